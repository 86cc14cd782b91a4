// What fp8_block_ops.cpp shares with the block-scaled GEMM's binding (fp8_block_gemm_ops.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace portable_te {

// The CPU kernel of fp8_block_dequantize (its schema in fp8_block_ops.cpp).
at::Tensor fp8_block_dequantize_cpu(const at::Tensor& data, const at::Tensor& scale_inv, int64_t block_rows,
                                    int64_t block_cols, at::ScalarType out_dtype);

}  // namespace portable_te
