// Few rows of a (the tokens of a decoding step) on the tiers that multiply in fp32 FMAs: avx2,
// portable, and avx512 CPUs without AVX512-BF16. Included by cpu/gemm/gemm_<tier>.cpp after
// gemm_kernels.h.
//
// The packed path (gemm_kernels.h) writes all of b widened to fp32 before it multiplies: for a
// [1, 4096] x [4096, 4096] GEMM that is 64 MiB written and read again for 32 MiB of bf16 weights
// (16 MiB of FP8 codes) read once, while the products are only 4096 x 4096 FMAs. Here b is read
// where it lies, 2 * Vec::kWidth values of a row at a time, widened in registers (bf16 by a shift,
// FP8 and NVFP4 by few_rows_widen.h: E2M1 values times the block's E4M3 scale; E4M3 values may
// come times a power of two, the tier's kE4M3Unit, whose inverse then multiplies a), and each
// output is the horizontal sum of one register of fp32 sums: exact products (every value is
// exact in fp32), fp32 sums, the packed path's epilogue. a (at most kFmaFewRows rows) is widened
// to fp32 once, into a buffer that stays in L2. Threads take blocks of C rows of b (C outputs
// per row of a); every 64 bytes read of a row of b ask for the same values of the next block's
// rows, for the reason in_place_block of gemm_avx512.cpp gives (the hardware prefetcher stops at
// each 4 KiB page). Block-scaled FP8 b has each k-block's sums times the block's scale added to
// the running sums by one FMA, as TE's block-scaled GEMM orders it. With more than
// kFmaGroupRows rows of a, C rows of b are widened to fp32 once (a staging buffer in L2) for the
// groups of rows of a to share, instead of each group widening them again.
#pragma once

#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu/gemm/few_rows_widen.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace gemm_detail {

constexpr int64_t kFmaFewRows = 16;
// Rows of a against rows of b at a time: with at most kFmaNarrowRows rows of a, kFmaNarrowCols
// rows of b (more loads from memory in flight); else groups of kFmaGroupRows rows of a against
// kFmaGroupCols rows of b (12 sums beside one row of b's two vectors: within 16 AVX2 registers).
constexpr int kFmaNarrowRows = 2;
constexpr int kFmaNarrowCols = 4;
constexpr int kFmaGroupRows = 4;
constexpr int kFmaGroupCols = 3;

// Readers of the rows of b from row0 on: load(row, k, low, high) is values [k, k + kStep) as fp32
// (k a multiple of kStep, the values within the row); value(row, k) is one value.
constexpr int64_t kStep = 2 * Vec::kWidth;

// bf16 rows as they lie, or fp32 ones: b's rows widened once for many rows of a to share (widen_b_rows).
template <typename T>
struct PlainValues {
  const T* data;
  int64_t ld;
  void load(int64_t row, int64_t k, Vec& low, Vec& high) const {
    low = Vec::load(data + row * ld + k);
    high = Vec::load(data + row * ld + k + Vec::kWidth);
  }
  float value(int64_t row, int64_t k) const { return to_float(data[row * ld + k]); }
  const void* at(int64_t row, int64_t k) const { return data + row * ld + k; }
  static constexpr int64_t kValuesPerLine = 64 / sizeof(T);
};
using Bf16Values = PlainValues<bf16_t>;
using F32Values = PlainValues<float>;

