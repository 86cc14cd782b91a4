// The GEMM compiled for the avx512 tier: AMX-BF16 tiles at the amx tier (gemm_amx.cpp), else
// bf16 dot products (AVX512-BF16) where the CPU has them, else fp32 FMAs, 12 x 32 sums in 24 ZMM
// registers either way; up to 16 rows of a on the dot products wherever the CPU has them, else
// on fp32 FMAs reading b in place (gemm_few_rows_fma.h).
#include "te_kernels/gemm.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx512.h"
#include "cpu/gemm/gemm_kernels.h"
#include "cpu/gemm/gemm_few_rows_fma.h"
#include "te_kernels/cpu_isa.h"

#if defined(__x86_64__) || defined(_M_X64)
// Only DotKernel uses the instructions; gemm_bf16 below calls it after checking the CPU.
#if !defined(TE_KERNELS_EMULATE_AVX512)  // the emulated test build has them from SIMDe (tier_avx512.h)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#endif
#include "cpu/gemm/fp8_to_bf16_avx512.h"
#include "cpu/gemm/nvfp4_to_bf16_avx512.h"

#include <type_traits>

namespace te_kernels::cpu::avx512::gemm_detail {

// Rows of an operand as 32 bf16 at a time: bf16 values as they are, FP8 codes widened by
// fp8_to_bf16_avx512.h's table, NVFP4 codes and scales by nvfp4_to_bf16_avx512.h's. load(row, k)
// reads values [k, k + 32) of a row (k a multiple of 32); with `present`, zeros past it.
struct Bf16Rows {
  const bf16_t* data;
  int64_t ld;
  __m512i load(int64_t row, int64_t k) const { return _mm512_loadu_si512(data + row * ld + k); }
  __m512i load(int64_t row, int64_t k, __mmask32 present) const {
    return _mm512_maskz_loadu_epi16(present, data + row * ld + k);
  }
  const void* at(int64_t row, int64_t k) const { return data + row * ld + k; }
  static constexpr int64_t kValuesPerLine = 32;  // values of a row in 64 bytes
};

struct CodeRows {
  const uint8_t* data;
  int64_t ld;
  const Fp8ToBf16* to_bf16;
  __m512i load(int64_t row, int64_t k) const {
    return to_bf16->widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + row * ld + k)));
  }
  __m512i load(int64_t row, int64_t k, __mmask32 present) const {
    return to_bf16->widen(_mm256_maskz_loadu_epi8(present, data + row * ld + k));
  }
  const void* at(int64_t row, int64_t k) const { return data + row * ld + k; }
  static constexpr int64_t kValuesPerLine = 64;
};

// Block-scaled FP8 codes: each 32 codes widened as CodeRows does, then times their block's
// scale in fp32 and rounded to bf16 as the tier's stores round (nearest even): the values of
// fp8_block_dequantize to bf16, bit for bit. x is the operand whose rows from row0 on these are.
struct ScaledCodeRows {
  CodeRows codes;
  const Operand* x;
  int64_t row0;
  __m512i load(int64_t row, int64_t k) const { return scaled(codes.load(row, k), x->block_scale(row0 + row, k)); }
  __m512i load(int64_t row, int64_t k, __mmask32 present) const {
    return scaled(codes.load(row, k, present), x->block_scale(row0 + row, k));
  }
  const void* at(int64_t row, int64_t k) const { return codes.at(row, k); }
  static constexpr int64_t kValuesPerLine = CodeRows::kValuesPerLine;
  static __m512i scaled(__m512i values, float scale) {
    const auto half = [&](__m256i words) {
      const __m512 wide = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(words), 16));
      return (Vec{wide} * Vec::broadcast(scale)).bf16_rounded_lanes();
    };
    const __m512i odd_words = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                               27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);  // the high halves
    return _mm512_permutex2var_epi16(half(_mm512_castsi512_si256(values)), odd_words,
                                     half(_mm512_extracti64x4_epi64(values, 1)));
  }
};

