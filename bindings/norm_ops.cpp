// The norm ops' binding: their schemas; their CPU kernels (Tensor -> te_kernels::Norm*Params,
// every argument checked first); the autograd kernels of the forward ops, for every device; the
// direct calls of layernorm and rmsnorm.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "aten_thread_pool.h"
#include "direct_calls.h"
#include "op_handles.h"
#include "te_kernels/norm.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // input [..., H]; weight, bias [H]; mean, rstd [...] (input's leading dims) in float32, or
  // float64 for float64 input.
  m.def(
      "layernorm_fwd(Tensor input, Tensor weight, Tensor? bias, float eps, bool zero_centered_gamma)"
      " -> (Tensor output, Tensor mean, Tensor rstd)");
  m.def(
      "layernorm_bwd(Tensor grad_output, Tensor input, Tensor mean, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
  m.def(
      "rmsnorm_fwd(Tensor input, Tensor weight, float eps, bool zero_centered_gamma)"
      " -> (Tensor output, Tensor rstd)");
  m.def(
      "rmsnorm_bwd(Tensor grad_output, Tensor input, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight)");
  // Residual add + norm: sum = input + residual (the next residual stream), output = norm(sum).
  // grad_sum is the gradient reaching sum from its other uses; grad_input (of input and of
  // residual alike) = norm_backward(grad_output) + grad_sum.
  m.def(
      "add_layernorm_fwd(Tensor input, Tensor residual, Tensor weight, Tensor? bias, float eps,"
      " bool zero_centered_gamma) -> (Tensor output, Tensor sum, Tensor mean, Tensor rstd)");
  m.def(
      "add_layernorm_bwd(Tensor grad_output, Tensor grad_sum, Tensor sum, Tensor mean, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
  m.def(
      "add_rmsnorm_fwd(Tensor input, Tensor residual, Tensor weight, float eps, bool zero_centered_gamma)"
      " -> (Tensor output, Tensor sum, Tensor rstd)");
  m.def(
      "add_rmsnorm_bwd(Tensor grad_output, Tensor grad_sum, Tensor sum, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight)");
  // Norm -> FP8 (forward only): data = saturate(output * scale) in fp8_dtype, amax = max |output|;
  // output (input's dtype) is returned only when return_output, else an empty [0] tensor.
  m.def(
      "layernorm_fp8_fwd(Tensor input, Tensor weight, Tensor? bias, Tensor scale, ScalarType fp8_dtype, float eps,"
      " bool zero_centered_gamma, bool return_output)"
      " -> (Tensor data, Tensor amax, Tensor mean, Tensor rstd, Tensor output)");
  m.def(
      "rmsnorm_fp8_fwd(Tensor input, Tensor weight, Tensor scale, ScalarType fp8_dtype, float eps,"
      " bool zero_centered_gamma, bool return_output) -> (Tensor data, Tensor amax, Tensor rstd, Tensor output)");
}

namespace portable_te {
namespace {

using te_kernels::NormKind;

// input [..., H] -> H, after checking the parameters fit it.
int64_t check_norm_params(const char* op, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor* bias) {
  kernel_dtype(op, "input", input);
  TORCH_CHECK_VALUE(input.dim() >= 1, op, ": input must have at least one dimension (the normalized one), got a 0-d tensor");
  const int64_t hidden = input.size(-1);
  TORCH_CHECK_VALUE(hidden > 0, op, ": the normalized (last) dimension of input must be non-empty, input has shape ",
                    input.sizes());
  kernel_dtype(op, "weight", weight);
  check_same_device(op, "weight", weight, "input", input);
  check_shape(op, "weight", weight, {hidden}, "the normalized size is input's last dimension");
  if (bias != nullptr) {
    check_same_device(op, "bias", *bias, "input", input);
    check_dtype(op, "bias", *bias, weight.scalar_type());
    check_shape(op, "bias", *bias, {hidden}, "the normalized size is input's last dimension");
  }
  return hidden;
}

void check_eps(const char* op, double eps) {
  TORCH_CHECK_VALUE(eps >= 0, op, ": eps must be non-negative, got ", eps);
}

void check_norm_backward(const char* op, const at::Tensor& grad_output, const at::Tensor& input,
                         const at::Tensor* mean, const at::Tensor& rstd) {
  check_same_device(op, "grad_output", grad_output, "input", input);
  check_dtype(op, "grad_output", grad_output, input.scalar_type());
  check_shape(op, "grad_output", grad_output, input.sizes(), "it must match input");
  const at::IntArrayRef leading = input.sizes().slice(0, input.dim() - 1);
  for (auto [name, stat] : {std::pair{"mean", mean}, std::pair{"rstd", &rstd}}) {
    if (stat == nullptr) continue;
    check_same_device(op, name, *stat, "input", input);
    check_dtype(op, name, *stat, stats_dtype(input.scalar_type()));
    check_shape(op, name, *stat, leading, "one statistic per row of input");
  }
}

// The residual of an add + norm: input's shape, dtype and device.
void check_residual(const char* op, const at::Tensor& residual, const at::Tensor& input) {
  check_same_device(op, "residual", residual, "input", input);
  check_dtype(op, "residual", residual, input.scalar_type());
  check_shape(op, "residual", residual, input.sizes(), "it must match input");
}

// The FP8 output of a norm -> FP8 forward: a per-tensor scale and a 16/32-bit input.
te_kernels::Fp8Format check_fp8_output(const char* op, const at::Tensor& input, const at::Tensor& scale,
                                       at::ScalarType fp8_dtype) {
  const te_kernels::Fp8Format format = fp8_format(op, "fp8_dtype", fp8_dtype);
  high_precision_dtype(op, "input", input.scalar_type());
  check_same_device(op, "scale", scale, "input", input);
  check_dtype(op, "scale", scale, at::kFloat);
  TORCH_CHECK_VALUE(scale.numel() == 1, op, ": scale must hold one element (per-tensor scaling), got shape ",
                    scale.sizes());
  return format;
}

// Optional fusions of the forward (te_kernels/norm.h).
struct ForwardFusions {
  const at::Tensor* residual = nullptr;  // add it to input first, and return the sum
  const at::Tensor* fp8_scale = nullptr;  // write FP8 codes of output * scale and amax(output)
  at::ScalarType fp8_dtype = at::kFloat8_e4m3fn;
  bool keep_output = true;  // with FP8: also return the high-precision output
};

struct NormOutputs {
  at::Tensor output, mean, rstd, sum, fp8_data, amax;
};

NormOutputs norm_forward(NormKind kind, const at::Tensor& input_arg, const at::Tensor& weight_arg,
                         const at::Tensor* bias_arg, double eps, bool zero_centered_gamma,
                         const ForwardFusions& fusions = {}) {
  const at::Tensor input = input_arg.contiguous();  // a non-contiguous view is copied once
  const at::Tensor weight = weight_arg.contiguous();
  const at::Tensor bias = bias_arg != nullptr ? bias_arg->contiguous() : at::Tensor();
  const at::Tensor residual = fusions.residual != nullptr ? fusions.residual->contiguous() : at::Tensor();
  const at::Tensor scale = fusions.fp8_scale != nullptr ? fusions.fp8_scale->contiguous() : at::Tensor();
  const int64_t hidden = input.size(-1);
  const at::IntArrayRef leading = input.sizes().slice(0, input.dim() - 1);
  const auto stats_options = input.options().dtype(stats_dtype(input.scalar_type()));

  NormOutputs out;
  // Without keep_output the high-precision output is an empty [0] placeholder.
  out.output = fusions.keep_output ? at::empty_like(input) : at::empty({0}, input.options());
  out.rstd = at::empty(leading, stats_options);
  if (kind == NormKind::kLayerNorm) out.mean = at::empty(leading, stats_options);
  if (residual.defined()) out.sum = at::empty_like(input);
  if (scale.defined()) {
    out.fp8_data = at::empty(input.sizes(), input.options().dtype(fusions.fp8_dtype));
    out.amax = at::empty({}, input.options().dtype(at::kFloat));
  }

  te_kernels::NormFwdParams p;
  p.kind = kind;
  p.rows = input.numel() / hidden;
  p.cols = hidden;
  p.x_dtype = kernel_dtype("norm", "input", input);
  p.w_dtype = kernel_dtype("norm", "weight", weight);
  p.x = input.const_data_ptr();
  p.gamma = weight.const_data_ptr();
  p.beta = bias.defined() ? bias.const_data_ptr() : nullptr;
  p.y = fusions.keep_output ? out.output.mutable_data_ptr() : nullptr;
  p.mean = out.mean.defined() ? out.mean.mutable_data_ptr() : nullptr;
  p.rstd = out.rstd.mutable_data_ptr();
  p.eps = eps;
  p.zero_centered_gamma = zero_centered_gamma;
  if (residual.defined()) {
    p.residual = residual.const_data_ptr();
    p.sum = out.sum.mutable_data_ptr();
  }
  if (scale.defined()) {
    p.y_fp8 = static_cast<uint8_t*>(out.fp8_data.mutable_data_ptr());
    p.fp8_format = fp8_format("norm", "fp8_dtype", fusions.fp8_dtype);
    p.fp8_scale = scale.const_data_ptr<float>();
    p.amax = out.amax.mutable_data_ptr<float>();
  }
  const AtenThreadPool pool;
  te_kernels::norm_fwd_plan(p, pool);
  const c10::DataPtr scratch = workspace(te_kernels::norm_fwd_workspace_bytes(p));
  p.workspace = scratch.get();
  te_kernels::norm_fwd(p, pool);
  return out;
}

struct NormGrads {
  at::Tensor input, weight, bias;
};

// grad_sum_arg (optional): the gradient of a residual add's sum from its other uses, added to grad_input.
NormGrads norm_backward(NormKind kind, const at::Tensor& grad_output_arg, const at::Tensor& input_arg,
                        const at::Tensor* mean_arg, const at::Tensor& rstd_arg, const at::Tensor& weight_arg,
                        bool zero_centered_gamma, const at::Tensor* grad_sum_arg = nullptr) {
  const at::Tensor grad_output = grad_output_arg.contiguous();
  const at::Tensor grad_sum = grad_sum_arg != nullptr ? grad_sum_arg->contiguous() : at::Tensor();
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor rstd = rstd_arg.contiguous();
  const at::Tensor mean = mean_arg != nullptr ? mean_arg->contiguous() : at::Tensor();
  const at::Tensor weight = weight_arg.contiguous();
  const int64_t hidden = input.size(-1);

  NormGrads grads;
  grads.input = at::empty_like(input);
  grads.weight = at::empty_like(weight);
  if (kind == NormKind::kLayerNorm) grads.bias = at::empty_like(weight);

  te_kernels::NormBwdParams p;
  p.kind = kind;
  p.rows = input.numel() / hidden;
  p.cols = hidden;
  p.x_dtype = kernel_dtype("norm", "input", input);
  p.w_dtype = kernel_dtype("norm", "weight", weight);
  p.dy = grad_output.const_data_ptr();
  p.x = input.const_data_ptr();
  p.mean = mean.defined() ? mean.const_data_ptr() : nullptr;
  p.rstd = rstd.const_data_ptr();
  p.gamma = weight.const_data_ptr();
  p.dsum = grad_sum.defined() ? grad_sum.const_data_ptr() : nullptr;
  p.dx = grads.input.mutable_data_ptr();
  p.dgamma = grads.weight.mutable_data_ptr();
  p.dbeta = grads.bias.defined() ? grads.bias.mutable_data_ptr() : nullptr;
  p.zero_centered_gamma = zero_centered_gamma;
  const AtenThreadPool pool;
  te_kernels::norm_bwd_plan(p, pool);
  const c10::DataPtr scratch = workspace(te_kernels::norm_bwd_workspace_bytes(p));
  p.workspace = scratch.get();
  te_kernels::norm_bwd(p, pool);
  return grads;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm_fwd_cpu(const at::Tensor& input, const at::Tensor& weight,
                                                                 const std::optional<at::Tensor>& bias, double eps,
                                                                 bool zero_centered_gamma) {
  const at::Tensor* bias_ptr = bias.has_value() ? &*bias : nullptr;
  check_norm_params("layernorm_fwd", input, weight, bias_ptr);
  check_eps("layernorm_fwd", eps);
  NormOutputs out = norm_forward(NormKind::kLayerNorm, input, weight, bias_ptr, eps, zero_centered_gamma);
  return {out.output, out.mean, out.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm_bwd_cpu(const at::Tensor& grad_output,
                                                                 const at::Tensor& input, const at::Tensor& mean,
                                                                 const at::Tensor& rstd, const at::Tensor& weight,
                                                                 bool zero_centered_gamma) {
  check_norm_params("layernorm_bwd", input, weight, nullptr);
  check_norm_backward("layernorm_bwd", grad_output, input, &mean, rstd);
  NormGrads g = norm_backward(NormKind::kLayerNorm, grad_output, input, &mean, rstd, weight, zero_centered_gamma);
  return {g.input, g.weight, g.bias};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd_cpu(const at::Tensor& input, const at::Tensor& weight, double eps,
                                                   bool zero_centered_gamma) {
  check_norm_params("rmsnorm_fwd", input, weight, nullptr);
  check_eps("rmsnorm_fwd", eps);
  NormOutputs out = norm_forward(NormKind::kRMSNorm, input, weight, nullptr, eps, zero_centered_gamma);
  return {out.output, out.rstd};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                                   const at::Tensor& rstd, const at::Tensor& weight,
                                                   bool zero_centered_gamma) {
  check_norm_params("rmsnorm_bwd", input, weight, nullptr);
  check_norm_backward("rmsnorm_bwd", grad_output, input, nullptr, rstd);
  NormGrads g = norm_backward(NormKind::kRMSNorm, grad_output, input, nullptr, rstd, weight, zero_centered_gamma);
  return {g.input, g.weight};
}

// --- residual add + norm ------------------------------------------------------------------
// sum = input + residual (input's dtype), output = norm(sum). The backward's grad_input =
// norm_backward(grad_output) + grad_sum is the gradient of both input and residual.

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layernorm_fwd_cpu(
    const at::Tensor& input, const at::Tensor& residual, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, double eps, bool zero_centered_gamma) {
  const char* op = "add_layernorm_fwd";
  const at::Tensor* bias_ptr = bias.has_value() ? &*bias : nullptr;
  check_norm_params(op, input, weight, bias_ptr);
  check_residual(op, residual, input);
  check_eps(op, eps);
  ForwardFusions fusions;
  fusions.residual = &residual;
  NormOutputs out = norm_forward(NormKind::kLayerNorm, input, weight, bias_ptr, eps, zero_centered_gamma, fusions);
  return {out.output, out.sum, out.mean, out.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layernorm_bwd_cpu(const at::Tensor& grad_output,
                                                                     const at::Tensor& grad_sum, const at::Tensor& sum,
                                                                     const at::Tensor& mean, const at::Tensor& rstd,
                                                                     const at::Tensor& weight,
                                                                     bool zero_centered_gamma) {
  const char* op = "add_layernorm_bwd";
  check_norm_params(op, sum, weight, nullptr);
  check_norm_backward(op, grad_output, sum, &mean, rstd);
  check_same_device(op, "grad_sum", grad_sum, "sum", sum);
  check_dtype(op, "grad_sum", grad_sum, sum.scalar_type());
  check_shape(op, "grad_sum", grad_sum, sum.sizes(), "it must match sum");
  NormGrads g = norm_backward(NormKind::kLayerNorm, grad_output, sum, &mean, rstd, weight, zero_centered_gamma,
                              &grad_sum);
  return {g.input, g.weight, g.bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rmsnorm_fwd_cpu(const at::Tensor& input,
                                                                   const at::Tensor& residual,
                                                                   const at::Tensor& weight, double eps,
                                                                   bool zero_centered_gamma) {
  const char* op = "add_rmsnorm_fwd";
  check_norm_params(op, input, weight, nullptr);
  check_residual(op, residual, input);
  check_eps(op, eps);
  ForwardFusions fusions;
  fusions.residual = &residual;
  NormOutputs out = norm_forward(NormKind::kRMSNorm, input, weight, nullptr, eps, zero_centered_gamma, fusions);
  return {out.output, out.sum, out.rstd};
}

std::tuple<at::Tensor, at::Tensor> add_rmsnorm_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& grad_sum,
                                                       const at::Tensor& sum, const at::Tensor& rstd,
                                                       const at::Tensor& weight, bool zero_centered_gamma) {
  const char* op = "add_rmsnorm_bwd";
  check_norm_params(op, sum, weight, nullptr);
  check_norm_backward(op, grad_output, sum, nullptr, rstd);
  check_same_device(op, "grad_sum", grad_sum, "sum", sum);
  check_dtype(op, "grad_sum", grad_sum, sum.scalar_type());
  check_shape(op, "grad_sum", grad_sum, sum.sizes(), "it must match sum");
  NormGrads g = norm_backward(NormKind::kRMSNorm, grad_output, sum, nullptr, rstd, weight, zero_centered_gamma,
                              &grad_sum);
  return {g.input, g.weight};
}

// --- norm -> FP8 ---------------------------------------------------------------------------

namespace {

// The norm forward writing FP8 codes (scaled by `scale`) and their amax in the same pass;
// with return_output the high-precision output as well.
NormOutputs fp8_norm_forward(const char* op, NormKind kind, const at::Tensor& input, const at::Tensor& weight,
                             const at::Tensor* bias, const at::Tensor& scale, at::ScalarType fp8_dtype, double eps,
                             bool zero_centered_gamma, bool return_output) {
  check_norm_params(op, input, weight, bias);
  check_fp8_output(op, input, scale, fp8_dtype);
  check_eps(op, eps);
  ForwardFusions fusions;
  fusions.fp8_scale = &scale;
  fusions.fp8_dtype = fp8_dtype;
  fusions.keep_output = return_output;
  return norm_forward(kind, input, weight, bias, eps, zero_centered_gamma, fusions);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> layernorm_fp8_fwd_cpu(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& scale, at::ScalarType fp8_dtype, double eps, bool zero_centered_gamma, bool return_output) {
  const NormOutputs out = fp8_norm_forward("layernorm_fp8_fwd", NormKind::kLayerNorm, input, weight,
                                           bias.has_value() ? &*bias : nullptr, scale, fp8_dtype, eps,
                                           zero_centered_gamma, return_output);
  return {out.fp8_data, out.amax, out.mean, out.rstd, out.output};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rmsnorm_fp8_fwd_cpu(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& scale, at::ScalarType fp8_dtype, double eps,
    bool zero_centered_gamma, bool return_output) {
  const NormOutputs out = fp8_norm_forward("rmsnorm_fp8_fwd", NormKind::kRMSNorm, input, weight, nullptr, scale,
                                           fp8_dtype, eps, zero_centered_gamma, return_output);
  return {out.fp8_data, out.amax, out.rstd, out.output};
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("layernorm_fwd", &portable_te::layernorm_fwd_cpu);
  m.impl("layernorm_bwd", &portable_te::layernorm_bwd_cpu);
  m.impl("rmsnorm_fwd", &portable_te::rmsnorm_fwd_cpu);
  m.impl("rmsnorm_bwd", &portable_te::rmsnorm_bwd_cpu);
  m.impl("add_layernorm_fwd", &portable_te::add_layernorm_fwd_cpu);
  m.impl("add_layernorm_bwd", &portable_te::add_layernorm_bwd_cpu);
  m.impl("add_rmsnorm_fwd", &portable_te::add_rmsnorm_fwd_cpu);
  m.impl("add_rmsnorm_bwd", &portable_te::add_rmsnorm_bwd_cpu);
  m.impl("layernorm_fp8_fwd", &portable_te::layernorm_fp8_fwd_cpu);
  m.impl("rmsnorm_fp8_fwd", &portable_te::rmsnorm_fp8_fwd_cpu);
}

// --- autograd --------------------------------------------------------------------------------------
// Autograd kernels of the norm ops, for every device: each forward op runs its device kernel
// below autograd and records a C++ node whose backward calls the matching backward op. In C++
// because a Python autograd formula (torch.library.register_autograd) costs tens of microseconds
// a call, several times the kernel on the small inputs of decoding and small models. The ops'
// fake kernels stay in Python (custom_ops/norm.py), so opcheck and torch.compile trace through
// these nodes like ATen's.

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

// --- direct calls (direct_calls.h) -----------------------------------------------------------------

namespace portable_te {
namespace {

Tensor layernorm_direct(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias, double eps,
                        bool zero_centered_gamma) {
  static const auto op = find_op<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&,
                                                                     const std::optional<Tensor>&, double, bool)>(
      "portable_te::layernorm_fwd");
  return std::get<0>(op.call(input, weight, bias, eps, zero_centered_gamma));
}

Tensor rmsnorm_direct(const Tensor& input, const Tensor& weight, double eps, bool zero_centered_gamma) {
  static const auto op = find_op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, double, bool)>(
      "portable_te::rmsnorm_fwd");
  return std::get<0>(op.call(input, weight, eps, zero_centered_gamma));
}

const DirectCall norm_direct_calls([](pybind11::module_& direct) {
  direct.def("layernorm", &layernorm_direct, "portable_te::layernorm_fwd's output, called through the dispatcher");
  direct.def("rmsnorm", &rmsnorm_direct, "portable_te::rmsnorm_fwd's output, called through the dispatcher");
});

}  // namespace
}  // namespace portable_te
