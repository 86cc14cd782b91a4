// The attention-softmax ops' binding: their schemas and CPU kernels (Tensor ->
// te_kernels::Softmax*Params, every argument checked first).
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten_thread_pool.h"
#include "te_kernels/softmax.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // Attention softmax over the last dim of input [b, h, sq, sk] (or [b*h, sq, sk]), fp32 math:
  // output = softmax(scale * input) with mask_type 'none', 'padding' (mask bool, broadcast as
  // [b or 1, h or 1, sq or 1, sk], True = masked out: the logit becomes -10000), 'causal' (keys
  // j > i dropped, sq == sk) or 'causal_bottom_right' (keys j > i + sk - sq dropped); dropped
  // keys give exactly 0. The backward takes the forward's output.
  m.def("scaled_softmax_fwd(Tensor input, Tensor? mask, float scale, str mask_type) -> Tensor");
  m.def(
      "scaled_softmax_bwd(Tensor grad_output, Tensor output, Tensor? mask, float scale, str mask_type)"
      " -> Tensor");
}

namespace portable_te {
namespace {

using te_kernels::SoftmaxMask;

SoftmaxMask mask_kind_of(const char* op, c10::string_view mask_type) {
  if (mask_type == "none") return SoftmaxMask::kNone;
  if (mask_type == "padding") return SoftmaxMask::kPadding;
  if (mask_type == "causal") return SoftmaxMask::kCausal;
  if (mask_type == "causal_bottom_right") return SoftmaxMask::kCausalBottomRight;
  TORCH_CHECK_VALUE(false, op, ": mask_type must be 'none', 'padding', 'causal' or 'causal_bottom_right', got '",
                    mask_type, "'");
}

// The mask's stride along dim, or 0 where it broadcasts (size 1 against a larger dim).
int64_t broadcast_stride(const at::Tensor& mask, int64_t dim) { return mask.size(dim) == 1 ? 0 : mask.stride(dim); }

// input [batch, heads, sq, sk] or [batch * heads, sq, sk] -> the kernel's shape; the
// padding mask (bool [batch or 1, heads or 1, sq or 1, sk], True = masked out) is checked
// and described by strides, so a broadcast mask is never materialised.
te_kernels::SoftmaxShape softmax_shape(const char* op, const char* arg, const at::Tensor& input,
                                       const at::Tensor* mask, double scale, c10::string_view mask_type) {
  te_kernels::SoftmaxShape s;
  s.mask_kind = mask_kind_of(op, mask_type);
  s.dtype = kernel_dtype(op, arg, input);
  TORCH_CHECK_VALUE(input.dim() == 3 || input.dim() == 4, op, ": ", arg,
                    " must be [batch, heads, sq, sk] or [batch * heads, sq, sk], got shape ", input.sizes());
  s.batch = input.size(0);
  s.heads = input.dim() == 4 ? input.size(1) : 1;
  s.sq = input.size(-2);
  s.sk = input.size(-1);
  s.scale = scale;
  if (s.mask_kind == SoftmaxMask::kCausal) {
    TORCH_CHECK_VALUE(s.sq == s.sk, op, ": the upper-triangular (causal) mask needs square scores (sq == sk), ",
                      "input has shape ", input.sizes(), "; use the bottom-right aligned causal mask for sq != sk");
  }
  if (s.mask_kind != SoftmaxMask::kPadding) {
    TORCH_CHECK_VALUE(mask == nullptr, op, ": mask_type '", mask_type, "' takes no mask tensor, got one of shape ",
                      mask->sizes());
    return s;
  }
  TORCH_CHECK_VALUE(mask != nullptr, op, ": mask_type 'padding' needs a mask tensor (bool, True = masked out)");
  check_same_device(op, "mask", *mask, arg, input);
  check_dtype(op, "mask", *mask, at::kBool);
  TORCH_CHECK_VALUE(input.dim() == 4, op, ": a masked softmax needs 4-D input [batch, heads, sq, sk], got shape ",
                    input.sizes());
  const bool fits = mask->dim() == 4 && mask->size(3) == s.sk && (mask->size(2) == 1 || mask->size(2) == s.sq) &&
                    (mask->size(1) == 1 || mask->size(1) == s.heads) && (mask->size(0) == 1 || mask->size(0) == s.batch);
  TORCH_CHECK_VALUE(fits, op, ": mask has shape ", mask->sizes(), " which does not broadcast to input's ",
                    input.sizes(), " as [batch or 1, heads or 1, sq or 1, sk]");
  return s;
}

// Points s at the mask's bytes; `mask` must have a unit last stride.
void attach_mask(te_kernels::SoftmaxShape& s, const at::Tensor& mask) {
  s.mask = static_cast<const uint8_t*>(mask.const_data_ptr());
  s.mask_batch_stride = broadcast_stride(mask, 0);
  s.mask_head_stride = broadcast_stride(mask, 1);
  s.mask_row_stride = broadcast_stride(mask, 2);
}

at::Tensor unit_last_stride(const at::Tensor& mask) { return mask.stride(-1) == 1 ? mask : mask.contiguous(); }

}  // namespace

at::Tensor scaled_softmax_fwd_cpu(const at::Tensor& input_arg, const std::optional<at::Tensor>& mask_arg,
                                  double scale, c10::string_view mask_type) {
  const char* op = "scaled_softmax_fwd";
  te_kernels::SoftmaxShape shape =
      softmax_shape(op, "input", input_arg, mask_arg.has_value() ? &*mask_arg : nullptr, scale, mask_type);
  const at::Tensor input = input_arg.contiguous();  // a non-contiguous view is copied once
  at::Tensor output = at::empty_like(input);
  if (input.numel() == 0) return output;
  at::Tensor mask;
  if (mask_arg.has_value()) {
    mask = unit_last_stride(*mask_arg);
    attach_mask(shape, mask);
  }
  te_kernels::SoftmaxFwdParams p;
  p.shape = shape;
  p.x = input.const_data_ptr();
  p.y = output.mutable_data_ptr();
  const AtenThreadPool pool;
  te_kernels::softmax_fwd_plan(p, pool);
  const c10::DataPtr scratch = workspace(te_kernels::softmax_fwd_workspace_bytes(p));
  p.workspace = scratch.get();
  te_kernels::softmax_fwd(p, pool);
  return output;
}

at::Tensor scaled_softmax_bwd_cpu(const at::Tensor& grad_output_arg, const at::Tensor& output_arg,
                                  const std::optional<at::Tensor>& mask_arg, double scale, c10::string_view mask_type) {
  const char* op = "scaled_softmax_bwd";
  te_kernels::SoftmaxShape shape =
      softmax_shape(op, "output", output_arg, mask_arg.has_value() ? &*mask_arg : nullptr, scale, mask_type);
  check_same_device(op, "grad_output", grad_output_arg, "output", output_arg);
  check_dtype(op, "grad_output", grad_output_arg, output_arg.scalar_type());
  check_shape(op, "grad_output", grad_output_arg, output_arg.sizes(), "it must match output");
  const at::Tensor grad_output = grad_output_arg.contiguous();
  const at::Tensor output = output_arg.contiguous();
  at::Tensor grad_input = at::empty_like(output);
  if (output.numel() == 0) return grad_input;
  at::Tensor mask;
  if (mask_arg.has_value()) {
    mask = unit_last_stride(*mask_arg);
    attach_mask(shape, mask);
  }
  te_kernels::SoftmaxBwdParams p;
  p.shape = shape;
  p.dy = grad_output.const_data_ptr();
  p.y = output.const_data_ptr();
  p.dx = grad_input.mutable_data_ptr();
  te_kernels::softmax_bwd(p, AtenThreadPool());
  return grad_input;
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("scaled_softmax_fwd", &portable_te::scaled_softmax_fwd_cpu);
  m.impl("scaled_softmax_bwd", &portable_te::scaled_softmax_bwd_cpu);
}
