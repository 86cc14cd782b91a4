// Public GEMM API: argument checks and the run-time choice of SIMD tier.
#include <stdexcept>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/gemm.h"

namespace te_kernels {

bool gemm_bf16_uses_dot_products() { return active_cpu_isa() == CpuIsa::kAvx512 && cpu_has_avx512_bf16(); }

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
  if (params.m < 0 || params.n < 0 || params.k < 0) throw std::invalid_argument("gemm_bf16: negative size");
  if (params.out_dtype == DType::kFloat64) throw std::invalid_argument("gemm_bf16: no float64 output");
  if (params.lda < params.k || params.ldb < params.k || params.ldc < params.n) {
    throw std::invalid_argument("gemm_bf16: a row stride is shorter than its row");
  }
  if (params.m == 0 || params.n == 0) return;  // (empty tensors may have null data pointers)
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::gemm_bf16(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::gemm_bf16(params, pool);
    case CpuIsa::kPortable: return cpu::portable::gemm_bf16(params, pool);
  }
}

}  // namespace te_kernels
