// Elementwise and gated activations over the last dimension of a row-major [rows, cols]
// matrix, with an optional fused bias (added before the activation, as a Linear's bias),
// the fused bias gradient in the backward pass, and an FP8 cast fused into the forward and into
// the backward (with the transpose of the codes).
//
//   plain:  y = act(x + bias)                                   y [rows, cols]
//   gated:  a, b = halves of the last dim of (x + bias);        y [rows, cols / 2]
//           y = act(a) * b   (clamped_swiglu: qgelu_alpha(min(a, limit)) * (clamp(b, +-limit) + 1))
//
// act: gelu (tanh approximation), qgelu x * sigmoid(1.702 x), relu, srelu (relu squared),
// silu x * sigmoid(x), and sigmoid for glu. Math is fp32 for fp32/bf16/fp16 data; outputs
// are rounded once to the data's dtype. The backward recomputes act from x (and bias).
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

enum class ActivationKind : int {
  kGelu, kQGelu, kRelu, kSRelu, kSilu,                                   // plain
  kGlu, kGeglu, kQGeglu, kReglu, kSReglu, kSwiglu, kClampedSwiglu,  // gated
};

// True for the *glu kinds, whose input's last dimension holds [a, b] and is twice the output's.
bool is_gated(ActivationKind kind);

struct Activation {
  ActivationKind kind = ActivationKind::kGelu;
  float limit = 7.0f;    // clamped_swiglu only
  float alpha = 1.702f;  // clamped_swiglu only: the sigmoid's slope
};

struct ActivationFwdParams {
  Activation act;
  int64_t rows = 0;
  int64_t cols = 0;                 // of x; even for a gated activation
  DType dtype = DType::kFloat32;    // of x, bias and y: float32, bfloat16 or float16
  const void* x = nullptr;          // [rows, cols]
  const void* bias = nullptr;       // [cols] or null
  void* y = nullptr;                // [rows, cols] or [rows, cols / 2] (gated)
};

struct ActivationBwdParams {
  Activation act;
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;  // of dy, x, bias, dx and dbias
  const void* dy = nullptr;       // [rows, cols] or [rows, cols / 2] (gated)
  const void* x = nullptr;        // [rows, cols]
  const void* bias = nullptr;     // [cols] or null: added to x before the activation
  void* dx = nullptr;             // [rows, cols]: the gradient of the activation's input
  void* dbias = nullptr;          // [cols] or null: dx summed over rows
  // Chunks of work whose fp32 dbias partials are reduced at the end, in order (no atomics).
  // Set by activation_bwd_plan(); the workspace size depends on it.
  int64_t num_chunks = 1;
  void* workspace = nullptr;  // activation_bwd_workspace_bytes(*this) bytes, 64-byte aligned
};

// The activation's output as FP8 codes: out = saturate(y * scale) with y = act(x + bias)
// rounded to x's dtype first, so the codes (and amax) equal those of fp8_quantize applied to
// activation_fwd's output, bit for bit, without writing that output to memory.
struct ActivationFp8Params {
  Activation act;
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;  // of x and bias
  const void* x = nullptr;        // [rows, cols]
  const void* bias = nullptr;     // [cols] or null
  Fp8Format format = Fp8Format::kE4M3;
  const float* scale = nullptr;  // [1]
  uint8_t* out = nullptr;        // like activation_fwd's y, as FP8 codes
  float* amax = nullptr;         // [1]: max |y| (NaN elements skipped)
  void* workspace = nullptr;     // activation_fp8_workspace_bytes(pool) bytes: per-chunk amaxes
};

// The gradient of the activation's input as FP8 codes, for the GEMM that consumes it (the
// backward of an MLP's first GEMM): out = saturate(dx * scale) with dx = activation_bwd's
// result (no bias) rounded to x's dtype first, and out_t = out^T, in one pass that never
// writes dx to memory: the codes, transpose and amax of fp8_quantize_transpose applied to
// activation_bwd's output, bit for bit.
struct ActivationBwdFp8Params {
  Activation act;
  int64_t rows = 0;
  int64_t cols = 0;                // of x (and of out); even for a gated activation
  DType dtype = DType::kFloat32;  // of dy and x
  const void* dy = nullptr;       // [rows, cols] or [rows, cols / 2] (gated)
  const void* x = nullptr;        // [rows, cols]
  Fp8Format format = Fp8Format::kE5M2;
  const float* scale = nullptr;  // [1]
  uint8_t* out = nullptr;        // [rows, cols]
  uint8_t* out_t = nullptr;      // [cols, rows], or null: no transpose
  float* amax = nullptr;         // [1]: max |dx| (NaN elements skipped)
  void* workspace = nullptr;     // activation_fp8_workspace_bytes(pool) bytes: per-chunk amaxes
};

void activation_fwd(const ActivationFwdParams& params, const ThreadPool& pool);

// Fills params.num_chunks for this pool; call before activation_bwd_workspace_bytes().
void activation_bwd_plan(ActivationBwdParams& params, const ThreadPool& pool);
size_t activation_bwd_workspace_bytes(const ActivationBwdParams& params);
void activation_bwd(const ActivationBwdParams& params, const ThreadPool& pool);

size_t activation_fp8_workspace_bytes(const ThreadPool& pool);
void activation_fp8(const ActivationFp8Params& params, const ThreadPool& pool);
void activation_bwd_fp8(const ActivationBwdFp8Params& params, const ThreadPool& pool);

}  // namespace te_kernels
