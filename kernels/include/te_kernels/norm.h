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
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
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
  void* y = nullptr;                // [rows, cols]
  void* mean = nullptr;             // [rows] accumulation type, LayerNorm only
  void* rstd = nullptr;             // [rows] accumulation type
  double eps = 1e-5;
  bool zero_centered_gamma = false;
  // Scratch of norm_fwd_workspace_bytes(*this) bytes, 64-byte aligned, owned by the caller
  // so that the kernel itself never allocates.
  void* workspace = nullptr;
};

struct NormBwdParams {
  NormKind kind = NormKind::kLayerNorm;
  int64_t rows = 0;
  int64_t cols = 0;
  DType x_dtype = DType::kFloat32;  // dtype of x, dy and dx
  DType w_dtype = DType::kFloat32;  // dtype of gamma, dgamma, dbeta
  const void* dy = nullptr;         // [rows, cols]
  const void* x = nullptr;          // [rows, cols]
  const void* mean = nullptr;       // [rows], LayerNorm only
  const void* rstd = nullptr;       // [rows]
  const void* gamma = nullptr;      // [cols]
  void* dx = nullptr;               // [rows, cols]
  void* dgamma = nullptr;           // [cols]
  void* dbeta = nullptr;            // [cols], LayerNorm only; may be null
  bool zero_centered_gamma = false;
  // Number of row chunks whose partial dgamma/dbeta are reduced at the end (no atomics).
  // Set by norm_bwd_plan(); the workspace size depends on it.
  int64_t num_chunks = 1;
  void* workspace = nullptr;  // norm_bwd_workspace_bytes(*this) bytes, 64-byte aligned
};

size_t norm_fwd_workspace_bytes(const NormFwdParams& params);
void norm_fwd(const NormFwdParams& params, const ThreadPool& pool);

// Fills params.num_chunks for this pool; call before norm_bwd_workspace_bytes().
void norm_bwd_plan(NormBwdParams& params, const ThreadPool& pool);
size_t norm_bwd_workspace_bytes(const NormBwdParams& params);
void norm_bwd(const NormBwdParams& params, const ThreadPool& pool);

// The SIMD tier norm_fwd/norm_bwd run on right now.
const char* norm_kernel_isa();

}  // namespace te_kernels