struct Nvfp4Rows {
  const uint8_t* codes;
  int64_t ld;
  const uint8_t* scales;
  int64_t ld_scales;
  const Nvfp4ToBf16* to_bf16;
  __m512i load(int64_t row, int64_t k) const { return to_bf16->widen(codes + row * ld, scales + row * ld_scales, k); }
  __m512i load(int64_t row, int64_t k, __mmask32 present) const {
    return to_bf16->widen(codes + row * ld, scales + row * ld_scales, k, present);
  }
  const void* at(int64_t row, int64_t k) const { return codes + row * ld + k / 2; }
  static constexpr int64_t kValuesPerLine = 128;
};

// f(rows) with the rows of x from row0 on, in their format's reader.
template <typename F>
void with_rows(const Operand& x, int64_t row0, const F& f) {
  switch (x.format) {
    case GemmOperand::kBFloat16: return f(Bf16Rows{x.bf16_row(row0), x.ld});
    case GemmOperand::kNvfp4:
      return f(Nvfp4Rows{x.code_row(row0), x.ld, x.scale_row(row0), x.ld_scales, &Nvfp4ToBf16::get()});
    case GemmOperand::kFp8E4M3:
    case GemmOperand::kFp8E5M2: {
      const CodeRows codes{x.code_row(row0), x.ld, Fp8ToBf16::of(x.format)};
      if (x.is_block_scaled()) return f(ScaledCodeRows{codes, &x, row0});
      return f(codes);
    }
  }
}

