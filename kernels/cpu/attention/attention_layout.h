// What the attention API file (sizing the workspace) and the kernels (using it) share: where a
// sequence lies, which keys a query sees, and how one thread's slot of workspace is cut.
// The functions are in an unnamed namespace: each translation unit, whatever SIMD tier it is
// compiled for, keeps its own copy, so no tier's code is ever linked into another's caller.
// The structs hold plain data.
#pragma once

#include <algorithm>
#include <cstdint>

#include "te_kernels/attention.h"

namespace te_kernels::attention_layout {

struct Sequence {
  int64_t lq, lkv, start_q, start_kv;
  int64_t offset;  // key position of query 0: lkv - lq bottom-right, 0 top-left
};

// How the forward cuts its work into tasks, and the offsets (in floats) of one task slot's
// buffers; `floats` is a slot's size. A task takes the query rows of `group_heads` consecutive
// query heads (`groups` such groups per sequence; fwd_group_heads), their queries in blocks of
// kBlockQ (`q_blocks` per head). With flash-decoding (splits > 1), every (sequence, group,
// split) keeps its part of the output at `parts` after the slots: part_floats each, its row
// maxima at part_m and row sums at part_l.
struct FwdSlot {
  int64_t group_heads = 1, groups = 0, q_blocks = 0;
  int64_t dkp = 0, dvp = 0, q = 0, k = 0, v = 0, s = 0, o = 0, m = 0, l = 0, keep = 0, amax = 0, p16 = 0, floats = 0;
  // FP8 attention: the logits of the first `kept_keys` keys each query block sees, per row
  // [kBlockQ][kept_keys] at `kept`, which the stats pass writes and the values pass reads back
  // instead of computing Q K^T again (the same floats: the same codes of P).
  int64_t kept = 0, kept_keys = 0;
  int64_t splits = 1, parts = 0, part_floats = 0, part_m = 0, part_l = 0, total_floats = 0;
};

// One backward slot (a (sequence, head) task's buffers), then, with GQA, every (sequence,
// query head)'s fp32 shares of dk and dv at `shares`.
struct BwdSlot {
  int64_t dkp = 0, dvp = 0;
  int64_t q = 0, dout = 0, delta = 0, lse_hi = 0, lse_lo = 0, dq = 0, kt = 0, k = 0, vt = 0, p = 0, pt = 0, ds = 0,
          dst = 0, dk = 0, dv = 0, keep = 0, cap = 0, o_cols = 0, o_diag = 0, amax = 0, floats = 0;
  // bf16 inputs only, for the bf16 dot products: the queries and the output gradient as bf16
  // rows (each padded to 32 values).
  int64_t q16 = 0, dout16 = 0;
  // FP8 attention on the bf16 dot products: q's and dO's code values as pairs of consecutive
  // queries ([(max_sq + 1) / 2][dkp], [...][dvp]), a key block's as pairs of consecutive keys
  // [kBlockKv / 2][dkp], and P's or G's codes as pairs [kBlockKv][kBlockQ / 2].
  int64_t q_pairs = 0, dout_pairs = 0, k_pairs = 0, a_pairs = 0;
  int64_t shares = 0, total_floats = 0;
};

namespace {

constexpr int64_t kBlockQ = kAttentionBlockQ;
constexpr int64_t kBlockKv = kAttentionBlockKv;

// Buffers start on 64-byte boundaries; packed rows are padded to 16 floats so that every
// tier's vectors cover them whole.
inline int64_t aligned_floats(int64_t floats) { return (floats + 15) / 16 * 16; }
inline int64_t padded_dim(int64_t dim) { return (dim + 15) / 16 * 16; }
// Width of a bf16 row packed for the bf16 dot products: one 32-value load at a time (half as
// many floats of workspace).
inline int64_t padded_bf16(int64_t dim) { return (dim + 31) / 32 * 32; }
// FP8 attention keeps the logits of up to this many keys per query block (1 MiB of a slot's
// workspace at 64 queries): the values pass reads them back at a few bytes per logit where
// computing them again costs 2 dk flops each. Keys past it are computed twice.
constexpr int64_t kFp8KeptKeys = 4096;

// Query t of `seq` sees the keys [key_lo, key_hi); both are non-decreasing in t, so a block of
// queries [t0, t1] sees keys within [key_lo(t0), key_hi(t1)).
inline int64_t key_lo(const Sequence& seq, const AttentionShape& s, int64_t t) {
  return s.window_left >= 0 ? std::max<int64_t>(0, t + seq.offset - s.window_left) : 0;
}
inline int64_t key_hi(const Sequence& seq, const AttentionShape& s, int64_t t) {
  return s.window_right >= 0 ? std::clamp<int64_t>(t + seq.offset + s.window_right + 1, 0, seq.lkv) : seq.lkv;
}

inline Sequence sequence(const AttentionShape& s, int64_t i) {
  Sequence seq;
  seq.lq = s.seqlens_q != nullptr ? s.seqlens_q[i] : s.max_sq;
  seq.lkv = s.seqlens_kv != nullptr ? s.seqlens_kv[i] : s.max_skv;
  seq.start_q = s.starts_q != nullptr ? s.starts_q[i] : 0;
  seq.start_kv = s.starts_kv != nullptr ? s.starts_kv[i] : 0;
  seq.offset = s.bottom_right ? seq.lkv - seq.lq : 0;
  return seq;
}

inline int64_t row_offset(const AttentionStrides& st, int64_t seq_index, int64_t head, int64_t start) {
  return seq_index * st.batch + head * st.head + start * st.token;
}

// Offset of (sequence i, head h, query t, key 0) in a dense [b | 1, h | 1, sq, skv] operand.
inline int64_t dense_offset(const AttentionDenseStrides& st, int64_t seq_index, int64_t head, int64_t t) {
  return seq_index * st.batch + head * st.head + t * st.row;
}

inline float alibi_slope(const AttentionShape& s, int64_t seq_index, int64_t head) {
  return s.alibi_slopes != nullptr ? s.alibi_slopes[seq_index * s.alibi_batch_stride + head] : 0.0f;
}

// Hands out consecutive 64-byte aligned buffers of a slot: take(floats) is each one's offset.
struct Carver {
  int64_t used = 0;
  int64_t take(int64_t floats) {
    const int64_t here = used;
    used += aligned_floats(floats);
    return here;
  }
};

inline int64_t slot_count(int64_t tasks, const ThreadPool& pool) {
  return std::min<int64_t>(std::max(pool.num_threads(), 1), tasks);
}

// Decoding: a forward task whose heads have at most kDotRows queries each reads its key rows
// as they lie (dot products; no transposed copy, which would cost more than so few rows'
// products), and query heads share a task so that each key row is read once for all of them:
// the query heads of one key/value head up to kDotRows rows, and when all of them fit, whole
// key/value heads up to kBlockQ rows, so that a cache laid out token by token (InferenceParams',
// paged or not: [tokens, kv_heads, d]) is read a whole token row at a time.
constexpr int64_t kDotRows = 16;

// Whether the rows of a query block of `per_head` queries of one head compute their scores as
// dot products of rows (else as a tile product with K^T). The two round differently (lanes
// summed at the end, against one FMA chain per score), and the backward must recompute each
// score with the forward's rounding: where a softmax is one-hot only then is P = exp(S - lse)
// exactly 1 and dS exactly 0 (at logits in the thousands one ulp of S is 1e-4, and P and dS
// would be off by that). Both passes ask it of the same blocks: a forward task's query block of
// each head is the backward's (kBlockQ queries from the same first one, or all of a grouped
// sequence's, which are fewer).
inline bool scores_by_rows(int64_t per_head) { return per_head <= kDotRows; }

// The query heads per forward task (FwdSlot::group_heads): whole key/value heads' worth when a
// key/value head's query heads have at most kDotRows queries in all (the most key/value heads
// that divide kv_heads within kBlockQ rows), else the most query heads of one key/value head
// that divide heads / kv_heads within kDotRows rows; 1 when one head's queries are more.
inline int64_t fwd_group_heads(const AttentionShape& s) {
  const int64_t ratio = s.heads / s.kv_heads, sq = std::max<int64_t>(s.max_sq, 1);
  if (ratio * sq <= kDotRows) {
    for (int64_t n = std::min(s.kv_heads, kBlockQ / (ratio * sq)); n > 1; --n) {
      if (s.kv_heads % n == 0) return n * ratio;
    }
    return ratio;
  }
  for (int64_t n = std::min(ratio, kDotRows / sq); n > 1; --n) {
    if (ratio % n == 0) return n;
  }
  return 1;
}

// Flash-decoding: a forward whose queries fit one block per (sequence, group), in fewer than
// kDecodeTasks such tasks (and no FP8 attention, whose P needs each row's lse first), splits each one's keys into parts of about kKeysPerPart (whole key
// blocks), each part a task, combined after in a fixed order. The split depends on the shape
// alone, so the result is the same on any number of threads.
constexpr int64_t kDecodeTasks = 64;
constexpr int64_t kKeysPerPart = 512;

inline int64_t fwd_splits(const AttentionShape& s, int64_t groups, int64_t q_blocks) {
  if (s.fp8.enabled || q_blocks > 1 || s.batch * groups >= kDecodeTasks) return 1;
  return std::clamp<int64_t>((s.max_skv + kKeysPerPart - 1) / kKeysPerPart, 1, kDecodeTasks);
}

inline FwdSlot fwd_slot(const AttentionShape& s, const ThreadPool& pool) {
  FwdSlot f;
  f.group_heads = fwd_group_heads(s);
  f.groups = s.heads / f.group_heads;
  f.q_blocks = (s.max_sq + kBlockQ - 1) / kBlockQ;  // 1 when heads are grouped
  f.dkp = padded_dim(s.head_dim_qk);
  f.dvp = padded_dim(s.head_dim_v);
  Carver slot;
  f.q = slot.take(kBlockQ * f.dkp);
  f.k = slot.take(kBlockKv * f.dkp);  // the block's K^T [dk][kBlockKv]
  f.v = slot.take(kBlockKv * f.dvp);
  f.s = slot.take(kBlockQ * kBlockKv);
  f.o = slot.take(kBlockQ * f.dvp);
  f.m = slot.take(kBlockQ);
  f.l = slot.take(kBlockQ);
  f.keep = slot.take(kBlockKv);  // dropout's keep factors of one row
  f.amax = slot.take(1);         // FP8: the slot's max of P
  f.p16 = slot.take(kBlockQ * kBlockKv / 2);  // FP8 on the bf16 dot products: P's codes as pairs
  if (s.fp8.enabled) {
    f.kept_keys = std::min((s.max_skv + kBlockKv - 1) / kBlockKv * kBlockKv, kFp8KeptKeys);
    f.kept = slot.take(kBlockQ * f.kept_keys);
  }
  f.floats = slot.used;
  f.splits = fwd_splits(s, f.groups, f.q_blocks);
  const int64_t tasks = s.batch * f.groups * (f.splits > 1 ? f.splits : f.q_blocks);
  f.parts = slot_count(tasks, pool) * f.floats;
  if (f.splits > 1) {
    const int64_t rows = f.group_heads * s.max_sq;  // <= kBlockQ
    Carver part;
    part.take(rows * f.dvp);
    f.part_m = part.take(rows);
    f.part_l = part.take(rows);
    f.part_floats = part.used;
  }
  f.total_floats = f.parts + (f.splits > 1 ? s.batch * f.groups * f.splits * f.part_floats : 0);
  return f;
}

inline BwdSlot bwd_slot(const AttentionShape& s, const ThreadPool& pool) {
  BwdSlot b;
  b.dkp = padded_dim(s.head_dim_qk);
  b.dvp = padded_dim(s.head_dim_v);
  Carver slot;
  b.q = slot.take(s.max_sq * b.dkp);
  b.dout = slot.take(s.max_sq * b.dvp);
  b.delta = slot.take(s.max_sq);
  b.lse_hi = slot.take(s.max_sq);
  b.lse_lo = slot.take(s.max_sq);
  b.dq = slot.take(s.max_sq * b.dkp);
  b.kt = slot.take(s.head_dim_qk * kBlockKv);
  b.k = slot.take(kBlockKv * b.dkp);
  b.vt = slot.take(s.head_dim_v * kBlockKv);
  b.p = slot.take(kBlockQ * kBlockKv);
  b.pt = slot.take(kBlockKv * kBlockQ);
  b.ds = slot.take(kBlockQ * kBlockKv);
  b.dst = slot.take(kBlockKv * kBlockQ);
  b.dk = slot.take(kBlockKv * b.dkp);
  b.dv = slot.take(kBlockKv * b.dvp);
  b.keep = slot.take(kBlockQ * kBlockKv);  // dropout's keep factors of the block
  b.cap = slot.take(kBlockQ * kBlockKv);   // the softcap's derivative 1 - tanh^2 of the block
  // Room for the widest tier's vectors (16 lanes): row_deltas' out^T columns and their products.
  b.o_cols = slot.take(s.head_dim_v * 16);
  b.o_diag = slot.take(16 * 16);
  b.amax = slot.take(1);  // FP8: the slot's max |G|
  if (s.dtype == DType::kBFloat16) {
    b.q16 = slot.take(s.max_sq * padded_bf16(s.head_dim_qk) / 2);
    b.dout16 = slot.take(s.max_sq * padded_bf16(s.head_dim_v) / 2);
    if (s.fp8.enabled) {
      b.q_pairs = slot.take((s.max_sq + 1) / 2 * b.dkp);
      b.dout_pairs = slot.take((s.max_sq + 1) / 2 * b.dvp);
      b.k_pairs = slot.take(kBlockKv / 2 * b.dkp);
      b.a_pairs = slot.take(kBlockKv * kBlockQ / 2);
    }
  }
  b.floats = slot.used;
  b.shares = slot_count(s.batch * s.heads, pool) * b.floats;
  const int64_t shares = s.heads != s.kv_heads ? s.batch * s.heads * s.max_skv * (b.dkp + b.dvp) : 0;
  b.total_floats = b.shares + shares;
  return b;
}

}  // namespace
}  // namespace te_kernels::attention_layout
