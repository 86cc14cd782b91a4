#include "tensor_checks.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace portable_te {

te_kernels::DType kernel_dtype(const char* op, const char* arg, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return te_kernels::DType::kFloat32;
    case at::kDouble: return te_kernels::DType::kFloat64;
    case at::kBFloat16: return te_kernels::DType::kBFloat16;
    case at::kHalf: return te_kernels::DType::kFloat16;
    default:
      TORCH_CHECK_VALUE(false, op, ": ", arg, " must be float32, float64, bfloat16 or float16, got ",
                        t.scalar_type(), " (shape ", t.sizes(), ")");
  }
}

void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", arg, " is on ", t.device(), " but ", ref_arg,
                    " is on ", ref.device(), "; move them to the same device");
}

void check_shape(const char* op, const char* arg, const at::Tensor& t, at::IntArrayRef expected,
                 const std::string& why) {
  TORCH_CHECK_VALUE(t.sizes() == expected, op, ": ", arg, " has shape ", t.sizes(), " but ", expected,
                    " was expected (", why, ")");
}

void check_dtype(const char* op, const char* arg, const at::Tensor& t, at::ScalarType expected) {
  TORCH_CHECK_VALUE(t.scalar_type() == expected, op, ": ", arg, " has dtype ", t.scalar_type(), " but ",
                    expected, " was expected");
}

te_kernels::Fp8Format fp8_format(const char* op, const char* arg, at::ScalarType dtype) {
  if (dtype == at::kFloat8_e4m3fn) return te_kernels::Fp8Format::kE4M3;
  if (dtype == at::kFloat8_e5m2) return te_kernels::Fp8Format::kE5M2;
  TORCH_CHECK_VALUE(false, op, ": ", arg, " must be torch.float8_e4m3fn or torch.float8_e5m2, got ", dtype);
}

te_kernels::DType high_precision_dtype(const char* op, const char* arg, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op, ": ", arg,
                    " must be float32, bfloat16 or float16, got ", dtype);
  return dtype == at::kFloat ? te_kernels::DType::kFloat32
                             : dtype == at::kBFloat16 ? te_kernels::DType::kBFloat16 : te_kernels::DType::kFloat16;
}

at::Tensor fp32_bias(const char* op, const at::Tensor& bias, int64_t n, const std::string& why, const char* ref_arg,
                     const at::Tensor& ref) {
  check_same_device(op, "bias", bias, ref_arg, ref);
  check_shape(op, "bias", bias, {n}, why);
  TORCH_CHECK_VALUE(at::isFloatingType(bias.scalar_type()), op, ": bias must be floating point, got ",
                    bias.scalar_type());
  return bias.to(at::kFloat).contiguous();
}

void check_written_rows(const char* op, const at::Tensor& out, const char* a_arg, const at::Tensor& a,
                        const char* b_arg, const at::Tensor& b) {
  TORCH_CHECK_VALUE(out.numel() == 0 || (out.stride(1) == 1 && (out.size(0) <= 1 || out.stride(0) >= out.size(1))),
                    op, ": out must have contiguous rows (it is written in place), got strides ", out.strides());
  TORCH_CHECK_VALUE(!out.is_alias_of(a) && !out.is_alias_of(b), op, ": out must not share memory with ", a_arg,
                    " or ", b_arg, " (it is written while they are read)");
}

c10::DataPtr workspace(size_t bytes) {
  return c10::GetCPUAllocator()->allocate(bytes);
}

}  // namespace portable_te
