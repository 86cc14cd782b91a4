// Cross-entropy of logits [rows, vocab] against integer targets, loss and gradient in one
// pass over the logits (torch.nn.functional.cross_entropy semantics, class dim last).
//
// With lse = log(sum_c exp(x_c)), label smoothing eps and target t:
//   loss  = (1 - eps) * (lse - x_t) + eps * (lse - mean_c x_c)
//   dloss/dx_c = softmax(x)_c - (1 - eps) * [c == t] - eps / vocab
// Rows whose target is ignore_index have loss 0 and a zero gradient row.
//
// Per row the kernel needs only four partials, all relative to the row max m = max_c x_c so
// that m never absorbs the small terms: m, s = sum_c exp(x_c - m), sum_c (x_c - m) and
// x_t - m; then loss = (1 - eps) * (log s - (x_t - m)) + eps * (log s - mean_c (x_c - m)).
// They combine across vocabulary shards (each shard's partials shifted to the global max M:
// s_i * exp(m_i - M), sum_i + n_i * (m_i - M), (x_t - m_i) + (m_i - M)), which is what a
// vocabulary-parallel version would exchange.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

struct CrossEntropyFwdParams {
  int64_t rows = 0;
  int64_t vocab = 0;
  DType dtype = DType::kFloat32;   // of logits and grad
  const void* logits = nullptr;    // [rows, vocab]
  const int64_t* target = nullptr; // [rows], each in [0, vocab) or == ignore_index
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  void* loss = nullptr;            // [rows], fp32 (fp64 for fp64 logits)
  void* grad = nullptr;            // [rows, vocab] dloss_row/dlogits in dtype; null: loss only
  // grad is written times this: the factor a reduction after the op applies to every row
  // (1 / kept tokens for a mean), so a backward whose loss gradients are exactly that factor
  // has nothing left to do, and the gradient is rounded to dtype once instead of twice.
  double grad_scale = 1.0;
  // Or one factor per row (fp32, fp64 for fp64 logits; [rows]), which replaces grad_scale:
  // the upstream gradient of an unreduced loss, so that the gradient is scaled in fp32 and
  // rounded to dtype once (scaling an already rounded bf16 gradient rounds it twice).
  const void* grad_scale_rows = nullptr;
  // Row chunks, each with a row of fp32 (fp64) scratch holding exp(x - max) between the
  // sum and the gradient pass. Set by cross_entropy_fwd_plan().
  int64_t num_chunks = 1;
  void* workspace = nullptr;       // cross_entropy_fwd_workspace_bytes(*this) bytes, 64-byte aligned
};

// grad_logits[r, :] = grad[r, :] * grad_loss[r]: the chain rule through the per-row loss.
struct CrossEntropyBwdParams {
  int64_t rows = 0;
  int64_t vocab = 0;
  DType dtype = DType::kFloat32;     // of grad and grad_logits
  const void* grad = nullptr;        // [rows, vocab], saved by the forward
  const void* grad_loss = nullptr;   // [rows], fp32 (fp64 for fp64 grad)
  void* grad_logits = nullptr;       // [rows, vocab]
};

// The first row whose target is neither in [0, vocab) nor ignore_index, or -1.
int64_t cross_entropy_first_bad_target(const int64_t* target, int64_t rows, int64_t vocab, int64_t ignore_index);

void cross_entropy_fwd_plan(CrossEntropyFwdParams& params, const ThreadPool& pool);
size_t cross_entropy_fwd_workspace_bytes(const CrossEntropyFwdParams& params);
void cross_entropy_fwd(const CrossEntropyFwdParams& params, const ThreadPool& pool);
void cross_entropy_bwd(const CrossEntropyBwdParams& params, const ThreadPool& pool);

}  // namespace te_kernels
