// Autograd kernels of the norm ops (schemas in schemas.cpp), for every device: each forward op
// runs its device kernel below autograd and records a C++ node whose backward calls the
// matching backward op. In C++ because a Python autograd formula (torch.library.register_autograd)
// costs tens of microseconds a call, several times the kernel on the small inputs of decoding
// and small models. The ops' fake kernels stay in Python (custom_ops/norm.py), so opcheck and
// torch.compile trace through these nodes like ATen's.
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "op_handles.h"

namespace portable_te {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using LayerNormFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                                        double, bool);
using LayerNormBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                        const Tensor&, bool);
using RMSNormFwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, double, bool);
using RMSNormBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool);
using AddLayerNormFwd = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                   const std::optional<Tensor>&, double, bool);
using AddLayerNormBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                           const Tensor&, const Tensor&, const Tensor&, bool);
using AddRMSNormFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double, bool);
using AddRMSNormBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                 const Tensor&, bool);

// Each Function: forward saves what its backward op reads and marks the statistics (mean,
// rstd) non-differentiable; backward returns one gradient per forward argument (undefined for
// eps, zero_centered_gamma and an absent bias).

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                               const std::optional<Tensor>& bias, double eps, bool zero_centered_gamma) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = find_op<LayerNormFwd>("portable_te::layernorm_fwd");
    auto [output, mean, rstd] = op.call(input, weight, bias, eps, zero_centered_gamma);
    ctx->save_for_backward({input, weight, mean, rstd});
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({mean, rstd});
    return {output, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = find_op<LayerNormBwd>("portable_te::layernorm_bwd");
    const variable_list saved = ctx->get_saved_variables();  // input, weight, mean, rstd
    auto [grad_input, grad_weight, grad_bias] = call_backward_op(
        op, grads[0], saved[0], saved[2], saved[3], saved[1], ctx->saved_data["zero_centered_gamma"].toBool());
    return {grad_input, grad_weight, ctx->saved_data["has_bias"].toBool() ? grad_bias : Tensor(), Tensor(), Tensor()};
  }
};

struct RMSNormFunction : torch::autograd::Function<RMSNormFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight, double eps,
                               bool zero_centered_gamma) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = find_op<RMSNormFwd>("portable_te::rmsnorm_fwd");
    auto [output, rstd] = op.call(input, weight, eps, zero_centered_gamma);
    ctx->save_for_backward({input, weight, rstd});
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    ctx->mark_non_differentiable({rstd});
    return {output, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = find_op<RMSNormBwd>("portable_te::rmsnorm_bwd");
    const variable_list saved = ctx->get_saved_variables();  // input, weight, rstd
    auto [grad_input, grad_weight] = call_backward_op(op, grads[0], saved[0], saved[2], saved[1],
                                                      ctx->saved_data["zero_centered_gamma"].toBool());
    return {grad_input, grad_weight, Tensor(), Tensor()};
  }
};

// sum = input + residual; d sum / d input = d sum / d residual = identity, so both get the
// backward op's grad_input (which already includes grad_sum, the gradient of sum's other uses).
struct AddLayerNormFunction : torch::autograd::Function<AddLayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& residual, const Tensor& weight,
                               const std::optional<Tensor>& bias, double eps, bool zero_centered_gamma) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = find_op<AddLayerNormFwd>("portable_te::add_layernorm_fwd");
    auto [output, sum, mean, rstd] = op.call(input, residual, weight, bias, eps, zero_centered_gamma);
    ctx->save_for_backward({sum, weight, mean, rstd});
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({mean, rstd});
    return {output, sum, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = find_op<AddLayerNormBwd>("portable_te::add_layernorm_bwd");
    const variable_list saved = ctx->get_saved_variables();  // sum, weight, mean, rstd
    auto [grad_input, grad_weight, grad_bias] =
        call_backward_op(op, grads[0], grads[1], saved[0], saved[2], saved[3], saved[1],
                         ctx->saved_data["zero_centered_gamma"].toBool());
    return {grad_input, grad_input, grad_weight, ctx->saved_data["has_bias"].toBool() ? grad_bias : Tensor(),
            Tensor(), Tensor()};
  }
};

struct AddRMSNormFunction : torch::autograd::Function<AddRMSNormFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& residual, const Tensor& weight,
                               double eps, bool zero_centered_gamma) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = find_op<AddRMSNormFwd>("portable_te::add_rmsnorm_fwd");
    auto [output, sum, rstd] = op.call(input, residual, weight, eps, zero_centered_gamma);
    ctx->save_for_backward({sum, weight, rstd});
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    ctx->mark_non_differentiable({rstd});
    return {output, sum, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = find_op<AddRMSNormBwd>("portable_te::add_rmsnorm_bwd");
    const variable_list saved = ctx->get_saved_variables();  // sum, weight, rstd
    auto [grad_input, grad_weight] = call_backward_op(op, grads[0], grads[1], saved[0], saved[2], saved[1],
                                                      ctx->saved_data["zero_centered_gamma"].toBool());
    return {grad_input, grad_input, grad_weight, Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> layernorm_fwd_autograd(const Tensor& input, const Tensor& weight,
                                                          const std::optional<Tensor>& bias, double eps,
                                                          bool zero_centered_gamma) {
  const variable_list out = LayerNormFunction::apply(input, weight, bias, eps, zero_centered_gamma);
  return {out[0], out[1], out[2]};
}

std::tuple<Tensor, Tensor> rmsnorm_fwd_autograd(const Tensor& input, const Tensor& weight, double eps,
                                                bool zero_centered_gamma) {
  const variable_list out = RMSNormFunction::apply(input, weight, eps, zero_centered_gamma);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layernorm_fwd_autograd(const Tensor& input, const Tensor& residual,
                                                                      const Tensor& weight,
                                                                      const std::optional<Tensor>& bias, double eps,
                                                                      bool zero_centered_gamma) {
  const variable_list out = AddLayerNormFunction::apply(input, residual, weight, bias, eps, zero_centered_gamma);
  return {out[0], out[1], out[2], out[3]};
}

std::tuple<Tensor, Tensor, Tensor> add_rmsnorm_fwd_autograd(const Tensor& input, const Tensor& residual,
                                                            const Tensor& weight, double eps,
                                                            bool zero_centered_gamma) {
  const variable_list out = AddRMSNormFunction::apply(input, residual, weight, eps, zero_centered_gamma);
  return {out[0], out[1], out[2]};
}

}  // namespace
}  // namespace portable_te

TORCH_LIBRARY_IMPL(portable_te, Autograd, m) {
  m.impl("layernorm_fwd", &portable_te::layernorm_fwd_autograd);
  m.impl("rmsnorm_fwd", &portable_te::rmsnorm_fwd_autograd);
  m.impl("add_layernorm_fwd", &portable_te::add_layernorm_fwd_autograd);
  m.impl("add_rmsnorm_fwd", &portable_te::add_rmsnorm_fwd_autograd);
}
