// CPU implementations of the cross-entropy ops (schemas in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace portable_te {

std::tuple<at::Tensor, at::Tensor> cross_entropy_fwd_cpu(const at::Tensor& logits, const at::Tensor& target,
                                                         double label_smoothing, int64_t ignore_index,
                                                         bool compute_grad,
                                                         const std::optional<at::Tensor>& grad_scale);
at::Tensor cross_entropy_bwd_cpu(const at::Tensor& grad, const at::Tensor& grad_loss);

}  // namespace portable_te
