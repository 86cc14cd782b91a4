// The GEMM compiled for the avx2 tier: fp32 FMAs, 6 x 16 sums in 12 YMM registers; NVFP4 times
// NVFP4 on byte products instead (nvfp4_byte_kernel_avx2.h: each block's exact sum, then the
// blocks added in fp32). Up to kFmaFewRows rows of a read b in place (gemm_few_rows_fma.h).
#include "te_kernels/gemm.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx2.h"
#include "cpu/gemm/gemm_kernels.h"
#include "cpu/gemm/few_rows_widen_avx2.h"
#include "cpu/gemm/gemm_few_rows_fma.h"
#if defined(__x86_64__) || defined(_M_X64)
#include "cpu/gemm/nvfp4_byte_kernel_avx2.h"
#endif

namespace te_kernels::cpu::avx2 {

using Kernel = gemm_detail::FmaKernel<Vec, 6>;

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
  if (params.m <= gemm_detail::kFmaFewRows) return gemm_detail::gemm_few_rows_fma(params, pool);
#if defined(__x86_64__) || defined(_M_X64)
  if (params.a_format == GemmOperand::kNvfp4 && params.b_format == GemmOperand::kNvfp4 &&
      params.b_packed == nullptr) {
    return gemm_detail::gemm<gemm_detail::Nvfp4ByteKernel<3>>(params, pool);
  }
#endif
  gemm_detail::gemm<Kernel>(params, pool);
}

size_t gemm_bf16_packed_b_bytes(int64_t n, int64_t k) { return gemm_detail::packed_b_bytes<Kernel>(n, k); }

void gemm_bf16_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool) {
  gemm_detail::pack_b<Kernel>(params, packed, pool);
}

}  // namespace te_kernels::cpu::avx2
