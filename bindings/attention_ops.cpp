// The flash-attention ops' binding: their schemas and CPU kernels (Tensor ->
// te_kernels::Attention*Params, every argument checked first; the checks read cu_seqlens, which
// live on the CPU like the tensors themselves).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "aten_thread_pool.h"
#include "te_kernels/attention.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // Flash attention (kernels/include/te_kernels/attention.h): out = dropout(softmax(logits,
  // masked, sink)) v, per head, never holding the scores. q [b, h, sq, dk], k [b, g, skv, dk],
  // v [b, g, skv, dv] (g divides h: query head i reads key/value head i / (h / g)), or packed
  // q [tq, h, dk], k / v [tkv, g, d] with cu_seqlens_q / cu_seqlens_kv [b + 1] (required) and
  // cu_seqlens_*_padded [b + 1] where sequences start; padded tensors take cu_seqlens for their
  // lengths. Query t of a sequence sits at key position t (+ lkv - lq when bottom_right) and
  // sees keys [pos - window_left, pos + window_right] (-1: unlimited) not set in mask (bool
  // [b | 1, h | 1, sq, skv], True = masked out). logits = cap(scale q k^T) + ALiBi + bias:
  // cap(x) = softcap tanh(x / softcap) (softcap 0: none), alibi_slopes fp32 [h] or [b, h] add
  // -slope |pos - key|, bias (q's dtype, [b | 1, h | 1, sq, skv]) is added; mask and bias only
  // with [b, h, s, d] tensors. softmax_offset fp32 [h]: each head's sink logit joins the
  // denominator. dropout p in [0, 1) draws from the header's Philox keyed by dropout_rng
  // (int64 [2] on the host: seed, offset; required when p > 0, so that the backward draws the
  // same mask again and torch.compile sees the draw as a tensor). page_table int32 [>= b, pages]
  // (forward only): k, v are a paged KV cache [pages, page_size, g, d], key j of sequence i in
  // page page_table[i, j / page_size], its lengths in cu_seqlens_kv (required). out has q's
  // layout with dv channels; lse fp64 [b, h, sq] or [tq, h] (-inf and a zero output row where
  // the denominator is empty); max_logit fp32 [h], the largest logit of each head, when
  // return_max_logit (else empty). The backward's grad_bias has bias's shape
  // and dtype when bias_grad (else empty); grad_softmax_offset fp32 [h] with a sink (else empty).
  m.def(
      "flash_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv,"
      " Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded, Tensor? alibi_slopes, Tensor? bias,"
      " Tensor? mask, Tensor? softmax_offset, Tensor? dropout_rng, Tensor? page_table, float scale, int window_left,"
      " int window_right, bool bottom_right, float softcap, float dropout, bool return_max_logit)"
      " -> (Tensor out, Tensor lse, Tensor max_logit)");
  m.def(
      "flash_attention_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,"
      " Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded,"
      " Tensor? alibi_slopes, Tensor? bias, Tensor? mask, Tensor? softmax_offset, Tensor? dropout_rng,"
      " Tensor? page_table, float scale, int window_left, int window_right, bool bottom_right, float softcap,"
      " float dropout, bool bias_grad) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor grad_bias,"
      " Tensor grad_softmax_offset)");
  // FP8 attention (te_kernels::AttentionFp8), TE's fp8_dpa emulated exactly: the ops above on
  // q, k, v (and out, grad_out) holding the values of FP8 codes (any of the three dtypes holds
  // them exactly), with no softcap. fp8_scales fp32 on the host: the forward's
  // (q_scale_inv, k_scale_inv, v_scale_inv, probs_scale, probs_scale_inv); the backward's
  // (q_scale_inv, k_scale_inv, v_scale_inv, out_scale_inv, grad_out_scale_inv, probs_scale,
  // probs_scale_inv, grad_scores_scale, grad_scores_scale_inv). P's codes are E4M3, G's
  // (dL/dlogits) E4M3 (grad_scores_format 0) or E5M2 (1). out and the gradients are fp32
  // (the caller rounds them once, in its FP8 casts). Each sum of code products takes one
  // fp32 factor, the product of its scales from left to right: logits scale * q_si * k_si,
  // out probs_si * v_si, D grad_out_si * out_si, dP grad_out_si * v_si, dV probs_si *
  // grad_out_si, dQ scale * grad_scores_si * k_si, dK scale * grad_scores_si * q_si.
  // probs_amax fp32 [1]: the max of P (after dropout's scaling); grad_scores_amax: max |G|.
  m.def(
      "flash_attention_fp8_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv,"
      " Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded, Tensor? alibi_slopes, Tensor? bias,"
      " Tensor? mask, Tensor? softmax_offset, Tensor? dropout_rng, Tensor? page_table, float scale, int window_left,"
      " int window_right, bool bottom_right, float dropout, bool return_max_logit, Tensor fp8_scales)"
      " -> (Tensor out, Tensor lse, Tensor max_logit, Tensor probs_amax)");
  m.def(
      "flash_attention_fp8_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,"
      " Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded,"
      " Tensor? alibi_slopes, Tensor? bias, Tensor? mask, Tensor? softmax_offset, Tensor? dropout_rng,"
      " Tensor? page_table, float scale, int window_left, int window_right, bool bottom_right, float dropout,"
      " bool bias_grad, Tensor fp8_scales, int grad_scores_format) -> (Tensor grad_q, Tensor grad_k,"
      " Tensor grad_v, Tensor grad_bias, Tensor grad_softmax_offset, Tensor grad_scores_amax)");
}

