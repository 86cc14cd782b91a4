// Direct calls of the hottest ops from Python: the same dispatcher call as torch.ops makes
// (every device's kernel, the C++ autograd of norm_autograd.cpp, activation_autograd.cpp and
// rope_autograd.cpp, Python dispatch modes), without its generic boxing of the arguments against
// the schema, which costs about 5 us a call: on the small inputs of decoding more than the
// kernel. custom_ops/norm.py, activation.py and rope.py take them only where torch.ops would add
// nothing (not while torch.compile traces, no __torch_function__ override).
#include <torch/extension.h>

#include <optional>
#include <string>
#include <tuple>

#include "op_handles.h"

namespace portable_te {
namespace {

using at::Tensor;

Tensor layernorm(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias, double eps,
                 bool zero_centered_gamma) {
  static const auto op = find_op<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&,
                                                                     const std::optional<Tensor>&, double, bool)>(
      "portable_te::layernorm_fwd");
  return std::get<0>(op.call(input, weight, bias, eps, zero_centered_gamma));
}

Tensor rmsnorm(const Tensor& input, const Tensor& weight, double eps, bool zero_centered_gamma) {
  static const auto op = find_op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, double, bool)>(
      "portable_te::rmsnorm_fwd");
  return std::get<0>(op.call(input, weight, eps, zero_centered_gamma));
}

Tensor activation(const Tensor& input, const std::optional<Tensor>& bias, const std::string& activation, double limit,
                  double alpha) {
  static const auto op = find_op<Tensor(const Tensor&, const std::optional<Tensor>&, const std::string&, double, double)>(
      "portable_te::activation_fwd");
  return op.call(input, bias, activation, limit, alpha);
}

Tensor rope(const Tensor& input, const Tensor& freqs, const std::string& tensor_format, bool interleaved,
            const std::optional<Tensor>& cu_seqlens, const std::optional<Tensor>& start_positions) {
  static const auto op = find_op<Tensor(const Tensor&, const Tensor&, const std::string&, bool,
                                        const std::optional<Tensor>&, const std::optional<Tensor>&)>(
      "portable_te::rope_fwd");
  return op.call(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions);
}

}  // namespace

void register_direct_calls(pybind11::module_& m) {
  m.def("layernorm", &layernorm, "portable_te::layernorm_fwd's output, called through the dispatcher");
  m.def("rmsnorm", &rmsnorm, "portable_te::rmsnorm_fwd's output, called through the dispatcher");
  m.def("activation", &activation, "portable_te::activation_fwd, called through the dispatcher");
  m.def("rope", &rope, "portable_te::rope_fwd, called through the dispatcher");
}

}  // namespace portable_te
