// The block-scaled FP8 GEMM op's binding: its schema and CPU kernel. Semantics:
// transformer_engine/pytorch/reference/scaled_gemm.py's fp8_block_gemm (each operand dequantised
// to fp32, then fp32 sums, the bias in fp32, one rounding). Where every scale is a power of two
// (E8M0, 'pow2' blocks) and the blocks fit te_kernels::gemm_bf16 (powers of two, at least 32
// along k), the codes and scales go to that kernel, which widens each code times its scale to
// bf16 (exact) inside it and sums the exact products in fp32, in its own order; otherwise the
// operands are dequantised to fp32 and multiplied by ATen's fp32 GEMM, as the reference does.
#include <ATen/ops/empty.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstring>

#include "aten_thread_pool.h"
#include "fp8_block_ops.h"
#include "te_kernels/gemm.h"
#include "tensor_checks.h"

TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // a @ b^T [m, n] for a [m, k] and b [n, k], each given as fp8_block_quantize's codes and
  // scale_inv with its block (rows, cols); a transposed operand stores its transpose (data
  // [k, rows]), as a column-wise Float8BlockTensor does. Bias [n] is optional.
  m.def(
      "fp8_block_gemm(Tensor a_data, Tensor a_scale_inv, int[] a_block, bool a_transposed, Tensor b_data, "
      "Tensor b_scale_inv, int[] b_block, bool b_transposed, Tensor? bias, ScalarType out_dtype) -> Tensor");
}

namespace portable_te {
namespace {

constexpr const char* kOp = "fp8_block_gemm";

// One operand as given (data, scale_inv, block, transposed), checked as
// custom_ops/fp8_block_gemm.py's _operand checks it.
struct BlockOperand {
  const at::Tensor& data;
  const at::Tensor& scale_inv;
  std::vector<int64_t> block;
  bool transposed;
  int64_t rows, k;  // of the operand the GEMM multiplies ([rows, k])

  BlockOperand(const char* name, const at::Tensor& data, const at::Tensor& scale_inv, at::IntArrayRef block_arg,
               bool transposed, const at::Tensor& ref)
      : data(data), scale_inv(scale_inv), block(block_arg.vec()), transposed(transposed) {
    const std::string arg(name);
    fp8_format(kOp, (arg + "_data").c_str(), data.scalar_type());
    TORCH_CHECK_VALUE(data.dim() == 2, kOp, ": ", name, "_data must be 2-D, got shape ", data.sizes());
    TORCH_CHECK_VALUE(block.size() == 2 && block[0] >= 1 && block[1] >= 1, kOp, ": ", name,
                      "_block must be two positive sizes (rows, cols), got ", block_arg);
    TORCH_CHECK_VALUE(scale_inv.scalar_type() == at::kFloat || scale_inv.scalar_type() == at::kByte, kOp, ": ", name,
                      "_scale_inv must be float32 or uint8 (E8M0 exponents), got ", scale_inv.scalar_type());
    check_shape(kOp, (arg + "_scale_inv").c_str(), scale_inv,
                {(data.size(0) + block[0] - 1) / block[0], (data.size(1) + block[1] - 1) / block[1]},
                "one scale per block of " + std::to_string(block[0]) + " x " + std::to_string(block[1]));
    check_same_device(kOp, (arg + "_scale_inv").c_str(), scale_inv, "a_data", data);
    check_same_device(kOp, (arg + "_data").c_str(), data, "a_data", ref);
    rows = transposed ? data.size(1) : data.size(0);
    k = transposed ? data.size(0) : data.size(1);
  }

  bool e8m0() const { return scale_inv.scalar_type() == at::kByte; }
  // Block sizes along the operand's rows and along k.
  int64_t rows_per_scale() const { return transposed ? block[1] : block[0]; }
  int64_t k_per_scale() const { return transposed ? block[0] : block[1]; }

  // Whether gemm_bf16 takes it: every code times its scale is a bf16 value (the scales powers of
  // two: E8M0, or fp32 ones whose mantissa bits are zero), blocks it can index.
  bool fits_bf16_kernel() const {
    if (!te_kernels::gemm_fp8_blocks_fit(rows_per_scale(), k_per_scale())) return false;
    if (e8m0()) return true;
    const at::Tensor scales = scale_inv.contiguous();
    const float* s = scales.const_data_ptr<float>();
    for (int64_t i = 0; i < scales.numel(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, s + i, sizeof(bits));
      if ((bits & 0x007FFFFFu) != 0) return false;
    }
    return true;
  }