namespace portable_te {
namespace {

using OptionalTensor = std::optional<at::Tensor>;

// What the sequence arguments say: per sequence its query / key lengths and, packed, where its
// tokens start. Empty vectors: every sequence is full (max_sq / max_skv).
struct Sequences {
  std::vector<int64_t> lq, lkv, start_q, start_kv;
  int64_t max_sq = 0, max_skv = 0;
};

// cu_seqlens* as int64 values, after the dtype, rank, device and length checks.
std::vector<int64_t> index_values(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& q,
                                  int64_t entries) {
  check_same_device(op, arg, t, "q", q);
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", arg,
                    " must be int32 or int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == entries, op, ": ", arg, " must be 1-D with ", entries,
                    " entries (sequences + 1), got shape ", t.sizes());
  const at::Tensor values = t.to(at::kLong).contiguous();
  const int64_t* data = values.const_data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + entries);
}

// Lengths from cu_seqlens (starting at 0, non-decreasing); packed, the starts from
// cu_seqlens_padded when given (each slot holding its sequence) and every sequence inside the
// `tokens` rows of the packed tensor; padded, each length at most `rows`.
void read_side(const char* op, const char* side, const at::Tensor& q, const OptionalTensor& cu_arg,
               const OptionalTensor& padded_arg, int64_t batch, bool packed, int64_t rows,
               std::vector<int64_t>& lengths, std::vector<int64_t>& starts, int64_t& longest) {
  const std::string cu_name = std::string("cu_seqlens_") + side, padded_name = cu_name + "_padded";
  if (!cu_arg.has_value()) {
    TORCH_CHECK_VALUE(!padded_arg.has_value(), op, ": ", padded_name, " needs ", cu_name);
    longest = rows;
    return;
  }
  const std::vector<int64_t> cu = index_values(op, cu_name.c_str(), *cu_arg, q, batch + 1);
  TORCH_CHECK_VALUE(cu[0] == 0, op, ": ", cu_name, " must start at 0, got ", cu[0]);
  std::vector<int64_t> slot = cu;
  if (padded_arg.has_value()) {
    TORCH_CHECK_VALUE(packed, op, ": ", padded_name, " is only meaningful for packed (3-D) q, k, v");
    slot = index_values(op, padded_name.c_str(), *padded_arg, q, batch + 1);
  }
  longest = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t length = cu[i + 1] - cu[i];
    TORCH_CHECK_VALUE(length >= 0, op, ": ", cu_name, " must be non-decreasing, but ", cu_name, "[", i + 1,
                      "] = ", cu[i + 1], " < ", cu_name, "[", i, "] = ", cu[i]);
    if (packed) {
      TORCH_CHECK_VALUE(slot[i] >= 0 && slot[i + 1] - slot[i] >= length && slot[i] + length <= rows, op,
                        ": sequence ", i, " of ", side, " (", length, " tokens from token ", slot[i],
                        ") does not fit its slot of the ", rows, " packed tokens");
      starts.push_back(slot[i]);
    } else {
      TORCH_CHECK_VALUE(length <= rows, op, ": sequence ", i, " of ", side, " has ", length,
                        " tokens, more than the ", rows, " rows of the padded tensor");
    }
    lengths.push_back(length);
    longest = std::max(longest, length);
  }
}

// The arguments after q, k, v that both ops take, in the schema's order.
struct AttentionArgs {
  const OptionalTensor& cu_seqlens_q;
  const OptionalTensor& cu_seqlens_kv;
  const OptionalTensor& cu_seqlens_q_padded;
  const OptionalTensor& cu_seqlens_kv_padded;
  const OptionalTensor& alibi_slopes;
  const OptionalTensor& bias;
  const OptionalTensor& mask;
  const OptionalTensor& softmax_offset;
  const OptionalTensor& dropout_rng;
  const OptionalTensor& page_table;
  double scale;
  int64_t window_left, window_right;
  bool bottom_right;
  double softcap, dropout;
};

