// Public cross-entropy API: target validation, chunk planning, workspace sizing and the
// run-time choice of SIMD tier.
#include <algorithm>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/cross_entropy.h"

namespace te_kernels {

// The entry points of cross_entropy_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(cross_entropy_fwd, CrossEntropyFwdParams)
TE_CPU_TIER_ENTRY(cross_entropy_bwd, CrossEntropyBwdParams)

int64_t cross_entropy_first_bad_target(const int64_t* target, int64_t rows, int64_t vocab, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    if (target[r] != ignore_index && (target[r] < 0 || target[r] >= vocab)) return r;
  }
  return -1;
}

void cross_entropy_fwd_plan(CrossEntropyFwdParams& params, const ThreadPool& pool) {
  // One chunk per thread at most, and none smaller than a task's worth of elements.
  const int64_t by_size = std::max<int64_t>(1, params.rows * params.vocab / cpu::kMinElementsPerTask);
  params.num_chunks = std::max<int64_t>(1, std::min<int64_t>({pool.num_threads(), by_size, params.rows}));
}

size_t cross_entropy_fwd_workspace_bytes(const CrossEntropyFwdParams& params) {
  const size_t acc = cpu::accumulator_bytes(params.dtype);
  return size_t(params.num_chunks) * size_t(cpu::padded_cols(params.vocab, acc)) * acc;
}

void cross_entropy_fwd(const CrossEntropyFwdParams& params, const ThreadPool& pool) {
  if (params.rows == 0) return;
  return TE_CPU_ACTIVE_TIER(cross_entropy_fwd)(params, pool);
}

void cross_entropy_bwd(const CrossEntropyBwdParams& params, const ThreadPool& pool) {
  if (params.rows == 0 || params.vocab == 0) return;
  return TE_CPU_ACTIVE_TIER(cross_entropy_bwd)(params, pool);
}

}  // namespace te_kernels
