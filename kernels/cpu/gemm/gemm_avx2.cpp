// The GEMM compiled for the avx2 tier: fp32 FMAs, 6 x 16 sums in 12 YMM registers.
#include "te_kernels/gemm.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx2.h"
#include "cpu/gemm/gemm_kernels.h"

namespace te_kernels::cpu::avx2 {

using Kernel = gemm_detail::FmaKernel<Vec, 6>;

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool) { gemm_detail::gemm<Kernel>(params, pool); }

size_t gemm_bf16_packed_b_bytes(int64_t n, int64_t k) { return gemm_detail::packed_b_bytes<Kernel>(n, k); }

void gemm_bf16_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool) {
  gemm_detail::pack_b<Kernel>(params, packed, pool);
}

}  // namespace te_kernels::cpu::avx2
