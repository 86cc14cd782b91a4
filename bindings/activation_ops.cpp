// The activation ops' binding: their schemas; their CPU kernels (Tensor ->
// te_kernels::Activation*Params, every argument checked first); the autograd kernel of
// activation_fwd, for every device; its direct call.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "aten_thread_pool.h"
#include "direct_calls.h"
#include "op_handles.h"
#include "te_kernels/activation.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // Activations over input [..., H] with an optional bias [H] added first; activation is one of
  // gelu, qgelu, relu, srelu, silu (output [..., H]) or glu, geglu, qgeglu, reglu, sreglu,
  // swiglu, clamped_swiglu (gated: output [..., H/2] = act(first half) * second half); limit
  // and alpha are clamped_swiglu's. The backward ops recompute the activation from input.
  m.def("activation_fwd(Tensor input, Tensor? bias, str activation, float limit, float alpha) -> Tensor");
  m.def(
      "activation_bwd(Tensor grad_output, Tensor input, Tensor? bias, str activation, float limit, float alpha)"
      " -> Tensor");
  // The same plus grad_bias [H]: grad_input summed over all rows, in the same pass.
  m.def(
      "activation_bwd_dbias(Tensor grad_output, Tensor input, Tensor bias, str activation, float limit,"
      " float alpha) -> (Tensor grad_input, Tensor grad_bias)");
  // data = saturate(y * scale) in fp8_dtype and amax = max |y|, for y = activation_fwd(...)
  // (rounded to input's dtype), without materialising y.
  m.def(
      "activation_fp8(Tensor input, Tensor? bias, str activation, float limit, float alpha, Tensor scale,"
      " ScalarType fp8_dtype) -> (Tensor data, Tensor amax)");
  // data = saturate(grad_input * scale) in fp8_dtype, data_t its transpose [H, rows] with
  // with_transpose (else [0]), and amax = max |grad_input|, for grad_input = activation_bwd(
  // grad_output, input, None, ...) (rounded to input's dtype), without materialising it: the
  // FP8 operand of the gradient for the GEMM before the activation.
  m.def(
      "activation_bwd_fp8(Tensor grad_output, Tensor input, str activation, float limit, float alpha, Tensor scale,"
      " ScalarType fp8_dtype, bool with_transpose) -> (Tensor data, Tensor data_t, Tensor amax)");
}

