// The autograd kernel of activation_fwd (schema in schemas.cpp), for every device: the forward
// runs the device kernel below autograd and records a C++ node whose backward calls
// activation_bwd, or activation_bwd_dbias where the bias needs its gradient (one pass over
// grad_output and input for both). In C++ for the reason norm_autograd.cpp gives: a Python
// formula costs a small call more than its kernel. The fake kernel stays in Python
// (custom_ops/activation.py), so opcheck and torch.compile trace through this node.
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "op_handles.h"

namespace portable_te {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// str arguments as the CPU kernels take them (activation_ops.cpp): one C++ signature per op.
using ActivationFwd = Tensor(const Tensor&, const std::optional<Tensor>&, const std::string&, double, double);
using ActivationBwd = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, const std::string&, double,
                             double);
using ActivationBwdDbias = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const std::string&,
                                                      double, double);

// Saves input and bias (the backward recomputes the activation from them); the backward
// returns one gradient per forward argument, none for activation, limit and alpha.
struct ActivationFunction : torch::autograd::Function<ActivationFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const std::optional<Tensor>& bias,
                        const std::string& activation, double limit, double alpha) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = find_op<ActivationFwd>("portable_te::activation_fwd");
    Tensor output = op.call(input, bias, activation, limit, alpha);
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->save_for_backward({input, has_bias ? *bias : Tensor()});
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["limit"] = limit;
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["has_bias"] = has_bias;
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = find_op<ActivationBwd>("portable_te::activation_bwd");
    static const auto bwd_dbias = find_op<ActivationBwdDbias>("portable_te::activation_bwd_dbias");
    const variable_list saved = ctx->get_saved_variables();  // input, bias (undefined without)
    const std::string activation = ctx->saved_data["activation"].toStringRef();
    const double limit = ctx->saved_data["limit"].toDouble(), alpha = ctx->saved_data["alpha"].toDouble();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    // Edges are the defined tensor arguments: input (0), then the bias (1) when given.
    if (has_bias && ctx->needs_input_grad(1)) {
      auto [grad_input, grad_bias] = call_backward_op(bwd_dbias, grads[0], saved[0], saved[1], activation, limit, alpha);
      return {grad_input, grad_bias, Tensor(), Tensor(), Tensor()};
    }
    const std::optional<Tensor> bias = has_bias ? std::optional<Tensor>(saved[1]) : std::nullopt;
    Tensor grad_input = call_backward_op(bwd, grads[0], saved[0], bias, activation, limit, alpha);
    return {grad_input, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor activation_fwd_autograd(const Tensor& input, const std::optional<Tensor>& bias, const std::string& activation,
                               double limit, double alpha) {
  return ActivationFunction::apply(input, bias, activation, limit, alpha);
}

}  // namespace
}  // namespace portable_te

TORCH_LIBRARY_IMPL(portable_te, Autograd, m) {
  m.impl("activation_fwd", &portable_te::activation_fwd_autograd);
}
