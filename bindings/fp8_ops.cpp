// The per-tensor FP8 ops' binding: their schemas and CPU kernels (Tensor -> te_kernels::Fp8*Params,
// every argument checked first).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "aten_thread_pool.h"
#include "te_kernels/fp8.h"
#include "te_kernels/fp8_block.h"
#include "te_kernels/nvfp4.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // data has input's shape in fp8_dtype (float8_e4m3fn or float8_e5m2); scale and scale_inv are
  // float32 tensors of one element; amax is a float32 scalar tensor.
  // data = saturate(input * scale) in FP8, amax = max |input| (NaN if input has a NaN).
  m.def("fp8_quantize(Tensor input, Tensor scale, ScalarType fp8_dtype) -> (Tensor data, Tensor amax)");
  // The same for input [..., N] viewed as [M, N], plus data_t [N, M]: the transposed codes,
  // written in the same pass (the weight-gradient GEMM needs both layouts).
  m.def(
      "fp8_quantize_transpose(Tensor input, Tensor scale, ScalarType fp8_dtype)"
      " -> (Tensor data, Tensor data_t, Tensor amax)");
  // Current scaling's cast in one call: amax = max |input| (NaN elements skipped, inf counted),
  // scale = fp8_max / max(amax, amax_epsilon) (1 for an amax of 0, inf or NaN, FLT_MAX where it
  // overflows, rounded down to a power of two with power_2), data = saturate(input * scale);
  // scale, scale_inv = 1 / scale and amax are float32 [1] (TE_API.md section 4).
  m.def(
      "fp8_quantize_current(Tensor input, ScalarType fp8_dtype, float amax_epsilon, bool power_2)"
      " -> (Tensor data, Tensor scale, Tensor scale_inv, Tensor amax)");
  // DelayedScaling's cast of one slot of a module's FP8 state: data = saturate(input * scales[slot])
  // and scale_inv = 1 / scales[slot] ([1] float32), while the input's amax (NaN elements skipped)
  // is max-accumulated into amax_history[0, slot] (a NaN there stays) and amax_recorded[slot] is
  // set: the cast and its record in one call (scales [slots], amax_history [len, slots] float32,
  // amax_recorded [slots] bool: fp8/state.py's ScalingGroup).
  m.def(
      "fp8_quantize_delayed_(Tensor input, Tensor scales, int slot, Tensor(a!) amax_history,"
      " Tensor(b!) amax_recorded, ScalarType fp8_dtype) -> (Tensor data, Tensor scale_inv)");
  // output = data * scale_inv in out_dtype.
  m.def("fp8_dequantize(Tensor data, Tensor scale_inv, ScalarType out_dtype) -> Tensor");
  // data_t [cols, rows] = the transpose of FP8 codes data [rows, cols], contiguous.
  m.def("fp8_transpose(Tensor data) -> Tensor");
}

