// The NVFP4 x NVFP4 micro-kernel of the avx2 tier, on AVX2's byte products (vpmaddubsw) instead of
// fp32 FMAs: a gemm_kernels.h policy, included by gemm_avx2.cpp after gemm_kernels.h (x86-64 only).
//
// Why it is exact. Twice an E2M1 value is an integer in [-12, 12], so the 16 products of a block
// of a row of a and a row of b are integers: 4 * sum(a_k * b_k) is an integer of at most
// 16 * 144 = 2304 in magnitude, exact in int16 and in fp32. Times b's E4M3 block scale (4
// significant bits) and a's divided by 4 (a power of two, never below 2^-11) the block's sum is
// still exact in fp32, so each block adds one exact value to the fp32 running sum: TE's tensor-core
// order (each block's sum times its two scales, then the blocks added in k order), one rounding
// per block where the FMA kernel rounds once per k.
//
// vpmaddubsw multiplies unsigned bytes of one operand by signed bytes of the other and adds
// adjacent pairs into int16: a's values go in offset by 12 (u = 2a + 12 in [0, 24]) and each
// block's sum over k of u * (2b) loses 12 * sum(2b), which the packing of b stores per column
// and block (the correction). Every int16 partial stays within 8 * 24 * 12 = 2304: no saturation.
//
// Packed layout (Packed = uint8_t, kBytesPerBlock bytes per row or column and block of 16 k):
//   tile of a (kMr rows), per block: [kMr][16] u bytes, then kMr fp32 scales (a's scale / 4)
//   panel of b (16 columns), per block: [4 quads of k][16 columns][4 k] signed bytes 2b, then 16
//   int32 corrections, then 16 fp32 scales
// Rows or columns past the operand and k past its end are zero values with scale 0.
#pragma once

#include <cstring>

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace gemm_detail {

constexpr int64_t kBytesPerBlock = 24;  // 16 code bytes, a 4-byte scale, a 4-byte correction (b)
constexpr int kOffsetA = 12;            // u = 2a + 12
constexpr int kPanelColumns = 16;       // a panel of b
// Where a panel's block of b keeps its corrections and its scales, after the 16 x 16 code bytes.
constexpr int kPanelCorrectionsAt = kPanelColumns * 16;
constexpr int kPanelScalesAt = kPanelColumns * 20;

// Twice the E2M1 value of each code (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), as bytes.
inline __m128i twice_e2m1_table() {
  return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

// The 16 values of a whole block (8 bytes of codes, the even k in each low nibble) as bytes 2v.
inline __m128i twice_values_of_block(const uint8_t* codes) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
  return _mm_shuffle_epi8(twice_e2m1_table(), _mm_unpacklo_epi8(low, high));  // k order
}

// Values [k0, k0 + count) of an NVFP4 row, count <= 16, as bytes 2v; zero past count. Whole
// blocks by shuffles, a ragged last block value by value.
inline __m128i twice_values(const uint8_t* codes, int64_t k0, int64_t count) {
  if (count == kNvfp4Block) return twice_values_of_block(codes + k0 / 2);
  alignas(16) int8_t values[kNvfp4Block] = {};
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = k0 + i;
    const int code = codes[k / 2] >> (4 * (k % 2)) & 0xf;
    values[i] = int8_t(2 * e2m1_value(uint8_t(code)));
  }
  return _mm_load_si128(reinterpret_cast<const __m128i*>(values));
}

template <int Mr>
struct Nvfp4ByteKernel {
  static constexpr int kMr = Mr;
  static constexpr int kNr = kPanelColumns;
  static constexpr int64_t kKc = 512;  // a panel's slice: 512 * 24 bytes = 12 KiB, in L1
  static constexpr int64_t kMc = 96;
  using Packed = uint8_t;
  struct Scope {};

  static int64_t rows(int64_t kc) { return (kc + kNvfp4Block - 1) / kNvfp4Block * kBytesPerBlock; }

