// The products of bf16 attention on AVX512-BF16 (vdpbf16ps), for the avx512 tier on x86-64:
// Bf16Dots<bf16_t> takes the products whose operands are both bf16 inputs, each instruction
// two products per fp32 lane (twice the fp32 FMA's work):
//   forward   S = Q K^T;
//   backward  S again, bit for bit as the forward (attention_layout::scores_by_rows), and
//             dP = dO V^T with D = rowsum(dO * out) in the same order.
// The product of two bf16 values is exact in fp32, so these differ from the fp32 FMA path only
// in the order of their fp32 sums; vdpbf16ps flushes denormal inputs and sums to zero (bf16
// inputs below 2^-126 count as zero). The products with P or dS (O += P V, dV, dK, dQ) stay on
// fp32 FMAs: rounding P or dS to bf16 for the instruction would add a rounding of its own
// (FlashAttention's GPU kernels take it; at 2^-9 of each term it put near-zero outputs off by
// up to 16% in our tests), and two bf16 parts of it would cost as many instructions as the FMAs.
//
// Operands are read as 32-bit pairs (x[2i] | x[2i + 1] << 16): a bf16 row as it lies is a row of
// pairs along its own length; the other operand of a tile product is packed so that each
// 32-bit lane holds the matching pair of one output column (pairs_of_columns).
#pragma once
#if !defined(TE_CPU_ISA_AVX512_X86)
#error "attention_bf16_dots.h belongs to the avx512 tier of an x86-64 build"
#endif

#include "cpu/attention/attention_tiles.h"
#include "te_kernels/cpu_isa.h"

#if !defined(TE_KERNELS_EMULATE_AVX512)  // the emulated test build has them from SIMDe (tier_avx512.h)
#pragma GCC push_options
#pragma GCC target("avx512bf16")
#endif

namespace te_kernels::cpu::avx512::attention_detail {

struct Bf16DotProducts {
  // C[m x n] += A[m x 2p] B[2p x n]: A as rows of p pairs (lda pairs apart), B as p rows of n
  // pair lanes (ldb apart), n a multiple of 16. Register tiles of R rows by NV vectors, as
  // gemm_acc's: each pair of A is one 32-bit broadcast into NV dot products.
  template <int R, int NV>
  static void pair_tile(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
                        int64_t pairs) {
    __m512 acc[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(c + r * ldc + v * 16);
    for (int64_t q = 0; q < pairs; ++q) {
      __m512bh bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + q * ldb + v * 16);
      for (int r = 0; r < R; ++r) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(int32_t(a[r * lda + q]));
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }

  template <int R>
  static void pair_columns(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
                           int64_t n, int64_t pairs) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) pair_tile<R, 4>(a, lda, b + j, ldb, c + j, ldc, pairs);
    for (; j < n; j += 16) pair_tile<R, 1>(a, lda, b + j, ldb, c + j, ldc, pairs);
  }

