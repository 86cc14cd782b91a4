// Public norm API: workspace sizing, chunk planning and the run-time choice of SIMD tier.
#include <algorithm>
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/norm.h"

namespace te_kernels {

// The entry points of norm_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(norm_fwd, NormFwdParams)
TE_CPU_TIER_ENTRY(norm_bwd, NormBwdParams)

namespace {

// One chunk per thread at most, and none smaller than a task's worth of elements: each
// chunk costs its own scratch (partials to zero and reduce, staging rows).
int64_t row_chunks(int64_t rows, int64_t cols, const ThreadPool& pool) {
  const int64_t by_size = std::max<int64_t>(1, rows * cols / cpu::kMinElementsPerTask);
  return std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), by_size));
}

}  // namespace

void norm_fwd_plan(NormFwdParams& params, const ThreadPool& pool) {
  params.num_chunks = row_chunks(params.rows, params.cols, pool);
}

size_t norm_fwd_workspace_bytes(const NormFwdParams& params) {
  const size_t acc = cpu::accumulator_bytes(params.x_dtype);
  const size_t row = size_t(cpu::padded_cols(params.cols, acc)) * acc;
  // Widened gamma and beta; per chunk a staging row for s and its amax partial.
  return 2 * row + size_t(params.num_chunks) * (row + sizeof(float));
}

void norm_bwd_plan(NormBwdParams& params, const ThreadPool& pool) {
  params.num_chunks = row_chunks(params.rows, params.cols, pool);
}

size_t norm_bwd_workspace_bytes(const NormBwdParams& params) {
  const size_t acc = cpu::accumulator_bytes(params.x_dtype);
  const size_t stride = size_t(cpu::padded_cols(params.cols, acc));
  return (1 + 2 * size_t(params.num_chunks)) * stride * acc;  // gamma + partials
}

// bindings/norm_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
void norm_fwd(const NormFwdParams& params, const ThreadPool& pool) {
  if (params.amax != nullptr) *params.amax = 0.0f;  // the max over no rows
  if (params.rows == 0) return;  // (empty tensors may have null data pointers)
  assert((params.residual == nullptr) == (params.sum == nullptr) &&
         "norm_fwd: residual and sum must be given together");
  assert((params.y_fp8 == nullptr || params.x_dtype != DType::kFloat64) && "norm_fwd: no FP8 output for float64 input");
  assert((params.y_fp8 == nullptr || (params.fp8_scale != nullptr && params.amax != nullptr)) &&
         "norm_fwd: an FP8 output needs fp8_scale and amax");
  assert((params.y_fp8 != nullptr || params.y != nullptr) && "norm_fwd: y is required without an FP8 output");
  return TE_CPU_ACTIVE_TIER(norm_fwd)(params, pool);
}

void norm_bwd(const NormBwdParams& params, const ThreadPool& pool) {
  return TE_CPU_ACTIVE_TIER(norm_bwd)(params, pool);
}

const char* norm_kernel_isa() { return cpu_isa_name(active_cpu_isa()); }

}  // namespace te_kernels
