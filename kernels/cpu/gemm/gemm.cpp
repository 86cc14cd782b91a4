// Public GEMM API: the run-time choice of SIMD tier.
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/gemm.h"

namespace te_kernels {

// The entry points of gemm_kernels.h, built once per SIMD tier; the packing of b ahead has
// signatures of its own.
TE_CPU_TIER_ENTRY(gemm_bf16, GemmBf16Params)
#define TE_GEMM_PACK_ENTRIES(tier)                                                          \
  namespace cpu::tier {                                                                     \
  size_t gemm_bf16_packed_b_bytes(int64_t n, int64_t k);                                    \
  void gemm_bf16_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool); \
  }
TE_GEMM_PACK_ENTRIES(portable)
TE_GEMM_PACK_ENTRIES(avx2)
TE_GEMM_PACK_ENTRIES(avx512)
#undef TE_GEMM_PACK_ENTRIES

size_t gemm_bf16_packed_b_bytes(int64_t n, int64_t k) {
  assert(n >= 0 && k >= 0 && "gemm_bf16_packed_b_bytes: negative size");
  return TE_CPU_ACTIVE_TIER(gemm_bf16_packed_b_bytes)(n, k);
}

void gemm_bf16_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool) {
  assert(params.n >= 0 && params.k >= 0 && params.ldb >= gemm_min_ld(params.b_format, params.k) &&
         params.b_blocks.data == nullptr && "gemm_bf16_pack_b: bad b");
  if (params.n == 0) return;
  TE_CPU_ACTIVE_TIER(gemm_bf16_pack_b)(params, packed, pool);
}

const char* gemm_bf16_kernel() {
  switch (active_cpu_isa()) {
    case CpuIsa::kAmx: return "amx";
    case CpuIsa::kAvx512: return cpu_has_avx512_bf16() ? "avx512_bf16" : "fma";
    default: return "fma";
  }
}

namespace {
[[maybe_unused]] bool block_scales_fit(GemmOperand format, const GemmFp8BlockScales& blocks) {
  if (blocks.data == nullptr) return true;
  return (format == GemmOperand::kFp8E4M3 || format == GemmOperand::kFp8E5M2) &&
         gemm_fp8_blocks_fit(blocks.rows_per_scale, blocks.k_per_scale);
}
}  // namespace

// bindings/scaled_gemm_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
  assert(params.m >= 0 && params.n >= 0 && params.k >= 0 && "gemm_bf16: negative size");
  assert(params.out_dtype != DType::kFloat64 && "gemm_bf16: no float64 output");
  assert(params.lda >= gemm_min_ld(params.a_format, params.k) &&
         params.ldb >= gemm_min_ld(params.b_format, params.k) && params.ldc >= params.n &&
         "gemm_bf16: a row stride is shorter than its row");
  assert((params.a_format != GemmOperand::kNvfp4 || params.a_scales != nullptr) &&
         (params.b_format != GemmOperand::kNvfp4 || params.b_scales != nullptr) && "gemm_bf16: NVFP4 without scales");
  assert(block_scales_fit(params.a_format, params.a_blocks) && block_scales_fit(params.b_format, params.b_blocks) &&
         "gemm_bf16: block scales on a non-FP8 operand, or block sizes that are not powers of two (k: at least 32)");
  if (params.m == 0 || params.n == 0) return;  // (empty tensors may have null data pointers)
  return TE_CPU_ACTIVE_TIER(gemm_bf16)(params, pool);
}

}  // namespace te_kernels
