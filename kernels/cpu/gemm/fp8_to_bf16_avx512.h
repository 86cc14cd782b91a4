// FP8 codes to bf16, 32 at a time, for the GEMM's AVX-512 paths (gemm_amx.cpp's packing,
// gemm_avx512.cpp's in-place rows): every E4M3 and E5M2 value, NaN included, is a bf16 value, so
// the widening is exact, and it is a table lookup. The table holds the bf16 bits of the 128
// magnitudes (from fp8_to_float, the scalar rule of fp8.cpp) in four registers; two
// two-register permutes index it by the low 7 bits and the sign bit moves from bit 7 to bit 15.
// Included after cpu/gemm/gemm_kernels.h and a unit's target pragma, on x86-64 only; the unnamed
// namespace gives each unit its own copy, built for that unit's target.
#pragma once

namespace te_kernels::cpu::avx512 {
namespace {

class Fp8ToBf16 {
 public:
  // The table of an operand's format, built once per format (on first use); null for bf16.
  static const Fp8ToBf16* of(GemmOperand format) {
    if (format == GemmOperand::kBFloat16) return nullptr;
    static const Fp8ToBf16 e4m3{Fp8Format::kE4M3}, e5m2{Fp8Format::kE5M2};
    return gemm_detail::fp8_format_of(format) == Fp8Format::kE4M3 ? &e4m3 : &e5m2;
  }

  explicit Fp8ToBf16(Fp8Format format) {
    alignas(64) uint16_t bits[128];
    alignas(64) uint8_t low_bytes[128], high_bytes[128];
    for (int code = 0; code < 128; ++code) {
      bits[code] = to_bf16(fp8_to_float(uint8_t(code), format)).bits;
      low_bytes[code] = uint8_t(bits[code]);
      high_bytes[code] = uint8_t(bits[code] >> 8);
    }
    for (int q = 0; q < 4; ++q) quarter_[q] = _mm512_load_si512(bits + 32 * q);
    for (int h = 0; h < 2; ++h) {
      low_[h] = _mm512_load_si512(low_bytes + 64 * h);
      high_[h] = _mm512_load_si512(high_bytes + 64 * h);
    }
  }

  // 64 codes -> 64 bf16 (first: codes 0-31, second: 32-63) with AVX512-VBMI, for the amx
  // tier alone (its CPUs all have it; cpu_isa.cpp checks): each byte of the result is one
  // 128-entry byte permute, half the instructions per code of widen().
  __attribute__((target("avx512vbmi"))) void widen64(__m512i codes, __m512i& first, __m512i& second) const {
    const __m512i magnitude = _mm512_and_si512(codes, _mm512_set1_epi8(0x7f));
    const __m512i low = _mm512_permutex2var_epi8(low_[0], magnitude, low_[1]);
    const __m512i high = _mm512_or_si512(_mm512_permutex2var_epi8(high_[0], magnitude, high_[1]),
                                         _mm512_and_si512(codes, _mm512_set1_epi8(char(0x80))));
    // The byte interleave works within 128-bit lanes: pairs of lanes back in order after.
    const __m512i even_lanes = _mm512_unpacklo_epi8(low, high), odd_lanes = _mm512_unpackhi_epi8(low, high);
    first = _mm512_permutex2var_epi64(even_lanes, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), odd_lanes);
    second = _mm512_permutex2var_epi64(even_lanes, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), odd_lanes);
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
  __m512i low_[2], high_[2];  // the table's low and high bytes, 64 codes a register
};

}  // namespace
}  // namespace te_kernels::cpu::avx512
