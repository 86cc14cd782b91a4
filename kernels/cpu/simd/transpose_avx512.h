// The 16 x 16 transpose of 32-bit lanes in registers, for the avx512 tier's packing of pairs of
// bf16 (the AMX GEMM's b panels, the attention dot products' K^T): three rounds of unpacks
// within 128-bit blocks, then two of block shuffles.
#pragma once

#include <immintrin.h>

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// x [16][16] of 32-bit lanes -> its transpose, in place: lane j of x[i] becomes lane i of x[j].
inline void transpose_16x16_epi32(__m512i x[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    x[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    x[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    x[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    x[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8) {
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(x[i + j], x[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(x[i + j], x[i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    x[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    x[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
