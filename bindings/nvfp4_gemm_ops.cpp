// The NVFP4 GEMM ops' binding: their schemas and CPU kernels, te_kernels::gemm_bf16 with NVFP4
// operands (each code widened to bf16 with its block scale inside the kernel, exactly; fp32
// sums; alpha, the bias and an accumulated output applied in fp32 before the one rounding).
// Semantics: transformer_engine/pytorch/reference/nvfp4.py's nvfp4_gemm and gemm_epilogue.
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten_thread_pool.h"
#include "te_kernels/gemm.h"
#include "te_kernels/nvfp4.h"
#include "tensor_checks.h"

TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // a @ b^T [m, n] for a [m, k], b [n, k] given as nvfp4_quantize's packed codes (uint8 [rows,
  // k / 2]) and E4M3 scales ([rows, k / 16]), k a multiple of 16; in fp32: the sums times alpha
  // (fp32 [1]), times row_scales[i] (fp32 [m]) * col_scales[j] (fp32 [n]) where given (row-scaled
  // operands), plus bias [n], one rounding to out_dtype.
  m.def(
      "nvfp4_gemm(Tensor a_data, Tensor a_scales, Tensor b_data, Tensor b_scales, int k, Tensor alpha,"
      " Tensor? row_scales, Tensor? col_scales, Tensor? bias, ScalarType out_dtype) -> Tensor");
  // out += alpha * (a @ b^T) in place (out [m, n], rows contiguous), out's values added in fp32
  // before the one rounding: a weight gradient added into main_grad.
  m.def(
      "nvfp4_gemm_accumulate(Tensor a_data, Tensor a_scales, Tensor b_data, Tensor b_scales, int k, Tensor alpha,"
      " Tensor(a!) out) -> ()");
}

