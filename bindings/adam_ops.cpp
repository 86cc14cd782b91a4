// The Adam op's binding: its schema and CPU kernel (tensor lists -> te_kernels::AdamStepParams,
// every tensor checked first).
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <vector>

#include "aten_thread_pool.h"
#include "te_kernels/adam.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // One Adam/AdamW step over all tensors of a param group, in place; master_params is empty
  // or holds a float32 master per param (then params receive the rounded master).
  m.def(
      "multi_tensor_adam(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs,"
      " Tensor(d!)[] master_params, float lr, float beta1, float beta2, float eps, int step, bool bias_correction,"
      " float weight_decay, bool adam_w_mode, float inv_grad_scale) -> ()");
}

namespace portable_te {
namespace {

constexpr const char* kOp = "multi_tensor_adam";

// A state or master tensor: float32, contiguous (updated in place), one value per param element.
float* state_buffer(const char* list, size_t k, const at::Tensor& t, const at::Tensor& param) {
  const std::string arg = std::string(list) + "[" + std::to_string(k) + "]";
  check_same_device(kOp, arg.c_str(), t, "its param", param);
  check_dtype(kOp, arg.c_str(), t, at::kFloat);
  TORCH_CHECK_VALUE(t.numel() == param.numel(), kOp, ": ", arg, " has shape ", t.sizes(), " but its param has shape ",
                    param.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), kOp, ": ", arg, " must be contiguous (it is updated in place)");
  return t.mutable_data_ptr<float>();
}

}  // namespace

void multi_tensor_adam_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                           at::TensorList exp_avg_sqs, at::TensorList master_params, double lr, double beta1,
                           double beta2, double eps, int64_t step, bool bias_correction, double weight_decay,
                           bool adam_w_mode, double inv_grad_scale) {
  const size_t n = params.size();
  TORCH_CHECK_VALUE(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n, kOp,
                    ": params, grads, exp_avgs and exp_avg_sqs must have one entry per param, got ", n, ", ",
                    grads.size(), ", ", exp_avgs.size(), " and ", exp_avg_sqs.size());
  TORCH_CHECK_VALUE(master_params.empty() || master_params.size() == n, kOp,
                    ": master_params must be empty or have one entry per param, got ", master_params.size(), " for ",
                    n, " params");
  TORCH_CHECK_VALUE(step >= 1, kOp, ": step counts from 1, got ", step);
  TORCH_CHECK_VALUE(0 <= beta1 && beta1 < 1 && 0 <= beta2 && beta2 < 1, kOp, ": betas must be in [0, 1), got (",
                    beta1, ", ", beta2, ")");

  std::vector<at::Tensor> contiguous_grads(n);  // keeps copies of non-contiguous grads alive
  std::vector<te_kernels::AdamTensor> tensors(n);
  for (size_t k = 0; k < n; ++k) {
    const at::Tensor& param = params[k];
    const std::string name = "params[" + std::to_string(k) + "]", grad_name = "grads[" + std::to_string(k) + "]";
    te_kernels::AdamTensor& t = tensors[k];
    t.param_dtype = kernel_dtype(kOp, name.c_str(), param);
    TORCH_CHECK_VALUE(t.param_dtype != te_kernels::DType::kFloat64, kOp, ": ", name,
                      " is float64; float32, bfloat16 and float16 params are supported");
    TORCH_CHECK_VALUE(param.is_contiguous(), kOp, ": ", name, " (shape ", param.sizes(), ") must be contiguous");
    const at::Tensor& grad = grads[k];
    check_same_device(kOp, grad_name.c_str(), grad, name.c_str(), param);
    t.grad_dtype = kernel_dtype(kOp, grad_name.c_str(), grad);
    TORCH_CHECK_VALUE(t.grad_dtype != te_kernels::DType::kFloat64, kOp, ": ", grad_name, " is float64");
    TORCH_CHECK_VALUE(grad.sizes() == param.sizes(), kOp, ": ", grad_name, " has shape ", grad.sizes(), " but ", name,
                      " has shape ", param.sizes());
    contiguous_grads[k] = grad.contiguous();
    t.numel = param.numel();
    t.param = param.mutable_data_ptr();
    t.grad = contiguous_grads[k].const_data_ptr();
    t.exp_avg = state_buffer("exp_avgs", k, exp_avgs[k], param);
    t.exp_avg_sq = state_buffer("exp_avg_sqs", k, exp_avg_sqs[k], param);
    if (!master_params.empty()) t.master = state_buffer("master_params", k, master_params[k], param);
  }

  te_kernels::AdamStepParams p;
  p.tensors = tensors.data();
  p.num_tensors = int64_t(n);
  p.lr = float(lr);
  p.beta1 = float(beta1);
  p.beta2 = float(beta2);
  p.eps = float(eps);
  p.weight_decay = float(weight_decay);
  p.adam_w_mode = adam_w_mode;
  // In double, as torch.optim computes them in Python floats, then rounded once.
  const double bias_correction1 = bias_correction ? 1 - std::pow(beta1, double(step)) : 1.0;
  const double bias_correction2 = bias_correction ? 1 - std::pow(beta2, double(step)) : 1.0;
  p.step_size = float(lr / bias_correction1);
  p.bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  p.inv_grad_scale = float(inv_grad_scale);
  te_kernels::adam_step(p, AtenThreadPool());
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("multi_tensor_adam", &portable_te::multi_tensor_adam_cpu);
}
