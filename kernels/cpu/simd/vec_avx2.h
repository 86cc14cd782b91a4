// Eight fp32 lanes in one YMM register; bf16/fp16 are widened on load and rounded (to
// nearest even, NaN quieted) on store, matching the scalar conversions in dtype.h.
// Only included by the translation unit compiled for avx2,fma,f16c.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including vec_avx2.h"
#endif

#include "cpu/simd/fp8_offset_codes.h"
#include "cpu/simd/transpose_avx2.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

struct VecAvx2 {
  using Acc = float;
  static constexpr int kWidth = 8;
  __m256 v;

  static VecAvx2 broadcast(float value) { return {_mm256_set1_ps(value)}; }
  static VecAvx2 zero() { return {_mm256_setzero_ps()}; }

  static VecAvx2 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static VecAvx2 load(const bf16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))};
  }
  static VecAvx2 load(const fp16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }

  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store(bf16_t* p) const { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits()); }

  // Non-temporal stores (p aligned to the vector's byte size): large outputs skip the
  // read-for-ownership of the destination line and do not evict the inputs from cache.
  void store_stream(float* p) const { _mm256_stream_ps(p, v); }
  void store_stream(bf16_t* p) const { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits()); }
  void store_stream(fp16_t* p) const {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  // Orders this thread's streaming stores before whatever the caller does next.
  static void stream_fence() { _mm_sfence(); }

  // Round to nearest even on the bit pattern: add 0x7fff plus the lowest kept bit, keep the
  // top half. NaN lanes become the canonical quiet NaN first (as c10::BFloat16 does), so the
  // rounding add cannot carry a NaN into infinity.
  __m128i to_bf16_bits() const {
    const __m256i rounded = bf16_rounded_lanes();
    // Gather bytes 2-3 of each 32-bit lane into the low 8 bytes of each 128-bit half, then
    // bring the two halves' low quadwords together.
    const __m256i take_high_halves = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                                      2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i gathered = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(rounded, take_high_halves), 0x08);
    return _mm256_castsi256_si128(gathered);
  }
  // Each lane with its bf16 rounding in the high half (the low half is garbage).
  __m256i bf16_rounded_lanes() const {
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256i bits = _mm256_castps_si256(_mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), is_nan));
    const __m256i tie_bit = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(bits, _mm256_add_epi32(tie_bit, _mm256_set1_epi32(0x7fff)));
  }
  // The value a store to T and a load back give, without the trip through memory.
  template <typename T>
  VecAvx2 rounded_as() const {
    if constexpr (std::is_same_v<T, bf16_t>) {
      return {_mm256_castsi256_ps(_mm256_and_si256(bf16_rounded_lanes(), _mm256_set1_epi32(int32_t(0xffff0000))))};
    } else if constexpr (std::is_same_v<T, fp16_t>) {
      return {_mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT))};
    } else {
      static_assert(std::is_same_v<T, float>, "rounded_as: float, bf16 or fp16");
      return *this;
    }
  }
  void store(fp16_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  // FP8 with the scalar rules of fp8.cpp: saturate, round to nearest even, NaN stays NaN.
  template <Fp8Format kFormat>
  void store_fp8(uint8_t* p) const { _mm_storel_epi64(reinterpret_cast<__m128i*>(p), fp8_bytes<kFormat>()); }
  template <Fp8Format kFormat>
  void store_fp8_stream(uint8_t* p) const {
    _mm_stream_si64(reinterpret_cast<long long*>(p), _mm_cvtsi128_si64(fp8_bytes<kFormat>()));
  }

  // The eight FP8 codes in the low 8 bytes.
  template <Fp8Format kFormat>
  __m128i fp8_bytes() const {
    constexpr int kFirstCode = fp8_first_code<kFormat>();
    __m256i code = _mm256_sub_epi32(fp8_offset_codes<kFormat>(), _mm256_set1_epi32(kFirstCode));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 24), _mm256_set1_epi32(0x80)));
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    return _mm_packus_epi16(words, words);
  }

  // Four vectors' codes packed together (32 bytes, one store): the per-vector work shrinks
  // to the rounding below, and the offset, NaN and sign are applied to 16 or 32 lanes at
  // once on the packed words and bytes.
  static constexpr int kFp8Group = 4;
  template <Fp8Format kFormat, bool kStream>
  static void store_fp8_group(const VecAvx2* values, uint8_t* p) {
    const __m256i codes = fp8_group_codes<kFormat>(values);
    if constexpr (kStream) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), codes);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), codes);
  }
  // The same codes to p and, streamed, to `streamed` (32-byte aligned): one conversion feeds
  // a staging copy in cache and the output in memory.
  template <Fp8Format kFormat>
  static void store_fp8_group_twice(const VecAvx2* values, uint8_t* p, uint8_t* streamed) {
    const __m256i codes = fp8_group_codes<kFormat>(values);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), codes);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(streamed), codes);
  }
  template <Fp8Format kFormat>
  static __m256i fp8_group_codes(const VecAvx2* values) {
    constexpr int kFirstCode = fp8_first_code<kFormat>();
    // packus keeps every offset code (< 2^16); a NaN lane saturates to 0xFFFF, and the
    // unsigned min then turns it into 0x7f, the NaN code (every other code is below it).
    const __m256i ab = _mm256_packus_epi32(values[0].fp8_offset_codes<kFormat>(), values[1].fp8_offset_codes<kFormat>());
    const __m256i cd = _mm256_packus_epi32(values[2].fp8_offset_codes<kFormat>(), values[3].fp8_offset_codes<kFormat>());
    const __m256i first = _mm256_set1_epi16(kFirstCode), nan_code = _mm256_set1_epi16(0x7f);
    const __m256i codes = _mm256_packus_epi16(_mm256_min_epu16(_mm256_subs_epu16(ab, first), nan_code),
                                              _mm256_min_epu16(_mm256_subs_epu16(cd, first), nan_code));
    // Signs: the sign-saturating packs keep each lane's sign bit through to its byte.
    const __m256i sign_ab = _mm256_packs_epi32(_mm256_castps_si256(values[0].v), _mm256_castps_si256(values[1].v));
    const __m256i sign_cd = _mm256_packs_epi32(_mm256_castps_si256(values[2].v), _mm256_castps_si256(values[3].v));
    const __m256i signs = _mm256_and_si256(_mm256_packs_epi16(sign_ab, sign_cd), _mm256_set1_epi8(char(0x80)));
    // The packs interleave 4-lane pieces per 128-bit half: a0 b0 c0 d0 | a1 b1 c1 d1.
    return _mm256_permutevar8x32_epi32(_mm256_or_si256(codes, signs), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }

  // FP8 codes plus fp8_first_code(), of |v| saturated, as int32 lanes (huge for NaN),
  // rounded by one fp32 addition (fp8_offset_codes.h).
  template <Fp8Format kFormat>
  __m256i fp8_offset_codes() const {
    constexpr bool kE4M3 = kFormat == Fp8Format::kE4M3;
    constexpr int kMantissaBits = kE4M3 ? 3 : 2;
    const __m256 abs = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
    const __m256 magnitude = _mm256_min_ps(_mm256_set1_ps(kE4M3 ? 448.0f : 57344.0f), abs);  // NaN stays NaN
    const __m256i binade = _mm256_and_si256(_mm256_castps_si256(magnitude), _mm256_set1_epi32(0x7f800000));
    const __m256i c = _mm256_max_epi32(_mm256_add_epi32(binade, _mm256_set1_epi32((23 - kMantissaBits) << 23)),
                                       _mm256_set1_epi32(fp8_floor_exponent<kFormat>() << 23));
    const __m256i sum = _mm256_castps_si256(_mm256_add_ps(magnitude, _mm256_castsi256_ps(c)));
    return _mm256_add_epi32(_mm256_sub_epi32(sum, c), _mm256_srli_epi32(c, 23 - kMantissaBits));
  }

  // FP8 codes widened by the F16C conversion. An E5M2 code is the top byte of the fp16 of
  // the same value. An E4M3 code, one exponent bit shorter, shifted one bit further (its
  // sign kept in bit 15) is the fp16 of its value times 2^-8, subnormals included. fp16
  // subnormals convert to normal fp32, so no fp32 subnormal is ever formed (a flush-to-zero
  // mode cannot touch them), and the times 2^8 is exact. E4M3's NaN code would be a finite
  // fp16 there: it becomes the fp16 NaN 0x7f80 (sign kept), which widens to 0x7ff00000 as
  // torch's conversion gives; E5M2's inf and NaN codes are fp16 inf and NaN already.
  template <Fp8Format kFormat>
  static VecAvx2 load_fp8(const uint8_t* p) {
    const __m128i code = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));  // 8 x u16
    const __m128i high_byte = _mm_slli_epi16(code, 8);
    if constexpr (kFormat == Fp8Format::kE5M2) {
      return {_mm256_cvtph_ps(high_byte)};
    } else {
      // An arithmetic shift by one copies the sign into bit 14 as well; clear it there.
      const __m128i half = _mm_and_si128(_mm_srai_epi16(high_byte, 1), _mm_set1_epi16(int16_t(0xbfff)));
      const __m128i nan_code = _mm_set1_epi16(0x7f);
      const __m128i is_nan = _mm_cmpeq_epi16(_mm_and_si128(code, nan_code), nan_code);
      const __m128i with_nan = _mm_or_si128(half, _mm_and_si128(is_nan, _mm_set1_epi16(0x7e00)));  // 0x3f80 | 0x7e00
      return {_mm256_mul_ps(_mm256_cvtph_ps(with_nan), _mm256_set1_ps(256.0f))};
    }
  }

  // Running max of |v| with fmaxf semantics, as TransformerEngine's amax: a NaN lane of v is
  // skipped, inf counts. maxps returns its second operand when either is NaN, and the running
  // value (which starts at 0) goes second, so it never becomes NaN: the same single
  // instruction as the integer max of the bit patterns it replaces, which let NaN win.
  static VecAvx2 magnitude_max(VecAvx2 running, VecAvx2 v) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v.v), _mm256_set1_epi32(0x7fffffff)));
    return {_mm256_max_ps(magnitude, running.v)};
  }
  // The lanes are magnitudes, never NaN: as integers they order as the floats do.
  float reduce_magnitude_max() const {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(_mm256_castps_si256(v)), _mm256_extracti128_si256(_mm256_castps_si256(v), 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return _mm_cvtss_f32(_mm_castsi128_ps(m));
  }

  // Lanes 2k and 2k+1 exchanged: the partner of each channel of an adjacent pair.
  VecAvx2 swap_pairs() const { return {_mm256_permute_ps(v, 0xb1)}; }
  // Softmax-style math (cross-entropy, attention softmax); NaN propagates. max_ps returns
  // its second operand when either is NaN, so the running value goes first.
  static VecAvx2 max(VecAvx2 a, VecAvx2 b) {
    const __m256 m = _mm256_max_ps(a.v, b.v);
    return {_mm256_blendv_ps(m, a.v, _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q))};
  }
  float reduce_max() const {
    __m128 m = max128(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = max128(m, _mm_movehl_ps(m, m));
    m = max128(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  static __m128 max128(__m128 a, __m128 b) {
    return _mm_blendv_ps(_mm_max_ps(a, b), a, _mm_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  // Lane i takes when_set where flags[i] != 0 (eight bytes), else otherwise.
  static VecAvx2 select(const uint8_t* flags, VecAvx2 when_set, VecAvx2 otherwise) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(flags)));
    const __m256 set = _mm256_castsi256_ps(_mm256_cmpgt_epi32(bytes, _mm256_setzero_si256()));
    return {_mm256_blendv_ps(otherwise.v, when_set.v, set)};
  }

  float reduce_add() const {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1));
    return _mm_cvtss_f32(sum);
  }

  // Lane i of the result = the sum of x[i]'s 8 lanes, as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 +
  // 7)) for every vector whatever its place: two rounds of horizontal adds within the 128-bit
  // halves, then the halves added, 9 instructions for 8 sums where one reduction each takes 5.
  static VecAvx2 sum_lanes(const VecAvx2 (&x)[8]) {
    __m256 pairs[4];
    for (int i = 0; i < 4; ++i) pairs[i] = _mm256_hadd_ps(x[2 * i].v, x[2 * i + 1].v);
    const __m256 low = _mm256_hadd_ps(pairs[0], pairs[1]);   // per half: x[0..3]'s sums over the half
    const __m256 high = _mm256_hadd_ps(pairs[2], pairs[3]);  // x[4..7]'s
    return {_mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31))};
  }

  // The 8 x 8 transpose in registers, in place: lane j of x[i] becomes lane i of x[j].
  static void transpose(VecAvx2 (&x)[8]) {
    __m256 lanes[8];
    for (int i = 0; i < 8; ++i) lanes[i] = x[i].v;
    transpose_8x8_ps(lanes);
    for (int i = 0; i < 8; ++i) x[i].v = lanes[i];
  }
};