namespace portable_te {
namespace {

using te_kernels::ActivationKind;

constexpr std::array<std::pair<const char*, ActivationKind>, 12> kActivations = {{
    {"gelu", ActivationKind::kGelu},       {"qgelu", ActivationKind::kQGelu},
    {"relu", ActivationKind::kRelu},       {"srelu", ActivationKind::kSRelu},
    {"silu", ActivationKind::kSilu},       {"glu", ActivationKind::kGlu},
    {"geglu", ActivationKind::kGeglu},     {"qgeglu", ActivationKind::kQGeglu},
    {"reglu", ActivationKind::kReglu},     {"sreglu", ActivationKind::kSReglu},
    {"swiglu", ActivationKind::kSwiglu},   {"clamped_swiglu", ActivationKind::kClampedSwiglu},
}};

te_kernels::Activation parse_activation(const char* op, const std::string& name, double limit, double alpha) {
  for (const auto& [known, kind] : kActivations) {
    if (name == known) {
      TORCH_CHECK_VALUE(limit >= 0, op, ": limit must be non-negative, got ", limit);
      return {kind, float(limit), float(alpha)};
    }
  }
  TORCH_CHECK_VALUE(false, op, ": unknown activation '", name,
                    "'; expected one of gelu, qgelu, relu, srelu, silu, glu, geglu, qgeglu, reglu, sreglu, swiglu, "
                    "clamped_swiglu");
}

// Checks input (and bias) and returns the output's shape: input's, with the last dimension
// halved for a gated activation.
std::vector<int64_t> check_input(const char* op, const at::Tensor& input, const at::Tensor* bias,
                                 const te_kernels::Activation& act) {
  high_precision_dtype(op, "input", input.scalar_type());
  TORCH_CHECK_VALUE(input.dim() >= 1, op, ": input must have at least one dimension, got a 0-d tensor");
  std::vector<int64_t> out_shape(input.sizes().begin(), input.sizes().end());
  if (te_kernels::is_gated(act.kind)) {
    TORCH_CHECK_VALUE(input.size(-1) % 2 == 0, op, ": a gated activation splits the last dimension of input in two "
                      "halves, so it must be even; input has shape ", input.sizes());
    out_shape.back() /= 2;
  }
  if (bias != nullptr) {
    check_same_device(op, "bias", *bias, "input", input);
    check_dtype(op, "bias", *bias, input.scalar_type());
    check_shape(op, "bias", *bias, {input.size(-1)}, "one bias per element of input's last dimension");
  }
  return out_shape;
}

void check_grad_output(const char* op, const at::Tensor& grad_output, const at::Tensor& input,
                       at::IntArrayRef out_shape) {
  check_same_device(op, "grad_output", grad_output, "input", input);
  check_dtype(op, "grad_output", grad_output, input.scalar_type());
  check_shape(op, "grad_output", grad_output, out_shape, "the shape of the activation's output");
}

// The fields every activation params struct shares: the activation, the input as [rows, cols]
// (cols = its last dimension, which a gated kind halves), its dtype, and the optional bias.
template <typename Params>
void fill_input_params(Params& p, const char* op, te_kernels::Activation act, const at::Tensor& input,
                       const at::Tensor& bias) {
  p.act = act;
  p.cols = input.size(-1);
  p.rows = p.cols > 0 ? input.numel() / p.cols : 0;
  p.dtype = high_precision_dtype(op, "input", input.scalar_type());
  p.x = input.const_data_ptr();
  p.bias = bias.defined() ? bias.const_data_ptr() : nullptr;
}

// scale: float32, one element, on input's device.
void check_per_tensor_scale(const char* op, const at::Tensor& scale, const at::Tensor& input) {
  check_same_device(op, "scale", scale, "input", input);
  check_dtype(op, "scale", scale, at::kFloat);
  TORCH_CHECK_VALUE(scale.numel() == 1, op, ": scale must hold one element (per-tensor scaling), got shape ",
                    scale.sizes());
}

std::pair<at::Tensor, at::Tensor> backward(const char* op, const at::Tensor& grad_output_arg,
                                           const at::Tensor& input_arg, const at::Tensor* bias_arg,
                                           bool with_grad_bias, const std::string& activation, double limit,
                                           double alpha) {
  const te_kernels::Activation act = parse_activation(op, activation, limit, alpha);
  const std::vector<int64_t> out_shape = check_input(op, input_arg, bias_arg, act);
  check_grad_output(op, grad_output_arg, input_arg, out_shape);
  const at::Tensor grad_output = grad_output_arg.contiguous();
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor bias = bias_arg != nullptr ? bias_arg->contiguous() : at::Tensor();
  at::Tensor grad_input = at::empty_like(input);
  at::Tensor grad_bias = with_grad_bias ? at::empty_like(bias) : at::Tensor();

  te_kernels::ActivationBwdParams p;
  fill_input_params(p, op, act, input, bias);
  p.dy = grad_output.const_data_ptr();
  p.dx = grad_input.mutable_data_ptr();
  p.dbias = with_grad_bias ? grad_bias.mutable_data_ptr() : nullptr;
  const AtenThreadPool pool;
  te_kernels::activation_bwd_plan(p, pool);
  const c10::DataPtr scratch = workspace(te_kernels::activation_bwd_workspace_bytes(p));
  p.workspace = scratch.get();
  te_kernels::activation_bwd(p, pool);
  return {grad_input, grad_bias};
}

}  // namespace

at::Tensor activation_fwd_cpu(const at::Tensor& input_arg, const std::optional<at::Tensor>& bias_arg,
                              const std::string& activation, double limit, double alpha) {
  const char* op = "activation_fwd";
  const te_kernels::Activation act = parse_activation(op, activation, limit, alpha);
  const std::vector<int64_t> out_shape = check_input(op, input_arg, bias_arg ? &*bias_arg : nullptr, act);
  const at::Tensor input = input_arg.contiguous();  // a non-contiguous view is copied once
  const at::Tensor bias = bias_arg ? bias_arg->contiguous() : at::Tensor();
  at::Tensor output = at::empty(out_shape, input.options());

  te_kernels::ActivationFwdParams p;
  fill_input_params(p, op, act, input, bias);
  p.y = output.mutable_data_ptr();
  te_kernels::activation_fwd(p, AtenThreadPool());
  return output;
}

at::Tensor activation_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                              const std::optional<at::Tensor>& bias, const std::string& activation, double limit,
                              double alpha) {
  return backward("activation_bwd", grad_output, input, bias ? &*bias : nullptr, /*with_grad_bias=*/false,
                  activation, limit, alpha)
      .first;
}