  // The values in fp32 [rows, k] (a view of the dequantised codes when transposed).
  at::Tensor dequantized() const {
    const at::Tensor values = fp8_block_dequantize_cpu(data, scale_inv, block[0], block[1], at::kFloat);
    return transposed ? values.t() : values;
  }
};

// The codes [rows, k] (rows contiguous), their scale grid and its layout, kept alive for the kernel.
struct KernelOperand {
  at::Tensor codes, scales;
  te_kernels::GemmOperand format;
  te_kernels::GemmFp8BlockScales blocks;
};

KernelOperand kernel_operand(const BlockOperand& x) {
  // A transposed operand's codes and grid are transposed first (one byte a code).
  const at::Tensor codes = x.transposed ? x.data.view(at::kByte).t().contiguous() : x.data.contiguous();
  const at::Tensor scales = x.transposed ? x.scale_inv.t().contiguous() : x.scale_inv.contiguous();
  KernelOperand out{codes, scales,
                    x.data.scalar_type() == at::kFloat8_e4m3fn ? te_kernels::GemmOperand::kFp8E4M3
                                                               : te_kernels::GemmOperand::kFp8E5M2,
                    {}};
  out.blocks.data = scales.const_data_ptr();
  out.blocks.e8m0 = x.e8m0();
  out.blocks.ld = scales.size(1);
  out.blocks.rows_per_scale = x.rows_per_scale();
  out.blocks.k_per_scale = x.k_per_scale();
  return out;
}

at::Tensor bf16_kernel_gemm(const BlockOperand& a_arg, const BlockOperand& b_arg, const at::Tensor& bias,
                            at::ScalarType out_dtype, te_kernels::DType dtype) {
  const KernelOperand a = kernel_operand(a_arg), b = kernel_operand(b_arg);
  at::Tensor out = at::empty({a_arg.rows, b_arg.rows}, a_arg.data.options().dtype(out_dtype));
  te_kernels::GemmBf16Params p;
  p.m = a_arg.rows, p.n = b_arg.rows, p.k = a_arg.k;
  p.a = a.codes.const_data_ptr(), p.a_format = a.format, p.lda = p.k, p.a_blocks = a.blocks;
  p.b = b.codes.const_data_ptr(), p.b_format = b.format, p.ldb = p.k, p.b_blocks = b.blocks;
  p.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  p.out_dtype = dtype;
  p.out = out.mutable_data_ptr();
  p.ldc = p.n;
  te_kernels::gemm_bf16(p, AtenThreadPool());
  return out;
}

}  // namespace

at::Tensor fp8_block_gemm_cpu(const at::Tensor& a_data, const at::Tensor& a_scale_inv, at::IntArrayRef a_block,
                              bool a_transposed, const at::Tensor& b_data, const at::Tensor& b_scale_inv,
                              at::IntArrayRef b_block, bool b_transposed, const std::optional<at::Tensor>& bias_arg,
                              at::ScalarType out_dtype) {
  const BlockOperand a("a", a_data, a_scale_inv, a_block, a_transposed, a_data);
  const BlockOperand b("b", b_data, b_scale_inv, b_block, b_transposed, a_data);
  TORCH_CHECK_VALUE(a.k == b.k, kOp, ": a is [", a.rows, ", ", a.k, "] and b is [", b.rows, ", ", b.k,
                    "]: both must have the same k (a @ b^T)");
  TORCH_CHECK_VALUE(a.e8m0() == b.e8m0(), kOp,
                    ": a_scale_inv and b_scale_inv must both be E8M0 (uint8) or both float32, got ",
                    a_scale_inv.scalar_type(), " and ", b_scale_inv.scalar_type());
  const te_kernels::DType dtype = high_precision_dtype(kOp, "out_dtype", out_dtype);
  const at::Tensor bias = bias_arg.has_value()
                              ? fp32_bias(kOp, *bias_arg, b.rows, "one per output column", "a_data", a_data)
                              : at::Tensor();
  if (a.fits_bf16_kernel() && b.fits_bf16_kernel()) return bf16_kernel_gemm(a, b, bias, out_dtype, dtype);
  // at::cpu::mm calls the CPU GEMM directly (no torch.autocast region can make it bf16).
  at::Tensor sums = at::cpu::mm(a.dequantized(), b.dequantized().t());  // [m, k] x [n, k]^T, fp32
  if (bias.defined()) sums.add_(bias);
  return sums.to(out_dtype);
}

}  // namespace portable_te

TORCH_LIBRARY_IMPL(portable_te, CPU, m) { m.impl("fp8_block_gemm", &portable_te::fp8_block_gemm_cpu); }