// Values [k0, k0 + kc) (k0 a multiple of 32) of count rows as bf16, rows ld_out apart.
template <typename Rows>
void widen_rows(const Rows& rows, int64_t count, int64_t k0, int64_t kc, bf16_t* out, int64_t ld_out) {
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t q = 0; q < kc; q += 32) {
      const __mmask32 present = __mmask32((uint64_t(1) << std::min<int64_t>(32, kc - q)) - 1);
      _mm512_mask_storeu_epi16(out + r * ld_out + q, present, rows.load(r, k0 + q, present));
    }
  }
}

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

  // row_as_bf16, with NVFP4 rows widened in registers (k0 is a multiple of kKc).
  static const bf16_t* row_as_bf16_in_registers(const Operand& x, int64_t r, int64_t k0, int64_t kc,
                                                bf16_t* staging) {
    if (!x.is_nvfp4()) return row_as_bf16(x, r, k0, kc, staging);
    with_rows(x, r, [&](const auto& rows) { widen_rows(rows, 1, k0, kc, staging, kc); });
    return staging;
  }

  template <Side kSide>
  static void pack(const Operand& x, int64_t row0, int64_t count, int64_t k0, int64_t kc, uint32_t* out,
                   bf16_t* staging) {
    constexpr int kWidth = kSide == Side::kA ? kMr : kNr;
    const int64_t whole_pairs = kc / 2, pairs = rows(kc);
    for (int64_t r = 0; r < count; ++r) {
      const bf16_t* row = row_as_bf16_in_registers(x, row0 + r, k0, kc, staging);
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
// horizontal sum of one register of dot products. R rows of a meet C rows of b at a time; the C
// rows of b stay in L1 for the next R rows of a, so that b, the one operand too large for the
// caches, comes from memory once. FP8 and NVFP4 codes are widened in registers (the readers
// above), so that a quantised weight is read at its own size (a byte or half a byte per
// element, and NVFP4's scales): all of a (at
// most 16 rows) first, into a buffer that stays in L2; b in registers as it is read where one
// group of R rows takes all of a, else C rows at a time into a buffer that stays in L1, for the
// groups to share. (Measured on 2 Xeon cores, [16, 4096] x [4096, 4096]: all 16 rows against one
// row of b at a time, reading b once but a 16 times per value of b, took 5.0 ms for bf16
// against 2.9.)
constexpr int64_t kInPlaceRows = 8;
constexpr int64_t kInPlaceMaxRows = 2 * kInPlaceRows;
constexpr int kInPlaceCols = 3;
// With at most kInPlaceWideRows rows of a, twice the rows of b meet them at a time (4 x 6 sums):
// more loads in flight for the one operand that comes from memory.
constexpr int64_t kInPlaceWideRows = 4;
constexpr int kInPlaceWideCols = 6;

// Rows [i0, i0 + R) of a against the first C rows of b, which are rows [j0, j0 + C) of the GEMM's b.
// Every 64 bytes of a row of b read ask for the same values of the `ahead` rows of b after these
// (the next block's) into L2: the hardware prefetcher stops at every 4 KiB page, and a row of FP8
// codes [k = 4096] is one page, so without this each row's first lines would come from memory at
// its full latency. (Rows 64 bytes apart in the address stream touch each line once, aligned or not.)
// Block-scaled FP8 b (ScaledCodeRows) has its codes widened alone, and each k-block's fp32 sums
// times the block's scale added into the running sums by one FMA: the order of TE's block-scaled
// GEMM, and, the scales being powers of two, each block's sums scaled exactly.
template <int R, int C, typename BRows>
void in_place_block(const GemmBf16Params& p, const Bf16Rows& a, const BRows& b, int64_t i0, int64_t j0, int ahead) {
  using Sums = __m512[R][C];
  const auto zero = [](Sums& sums) {
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) sums[r][c] = _mm512_setzero_ps();
    }
  };
  const auto step = [&](Sums& sums, auto load_a, auto load_b) {
    __m512bh b_values[C];
    for (int c = 0; c < C; ++c) b_values[c] = (__m512bh)load_b(c);
    for (int r = 0; r < R; ++r) {
      const __m512bh a_values = (__m512bh)load_a(i0 + r);
      for (int c = 0; c < C; ++c) sums[r][c] = _mm512_dpbf16_ps(sums[r][c], a_values, b_values[c]);
    }
  };
  // sums += the products of values [begin, end) of k, rows of b read by `rows`.
  const auto sum_range = [&](Sums& sums, const auto& rows, int64_t begin, int64_t end) {
    using Rows = std::decay_t<decltype(rows)>;
    int64_t k = begin;
    for (; k + 32 <= end; k += 32) {
      if (k % Rows::kValuesPerLine == 0) {
        for (int c = 0; c < ahead; ++c) _mm_prefetch(static_cast<const char*>(rows.at(C + c, k)), _MM_HINT_T1);
      }
      step(sums, [&](int64_t r) { return a.load(r, k); }, [&](int64_t j) { return rows.load(j, k); });
    }
    if (k < end) {  // the last values of k, zeros past them on both sides
      const __mmask32 present = __mmask32((uint64_t(1) << (end - k)) - 1);
      step(sums, [&](int64_t r) { return a.load(r, k, present); }, [&](int64_t j) { return rows.load(j, k, present); });
    }
  };
  Sums acc;
  zero(acc);
  if constexpr (std::is_same_v<BRows, ScaledCodeRows>) {
    const int64_t k_per_scale = b.x->blocks.k_per_scale;
    for (int64_t k0 = 0; k0 < p.k; k0 += k_per_scale) {
      Sums block;
      zero(block);
      sum_range(block, b.codes, k0, std::min(p.k, k0 + k_per_scale));
      for (int c = 0; c < C; ++c) {
        const __m512 scale = _mm512_set1_ps(b.x->block_scale(b.row0 + c, k0));
        for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(block[r][c], scale, acc[r][c]);
      }
    }
  } else {
    sum_range(acc, b, 0, p.k);
  }
  float sums[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) sums[r][c] = _mm512_reduce_add_ps(acc[r][c]);
  }
  store_output(p, &sums[0][0], C, i0, j0, R, C);  // the packed path's epilogue
}

