// The 8 x 8 transpose of fp32 lanes in YMM registers, for the avx2 tier's vectors
// (VecAvx2::transpose) and the x86 tiers' NVFP4 tile transposes: unpacks of row pairs, shuffles
// of row quadruples (within each 128-bit half), then the halves joined.
#pragma once

#include <immintrin.h>

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// x [8][8] -> its transpose, in place: lane j of x[i] becomes lane i of x[j].
inline void transpose_8x8_ps(__m256 (&x)[8]) {
  __m256 pairs[8], quads[8];
  for (int k = 0; k < 4; ++k) {  // columns 0-1, then 2-3, of rows 2k and 2k + 1 (per half)
    pairs[2 * k] = _mm256_unpacklo_ps(x[2 * k], x[2 * k + 1]);
    pairs[2 * k + 1] = _mm256_unpackhi_ps(x[2 * k], x[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h + 3: quads[4h + m] holds column m (per half)
    const __m256* t = pairs + 4 * h;
    quads[4 * h] = _mm256_shuffle_ps(t[0], t[2], 0x44);
    quads[4 * h + 1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
    quads[4 * h + 2] = _mm256_shuffle_ps(t[1], t[3], 0x44);
    quads[4 * h + 3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    x[m] = _mm256_permute2f128_ps(quads[m], quads[4 + m], 0x20);
    x[4 + m] = _mm256_permute2f128_ps(quads[m], quads[4 + m], 0x31);
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
