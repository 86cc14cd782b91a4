// Public attention-softmax API: chunk planning, workspace sizing and the run-time choice
// of SIMD tier.
#include <algorithm>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/softmax.h"

namespace te_kernels {

// The entry points of softmax_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(softmax_fwd, SoftmaxFwdParams)
TE_CPU_TIER_ENTRY(softmax_bwd, SoftmaxBwdParams)

void softmax_fwd_plan(SoftmaxFwdParams& params, const ThreadPool& pool) {
  // One chunk per thread at most, and none smaller than a task's worth of elements.
  const int64_t elements = params.shape.rows() * params.shape.sk;
  const int64_t by_size = std::max<int64_t>(1, elements / cpu::kMinElementsPerTask);
  params.num_chunks = std::max<int64_t>(1, std::min<int64_t>({pool.num_threads(), by_size, params.shape.rows()}));
}

size_t softmax_fwd_workspace_bytes(const SoftmaxFwdParams& params) {
  const size_t acc = cpu::accumulator_bytes(params.shape.dtype);
  return size_t(params.num_chunks) * size_t(cpu::padded_cols(params.shape.sk, acc)) * acc;
}

void softmax_fwd(const SoftmaxFwdParams& params, const ThreadPool& pool) {
  if (params.shape.rows() == 0 || params.shape.sk == 0) return;
  return TE_CPU_ACTIVE_TIER(softmax_fwd)(params, pool);
}

void softmax_bwd(const SoftmaxBwdParams& params, const ThreadPool& pool) {
  if (params.shape.rows() == 0 || params.shape.sk == 0) return;
  return TE_CPU_ACTIVE_TIER(softmax_bwd)(params, pool);
}

}  // namespace te_kernels