namespace portable_te {
namespace {

void check_scale(const char* op, const char* arg, const at::Tensor& scale, const at::Tensor& data) {
  check_same_device(op, arg, scale, "the data", data);
  check_dtype(op, arg, scale, at::kFloat);
  TORCH_CHECK_VALUE(scale.numel() == 1, op, ": ", arg, " must hold one element (per-tensor scaling), got shape ",
                    scale.sizes());
}

// Shared by both quantize ops; with_transpose views input as [M, N] and adds data_t [N, M].
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize(const char* op, const at::Tensor& input_arg,
                                                        const at::Tensor& scale, at::ScalarType fp8_dtype,
                                                        bool with_transpose) {
  const te_kernels::Fp8Format format = fp8_format(op, "fp8_dtype", fp8_dtype);
  const te_kernels::DType in_dtype = high_precision_dtype(op, "input", input_arg.scalar_type());
  check_scale(op, "scale", scale, input_arg);
  if (with_transpose) {
    TORCH_CHECK_VALUE(input_arg.dim() >= 1, op, ": input must have at least one dimension, got a 0-d tensor");
  }
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor scale_value = scale.contiguous();
  at::Tensor data = at::empty(input.sizes(), input.options().dtype(fp8_dtype));
  at::Tensor amax = at::empty({}, input.options().dtype(at::kFloat));
  const int64_t cols = with_transpose ? input.size(-1) : 0;
  const int64_t rows = with_transpose && cols > 0 ? input.numel() / cols : 0;
  at::Tensor data_t = with_transpose ? at::empty({cols, rows}, data.options()) : at::Tensor();
  const AtenThreadPool pool;
  const c10::DataPtr scratch = workspace(te_kernels::fp8_quantize_workspace_bytes(pool));

  te_kernels::Fp8QuantizeParams p;
  p.numel = input.numel();
  p.in_dtype = in_dtype;
  p.in = input.const_data_ptr();
  p.format = format;
  p.scale = scale_value.const_data_ptr<float>();
  p.out = static_cast<uint8_t*>(data.mutable_data_ptr());
  p.amax = amax.mutable_data_ptr<float>();
  p.workspace = scratch.get();
  if (with_transpose) {
    p.out_t = static_cast<uint8_t*>(data_t.mutable_data_ptr());
    p.rows = rows;
    p.cols = cols;
  }
  te_kernels::fp8_quantize(p, pool);
  return {data, data_t, amax};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fp8_quantize_cpu(const at::Tensor& input, const at::Tensor& scale,
                                                    at::ScalarType fp8_dtype) {
  auto [data, data_t, amax] = quantize("fp8_quantize", input, scale, fp8_dtype, /*with_transpose=*/false);
  return {data, amax};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fp8_quantize_transpose_cpu(const at::Tensor& input,
                                                                          const at::Tensor& scale,
                                                                          at::ScalarType fp8_dtype) {
  return quantize("fp8_quantize_transpose", input, scale, fp8_dtype, /*with_transpose=*/true);
}

// max |input| with fmaxf semantics (NaN skipped, inf counted, 0 over no elements): the NVFP4
// cast's amax kernel (te_kernels/nvfp4.h, no transform), which has that rule, over the
// contiguous input viewed as [rows, last dim].
float magnitude_max(const at::Tensor& input, te_kernels::DType dtype) {
  float amax = 0.0f;
  if (input.numel() == 0) return amax;
  te_kernels::Nvfp4AmaxParams p;
  p.source.cols = input.dim() == 0 ? 1 : input.size(-1);
  p.source.rows = input.numel() / p.source.cols;
  p.source.dtype = dtype;
  p.source.data = input.const_data_ptr();
  p.source.row_stride = p.source.cols;
  p.amax = &amax;
  te_kernels::nvfp4_amax(p, AtenThreadPool());
  return amax;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fp8_quantize_current_cpu(const at::Tensor& input_arg,
                                                                                    at::ScalarType fp8_dtype,
                                                                                    double amax_epsilon, bool power_2) {
  const char* op = "fp8_quantize_current";
  const te_kernels::Fp8Format format = fp8_format(op, "fp8_dtype", fp8_dtype);
  const te_kernels::DType in_dtype = high_precision_dtype(op, "input", input_arg.scalar_type());
  TORCH_CHECK_VALUE(amax_epsilon >= 0.0, op, ": amax_epsilon must be >= 0, got ", amax_epsilon);
  const at::Tensor input = input_arg.contiguous();
  const float amax = magnitude_max(input, in_dtype);
  // The per-tensor scale is a block scale whose block is the whole tensor (fp8_block.h's rule,
  // the same fp32 arithmetic as scaling.current_scale).
  const te_kernels::BlockScale scale = te_kernels::block_scale(
      amax, te_kernels::fp8_max(format),
      power_2 ? te_kernels::BlockScaleMode::kPow2 : te_kernels::BlockScaleMode::kFp32, float(amax_epsilon));
  const at::TensorOptions fp32 = input.options().dtype(at::kFloat);
  at::Tensor scale_out = at::full({1}, scale.scale, fp32);
  at::Tensor scale_inv_out = at::full({1}, scale.scale_inv, fp32);
  at::Tensor amax_out = at::full({1}, amax, fp32);
  at::Tensor data = at::empty(input.sizes(), input.options().dtype(fp8_dtype));
  const AtenThreadPool pool;
  const c10::DataPtr scratch = workspace(te_kernels::fp8_quantize_workspace_bytes(pool));
  float cast_amax = 0.0f;  // the cast's own amax of the same values: amax_out already holds it

  te_kernels::Fp8QuantizeParams p;
  p.numel = input.numel();
  p.in_dtype = in_dtype;
  p.in = input.const_data_ptr();
  p.format = format;
  p.scale = &scale.scale;
  p.out = static_cast<uint8_t*>(data.mutable_data_ptr());
  p.amax = &cast_amax;
  p.workspace = scratch.get();
  te_kernels::fp8_quantize(p, pool);
  return {data, scale_out, scale_inv_out, amax_out};
}

std::tuple<at::Tensor, at::Tensor> fp8_quantize_delayed_cpu(const at::Tensor& input_arg, const at::Tensor& scales,
                                                            int64_t slot, at::Tensor& amax_history,
                                                            at::Tensor& amax_recorded, at::ScalarType fp8_dtype) {
  const char* op = "fp8_quantize_delayed_";
  const te_kernels::Fp8Format format = fp8_format(op, "fp8_dtype", fp8_dtype);
  const te_kernels::DType in_dtype = high_precision_dtype(op, "input", input_arg.scalar_type());
  check_dtype(op, "scales", scales, at::kFloat);
  check_dtype(op, "amax_history", amax_history, at::kFloat);
  check_dtype(op, "amax_recorded", amax_recorded, at::kBool);
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.is_contiguous(), op,
                    ": scales must be a contiguous 1-D tensor, got shape ", scales.sizes());
  const int64_t slots = scales.size(0);
  TORCH_CHECK_VALUE(slot >= 0 && slot < slots, op, ": slot ", slot, " is outside the ", slots, " slots of scales");
  TORCH_CHECK_VALUE(amax_history.dim() == 2 && amax_history.size(0) >= 1 && amax_history.size(1) == slots &&
                        amax_history.is_contiguous(),
                    op, ": amax_history must be a contiguous [history_len >= 1, ", slots, "] tensor, got shape ",
                    amax_history.sizes());
  TORCH_CHECK_VALUE(amax_recorded.dim() == 1 && amax_recorded.size(0) == slots && amax_recorded.is_contiguous(), op,
                    ": amax_recorded must be a contiguous [", slots, "] tensor, got shape ", amax_recorded.sizes());
  check_same_device(op, "scales", scales, "the input", input_arg);
  check_same_device(op, "amax_history", amax_history, "the input", input_arg);
  check_same_device(op, "amax_recorded", amax_recorded, "the input", input_arg);
  const at::Tensor input = input_arg.contiguous();
  const float scale = scales.const_data_ptr<float>()[slot];
  at::Tensor data = at::empty(input.sizes(), input.options().dtype(fp8_dtype));
  const AtenThreadPool pool;
  const c10::DataPtr scratch = workspace(te_kernels::fp8_quantize_workspace_bytes(pool));
  float amax = 0.0f;
  te_kernels::Fp8QuantizeParams p;
  p.numel = input.numel();
  p.in_dtype = in_dtype;
  p.in = input.const_data_ptr();
  p.format = format;
  p.scale = &scale;
  p.out = static_cast<uint8_t*>(data.mutable_data_ptr());
  p.amax = &amax;
  p.workspace = scratch.get();
  te_kernels::fp8_quantize(p, pool);
  float& live = amax_history.mutable_data_ptr<float>()[slot];  // row 0, the live amaxes
  if (!std::isnan(live)) live = std::max(live, amax);  // torch.maximum's rule: a NaN recorded before stays
  amax_recorded.mutable_data_ptr<bool>()[slot] = true;
  return {data, at::full({1}, 1.0f / scale, input.options().dtype(at::kFloat))};
}

at::Tensor fp8_dequantize_cpu(const at::Tensor& data_arg, const at::Tensor& scale_inv, at::ScalarType out_dtype) {
  const char* op = "fp8_dequantize";
  const te_kernels::Fp8Format format = fp8_format(op, "data", data_arg.scalar_type());
  const te_kernels::DType dtype = high_precision_dtype(op, "out_dtype", out_dtype);
  check_scale(op, "scale_inv", scale_inv, data_arg);
  const at::Tensor data = data_arg.contiguous();
  const at::Tensor scale_value = scale_inv.contiguous();
  at::Tensor out = at::empty(data.sizes(), data.options().dtype(out_dtype));

  te_kernels::Fp8DequantizeParams p;
  p.numel = data.numel();
  p.in = static_cast<const uint8_t*>(data.const_data_ptr());
  p.format = format;
  p.scale_inv = scale_value.const_data_ptr<float>();
  p.out_dtype = dtype;
  p.out = out.mutable_data_ptr();
  te_kernels::fp8_dequantize(p, AtenThreadPool());
  return out;
}

at::Tensor fp8_transpose_cpu(const at::Tensor& data_arg) {
  const char* op = "fp8_transpose";
  fp8_format(op, "data", data_arg.scalar_type());
  TORCH_CHECK_VALUE(data_arg.dim() == 2, op, ": data must be 2-D [rows, cols], got shape ", data_arg.sizes());
  const at::Tensor data = data_arg.contiguous();
  at::Tensor out = at::empty({data.size(1), data.size(0)}, data.options());
  te_kernels::Fp8TransposeParams p;
  p.rows = data.size(0);
  p.cols = data.size(1);
  p.in = static_cast<const uint8_t*>(data.const_data_ptr());
  p.out = static_cast<uint8_t*>(out.mutable_data_ptr());
  te_kernels::fp8_transpose(p, AtenThreadPool());
  return out;
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("fp8_quantize", &portable_te::fp8_quantize_cpu);
  m.impl("fp8_quantize_transpose", &portable_te::fp8_quantize_transpose_cpu);
  m.impl("fp8_quantize_current", &portable_te::fp8_quantize_current_cpu);
  m.impl("fp8_quantize_delayed_", &portable_te::fp8_quantize_delayed_cpu);
  m.impl("fp8_dequantize", &portable_te::fp8_dequantize_cpu);
  m.impl("fp8_transpose", &portable_te::fp8_transpose_cpu);
}
