// The NVFP4 cast ops' binding: their schemas and CPU kernels (Tensor -> te_kernels::Nvfp4*Params,
// every argument checked first). Semantics: transformer_engine/pytorch/reference/nvfp4.py.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>

#include "aten_thread_pool.h"
#include "te_kernels/nvfp4.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // The fp32 [1] amax of what nvfp4_quantize(input, ..., transpose, rht) casts: input [rows,
  // cols] (or its transpose), through the random Hadamard transform when rht; per_row: fp32
  // [rows], each row's (row-scaled NVFP4).
  m.def("nvfp4_amax(Tensor input, bool transpose, bool rht, bool per_row=False) -> Tensor");
  // data uint8 [rows, ceil(cols / 2)] (E2M1 codes, the even column in the low nibble) and
  // scales float8_e4m3fn [rows, ceil(cols / 16)] of input (or its transpose) with the tensor's
  // amax (fp32 [1]) or, with block_rows 1, each row's (fp32 [rows]); block_rows 1 (1 x 16
  // blocks) or 16 (16 x 16, each tile's scale on its 16 rows); sr_rng int64 [2] (seed,
  // offset): stochastic rounding, else nearest; e4m3_max: the global scale's bound (448 or
  // 256); four_over_six "mae" or "mse": 4over6's choice of each block's scale, its error
  // scaled when scaled_error.
  m.def(
      "nvfp4_quantize(Tensor input, Tensor amax, int block_rows, bool transpose, bool rht, Tensor? sr_rng,"
      " int e4m3_max=448, str four_over_six=\"off\", bool scaled_error=False) -> (Tensor data, Tensor scales)");
  // The values [rows, cols] in out_dtype: code * scale * amax / (6 e4m3_max), with the tensor's
  // amax or each row's.
  m.def(
      "nvfp4_dequantize(Tensor data, Tensor scales, Tensor amax, int cols, ScalarType out_dtype, int e4m3_max=448)"
      " -> Tensor");
  // The column-wise usage (data uint8 [cols, ceil(rows / 2)], scales [cols, ceil(rows / 16)])
  // of a 16 x 16-tile cast of nearest rounding without the transform, from its row-wise data
  // [rows, ceil(cols / 2)] and scales [rows, ceil(cols / 16)]: the same bits as casting the
  // transpose.
  m.def("nvfp4_transpose_tiles(Tensor data, Tensor scales, int cols) -> (Tensor data, Tensor scales)");
}

namespace portable_te {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The source the kernels cast: input, or its transpose as the input with its strides swapped.
te_kernels::Nvfp4Source source_of(const char* op, const at::Tensor& input, bool transpose, bool rht) {
  te_kernels::Nvfp4Source s;
  s.dtype = high_precision_dtype(op, "input", input.scalar_type());
  TORCH_CHECK_VALUE(input.dim() == 2, op, ": input must be 2-D [rows, cols], got shape ", input.sizes());
  const int64_t r = transpose ? 1 : 0, c = 1 - r;
  s.rows = input.size(r), s.cols = input.size(c);
  s.row_stride = input.stride(r), s.col_stride = s.cols == 1 ? 1 : input.stride(c);
  s.data = input.const_data_ptr();
  s.rht = rht;
  TORCH_CHECK_VALUE(!rht || s.cols % te_kernels::kNvfp4Block == 0, op,
                    ": rht transforms blocks of 16 values along the rows of input", transpose ? "^T" : "",
                    ", whose ", s.cols, " columns are not a multiple of 16 (input shape ", input.sizes(), ")");
  return s;
}

// Checks packed codes data [rows, ceil(cols / 2)] and their scales [rows, ceil(cols / 16)]; rows.
int64_t check_codes(const char* op, const at::Tensor& data, const at::Tensor& scales, int64_t cols) {
  check_dtype(op, "data", data, at::kByte);
  TORCH_CHECK_VALUE(data.dim() == 2, op, ": data must be 2-D [rows, ceil(cols / 2)], got shape ", data.sizes());
  TORCH_CHECK_VALUE(cols >= 0 && ceil_div(cols, 2) == data.size(1), op, ": cols ", cols, " does not fit data of shape ",
                    data.sizes(), " (two codes per byte)");
  check_same_device(op, "scales", scales, "data", data);
  check_dtype(op, "scales", scales, at::kFloat8_e4m3fn);
  check_shape(op, "scales", scales, {data.size(0), ceil_div(cols, te_kernels::kNvfp4Block)},
              "one scale per 16 values of a row");
  return data.size(0);
}

// The amax: float32 on `ref`'s device (its size is each op's to check), contiguous for the kernels.
at::Tensor amax_of(const char* op, const at::Tensor& amax, const char* ref_arg, const at::Tensor& ref) {
  check_same_device(op, "amax", amax, ref_arg, ref);
  check_dtype(op, "amax", amax, at::kFloat);
  return amax.contiguous();
}

// The global scale's bound E: 448, or 256 (TE's 4over6 tensors).
float e4m3_max_of(const char* op, int64_t e4m3_max) {
  TORCH_CHECK_VALUE(e4m3_max == 448 || e4m3_max == 256, op, ": e4m3_max must be 448 or 256, got ", e4m3_max);
  return float(e4m3_max);
}

te_kernels::Nvfp4FourOverSix four_over_six_of(const char* op, const std::string& four_over_six) {
  if (four_over_six == "mae") return te_kernels::Nvfp4FourOverSix::kMae;
  if (four_over_six == "mse") return te_kernels::Nvfp4FourOverSix::kMse;
  TORCH_CHECK_VALUE(four_over_six == "off", op, ": four_over_six must be 'off', 'mae' or 'mse', got '",
                    four_over_six, "'");
  return te_kernels::Nvfp4FourOverSix::kOff;
}

}  // namespace

