// Sixteen fp32 lanes in one ZMM register; same conversion rules as vec_avx2.h.
// Only included by the translation unit compiled for avx512f,avx512bw,avx512vl,avx512dq.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including vec_avx512.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

struct VecAvx512 {
  using Acc = float;
  static constexpr int kFp8Group = 1;  // vectors whose FP8 codes are stored together
  static constexpr int kWidth = 16;
  __m512 v;

  static VecAvx512 broadcast(float value) { return {_mm512_set1_ps(value)}; }
  static VecAvx512 zero() { return {_mm512_setzero_ps()}; }

  static VecAvx512 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static VecAvx512 load(const bf16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
  }
  static VecAvx512 load(const fp16_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
  }

  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store(bf16_t* p) const { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits()); }

  // Non-temporal stores; see vec_avx2.h.
  void store_stream(float* p) const { _mm512_stream_ps(p, v); }
  void store_stream(bf16_t* p) const { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits()); }
  void store_stream(fp16_t* p) const {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  static void stream_fence() { _mm_sfence(); }

  // Rounding as in vec_avx2.h: NaN lanes become the canonical quiet NaN, then round to
  // nearest even on the bit pattern and keep the top halves.
  __m256i to_bf16_bits() const {
    const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i bits = _mm512_mask_mov_epi32(_mm512_castps_si512(v), is_nan, _mm512_set1_epi32(0x7fc00000));
    const __m512i tie_bit = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(tie_bit, _mm512_set1_epi32(0x7fff)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
  }
  void store(fp16_t* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  // FP8 as in vec_avx2.h (saturate, round to nearest even, NaN stays NaN).
  template <Fp8Format kFormat>
  void store_fp8(uint8_t* p) const { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), fp8_bytes<kFormat>()); }
  template <Fp8Format kFormat>
  void store_fp8_stream(uint8_t* p) const { _mm_stream_si128(reinterpret_cast<__m128i*>(p), fp8_bytes<kFormat>()); }
  // The same codes to p and, streamed, to `streamed` (16-byte aligned), converted once.
  template <Fp8Format kFormat>
  void store_fp8_twice(uint8_t* p, uint8_t* streamed) const {
    const __m128i codes = fp8_bytes<kFormat>();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), codes);
    _mm_stream_si128(reinterpret_cast<__m128i*>(streamed), codes);
  }

  // The sixteen FP8 codes.
  template <Fp8Format kFormat>
  __m128i fp8_bytes() const {
    constexpr bool kE4M3 = kFormat == Fp8Format::kE4M3;
    constexpr int kShift = kE4M3 ? 20 : 21;
    constexpr int kRebias = kE4M3 ? (120 << 3) : (112 << 2);
    const __m512i bits = _mm512_castps_si512(v);
    const __m512 magnitude = _mm512_min_ps(_mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff))),
                                           _mm512_set1_ps(kE4M3 ? 448.0f : 57344.0f));
    const __m512i m = _mm512_castps_si512(magnitude);
    const __m512i tie_bit = _mm512_and_si512(_mm512_srli_epi32(m, kShift), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(m, _mm512_add_epi32(tie_bit, _mm512_set1_epi32((1 << (kShift - 1)) - 1)));
    __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(rounded, kShift), _mm512_set1_epi32(kRebias));
    const __mmask16 is_subnormal = _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(kE4M3 ? 0.015625f : 6.103515625e-05f), _CMP_LT_OQ);
    code = _mm512_mask_mov_epi32(code, is_subnormal,
                                 _mm512_cvtps_epi32(_mm512_mul_ps(magnitude, _mm512_set1_ps(kE4M3 ? 512.0f : 65536.0f))));
    code = _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7f));
    code = _mm512_or_si512(code, _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80)));
    return _mm512_cvtepi32_epi8(code);
  }

  template <Fp8Format kFormat>
  static VecAvx512 load_fp8(const uint8_t* p) {
    constexpr bool kE4M3 = kFormat == Fp8Format::kE4M3;
    constexpr int kShift = kE4M3 ? 20 : 21;
    constexpr int kMantissaBits = kE4M3 ? 3 : 2;
    const __m512i code = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i magnitude = _mm512_and_si512(code, _mm512_set1_epi32(0x7f));
    const __m512i exponent = _mm512_srli_epi32(magnitude, kMantissaBits);
    __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(magnitude, kShift), _mm512_set1_epi32((kE4M3 ? 120 : 112) << 23));
    const __m512 subnormal = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(magnitude, _mm512_set1_epi32((1 << kMantissaBits) - 1))),
                                           _mm512_set1_ps(kE4M3 ? 0.001953125f : 1.52587890625e-05f));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(exponent, _mm512_setzero_si512()), _mm512_castps_si512(subnormal));
    if constexpr (kE4M3) {
      bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7f)), _mm512_set1_epi32(0x7fc00000));
    } else {
      const __m512i special = _mm512_or_si512(_mm512_set1_epi32(0x7f800000), _mm512_slli_epi32(_mm512_and_si512(magnitude, _mm512_set1_epi32(3)), kShift));
      bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(exponent, _mm512_set1_epi32(31)), special);
    }
    bits = _mm512_or_si512(bits, _mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24));
    return {_mm512_castsi512_ps(bits)};
  }

  static VecAvx512 magnitude_max(VecAvx512 running, VecAvx512 v) {
    const __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(v.v), _mm512_set1_epi32(0x7fffffff));
    return {_mm512_castsi512_ps(_mm512_max_epi32(_mm512_castps_si512(running.v), magnitude))};
  }
  float reduce_magnitude_max() const {
    const int32_t m = _mm512_reduce_max_epi32(_mm512_castps_si512(v));
    float out;
    std::memcpy(&out, &m, sizeof(out));
    return out;
  }

  // Lanes 2k and 2k+1 exchanged: the partner of each channel of an adjacent pair.
  VecAvx512 swap_pairs() const { return {_mm512_permute_ps(v, 0xb1)}; }
  // Softmax-style math: a max that keeps a NaN of `a`, and its reduction.
  static VecAvx512 max(VecAvx512 a, VecAvx512 b) {
    const __mmask16 a_nan = _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
    return {_mm512_mask_blend_ps(a_nan, _mm512_max_ps(a.v, b.v), a.v)};
  }
  float reduce_max() const {
    // _mm512_reduce_max_ps may drop a NaN lane; a NaN anywhere makes the row NaN.
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) return std::nanf("");
    return _mm512_reduce_max_ps(v);
  }
  static VecAvx512 select(const uint8_t* flags, VecAvx512 when_set, VecAvx512 otherwise) {
    const __mmask16 set = _mm_test_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(flags)),
                                             _mm_set1_epi8(char(0xff)));
    return {_mm512_mask_blend_ps(set, otherwise.v, when_set.v)};
  }

  float reduce_add() const { return _mm512_reduce_add_ps(v); }
};

