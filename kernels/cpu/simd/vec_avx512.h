// Sixteen fp32 lanes in one ZMM register; same conversion rules as vec_avx2.h.
// Only included by the translation unit compiled for avx512f,avx512bw,avx512vl,avx512dq.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including vec_avx512.h"
#endif

#include "cpu/simd/fp8_offset_codes.h"
#include "cpu/simd/transpose_avx512.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

struct VecAvx512 {
  using Acc = float;
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
    // The high words of the 16 lanes into the low half: one vpermw, where a shift and vpmovdw
    // take three operations.
    const __m512i high_words = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27,
                                                25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi16(high_words, bf16_rounded_lanes()));
  }
  // Each lane with its bf16 rounding in the high half (the low half is garbage).
  __m512i bf16_rounded_lanes() const {
    const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i bits = _mm512_mask_mov_epi32(_mm512_castps_si512(v), is_nan, _mm512_set1_epi32(0x7fc00000));
    const __m512i tie_bit = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_add_epi32(bits, _mm512_add_epi32(tie_bit, _mm512_set1_epi32(0x7fff)));
  }
  // The value a store to T and a load back give, without the trip through memory.
  template <typename T>
  VecAvx512 rounded_as() const {
    if constexpr (std::is_same_v<T, bf16_t>) {
      return {_mm512_castsi512_ps(_mm512_and_si512(bf16_rounded_lanes(), _mm512_set1_epi32(int32_t(0xffff0000))))};
    } else if constexpr (std::is_same_v<T, fp16_t>) {
      return {_mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT))};
    } else {
      static_assert(std::is_same_v<T, float>, "rounded_as: float, bf16 or fp16");
      return *this;
    }
  }
  void store(fp16_t* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  // FP8 with the scalar rules of fp8.cpp (saturate, round to nearest even, NaN stays NaN):
  // the rounding is one fp32 addition per lane (fp8_offset_codes.h), and the offset, NaN and
  // sign are applied to packed words and bytes.
  template <Fp8Format kFormat>
  void store_fp8(uint8_t* p) const { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), fp8_bytes<kFormat>()); }
  template <Fp8Format kFormat>
  void store_fp8_stream(uint8_t* p) const { _mm_stream_si128(reinterpret_cast<__m128i*>(p), fp8_bytes<kFormat>()); }

  // The sixteen FP8 codes.
  template <Fp8Format kFormat>
  __m128i fp8_bytes() const {
    constexpr int kFirstCode = fp8_first_code<kFormat>();
    __m512i code = _mm512_sub_epi32(fp8_offset_codes<kFormat>(), _mm512_set1_epi32(kFirstCode));
    code = _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7f));
    code = _mm512_or_si512(code, _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 24), _mm512_set1_epi32(0x80)));
    return _mm512_cvtepi32_epi8(code);
  }

  // Four vectors' codes packed together: 64 bytes, one whole cache line per store.
  static constexpr int kFp8Group = 4;
  template <Fp8Format kFormat, bool kStream>
  static void store_fp8_group(const VecAvx512* values, uint8_t* p) {
    const __m512i codes = fp8_group_codes<kFormat>(values);
    if constexpr (kStream) _mm512_stream_si512(reinterpret_cast<__m512i*>(p), codes);
    else _mm512_storeu_si512(p, codes);
  }
  // The same codes to p and, streamed, to `streamed` (64-byte aligned).
  template <Fp8Format kFormat>
  static void store_fp8_group_twice(const VecAvx512* values, uint8_t* p, uint8_t* streamed) {
    const __m512i codes = fp8_group_codes<kFormat>(values);
    _mm512_storeu_si512(p, codes);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(streamed), codes);
  }
  template <Fp8Format kFormat>
  static __m512i fp8_group_codes(const VecAvx512* values) {
    constexpr int kFirstCode = fp8_first_code<kFormat>();
    // As in vec_avx2.h: packus keeps every offset code, a NaN lane saturates to 0xFFFF and
    // the unsigned min makes it 0x7f; the sign-saturating packs carry each sign bit along.
    const __m512i ab = _mm512_packus_epi32(values[0].fp8_offset_codes<kFormat>(), values[1].fp8_offset_codes<kFormat>());
    const __m512i cd = _mm512_packus_epi32(values[2].fp8_offset_codes<kFormat>(), values[3].fp8_offset_codes<kFormat>());
    const __m512i first = _mm512_set1_epi16(kFirstCode), nan_code = _mm512_set1_epi16(0x7f);
    const __m512i codes = _mm512_packus_epi16(_mm512_min_epu16(_mm512_subs_epu16(ab, first), nan_code),
                                              _mm512_min_epu16(_mm512_subs_epu16(cd, first), nan_code));
    const __m512i sign_ab = _mm512_packs_epi32(_mm512_castps_si512(values[0].v), _mm512_castps_si512(values[1].v));
    const __m512i sign_cd = _mm512_packs_epi32(_mm512_castps_si512(values[2].v), _mm512_castps_si512(values[3].v));
    const __m512i signs = _mm512_and_si512(_mm512_packs_epi16(sign_ab, sign_cd), _mm512_set1_epi8(char(0x80)));
    // The packs work per 128-bit lane: 4-byte piece 4i + s holds piece i of source s (a..d);
    // gather them back as all of a, then b, c, d.
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(order, _mm512_or_si512(codes, signs));
  }

  // FP8 codes plus fp8_first_code(), of |v| saturated, as int32 lanes (huge for NaN),
  // rounded by one fp32 addition (fp8_offset_codes.h).
  template <Fp8Format kFormat>
  __m512i fp8_offset_codes() const {
    constexpr bool kE4M3 = kFormat == Fp8Format::kE4M3;
    constexpr int kMantissaBits = kE4M3 ? 3 : 2;
    const __m512 abs = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
    const __m512 magnitude = _mm512_min_ps(_mm512_set1_ps(kE4M3 ? 448.0f : 57344.0f), abs);  // NaN stays NaN
    const __m512i binade = _mm512_and_si512(_mm512_castps_si512(magnitude), _mm512_set1_epi32(0x7f800000));
    const __m512i c = _mm512_max_epi32(_mm512_add_epi32(binade, _mm512_set1_epi32((23 - kMantissaBits) << 23)),
                                       _mm512_set1_epi32(fp8_floor_exponent<kFormat>() << 23));
    const __m512i sum = _mm512_castps_si512(_mm512_add_ps(magnitude, _mm512_castsi512_ps(c)));
    return _mm512_add_epi32(_mm512_sub_epi32(sum, c), _mm512_srli_epi32(c, 23 - kMantissaBits));
  }

  // FP8 codes widened through the fp16 conversion, as vec_avx2.h's load_fp8 explains.
  template <Fp8Format kFormat>
  static VecAvx512 load_fp8(const uint8_t* p) {
    const __m256i code = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));  // 16 x u16
    const __m256i high_byte = _mm256_slli_epi16(code, 8);
    if constexpr (kFormat == Fp8Format::kE5M2) {
      return {_mm512_cvtph_ps(high_byte)};
    } else {
      const __m256i half = _mm256_and_si256(_mm256_srai_epi16(high_byte, 1), _mm256_set1_epi16(int16_t(0xbfff)));
      const __m256i nan_code = _mm256_set1_epi16(0x7f);
      const __mmask16 is_nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(code, nan_code), nan_code);
      const __m256i with_nan = _mm256_mask_mov_epi16(half, is_nan, _mm256_or_si256(half, _mm256_set1_epi16(0x7e00)));  // 0x3f80 | 0x7e00
      return {_mm512_mul_ps(_mm512_cvtph_ps(with_nan), _mm512_set1_ps(256.0f))};
    }
  }

  // Running max of |v| with fmaxf semantics (vec_avx2.h says how): NaN lanes of v are skipped.
  static VecAvx512 magnitude_max(VecAvx512 running, VecAvx512 v) {
    const __m512 magnitude = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v.v), _mm512_set1_epi32(0x7fffffff)));
    return {_mm512_max_ps(magnitude, running.v)};
  }
  // The lanes are magnitudes, never NaN: as integers they order as the floats do.
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

  // Lane i of the result = the sum of x[i]'s 16 lanes: the 16 vectors added to each other in a
  // transposing tree (lanes 2 apart, then 1, within each 128-bit block; then the blocks), 45
  // instructions for 16 sums where one reduction each would take about 100. Every vector's
  // lanes meet in the same order whatever its place and whatever the others hold.
  static VecAvx512 sum_lanes(const VecAvx512 (&x)[16]) {
    __m512 pairs[8], quads[4], halves[2];
    for (int i = 0; i < 8; ++i)  // per block: x[2i] lanes 0+2, x[2i+1] 0+2, x[2i] 1+3, x[2i+1] 1+3
      pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i].v, x[2 * i + 1].v),
                               _mm512_unpackhi_ps(x[2 * i].v, x[2 * i + 1].v));
    for (int i = 0; i < 4; ++i) {  // per block: the block's sum of x[4i], ..., x[4i + 3]
      const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
      quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)  // blocks: x[8i..8i+3] blocks 0+1, 2+3; x[8i+4..8i+7] blocks 0+1, 2+3
      halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0x88),
                                _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0xDD));
    return {_mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], 0x88),
                          _mm512_shuffle_f32x4(halves[0], halves[1], 0xDD))};
  }

  // The 16 x 16 transpose in registers, in place (lane j of x[i] becomes lane i of x[j]).
  static void transpose(VecAvx512 (&x)[16]) {
    __m512i lanes[16];
    for (int i = 0; i < 16; ++i) lanes[i] = _mm512_castps_si512(x[i].v);
    transpose_16x16_epi32(lanes);
    for (int i = 0; i < 16; ++i) x[i].v = _mm512_castsi512_ps(lanes[i]);
  }
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

