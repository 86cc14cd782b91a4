// LayerNorm and RMSNorm over the last dimension of a row-major [rows, cols] matrix.
//
//   LayerNorm: y = (x - mean) * rstd * g + b,   rstd = 1 / sqrt(var + eps)  (biased var)
//   RMSNorm:   y = x * rstd * g,                rstd = 1 / sqrt(mean(x^2) + eps)
//   g = gamma, or 1 + gamma when zero_centered_gamma (gamma is then stored around 0).
//
// Statistics (mean, rstd) are computed and returned in the accumulation type: fp32 for
// fp32/bf16/fp16 inputs, fp64 for fp64 inputs. Outputs are rounded once, from fp32.
// gamma/beta may have a different dtype from x (e.g. fp32 parameters, bf16 activations);
// the gradients dgamma/dbeta are written in gamma's dtype.
//
// Two optional fusions ride on the same row passes:
//   residual add: the normalised row is s = x + residual (added in fp32, rounded once to
//     x's dtype and written to `sum`, the next residual stream); the backward then takes the
//     gradient dsum reaching s from its other uses and returns dx = norm_backward(dy) + dsum,
//     which is the gradient of both x and residual.
//   FP8 output: the codes of y * scale, with y first rounded to x's dtype, so they equal a
//     per-tensor fp8_quantize of the high-precision y bit for bit; amax = max |y| over all
//     rows (NaN elements skipped, as in every amax), reduced without atomics over row chunks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

enum class NormKind : int { kLayerNorm, kRMSNorm };

struct NormFwdParams {
  NormKind kind = NormKind::kLayerNorm;
  int64_t rows = 0;
  int64_t cols = 0;
  DType x_dtype = DType::kFloat32;  // also the dtype of y
  DType w_dtype = DType::kFloat32;  // dtype of gamma and beta
  const void* x = nullptr;          // [rows, cols]
  const void* gamma = nullptr;      // [cols]
  const void* beta = nullptr;       // [cols], LayerNorm only; may be null (no bias)
  void* y = nullptr;                // [rows, cols]; may be null when y_fp8 is set
  void* mean = nullptr;             // [rows] accumulation type, LayerNorm only
  void* rstd = nullptr;             // [rows] accumulation type
  double eps = 1e-5;
  bool zero_centered_gamma = false;
  // Residual add (optional, both or neither): x + residual is normalised and stored in sum.
  const void* residual = nullptr;  // [rows, cols] x_dtype
  void* sum = nullptr;             // [rows, cols] x_dtype
  // FP8 output (optional; x_dtype float32, bfloat16 or float16): y_fp8 = saturate(y * scale).
  uint8_t* y_fp8 = nullptr;  // [rows, cols] codes
  Fp8Format fp8_format = Fp8Format::kE4M3;
  const float* fp8_scale = nullptr;  // [1]
  float* amax = nullptr;             // [1]: max |y| (0 when rows == 0)
  // Number of row chunks run in parallel (each with its own staging row and amax partial).
  // Set by norm_fwd_plan(); the workspace size depends on it.
  int64_t num_chunks = 1;
  // Scratch of norm_fwd_workspace_bytes(*this) bytes, 64-byte aligned, owned by the caller
  // so that the kernel itself never allocates.
  void* workspace = nullptr;
};

struct NormBwdParams {
  NormKind kind = NormKind::kLayerNorm;
  int64_t rows = 0;
  int64_t cols = 0;
  DType x_dtype = DType::kFloat32;  // dtype of x, dy, dsum and dx
  DType w_dtype = DType::kFloat32;  // dtype of gamma, dgamma, dbeta
  const void* dy = nullptr;         // [rows, cols]
  const void* x = nullptr;          // [rows, cols]: what was normalised (s for a residual add)
  const void* mean = nullptr;       // [rows], LayerNorm only
  const void* rstd = nullptr;       // [rows]
  const void* gamma = nullptr;      // [cols]
  const void* dsum = nullptr;       // [rows, cols], optional: added to dx (residual add)
  void* dx = nullptr;               // [rows, cols]
  void* dgamma = nullptr;           // [cols]
  void* dbeta = nullptr;            // [cols], LayerNorm only; may be null
  bool zero_centered_gamma = false;
  // Number of row chunks whose partial dgamma/dbeta are reduced at the end (no atomics).
  // Set by norm_bwd_plan(); the workspace size depends on it.
  int64_t num_chunks = 1;
  void* workspace = nullptr;  // norm_bwd_workspace_bytes(*this) bytes, 64-byte aligned
};

// Fills params.num_chunks for this pool; call before norm_fwd_workspace_bytes().
void norm_fwd_plan(NormFwdParams& params, const ThreadPool& pool);
size_t norm_fwd_workspace_bytes(const NormFwdParams& params);
void norm_fwd(const NormFwdParams& params, const ThreadPool& pool);

// Fills params.num_chunks for this pool; call before norm_bwd_workspace_bytes().
void norm_bwd_plan(NormBwdParams& params, const ThreadPool& pool);
size_t norm_bwd_workspace_bytes(const NormBwdParams& params);
void norm_bwd(const NormBwdParams& params, const ThreadPool& pool);

// The SIMD tier norm_fwd/norm_bwd run on right now.
const char* norm_kernel_isa();

}  // namespace te_kernels
