// A GEMM of bf16 operands with fp32 accumulation and a fused fp32 epilogue, for the FP8
// GEMMs of the Linear modules: FP8 codes (E4M3 and E5M2) are exact in bf16, so the product
// of two code matrices, summed in fp32, scaled once in fp32 and rounded once to the output
// dtype, is TransformerEngine's FP8 GEMM. PyTorch's CPU bf16 GEMM rounds its output to bf16,
// which is why this exists.
#pragma once

#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

// out[i, j] = round_to_out_dtype(alpha * sum_k a[i, k] b[j, k] + bias[j])
// a: bf16 [m, k], rows lda elements apart; b: bf16 [n, k], rows ldb apart (both contiguous
// along k: the "NT" layout of y = x W^T). The sums are fp32 (each bf16 product is exact in
// fp32); their order depends on the tier and on m (cpu/gemm/gemm_kernels.h). alpha and bias
// are applied in fp32 after the sum; bias is fp32 [n] or null. out: [m, n] in out_dtype (fp32, bf16 or fp16), rows
// ldc apart.
struct GemmBf16Params {
  int64_t m = 0, n = 0, k = 0;
  const bf16_t* a = nullptr;
  int64_t lda = 0;
  const bf16_t* b = nullptr;
  int64_t ldb = 0;
  float alpha = 1.0f;
  const float* bias = nullptr;
  DType out_dtype = DType::kFloat32;
  void* out = nullptr;
  int64_t ldc = 0;
};

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool);

// Whether gemm_bf16 runs on the CPU's bf16 dot-product instructions (AVX512-BF16) at the
// active SIMD tier; otherwise it widens to fp32 FMAs (same sums, slower).
bool gemm_bf16_uses_dot_products();

}  // namespace te_kernels