// The tensors the kernel reads through AttentionShape's pointers, held contiguous (channels,
// or keys of the dense operands) for the call; sequence lengths and starts in `seqs`.
struct HeldOperands {
  Sequences seqs;
  at::Tensor slopes, bias, mask, softmax_offset, page_table;
};

at::Tensor unit_channel_stride(const at::Tensor& t) { return t.size(-1) == 1 || t.stride(-1) == 1 ? t : t.contiguous(); }

// A dense [b | 1, h | 1, sq, skv] operand's checks and strides (0 where it broadcasts).
te_kernels::AttentionDenseStrides dense_operand(const char* op, const char* arg, const at::Tensor& t,
                                                const at::Tensor& q, const at::Tensor& k) {
  check_same_device(op, arg, t, "q", q);
  TORCH_CHECK_VALUE(q.dim() == 4, op, ": ", arg, " needs [batch, heads, sq, head_dim] q, k, v, not packed ones");
  const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), skv = k.size(2);
  TORCH_CHECK_VALUE(t.dim() == 4 && (t.size(0) == 1 || t.size(0) == b) && (t.size(1) == 1 || t.size(1) == h) &&
                        t.size(2) == sq && t.size(3) == skv,
                    op, ": ", arg, " must be [1 or batch, 1 or heads, sq, skv] = [1 or ", b, ", 1 or ", h, ", ", sq,
                    ", ", skv, "], got shape ", t.sizes());
  return {t.size(0) == 1 ? 0 : t.stride(0), t.size(1) == 1 ? 0 : t.stride(1), t.stride(2)};
}

// page_table's checks (int32 [>= batch, pages per sequence], on q's device) and the pools' layout:
// each k / v page follows the previous one (stride(0) = page_size * stride(1)), so that a page's
// tokens are token rows of the pool.
void read_paging(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& page_table, int64_t batch, at::Tensor& held, te_kernels::AttentionShape& s) {
  check_same_device(op, "page_table", page_table, "q", q);
  check_dtype(op, "page_table", page_table, at::kInt);
  TORCH_CHECK_VALUE(page_table.dim() == 2 && page_table.size(0) >= batch, op,
                    ": page_table must be [batch or more, pages per sequence] with batch = ", batch, ", got shape ",
                    page_table.sizes());
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"k", k}, {"v", v}}) {
    TORCH_CHECK_VALUE(t.size(0) <= 1 || t.stride(0) == t.size(1) * t.stride(1), op, ": the pages of ", name,
                      " must follow each other (stride(0) = page_size * stride(1)), got strides ", t.strides());
  }
  held = page_table.contiguous();
  s.page_table = held.const_data_ptr<int32_t>();
  s.page_table_stride = held.size(1);
}

// Every page a sequence's keys use is a page of the pool.
void check_pages_in_use(const char* op, const at::Tensor& page_table, const std::vector<int64_t>& lengths,
                        int64_t page_size, int64_t pages) {
  const int32_t* table = page_table.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < int64_t(lengths.size()); ++i) {
    for (int64_t n = 0; n < (lengths[i] + page_size - 1) / page_size; ++n) {
      const int32_t page = table[i * page_table.size(1) + n];
      TORCH_CHECK_VALUE(page >= 0 && page < pages, op, ": page_table[", i, ", ", n, "] = ", page,
                        " is not one of the cache's ", pages, " pages");
    }
  }
}