template <Fp8Format kFormat>
struct Fp8Values {
  const uint8_t* data;
  int64_t ld;
  void load(int64_t row, int64_t k, Vec& low, Vec& high) const {
    FewRowsWiden<Vec>::template fp8<kFormat>(data + row * ld + k, low, high);
  }
  // Runs of kRun steps of E4M3 codes the tier checks at once, C rows of b together (run_kind),
  // and widens as the check allows (load_run; few_rows_widen.h). Templates, so that readers and
  // tiers without the check never name it.
  static constexpr int kRun = kFormat == Fp8Format::kE4M3 ? FewRowsWiden<Vec>::kE4M3Run : 1;
  template <int C, typename Widen = FewRowsWiden<Vec>>
  Fp8Run run_kind(int64_t k) const {
    const uint8_t* rows[C];
    for (int c = 0; c < C; ++c) rows[c] = data + c * ld + k;
    return Widen::template e4m3_run_kind<C>(rows);
  }
  template <Fp8Run kKind, typename Widen = FewRowsWiden<Vec>>
  void load_run(int64_t row, int64_t k, Vec& low, Vec& high) const {
    Widen::template e4m3_run<kKind>(data + row * ld + k, low, high);
  }
  // The unit of the values load gives: E4M3's values come times the tier's kE4M3Unit.
  static constexpr float kUnit = kFormat == Fp8Format::kE4M3 ? FewRowsWiden<Vec>::kE4M3Unit : 1.0f;
  float value(int64_t row, int64_t k) const { return fp8_to_float(data[row * ld + k], kFormat) * kUnit; }
  const void* at(int64_t row, int64_t k) const { return data + row * ld + k; }
  static constexpr int64_t kValuesPerLine = 64;
};

// The unit of a reader's values (its kUnit), else 1.
template <typename Values, typename = void>
struct UnitOf {
  static constexpr float value = 1.0f;
};
template <typename Values>
struct UnitOf<Values, std::void_t<decltype(Values::kUnit)>> {
  static constexpr float value = Values::kUnit;
};

// The steps of a reader's checked runs (its kRun), else 1.
template <typename Values, typename = void>
struct RunOf : std::integral_constant<int, 1> {};
template <typename Values>
struct RunOf<Values, std::void_t<decltype(Values::kRun)>> : std::integral_constant<int, Values::kRun> {};

// Block-scaled FP8 codes: the codes' reader, and the operand whose rows from row0 on they are (its scales).
template <Fp8Format kFormat>
struct ScaledFp8Values {
  Fp8Values<kFormat> codes;
  const Operand* x;
  int64_t row0;
};
template <typename Values>
struct IsScaled : std::false_type {};
template <Fp8Format kFormat>
struct IsScaled<ScaledFp8Values<kFormat>> : std::true_type {};

// NVFP4: one E4M3 scale per 16 values; each vector's values lie within one block (the width divides 16).
struct Nvfp4Values {
  const uint8_t* codes;
  int64_t ld;
  const uint8_t* scales;
  int64_t ld_scales;
  const float* scale_values;  // e4m3_values()
  static_assert(kNvfp4Block % Vec::kWidth == 0, "a vector's values must lie within one NVFP4 block");
  void load(int64_t row, int64_t k, Vec& low, Vec& high) const {
    const float first = scale(row, k);
    const float second = kStep <= kNvfp4Block ? first : scale(row, k + Vec::kWidth);
    low = FewRowsWiden<Vec>::e2m1(codes + row * ld + k / 2, first);
    high = FewRowsWiden<Vec>::e2m1(codes + row * ld + (k + Vec::kWidth) / 2, second);
  }
  float scale(int64_t row, int64_t k) const { return scale_values[scales[row * ld_scales + k / kNvfp4Block]]; }
  float value(int64_t row, int64_t k) const {
    return e2m1_value(uint8_t(codes[row * ld + k / 2] >> (4 * (k % 2)) & 0xf)) * scale(row, k);
  }
  const void* at(int64_t row, int64_t k) const { return codes + row * ld + k / 2; }
  static constexpr int64_t kValuesPerLine = 128;
};