// in_place_block<R, C> for R = rows (1..kInPlaceRows) and C = cols (1..kInPlaceWideCols).
template <int R = kInPlaceRows, int C = kInPlaceWideCols, typename BRows>
void in_place_block_of(int rows, int cols, const GemmBf16Params& p, const Bf16Rows& a, const BRows& b, int64_t i0,
                       int64_t j0, int ahead) {
  if constexpr (R > 0 && C > 0) {
    if (rows < R) return in_place_block_of<R - 1, C>(rows, cols, p, a, b, i0, j0, ahead);
    if (cols < C) return in_place_block_of<R, C - 1>(rows, cols, p, a, b, i0, j0, ahead);
    in_place_block<R, C>(p, a, b, i0, j0, ahead);
  }
}

// Every group of rows of a against the first cols rows of b (the GEMM's rows [j0, j0 + cols)); the
// first group asks for the `ahead` rows of b after them (in_place_block), the others find b in L1.
template <typename BRows>
void in_place_columns(const GemmBf16Params& p, const Bf16Rows& a, const BRows& b, int64_t j0, int cols, int ahead) {
  // Block-scaled b keeps a k-block's sums beside the running ones: groups of at most 12 sums each.
  const int64_t group = std::is_same_v<BRows, ScaledCodeRows> ? std::max<int64_t>(1, 12 / std::max(cols, 1))
                                                               : kInPlaceRows;
  for (int64_t i0 = 0; i0 < p.m; i0 += group) {
    in_place_block_of(int(std::min(group, p.m - i0)), cols, p, a, b, i0, j0, i0 == 0 ? ahead : 0);
  }
}

#if !defined(TE_KERNELS_EMULATE_AVX512)
// Up to kVbmiRows rows of a against C rows of FP8 b, on CPUs with AVX512-VBMI: b's codes read 64
// at a time and widened by byte permutes (Fp8ToBf16::widen64: half the instructions per code of
// CodeRows' widening, which bounded the FP8 GEMV on Zen 4: [1, 4096] x [4096, 4096] in 0.57 ms
// where bf16 weights of twice the bytes took 0.85). The same sums as in_place_block's, added in
// the same order (values [k, k + 32) before [k + 32, k + 64) into each sum), the same prefetches,
// and for block-scaled b (k-blocks of a multiple of 64 values) the same per-block FMA. Written
// without lambdas: GCC compiles a lambda without its enclosing function's target.
#define TE_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")))
constexpr int64_t kVbmiRows = 2;

// sums += the products of values [begin, end) of k (begin a multiple of 64), rows of b read by `codes`.
template <int R, int C>
TE_VBMI_TARGET inline void sum_range_vbmi(__m512 (&sums)[R][C], const Bf16Rows& a, const CodeRows& codes, int64_t i0,
                                          int64_t begin, int64_t end, int ahead) {
  int64_t k = begin;
  for (; k + 64 <= end; k += 64) {
    for (int c = 0; c < ahead; ++c) _mm_prefetch(static_cast<const char*>(codes.at(C + c, k)), _MM_HINT_T1);
    __m512i first[C], second[C];  // b's values [k, k + 32) and [k + 32, k + 64)
    for (int c = 0; c < C; ++c) codes.to_bf16->widen64(_mm512_loadu_si512(codes.at(c, k)), first[c], second[c]);
    for (int r = 0; r < R; ++r) {
      const __m512bh a_first = (__m512bh)a.load(i0 + r, k), a_second = (__m512bh)a.load(i0 + r, k + 32);
      for (int c = 0; c < C; ++c) {
        sums[r][c] = _mm512_dpbf16_ps(sums[r][c], a_first, (__m512bh)first[c]);
        sums[r][c] = _mm512_dpbf16_ps(sums[r][c], a_second, (__m512bh)second[c]);
      }
    }
  }
  for (; k < end; k += 32) {  // the last values, 32 at a time, zeros past them on both sides
    const __mmask32 present = __mmask32((uint64_t(1) << std::min<int64_t>(32, end - k)) - 1);
    __m512bh values[C];
    for (int c = 0; c < C; ++c) values[c] = (__m512bh)codes.load(c, k, present);
    for (int r = 0; r < R; ++r) {
      const __m512bh a_values = (__m512bh)a.load(i0 + r, k, present);
      for (int c = 0; c < C; ++c) sums[r][c] = _mm512_dpbf16_ps(sums[r][c], a_values, values[c]);
    }
  }
}

