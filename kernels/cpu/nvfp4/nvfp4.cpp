// Public NVFP4 cast API: the run-time tier choice (the scalar definitions are inline in nvfp4.h).
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/nvfp4.h"

namespace te_kernels {

// The entry points of nvfp4_kernels.h, built once per SIMD tier by nvfp4_<tier>.cpp
// (nvfp4_entries.h) and, 4over6's cast, by nvfp4_four_over_six_<tier>.cpp.
TE_CPU_TIER_ENTRY(nvfp4_amax, Nvfp4AmaxParams)
TE_CPU_TIER_ENTRY(nvfp4_quantize, Nvfp4QuantizeParams)
TE_CPU_TIER_ENTRY(nvfp4_quantize_four_over_six, Nvfp4QuantizeParams)
TE_CPU_TIER_ENTRY(nvfp4_dequantize, Nvfp4DequantizeParams)

// bindings/nvfp4_ops.cpp checks every argument, with messages naming it; the asserts state
// what the kernels assume of a direct C++ caller, and run in debug builds.
namespace {

[[maybe_unused]] bool valid_source(const Nvfp4Source& s) {
  return s.rows >= 0 && s.cols >= 0 && s.dtype != DType::kFloat64 && (!s.rht || s.cols % kNvfp4Block == 0);
}

[[maybe_unused]] bool valid_e4m3_max(float e4m3_max) { return e4m3_max == 448.0f || e4m3_max == 256.0f; }

}  // namespace

void nvfp4_amax(const Nvfp4AmaxParams& params, const ThreadPool& pool) {
  assert(valid_source(params.source) && "nvfp4_amax: negative size, float64, or rht with cols not whole blocks");
  return TE_CPU_ACTIVE_TIER(nvfp4_amax)(params, pool);
}

void nvfp4_quantize(const Nvfp4QuantizeParams& params, const ThreadPool& pool) {
  assert(valid_source(params.source) && "nvfp4_quantize: negative size, float64, or rht with cols not whole blocks");
  assert((params.block_rows == 1 || params.block_rows == kNvfp4Block) && "nvfp4_quantize: block_rows must be 1 or 16");
  assert((!params.amax_per_row || params.block_rows == 1) && "nvfp4_quantize: a row-scaled cast has 1 x 16 blocks");
  assert(valid_e4m3_max(params.e4m3_max) && "nvfp4_quantize: e4m3_max must be 448 or 256");
  assert((params.four_over_six == Nvfp4FourOverSix::kOff || !params.stochastic) &&
         "nvfp4_quantize: 4over6 takes no stochastic rounding");
  if (params.four_over_six == Nvfp4FourOverSix::kOff) return TE_CPU_ACTIVE_TIER(nvfp4_quantize)(params, pool);
  return TE_CPU_ACTIVE_TIER(nvfp4_quantize_four_over_six)(params, pool);
}

void nvfp4_dequantize(const Nvfp4DequantizeParams& params, const ThreadPool& pool) {
  assert(params.rows >= 0 && params.cols >= 0 && "nvfp4_dequantize: negative size");
  assert(params.out_dtype != DType::kFloat64 && "nvfp4_dequantize: float64 output is not supported");
  assert(valid_e4m3_max(params.e4m3_max) && "nvfp4_dequantize: e4m3_max must be 448 or 256");
  return TE_CPU_ACTIVE_TIER(nvfp4_dequantize)(params, pool);
}

}  // namespace te_kernels