std::tuple<at::Tensor, at::Tensor> activation_bwd_dbias_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                                            const at::Tensor& bias, const std::string& activation,
                                                            double limit, double alpha) {
  auto [grad_input, grad_bias] =
      backward("activation_bwd_dbias", grad_output, input, &bias, /*with_grad_bias=*/true, activation, limit, alpha);
  return {grad_input, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> activation_fp8_cpu(const at::Tensor& input_arg,
                                                      const std::optional<at::Tensor>& bias_arg,
                                                      const std::string& activation, double limit, double alpha,
                                                      const at::Tensor& scale_arg, at::ScalarType fp8_dtype) {
  const char* op = "activation_fp8";
  const te_kernels::Activation act = parse_activation(op, activation, limit, alpha);
  const std::vector<int64_t> out_shape = check_input(op, input_arg, bias_arg ? &*bias_arg : nullptr, act);
  const te_kernels::Fp8Format format = fp8_format(op, "fp8_dtype", fp8_dtype);
  check_per_tensor_scale(op, scale_arg, input_arg);
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor bias = bias_arg ? bias_arg->contiguous() : at::Tensor();
  const at::Tensor scale = scale_arg.contiguous();
  at::Tensor data = at::empty(out_shape, input.options().dtype(fp8_dtype));
  at::Tensor amax = at::empty({}, input.options().dtype(at::kFloat));
  const AtenThreadPool pool;
  const c10::DataPtr scratch = workspace(te_kernels::activation_fp8_workspace_bytes(pool));

  te_kernels::ActivationFp8Params p;
  fill_input_params(p, op, act, input, bias);
  p.format = format;
  p.scale = scale.const_data_ptr<float>();
  p.out = static_cast<uint8_t*>(data.mutable_data_ptr());
  p.amax = amax.mutable_data_ptr<float>();
  p.workspace = scratch.get();
  te_kernels::activation_fp8(p, pool);
  return {data, amax};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> activation_bwd_fp8_cpu(const at::Tensor& grad_output_arg,
                                                                      const at::Tensor& input_arg,
                                                                      const std::string& activation, double limit,
                                                                      double alpha, const at::Tensor& scale_arg,
                                                                      at::ScalarType fp8_dtype, bool with_transpose) {
  const char* op = "activation_bwd_fp8";
  const te_kernels::Activation act = parse_activation(op, activation, limit, alpha);
  const std::vector<int64_t> out_shape = check_input(op, input_arg, nullptr, act);
  check_grad_output(op, grad_output_arg, input_arg, out_shape);
  const te_kernels::Fp8Format format = fp8_format(op, "fp8_dtype", fp8_dtype);
  check_per_tensor_scale(op, scale_arg, input_arg);
  const at::Tensor grad_output = grad_output_arg.contiguous();
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor scale = scale_arg.contiguous();
  const int64_t cols = input.size(-1), rows = cols > 0 ? input.numel() / cols : 0;
  at::Tensor data = at::empty(input.sizes(), input.options().dtype(fp8_dtype));
  at::Tensor data_t = at::empty(with_transpose ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{0},
                                input.options().dtype(fp8_dtype));
  at::Tensor amax = at::empty({}, input.options().dtype(at::kFloat));
  const AtenThreadPool pool;
  const c10::DataPtr scratch = workspace(te_kernels::activation_fp8_workspace_bytes(pool));

  te_kernels::ActivationBwdFp8Params p;
  p.act = act;
  p.rows = rows;
  p.cols = cols;
  p.dtype = high_precision_dtype(op, "input", input.scalar_type());
  p.x = input.const_data_ptr();
  p.dy = grad_output.const_data_ptr();
  p.format = format;
  p.scale = scale.const_data_ptr<float>();
  p.out = static_cast<uint8_t*>(data.mutable_data_ptr());
  p.out_t = with_transpose ? static_cast<uint8_t*>(data_t.mutable_data_ptr()) : nullptr;
  p.amax = amax.mutable_data_ptr<float>();
  p.workspace = scratch.get();
  te_kernels::activation_bwd_fp8(p, pool);
  return {data, data_t, amax};
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("activation_fwd", &portable_te::activation_fwd_cpu);
  m.impl("activation_bwd", &portable_te::activation_bwd_cpu);
  m.impl("activation_bwd_dbias", &portable_te::activation_bwd_dbias_cpu);
  m.impl("activation_fp8", &portable_te::activation_fp8_cpu);
  m.impl("activation_bwd_fp8", &portable_te::activation_bwd_fp8_cpu);
}

// --- autograd --------------------------------------------------------------------------------------
// The autograd kernel of activation_fwd, for every device: the forward runs the device kernel
// below autograd and records a C++ node whose backward calls activation_bwd, or
// activation_bwd_dbias where the bias needs its gradient (one pass over grad_output and input for
// both). In C++ for the reason norm_ops.cpp gives: a Python formula costs a small call more than
// its kernel. The fake kernel stays in Python (custom_ops/activation.py), so opcheck and
// torch.compile trace through this node.

namespace portable_te {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// str arguments as the CPU kernels above take them: one C++ signature per op.
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

// --- direct call (direct_calls.h) ------------------------------------------------------------------

namespace portable_te {
namespace {

Tensor activation_direct(const Tensor& input, const std::optional<Tensor>& bias, const std::string& activation,
                         double limit, double alpha) {
  static const auto op = find_op<Tensor(const Tensor&, const std::optional<Tensor>&, const std::string&, double, double)>(
      "portable_te::activation_fwd");
  return op.call(input, bias, activation, limit, alpha);
}

const DirectCall activation_direct_call([](pybind11::module_& direct) {
  direct.def("activation", &activation_direct, "portable_te::activation_fwd, called through the dispatcher");
});

}  // namespace
}  // namespace portable_te