template <int R, int C, typename BRows>
TE_VBMI_TARGET void in_place_block_vbmi(const GemmBf16Params& p, const Bf16Rows& a, const BRows& b, int64_t j0,
                                        int ahead) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  if constexpr (std::is_same_v<BRows, ScaledCodeRows>) {
    const int64_t k_per_scale = b.x->blocks.k_per_scale;
    for (int64_t k0 = 0; k0 < p.k; k0 += k_per_scale) {
      __m512 block[R][C];
      for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) block[r][c] = _mm512_setzero_ps();
      }
      sum_range_vbmi<R, C>(block, a, b.codes, 0, k0, std::min(p.k, k0 + k_per_scale), ahead);
      for (int c = 0; c < C; ++c) {
        const __m512 scale = _mm512_set1_ps(b.x->block_scale(b.row0 + c, k0));
        for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(block[r][c], scale, acc[r][c]);
      }
    }
  } else {
    sum_range_vbmi<R, C>(acc, a, b, 0, 0, p.k, ahead);
  }
  float sums[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) sums[r][c] = _mm512_reduce_add_ps(acc[r][c]);
  }
  store_output(p, &sums[0][0], C, 0, j0, R, C);
}

// in_place_block_vbmi<R, C> for R = rows (1..kVbmiRows) and C = cols (1..kInPlaceWideCols).
template <int R = kVbmiRows, int C = kInPlaceWideCols, typename BRows>
void in_place_block_vbmi_of(int rows, int cols, const GemmBf16Params& p, const Bf16Rows& a, const BRows& b,
                            int64_t j0, int ahead) {
  if constexpr (R > 0 && C > 0) {
    if (rows < R) return in_place_block_vbmi_of<R - 1, C>(rows, cols, p, a, b, j0, ahead);
    if (cols < C) return in_place_block_vbmi_of<R, C - 1>(rows, cols, p, a, b, j0, ahead);
    in_place_block_vbmi<R, C>(p, a, b, j0, ahead);
  }
}

// Whether in_place_block_vbmi reads b: FP8 codes per tensor, or in k-blocks of whole 64-code steps.
inline bool vbmi_reads(const CodeRows&) { return true; }
inline bool vbmi_reads(const ScaledCodeRows& b) { return b.x->blocks.k_per_scale % 64 == 0; }
#undef TE_VBMI_TARGET
#endif

void gemm_few_rows(const GemmBf16Params& p, const ThreadPool& pool) {
  const Operand a_operand = operand_a(p), b_operand = operand_b(p);
  thread_local KeptScratch a_scratch, b_scratch;
  Bf16Rows a{a_operand.is_bf16() ? a_operand.bf16_row(0) : nullptr, a_operand.ld};
  if (!a_operand.is_bf16()) {
    bf16_t* const widened = a_scratch.reserve<bf16_t>(size_t(p.m * p.k));
    with_rows(a_operand, 0, [&](const auto& rows) { widen_rows(rows, p.m, 0, p.k, widened, p.k); });
    a = Bf16Rows{widened, p.k};
  }
  const int block_cols = p.m <= kInPlaceWideRows ? kInPlaceWideCols : kInPlaceCols;
  const int64_t col_blocks = (p.n + block_cols - 1) / block_cols;
#if !defined(TE_KERNELS_EMULATE_AVX512)
  const bool vbmi = p.m <= kVbmiRows && cpu_has_avx512_vbmi();  // FP8 b widened 64 codes at a time
#endif
  pool.parallel_for(col_blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t j0 = block * block_cols;
      const int cols = int(std::min<int64_t>(block_cols, p.n - j0));
      // The rows of this thread's next block, which its reads ask for ahead.
      const int ahead = block + 1 < end ? int(std::min<int64_t>(block_cols, p.n - j0 - cols)) : 0;
      with_rows(b_operand, j0, [&](const auto& b) {
#if !defined(TE_KERNELS_EMULATE_AVX512)
        using B = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<B, CodeRows> || std::is_same_v<B, ScaledCodeRows>) {
          if (vbmi && vbmi_reads(b)) return in_place_block_vbmi_of(int(p.m), cols, p, a, b, j0, ahead);
        }
#endif
        if (std::is_same_v<std::decay_t<decltype(b)>, Bf16Rows> || p.m <= kInPlaceRows) {
          in_place_columns(p, a, b, j0, cols, ahead);
        } else {
          bf16_t* const widened = b_scratch.reserve<bf16_t>(size_t(block_cols * p.k));  // [cols, k]
          widen_rows(b, cols, 0, p.k, widened, p.k);
          in_place_columns(p, a, Bf16Rows{widened, p.k}, j0, cols, 0);
        }
      });
    }
  });
}

}  // namespace te_kernels::cpu::avx512::gemm_detail
#endif

