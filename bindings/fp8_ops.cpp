// The per-tensor FP8 ops' binding: their schemas and CPU kernels (Tensor -> te_kernels::Fp8*Params,
// every argument checked first).
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten_thread_pool.h"
#include "te_kernels/fp8.h"
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
  m.impl("fp8_dequantize", &portable_te::fp8_dequantize_cpu);
  m.impl("fp8_transpose", &portable_te::fp8_transpose_cpu);
}