// Checks q, k, v and the other arguments, and describes them to the kernel.
te_kernels::AttentionShape attention_shape(const char* op, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const AttentionArgs& a, HeldOperands& held) {
  te_kernels::AttentionShape s;
  Sequences& seqs = held.seqs;
  s.dtype = high_precision_dtype(op, "q", q.scalar_type());
  check_same_device(op, "k", k, "q", q);
  check_same_device(op, "v", v, "q", q);
  check_dtype(op, "k", k, q.scalar_type());
  check_dtype(op, "v", v, q.scalar_type());
  TORCH_CHECK_VALUE(q.dim() == 4 || q.dim() == 3, op,
                    ": q must be [batch, heads, sq, head_dim] or packed [tokens, heads, head_dim], got shape ",
                    q.sizes());
  const bool paged = a.page_table.has_value();
  if (paged) {
    TORCH_CHECK_VALUE(k.dim() == 4 && v.dim() == 4, op,
                      ": with page_table, k and v are a paged cache [pages, page_size, kv_heads, head_dim], got k ",
                      k.sizes(), ", v ", v.sizes());
  } else {
    TORCH_CHECK_VALUE(k.dim() == q.dim() && v.dim() == q.dim(), op, ": k and v must be ", q.dim(),
                      "-D like q, got k ", k.sizes(), ", v ", v.sizes());
  }
  const bool packed = q.dim() == 3;
  TORCH_CHECK_VALUE(k.sizes().slice(0, k.dim() - 1) == v.sizes().slice(0, v.dim() - 1), op, ": k ", k.sizes(),
                    " and v ", v.sizes(), " must agree in all but the head dim");
  TORCH_CHECK_VALUE(packed || paged || k.size(0) == q.size(0), op, ": q ", q.sizes(), " and k ", k.sizes(),
                    " must have the same batch");
  TORCH_CHECK_VALUE(k.size(-1) == q.size(-1), op, ": k's head dim ", k.size(-1), " differs from q's ", q.size(-1));
  s.heads = q.size(1);
  s.kv_heads = paged ? k.size(2) : k.size(1);
  TORCH_CHECK_VALUE(s.kv_heads > 0 && s.heads % s.kv_heads == 0, op, ": the key/value heads of k ", k.sizes(),
                    " must divide the query heads of q ", q.sizes());
  s.head_dim_qk = q.size(-1);
  s.head_dim_v = v.size(-1);
  TORCH_CHECK_VALUE(s.head_dim_qk >= 1 && s.head_dim_qk <= te_kernels::kAttentionMaxHeadDim && s.head_dim_v >= 1 &&
                        s.head_dim_v <= te_kernels::kAttentionMaxHeadDim,
                    op, ": head dims must be in [1, ", te_kernels::kAttentionMaxHeadDim, "], got q ", q.sizes(), ", v ",
                    v.sizes());
  TORCH_CHECK_VALUE(a.window_left >= -1 && a.window_right >= -1, op,
                    ": window bounds must be -1 (unlimited) or >= 0, got (", a.window_left, ", ", a.window_right, ")");
  if (packed) {
    TORCH_CHECK_VALUE(a.cu_seqlens_q.has_value() && a.cu_seqlens_kv.has_value(), op,
                      ": packed (3-D) q, k, v need cu_seqlens_q and cu_seqlens_kv");
    s.batch = a.cu_seqlens_q->dim() == 1 ? a.cu_seqlens_q->size(0) - 1 : 0;
    TORCH_CHECK_VALUE(s.batch >= 0, op, ": cu_seqlens_q needs at least one entry (0), got shape ",
                      a.cu_seqlens_q->sizes());
  } else {
    s.batch = q.size(0);
  }
  read_side(op, "q", q, a.cu_seqlens_q, a.cu_seqlens_q_padded, s.batch, packed, packed ? q.size(0) : q.size(2),
            seqs.lq, seqs.start_q, seqs.max_sq);
  if (paged) {
    TORCH_CHECK_VALUE(a.cu_seqlens_kv.has_value(), op, ": a paged cache needs cu_seqlens_kv (each sequence's length)");
    s.page_size = k.size(1);
    read_paging(op, q, k, v, *a.page_table, s.batch, held.page_table, s);
  }
  const int64_t kv_rows = paged ? s.page_table_stride * s.page_size : packed ? k.size(0) : k.size(2);
  read_side(op, "kv", q, a.cu_seqlens_kv, a.cu_seqlens_kv_padded, s.batch, packed && !paged, kv_rows, seqs.lkv,
            seqs.start_kv, seqs.max_skv);
  if (paged) check_pages_in_use(op, held.page_table, seqs.lkv, s.page_size, k.size(0));
  TORCH_CHECK_VALUE(seqs.lq.empty() == seqs.lkv.empty(), op,
                    ": give both cu_seqlens_q and cu_seqlens_kv, or neither");
  s.max_sq = seqs.max_sq;
  s.max_skv = seqs.max_skv;
  if (!seqs.lq.empty()) {
    s.seqlens_q = seqs.lq.data();
    s.seqlens_kv = seqs.lkv.data();
  }
  if (packed) {
    s.starts_q = seqs.start_q.data();
    if (!paged) s.starts_kv = seqs.start_kv.data();
  }
  s.scale = float(a.scale);
  s.window_left = a.window_left;
  s.window_right = a.window_right;
  s.bottom_right = a.bottom_right;
  if (a.alibi_slopes.has_value()) {
    const at::Tensor& slopes = *a.alibi_slopes;
    check_same_device(op, "alibi_slopes", slopes, "q", q);
    check_dtype(op, "alibi_slopes", slopes, at::kFloat);
    const bool per_head = slopes.dim() == 1 && slopes.size(0) == s.heads;
    const bool per_sequence = slopes.dim() == 2 && slopes.size(0) == s.batch && slopes.size(1) == s.heads;
    TORCH_CHECK_VALUE(per_head || per_sequence, op, ": alibi_slopes must be [heads] = [", s.heads,
                      "] or [batch, heads] = [", s.batch, ", ", s.heads, "], got shape ", slopes.sizes());
    s.alibi_batch_stride = per_sequence ? s.heads : 0;
    held.slopes = slopes.contiguous();
    s.alibi_slopes = held.slopes.const_data_ptr<float>();
  }
  TORCH_CHECK_VALUE(!paged || (!a.bias.has_value() && !a.mask.has_value()), op,
                    ": bias and mask need contiguous k and v, not a paged cache");
  if (a.bias.has_value()) {
    check_dtype(op, "bias", *a.bias, q.scalar_type());
    held.bias = unit_channel_stride(*a.bias);
    s.bias_strides = dense_operand(op, "bias", held.bias, q, k);
    s.bias = held.bias.const_data_ptr();
  }
  if (a.mask.has_value()) {
    check_dtype(op, "mask", *a.mask, at::kBool);
    held.mask = unit_channel_stride(*a.mask);
    s.mask_strides = dense_operand(op, "mask", held.mask, q, k);
    s.mask = reinterpret_cast<const uint8_t*>(held.mask.const_data_ptr<bool>());
  }
  if (a.softmax_offset.has_value()) {
    const at::Tensor& offset = *a.softmax_offset;
    check_same_device(op, "softmax_offset", offset, "q", q);
    check_dtype(op, "softmax_offset", offset, at::kFloat);
    check_shape(op, "softmax_offset", offset, {s.heads}, "one sink logit per query head");
    held.softmax_offset = offset.contiguous();
    s.softmax_offset = held.softmax_offset.const_data_ptr<float>();
  }
  TORCH_CHECK_VALUE(std::isfinite(a.softcap) && a.softcap >= 0.0, op,
                    ": softcap must be 0 (no cap) or a positive number, got ", a.softcap);
  s.softcap = float(a.softcap);
  TORCH_CHECK_VALUE(a.dropout >= 0.0 && a.dropout < 1.0, op, ": dropout must be in [0, 1), got ", a.dropout);
  // Dropout's Philox counter holds a query row's index in 32 bits.
  TORCH_CHECK_VALUE(a.dropout == 0.0 || s.batch * s.heads * s.max_sq < (int64_t(1) << 32), op,
                    ": dropout takes at most 2^32 query rows (batch * heads * sq), got ", s.batch * s.heads * s.max_sq);
  s.dropout = float(a.dropout);
  if (a.dropout > 0.0) {
    TORCH_CHECK_VALUE(a.dropout_rng.has_value(), op, ": dropout ", a.dropout, " needs dropout_rng (seed, offset)");
    const at::Tensor& rng = *a.dropout_rng;
    check_same_device(op, "dropout_rng", rng, "q", q);
    check_dtype(op, "dropout_rng", rng, at::kLong);
    check_shape(op, "dropout_rng", rng, {2}, "(seed, offset)");
    const at::Tensor values = rng.contiguous();
    s.dropout_seed = uint64_t(values.const_data_ptr<int64_t>()[0]);
    s.dropout_offset = uint64_t(values.const_data_ptr<int64_t>()[1]);
  }
  return s;
}

