// CPU implementations of the attention-softmax ops (schemas in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

namespace portable_te {

at::Tensor scaled_softmax_fwd_cpu(const at::Tensor& input, const std::optional<at::Tensor>& mask, double scale,
                                  c10::string_view mask_type);
at::Tensor scaled_softmax_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& output,
                                  const std::optional<at::Tensor>& mask, double scale, c10::string_view mask_type);

}  // namespace portable_te
