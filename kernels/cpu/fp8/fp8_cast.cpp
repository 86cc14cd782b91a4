// Public FP8 cast API: workspace sizing and the run-time tier choice.
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8.h"

namespace te_kernels {

// The entry points of fp8_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(fp8_quantize, Fp8QuantizeParams)
TE_CPU_TIER_ENTRY(fp8_dequantize, Fp8DequantizeParams)
TE_CPU_TIER_ENTRY(fp8_transpose, Fp8TransposeParams)

size_t fp8_quantize_workspace_bytes(const ThreadPool& pool) { return size_t(pool.num_threads() + 1) * sizeof(float); }

// bindings/fp8_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
void fp8_quantize(const Fp8QuantizeParams& params, const ThreadPool& pool) {
  assert(params.in_dtype != DType::kFloat64 && "fp8_quantize: float64 input is not supported");
  assert((params.out_t == nullptr || params.rows * params.cols == params.numel) &&
         "fp8_quantize: rows * cols must equal numel for the transposed output");
  return TE_CPU_ACTIVE_TIER(fp8_quantize)(params, pool);
}

void fp8_transpose(const Fp8TransposeParams& params, const ThreadPool& pool) {
  assert(params.rows >= 0 && params.cols >= 0 && "fp8_transpose: negative size");
  if (params.rows == 0 || params.cols == 0) return;
  return TE_CPU_ACTIVE_TIER(fp8_transpose)(params, pool);
}

void fp8_dequantize(const Fp8DequantizeParams& params, const ThreadPool& pool) {
  assert(params.out_dtype != DType::kFloat64 && "fp8_dequantize: float64 output is not supported");
  return TE_CPU_ACTIVE_TIER(fp8_dequantize)(params, pool);
}

}  // namespace te_kernels
