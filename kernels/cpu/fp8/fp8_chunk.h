// The vector-level FP8 quantisation of one contiguous range (scale, saturate, round, store
// codes, amax), and the chunking helpers around it; shared by the per-tensor cast
// (fp8_kernels.h) and the kernels that fuse a cast into their output (activation_kernels.h,
// norm_kernels.h), so that a fused cast produces the same codes as the stand-alone one, bit
// for bit.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including fp8_chunk.h"
#endif
#pragma once

#include "cpu/simd/prefetch.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

constexpr int64_t kBlock = 64;

// [begin, end) of part `index` of `parts` over numel elements, cut at multiples of kBlock.
inline std::pair<int64_t, int64_t> block_aligned_part(int64_t numel, int64_t index, int64_t parts) {
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
  return {std::min(numel, blocks * index / parts * kBlock), std::min(numel, blocks * (index + 1) / parts * kBlock)};
}

// The chunks' amaxes combined in chunk order.
inline float combine_amaxes(const float* partial, int64_t chunks) {
  using Scalar = VecPortable<float, 1>;
  Scalar amax = Scalar::zero();
  for (int64_t c = 0; c < chunks; ++c) amax = Scalar::magnitude_max(amax, Scalar::broadcast(partial[c]));
  return amax.lane[0];
}

template <bool kStream, Fp8Format kFormat, typename W>
inline void put_fp8(const W& value, uint8_t* p) {
  if constexpr (kStream) value.template store_fp8_stream<kFormat>(p);
  else value.template store_fp8<kFormat>(p);
}

// The codes of V::kFp8Group consecutive vectors.
template <typename V, Fp8Format kFormat, bool kStream>
inline void put_fp8_group(const V* values, uint8_t* p) {
  if constexpr (V::kFp8Group > 1) V::template store_fp8_group<kFormat, kStream>(values, p);
  else put_fp8<kStream, kFormat>(values[0], p);
}

// Where quantize_into puts the codes of position j: out[j], streamed when kStream.
template <bool kStream>
struct CodesTo {
  uint8_t* out;
  template <Fp8Format kFormat, typename V>
  void group(const V* values, int64_t j) const { put_fp8_group<V, kFormat, kStream>(values, out + j); }
  template <Fp8Format kFormat, typename W>
  void vector(const W& value, int64_t j) const { put_fp8<kStream, kFormat>(value, out + j); }
};

// staged[j] (a buffer in cache) and streamed[j] (the output), from one conversion. Group
// stores to `streamed` are non-temporal, so whole groups there must be aligned to the
// group's byte size; the ragged end, if any, is copied with ordinary stores.
struct CodesToStagedAndStreamed {
  uint8_t* staged;
  uint8_t* streamed;
  template <Fp8Format kFormat, typename V>
  void group(const V* values, int64_t j) const {
    if constexpr (V::kFp8Group > 1) V::template store_fp8_group_twice<kFormat>(values, staged + j, streamed + j);
    else values[0].template store_fp8_twice<kFormat>(staged + j, streamed + j);
  }
  template <Fp8Format kFormat, typename W>
  void vector(const W& value, int64_t j) const {
    value.template store_fp8<kFormat>(staged + j);
    std::memcpy(streamed + j, staged + j, W::kWidth);
  }
};

// How quantize_into reads its input: as a stream from memory, asking for each line 4 KiB
// ahead (prefetch.h), or as a segment the caller has prefetched or staged in cache itself
// (the transposing cast reads rows a panel at a time: 4 KiB on along a row is a later panel).
enum class InputReads { kPrefetchAhead, kPreparedByCaller };

// Codes of value(j) * scale for j in [begin, end) into `codes` (CodesTo /
// CodesToStagedAndStreamed); returns max |value| over the range when kAmax (else 0: the
// caller knew the amax before choosing the scale). value(tag, j) returns the vector (V or
// the scalar tail's type, as tag points to) of the values at j, already rounded to the
// dtype a stand-alone cast would read them in: a fusion computes them in registers, and its
// codes and amax are those of the cast of its stored output, bit for bit.
// Flattened: GCC left the group store out of line in the norms' fused cast, where each call
// spilled the group and reloaded every constant (bf16 [256, 4096] layernorm -> FP8, in
// cache: 228 us with the calls, 214 us flattened).
template <typename V, Fp8Format kFormat, bool kAmax = true, typename Values, typename Codes>
[[gnu::flatten]] float quantize_values(Values value, const Codes& codes, int64_t begin, int64_t end, float scale) {
  using Scalar = VecPortable<float, 1>;
  constexpr int64_t kGroup = V::kFp8Group * V::kWidth;
  V running = V::zero();
  Scalar tail = Scalar::zero();
  int64_t j = begin;
  for (; j + kGroup <= end; j += kGroup) {
    V scaled[V::kFp8Group];
    for (int g = 0; g < V::kFp8Group; ++g) {
      const V x = value(static_cast<V*>(nullptr), j + g * V::kWidth);
      if constexpr (kAmax) running = V::magnitude_max(running, x);
      scaled[g] = x * V::broadcast(scale);
    }
    codes.template group<kFormat>(scaled, j);
  }
  for (; j + V::kWidth <= end; j += V::kWidth) {
    const V x = value(static_cast<V*>(nullptr), j);
    if constexpr (kAmax) running = V::magnitude_max(running, x);
    codes.template vector<kFormat>(x * V::broadcast(scale), j);
  }
  for (; j < end; ++j) {
    const Scalar x = value(static_cast<Scalar*>(nullptr), j);
    if constexpr (kAmax) tail = Scalar::magnitude_max(tail, x);
    codes.template vector<kFormat>(x * Scalar::broadcast(scale), j);
  }
  return Scalar::magnitude_max(Scalar::broadcast(running.reduce_magnitude_max()), tail).lane[0];
}

// quantize_values of in[begin, end).
template <typename V, Fp8Format kFormat, bool kAmax = true, InputReads kReads = InputReads::kPrefetchAhead,
          typename T, typename Codes>
float quantize_into(const T* in, const Codes& codes, int64_t begin, int64_t end, float scale) {
  const auto load = [in](auto* tag, int64_t j) {
    using W = std::remove_pointer_t<decltype(tag)>;
    if constexpr (kReads == InputReads::kPrefetchAhead) prefetch_ahead(in, j);
    return W::load(in + j);
  };
  return quantize_values<V, kFormat, kAmax>(load, codes, begin, end, scale);
}

// Codes of in[begin, end) * scale into out (streamed when kStream); see quantize_into.
template <typename V, Fp8Format kFormat, bool kStream, typename T, bool kAmax = true,
          InputReads kReads = InputReads::kPrefetchAhead>
float quantize_chunk(const T* in, uint8_t* out, int64_t begin, int64_t end, float scale) {
  return quantize_into<V, kFormat, kAmax, kReads>(in, CodesTo<kStream>{out}, begin, end, scale);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
