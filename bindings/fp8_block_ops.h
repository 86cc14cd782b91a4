// CPU implementations of the block-scaled FP8 cast ops (schemas in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>
#include <vector>

namespace portable_te {

std::tuple<at::Tensor, at::Tensor> fp8_block_quantize_cpu(const at::Tensor& input, int64_t block_rows,
                                                          int64_t block_cols, at::ScalarType fp8_dtype,
                                                          c10::string_view scale_mode, double amax_epsilon);
at::Tensor fp8_block_dequantize_cpu(const at::Tensor& data, const at::Tensor& scale_inv, int64_t block_rows,
                                    int64_t block_cols, at::ScalarType out_dtype);

}  // namespace portable_te
