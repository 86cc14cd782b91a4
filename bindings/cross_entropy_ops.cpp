// The cross-entropy ops' binding: their schemas and CPU kernels (Tensor ->
// te_kernels::CrossEntropy*Params, every argument checked first).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten_thread_pool.h"
#include "te_kernels/cross_entropy.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // Cross-entropy of logits [N, V] against target [N] (int64): loss [N] float32 (float64 for
  // float64 logits; 0 where target == ignore_index) and, when compute_grad, grad [N, V] in
  // logits' dtype = grad_scale * d loss[n] / d logits[n] (else [0, V]); grad_scale [] or
  // [N] (a factor per row) in loss's dtype, 1 when None. The backward scales grad's rows by
  // grad_loss [N].
  m.def(
      "cross_entropy_fwd(Tensor logits, Tensor target, float label_smoothing, int ignore_index, bool compute_grad,"
      " Tensor? grad_scale=None) -> (Tensor loss, Tensor grad)");
  m.def("cross_entropy_bwd(Tensor grad, Tensor grad_loss) -> Tensor");
}

namespace portable_te {

std::tuple<at::Tensor, at::Tensor> cross_entropy_fwd_cpu(const at::Tensor& logits_arg, const at::Tensor& target_arg,
                                                         double label_smoothing, int64_t ignore_index,
                                                         bool compute_grad,
                                                         const std::optional<at::Tensor>& grad_scale) {
  const char* op = "cross_entropy_fwd";
  const te_kernels::DType dtype = kernel_dtype(op, "logits", logits_arg);
  TORCH_CHECK_VALUE(logits_arg.dim() == 2, op, ": logits must be [tokens, vocab], got shape ", logits_arg.sizes());
  const int64_t rows = logits_arg.size(0), vocab = logits_arg.size(1);
  TORCH_CHECK_VALUE(vocab > 0, op, ": logits must have at least one class, got shape ", logits_arg.sizes());
  check_same_device(op, "target", target_arg, "logits", logits_arg);
  check_dtype(op, "target", target_arg, at::kLong);
  check_shape(op, "target", target_arg, {rows}, "one class index per row of logits");
  TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
                    ": label_smoothing must be in [0, 1], got ", label_smoothing);
  if (grad_scale.has_value()) {
    check_same_device(op, "grad_scale", *grad_scale, "logits", logits_arg);
    check_dtype(op, "grad_scale", *grad_scale, stats_dtype(logits_arg.scalar_type()));
    if (grad_scale->dim() != 0) check_shape(op, "grad_scale", *grad_scale, {rows}, "one factor per row, or [] for all");
  }
  const at::Tensor logits = logits_arg.contiguous();  // a non-contiguous view is copied once
  const at::Tensor target = target_arg.contiguous();
  const int64_t* target_data = target.const_data_ptr<int64_t>();
  const int64_t bad = te_kernels::cross_entropy_first_bad_target(target_data, rows, vocab, ignore_index);
  TORCH_CHECK_VALUE(bad < 0, op, ": target[", bad, "] = ", bad < 0 ? 0 : target_data[bad],
                    " is out of range for ", vocab, " classes (valid: 0..", vocab - 1,
                    ", or ignore_index = ", ignore_index, ")");

  at::Tensor loss = at::empty({rows}, logits.options().dtype(stats_dtype(logits.scalar_type())));
  at::Tensor grad = compute_grad ? at::empty_like(logits) : at::empty({0, vocab}, logits.options());
  te_kernels::CrossEntropyFwdParams p;
  p.rows = rows;
  p.vocab = vocab;
  p.dtype = dtype;
  p.logits = logits.const_data_ptr();
  p.target = target_data;
  p.ignore_index = ignore_index;
  p.label_smoothing = label_smoothing;
  p.loss = loss.mutable_data_ptr();
  p.grad = compute_grad ? grad.mutable_data_ptr() : nullptr;
  const at::Tensor row_scales = grad_scale.has_value() && grad_scale->dim() == 1 ? grad_scale->contiguous() : at::Tensor();
  if (row_scales.defined()) p.grad_scale_rows = row_scales.const_data_ptr();
  else if (grad_scale.has_value()) p.grad_scale = grad_scale->item<double>();
  const AtenThreadPool pool;
  te_kernels::cross_entropy_fwd_plan(p, pool);
  const c10::DataPtr scratch = workspace(te_kernels::cross_entropy_fwd_workspace_bytes(p));
  p.workspace = scratch.get();
  te_kernels::cross_entropy_fwd(p, pool);
  return {loss, grad};
}

at::Tensor cross_entropy_bwd_cpu(const at::Tensor& grad_arg, const at::Tensor& grad_loss_arg) {
  const char* op = "cross_entropy_bwd";
  const te_kernels::DType dtype = kernel_dtype(op, "grad", grad_arg);
  TORCH_CHECK_VALUE(grad_arg.dim() == 2, op, ": grad must be [tokens, vocab], got shape ", grad_arg.sizes());
  check_same_device(op, "grad_loss", grad_loss_arg, "grad", grad_arg);
  check_dtype(op, "grad_loss", grad_loss_arg, stats_dtype(grad_arg.scalar_type()));
  check_shape(op, "grad_loss", grad_loss_arg, {grad_arg.size(0)}, "one loss gradient per row of grad");
  const at::Tensor grad = grad_arg.contiguous();
  const at::Tensor grad_loss = grad_loss_arg.contiguous();  // often an expanded scalar (mean, sum)
  at::Tensor grad_logits = at::empty_like(grad);
  te_kernels::CrossEntropyBwdParams p;
  p.rows = grad.size(0);
  p.vocab = grad.size(1);
  p.dtype = dtype;
  p.grad = grad.const_data_ptr();
  p.grad_loss = grad_loss.const_data_ptr();
  p.grad_logits = grad_logits.mutable_data_ptr();
  te_kernels::cross_entropy_bwd(p, AtenThreadPool());
  return grad_logits;
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("cross_entropy_fwd", &portable_te::cross_entropy_fwd_cpu);
  m.impl("cross_entropy_bwd", &portable_te::cross_entropy_bwd_cpu);
}
