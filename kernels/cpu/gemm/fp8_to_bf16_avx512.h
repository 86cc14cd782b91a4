// FP8 codes to bf16, 32 at a time, for the GEMM's AVX-512 packing (gemm_amx.cpp): every E4M3 and
// E5M2 value, NaN included, is a bf16 value, so the widening is exact, and it is a table lookup.
// The table holds the bf16 bits of the 128 magnitudes (from fp8_to_float, the scalar rule of
// fp8.cpp) in four registers; two two-register permutes index it by the low 7 bits and the
// sign bit moves from bit 7 to bit 15. Included after cpu/isa/tier_avx512.h, on x86-64 only.
#pragma once

namespace te_kernels::cpu::avx512 {

class Fp8ToBf16 {
 public:
  explicit Fp8ToBf16(Fp8Format format) {
    alignas(64) uint16_t bits[128];
    for (int code = 0; code < 128; ++code) bits[code] = to_bf16(fp8_to_float(uint8_t(code), format)).bits;
    for (int q = 0; q < 4; ++q) quarter_[q] = _mm512_load_si512(bits + 32 * q);
  }

  // 32 codes (one byte each) -> 32 bf16.
  __m512i widen(__m256i codes) const {
    const __m512i wide = _mm512_cvtepu8_epi16(codes);
    const __m512i magnitude = _mm512_and_si512(wide, _mm512_set1_epi16(0x7f));
    // Index bit 5 picks the second register of a pair, bit 6 the pair.
    const __m512i low = _mm512_permutex2var_epi16(quarter_[0], magnitude, quarter_[1]);
    const __m512i high = _mm512_permutex2var_epi16(quarter_[2], magnitude, quarter_[3]);
    const __m512i value = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(wide, _mm512_set1_epi16(0x40)), low, high);
    const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(wide, _mm512_set1_epi16(0x80)), 8);
    return _mm512_or_si512(value, sign);
  }

 private:
  __m512i quarter_[4];
};

}  // namespace te_kernels::cpu::avx512
