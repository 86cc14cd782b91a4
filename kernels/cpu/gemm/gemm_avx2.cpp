// The GEMM compiled for the avx2 tier: fp32 FMAs, 6 x 16 sums in 12 YMM registers.
#include "te_kernels/gemm.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx2.h"
#include "cpu/gemm/gemm_kernels.h"

namespace te_kernels::cpu::avx2 {

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
  gemm_detail::gemm<gemm_detail::FmaKernel<Vec, 6>>(params, pool);
}

}  // namespace te_kernels::cpu::avx2
