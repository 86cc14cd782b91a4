// CPU implementations of the FP8 cast ops (schemas in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace portable_te {

std::tuple<at::Tensor, at::Tensor> fp8_quantize_cpu(const at::Tensor& input, const at::Tensor& scale,
                                                    at::ScalarType fp8_dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fp8_quantize_transpose_cpu(const at::Tensor& input,
                                                                          const at::Tensor& scale,
                                                                          at::ScalarType fp8_dtype);
at::Tensor fp8_dequantize_cpu(const at::Tensor& data, const at::Tensor& scale_inv, at::ScalarType out_dtype);

}  // namespace portable_te
