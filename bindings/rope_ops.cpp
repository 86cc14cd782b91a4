// The RoPE ops' binding: their schemas; their CPU kernels (Tensor -> te_kernels::RopeParams,
// every argument checked first; the checks read cu_seqlens and start_positions, which live on
// the CPU like the tensor itself); their autograd kernels, for every device; rope_fwd's direct
// call.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "aten_thread_pool.h"
#include "direct_calls.h"
#include "op_handles.h"
#include "te_kernels/rope.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // RoPE of input [s, b, h, d] ('sbhd'), [b, s, h, d] ('bshd') or [t, h, d] ('thd', packed
  // sequences split by cu_seqlens [b + 1]); freqs [max_seq_len, 1, 1, d2] float32 angles, d2
  // even and <= d; start_positions [b] offsets the positions. rope_bwd applies the transpose.
  m.def(
      "rope_fwd(Tensor input, Tensor freqs, str tensor_format, bool interleaved, Tensor? cu_seqlens,"
      " Tensor? start_positions) -> Tensor");
  m.def(
      "rope_bwd(Tensor grad_output, Tensor freqs, str tensor_format, bool interleaved, Tensor? cu_seqlens,"
      " Tensor? start_positions) -> Tensor");
}

namespace portable_te {
namespace {

using te_kernels::RopeFormat;

RopeFormat parse_format(const char* op, const std::string& format) {
  if (format == "sbhd") return RopeFormat::kSbhd;
  if (format == "bshd") return RopeFormat::kBshd;
  if (format == "thd") return RopeFormat::kThd;
  TORCH_CHECK_VALUE(false, op, ": tensor_format must be 'sbhd', 'bshd' or 'thd', got '", format, "'");
}

// An integer index tensor (cu_seqlens, start_positions) as contiguous int64 [n].
at::Tensor index_vector(const char* op, const char* arg, const at::Tensor& t, const char* input_name,
                        const at::Tensor& input) {
  check_same_device(op, arg, t, input_name, input);
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", arg,
                    " must be int32 or int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1, op, ": ", arg, " must be 1-D, got shape ", t.sizes());
  return t.to(at::kLong).contiguous();
}

// Element strides between x's tokens and between its heads, where each head's channels are
// contiguous, the rows of heads do not overlap, and the tokens are evenly spaced: thd's
// [t, h, d], or [s, b, h, d] / [b, s, h, d] whose two leading dimensions flatten into the one
// token index n = i0 * size(1) + i1. Else nullopt (the input is then copied).
struct TokenStrides {
  int64_t token, head;
};

std::optional<TokenStrides> token_strides(const at::Tensor& t) {
  if (t.dim() < 3 || (t.size(-1) > 1 && t.stride(-1) != 1)) return std::nullopt;
  const int64_t heads = t.size(-2), head_dim = t.size(-1);
  const int64_t head = heads > 1 ? t.stride(-2) : head_dim;
  std::optional<int64_t> token;
  if (t.dim() == 3 || t.size(1) == 1) token = t.stride(0);
  else if (t.size(0) == 1 || t.stride(0) == t.size(1) * t.stride(1)) token = t.stride(1);
  if (!token.has_value() || head < head_dim || *token < heads * head) return std::nullopt;
  return TokenStrides{*token, head};
}

at::Tensor rope_cpu(const char* op, bool backward, const char* input_name, const at::Tensor& input_arg, const at::Tensor& freqs_arg,
                    const std::string& tensor_format, bool interleaved, const std::optional<at::Tensor>& cu_seqlens_arg,
                    const std::optional<at::Tensor>& start_positions_arg) {
  te_kernels::RopeParams p;
  p.format = parse_format(op, tensor_format);
  p.interleaved = interleaved;
  p.backward = backward;
  p.dtype = kernel_dtype(op, input_name, input_arg);
  TORCH_CHECK_VALUE(p.dtype != te_kernels::DType::kFloat64, op, ": ", input_name,
                    " must be float32, bfloat16 or float16, got float64 (the plain-PyTorch path, "
                    "fused=False, handles float64)");
  const bool thd = p.format == RopeFormat::kThd;
  const int64_t want_dim = thd ? 3 : 4;
  TORCH_CHECK_VALUE(input_arg.dim() == want_dim, op, ": ", input_name, " in '", tensor_format, "' format must be ", want_dim,
                    "-D, got shape ", input_arg.sizes());
  check_same_device(op, "freqs", freqs_arg, input_name, input_arg);
  check_dtype(op, "freqs", freqs_arg, at::kFloat);
  TORCH_CHECK_VALUE(freqs_arg.dim() == 4 && freqs_arg.size(1) == 1 && freqs_arg.size(2) == 1, op,
                    ": freqs must have shape [max_seq_len, 1, 1, rotary_dim], got ", freqs_arg.sizes());
  p.heads = input_arg.size(-2);
  p.head_dim = input_arg.size(-1);
  p.rotary_dim = freqs_arg.size(3);
  TORCH_CHECK_VALUE(p.rotary_dim > 0 && p.rotary_dim % 2 == 0, op, ": the rotary dim (freqs' last, shape ",
                    freqs_arg.sizes(), ") must be even and positive");
  TORCH_CHECK_VALUE(p.rotary_dim <= p.head_dim, op, ": the rotary dim ", p.rotary_dim, " (freqs shape ",
                    freqs_arg.sizes(), ") exceeds the head dim of ", input_name, " ", input_arg.sizes());

  at::Tensor cu_seqlens;
  if (thd) {
    TORCH_CHECK_VALUE(cu_seqlens_arg.has_value(), op, ": the 'thd' format needs cu_seqlens");
    cu_seqlens = index_vector(op, "cu_seqlens", *cu_seqlens_arg, input_name, input_arg);
    const int64_t entries = cu_seqlens.size(0);
    TORCH_CHECK_VALUE(entries >= 1, op, ": cu_seqlens needs at least one entry (0), got shape ", cu_seqlens.sizes());
    const int64_t* cu = cu_seqlens.const_data_ptr<int64_t>();
    TORCH_CHECK_VALUE(cu[0] == 0, op, ": cu_seqlens must start at 0, got ", cu[0]);
    for (int64_t b = 1; b < entries; ++b) {
      TORCH_CHECK_VALUE(cu[b] >= cu[b - 1], op, ": cu_seqlens must be non-decreasing, but cu_seqlens[", b, "] = ",
                        cu[b], " < cu_seqlens[", b - 1, "] = ", cu[b - 1]);
    }
    TORCH_CHECK_VALUE(cu[entries - 1] == input_arg.size(0), op, ": cu_seqlens ends at ", cu[entries - 1],
                      " but ", input_name, " has ", input_arg.size(0), " tokens (shape ", input_arg.sizes(), ")");
    p.seq_len = input_arg.size(0);
    p.batch = entries - 1;
    p.cu_seqlens = cu;
  } else {
    TORCH_CHECK_VALUE(!cu_seqlens_arg.has_value(), op, ": cu_seqlens is only meaningful for the 'thd' format, got '",
                      tensor_format, "'");
    const bool sbhd = p.format == RopeFormat::kSbhd;
    p.seq_len = input_arg.size(sbhd ? 0 : 1);
    p.batch = input_arg.size(sbhd ? 1 : 0);
  }

  at::Tensor start_positions;
  if (start_positions_arg.has_value()) {
    start_positions = index_vector(op, "start_positions", *start_positions_arg, input_name, input_arg);
    TORCH_CHECK_VALUE(start_positions.size(0) == p.batch, op, ": start_positions has shape ", start_positions.sizes(),
                      " but there are ", p.batch, " sequences");
    const int64_t* start = start_positions.const_data_ptr<int64_t>();
    for (int64_t b = 0; b < p.batch; ++b) {
      TORCH_CHECK_VALUE(start[b] >= 0, op, ": start_positions[", b, "] = ", start[b], " is negative");
    }
    p.start_positions = start;
  }

  p.freqs_rows = freqs_arg.size(0);
  p.table_rows = te_kernels::rope_table_rows(p);
  TORCH_CHECK_VALUE(p.table_rows <= p.freqs_rows, op, ": freqs (shape ", freqs_arg.sizes(), ") covers ", p.freqs_rows,
                    " positions but the tokens of ", input_name, " (shape ", input_arg.sizes(), ") need ", p.table_rows,
                    " (sequence lengths plus start_positions)");

  const std::optional<TokenStrides> strides = token_strides(input_arg);
  // Read where it lies when its tokens are evenly spaced (q or k split off a fused QKV
  // projection), else copied once.
  const at::Tensor input = strides.has_value() ? input_arg : input_arg.contiguous();
  if (strides.has_value()) {  // a contiguous input's are the packed ones
    p.x_token_stride = strides->token;
    p.x_head_stride = strides->head;
  }
  const at::Tensor freqs = freqs_arg.contiguous();
  at::Tensor output = at::empty(input.sizes(), input.options());
  p.x = input.const_data_ptr();
  p.y = output.mutable_data_ptr();
  p.freqs = freqs.const_data_ptr<float>();
  const c10::DataPtr table = workspace(te_kernels::rope_workspace_bytes(p));
  p.workspace = table.get();
  te_kernels::rope(p, AtenThreadPool());
  return output;
}

}  // namespace

at::Tensor rope_fwd_cpu(const at::Tensor& input, const at::Tensor& freqs, const std::string& tensor_format,
                        bool interleaved, const std::optional<at::Tensor>& cu_seqlens,
                        const std::optional<at::Tensor>& start_positions) {
  return rope_cpu("rope_fwd", false, "input", input, freqs, tensor_format, interleaved, cu_seqlens, start_positions);
}

at::Tensor rope_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& freqs, const std::string& tensor_format,
                        bool interleaved, const std::optional<at::Tensor>& cu_seqlens,
                        const std::optional<at::Tensor>& start_positions) {
  return rope_cpu("rope_bwd", true, "grad_output", grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions);
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("rope_fwd", &portable_te::rope_fwd_cpu);
  m.impl("rope_bwd", &portable_te::rope_bwd_cpu);
}

// --- autograd --------------------------------------------------------------------------------------
// Autograd kernels of rope_fwd and rope_bwd, for every device. Each op is linear in its tensor
// input and the other is its transpose, so each one's backward is the other op on the gradient;
// under create_graph that call goes through the other's autograd kernel, which gives every order
// of derivative. In C++ for the reason norm_ops.cpp gives; the fake kernels stay in Python
// (custom_ops/rope.py).

namespace portable_te {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// str as the CPU kernels above take it: one C++ signature per op.
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

// --- direct call (direct_calls.h) ------------------------------------------------------------------

namespace portable_te {
namespace {

Tensor rope_direct(const Tensor& input, const Tensor& freqs, const std::string& tensor_format, bool interleaved,
                   const std::optional<Tensor>& cu_seqlens, const std::optional<Tensor>& start_positions) {
  static const auto op = find_op<RopeOp>("portable_te::rope_fwd");
  return op.call(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions);
}

const DirectCall rope_direct_call([](pybind11::module_& direct) {
  direct.def("rope", &rope_direct, "portable_te::rope_fwd, called through the dispatcher");
});

}  // namespace
}  // namespace portable_te
