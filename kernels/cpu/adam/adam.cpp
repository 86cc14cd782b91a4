// Public multi-tensor Adam API: argument checks and the run-time choice of SIMD tier.
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/isa/entries.h"
#include "te_kernels/adam.h"
#include "te_kernels/cpu_isa.h"

namespace te_kernels {

void adam_step(const AdamStepParams& params, const ThreadPool& pool) {
  for (int64_t k = 0; k < params.num_tensors; ++k) {
    const AdamTensor& t = params.tensors[k];
    const std::string which = "adam_step: tensor " + std::to_string(k);
    if (t.numel < 0) throw std::invalid_argument(which + " has a negative size");
    if (t.param_dtype == DType::kFloat64 || t.grad_dtype == DType::kFloat64) {
      throw std::invalid_argument(which + ": float64 params and grads are not supported");
    }
    if (t.numel > 0 && (t.param == nullptr || t.grad == nullptr || t.exp_avg == nullptr || t.exp_avg_sq == nullptr)) {
      throw std::invalid_argument(which + " lacks a param, grad or moment buffer");
    }
  }
  std::vector<int64_t> chunk_starts(size_t(params.num_tensors) + 1, 0);
  for (int64_t k = 0; k < params.num_tensors; ++k) {
    chunk_starts[k + 1] = chunk_starts[k] + (params.tensors[k].numel + kAdamChunkElements - 1) / kAdamChunkElements;
  }
  AdamStepParams chunked = params;
  chunked.chunk_starts = chunk_starts.data();
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::adam_step(chunked, pool);
    case CpuIsa::kAvx2: return cpu::avx2::adam_step(chunked, pool);
    case CpuIsa::kPortable: return cpu::portable::adam_step(chunked, pool);
  }
}

}  // namespace te_kernels
