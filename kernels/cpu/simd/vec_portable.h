// A fixed-width "vector" of N accumulation values built from plain arrays. Loops over the
// N lanes are what compilers auto-vectorise for whatever baseline ISA they target (SSE2 on
// x86-64, NEON on aarch64), so the portable path is still SIMD where the compiler can do it.
// N = 1 is the scalar used for row tails by every tier.
//
// Included by each ISA translation unit inside its own namespace (TE_CPU_ISA_NAMESPACE), so
// the copies compiled for different targets never merge at link time.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including vec_portable.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

template <typename AccT, int N>
struct VecPortable {
  using Acc = AccT;
  static constexpr int kFp8Group = 1;  // vectors whose FP8 codes are stored together
  static constexpr int kWidth = N;
  Acc lane[N];

  static VecPortable broadcast(Acc value) {
    VecPortable out;
    for (int i = 0; i < N; ++i) out.lane[i] = value;
    return out;
  }
  static VecPortable zero() { return broadcast(Acc(0)); }

  template <typename T>
  static VecPortable load(const T* p) {
    VecPortable out;
    for (int i = 0; i < N; ++i) out.lane[i] = Acc(widen(p[i]));
    return out;
  }
  template <typename T>
  void store(T* p) const {
    for (int i = 0; i < N; ++i) p[i] = Convert<T>::from(lane[i]);
  }

  // The value a store to T and a load back give.
  template <typename T>
  VecPortable rounded_as() const {
    VecPortable out;
    for (int i = 0; i < N; ++i) out.lane[i] = Acc(widen(Convert<T>::from(lane[i])));
    return out;
  }

  // FP8 through the exact scalar conversions (fp8.h), lane by lane.
  template <Fp8Format kFormat>
  void store_fp8(uint8_t* p) const {
    for (int i = 0; i < N; ++i) p[i] = to_fp8(float(lane[i]), kFormat);
  }
  template <Fp8Format kFormat>
  void store_fp8_stream(uint8_t* p) const {
    store_fp8<kFormat>(p);
  }
  template <Fp8Format kFormat>
  void store_fp8_twice(uint8_t* p, uint8_t* streamed) const {
    store_fp8<kFormat>(p);
    std::memcpy(streamed, p, N);
  }
  template <Fp8Format kFormat>
  static VecPortable load_fp8(const uint8_t* p) {
    VecPortable out;
    for (int i = 0; i < N; ++i) out.lane[i] = Acc(fp8_to_float(p[i], kFormat));
    return out;
  }
  // Running max of |v| with fmaxf semantics, as TransformerEngine's amax: a NaN lane of v
  // fails the comparison and leaves the running value (never NaN: it starts at 0) as it is;
  // inf counts.
  static VecPortable magnitude_max(VecPortable running, VecPortable v) {
    for (int i = 0; i < N; ++i) {
      const Acc magnitude = v.lane[i] < 0 ? -v.lane[i] : v.lane[i];
      if (magnitude > running.lane[i]) running.lane[i] = magnitude;
    }
    return running;
  }
  Acc reduce_magnitude_max() const {
    Acc result = lane[0];
    for (int i = 1; i < N; ++i) result = lane[i] > result ? lane[i] : result;
    return result;
  }

  // No streaming stores in plain C++: an ordinary store.
  template <typename T>
  void store_stream(T* p) const {
    store(p);
  }
  static void stream_fence() {}

  // Lanes 2k and 2k+1 exchanged (N even): the partner of each channel of an adjacent pair.
  VecPortable swap_pairs() const {
    static_assert(N % 2 == 0, "swap_pairs needs whole pairs of lanes");
    VecPortable out;
    for (int i = 0; i < N; ++i) out.lane[i] = lane[i ^ 1];
    return out;
  }

  Acc reduce_add() const {
    Acc total = lane[0];
    for (int i = 1; i < N; ++i) total += lane[i];
    return total;
  }

  // Lane i of the result = x[i].reduce_add(): the vector types' transposing sums, in order.
  static VecPortable sum_lanes(const VecPortable (&x)[N]) {
    VecPortable out;
    for (int i = 0; i < N; ++i) out.lane[i] = x[i].reduce_add();
    return out;
  }

  // The N x N transpose, in place: lane j of x[i] becomes lane i of x[j].
  static void transpose(VecPortable (&x)[N]) {
    for (int i = 0; i < N; ++i)
      for (int j = i + 1; j < N; ++j) std::swap(x[i].lane[j], x[j].lane[i]);
  }