at::Tensor nvfp4_amax_cpu(const at::Tensor& input, bool transpose, bool rht, bool per_row) {
  te_kernels::Nvfp4AmaxParams p;
  p.source = source_of("nvfp4_amax", input, transpose, rht);
  p.per_row = per_row;
  at::Tensor amax = at::empty({per_row ? p.source.rows : 1}, input.options().dtype(at::kFloat));
  p.amax = amax.mutable_data_ptr<float>();
  te_kernels::nvfp4_amax(p, AtenThreadPool());
  return amax;
}

std::tuple<at::Tensor, at::Tensor> nvfp4_quantize_cpu(const at::Tensor& input, const at::Tensor& amax,
                                                      int64_t block_rows, bool transpose, bool rht,
                                                      const std::optional<at::Tensor>& sr_rng, int64_t e4m3_max,
                                                      c10::string_view four_over_six, bool scaled_error) {
  const char* op = "nvfp4_quantize";
  te_kernels::Nvfp4QuantizeParams p;
  p.source = source_of(op, input, transpose, rht);
  TORCH_CHECK_VALUE(block_rows == 1 || block_rows == te_kernels::kNvfp4Block, op,
                    ": block_rows must be 1 or 16, got ", block_rows);
  p.block_rows = block_rows;
  const at::Tensor global_amax = amax_of(op, amax, "input", input);
  TORCH_CHECK_VALUE(amax.numel() == 1 || (block_rows == 1 && amax.numel() == p.source.rows), op,
                    ": amax must hold one element (the tensor's amax) or, with block_rows 1, one per row of what "
                    "is cast (", p.source.rows, "), got shape ", amax.sizes(), " with block_rows ", block_rows);
  p.amax = global_amax.const_data_ptr<float>();
  p.amax_per_row = global_amax.numel() != 1;
  p.e4m3_max = e4m3_max_of(op, e4m3_max);
  p.four_over_six = four_over_six_of(op, std::string(four_over_six));
  p.scaled_error = scaled_error;
  TORCH_CHECK_VALUE(p.four_over_six == te_kernels::Nvfp4FourOverSix::kOff || !sr_rng.has_value(), op,
                    ": four_over_six '", four_over_six, "' keeps each block's nearer cast; it takes no sr_rng "
                    "(stochastic rounding)");
  if (sr_rng.has_value()) {
    check_same_device(op, "sr_rng", *sr_rng, "input", input);
    check_dtype(op, "sr_rng", *sr_rng, at::kLong);
    check_shape(op, "sr_rng", *sr_rng, {2}, "(seed, offset)");
    const at::Tensor rng = sr_rng->contiguous();
    // Philox's counter holds a row's index in 32 bits and a column's in 32 bits over 4.
    TORCH_CHECK_VALUE(p.source.rows <= (int64_t(1) << 32) && p.source.cols <= (int64_t(1) << 34), op,
                      ": stochastic rounding takes at most 2^32 rows and 2^34 columns, got ", p.source.rows,
                      " x ", p.source.cols);
    p.stochastic = true;
    p.seed = uint64_t(rng.const_data_ptr<int64_t>()[0]);
    p.offset = uint64_t(rng.const_data_ptr<int64_t>()[1]);
  }
  at::Tensor data = at::empty({p.source.rows, ceil_div(p.source.cols, 2)}, input.options().dtype(at::kByte));
  at::Tensor scales = at::empty({p.source.rows, ceil_div(p.source.cols, te_kernels::kNvfp4Block)},
                                input.options().dtype(at::kFloat8_e4m3fn));
  p.data = static_cast<uint8_t*>(data.mutable_data_ptr());
  p.scales = static_cast<uint8_t*>(scales.mutable_data_ptr());
  te_kernels::nvfp4_quantize(p, AtenThreadPool());
  return {data, scales};
}

