// FewRowsWiden (few_rows_widen.h) for the avx2 tier. FP8: 16 codes in one pass of 16-bit lanes,
// into the fp16 bit patterns of VecAvx2::load_fp8 (E5M2: the code is the fp16's top byte; E4M3,
// one exponent bit shorter and shifted one bit further, is the fp16 of its value times 2^-8,
// its NaN code made the fp16 NaN), then two F16C conversions: half the integer work per code of
// two 8-code loads, which bounded the [1, 4096] x [4096, 4096] FP8 GEMV on 2 Zen 3 cores. E2M1:
// the eight 4-bit codes of one 32-bit word shifted into eight lanes, the magnitude looked up in
// one register (vpermps reads the low 3 bits), the sign bit moved to bit 31.
#pragma once

#include <cstring>

#include "cpu/gemm/few_rows_widen.h"

#if defined(__x86_64__) || defined(_M_X64)  // elsewhere the avx2 tier is built on portable vectors
namespace te_kernels::cpu::avx2::gemm_detail {

template <>
struct FewRowsWiden<VecAvx2> {
  template <Fp8Format kFormat>
  static void fp8(const uint8_t* codes, VecAvx2& low, VecAvx2& high) {
    const __m256i code = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));  // 16 x u16
    __m256i half = _mm256_slli_epi16(code, 8);
    if constexpr (kFormat == Fp8Format::kE4M3) {
      // An arithmetic shift by one copies the sign into bit 14 as well; clear it there.
      half = _mm256_and_si256(_mm256_srai_epi16(half, 1), _mm256_set1_epi16(int16_t(0xbfff)));
      const __m256i nan_code = _mm256_set1_epi16(0x7f);
      const __m256i is_nan = _mm256_cmpeq_epi16(_mm256_and_si256(code, nan_code), nan_code);
      half = _mm256_or_si256(half, _mm256_and_si256(is_nan, _mm256_set1_epi16(0x7e00)));
    }
    low.v = _mm256_cvtph_ps(_mm256_castsi256_si128(half));
    high.v = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
    if constexpr (kFormat == Fp8Format::kE4M3) {
      low.v = _mm256_mul_ps(low.v, _mm256_set1_ps(256.0f));
      high.v = _mm256_mul_ps(high.v, _mm256_set1_ps(256.0f));
    }
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
