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

}  // namespace portable_te