  template <Side kSide>
  static void pack(const Operand& x, int64_t row0, int64_t count, int64_t k0, int64_t kc, uint8_t* out, bf16_t*) {
    const float* scale_values = e4m3_values();
    const int64_t blocks = (kc + kNvfp4Block - 1) / kNvfp4Block;
    constexpr int kWidth = kSide == Side::kA ? kMr : kNr;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      uint8_t* block = out + blk * kWidth * kBytesPerBlock;
      const int64_t k = k0 + blk * kNvfp4Block, values = std::min<int64_t>(kNvfp4Block, k0 + kc - k);
      float* scales = reinterpret_cast<float*>(block + (kSide == Side::kA ? kMr * 16 : kPanelScalesAt));
      for (int r = 0; r < kWidth; ++r) {
        const bool present = r < count;
        const __m128i twice = present ? twice_values(x.code_row(row0 + r), k, values) : _mm_setzero_si128();
        const float scale = present ? scale_values[x.scale_row(row0 + r)[k / kNvfp4Block]] : 0.0f;
        if constexpr (kSide == Side::kA) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(block + r * 16),
                           _mm_add_epi8(twice, _mm_set1_epi8(kOffsetA)));
          scales[r] = scale * 0.25f;  // exact: a power of two, and E4M3's least value 2^-9 stays normal
        } else {
          alignas(16) uint32_t quads[4];
          _mm_store_si128(reinterpret_cast<__m128i*>(quads), twice);
          for (int q = 0; q < 4; ++q) std::memcpy(block + q * 64 + r * 4, &quads[q], 4);
          // sum(2b) from the sum of (2b + 12) over the 16 bytes (unsigned, so psadbw adds them)
          const __m128i sums = _mm_sad_epu8(_mm_add_epi8(twice, _mm_set1_epi8(kOffsetA)), _mm_setzero_si128());
          const int sum = _mm_cvtsi128_si32(sums) + _mm_extract_epi16(sums, 4) - kOffsetA * kNvfp4Block;
          reinterpret_cast<int32_t*>(block + kPanelCorrectionsAt)[r] = kOffsetA * sum;
          scales[r] = scale;
        }
      }
    }
  }

  // c[kMr, 16] (+)= the blocks of a_tile . b_panel: per block, the int16 partials of each row's
  // two vectors of 8 columns (4 k a lane pair step), joined to int32 by vpmaddwd, corrected,
  // converted and scaled (exact), then added to the fp32 sums.
  static void tile(const uint8_t* a, int64_t kc, const uint8_t* b, float* c, int64_t ldc, bool accumulate) {
    __m256 acc[kMr][2];
    for (int r = 0; r < kMr; ++r) {
      acc[r][0] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
      acc[r][1] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
    }
    const int64_t blocks = (kc + kNvfp4Block - 1) / kNvfp4Block;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t blk = 0; blk < blocks; ++blk, a += kMr * kBytesPerBlock, b += kNr * kBytesPerBlock) {
      const float* a_scales = reinterpret_cast<const float*>(a + kMr * 16);
      const int32_t* corrections = reinterpret_cast<const int32_t*>(b + kPanelCorrectionsAt);
      const float* b_scales = reinterpret_cast<const float*>(b + kPanelScalesAt);
      // Row by row, b's 8 vectors read from L1 again for each: the sums of all rows at once
      // would not fit the 16 YMM registers beside the int16 partials.
      for (int r = 0; r < kMr; ++r) {
        __m256i partial[2];
        for (int q = 0; q < 4; ++q) {
          int32_t quad;
          std::memcpy(&quad, a + r * 16 + q * 4, 4);
          const __m256i u = _mm256_set1_epi32(quad);
          for (int h = 0; h < 2; ++h) {
            const __m256i codes = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + q * 64 + 32 * h));
            const __m256i p = _mm256_maddubs_epi16(u, codes);
            partial[h] = q == 0 ? p : _mm256_add_epi16(partial[h], p);
          }
        }
        const __m256 a_scale = _mm256_broadcast_ss(a_scales + r);
        for (int h = 0; h < 2; ++h) {
          const __m256i offset_share = _mm256_load_si256(reinterpret_cast<const __m256i*>(corrections + 8 * h));
          const __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(partial[h], ones), offset_share);
          const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_load_ps(b_scales + 8 * h));
          acc[r][h] = _mm256_fmadd_ps(scaled, a_scale, acc[r][h]);
        }
      }
    }
    for (int r = 0; r < kMr; ++r) {
      _mm256_storeu_ps(c + r * ldc, acc[r][0]);
      _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
    }
  }
};

}  // namespace gemm_detail
}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