at::Tensor nvfp4_dequantize_cpu(const at::Tensor& data_arg, const at::Tensor& scales_arg, const at::Tensor& amax,
                                int64_t cols, at::ScalarType out_dtype, int64_t e4m3_max) {
  const char* op = "nvfp4_dequantize";
  te_kernels::Nvfp4DequantizeParams p;
  p.out_dtype = high_precision_dtype(op, "out_dtype", out_dtype);
  const int64_t rows = check_codes(op, data_arg, scales_arg, cols);
  const at::Tensor global_amax = amax_of(op, amax, "data", data_arg);
  TORCH_CHECK_VALUE(amax.numel() == 1 || amax.numel() == rows, op,
                    ": amax must hold one element (the tensor's amax) or one per row of data (", rows,
                    "), got shape ", amax.sizes());
  p.amax = global_amax.const_data_ptr<float>();
  p.amax_per_row = global_amax.numel() != 1;
  p.e4m3_max = e4m3_max_of(op, e4m3_max);
  const at::Tensor data = data_arg.contiguous();
  const at::Tensor scales = scales_arg.contiguous();
  at::Tensor out = at::empty({rows, cols}, data.options().dtype(out_dtype));
  p.rows = rows, p.cols = cols;
  p.data = static_cast<const uint8_t*>(data.const_data_ptr());
  p.scales = static_cast<const uint8_t*>(scales.const_data_ptr());
  p.out = out.mutable_data_ptr();
  te_kernels::nvfp4_dequantize(p, AtenThreadPool());
  return out;
}

std::tuple<at::Tensor, at::Tensor> nvfp4_transpose_tiles_cpu(const at::Tensor& data_arg, const at::Tensor& scales_arg,
                                                             int64_t cols) {
  const char* op = "nvfp4_transpose_tiles";
  const int64_t rows = check_codes(op, data_arg, scales_arg, cols);
  const at::Tensor data = data_arg.contiguous();
  const at::Tensor scales = scales_arg.contiguous();
  at::Tensor transposed_data = at::empty({cols, ceil_div(rows, 2)}, data.options());
  at::Tensor transposed_scales = at::empty({cols, ceil_div(rows, te_kernels::kNvfp4Block)}, scales.options());
  te_kernels::Nvfp4TransposeTilesParams p;
  p.rows = rows, p.cols = cols;
  p.data = static_cast<const uint8_t*>(data.const_data_ptr());
  p.scales = static_cast<const uint8_t*>(scales.const_data_ptr());
  p.transposed_data = static_cast<uint8_t*>(transposed_data.mutable_data_ptr());
  p.transposed_scales = static_cast<uint8_t*>(transposed_scales.mutable_data_ptr());
  te_kernels::nvfp4_transpose_tiles(p, AtenThreadPool());
  return {transposed_data, transposed_scales};
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("nvfp4_amax", &portable_te::nvfp4_amax_cpu);
  m.impl("nvfp4_quantize", &portable_te::nvfp4_quantize_cpu);
  m.impl("nvfp4_dequantize", &portable_te::nvfp4_dequantize_cpu);
  m.impl("nvfp4_transpose_tiles", &portable_te::nvfp4_transpose_tiles_cpu);
}
