// CPU implementations of the activation ops (schemas in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace portable_te {

at::Tensor activation_fwd_cpu(const at::Tensor& input, const std::optional<at::Tensor>& bias,
                              const std::string& activation, double limit, double alpha);
at::Tensor activation_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                              const std::optional<at::Tensor>& bias, const std::string& activation, double limit,
                              double alpha);
std::tuple<at::Tensor, at::Tensor> activation_bwd_dbias_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                                            const at::Tensor& bias, const std::string& activation,
                                                            double limit, double alpha);
std::tuple<at::Tensor, at::Tensor> activation_fp8_cpu(const at::Tensor& input, const std::optional<at::Tensor>& bias,
                                                      const std::string& activation, double limit, double alpha,
                                                      const at::Tensor& scale, at::ScalarType fp8_dtype);

}  // namespace portable_te