// e^x by vec_avx2.h's method (see its exp): k = round(8 x / ln2) from the magic-number
// addition, 2^((k & 7) / 8) from a table in one register (here sixteen entries, the eight
// repeated, since vpermps on a ZMM reads four index bits), e^r by the degree-4 Taylor
// polynomial. The power 2^(k >> 3) is applied by vscalefps (times 2^floor(k / 8)), which
// overflows to inf by itself: no ceiling compare and blend, and no exponent-field arithmetic,
// 15 vector operations instead of 19 (exp-bound loops such as silu ran 20% faster). The bits
// are the AVX2 tier's except from 88.68 to ln FLT_MAX, where the AVX2 exponent field
// overflows early and this gives the finite value. x is clamped to [kExpFloor, 89] first (89
// keeps k small for the magic number, and e^89 is already inf); below the floor the result
// is 0, as in every tier (vec_portable.h says why); NaN stays NaN.
inline VecAvx512 exp(VecAvx512 x) {
  const __m512 floor = _mm512_set1_ps(kExpFloor);
  const __m512 clamped = _mm512_max_ps(floor, _mm512_min_ps(_mm512_set1_ps(89.0f), x.v));
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m512 shifted = _mm512_fmadd_ps(clamped, _mm512_set1_ps(8.0f * 1.44269504088896341f), magic);
  const __m512 k = _mm512_sub_ps(shifted, magic);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f / 8), clamped);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f / 8), r);
  __m512 e_r = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 24), r, _mm512_set1_ps(1.0f / 6));
  e_r = _mm512_fmadd_ps(e_r, r, _mm512_set1_ps(0.5f));
  e_r = _mm512_fmadd_ps(e_r, r, _mm512_set1_ps(1.0f));
  e_r = _mm512_fmadd_ps(e_r, r, _mm512_set1_ps(1.0f));
  const __m512 eighths = _mm512_setr_ps(1.0f, 1.0905077326652577f, 1.189207115002721f, 1.2968395546510096f,
                                        1.4142135623730951f, 1.5422108254079407f, 1.681792830507429f,
                                        1.8340080864093424f, 1.0f, 1.0905077326652577f, 1.189207115002721f,
                                        1.2968395546510096f, 1.4142135623730951f, 1.5422108254079407f,
                                        1.681792830507429f, 1.8340080864093424f);  // 2^((j & 7) / 8)
  const __m512 mantissa = _mm512_mul_ps(e_r, _mm512_permutexvar_ps(_mm512_castps_si512(shifted), eighths));
  const __mmask16 kept = _mm512_cmp_ps_mask(x.v, floor, _CMP_NLT_UQ);  // x >= floor, or NaN
  return {_mm512_maskz_scalef_ps(kept, mantissa, _mm512_mul_ps(k, _mm512_set1_ps(0.125f)))};
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
