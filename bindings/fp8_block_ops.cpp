// The block-scaled FP8 ops' binding: their schemas and CPU kernels (Tensor ->
// te_kernels::Fp8Block*Params, every argument checked first).
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten_thread_pool.h"
#include "fp8_block_ops.h"
#include "te_kernels/fp8_block.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // Block scaling of a 2-D input [rows, cols]: one scale per block_rows x block_cols block,
  // scale_inv [ceil(rows / block_rows), ceil(cols / block_cols)]; scale_mode 'fp32' or 'pow2'
  // (float32 scale_inv = 1 / scale, scale = fp8_max / max(block amax, amax_epsilon)) or
  // 'e8m0' (MXFP8: uint8 biased exponents, scale_inv = 2^(e - 127)).
  m.def(
      "fp8_block_quantize(Tensor input, int block_rows, int block_cols, ScalarType fp8_dtype, str scale_mode,"
      " float amax_epsilon) -> (Tensor data, Tensor scale_inv)");
  // output = data * scale_inv of each element's block, in out_dtype.
  m.def(
      "fp8_block_dequantize(Tensor data, Tensor scale_inv, int block_rows, int block_cols, ScalarType out_dtype)"
      " -> Tensor");
}

namespace portable_te {
namespace {

te_kernels::BlockScaleMode scale_mode_of(const char* op, c10::string_view mode) {
  if (mode == "fp32") return te_kernels::BlockScaleMode::kFp32;
  if (mode == "pow2") return te_kernels::BlockScaleMode::kPow2;
  if (mode == "e8m0") return te_kernels::BlockScaleMode::kE8M0;
  TORCH_CHECK_VALUE(false, op, ": scale_mode must be 'fp32', 'pow2' or 'e8m0', got '", std::string(mode), "'");
}

void check_matrix_and_blocks(const char* op, const char* arg, const at::Tensor& t, int64_t block_rows,
                             int64_t block_cols) {
  TORCH_CHECK_VALUE(t.dim() == 2, op, ": ", arg, " must be 2-D [rows, cols], got shape ", t.sizes());
  TORCH_CHECK_VALUE(block_rows >= 1 && block_cols >= 1 && block_cols <= te_kernels::kMaxBlockCols, op, ": blocks of ",
                    block_rows, " x ", block_cols, " are not supported (rows >= 1, 1 <= cols <= ",
                    te_kernels::kMaxBlockCols, ")");
}

std::vector<int64_t> block_grid(const at::Tensor& t, int64_t block_rows, int64_t block_cols) {
  return {(t.size(0) + block_rows - 1) / block_rows, (t.size(1) + block_cols - 1) / block_cols};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fp8_block_quantize_cpu(const at::Tensor& input_arg, int64_t block_rows,
                                                          int64_t block_cols, at::ScalarType fp8_dtype,
                                                          c10::string_view scale_mode, double amax_epsilon) {
  const char* op = "fp8_block_quantize";
  const te_kernels::Fp8Format format = fp8_format(op, "fp8_dtype", fp8_dtype);
  const te_kernels::DType in_dtype = high_precision_dtype(op, "input", input_arg.scalar_type());
  const te_kernels::BlockScaleMode mode = scale_mode_of(op, scale_mode);
  check_matrix_and_blocks(op, "input", input_arg, block_rows, block_cols);
  TORCH_CHECK_VALUE(amax_epsilon >= 0, op, ": amax_epsilon must be >= 0, got ", amax_epsilon);
  const at::Tensor input = input_arg.contiguous();
  at::Tensor data = at::empty(input.sizes(), input.options().dtype(fp8_dtype));
  const auto scale_dtype = mode == te_kernels::BlockScaleMode::kE8M0 ? at::kByte : at::kFloat;
  at::Tensor scale_inv = at::empty(block_grid(input, block_rows, block_cols), input.options().dtype(scale_dtype));

  te_kernels::Fp8BlockQuantizeParams p;
  p.rows = input.size(0), p.cols = input.size(1), p.block_rows = block_rows, p.block_cols = block_cols;
  p.in_dtype = in_dtype;
  p.in = input.const_data_ptr();
  p.format = format;
  p.mode = mode;
  p.amax_epsilon = float(amax_epsilon);
  p.out = static_cast<uint8_t*>(data.mutable_data_ptr());
  p.scale_inv = scale_inv.mutable_data_ptr();
  te_kernels::fp8_block_quantize(p, AtenThreadPool());
  return {data, scale_inv};
}

at::Tensor fp8_block_dequantize_cpu(const at::Tensor& data_arg, const at::Tensor& scale_inv_arg, int64_t block_rows,
                                    int64_t block_cols, at::ScalarType out_dtype) {
  const char* op = "fp8_block_dequantize";
  const te_kernels::Fp8Format format = fp8_format(op, "data", data_arg.scalar_type());
  const te_kernels::DType dtype = high_precision_dtype(op, "out_dtype", out_dtype);
  check_matrix_and_blocks(op, "data", data_arg, block_rows, block_cols);
  check_same_device(op, "scale_inv", scale_inv_arg, "data", data_arg);
  const bool e8m0 = scale_inv_arg.scalar_type() == at::kByte;
  TORCH_CHECK_VALUE(e8m0 || scale_inv_arg.scalar_type() == at::kFloat, op,
                    ": scale_inv must be float32 (fp32 / power-of-two scales) or uint8 (E8M0 exponents), got ",
                    scale_inv_arg.scalar_type());
  check_shape(op, "scale_inv", scale_inv_arg, block_grid(data_arg, block_rows, block_cols),
              "one scale per block of " + std::to_string(block_rows) + " x " + std::to_string(block_cols));
  const at::Tensor data = data_arg.contiguous();
  const at::Tensor scale_inv = scale_inv_arg.contiguous();
  at::Tensor out = at::empty(data.sizes(), data.options().dtype(out_dtype));

  te_kernels::Fp8BlockDequantizeParams p;
  p.rows = data.size(0), p.cols = data.size(1), p.block_rows = block_rows, p.block_cols = block_cols;
  p.in = static_cast<const uint8_t*>(data.const_data_ptr());
  p.format = format;
  p.e8m0_scales = e8m0;
  p.scale_inv = scale_inv.const_data_ptr();
  p.out_dtype = dtype;
  p.out = out.mutable_data_ptr();
  te_kernels::fp8_block_dequantize(p, AtenThreadPool());
  return out;
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("fp8_block_quantize", &portable_te::fp8_block_quantize_cpu);
  m.impl("fp8_block_dequantize", &portable_te::fp8_block_dequantize_cpu);
}