// The strides of a [b, h, s, d] or packed [t, h, d] tensor whose channels are contiguous.
te_kernels::AttentionStrides strides_of(const at::Tensor& t) {
  if (t.dim() == 3) return {0, t.stride(1), t.stride(0)};
  return {t.stride(0), t.stride(1), t.stride(2)};
}

// A paged cache's pool [pages, page_size, g, d] as token rows (read_paging checked that they are).
te_kernels::AttentionStrides page_strides(const at::Tensor& t) { return {0, t.stride(2), t.stride(1)}; }

// lse [b, h, sq] or packed [tokens, h] (fp64): the strides the kernel indexes it by.
te_kernels::AttentionStrides lse_strides(const at::Tensor& lse) {
  if (lse.dim() == 2) return {0, lse.stride(1), lse.stride(0)};
  return {lse.stride(0), lse.stride(1), lse.stride(2)};
}

std::vector<int64_t> lse_shape(const at::Tensor& q) {
  if (q.dim() == 3) return {q.size(0), q.size(1)};
  return {q.size(0), q.size(1), q.size(2)};
}

std::vector<int64_t> out_shape(const at::Tensor& q, const at::Tensor& v) {
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
  shape.back() = v.size(-1);
  return shape;
}

// fp32 [h]: the largest of each head's rows' maxima (laid out as lse), -inf for a head with none.
at::Tensor max_over_rows(const at::Tensor& row_max) {
  const int64_t heads = row_max.size(1);
  if (row_max.numel() == 0) return at::full({heads}, -std::numeric_limits<float>::infinity(), row_max.options());
  return row_max.dim() == 2 ? row_max.amax({0}) : row_max.amax({0, 2});
}

