// Public GEMM API: the run-time choice of SIMD tier.
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/gemm.h"

namespace te_kernels {

// The entry points of gemm_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(gemm_bf16, GemmBf16Params)

const char* gemm_bf16_kernel() {
  switch (active_cpu_isa()) {
    case CpuIsa::kAmx: return "amx";
    case CpuIsa::kAvx512: return cpu_has_avx512_bf16() ? "avx512_bf16" : "fma";
    default: return "fma";
  }
}

// bindings/scaled_gemm_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
  assert(params.m >= 0 && params.n >= 0 && params.k >= 0 && "gemm_bf16: negative size");
  assert(params.out_dtype != DType::kFloat64 && "gemm_bf16: no float64 output");
  assert(params.lda >= params.k && params.ldb >= params.k && params.ldc >= params.n &&
         "gemm_bf16: a row stride is shorter than its row");
  if (params.m == 0 || params.n == 0) return;  // (empty tensors may have null data pointers)
  return TE_CPU_ACTIVE_TIER(gemm_bf16)(params, pool);
}

}  // namespace te_kernels
