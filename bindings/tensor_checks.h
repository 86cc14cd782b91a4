// Argument checks shared by the bindings. Each failure raises a Python ValueError whose
// message names the op, the argument and the sizes or dtypes involved.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <string>

#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"

namespace portable_te {

// float32/float64/bfloat16/float16 -> kernel dtype; anything else is rejected.
te_kernels::DType kernel_dtype(const char* op, const char* arg, const at::Tensor& t);

// float8_e4m3fn / float8_e5m2 -> kernel format; anything else is rejected.
te_kernels::Fp8Format fp8_format(const char* op, const char* arg, at::ScalarType dtype);
// The high-precision side of an FP8 cast: 16/32-bit floats only (fp64 has no fast path to
// FP8 and is not a training dtype).
te_kernels::DType high_precision_dtype(const char* op, const char* arg, at::ScalarType dtype);

void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref);
void check_shape(const char* op, const char* arg, const at::Tensor& t, at::IntArrayRef expected,
                 const std::string& why);
void check_dtype(const char* op, const char* arg, const at::Tensor& t, at::ScalarType expected);

// A GEMM's bias [n] (any floating dtype, on ref's device) as contiguous fp32: the GEMMs add it in
// fp32, whatever its storage.
at::Tensor fp32_bias(const char* op, const at::Tensor& bias, int64_t n, const std::string& why, const char* ref_arg,
                     const at::Tensor& ref);

// An output written in place while a and b are read: its rows contiguous (any longer row
// stride), sharing no memory with either.
void check_written_rows(const char* op, const at::Tensor& out, const char* a_arg, const at::Tensor& a,
                        const char* b_arg, const at::Tensor& b);

// Statistics (mean, rstd) are kept in fp32, or fp64 for fp64 inputs.
inline at::ScalarType stats_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

// A caller-owned scratch buffer of the CPU kernels, aligned to 64 bytes by the CPU allocator.
// Taken from the allocator itself rather than as a tensor: at::empty's dispatch costs a small
// call's kernel time again.
c10::DataPtr workspace(size_t bytes);

}  // namespace portable_te