  // Softmax-style math (cross-entropy, attention softmax). NaN propagates through all three.
  static VecPortable max(VecPortable a, VecPortable b) {
    for (int i = 0; i < N; ++i) a.lane[i] = max_keeping_nan(a.lane[i], b.lane[i]);
    return a;
  }
  Acc reduce_max() const {
    Acc result = lane[0];
    for (int i = 1; i < N; ++i) result = max_keeping_nan(result, lane[i]);
    return result;
  }
  // Lane i takes when_set.lane[i] where flags[i] != 0, else otherwise.lane[i].
  static VecPortable select(const uint8_t* flags, VecPortable when_set, VecPortable otherwise) {
    for (int i = 0; i < N; ++i) otherwise.lane[i] = flags[i] ? when_set.lane[i] : otherwise.lane[i];
    return otherwise;
  }

 private:
  static Acc max_keeping_nan(Acc a, Acc b) {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
  }
  static float widen(float v) { return v; }
  static double widen(double v) { return v; }
  static float widen(bf16_t v) { return to_float(v); }
  static float widen(fp16_t v) { return to_float(v); }
};

// Free operators (GCC does not apply a target pragma to in-class friend definitions).
template <typename AccT, int N>
inline VecPortable<AccT, N> operator+(VecPortable<AccT, N> a, VecPortable<AccT, N> b) {
  for (int i = 0; i < N; ++i) a.lane[i] += b.lane[i];
  return a;
}
template <typename AccT, int N>
inline VecPortable<AccT, N> operator-(VecPortable<AccT, N> a, VecPortable<AccT, N> b) {
  for (int i = 0; i < N; ++i) a.lane[i] -= b.lane[i];
  return a;
}
template <typename AccT, int N>
inline VecPortable<AccT, N> operator*(VecPortable<AccT, N> a, VecPortable<AccT, N> b) {
  for (int i = 0; i < N; ++i) a.lane[i] *= b.lane[i];
  return a;
}
template <typename AccT, int N>
inline VecPortable<AccT, N> operator/(VecPortable<AccT, N> a, VecPortable<AccT, N> b) {
  for (int i = 0; i < N; ++i) a.lane[i] /= b.lane[i];
  return a;
}
template <typename AccT, int N>
inline VecPortable<AccT, N> sqrt(VecPortable<AccT, N> a) {
  for (int i = 0; i < N; ++i) a.lane[i] = std::sqrt(a.lane[i]);
  return a;
}
// a * b + c
template <typename AccT, int N>
inline VecPortable<AccT, N> fmadd(VecPortable<AccT, N> a, VecPortable<AccT, N> b, VecPortable<AccT, N> c) {
  for (int i = 0; i < N; ++i) a.lane[i] = a.lane[i] * b.lane[i] + c.lane[i];
  return a;
}

// a < b ? if_less : otherwise, lane by lane (false for NaN lanes, as an ordered compare is).
template <typename AccT, int N>
inline VecPortable<AccT, N> where_less(VecPortable<AccT, N> a, VecPortable<AccT, N> b, VecPortable<AccT, N> if_less,
                                       VecPortable<AccT, N> otherwise) {
  for (int i = 0; i < N; ++i) otherwise.lane[i] = a.lane[i] < b.lane[i] ? if_less.lane[i] : otherwise.lane[i];
  return otherwise;
}
// Every fp32 exp here returns 0 for x below kExpFloor (e^-87.3 is just above the smallest
// normal float) rather than a subnormal: computing subnormal results costs a microcode assist
// per lane (measured: a softmax with half its logits masked ran at half speed), and no user
// needs them (softmax and cross-entropy terms beside a row maximum of 1; sigmoid's
// 1 / (1 + e^-x) is 1 either way).
constexpr float kExpFloor = -87.3f;

// e^x from the C library, lane by lane; fp32 lanes below kExpFloor give 0, as in the vector tiers.
template <typename AccT, int N>
inline VecPortable<AccT, N> exp(VecPortable<AccT, N> x) {
  for (int i = 0; i < N; ++i) {
    const bool below_floor = std::is_same_v<AccT, float> && x.lane[i] < kExpFloor;
    x.lane[i] = below_floor ? AccT(0) : std::exp(x.lane[i]);
  }
  return x;
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