// The first `cols` rows of b as their values in fp32, rows ld apart (ld a whole number of steps,
// zeros past k): codes in the unit the reader gives them times its inverse (exact: a power of
// two), block-scaled codes then times their block's scale in fp32 (fp8_block_dequantize's values).
template <typename Values>
void widen_b_rows(const Values& b, int cols, int64_t k, float* out, int64_t ld) {
  for (int c = 0; c < cols; ++c) {
    float* row = out + c * ld;
    int64_t k0 = 0;
    for (; k0 + kStep <= k; k0 += kStep) {
      Vec low, high;
      if constexpr (IsScaled<Values>::value) {
        b.codes.load(c, k0, low, high);
        const Vec to_value = Vec::broadcast(1.0f / b.codes.kUnit);
        const Vec scale = Vec::broadcast(b.x->block_scale(b.row0 + c, k0));
        low = low * to_value * scale;
        high = high * to_value * scale;
      } else {
        b.load(c, k0, low, high);
        if constexpr (UnitOf<Values>::value != 1.0f) {
          low = low * Vec::broadcast(1.0f / UnitOf<Values>::value);
          high = high * Vec::broadcast(1.0f / UnitOf<Values>::value);
        }
      }
      low.store(row + k0);
      high.store(row + k0 + Vec::kWidth);
    }
    for (; k0 < k; ++k0) {
      if constexpr (IsScaled<Values>::value) {
        row[k0] = b.codes.value(c, k0) / b.codes.kUnit * b.x->block_scale(b.row0 + c, k0);
      } else {
        row[k0] = b.value(c, k0) / UnitOf<Values>::value;
      }
    }
    std::fill(row + k, row + ld, 0.0f);
  }
}

// f(values) with the rows of x from row0 on, in their format's reader.
template <typename F>
void with_values(const Operand& x, int64_t row0, const F& f) {
  switch (x.format) {
    case GemmOperand::kBFloat16: return f(Bf16Values{x.bf16_row(row0), x.ld});
    case GemmOperand::kNvfp4:
      return f(Nvfp4Values{x.code_row(row0), x.ld, x.scale_row(row0), x.ld_scales, e4m3_values()});
    case GemmOperand::kFp8E4M3: {
      const Fp8Values<Fp8Format::kE4M3> codes{x.code_row(row0), x.ld};
      if (x.is_block_scaled()) return f(ScaledFp8Values<Fp8Format::kE4M3>{codes, &x, row0});
      return f(codes);
    }
    case GemmOperand::kFp8E5M2: {
      const Fp8Values<Fp8Format::kE5M2> codes{x.code_row(row0), x.ld};
      if (x.is_block_scaled()) return f(ScaledFp8Values<Fp8Format::kE5M2>{codes, &x, row0});
      return f(codes);
    }
  }
}

// sums[r][c] += the products of values [begin, end) of k of row r of a (rows lda apart, fp32,
// zeros past the GEMM's k up to a whole step) and row c of b, kStep values a step, the first
// half's products added before the second's. begin is a multiple of kStep; past `end` (only at
// the GEMM's k) b's side is zero too. Inlined always: block-scaled b runs it once per k-block (32
// values for MXFP8), where a call's cost and its sums through memory were a fifth of the work.
template <int R, int C, typename Values>
[[gnu::always_inline]] inline void block_products(Vec (&sums)[R][C], const float* a, int64_t lda, const Values& b,
                                                  int64_t begin, int64_t end, int ahead) {
  // The sums in locals: written through the reference, they would be stored at every step (the
  // compiler cannot tell them from the operands). Each row of b is widened and used at once, so
  // that two of its vectors are live rather than all C rows' (16 AVX2 registers).
  Vec acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = sums[r][c];
  }
  const auto add = [&](int c, Vec low, Vec high, int64_t k) {
    for (int r = 0; r < R; ++r) {
      const float* a_row = a + r * lda + k;
      acc[r][c] = fmadd(Vec::load(a_row + Vec::kWidth), high, fmadd(Vec::load(a_row), low, acc[r][c]));
    }
  };
  // Runs of the reader's steps (readers that check their codes): where the check of every row's
  // codes in the run allows, a faster widening for all of them (one test, so that each loop stays
  // free of branches and the sums in registers); single steps after the last whole run, and for
  // every other reader.
  constexpr int kRunSteps = RunOf<Values>::value;
  const auto step = [&](int c, int64_t k) {
    Vec low, high;
    b.load(c, k, low, high);
    add(c, low, high, k);
  };
  const auto ask_ahead = [&](int64_t k) {
    if (k % Values::kValuesPerLine == 0) {
      for (int c = 0; c < ahead; ++c) __builtin_prefetch(b.at(C + c, k), 0, 2);
    }
  };
  int64_t k = begin;
  if constexpr (kRunSteps > 1) {
    for (; k + kRunSteps * kStep <= end; k += kRunSteps * kStep) {
      ask_ahead(k);
      const auto run = [&](auto kind) {
        for (int64_t at = k; at < k + kRunSteps * kStep; at += kStep) {
          for (int c = 0; c < C; ++c) {
            Vec low, high;
            b.template load_run<decltype(kind)::value>(c, at, low, high);
            add(c, low, high, at);
          }
        }
      };
      const Fp8Run kind = b.template run_kind<C>(k);
      if (kind == Fp8Run::kNormal) {
        run(std::integral_constant<Fp8Run, Fp8Run::kNormal>{});
      } else if (kind == Fp8Run::kFinite) {
        run(std::integral_constant<Fp8Run, Fp8Run::kFinite>{});
      } else {
        for (int64_t at = k; at < k + kRunSteps * kStep; at += kStep) {
          for (int c = 0; c < C; ++c) step(c, at);
        }
      }
    }
  }
  for (; k + kStep <= end; k += kStep) {
    ask_ahead(k);
    for (int c = 0; c < C; ++c) step(c, k);
  }
  if (k < end) {
    for (int c = 0; c < C; ++c) {
      float tail[kStep] = {};
      for (int64_t i = 0; i < end - k; ++i) tail[i] = b.value(c, k + i);
      add(c, Vec::load(tail), Vec::load(tail + Vec::kWidth), k);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) sums[r][c] = acc[r][c];
  }
}

