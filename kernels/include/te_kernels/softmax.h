// Softmax over the last dimension of attention scores, the fused kernels behind TE's
// ScaledSoftmax, ScaledMaskedSoftmax, ScaledUpperTriangMaskedSoftmax and
// ScaledAlignedCausalMaskedSoftmax.
//
// x is row-major [batch, heads, sq, sk]; each of the batch * heads * sq rows of sk logits
// becomes a probability row. Math is fp32 (fp64 for fp64 data); outputs are rounded once.
//   logits  z_j = scale * x_j                       (all mask kinds, before masking)
//   padding  z_j = -10000 where the mask byte is set: a fully masked row is uniform 1/sk
//   causal   keys j > i + offset are dropped and output exactly 0 (offset 0: top-left
//            aligned; offset sk - sq: bottom-right aligned). A row with no visible key
//            (bottom-right with sq > sk) is all zeros.
//   forward  y = softmax(z)
//   backward dx = scale * y * (dy - sum_j(dy_j * y_j)), and 0 where x does not reach y
//            (masked or dropped positions), which is the exact gradient of the forward.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

enum class SoftmaxMask : int { kNone, kPadding, kCausal, kCausalBottomRight };

// The logits written by the padding mask (TE's value; exp(-10000 - max) is 0 in fp32
// unless the whole row is masked).
constexpr float kSoftmaxMaskedLogit = -10000.0f;

struct SoftmaxShape {
  SoftmaxMask mask_kind = SoftmaxMask::kNone;
  DType dtype = DType::kFloat32;  // of x, y, dy, dx
  int64_t batch = 0;
  int64_t heads = 1;
  int64_t sq = 0;
  int64_t sk = 0;
  double scale = 1.0;
  // kPadding only: bytes (non-zero = masked out) addressed, for batch b, head h, query i,
  // key j, as mask[b * mask_batch_stride + h * mask_head_stride + i * mask_row_stride + j]
  // (a stride of 0 broadcasts that dimension).
  const uint8_t* mask = nullptr;
  int64_t mask_batch_stride = 0;
  int64_t mask_head_stride = 0;
  int64_t mask_row_stride = 0;

  int64_t rows() const { return batch * heads * sq; }
};

struct SoftmaxFwdParams {
  SoftmaxShape shape;
  const void* x = nullptr;  // [batch, heads, sq, sk]
  void* y = nullptr;        // [batch, heads, sq, sk]
  // Rows are split into num_chunks ranges, each with a row of fp32 (fp64) scratch that
  // holds the exponentials between the sum and the normalising pass. Set by
  // softmax_fwd_plan(); the workspace size depends on it.
  int64_t num_chunks = 1;
  void* workspace = nullptr;  // softmax_fwd_workspace_bytes(*this) bytes, 64-byte aligned
};

struct SoftmaxBwdParams {
  SoftmaxShape shape;
  const void* dy = nullptr;  // [batch, heads, sq, sk]
  const void* y = nullptr;   // the forward's output
  void* dx = nullptr;
};

void softmax_fwd_plan(SoftmaxFwdParams& params, const ThreadPool& pool);
size_t softmax_fwd_workspace_bytes(const SoftmaxFwdParams& params);
void softmax_fwd(const SoftmaxFwdParams& params, const ThreadPool& pool);
void softmax_bwd(const SoftmaxBwdParams& params, const ThreadPool& pool);

}  // namespace te_kernels
