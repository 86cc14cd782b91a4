// Autograd kernels of rope_fwd and rope_bwd (schemas in schemas.cpp), for every device. Each op
// is linear in its tensor input and the other is its transpose, so each one's backward is the
// other op on the gradient; under create_graph that call goes through the other's autograd
// kernel, which gives every order of derivative. In C++ for the reason norm_autograd.cpp
// gives; the fake kernels stay in Python (custom_ops/rope.py).
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "op_handles.h"

namespace portable_te {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// str as the CPU kernels take it (rope_ops.cpp): one C++ signature per op.
using RopeOp = Tensor(const Tensor&, const Tensor&, const std::string&, bool, const std::optional<Tensor>&,
                      const std::optional<Tensor>&);

constexpr char kRopeFwd[] = "portable_te::rope_fwd";
constexpr char kRopeBwd[] = "portable_te::rope_bwd";

// `kOwn` applied to input, differentiated by `kTranspose`. Only the input gets a gradient:
// freqs, the positions and cu_seqlens are data, not parameters (as in TE).
template <const char* kOwn, const char* kTranspose>
struct RopeFunction : torch::autograd::Function<RopeFunction<kOwn, kTranspose>> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& freqs,
                        const std::string& tensor_format, bool interleaved, const std::optional<Tensor>& cu_seqlens,
                        const std::optional<Tensor>& start_positions) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = find_op<RopeOp>(kOwn);
    Tensor output = op.call(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions);
    const auto defined = [](const std::optional<Tensor>& t) { return t.has_value() && t->defined(); };
    ctx->save_for_backward({freqs, defined(cu_seqlens) ? *cu_seqlens : Tensor(),
                            defined(start_positions) ? *start_positions : Tensor()});
    ctx->saved_data["tensor_format"] = tensor_format;
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["has_cu_seqlens"] = defined(cu_seqlens);
    ctx->saved_data["has_start_positions"] = defined(start_positions);
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto transpose = find_op<RopeOp>(kTranspose);
    const variable_list saved = ctx->get_saved_variables();  // freqs, cu_seqlens, start_positions
    const auto optional_saved = [&](size_t i, const char* flag) {
      return ctx->saved_data[flag].toBool() ? std::optional<Tensor>(saved[i]) : std::nullopt;
    };
    Tensor grad_input = call_backward_op(transpose, grads[0], saved[0], ctx->saved_data["tensor_format"].toStringRef(),
                                         ctx->saved_data["interleaved"].toBool(),
                                         optional_saved(1, "has_cu_seqlens"), optional_saved(2, "has_start_positions"));
    return {grad_input, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

template <const char* kOwn, const char* kTranspose>
Tensor rope_autograd(const Tensor& input, const Tensor& freqs, const std::string& tensor_format, bool interleaved,
                     const std::optional<Tensor>& cu_seqlens, const std::optional<Tensor>& start_positions) {
  return RopeFunction<kOwn, kTranspose>::apply(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions);
}

}  // namespace
}  // namespace portable_te

TORCH_LIBRARY_IMPL(portable_te, Autograd, m) {
  m.impl("rope_fwd", &portable_te::rope_autograd<portable_te::kRopeFwd, portable_te::kRopeBwd>);
  m.impl("rope_bwd", &portable_te::rope_autograd<portable_te::kRopeBwd, portable_te::kRopeFwd>);
}
