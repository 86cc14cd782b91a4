// Fused (flash) attention on the CPU: softmax(scale * q k^T + alibi, masked) v without ever
// holding the [sq, skv] scores, forward and backward.
//
// Blocked online softmax (FlashAttention-2's order): each block of kAttentionBlockQ query rows
// walks the blocks of kAttentionBlockKv keys its mask can reach, keeping per row the running
// max m, the running sum l of exp(s - m) and the unnormalised output; blocks the mask drops
// entirely are never computed. The forward saves the log-sum-exp lse = m + log(l) (fp32) for
// the backward, which recomputes P = exp(s - lse) block by block. Every product is an fp32 FMA
// on operands widened to fp32 once, as they are packed; one rounding to the output dtype.
//
// Which keys a query sees (TE's alignment, attention/masks.py): sequence i has lq_i queries and
// lkv_i keys (seqlens_q / seqlens_kv, or max_sq / max_skv when null). Query t sits at key
// position pos = t + (lkv_i - lq_i) when bottom_right, else pos = t. It attends keys
// j in [pos - window_left, pos + window_right] (a negative bound is unlimited) within
// [0, lkv_i); a causal mask is window_right = 0. The logit of (t, j) is
//   s = cap(scale * q.k) - slope_h * |pos - j| + bias[i, h, t, j],  cap(x) = softcap * tanh(x / softcap)
// (no cap when softcap is 0; ALiBi and the bias are TE's post-scale bias), -inf where the
// dense mask is set. With a sink (softmax_offset, TE's softmax_type 'off-by-one' /
// 'learnable'), exp(offset_h) joins every row's denominator and attends to nothing. With
// dropout p, each probability is kept with probability 1 - p and scaled by 1 / (1 - p), the
// draw a function of (seed, offset, sequence, head, t, j) alone (dropout_keep() below), so the
// backward draws the same mask again. A query that sees no key gets a zero output, lse = -inf
// (offset_h with a sink), and passes no gradient.
//
// Layout of every tensor argument (q, k, v, out, the gradients; lse without the channel):
// element (sequence i, head h, token t, channel c) lies at
//   base + i * batch + h * head + (start_i + t) * token + c
// (strides in elements, start_i from starts_q / starts_kv, 0 when null). [b, h, s, d] tensors
// of any stride order have no starts; packed thd tensors [tokens, h, d] have batch = 0 and the
// sequences' first tokens in starts (cu_seqlens, or cu_seqlens_padded with gaps between).
// Channels are contiguous. GQA / MQA: query head h reads key/value head h / (heads / kv_heads).
//
// The kernels write only the rows inside sequences (t < lq_i, j < lkv_i): the caller hands in
// outputs and gradients already zeroed and lse filled with -inf (bindings/attention_ops.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"
#include "te_kernels/parallel.h"
#include "te_kernels/philox.h"

