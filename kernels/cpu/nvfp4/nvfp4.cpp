// Public NVFP4 cast API: the run-time tier choice (the scalar definitions are inline in nvfp4.h).
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/nvfp4.h"

namespace te_kernels {

// The entry points of nvfp4_kernels.h, built once per SIMD tier by nvfp4_<tier>.cpp.
TE_CPU_TIER_ENTRY(nvfp4_amax, Nvfp4AmaxParams)
TE_CPU_TIER_ENTRY(nvfp4_quantize, Nvfp4QuantizeParams)
TE_CPU_TIER_ENTRY(nvfp4_dequantize, Nvfp4DequantizeParams)

// bindings/nvfp4_ops.cpp checks every argument, with messages naming it; the asserts state
// what the kernels assume of a direct C++ caller, and run in debug builds.
namespace {

[[maybe_unused]] bool valid_source(const Nvfp4Source& s) {
  return s.rows >= 0 && s.cols >= 0 && s.dtype != DType::kFloat64 && (!s.rht || s.cols % kNvfp4Block == 0);
}

}  // namespace

void nvfp4_amax(const Nvfp4AmaxParams& params, const ThreadPool& pool) {
  assert(valid_source(params.source) && "nvfp4_amax: negative size, float64, or rht with cols not whole blocks");
  return TE_CPU_ACTIVE_TIER(nvfp4_amax)(params, pool);
}

void nvfp4_quantize(const Nvfp4QuantizeParams& params, const ThreadPool& pool) {
  assert(valid_source(params.source) && "nvfp4_quantize: negative size, float64, or rht with cols not whole blocks");
  assert((params.block_rows == 1 || params.block_rows == kNvfp4Block) && "nvfp4_quantize: block_rows must be 1 or 16");
  return TE_CPU_ACTIVE_TIER(nvfp4_quantize)(params, pool);
}

void nvfp4_dequantize(const Nvfp4DequantizeParams& params, const ThreadPool& pool) {
  assert(params.rows >= 0 && params.cols >= 0 && "nvfp4_dequantize: negative size");
  assert(params.out_dtype != DType::kFloat64 && "nvfp4_dequantize: float64 output is not supported");
  return TE_CPU_ACTIVE_TIER(nvfp4_dequantize)(params, pool);
}

}  // namespace te_kernels
