// DelayedScaling's update as an op: the schema and CPU kernel (te_kernels::delayed_scaling_update
// over each state's tensors, every argument checked first). One call updates every FP8 state an
// autocast region used, where a Python update costs some thirty small ops per state.
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>

#include "te_kernels/delayed_scaling.h"
#include "tensor_checks.h"

TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // For each state i: amax_histories[i] [len_i, n_i], scales[i], scale_invs[i] [n_i] float32 and
  // recorded[i] [n_i] bool, updated in place (te_kernels/delayed_scaling.h); amax_compute_algo
  // "max" or "most_recent"; the scale is divided by 2**margin.
  m.def(
      "delayed_scaling_update_(Tensor(a!)[] amax_histories, Tensor(b!)[] scales, Tensor(c!)[] scale_invs,"
      " Tensor(d!)[] recorded, str amax_compute_algo, float fp8_max, float margin) -> ()");
}

namespace portable_te {
namespace {

// The names in messages are built only when a check fails (the op runs on every step).
void check_state(const char* op, size_t i, const at::Tensor& history, const at::Tensor& scale,
                 const at::Tensor& scale_inv, const at::Tensor& recorded) {
  TORCH_CHECK_VALUE(history.scalar_type() == at::kFloat && history.dim() == 2 && history.size(0) >= 1, op,
                    ": amax_histories[", i, "] must be a float32 [history_len >= 1, slots] tensor, got ",
                    history.scalar_type(), " of shape ", history.sizes());
  const int64_t slots = history.size(1);
  const char* names[] = {"amax_histories", "scales", "scale_invs", "recorded"};
  const at::Tensor* tensors[] = {&history, &scale, &scale_inv, &recorded};
  for (int k = 1; k < 4; ++k) {
    const at::Tensor& t = *tensors[k];
    const at::ScalarType dtype = k == 3 ? at::kBool : at::kFloat;
    TORCH_CHECK_VALUE(t.scalar_type() == dtype && t.dim() == 1 && t.size(0) == slots, op, ": ", names[k], "[", i,
                      "] must be a ", dtype, " tensor of shape [", slots, "] (the history's slots), got ",
                      t.scalar_type(), " of shape ", t.sizes());
  }
  for (int k = 0; k < 4; ++k) {
    const at::Tensor& t = *tensors[k];
    TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", names[k], "[", i, "] must be contiguous (it is updated in place)");
    TORCH_CHECK_VALUE(t.device() == history.device(), op, ": ", names[k], "[", i, "] is on ", t.device(),
                      " but amax_histories[", i, "] is on ", history.device());
  }
}

void delayed_scaling_update_cpu(at::TensorList amax_histories, at::TensorList scales, at::TensorList scale_invs,
                                at::TensorList recorded, c10::string_view amax_compute_algo, double fp8_max,
                                double margin) {
  const char* op = "delayed_scaling_update_";
  const size_t count = amax_histories.size();
  TORCH_CHECK_VALUE(scales.size() == count && scale_invs.size() == count && recorded.size() == count, op,
                    ": amax_histories, scales, scale_invs and recorded must hold one tensor per state, got ", count,
                    ", ", scales.size(), ", ", scale_invs.size(), " and ", recorded.size());
  TORCH_CHECK_VALUE(amax_compute_algo == "max" || amax_compute_algo == "most_recent", op,
                    ": amax_compute_algo must be 'max' or 'most_recent', got '", std::string(amax_compute_algo), "'");
  TORCH_CHECK_VALUE(margin >= 0.0, op, ": margin must be >= 0, got ", margin);
  for (size_t i = 0; i < count; ++i) check_state(op, i, amax_histories[i], scales[i], scale_invs[i], recorded[i]);
  te_kernels::DelayedScalingUpdateParams p;
  p.algo = amax_compute_algo == "max" ? te_kernels::AmaxAlgo::kMax : te_kernels::AmaxAlgo::kMostRecent;
  p.fp8_max = float(fp8_max);
  p.margin_divisor = float(std::pow(2.0, margin));  // Python's 2.0 ** margin, then the fp32 operand
  for (size_t i = 0; i < count; ++i) {
    p.history_len = amax_histories[i].size(0);
    p.slots = amax_histories[i].size(1);
    p.history = amax_histories[i].mutable_data_ptr<float>();
    p.scale = scales[i].mutable_data_ptr<float>();
    p.scale_inv = scale_invs[i].mutable_data_ptr<float>();
    p.recorded = recorded[i].mutable_data_ptr<bool>();
    te_kernels::delayed_scaling_update(p);
  }
}

}  // namespace
}  // namespace portable_te

TORCH_LIBRARY_IMPL(portable_te, CPU, m) { m.impl("delayed_scaling_update_", &portable_te::delayed_scaling_update_cpu); }
