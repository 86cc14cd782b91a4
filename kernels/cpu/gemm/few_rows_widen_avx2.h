// FewRowsWiden (few_rows_widen.h) for the avx2 tier.
//
// FP8: 16 codes in one pass of 16-bit lanes, into the fp16 bit patterns of VecAvx2::load_fp8
// (E5M2: the code is the fp16's top byte; E4M3, one exponent bit shorter and shifted one bit
// further, is the fp16 of its value times 2^-8, its NaN code made the fp16 NaN), then two F16C
// conversions. E4M3 values stay times 2^-8 (kE4M3Unit): the caller scales a by 2^8 instead of
// multiplying every code. That route, with its NaN blend, about 12 instructions per 16 codes,
// bounded the [1, 4096] x [4096, 4096] FP8 GEMV on 2 Zen 3 cores. So E4M3 codes are also
// checked 32 at a time for C rows of b together (e4m3_run_kind, three instructions per row):
// where every code is a normal number (no zero, subnormal or NaN code), each becomes the bf16
// bits of its value times 2^-8 by integer instructions, seven per 16 codes (e4m3_normal); where
// none is NaN, the F16C route skips the blend. A weight quantised with TE's scale (448 / amax)
// holds a zero or subnormal code in about 1 of 7,000 codes, 0.45% of the runs of 32; one
// quantised with a scale of 1 (DelayedScaling's first) holds them in most runs. Every value is
// exact on each route, so the sums do not depend on the route.
//
// E2M1: the eight 4-bit codes of one 32-bit word shifted into eight lanes, the magnitude looked
// up in one register (vpermps reads the low 3 bits), the sign bit moved to bit 31.
#pragma once

#include <cstring>

#include "cpu/gemm/few_rows_widen.h"

