// The GEMM compiled for the avx512 tier: AMX-BF16 tiles at the amx tier (gemm_amx.cpp), else
// bf16 dot products (AVX512-BF16) where the CPU has them, else fp32 FMAs, 12 x 32 sums in 24 ZMM
// registers either way; up to 16 rows of a on the dot products wherever the CPU has them.
#include "te_kernels/gemm.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx512.h"
#include "cpu/gemm/gemm_kernels.h"
#include "te_kernels/cpu_isa.h"

#if defined(__x86_64__) || defined(_M_X64)
// Only DotKernel uses the instructions; gemm_bf16 below calls it after checking the CPU.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace te_kernels::cpu::avx512::gemm_detail {

// vdpbf16ps: each fp32 lane of the sum takes the products of one pair of k values (exact in
// fp32), odd element first. Both operands are packed as pairs (b[j, 2q] | b[j, 2q + 1] << 16),
// b as [k / 2][32] and a as [k / 2][12], so that a pair of a's row is one broadcast 32-bit
// load; an odd k pairs its last value with a zero on both sides. The instruction flushes
// denormal inputs and results to zero: FP8 codes and their products and sums are normal fp32
// numbers (E5M2's smallest product is 2^-32), so it matters only for operands scaled far
// below that.
struct DotKernel {
  static constexpr int kMr = 12;
  static constexpr int kNr = 32;
  static constexpr int64_t kKc = 256;
  static constexpr int64_t kMc = 96;
  using Packed = uint32_t;
  struct Scope {};

  static int64_t rows(int64_t kc) { return (kc + 1) / 2; }

  template <Side kSide>
  static void pack(const Operand& x, int64_t row0, int64_t count, int64_t k0, int64_t kc, uint32_t* out,
                   bf16_t* staging) {
    constexpr int kWidth = kSide == Side::kA ? kMr : kNr;
    const int64_t whole_pairs = kc / 2, pairs = rows(kc);
    for (int64_t r = 0; r < count; ++r) {
      const bf16_t* row = row_as_bf16(x, row0 + r, k0, kc, staging);
      for (int64_t q = 0; q < whole_pairs; ++q) std::memcpy(out + q * kWidth + r, row + 2 * q, sizeof(uint32_t));
      if (pairs > whole_pairs) out[whole_pairs * kWidth + r] = row[kc - 1].bits;  // an odd k: (last, 0)
    }
    for (int64_t r = count; r < kWidth; ++r) {
      for (int64_t q = 0; q < pairs; ++q) out[q * kWidth + r] = 0;
    }
  }

  static void tile(const uint32_t* a, int64_t kc, const uint32_t* b, float* c, int64_t ldc, bool accumulate) {
    __m512 acc[kMr][2];
    for (int r = 0; r < kMr; ++r) {
      acc[r][0] = accumulate ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
      acc[r][1] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
    }
    const int64_t pairs = rows(kc);
    for (int64_t q = 0; q < pairs; ++q) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + q * kNr);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + q * kNr + 16);
      for (int r = 0; r < kMr; ++r) {
        const __m512bh x = (__m512bh)_mm512_set1_epi32(int32_t(a[q * kMr + r]));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
      }
    }
    for (int r = 0; r < kMr; ++r) {
      _mm512_storeu_ps(c + r * ldc, acc[r][0]);
      _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
  }
};

// Few rows of a (the tokens of a decoding step): packing b, the weight, would cost more than
// the GEMM, so both operands are read in place, 32 values of k a load, and each output is the
// horizontal sum of one register of dot products. R rows of a meet C rows of b at a time; b is
// read once per kInPlaceRows rows of a. FP8 operands are widened first: all of a (at most 16
// rows), and b kInPlaceCols rows at a time, into buffers that stay in L1 and L2.
constexpr int64_t kInPlaceRows = 8;
constexpr int64_t kInPlaceMaxRows = 2 * kInPlaceRows;
constexpr int kInPlaceCols = 3;

