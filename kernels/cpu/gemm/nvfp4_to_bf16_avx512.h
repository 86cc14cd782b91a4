// NVFP4 values to bf16, 32 at a time, for the GEMM's AVX-512 paths (gemm_avx512.cpp's packing and
// in-place rows, gemm_amx.cpp's): 16 bytes of codes (two a byte, the even value in the low
// nibble) and the two E4M3 scales of their blocks. Each code indexes a 16-entry register of its
// E2M1 values in fp32 and the product with the block's scale is exact in fp32 (2 significant
// bits times 4); so is its bf16, the upper half of the fp32 bits, taken by one permute.
// Included after cpu/gemm/gemm_kernels.h and a unit's target pragma, on x86-64 only; the unnamed
// namespace gives each unit its own copy, built for that unit's target.
#pragma once

namespace te_kernels::cpu::avx512 {
namespace {

class Nvfp4ToBf16 {
 public:
  static const Nvfp4ToBf16& get() {
    static const Nvfp4ToBf16 table;
    return table;
  }

  Nvfp4ToBf16() {
    alignas(64) float values[16];
    for (int code = 0; code < 16; ++code) values[code] = e2m1_value(uint8_t(code));
    e2m1_ = _mm512_load_ps(values);
    for (int code = 0; code < 256; ++code) scales_[code] = fp8_to_float(uint8_t(code), Fp8Format::kE4M3);
    alignas(64) uint16_t high_halves[32];
    for (int i = 0; i < 32; ++i) high_halves[i] = uint16_t(2 * i + 1);
    high_halves_ = _mm512_load_si512(high_halves);
  }

  // Values [k, k + 32) of a row (k a multiple of 16) as 32 bf16; those past `present` are zero
  // (a ragged k: only the bytes and scales of present values are read).
  __m512i widen(const uint8_t* codes, const uint8_t* scales, int64_t k, __mmask32 present) const {
    const int values = present == __mmask32(~0u) ? 32 : __builtin_popcount(present);
    const __mmask16 bytes_present = __mmask16((1u << ((values + 1) / 2)) - 1);
    const __m128i bytes = _mm_maskz_loadu_epi8(bytes_present, codes + k / 2);
    const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
    const __m128i first = _mm_unpacklo_epi8(low, high), second = _mm_unpackhi_epi8(low, high);  // codes in order
    const __m512 scale_first = _mm512_set1_ps(scales_[scales[k / kNvfp4Block]]);
    const __m512 scale_second = _mm512_set1_ps(values > 16 ? scales_[scales[k / kNvfp4Block + 1]] : 0.0f);
    const __m512 value_first = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(first), e2m1_), scale_first);
    const __m512 value_second =
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(second), e2m1_), scale_second);
    const __m512i bf16 = _mm512_permutex2var_epi16(_mm512_castps_si512(value_first), high_halves_,
                                                   _mm512_castps_si512(value_second));
    return _mm512_maskz_mov_epi16(present, bf16);
  }

  // The same for a whole 32 values (no mask).
  __m512i widen(const uint8_t* codes, const uint8_t* scales, int64_t k) const {
    return widen(codes, scales, k, __mmask32(~0u));
  }

 private:
  __m512 e2m1_;        // the 16 codes' values
  __m512i high_halves_;  // word indices 1, 3, ..., 63: the bf16 halves of two registers of fp32
  float scales_[256];  // every E4M3 scale's value
};

}  // namespace
}  // namespace te_kernels::cpu::avx512