// block_products over the whole of k, a call of its own: inlined into few_rows_block as well, the
// bf16 GEMV lost 10-25% of its bandwidth on 2 Zen 3 cores.
template <int R, int C, typename Values>
void sum_products(Vec (&sums)[R][C], const float* a, int64_t lda, const Values& b, int64_t begin, int64_t end,
                  int ahead) {
  block_products(sums, a, lda, b, begin, end, ahead);
}

// Rows [i0, i0 + R) of the GEMM against the first C rows of b (rows [j0, j0 + C) of the GEMM's b);
// a points at row i0 of the widened a.
template <int R, int C, typename Values>
void few_rows_block(const GemmBf16Params& p, const float* a, int64_t lda, const Values& b, int64_t i0, int64_t j0,
                    int ahead) {
  Vec acc[R][C];
  for (auto& row : acc) {
    for (Vec& sum : row) sum = Vec::zero();
  }
  if constexpr (IsScaled<Values>::value) {
    const int64_t k_per_scale = b.x->blocks.k_per_scale;
    for (int64_t k0 = 0; k0 < p.k; k0 += k_per_scale) {
      Vec block[R][C];
      for (auto& row : block) {
        for (Vec& sum : row) sum = Vec::zero();
      }
      block_products(block, a, lda, b.codes, k0, std::min(p.k, k0 + k_per_scale), ahead);
      for (int c = 0; c < C; ++c) {
        const Vec scale = Vec::broadcast(b.x->block_scale(b.row0 + c, k0));
        for (int r = 0; r < R; ++r) acc[r][c] = fmadd(block[r][c], scale, acc[r][c]);
      }
    }
  } else {
    sum_products(acc, a, lda, b, 0, p.k, ahead);
  }
  float sums[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) sums[r][c] = acc[r][c].reduce_add();
  }
  store_output(p, &sums[0][0], C, i0, j0, R, C);
}

// few_rows_block<R, C> for R = rows (1..kFmaGroupRows) and C = cols (1..kFmaNarrowCols).
template <int R = kFmaGroupRows, int C = kFmaNarrowCols, typename Values>
void few_rows_block_of(int rows, int cols, const GemmBf16Params& p, const float* a, int64_t lda, const Values& b,
                       int64_t i0, int64_t j0, int ahead) {
  if constexpr (R > 0 && C > 0) {
    if (rows < R) return few_rows_block_of<R - 1, C>(rows, cols, p, a, lda, b, i0, j0, ahead);
    if (cols < C) return few_rows_block_of<R, C - 1>(rows, cols, p, a, lda, b, i0, j0, ahead);
    few_rows_block<R, C>(p, a + i0 * lda, lda, b, i0, j0, ahead);
  }
}