// fp8_scales' checks (fp32 [entries] on the host, every entry finite and positive) and values.
std::vector<float> fp8_scales_of(const char* op, const at::Tensor& scales, int64_t entries) {
  TORCH_CHECK_VALUE(scales.device().is_cpu(), op, ": fp8_scales must be on the host (CPU), got ", scales.device());
  check_dtype(op, "fp8_scales", scales, at::kFloat);
  check_shape(op, "fp8_scales", scales, {entries}, "the scales and scale_invs the schema lists");
  const at::Tensor values = scales.contiguous();
  std::vector<float> out(values.const_data_ptr<float>(), values.const_data_ptr<float>() + entries);
  for (int64_t i = 0; i < entries; ++i) {
    TORCH_CHECK_VALUE(std::isfinite(out[i]) && out[i] > 0.0f, op, ": fp8_scales[", i,
                      "] must be finite and positive, got ", out[i]);
  }
  return out;
}

// What FP8 attention asks of the shape: no softcap, and the logits' factor with the
// scale_invs of q and k folded in.
void fp8_shape(const char* op, const std::vector<float>& scales, te_kernels::AttentionShape& s) {
  TORCH_CHECK_VALUE(s.softcap == 0.0f, op, ": FP8 attention takes no softcap, got ", s.softcap);
  s.scale = s.scale * scales[0] * scales[1];
  s.fp8.enabled = true;
}

}  // namespace

namespace {

// The forward of both ops; fp8_scales (the FP8 op's, checked) or null.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(const char* op, const at::Tensor& q_arg,
                                                                   const at::Tensor& k_arg, const at::Tensor& v_arg,
                                                                   const AttentionArgs& args, bool return_max_logit,
                                                                   const std::vector<float>* fp8_scales) {
  HeldOperands held;
  te_kernels::AttentionFwdParams p;
  p.shape = attention_shape(op, q_arg, k_arg, v_arg, args, held);
  at::Tensor probs_amax = at::empty({fp8_scales != nullptr ? 1 : 0}, q_arg.options().dtype(at::kFloat));
  if (fp8_scales != nullptr) {
    const std::vector<float>& f = *fp8_scales;  // q_si, k_si, v_si, probs_scale, probs_si
    fp8_shape(op, f, p.shape);
    p.shape.fp8.probs_scale = f[3];
    p.shape.fp8.out_factor = f[4] * f[2];
    probs_amax.zero_();
    p.shape.fp8.probs_amax = probs_amax.mutable_data_ptr<float>();
  }
  const at::Tensor q = unit_channel_stride(q_arg), k = unit_channel_stride(k_arg), v = unit_channel_stride(v_arg);
  // Rows outside every sequence stay zero (lse -inf): the kernel writes the rows inside them.
  // FP8 attention's out is fp32: its caller rounds it once (te_kernels::AttentionFp8).
  at::Tensor out = at::zeros(out_shape(q, v), q.options().dtype(fp8_scales != nullptr ? at::kFloat : q.scalar_type()));
  at::Tensor lse = at::full(lse_shape(q), -std::numeric_limits<double>::infinity(), q.options().dtype(at::kDouble));
  at::Tensor row_max = return_max_logit ? at::full(lse_shape(q), -std::numeric_limits<float>::infinity(),
                                                   q.options().dtype(at::kFloat))
                                        : at::Tensor();
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.q_strides = strides_of(q);
  p.k_strides = args.page_table.has_value() ? page_strides(k) : strides_of(k);
  p.v_strides = args.page_table.has_value() ? page_strides(v) : strides_of(v);
  p.out = out.mutable_data_ptr();
  p.out_strides = strides_of(out);
  p.lse = lse.mutable_data_ptr<double>();
  p.lse_strides = lse_strides(lse);
  p.row_max = return_max_logit ? row_max.mutable_data_ptr<float>() : nullptr;
  const AtenThreadPool pool;
  const c10::DataPtr scratch = workspace(te_kernels::attention_fwd_workspace_bytes(p.shape, pool));
  p.workspace = scratch.get();
  te_kernels::attention_fwd(p, pool);
  at::Tensor max_logit = return_max_logit ? max_over_rows(row_max) : at::empty({0}, q.options().dtype(at::kFloat));
  return {out, lse, max_logit, probs_amax};
}

