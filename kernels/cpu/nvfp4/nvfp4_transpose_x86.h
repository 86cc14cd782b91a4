// 16 x 16 tile transposes on YMM registers for the x86 tiers' Nvfp4Lanes::transpose_tile
// (nvfp4_lanes_avx2.h, nvfp4_lanes_avx512.h): a gathered strip of the transposed usage reads
// 16 input rows' contiguous runs of 16 values, once each, and writes the tile's 16 columns as
// contiguous runs of the strip's rows. Pure data movement, so every tier's values are the
// scalar gather's, bit for bit.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/simd/transpose_avx2.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// dst[c * dst_stride + r] = src[r * src_stride + c] for 16-bit values, r, c < 16: one row per
// register; word, dword and qword unpacks of row pairs (within each 128-bit half: columns
// 0-7, then 8-15) leave register m of each 8-row half holding columns m and 8 + m of those
// rows, and 128-bit permutes join the halves.
inline void transpose16x16_u16(const uint16_t* src, int64_t src_stride, uint16_t* dst, int64_t dst_stride) {
  __m256i a[16], b[16];
  for (int r = 0; r < 16; ++r) a[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + r * src_stride));
  for (int k = 0; k < 8; ++k) {  // b[2k]: columns 0-3 of rows 2k, 2k + 1 (per half); b[2k + 1]: columns 4-7
    b[2 * k] = _mm256_unpacklo_epi16(a[2 * k], a[2 * k + 1]);
    b[2 * k + 1] = _mm256_unpackhi_epi16(a[2 * k], a[2 * k + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // rows 4q .. 4q + 3: a[4q + m] holds columns 2m, 2m + 1
    const __m256i* t = b + 4 * q;
    a[4 * q] = _mm256_unpacklo_epi32(t[0], t[2]);
    a[4 * q + 1] = _mm256_unpackhi_epi32(t[0], t[2]);
    a[4 * q + 2] = _mm256_unpacklo_epi32(t[1], t[3]);
    a[4 * q + 3] = _mm256_unpackhi_epi32(t[1], t[3]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7: b[8h + m] holds column m (per half)
    const __m256i* u = a + 8 * h;
    for (int m = 0; m < 4; ++m) {
      b[8 * h + 2 * m] = _mm256_unpacklo_epi64(u[m], u[m + 4]);
      b[8 * h + 2 * m + 1] = _mm256_unpackhi_epi64(u[m], u[m + 4]);
    }
  }
  for (int m = 0; m < 8; ++m) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + m * dst_stride),
                        _mm256_permute2x128_si256(b[m], b[8 + m], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (8 + m) * dst_stride),
                        _mm256_permute2x128_si256(b[m], b[8 + m], 0x31));
  }
}

// The same for an 8 x 8 tile of fp32 values.
inline void transpose8x8_f32(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m256 rows[8];
  for (int r = 0; r < 8; ++r) rows[r] = _mm256_loadu_ps(src + r * src_stride);
  transpose_8x8_ps(rows);
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * dst_stride, rows[c]);
}

// A 16 x 16 tile of T (fp32, or any 16-bit type) transposed: see transpose16x16_u16.
template <typename T>
inline void transpose_tile_x86(const T* src, int64_t src_stride, T* dst, int64_t dst_stride) {
  if constexpr (sizeof(T) == 2) {
    transpose16x16_u16(reinterpret_cast<const uint16_t*>(src), src_stride, reinterpret_cast<uint16_t*>(dst),
                       dst_stride);
  } else {
    static_assert(sizeof(T) == 4, "fp32 or a 16-bit type");
    const float* s = reinterpret_cast<const float*>(src);
    float* d = reinterpret_cast<float*>(dst);
    for (int r = 0; r < 16; r += 8) {
      for (int c = 0; c < 16; c += 8) {
        transpose8x8_f32(s + r * src_stride + c, src_stride, d + c * dst_stride + r, dst_stride);
      }
    }
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