// Free operators (GCC does not apply a target pragma to in-class friend definitions).
inline VecAvx2 operator+(VecAvx2 a, VecAvx2 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VecAvx2 operator-(VecAvx2 a, VecAvx2 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VecAvx2 operator*(VecAvx2 a, VecAvx2 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VecAvx2 operator/(VecAvx2 a, VecAvx2 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline VecAvx2 sqrt(VecAvx2 a) { return {_mm256_sqrt_ps(a.v)}; }
inline VecAvx2 fmadd(VecAvx2 a, VecAvx2 b, VecAvx2 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }

// a < b ? if_less : otherwise (false for NaN lanes).
inline VecAvx2 where_less(VecAvx2 a, VecAvx2 b, VecAvx2 if_less, VecAvx2 otherwise) {
  return {_mm256_blendv_ps(otherwise.v, if_less.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))};
}

// e^x within about 1.5 ulp: x = (k / 8) ln2 + r, |r| <= ln2 / 16, with k = round(8 x / ln2)
// taken from the low bits of x (8 / ln2) + 1.5 * 2^23 (the magic number leaves k there, in
// two's complement); e^x = 2^(k >> 3) * 2^((k & 7) / 8) * e^r. The eighth powers of two come
// from an 8-entry table in one register (vpermps reads only the low 3 bits of each index),
// e^r from its degree-4 Taylor polynomial (|r|^5 / 120 < 2e-9), and 2^(k >> 3) is added to
// the table entry's exponent field. The small |r| is what keeps this short: four dependent
// multiply-adds instead of seven, which is what bounds the exp-heavy loops (softmax,
// cross-entropy, the sigmoid gates) on cores that can keep only a few iterations in flight.
// x is clamped to [kExpFloor, ln FLT_MAX] first: below the floor the result is 0 (see
// vec_portable.h: no subnormal is ever computed), above it inf, and from 88.68 (k = 1024) on
// the exponent field overflows to inf a little early. NaN stays NaN (min/max return their
// second operand when either is NaN, and the final product keeps it).
inline VecAvx2 exp(VecAvx2 x) {
  const __m256 floor = _mm256_set1_ps(kExpFloor), ceiling = _mm256_set1_ps(88.72283905f);
  const __m256 clamped = _mm256_max_ps(floor, _mm256_min_ps(ceiling, x.v));
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m256 shifted = _mm256_fmadd_ps(clamped, _mm256_set1_ps(8.0f * 1.44269504088896341f), magic);
  const __m256 k = _mm256_sub_ps(shifted, magic);
  // r = x - k ln2 / 8, with ln2 / 8 split in two so that k times the first part is exact.
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f / 8), clamped);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f / 8), r);
  __m256 e_r = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 24), r, _mm256_set1_ps(1.0f / 6));
  e_r = _mm256_fmadd_ps(e_r, r, _mm256_set1_ps(0.5f));
  e_r = _mm256_fmadd_ps(e_r, r, _mm256_set1_ps(1.0f));
  e_r = _mm256_fmadd_ps(e_r, r, _mm256_set1_ps(1.0f));
  const __m256 eighths = _mm256_setr_ps(1.0f, 1.0905077326652577f, 1.189207115002721f, 1.2968395546510096f,
                                        1.4142135623730951f, 1.5422108254079407f, 1.681792830507429f,
                                        1.8340080864093424f);  // 2^(j / 8)
  const __m256i k_bits = _mm256_castps_si256(shifted);
  // (k << 20) with the mantissa bits cleared is (k >> 3) << 23, the bits above k shifted out.
  const __m256i exponent = _mm256_and_si256(_mm256_slli_epi32(k_bits, 20), _mm256_set1_epi32(int(0xFF800000u)));
  const __m256 two_k = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_castps_si256(_mm256_permutevar8x32_ps(eighths, k_bits)), exponent));
  __m256 result = _mm256_mul_ps(e_r, two_k);
  result = _mm256_blendv_ps(result, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000)),  // inf
                            _mm256_cmp_ps(x.v, ceiling, _CMP_GT_OQ));
  return {_mm256_andnot_ps(_mm256_cmp_ps(x.v, floor, _CMP_LT_OQ), result)};  // 0 below the floor; NaN kept
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