// Every group of rows of a against the first cols rows of b; the first group asks for the
// `ahead` rows of b after them, the others find b in cache.
template <typename Values>
void few_rows_columns(const GemmBf16Params& p, const float* a, int64_t lda, const Values& b, int64_t j0, int cols,
                      int ahead) {
  // Block-scaled b keeps a k-block's sums beside the running ones: half the sums per group.
  const int64_t group = IsScaled<Values>::value ? std::max(1, kFmaGroupRows / 2) : kFmaGroupRows;
  for (int64_t i0 = 0; i0 < p.m; i0 += group) {
    few_rows_block_of(int(std::min(group, p.m - i0)), cols, p, a, lda, b, i0, j0, i0 == 0 ? ahead : 0);
  }
}

// a [m, k] widened to fp32, rows lda apart (k rounded up to a whole step, zeros past k).
inline void widen_a(const Operand& a, int64_t m, int64_t k, int64_t lda, float* out) {
  bf16_t staging[256];
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t k0 = 0; k0 < k; k0 += 256) {
      const int64_t kc = std::min<int64_t>(256, k - k0);
      const bf16_t* values = row_as_bf16(a, r, k0, kc, staging);
      for (int64_t i = 0; i < kc; ++i) out[r * lda + k0 + i] = to_float(values[i]);
    }
    std::fill(out + r * lda + k, out + (r + 1) * lda, 0.0f);
  }
}

// a's values times `factor` (a power of two) in place, unless one of them would overflow (or is
// inf): whether they were scaled. count is a multiple of the vector width.
inline bool scale_a(float* a, int64_t count, float factor) {
  Vec largest = Vec::zero();
  for (int64_t i = 0; i < count; i += Vec::kWidth) largest = Vec::magnitude_max(largest, Vec::load(a + i));
  if (!(largest.reduce_magnitude_max() <= std::numeric_limits<float>::max() / factor)) return false;
  for (int64_t i = 0; i < count; i += Vec::kWidth) (Vec::load(a + i) * Vec::broadcast(factor)).store(a + i);
  return true;
}

inline void gemm_few_rows_fma(const GemmBf16Params& p, const ThreadPool& pool) {
  thread_local KeptScratch a_scratch, b_scratch;
  const Operand a_operand = operand_a(p), b_operand = operand_b(p);
  const int64_t lda = (p.k + kStep - 1) / kStep * kStep;
  float* const a = a_scratch.reserve<float>(size_t(p.m * lda));
  widen_a(a_operand, p.m, p.k, lda, a);
  // Where the tier widens E4M3 codes of b read in place to their values times kE4M3Unit, a times
  // its inverse makes each product the same fp32 number, and so every sum the same bits. Should
  // a value of a not fit, or more rows of a stage b's rows, those are staged as their values.
  const float unit = b_operand.format == GemmOperand::kFp8E4M3 ? FewRowsWiden<Vec>::kE4M3Unit : 1.0f;
  const bool in_place = b_operand.is_bf16() || p.m <= kFmaGroupRows;
  const bool b_in_place = in_place && (unit == 1.0f || scale_a(a, p.m * lda, 1.0f / unit));
  const int block_cols = p.m <= kFmaNarrowRows ? kFmaNarrowCols : kFmaGroupCols;
  const int64_t col_blocks = (p.n + block_cols - 1) / block_cols;
  pool.parallel_for(col_blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t j0 = block * block_cols;
      const int cols = int(std::min<int64_t>(block_cols, p.n - j0));
      // The rows of this thread's next block, which its reads ask for ahead.
      const int ahead = block + 1 < end ? int(std::min<int64_t>(block_cols, p.n - j0 - cols)) : 0;
      if (b_in_place) {
        with_values(b_operand, j0, [&](const auto& b) { few_rows_columns(p, a, lda, b, j0, cols, ahead); });
        continue;
      }
      float* const widened = b_scratch.reserve<float>(size_t(block_cols * lda));  // [cols, lda]
      with_values(b_operand, j0, [&](const auto& b) { widen_b_rows(b, cols, p.k, widened, lda); });
      few_rows_columns(p, a, lda, F32Values{widened, lda}, j0, cols, 0);
    }
  });
}

}  // namespace gemm_detail
}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
