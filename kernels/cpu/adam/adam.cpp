// Public multi-tensor Adam API: the chunk table and the run-time choice of SIMD tier.
#include <cassert>
#include <vector>

#include "cpu/isa/entries.h"
#include "te_kernels/adam.h"
#include "te_kernels/cpu_isa.h"

namespace te_kernels {

// The entry points of adam_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(adam_step, AdamStepParams)

// bindings/adam_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
void adam_step(const AdamStepParams& params, const ThreadPool& pool) {
  for (int64_t k = 0; k < params.num_tensors; ++k) {
    [[maybe_unused]] const AdamTensor& t = params.tensors[k];
    assert(t.numel >= 0 && "adam_step: a tensor has a negative size");
    assert(t.param_dtype != DType::kFloat64 && t.grad_dtype != DType::kFloat64 &&
           "adam_step: float64 params and grads are not supported");
    assert((t.numel == 0 || (t.param && t.grad && t.exp_avg && t.exp_avg_sq)) &&
           "adam_step: a tensor lacks a param, grad or moment buffer");
  }
  std::vector<int64_t> chunk_starts(size_t(params.num_tensors) + 1, 0);
  for (int64_t k = 0; k < params.num_tensors; ++k) {
    chunk_starts[k + 1] = chunk_starts[k] + (params.tensors[k].numel + kAdamChunkElements - 1) / kAdamChunkElements;
  }
  AdamStepParams chunked = params;
  chunked.chunk_starts = chunk_starts.data();
  return TE_CPU_ACTIVE_TIER(adam_step)(chunked, pool);
}

}  // namespace te_kernels