#if defined(__x86_64__) || defined(_M_X64)  // elsewhere the avx2 tier is built on portable vectors
namespace te_kernels::cpu::avx2::gemm_detail {

template <>
struct FewRowsWiden<VecAvx2> {
  template <Fp8Format kFormat>
  static void fp8(const uint8_t* codes, VecAvx2& low, VecAvx2& high) {
    fp8_halves<kFormat, true>(codes, low, high);
  }
  static constexpr float kE4M3Unit = 1.0f / 256;  // the fp16 of an E4M3 code is its value times 2^-8
  // The F16C route; kNanCodes: whether E4M3's NaN code may be among the 16 codes.
  template <Fp8Format kFormat, bool kNanCodes>
  static void fp8_halves(const uint8_t* codes, VecAvx2& low, VecAvx2& high) {
    const __m256i code = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));  // 16 x u16
    __m256i half = _mm256_slli_epi16(code, 8);
    if constexpr (kFormat == Fp8Format::kE4M3) {
      // An arithmetic shift by one copies the sign into bit 14 as well; clear it there.
      half = _mm256_and_si256(_mm256_srai_epi16(half, 1), _mm256_set1_epi16(int16_t(0xbfff)));
      if constexpr (kNanCodes) {
        const __m256i nan_code = _mm256_set1_epi16(0x7f);
        const __m256i is_nan = _mm256_cmpeq_epi16(_mm256_and_si256(code, nan_code), nan_code);
        half = _mm256_or_si256(half, _mm256_and_si256(is_nan, _mm256_set1_epi16(0x7e00)));
      }
    }
    low.v = _mm256_cvtph_ps(_mm256_castsi256_si128(half));
    high.v = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
  }

  // Runs of 32 E4M3 codes (two steps) of C rows of b, checked at once: where every code of all of
  // them is a normal number, e4m3_run widens the run's steps by integer instructions; where none
  // is NaN, by F16C without the NaN code's blend; elsewhere the reader's load does. (E5M2, one
  // shift from its fp16, has nothing to gain.)
  static constexpr int kE4M3Run = 2;
  template <int C>
  static Fp8Run e4m3_run_kind(const uint8_t* const (&rows)[C]) {
    __m256i odd = e4m3_odd(rows[0]);
    for (int c = 1; c < C; ++c) odd = _mm256_or_si256(odd, e4m3_odd(rows[c]));
    if (_mm256_testz_si256(odd, _mm256_set1_epi8(char(0x80)))) return Fp8Run::kNormal;
    __m256i nan = e4m3_nan(rows[0]);
    for (int c = 1; c < C; ++c) nan = _mm256_or_si256(nan, e4m3_nan(rows[c]));
    return _mm256_testz_si256(nan, nan) ? Fp8Run::kFinite : Fp8Run::kAny;
  }
  template <Fp8Run kRun>
  static void e4m3_run(const uint8_t* codes, VecAvx2& low, VecAvx2& high) {
    static_assert(kRun != Fp8Run::kAny, "a run that may hold NaN takes the reader's load");
    if constexpr (kRun == Fp8Run::kNormal) {
      e4m3_normal(codes, low, high);
    } else {
      fp8_halves<Fp8Format::kE4M3, false>(codes, low, high);
    }
  }
  // 32 E4M3 codes' bytes, all ones where the code is NaN (s 1111 111).
  static __m256i e4m3_nan(const uint8_t* codes) {
    const __m256i code = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
    return _mm256_cmpeq_epi8(_mm256_or_si256(code, _mm256_set1_epi8(char(0x80))), _mm256_set1_epi8(char(0xff)));
  }
  // 32 E4M3 codes' bytes, each with its sign bit set where the code has exponent 0 (zero and the
  // subnormals) or is NaN (s 1111 111): the magnitude plus one is then 1..8 or NaN's 0x80 (-128
  // as a signed byte), which minus 9 (saturating) stays negative, while 9..127 become 0..118.
  static __m256i e4m3_odd(const uint8_t* codes) {
    const __m256i magnitude =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)), _mm256_set1_epi8(0x7f));
    return _mm256_subs_epi8(_mm256_add_epi8(magnitude, _mm256_set1_epi8(1)), _mm256_set1_epi8(9));
  }
  // 16 normal E4M3 codes as fp32, in order. Their 4-byte groups are reordered (0, 2, 1, 3), so that
  // sign-extended to 16-bit lanes each 128-bit lane holds codes 0..3 | 8..11 and 4..7 | 12..15.
  // Each lane becomes the bf16 bits of its code's value times 2^-8 (kE4M3Unit, as the F16C route
  // gives it): s eeee mmm shifted to bits 10..4, the sign's copies cleared from bits 14..11, the
  // exponent rebiased from 7 to 127 - 8 (e + 112 <= 127: no carry into the sign). Interleaved
  // above zeros, the low halves of the lanes are codes 0..7 as fp32, the high halves codes 8..15:
  // seven instructions, where two 8-code widenings to 32-bit lanes took eight.
  static void e4m3_normal(const uint8_t* codes, VecAvx2& low, VecAvx2& high) {
    const __m128i grouped =
        _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)), _MM_SHUFFLE(3, 1, 2, 0));
    const __m256i shifted = _mm256_slli_epi16(_mm256_cvtepi8_epi16(grouped), 4);
    const __m256i bf16 =
        _mm256_add_epi16(_mm256_and_si256(shifted, _mm256_set1_epi16(int16_t(0x87f0))), _mm256_set1_epi16(112 << 7));
    low.v = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), bf16));
    high.v = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), bf16));
  }
  static VecAvx2 e2m1(const uint8_t* pairs, float scale) {
    uint32_t word;
    std::memcpy(&word, pairs, sizeof(word));
    const __m256i nibbles =
        _mm256_srlv_epi32(_mm256_set1_epi32(int32_t(word)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);  // kE2m1Values
    const __m256 magnitude = _mm256_permutevar8x32_ps(magnitudes, nibbles);
    const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(nibbles, _mm256_set1_epi32(8)), 28));
    return {_mm256_mul_ps(_mm256_xor_ps(magnitude, sign), _mm256_set1_ps(scale))};
  }
};

}  // namespace te_kernels::cpu::avx2::gemm_detail
#endif
