// CPU implementations of the norm ops (schemas in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace portable_te {

std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm_fwd_cpu(const at::Tensor& input, const at::Tensor& weight,
                                                                 const std::optional<at::Tensor>& bias, double eps,
                                                                 bool zero_centered_gamma);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm_bwd_cpu(const at::Tensor& grad_output,
                                                                 const at::Tensor& input, const at::Tensor& mean,
                                                                 const at::Tensor& rstd, const at::Tensor& weight,
                                                                 bool zero_centered_gamma);
std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd_cpu(const at::Tensor& input, const at::Tensor& weight, double eps,
                                                   bool zero_centered_gamma);
std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                                   const at::Tensor& rstd, const at::Tensor& weight,
                                                   bool zero_centered_gamma);

// Residual add + norm: sum = input + residual (input's dtype), output = norm(sum). The
// backward's grad_input = norm_backward(grad_output) + grad_sum is the gradient of both
// input and residual.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layernorm_fwd_cpu(
    const at::Tensor& input, const at::Tensor& residual, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, double eps, bool zero_centered_gamma);
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layernorm_bwd_cpu(const at::Tensor& grad_output,
                                                                     const at::Tensor& grad_sum, const at::Tensor& sum,
                                                                     const at::Tensor& mean, const at::Tensor& rstd,
                                                                     const at::Tensor& weight,
                                                                     bool zero_centered_gamma);
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rmsnorm_fwd_cpu(const at::Tensor& input,
                                                                   const at::Tensor& residual,
                                                                   const at::Tensor& weight, double eps,
                                                                   bool zero_centered_gamma);
std::tuple<at::Tensor, at::Tensor> add_rmsnorm_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& grad_sum,
                                                       const at::Tensor& sum, const at::Tensor& rstd,
                                                       const at::Tensor& weight, bool zero_centered_gamma);

// Norm -> FP8: data = saturate(output * scale) in fp8_dtype, amax = max |output|, plus the
// statistics for the ordinary backward; output itself only when return_output (else [0]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> layernorm_fp8_fwd_cpu(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& scale, at::ScalarType fp8_dtype, double eps, bool zero_centered_gamma, bool return_output);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rmsnorm_fp8_fwd_cpu(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& scale, at::ScalarType fp8_dtype, double eps,
    bool zero_centered_gamma, bool return_output);

}  // namespace portable_te
