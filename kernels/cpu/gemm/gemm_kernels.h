// The blocked GEMM of gemm.h for one SIMD tier. Included by cpu/gemm/gemm_<tier>.cpp after the
// tier's header; everything here compiles into te_kernels::cpu::<tier>.
//
// Work split: b is packed once, in strips of at most kNcMax columns, into panels of kNr columns
// in the layout the micro-kernel reads (Kernel::pack_b); a's rows are read in place. A task is
// one [kMc, nc] block of the output: for every kKc slice of k, each packed b panel (in L1)
// meets every kMr-row tile of the block's rows of a (in L2); the fp32 sums of the block wait
// between slices in a buffer (in L2), and the epilogue (alpha, bias, one rounding) turns them
// into the output once.
//
// A micro-kernel is a policy type:
//   kMr, kNr               the rows and columns of one tile of sums, held in registers
//   Packed                 element type of packed b
//   rows(kc)               rows of kNr Packed that kc values of k pack into
//   pack_b(b, ldb, cols, kc, out)   b [cols <= kNr, kc] (rows ldb apart) -> one panel; columns
//                          past `cols` and any padding in k are zero
//   tile<R>(a, lda, kc, panel, c, ldc, accumulate)   c[R, kNr] (+)= a[R, kc] . panel
// Every micro-kernel adds the products of a pair of k values odd element first, then even, in
// fp32: the order of the AVX512-BF16 dot product, so that each tier's sums are the same.
#pragma once

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

#include "te_kernels/gemm.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace gemm_detail {

constexpr int64_t kKc = 256;  // even, so that every slice but the last holds whole k pairs
constexpr int64_t kMc = 96;
constexpr int64_t kNcMax = 512;

// Scratch of one GEMM call: the packed b and each thread's block of sums, allocated once per call
// (never inside the loops).
template <typename T>
struct AlignedArray {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data;
  explicit AlignedArray(size_t count) {
    const size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    data.reset(static_cast<T*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes)));
    if (!data) throw std::bad_alloc();
  }
  T* get() const { return data.get(); }
};

// fp32 FMAs on any vector type: a is widened one element at a time and broadcast, b is
// packed widened to fp32, [k][kNr].
template <typename V, int Mr>
struct FmaKernel {
  static constexpr int kMr = Mr;
  static constexpr int kNr = 2 * V::kWidth;
  using Packed = float;

  static int64_t rows(int64_t kc) { return kc; }

  static void pack_b(const bf16_t* b, int64_t ldb, int64_t cols, int64_t kc, float* out) {
    for (int64_t j = 0; j < kNr; ++j) {
      const bf16_t* row = b + j * ldb;
      for (int64_t k = 0; k < kc; ++k) out[k * kNr + j] = j < cols ? to_float(row[k]) : 0.0f;
    }
  }

  template <int R>
  static void tile(const bf16_t* a, int64_t lda, int64_t kc, const float* panel, float* c, int64_t ldc,
                   bool accumulate) {
    V acc[R][2];
    for (int r = 0; r < R; ++r) {
      acc[r][0] = accumulate ? V::load(c + r * ldc) : V::zero();
      acc[r][1] = accumulate ? V::load(c + r * ldc + V::kWidth) : V::zero();
    }
    const auto step = [&](int64_t k) {
      const V b0 = V::load(panel + k * kNr), b1 = V::load(panel + k * kNr + V::kWidth);
      for (int r = 0; r < R; ++r) {
        const V x = V::broadcast(to_float(a[r * lda + k]));
        acc[r][0] = fmadd(x, b0, acc[r][0]);
        acc[r][1] = fmadd(x, b1, acc[r][1]);
      }
    };
    int64_t k = 0;
    for (; k + 1 < kc; k += 2) {
      step(k + 1);
      step(k);
    }
    if (k < kc) step(k);
    for (int r = 0; r < R; ++r) {
      acc[r][0].store(c + r * ldc);
      acc[r][1].store(c + r * ldc + V::kWidth);
    }
  }
};

// tile<R> for R = rows (1..kMr), chosen at run time for the last rows of a block.
template <typename Kernel, int R = Kernel::kMr>
void tile_rows(int rows, const bf16_t* a, int64_t lda, int64_t kc, const typename Kernel::Packed* panel, float* c,
               int64_t ldc, bool accumulate) {
  if constexpr (R > 0) {
    if (rows == R) return Kernel::template tile<R>(a, lda, kc, panel, c, ldc, accumulate);
    return tile_rows<Kernel, R - 1>(rows, a, lda, kc, panel, c, ldc, accumulate);
  }
}

// out[i, j] = round(alpha * sums[i, j] + bias[j]) for a block of rows x cols.
template <typename T>
void store_block(const GemmBf16Params& p, const float* sums, int64_t ld_sums, int64_t i0, int64_t j0, int64_t rows,
                 int64_t cols) {
  T* out = static_cast<T*>(p.out);
  const Vec alpha = Vec::broadcast(p.alpha);
  for (int64_t i = 0; i < rows; ++i) {
    const float* s = sums + i * ld_sums;
    T* o = out + (i0 + i) * p.ldc + j0;
    int64_t j = 0;
    for (; j + Vec::kWidth <= cols; j += Vec::kWidth) {
      const Vec scaled = Vec::load(s + j) * alpha;
      (p.bias != nullptr ? scaled + Vec::load(p.bias + j0 + j) : scaled).store(o + j);
    }
    for (; j < cols; ++j) {
      const float scaled = s[j] * p.alpha;
      o[j] = Convert<T>::from(p.bias != nullptr ? scaled + p.bias[j0 + j] : scaled);
    }
  }
}

