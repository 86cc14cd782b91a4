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
#include "cpu/simd/transpose_avx512.h"
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

  // One step of dot_tile: the 32 values [c, c + 32) of the keys (masked to `present`) against
  // those of the query rows, asking for the same values of ahead[j] (j < ahead_count).
  template <int R, int NK>
  static void dot_step(const uint16_t* q, int64_t width, const bf16_t* const* keys, int64_t c, __mmask32 present,
                       const bf16_t* const* ahead, int64_t ahead_count, __m512 (&acc)[R][NK]) {
    for (int j = 0; j < NK && j < ahead_count; ++j) __builtin_prefetch(ahead[j] + c, 0, 2);
    __m512bh kv[NK];
    for (int j = 0; j < NK; ++j) {
      kv[j] = (__m512bh)(present == ~__mmask32(0) ? _mm512_loadu_si512(keys[j] + c)
                                                   : _mm512_maskz_loadu_epi16(present, keys[j] + c));
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + r * width + c);
      for (int j = 0; j < NK; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], qv, kv[j]);
    }
  }

  // scores[r * ld + j] = q_r . k_j for r < R, j < NK (both at most 4): rows of q as bf16,
  // `width` apart and zero past the head dim dk (width a multiple of 32), keys read where they
  // lie (keys[j]), 32 values a step; the 16 lanes summed at the end (VecAvx512::sum_lanes, score (r, j) in
  // lane 4 r + j). Each 64 bytes of a key row read asks for the same 64 bytes of ahead[j]
  // (j < ahead_count) into L2: one prefetch per line, spread over the products (a burst of them
  // would fill the miss buffers and stall). The step of a head dim's last values, if fewer
  // than 32, is masked and out of the loop: GCC keeps the sums of a loop with a masked load in
  // memory, stored at every step.
  template <int R, int NK>
  static void dot_tile(const uint16_t* q, int64_t width, const bf16_t* const* keys, int64_t dk, float* scores,
                       int64_t ld, const bf16_t* const* ahead, int64_t ahead_count) {
    __m512 acc[R][NK];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NK; ++j) acc[r][j] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= dk; c += 32) dot_step<R, NK>(q, width, keys, c, ~__mmask32(0), ahead, ahead_count, acc);
    if (c < dk) dot_step<R, NK>(q, width, keys, c, (uint32_t(1) << (dk - c)) - 1, ahead, ahead_count, acc);
    for (int j = 0; j < NK && j < ahead_count; ++j) __builtin_prefetch(ahead[j] + dk - 1, 0, 2);  // an unaligned row's last line
    VecAvx512 lanes[16];
    for (int i = 0; i < 16; ++i) lanes[i] = {i / 4 < R && i % 4 < NK ? acc[i / 4][i % 4] : _mm512_setzero_ps()};
    const __m512 sums = VecAvx512::sum_lanes(lanes).v;
    const __mmask8 row = __mmask8((1u << NK) - 1);
    if constexpr (R > 0) _mm_mask_storeu_ps(scores, row, _mm512_extractf32x4_ps(sums, 0));
    if constexpr (R > 1) _mm_mask_storeu_ps(scores + ld, row, _mm512_extractf32x4_ps(sums, 1));
    if constexpr (R > 2) _mm_mask_storeu_ps(scores + 2 * ld, row, _mm512_extractf32x4_ps(sums, 2));
    if constexpr (R > 3) _mm_mask_storeu_ps(scores + 3 * ld, row, _mm512_extractf32x4_ps(sums, 3));
  }

  template <int R>
  static void dot_keys(const uint16_t* q, int64_t width, const bf16_t* const* keys, int64_t nk, int64_t dk,
                       float* scores, int64_t ld, const bf16_t* const* ahead, int64_t ahead_count) {
    // The tile of keys from j asks for ahead[j, ...) while there are any.
    const auto ahead_of = [&](int64_t j) { return j < ahead_count ? ahead + j : nullptr; };
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) dot_tile<R, 4>(q, width, keys + j, dk, scores + j, ld, ahead_of(j), ahead_count - j);
    switch (nk - j) {
      case 3: return dot_tile<R, 3>(q, width, keys + j, dk, scores + j, ld, ahead_of(j), ahead_count - j);
      case 2: return dot_tile<R, 2>(q, width, keys + j, dk, scores + j, ld, ahead_of(j), ahead_count - j);
      case 1: return dot_tile<R, 1>(q, width, keys + j, dk, scores + j, ld, ahead_of(j), ahead_count - j);
      default: return;
    }
  }

  // scores[r * ld + j] = q_r . k_j for r < rows, j < nk (dot_tile), four rows at a time; the
  // first four ask for the rows ahead (`ahead`, ahead_count of them: the step after this one's
  // keys), the others find the keys in cache.
  static __attribute__((noinline)) void dot_rows(const uint16_t* q, int64_t width, const bf16_t* const* keys,
                                                 int64_t dk, int64_t rows, int64_t nk, float* scores, int64_t ld,
                                                 const bf16_t* const* ahead = nullptr, int64_t ahead_count = 0) {
    for (int64_t r = 0; r < rows; r += 4) {
      const int64_t asked = r == 0 ? ahead_count : 0;
      switch (std::min<int64_t>(rows - r, 4)) {
        case 4: dot_keys<4>(q + r * width, width, keys, nk, dk, scores + r * ld, ld, ahead, asked); break;
        case 3: dot_keys<3>(q + r * width, width, keys, nk, dk, scores + r * ld, ld, ahead, asked); break;
        case 2: dot_keys<2>(q + r * width, width, keys, nk, dk, scores + r * ld, ld, ahead, asked); break;
        default: dot_keys<1>(q + r * width, width, keys, nk, dk, scores + r * ld, ld, ahead, asked); break;
      }
    }
  }

  // dst[c] = src[c] for c < n, zero for c in [n, padded): a row to be read as pairs.
  static void copy_row(const bf16_t* src, int64_t n, int64_t padded, uint16_t* dst) {
    std::memcpy(dst, src, size_t(n) * sizeof(uint16_t));
    std::fill(dst + n, dst + padded, uint16_t(0));
  }

  // The bf16 bits of a value bf16 holds exactly: a bf16 input, or an fp32 FP8 code value (P's
  // and G's codes, FP8 attention's widened inputs), whose low 16 bits are zero.
  static uint16_t bits_of(bf16_t x) { return x.bits; }
  static uint16_t bits_of(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    return uint16_t(u >> 16);
  }

  // dst[j] = (x[2j], x[2j + 1]) for j < n / 2, n even: a row of fp32 values that bf16 holds
  // exactly (FP8 attention's P and G) as the A operand of a product along its length.
  static void pairs_of_values(const float* x, int64_t n, uint32_t* dst) {
    for (int64_t j = 0; j < n / 2; ++j) dst[j] = uint32_t(bits_of(x[2 * j])) | uint32_t(bits_of(x[2 * j + 1])) << 16;
  }

  // dst[q * ld + c] = (row(2q)[c], row(2q + 1)[c]) for c < width, q < count / 2 (an odd count's
  // last pair (row(count - 1)[c], 0)); zero for c in [width, cols) and for q in
  // [(count + 1) / 2, pairs): the B operand of a product along the rows' index (FP8 attention's
  // P V over keys, P^T dO and G^T Q over queries, G K over keys). row(i) points to values bf16
  // holds exactly (bf16_t, or fp32 FP8 code values).
  template <typename RowOf>
  static void pairs_of_rows(RowOf row, int64_t count, int64_t width, int64_t cols, int64_t pairs, uint32_t* dst,
                            int64_t ld) {
    for (int64_t q = 0; q < pairs; ++q) {
      uint32_t* out = dst + q * ld;
      if (2 * q >= count) {
        std::fill(out, out + cols, 0u);
        continue;
      }
      const auto* even = row(2 * q);
      if (2 * q + 1 < count) {
        const auto* odd = row(2 * q + 1);
        for (int64_t c = 0; c < width; ++c) out[c] = uint32_t(bits_of(even[c])) | uint32_t(bits_of(odd[c])) << 16;
      } else {
        for (int64_t c = 0; c < width; ++c) out[c] = uint32_t(bits_of(even[c]));
      }
      std::fill(out + width, out + cols, 0u);
    }
  }

  // dst[q][j] = (row_j[2q], row_j[2q + 1]) for j < nk, q < (n + 1) / 2 (row_j = row(j), n values,
  // an odd n's last pair (row_j[n - 1], 0)); dst[q][j] = 0 for j in [nk, cols). The B operand of
  // a product along the rows' length (S = Q K^T: keys as columns; dP = dO V^T; D).
  // Sixteen rows at a time and 16 whole pairs (32 values) of each, a 16 x 16 transpose of their
  // 32-bit pairs in registers; the rest pair by pair.
  template <typename RowOf>
  static void pairs_of_columns(RowOf row, int64_t nk, int64_t cols, int64_t n, uint32_t* dst, int64_t ld) {
    const int64_t whole = n / 2, pairs = (n + 1) / 2;
    // Row j's pairs from q_from on, one at a time.
    const auto one_by_one = [&](int64_t j, int64_t q_from) {
      const bf16_t* values = row(j);
      for (int64_t q = q_from; q < whole; ++q) std::memcpy(dst + q * ld + j, values + 2 * q, sizeof(uint32_t));
      if (pairs > whole) dst[whole * ld + j] = values[n - 1].bits;
    };
    int64_t j0 = 0;
    for (; j0 + 16 <= nk; j0 += 16) {
      int64_t q0 = 0;
      for (; q0 + 16 <= whole; q0 += 16) {
        __m512i lanes[16];  // [row][pair] -> [pair][row]
        for (int r = 0; r < 16; ++r) lanes[r] = _mm512_loadu_si512(row(j0 + r) + 2 * q0);
        transpose_16x16_epi32(lanes);
        for (int q = 0; q < 16; ++q) _mm512_storeu_si512(dst + (q0 + q) * ld + j0, lanes[q]);
      }
      for (int64_t j = j0; j < j0 + 16; ++j) one_by_one(j, q0);
    }
    for (int64_t j = j0; j < nk; ++j) one_by_one(j, 0);
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