// a: rows of a from row i0, lda apart; b: rows of b from row j0, ldb apart; both bf16.
template <int R, int C>
void in_place_block(const GemmBf16Params& p, const bf16_t* a, int64_t lda, const bf16_t* b, int64_t ldb,
                    int64_t i0, int64_t j0) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const auto step = [&](auto load) {
    __m512bh b_values[C];
    for (int c = 0; c < C; ++c) b_values[c] = (__m512bh)load(b + c * ldb);
    for (int r = 0; r < R; ++r) {
      const __m512bh a_values = (__m512bh)load(a + r * lda);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a_values, b_values[c]);
    }
  };
  int64_t k = 0;
  for (; k + 32 <= p.k; k += 32) step([k](const bf16_t* row) { return _mm512_loadu_si512(row + k); });
  if (k < p.k) {  // the last values of k, zeros past them on both sides
    const __mmask32 mask = __mmask32((uint64_t(1) << (p.k - k)) - 1);
    step([k, mask](const bf16_t* row) { return _mm512_maskz_loadu_epi16(mask, row + k); });
  }
  float sums[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) sums[r][c] = _mm512_reduce_add_ps(acc[r][c]);
  }
  store_output(p, &sums[0][0], C, i0, j0, R, C);  // the packed path's epilogue
}

// in_place_block<R, C> for R = rows (1..kInPlaceRows) and C = cols (1..kInPlaceCols).
template <int R = kInPlaceRows, int C = kInPlaceCols>
void in_place_block_of(int rows, int cols, const GemmBf16Params& p, const bf16_t* a, int64_t lda, const bf16_t* b,
                       int64_t ldb, int64_t i0, int64_t j0) {
  if constexpr (R > 0 && C > 0) {
    if (rows < R) return in_place_block_of<R - 1, C>(rows, cols, p, a, lda, b, ldb, i0, j0);
    if (cols < C) return in_place_block_of<R, C - 1>(rows, cols, p, a, lda, b, ldb, i0, j0);
    in_place_block<R, C>(p, a, lda, b, ldb, i0, j0);
  }
}

// Rows [row0, row0 + count) of x as bf16 rows ld apart: x itself, or widened into `widened`
// ([count, k] bf16, allocated here once per call or per thread).
const bf16_t* rows_as_bf16(const Operand& x, int64_t row0, int64_t count, int64_t k, AlignedArray<bf16_t>& widened,
                           int64_t& ld) {
  if (x.is_bf16()) {
    ld = x.ld;
    return x.bf16_row(row0);
  }
  for (int64_t r = 0; r < count; ++r) row_as_bf16(x, row0 + r, 0, k, widened.get() + r * k);
  ld = k;
  return widened.get();
}

void gemm_few_rows(const GemmBf16Params& p, const ThreadPool& pool) {
  const Operand a_operand = operand_a(p), b_operand = operand_b(p);
  AlignedArray<bf16_t> a_widened{a_operand.is_bf16() ? 0 : size_t(p.m * p.k)};
  int64_t lda = 0;
  const bf16_t* a = rows_as_bf16(a_operand, 0, p.m, p.k, a_widened, lda);
  const int64_t col_blocks = (p.n + kInPlaceCols - 1) / kInPlaceCols;
  pool.parallel_for(col_blocks, 16, [&](int64_t begin, int64_t end) {
    AlignedArray<bf16_t> b_widened{b_operand.is_bf16() ? 0 : size_t(kInPlaceCols * p.k)};
    for (int64_t block = begin; block < end; ++block) {
      const int64_t j0 = block * kInPlaceCols;
      const int cols = int(std::min<int64_t>(kInPlaceCols, p.n - j0));
      int64_t ldb = 0;
      const bf16_t* b = rows_as_bf16(b_operand, j0, cols, p.k, b_widened, ldb);
      for (int64_t i0 = 0; i0 < p.m; i0 += kInPlaceRows) {
        in_place_block_of(int(std::min(kInPlaceRows, p.m - i0)), cols, p, a + i0 * lda, lda, b, ldb, i0, j0);
      }
    }
  });
}

}  // namespace te_kernels::cpu::avx512::gemm_detail
#endif

namespace te_kernels::cpu::avx512 {

#if defined(__x86_64__) || defined(_M_X64)
namespace gemm_detail {
void gemm_amx(const GemmBf16Params& params, const ThreadPool& pool);  // gemm_amx.cpp
}
#endif

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
#if defined(__x86_64__) || defined(_M_X64)
  if (cpu_has_avx512_bf16()) {
    if (params.m <= gemm_detail::kInPlaceMaxRows) return gemm_detail::gemm_few_rows(params, pool);
    if (active_cpu_isa() == CpuIsa::kAmx) return gemm_detail::gemm_amx(params, pool);
    return gemm_detail::gemm<gemm_detail::DotKernel>(params, pool);
  }
#endif
  gemm_detail::gemm<gemm_detail::FmaKernel<Vec, 12>>(params, pool);
}

}  // namespace te_kernels::cpu::avx512