// The backward of both ops; fp8_scales (the FP8 op's, checked) or null.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const char* op, const at::Tensor& grad_out_arg, const at::Tensor& q_arg, const at::Tensor& k_arg,
    const at::Tensor& v_arg, const at::Tensor& out_arg, const at::Tensor& lse_arg, const AttentionArgs& args,
    bool bias_grad, const std::vector<float>* fp8_scales, te_kernels::Fp8Format grad_scores_format) {
  TORCH_CHECK_VALUE(!args.page_table.has_value(), op, ": a paged KV cache (page_table) has no backward: "
                    "decoding runs without gradients");
  HeldOperands held;
  te_kernels::AttentionBwdParams p;
  p.shape = attention_shape(op, q_arg, k_arg, v_arg, args, held);
  at::Tensor grad_scores_amax = at::empty({fp8_scales != nullptr ? 1 : 0}, q_arg.options().dtype(at::kFloat));
  if (fp8_scales != nullptr) {
    // q_si, k_si, v_si, out_si, grad_out_si, probs_scale, probs_si, grad_scores_scale, grad_scores_si
    const std::vector<float>& f = *fp8_scales;
    const float softmax_scale = float(args.scale);
    fp8_shape(op, f, p.shape);
    te_kernels::AttentionFp8& fp8 = p.shape.fp8;
    fp8.probs_scale = f[5];
    fp8.grad_scores_format = grad_scores_format;
    fp8.grad_scores_scale = f[7];
    fp8.delta_factor = f[4] * f[3];
    fp8.dp_factor = f[4] * f[2];
    fp8.dv_factor = f[6] * f[4];
    fp8.dq_factor = softmax_scale * f[8] * f[1];
    fp8.dk_factor = softmax_scale * f[8] * f[0];
    grad_scores_amax.zero_();
    fp8.grad_scores_amax = grad_scores_amax.mutable_data_ptr<float>();
  }
  const auto& bias = args.bias;
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"grad_out", grad_out_arg}, {"out", out_arg}}) {
    check_same_device(op, name, t, "q", q_arg);
    check_dtype(op, name, t, q_arg.scalar_type());
    check_shape(op, name, t, out_shape(q_arg, v_arg), "the attention output's shape");
  }
  check_same_device(op, "lse", lse_arg, "q", q_arg);
  check_dtype(op, "lse", lse_arg, at::kDouble);
  check_shape(op, "lse", lse_arg, lse_shape(q_arg), "one log-sum-exp per query row");
  TORCH_CHECK_VALUE(!bias_grad || bias.has_value(), op, ": bias_grad needs a bias");
  const at::Tensor q = unit_channel_stride(q_arg), k = unit_channel_stride(k_arg), v = unit_channel_stride(v_arg);
  const at::Tensor out = unit_channel_stride(out_arg), grad_out = unit_channel_stride(grad_out_arg);
  const at::Tensor lse = lse_arg;
  // FP8 attention's gradients are fp32, as its out.
  const auto grad_options = q.options().dtype(fp8_scales != nullptr ? at::kFloat : q.scalar_type());
  at::Tensor grad_q = at::zeros(q.sizes(), grad_options);
  at::Tensor grad_k = at::zeros(k.sizes(), grad_options);
  at::Tensor grad_v = at::zeros(v.sizes(), grad_options);
  // dL/dlogits of every (sequence, head), then summed over the bias's broadcast dims.
  at::Tensor grad_logits = bias_grad ? at::zeros({q.size(0), q.size(1), q.size(2), k.size(2)}, q.options().dtype(at::kFloat))
                                     : at::Tensor();
  at::Tensor sink_shares = args.softmax_offset.has_value() ? at::zeros({p.shape.batch, p.shape.heads}, q.options().dtype(at::kDouble))
                                                      : at::Tensor();
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.out = out.const_data_ptr();
  p.grad_out = grad_out.const_data_ptr();
  p.lse = lse.const_data_ptr<double>();
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);
  p.grad_out_strides = strides_of(grad_out);
  p.lse_strides = lse_strides(lse);
  p.grad_q = grad_q.mutable_data_ptr();
  p.grad_k = grad_k.mutable_data_ptr();
  p.grad_v = grad_v.mutable_data_ptr();
  p.grad_q_strides = strides_of(grad_q);
  p.grad_k_strides = strides_of(grad_k);
  p.grad_v_strides = strides_of(grad_v);
  if (bias_grad) {
    p.grad_bias = grad_logits.mutable_data_ptr<float>();
    p.grad_bias_strides = {grad_logits.stride(0), grad_logits.stride(1), grad_logits.stride(2)};
  }
  if (args.softmax_offset.has_value()) p.grad_softmax_offset = sink_shares.mutable_data_ptr<double>();
  const AtenThreadPool pool;
  const c10::DataPtr scratch = workspace(te_kernels::attention_bwd_workspace_bytes(p.shape, pool));
  p.workspace = scratch.get();
  te_kernels::attention_bwd(p, pool);
  at::Tensor grad_bias = at::empty({0}, q.options());
  if (bias_grad) {
    std::vector<int64_t> broadcast;
    for (int64_t d : {0, 1}) {
      if (bias->size(d) == 1 && grad_logits.size(d) != 1) broadcast.push_back(d);
    }
    grad_bias = (broadcast.empty() ? grad_logits : grad_logits.sum(broadcast, true)).to(bias->scalar_type());
  }
  // The sequences' shares added in sequence order (fp64), one rounding to fp32.
  at::Tensor grad_softmax_offset = args.softmax_offset.has_value() ? sink_shares.sum(0).to(at::kFloat)
                                                              : at::empty({0}, q.options().dtype(at::kFloat));
  return {grad_q, grad_k, grad_v, grad_bias, grad_softmax_offset, grad_scores_amax};
}


}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_fwd_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_kv, const OptionalTensor& cu_seqlens_q_padded,
    const OptionalTensor& cu_seqlens_kv_padded, const OptionalTensor& alibi_slopes, const OptionalTensor& bias,
    const OptionalTensor& mask, const OptionalTensor& softmax_offset, const OptionalTensor& dropout_rng,
    const OptionalTensor& page_table, double scale, int64_t window_left, int64_t window_right, bool bottom_right,
    double softcap, double dropout, bool return_max_logit) {
  const AttentionArgs args{cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                           alibi_slopes, bias,          mask,                softmax_offset,
                           dropout_rng,  page_table,    scale,               window_left,
                           window_right, bottom_right,  softcap,             dropout};
  auto [out, lse, max_logit, unused] = forward("flash_attention_fwd", q, k, v, args, return_max_logit, nullptr);
  return {out, lse, max_logit};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_fp8_fwd_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_kv, const OptionalTensor& cu_seqlens_q_padded,
    const OptionalTensor& cu_seqlens_kv_padded, const OptionalTensor& alibi_slopes, const OptionalTensor& bias,
    const OptionalTensor& mask, const OptionalTensor& softmax_offset, const OptionalTensor& dropout_rng,
    const OptionalTensor& page_table, double scale, int64_t window_left, int64_t window_right, bool bottom_right,
    double dropout, bool return_max_logit, const at::Tensor& fp8_scales) {
  const char* op = "flash_attention_fp8_fwd";
  const AttentionArgs args{cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                           alibi_slopes, bias,          mask,                softmax_offset,
                           dropout_rng,  page_table,    scale,               window_left,
                           window_right, bottom_right,  0.0,                 dropout};
  const std::vector<float> scales = fp8_scales_of(op, fp8_scales, 5);
  return forward(op, q, k, v, args, return_max_logit, &scales);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_bwd_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_kv, const OptionalTensor& cu_seqlens_q_padded,
    const OptionalTensor& cu_seqlens_kv_padded, const OptionalTensor& alibi_slopes, const OptionalTensor& bias,
    const OptionalTensor& mask, const OptionalTensor& softmax_offset, const OptionalTensor& dropout_rng,
    const OptionalTensor& page_table, double scale, int64_t window_left, int64_t window_right, bool bottom_right,
    double softcap, double dropout, bool bias_grad) {
  const AttentionArgs args{cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                           alibi_slopes, bias,          mask,                softmax_offset,
                           dropout_rng,  page_table,    scale,               window_left,
                           window_right, bottom_right,  softcap,             dropout};
  auto [grad_q, grad_k, grad_v, grad_bias, grad_offset, unused] =
      backward("flash_attention_bwd", grad_out, q, k, v, out, lse, args, bias_grad, nullptr, te_kernels::Fp8Format::kE4M3);
  return {grad_q, grad_k, grad_v, grad_bias, grad_offset};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_fp8_bwd_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_kv, const OptionalTensor& cu_seqlens_q_padded,
    const OptionalTensor& cu_seqlens_kv_padded, const OptionalTensor& alibi_slopes, const OptionalTensor& bias,
    const OptionalTensor& mask, const OptionalTensor& softmax_offset, const OptionalTensor& dropout_rng,
    const OptionalTensor& page_table, double scale, int64_t window_left, int64_t window_right, bool bottom_right,
    double dropout, bool bias_grad, const at::Tensor& fp8_scales, int64_t grad_scores_format) {
  const char* op = "flash_attention_fp8_bwd";
  TORCH_CHECK_VALUE(grad_scores_format == 0 || grad_scores_format == 1, op,
                    ": grad_scores_format must be 0 (E4M3) or 1 (E5M2), got ", grad_scores_format);
  const AttentionArgs args{cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                           alibi_slopes, bias,          mask,                softmax_offset,
                           dropout_rng,  page_table,    scale,               window_left,
                           window_right, bottom_right,  0.0,                 dropout};
  const std::vector<float> scales = fp8_scales_of(op, fp8_scales, 9);
  return backward(op, grad_out, q, k, v, out, lse, args, bias_grad, &scales,
                  te_kernels::Fp8Format(grad_scores_format));
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("flash_attention_fwd", &portable_te::flash_attention_fwd_cpu);
  m.impl("flash_attention_bwd", &portable_te::flash_attention_bwd_cpu);
  m.impl("flash_attention_fp8_fwd", &portable_te::flash_attention_fp8_fwd_cpu);
  m.impl("flash_attention_fp8_bwd", &portable_te::flash_attention_fp8_bwd_cpu);
}
