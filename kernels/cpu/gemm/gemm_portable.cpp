// The GEMM compiled for the portable tier: fp32 FMAs on the compiler's baseline vectors.
#include "te_kernels/gemm.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_portable.h"
#include "cpu/gemm/gemm_kernels.h"

namespace te_kernels::cpu::portable {

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) {
  gemm_detail::gemm<gemm_detail::FmaKernel<Vec, 4>>(params, pool);
}

}  // namespace te_kernels::cpu::portable
