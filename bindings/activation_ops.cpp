// Tensor -> te_kernels::Activation*Params, with every argument checked first.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <utility>

#include "aten_thread_pool.h"
#include "te_kernels/activation.h"
#include "tensor_checks.h"

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
  check_same_device(op, "scale", scale_arg, "input", input_arg);
  check_dtype(op, "scale", scale_arg, at::kFloat);
  TORCH_CHECK_VALUE(scale_arg.numel() == 1, op, ": scale must hold one element (per-tensor scaling), got shape ",
                    scale_arg.sizes());
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

}  // namespace portable_te

// The CPU kernels of these ops (schemas in schemas.cpp).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("activation_fwd", &portable_te::activation_fwd_cpu);
  m.impl("activation_bwd", &portable_te::activation_bwd_cpu);
  m.impl("activation_bwd_dbias", &portable_te::activation_bwd_dbias_cpu);
  m.impl("activation_fp8", &portable_te::activation_fp8_cpu);
}