namespace portable_te {
namespace {

// An operand's codes and scales, checked, with rows contiguous.
struct Nvfp4Operand {
  at::Tensor data, scales;
};

Nvfp4Operand operand_of(const char* op, const char* data_arg, const at::Tensor& data, const char* scales_arg,
                        const at::Tensor& scales, int64_t k, const at::Tensor& ref) {
  check_same_device(op, data_arg, data, "a_data", ref);
  check_same_device(op, scales_arg, scales, "a_data", ref);
  check_dtype(op, data_arg, data, at::kByte);
  TORCH_CHECK_VALUE(data.dim() == 2 && data.size(1) == k / 2, op, ": ", data_arg, " must be [rows, k / 2] = [rows, ",
                    k / 2, "] (two codes a byte), got shape ", data.sizes());
  check_dtype(op, scales_arg, scales, at::kFloat8_e4m3fn);
  check_shape(op, scales_arg, scales, {data.size(0), k / te_kernels::kNvfp4Block},
              "one E4M3 scale per 16 values along k");
  return {data.contiguous(), scales.contiguous()};
}

// The fp32 [length] vector `value`, checked (its meaning for the message).
void check_vector(const char* op, const char* arg, const at::Tensor& value, int64_t length, const at::Tensor& ref,
                  const char* meaning) {
  check_same_device(op, arg, value, "a_data", ref);
  check_dtype(op, arg, value, at::kFloat);
  check_shape(op, arg, value, {length}, meaning);
}

void check_k(const char* op, int64_t k) {
  TORCH_CHECK_VALUE(k >= 0 && k % te_kernels::kNvfp4Block == 0, op,
                    ": k must be a non-negative multiple of 16 (whole scale blocks), got ", k);
}

// gemm_bf16 of a and b into out ([m, n], rows ldc apart).
void nvfp4_gemm_into(const Nvfp4Operand& a, const Nvfp4Operand& b, int64_t k, float alpha, const float* bias,
                     void* out, te_kernels::DType out_dtype, int64_t ldc, bool accumulate) {
  te_kernels::GemmBf16Params p;
  p.m = a.data.size(0), p.n = b.data.size(0), p.k = k;
  p.a = a.data.const_data_ptr(), p.a_format = te_kernels::GemmOperand::kNvfp4, p.lda = k / 2;
  p.a_scales = static_cast<const uint8_t*>(a.scales.const_data_ptr()), p.lda_scales = k / te_kernels::kNvfp4Block;
  p.b = b.data.const_data_ptr(), p.b_format = te_kernels::GemmOperand::kNvfp4, p.ldb = k / 2;
  p.b_scales = static_cast<const uint8_t*>(b.scales.const_data_ptr()), p.ldb_scales = k / te_kernels::kNvfp4Block;
  p.alpha = alpha;
  p.bias = bias;
  p.out = out, p.out_dtype = out_dtype, p.ldc = ldc;
  p.accumulate = accumulate;
  te_kernels::gemm_bf16(p, AtenThreadPool());
}

}  // namespace

at::Tensor nvfp4_gemm_cpu(const at::Tensor& a_data, const at::Tensor& a_scales, const at::Tensor& b_data,
                          const at::Tensor& b_scales, int64_t k, const at::Tensor& alpha,
                          const std::optional<at::Tensor>& row_scales, const std::optional<at::Tensor>& col_scales,
                          const std::optional<at::Tensor>& bias_arg, at::ScalarType out_dtype) {
  constexpr const char* kOp = "nvfp4_gemm";
  check_k(kOp, k);
  const Nvfp4Operand a = operand_of(kOp, "a_data", a_data, "a_scales", a_scales, k, a_data);
  const Nvfp4Operand b = operand_of(kOp, "b_data", b_data, "b_scales", b_scales, k, a_data);
  const int64_t m = a.data.size(0), n = b.data.size(0);
  check_vector(kOp, "alpha", alpha, 1, a_data, "the global factor");
  if (row_scales.has_value()) check_vector(kOp, "row_scales", *row_scales, m, a_data, "one per row of a");
  if (col_scales.has_value()) check_vector(kOp, "col_scales", *col_scales, n, a_data, "one per row of b");
  const at::Tensor bias =
      bias_arg.has_value() ? fp32_bias(kOp, *bias_arg, n, "one per output column", "a_data", a_data) : at::Tensor();
  const te_kernels::DType dtype = high_precision_dtype(kOp, "out_dtype", out_dtype);
  const float factor = alpha.item<float>();
  if (!row_scales.has_value() && !col_scales.has_value()) {
    at::Tensor out = at::empty({m, n}, a_data.options().dtype(out_dtype));
    nvfp4_gemm_into(a, b, k, factor, bias.defined() ? bias.const_data_ptr<float>() : nullptr, out.mutable_data_ptr(),
                    dtype, n, /*accumulate=*/false);
    return out;
  }
  // TE's row-scaled epilogue, in fp32 in its order: (sums * alpha) * (row_scale * col_scale) + bias.
  at::Tensor sums = at::empty({m, n}, a_data.options().dtype(at::kFloat));
  nvfp4_gemm_into(a, b, k, factor, nullptr, sums.mutable_data_ptr(), te_kernels::DType::kFloat32, n,
                  /*accumulate=*/false);
  const at::Tensor unit = at::ones({1, 1}, sums.options());
  const at::Tensor rows = row_scales.has_value() ? row_scales->view({m, 1}) : unit;
  const at::Tensor cols = col_scales.has_value() ? col_scales->view({1, n}) : unit;
  sums.mul_(rows.mul(cols));
  if (bias.defined()) sums.add_(bias);
  return sums.to(out_dtype);
}

void nvfp4_gemm_accumulate_cpu(const at::Tensor& a_data, const at::Tensor& a_scales, const at::Tensor& b_data,
                               const at::Tensor& b_scales, int64_t k, const at::Tensor& alpha, const at::Tensor& out) {
  constexpr const char* kOp = "nvfp4_gemm_accumulate";
  check_k(kOp, k);
  const Nvfp4Operand a = operand_of(kOp, "a_data", a_data, "a_scales", a_scales, k, a_data);
  const Nvfp4Operand b = operand_of(kOp, "b_data", b_data, "b_scales", b_scales, k, a_data);
  check_vector(kOp, "alpha", alpha, 1, a_data, "the global factor");
  check_same_device(kOp, "out", out, "a_data", a_data);
  check_shape(kOp, "out", out, {a.data.size(0), b.data.size(0)}, "[m, n]");
  const te_kernels::DType dtype = high_precision_dtype(kOp, "out", out.scalar_type());
  check_written_rows(kOp, out, "a_data", a_data, "b_data", b_data);
  const int64_t ldc = out.size(0) <= 1 ? out.size(1) : out.stride(0);
  nvfp4_gemm_into(a, b, k, alpha.item<float>(), nullptr, out.mutable_data_ptr(), dtype, ldc, /*accumulate=*/true);
}

}  // namespace portable_te

TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("nvfp4_gemm", &portable_te::nvfp4_gemm_cpu);
  m.impl("nvfp4_gemm_accumulate", &portable_te::nvfp4_gemm_accumulate_cpu);
}
