// CPU implementation of the scaled_gemm op (schema in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace portable_te {

at::Tensor scaled_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& a_scale_inv,
                           const std::optional<at::Tensor>& b_scale_inv, const std::optional<at::Tensor>& bias,
                           at::ScalarType out_dtype);

}  // namespace portable_te