namespace te_kernels::cpu::avx512 {

#if defined(__x86_64__) || defined(_M_X64)
namespace gemm_detail {
// gemm_amx.cpp: the tiles for up to kAmxFewRows rows of a, and for more; b packed ahead for them.
constexpr int64_t kAmxFewRows = 32;
void gemm_amx_few_rows(const GemmBf16Params& params, const ThreadPool& pool);
void gemm_amx(const GemmBf16Params& params, const ThreadPool& pool);
size_t amx_packed_b_bytes(int64_t n, int64_t k);
void amx_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool);
}  // namespace gemm_detail
#endif

using FmaKernel = gemm_detail::FmaKernel<Vec, 12>;

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
#if defined(__x86_64__) || defined(_M_X64)
  // The AMX tiles' packing reads per-tensor codes and NVFP4 alone: block-scaled FP8 goes to the
  // AVX512-BF16 dot products, which every AMX CPU has.
  if (active_cpu_isa() == CpuIsa::kAmx && params.a_blocks.data == nullptr && params.b_blocks.data == nullptr) {
    if (params.m <= gemm_detail::kAmxFewRows) return gemm_detail::gemm_amx_few_rows(params, pool);
    return gemm_detail::gemm_amx(params, pool);
  }
  if (cpu_has_avx512_bf16()) {
    if (params.m <= gemm_detail::kInPlaceMaxRows) return gemm_detail::gemm_few_rows(params, pool);
    return gemm_detail::gemm<gemm_detail::DotKernel>(params, pool);
  }
#endif
  if (params.m <= gemm_detail::kFmaFewRows) return gemm_detail::gemm_few_rows_fma(params, pool);
  gemm_detail::gemm<FmaKernel>(params, pool);
}

// The layout of the kernel gemm_bf16 above packs b for.
size_t gemm_bf16_packed_b_bytes(int64_t n, int64_t k) {
#if defined(__x86_64__) || defined(_M_X64)
  if (active_cpu_isa() == CpuIsa::kAmx) return gemm_detail::amx_packed_b_bytes(n, k);
  if (cpu_has_avx512_bf16()) return gemm_detail::packed_b_bytes<gemm_detail::DotKernel>(n, k);
#endif
  return gemm_detail::packed_b_bytes<FmaKernel>(n, k);
}

void gemm_bf16_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool) {
#if defined(__x86_64__) || defined(_M_X64)
  if (active_cpu_isa() == CpuIsa::kAmx) return gemm_detail::amx_pack_b(params, packed, pool);
  if (cpu_has_avx512_bf16()) return gemm_detail::pack_b<gemm_detail::DotKernel>(params, packed, pool);
#endif
  gemm_detail::pack_b<FmaKernel>(params, packed, pool);
}

}  // namespace te_kernels::cpu::avx512
