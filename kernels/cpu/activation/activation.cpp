// Public activation API: argument checks, workspace sizing, chunk planning and the run-time
// choice of SIMD tier.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cpu/isa/entries.h"
#include "te_kernels/activation.h"
#include "te_kernels/cpu_isa.h"

namespace te_kernels {
namespace {

// The bindings check every argument with messages naming them; these guard the kernels'
// own assumptions for direct C++ callers.
void check(int64_t rows, int64_t cols, DType dtype, ActivationKind kind) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("activation: negative rows or cols");
  if (dtype == DType::kFloat64) throw std::invalid_argument("activation: float64 data is not supported");
  if (is_gated(kind) && cols % 2 != 0) {
    throw std::invalid_argument("activation: a gated activation needs an even last dimension, got " +
                                std::to_string(cols));
  }
}

}  // namespace

bool is_gated(ActivationKind kind) { return kind >= ActivationKind::kGlu; }

void activation_fwd(const ActivationFwdParams& p, const ThreadPool& pool) {
  check(p.rows, p.cols, p.dtype, p.act.kind);
  if (p.rows == 0 || p.cols == 0) return;
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::activation_fwd(p, pool);
    case CpuIsa::kAvx2: return cpu::avx2::activation_fwd(p, pool);
    case CpuIsa::kPortable: return cpu::portable::activation_fwd(p, pool);
  }
}

void activation_bwd_plan(ActivationBwdParams& p, const ThreadPool& pool) {
  // One chunk per thread at most, and none smaller than a task's worth of elements: each
  // chunk costs a [cols] partial to zero and to reduce.
  const int64_t by_size = std::max<int64_t>(1, p.rows * p.cols / cpu::kMinElementsPerTask);
  p.num_chunks = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), by_size));
}

size_t activation_bwd_workspace_bytes(const ActivationBwdParams& p) {
  if (p.dbias == nullptr) return 0;
  return size_t(p.num_chunks) * size_t(cpu::padded_cols(p.cols, sizeof(float))) * sizeof(float);
}

void activation_bwd(const ActivationBwdParams& p, const ThreadPool& pool) {
  check(p.rows, p.cols, p.dtype, p.act.kind);
  if (p.cols == 0) return;
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::activation_bwd(p, pool);
    case CpuIsa::kAvx2: return cpu::avx2::activation_bwd(p, pool);
    case CpuIsa::kPortable: return cpu::portable::activation_bwd(p, pool);
  }
}

size_t activation_fp8_workspace_bytes(const ThreadPool& pool) { return size_t(pool.num_threads()) * sizeof(float); }

void activation_fp8(const ActivationFp8Params& p, const ThreadPool& pool) {
  check(p.rows, p.cols, p.dtype, p.act.kind);
  if (p.rows == 0 || p.cols == 0) {
    *p.amax = 0.0f;
    return;
  }
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::activation_fp8(p, pool);
    case CpuIsa::kAvx2: return cpu::avx2::activation_fp8(p, pool);
    case CpuIsa::kPortable: return cpu::portable::activation_fp8(p, pool);
  }
}

}  // namespace te_kernels