namespace te_kernels {

// Query rows and keys per block: a block's scores (64 x 64 fp32, 16 KiB), its packed queries
// and its output rows (64 x head_dim each) stay in L2 while the block walks the keys.
constexpr int64_t kAttentionBlockQ = 64;
constexpr int64_t kAttentionBlockKv = 64;
// Largest head dim the kernels take (a block's packed operands must stay in L2).
constexpr int64_t kAttentionMaxHeadDim = 1024;

struct AttentionStrides {
  int64_t batch = 0, head = 0, token = 0;
};

// A dense [b | 1, h | 1, sq, skv] operand of a [b, h, s, d] call (no packed sequences):
// element (sequence i, head h, query t, key j) at i * batch + h * head + t * row + j; a stride
// of 0 broadcasts that dim.
struct AttentionDenseStrides {
  int64_t batch = 0, head = 0, row = 0;
};

// FP8 attention (TE's fp8_dpa), emulated exactly. q, k and v (and the backward's out and
// grad_out) hold the values of FP8 codes, which every input dtype holds exactly; the caller
// folds their scale_invs into `scale` and the factors below, each applied once to an fp32 sum
// of exact products of code values. The probabilities P = exp(s - lse), normalised and
// dropped out, are quantised to E4M3 (P * probs_scale, saturating, to nearest even) before
// O = P V, so the forward runs twice over the keys: the first pass finds every row's lse, the
// second forms P and O. The backward recomputes the same P codes for dV and quantises dL/ds
// (G, before the softmax scale) before dQ and dK. out and the gradients are fp32 (whatever
// q's dtype): the caller rounds them once, in their own FP8 casts or to its dtype. With a cap
// on the logits (softcap) there is no FP8 attention, nor with flash-decoding's split (the
// forward keeps one task per block).
struct AttentionFp8 {
  bool enabled = false;
  float probs_scale = 1.0f;  // P's codes: e4m3(P * probs_scale)
  // Forward: out = out_factor * sum P_code v_code.
  float out_factor = 1.0f;
  // Backward: D = delta_factor * sum dO_code out_code, dP = dp_factor * sum dO_code v_code,
  // G = P (dP Z - D), G's codes grad_scores_format(G * grad_scores_scale);
  // dV = dv_factor * sum P_code dO_code, dQ = dq_factor * sum G_code k_code,
  // dK = dk_factor * sum G_code q_code (the softmax scale inside dq_factor and dk_factor).
  Fp8Format grad_scores_format = Fp8Format::kE5M2;
  float grad_scores_scale = 1.0f;
  float delta_factor = 1.0f, dp_factor = 1.0f, dv_factor = 1.0f, dq_factor = 1.0f, dk_factor = 1.0f;
  // Outputs: the forward's max of P (after dropout's scaling), the backward's max |G|, over
  // every entry the masks let through (0 where none is).
  float* probs_amax = nullptr;
  float* grad_scores_amax = nullptr;
};

struct AttentionShape {
  DType dtype = DType::kFloat32;  // of q, k, v, out and the gradients: float32, bfloat16 or float16
  int64_t batch = 0, heads = 0, kv_heads = 0;  // kv_heads divides heads
  int64_t max_sq = 0, max_skv = 0;             // the longest sequences (all of them when seqlens_* are null)
  int64_t head_dim_qk = 0, head_dim_v = 0;
  const int64_t* seqlens_q = nullptr;  // [batch] each in [0, max_sq], or null
  const int64_t* seqlens_kv = nullptr;
  const int64_t* starts_q = nullptr;  // [batch] first token of each sequence, or null (0)
  const int64_t* starts_kv = nullptr;
  float scale = 1.0f;
  int64_t window_left = -1, window_right = -1;
  bool bottom_right = false;
  const float* alibi_slopes = nullptr;  // [batch or 1][heads], or null
  int64_t alibi_batch_stride = 0;       // heads when slopes are per sequence, else 0
  float softcap = 0.0f;                 // > 0 caps the scaled logits (tanh), 0: no cap
  const void* bias = nullptr;           // q's dtype, or null
  AttentionDenseStrides bias_strides;
  const uint8_t* mask = nullptr;  // nonzero: the key is masked out (TE's convention), or null
  AttentionDenseStrides mask_strides;
  const float* softmax_offset = nullptr;  // [heads] the sinks' logits, or null (plain softmax)
  float dropout = 0.0f;                   // in [0, 1)
  uint64_t dropout_seed = 0, dropout_offset = 0;
  // A paged KV cache (forward only): k and v are pools of pages, [pages * page_size] token rows
  // (batch stride 0, no starts_kv); key j of sequence i is token
  // page_table[i * page_table_stride + j / page_size] * page_size + j % page_size.
  const int32_t* page_table = nullptr;
  int64_t page_table_stride = 0, page_size = 0;
  AttentionFp8 fp8;
};

// Dropout's draw (Philox4x32-10, the counter-based generator of Salmon et al., SC'11): key
// = seed; counter = (j / 4, row, offset low, offset high) with row = (i * heads + h) * max_sq
// + t, so the four keys j of a group share one call and lane j % 4 is theirs. The key is
// dropped when (word >> 8) * 2^-24 < p: 24 uniform bits. reference/attention.py draws the same.

struct AttentionFwdParams {
  AttentionShape shape;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  AttentionStrides q_strides, k_strides, v_strides;
  void* out = nullptr;
  AttentionStrides out_strides;
  // One per query row (its token stride steps rows), in fp64: the backward recomputes
  // P = exp(s - lse) with no rounding of lse (attention_kernels.h says why).
  double* lse = nullptr;
  AttentionStrides lse_strides;
  // Optional, laid out as lse: each row's largest logit (-inf where it sees no key), the
  // statistic behind TE's return_max_logit.
  float* row_max = nullptr;
  void* workspace = nullptr;  // attention_fwd_workspace_bytes() bytes, 64-byte aligned
};

struct AttentionBwdParams {
  AttentionShape shape;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const void* grad_out = nullptr;
  const double* lse = nullptr;
  AttentionStrides q_strides, k_strides, v_strides, out_strides, grad_out_strides, lse_strides;
  void* grad_q = nullptr;
  void* grad_k = nullptr;
  void* grad_v = nullptr;
  AttentionStrides grad_q_strides, grad_k_strides, grad_v_strides;
  // Optional: dL/ds of every logit, fp32 [b, h, sq, skv] (the caller sums it over the bias's
  // broadcast dims); only the entries the mask lets through are written.
  float* grad_bias = nullptr;
  AttentionDenseStrides grad_bias_strides;
  // With a sink: [batch][heads], sequence i's share of dL/d offset_h (the caller adds them).
  double* grad_softmax_offset = nullptr;
  void* workspace = nullptr;  // attention_bwd_workspace_bytes() bytes, 64-byte aligned
};

// The workspaces grow with the head dims, the longest sequences and the pool's thread count,
// never with sq * skv.
size_t attention_fwd_workspace_bytes(const AttentionShape& shape, const ThreadPool& pool);
size_t attention_bwd_workspace_bytes(const AttentionShape& shape, const ThreadPool& pool);

// The binding (bindings/attention_ops.cpp) checks every argument first; debug builds assert
// what the kernels assume.
// Queries that fit one block per (sequence, head), in few such tasks (decoding), split the keys
// over more tasks and combine the parts (flash-decoding); the split follows the shape alone.
void attention_fwd(const AttentionFwdParams& params, const ThreadPool& pool);
// Deterministic whatever the thread count: every gradient element is summed by one task in a
// fixed order. One task per (sequence, query head) accumulates its dq and its head's share of
// dk and dv; with GQA the shares of a key/value head's query heads are added in head order.
void attention_bwd(const AttentionBwdParams& params, const ThreadPool& pool);

}  // namespace te_kernels
