// Public norm API: workspace sizing, chunk planning and the run-time choice of SIMD tier.
#include <algorithm>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/norm.h"

namespace te_kernels {

size_t norm_fwd_workspace_bytes(const NormFwdParams& params) {
  const size_t acc = cpu::accumulator_bytes(params.x_dtype);
  return 2 * size_t(cpu::padded_cols(params.cols, acc)) * acc;  // widened gamma, beta
}

void norm_bwd_plan(NormBwdParams& params, const ThreadPool& pool) {
  // One chunk per thread at most, and none smaller than a task's worth of elements: each
  // chunk costs a [2, cols] partial to zero and to reduce.
  const int64_t elements = params.rows * params.cols;
  const int64_t by_size = std::max<int64_t>(1, elements / cpu::kMinElementsPerTask);
  params.num_chunks = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), by_size));
}

size_t norm_bwd_workspace_bytes(const NormBwdParams& params) {
  const size_t acc = cpu::accumulator_bytes(params.x_dtype);
  const size_t stride = size_t(cpu::padded_cols(params.cols, acc));
  return (1 + 2 * size_t(params.num_chunks)) * stride * acc;  // gamma + partials
}

void norm_fwd(const NormFwdParams& params, const ThreadPool& pool) {
  if (params.rows == 0) return;
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::norm_fwd(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::norm_fwd(params, pool);
    case CpuIsa::kPortable: return cpu::portable::norm_fwd(params, pool);
  }
}

void norm_bwd(const NormBwdParams& params, const ThreadPool& pool) {
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::norm_bwd(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::norm_bwd(params, pool);
    case CpuIsa::kPortable: return cpu::portable::norm_bwd(params, pool);
  }
}

const char* norm_kernel_isa() { return cpu_isa_name(active_cpu_isa()); }

}  // namespace te_kernels