inline void store_output(const GemmBf16Params& p, const float* sums, int64_t ld_sums, int64_t i0, int64_t j0,
                         int64_t rows, int64_t cols) {
  switch (p.out_dtype) {
    case DType::kFloat32: return store_block<float>(p, sums, ld_sums, i0, j0, rows, cols);
    case DType::kBFloat16: return store_block<bf16_t>(p, sums, ld_sums, i0, j0, rows, cols);
    case DType::kFloat16: return store_block<fp16_t>(p, sums, ld_sums, i0, j0, rows, cols);
    case DType::kFloat64: break;  // refused by gemm.cpp
  }
}

// How the output is cut into tasks: strips of nc columns, each cut into blocks of kMc rows.
struct Plan {
  int64_t nc;        // columns of a strip (a multiple of kNr, at most kNcMax)
  int64_t strips;    // ceil(n / nc)
  int64_t m_blocks;  // ceil(m / kMc)
};

template <typename Kernel>
Plan plan(const GemmBf16Params& p) {
  Plan plan;
  const int64_t n_padded = (p.n + Kernel::kNr - 1) / Kernel::kNr * Kernel::kNr;
  plan.nc = std::min(kNcMax, n_padded);
  plan.strips = (p.n + plan.nc - 1) / plan.nc;
  plan.m_blocks = (p.m + kMc - 1) / kMc;
  return plan;
}

// Packs the strip of b starting at column j0 (nc columns, all of k), slice by slice and panel
// by panel: slice s (k from s * kKc) starts at rows(s * kKc) * nc.
template <typename Kernel>
void pack_strip(const GemmBf16Params& p, int64_t j0, int64_t nc, typename Kernel::Packed* packed) {
  for (int64_t k0 = 0; k0 < p.k; k0 += kKc) {
    const int64_t kc = std::min(kKc, p.k - k0);
    typename Kernel::Packed* slice = packed + Kernel::rows(k0) * nc;
    for (int64_t jr = 0; jr < nc; jr += Kernel::kNr) {
      const int64_t cols = std::max<int64_t>(0, std::min<int64_t>(Kernel::kNr, p.n - j0 - jr));
      Kernel::pack_b(p.b + (j0 + jr) * p.ldb + k0, p.ldb, cols, kc, slice + jr * Kernel::rows(kc));
    }
  }
}

// One task: the output block of rows [i0, i0 + kMc) and the strip at column j0, whose b is packed.
template <typename Kernel>
void run_task(const GemmBf16Params& p, const Plan& plan, int64_t i0, int64_t j0,
              const typename Kernel::Packed* packed, float* sums) {
  const int64_t cols = std::min(plan.nc, p.n - j0), mc = std::min(kMc, p.m - i0);
  for (int64_t k0 = 0; k0 < p.k; k0 += kKc) {
    const int64_t kc = std::min(kKc, p.k - k0);
    const typename Kernel::Packed* slice = packed + Kernel::rows(k0) * plan.nc;
    for (int64_t jr = 0; jr < cols; jr += Kernel::kNr) {
      const typename Kernel::Packed* panel = slice + jr * Kernel::rows(kc);
      for (int64_t ir = 0; ir < mc; ir += Kernel::kMr) {
        const int rows = int(std::min<int64_t>(Kernel::kMr, mc - ir));
        tile_rows<Kernel>(rows, p.a + (i0 + ir) * p.lda + k0, p.lda, kc, panel, sums + ir * plan.nc + jr, plan.nc,
                          /*accumulate=*/k0 > 0);
      }
    }
  }
  if (p.k == 0) std::fill(sums, sums + mc * plan.nc, 0.0f);  // the sum over no k
  store_output(p, sums, plan.nc, i0, j0, mc, cols);
}

// b is packed once, strip by strip, into one buffer that every thread reads. The tasks are then
// handed out one at a time from a shared counter, so that a thread slowed by another process
// on its core (2 shared cores in CI) leaves its share to the others instead of holding all up.
template <typename Kernel>
void gemm(const GemmBf16Params& p, const ThreadPool& pool) {
  const Plan plan = gemm_detail::plan<Kernel>(p);
  const int64_t strip_count = Kernel::rows(p.k) * plan.nc;
  const int threads = std::max(1, pool.num_threads());
  AlignedArray<typename Kernel::Packed> packed{size_t(plan.strips * strip_count)};
  AlignedArray<float> sums{size_t(threads * kMc * plan.nc)};
  pool.parallel_for(plan.strips, 1, [&](int64_t begin, int64_t end) {
    for (int64_t strip = begin; strip < end; ++strip) {
      pack_strip<Kernel>(p, strip * plan.nc, plan.nc, packed.get() + strip * strip_count);
    }
  });
  // Row-block major: threads working at once share a's rows and read different strips.
  const int64_t tasks = plan.m_blocks * plan.strips;
  std::atomic<int64_t> next_task{0};
  pool.parallel_for(threads, 1, [&](int64_t slot, int64_t) {
    float* my_sums = sums.get() + slot * kMc * plan.nc;
    for (int64_t task = next_task.fetch_add(1); task < tasks; task = next_task.fetch_add(1)) {
      const int64_t strip = task % plan.strips;
      run_task<Kernel>(p, plan, task / plan.strips * kMc, strip * plan.nc, packed.get() + strip * strip_count,
                       my_sums);
    }
  });
}

}  // namespace gemm_detail
}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