// Free operators (GCC does not apply a target pragma to in-class friend definitions).
inline VecAvx512 operator+(VecAvx512 a, VecAvx512 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VecAvx512 operator-(VecAvx512 a, VecAvx512 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VecAvx512 operator*(VecAvx512 a, VecAvx512 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline VecAvx512 operator/(VecAvx512 a, VecAvx512 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline VecAvx512 sqrt(VecAvx512 a) { return {_mm512_sqrt_ps(a.v)}; }
inline VecAvx512 fmadd(VecAvx512 a, VecAvx512 b, VecAvx512 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }

// a < b ? if_less : otherwise (false for NaN lanes).
inline VecAvx512 where_less(VecAvx512 a, VecAvx512 b, VecAvx512 if_less, VecAvx512 otherwise) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ), otherwise.v, if_less.v)};
}

// e^x within about 1 ulp: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts so that
// n ln2 is exact), e^r by a degree-7 polynomial (Cephes' expf coefficients), times 2^n as two
// factors 2^(n/2) and 2^(n - n/2), each a normal float, so large x overflows to inf. Below
// kExpFloor the result is 0 (vec_portable.h); NaN stays NaN. The avx2 tier's exp uses a table
// of 2^(j/8) and a shorter polynomial instead; this tier keeps the older scheme until it can be
// measured and tested on an AVX-512 machine.
inline VecAvx512 exp(VecAvx512 x) {
  const __m512 floor = _mm512_set1_ps(kExpFloor);
  const __m512 clamped = _mm512_max_ps(floor, _mm512_min_ps(_mm512_set1_ps(89.0f), x.v));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), clamped);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e_r = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i whole = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(whole, 1);
  const __m512 two_half = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 two_rest = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(whole, half), _mm512_set1_epi32(127)), 23));
  const __m512 result = _mm512_mul_ps(_mm512_mul_ps(e_r, two_half), two_rest);
  const __mmask16 below_floor = _mm512_cmp_ps_mask(x.v, floor, _CMP_LT_OQ);  // false for NaN: kept
  return {_mm512_maskz_mov_ps(static_cast<__mmask16>(~below_floor), result)};
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