  // Not inlined into the (baseline avx512) callers: the instructions are compiled for this part only.
  static __attribute__((noinline)) void pair_gemm(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                                                  float* c, int64_t ldc, int64_t m, int64_t n, int64_t pairs) {
    int64_t i = 0;
    for (; i + 6 <= m; i += 6) pair_columns<6>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, pairs);
    switch (m - i) {
      case 5: return pair_columns<5>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, pairs);
      case 4: return pair_columns<4>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, pairs);
      case 3: return pair_columns<3>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, pairs);
      case 2: return pair_columns<2>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, pairs);
      case 1: return pair_columns<1>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, pairs);
      default: return;
    }
  }

  // out[i] = the sum of x[i]'s 16 lanes for i < N (N <= 8): the vectors added to each other in
  // a transposing tree (halves, quarters, then lanes of up to 8 vectors at once), about 30
  // instructions for 8 sums where one reduction each would take about 64. A fixed order:
  // the forward and the backward sum each score alike.
  template <int N>
  static void sum_lanes(const __m512* x, float* out) {
    static_assert(N >= 1 && N <= 8, "sum_lanes: 1 to 8 vectors");
    __m512 v[8];
    for (int i = 0; i < 8; ++i) v[i] = i < N ? x[i] : _mm512_setzero_ps();
    __m512 halves[4], quarters[2];
    for (int i = 0; i < 4; ++i)  // quarters [a0 + a2, a1 + a3, b0 + b2, b1 + b3] of a = v[2i], b = v[2i + 1]
      halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                                _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; ++i)  // quarter q: 4 lanes of v[4i + q]
      quarters[i] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0x88),
                                  _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0xDD));
    // Per quarter q: lane 0 sums v[q]'s lanes, lane 1 v[4 + q]'s.
    const __m512 pairs = _mm512_add_ps(_mm512_unpacklo_ps(quarters[0], quarters[1]),
                                       _mm512_unpackhi_ps(quarters[0], quarters[1]));
    float lanes[16];
    _mm512_storeu_ps(lanes, _mm512_add_ps(pairs, _mm512_permute_ps(pairs, 0x4E)));
    for (int i = 0; i < N; ++i) out[i] = lanes[4 * (i % 4) + i / 4];
  }

  // scores[r * ld + j] = q_r . k_j: rows of q as bf16, `width` apart and zero past the head dim
  // dk (width a multiple of 32), keys read where they lie (keys[j]); 32 values a load, masked to
  // the row's dk values, the 16 lanes summed at the end (sum_lanes).
  template <int R, int NK>
  static void dot_tile(const uint16_t* q, int64_t width, const bf16_t* const* keys, int64_t dk, float* scores,
                       int64_t ld) {
    __m512 acc[R][NK];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NK; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < dk; c += 32) {
      const __mmask32 present = dk - c >= 32 ? ~__mmask32(0) : __mmask32((uint32_t(1) << (dk - c)) - 1);
      __m512bh kv[NK];
      for (int j = 0; j < NK; ++j) kv[j] = (__m512bh)_mm512_maskz_loadu_epi16(present, keys[j] + c);
      for (int r = 0; r < R; ++r) {
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + r * width + c);
        for (int j = 0; j < NK; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], qv, kv[j]);
      }
    }
    float sums[R * NK];
    sum_lanes<R * NK>(&acc[0][0], sums);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NK; ++j) scores[r * ld + j] = sums[r * NK + j];
  }

  template <int R>
  static void dot_keys(const uint16_t* q, int64_t width, const bf16_t* const* keys, int64_t nk, int64_t dk,
                       float* scores, int64_t ld) {
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) dot_tile<R, 2>(q, width, keys + j, dk, scores + j, ld);
    if (j < nk) dot_tile<R, 1>(q, width, keys + j, dk, scores + j, ld);
  }

  static __attribute__((noinline)) void dot_rows(const uint16_t* q, int64_t width, const bf16_t* const* keys,
                                                 int64_t dk, int64_t rows, int64_t nk, float* scores, int64_t ld) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) dot_keys<4>(q + r * width, width, keys, nk, dk, scores + r * ld, ld);
    switch (rows - r) {
      case 3: return dot_keys<3>(q + r * width, width, keys, nk, dk, scores + r * ld, ld);
      case 2: return dot_keys<2>(q + r * width, width, keys, nk, dk, scores + r * ld, ld);
      case 1: return dot_keys<1>(q + r * width, width, keys, nk, dk, scores + r * ld, ld);
      default: return;
    }
  }

  // dst[c] = src[c] for c < n, zero for c in [n, padded): a row to be read as pairs.
  static void copy_row(const bf16_t* src, int64_t n, int64_t padded, uint16_t* dst) {
    std::memcpy(dst, src, size_t(n) * sizeof(uint16_t));
    std::fill(dst + n, dst + padded, uint16_t(0));
  }

  // dst[q][j] = (row_j[2q], row_j[2q + 1]) for j < nk, q < (n + 1) / 2 (row_j = row(j), n values,
  // an odd n's last pair (row_j[n - 1], 0)); dst[q][j] = 0 for j in [nk, cols). The B operand of
  // a product along the rows' length (S = Q K^T: keys as columns; dP = dO V^T; D).
  template <typename RowOf>
  static void pairs_of_columns(RowOf row, int64_t nk, int64_t cols, int64_t n, uint32_t* dst, int64_t ld) {
    const int64_t whole = n / 2, pairs = (n + 1) / 2;
    for (int64_t j = 0; j < nk; ++j) {
      const bf16_t* values = row(j);
      for (int64_t q = 0; q < whole; ++q) std::memcpy(dst + q * ld + j, values + 2 * q, sizeof(uint32_t));
      if (pairs > whole) dst[whole * ld + j] = values[n - 1].bits;
    }
    for (int64_t q = 0; q < pairs; ++q) std::fill(dst + q * ld + nk, dst + q * ld + cols, 0u);
  }
};

// The products of Forward<bf16_t> and Backward<bf16_t> where the CPU has the dot products
// (attention_tiles.h's primary template says none are compiled elsewhere).
template <>
struct Bf16Dots<bf16_t> : Bf16DotProducts {
  static constexpr bool kCompiled = true;
  static bool available() { return cpu_has_avx512_bf16(); }
};

}  // namespace te_kernels::cpu::avx512::attention_detail

#if !defined(TE_KERNELS_EMULATE_AVX512)
#pragma GCC pop_options
#endif
