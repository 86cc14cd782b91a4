// Flash attention's forward pass (attention_kernels.h says how it runs), written over the
// tier's vector type.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including attention_forward.h"
#endif
#pragma once


#include "cpu/attention/attention_logits.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail {

// A forward task's query rows: `heads` query heads from first_head (some of one key/value
// head's, or all of whole key/value heads'), each with its queries [t0, t0 + per_head). Row r
// is head first_head + r / per_head, query t0 + r % per_head.
struct TaskRows {
  int64_t seq_index, first_head, heads, t0, per_head;
  int64_t count() const { return heads * per_head; }
  int64_t head(int64_t r) const { return first_head + r / per_head; }
  int64_t t(int64_t r) const { return t0 + r % per_head; }
};

// The key and value rows the step after this one reads (`count` token rows of key/value head
// kv_head), which this step asks the memory for as it goes.
struct NextRows {
  const int64_t* tokens;
  int64_t count, kv_head;
};

// The key and value rows one step (a key block of one key/value head) reads where they lie,
// and those of the step after it (`ahead` of each), which this step asks the memory for as it
// reads its own: one step ahead is a few thousand cycles, time enough for memory to deliver.
template <typename T>
struct StepRows {
  const T* keys[kBlockKv];
  const T* values[kBlockKv];
  const T* keys_ahead[kBlockKv];
  const T* values_ahead[kBlockKv];
  int64_t count = 0, ahead = 0;
};

// A forward's pass over the keys: kOnline, flash attention's (the online softmax, out = O / l);
// FP8 attention's kStats (each row's running max and sum alone, for its lse), then kValues
// (P = exp(s - lse) from that lse, quantised, O += P_code V).
enum class FwdPass { kOnline, kStats, kValues };

template <typename T>
struct Forward {
  const AttentionFwdParams& p;
  const AttentionShape& s;
  attention_layout::FwdSlot layout;
  using Dots = Bf16Dots<T>;
  bool dots;  // S on Bf16Dots<T> (bf16 inputs, AVX512-BF16): queries and keys packed as bf16, not floats
  FwdPass pass;

  // The rows of (sequence, group of heads) from query t0: a block of kBlockQ queries of one
  // head, or (grouped heads, one block) every query of each.
  TaskRows rows_of(int64_t seq_index, int64_t group, const Sequence& seq, int64_t t0) const {
    return {seq_index, group * layout.group_heads, layout.group_heads, t0, std::min(kBlockQ, seq.lq - t0)};
  }

  // tokens[j] = where key k0 + j of the sequence lies among k's and v's token rows: after the
  // sequence's start, or through the page table of a paged cache.
  void key_tokens(const Sequence& seq, int64_t seq_index, int64_t k0, int64_t nk, int64_t* tokens) const {
    if (s.page_table == nullptr) {
      for (int64_t j = 0; j < nk; ++j) tokens[j] = seq.start_kv + k0 + j;
      return;
    }
    const int32_t* pages = s.page_table + seq_index * s.page_table_stride;
    for (int64_t j = 0; j < nk; ++j) tokens[j] = int64_t(pages[(k0 + j) / s.page_size]) * s.page_size + (k0 + j) % s.page_size;
  }

  // The first key or value row of key/value head kv_head of a sequence (`base` p.k or p.v).
  const T* head_rows(const void* base, const AttentionStrides& st, int64_t seq_index, int64_t kv_head) const {
    return static_cast<const T*>(base) + attention_layout::row_offset(st, seq_index, kv_head, 0);
  }

  // The rows of a step of key/value head kv_head (token rows `tokens`, nk of them) and of the
  // step after it (`next`).
  StepRows<T> step_rows(int64_t seq_index, int64_t kv_head, const int64_t* tokens, int64_t nk,
                        const NextRows& next) const {
    StepRows<T> rows;
    const T* k = head_rows(p.k, p.k_strides, seq_index, kv_head);
    const T* v = head_rows(p.v, p.v_strides, seq_index, kv_head);
    for (int64_t j = 0; j < nk; ++j) {
      rows.keys[j] = k + tokens[j] * p.k_strides.token;
      rows.values[j] = v + tokens[j] * p.v_strides.token;
    }
    const T* next_k = head_rows(p.k, p.k_strides, seq_index, next.kv_head);
    const T* next_v = head_rows(p.v, p.v_strides, seq_index, next.kv_head);
    for (int64_t j = 0; j < next.count; ++j) {
      rows.keys_ahead[j] = next_k + next.tokens[j] * p.k_strides.token;
      rows.values_ahead[j] = next_v + next.tokens[j] * p.v_strides.token;
    }
    rows.count = nk;
    rows.ahead = next.count;
    return rows;
  }

  // S = Q K^T of one step's keys into scores [rows][kBlockKv] for the task rows [first, first +
  // rows), which read one key/value head (entries past nk left as they are by the dot
  // products, zero from the tile product). Query blocks of few queries per head read the key
  // rows as they lie (dot_rows, or the bf16 dot products), asking for the next step's as they
  // go; more take K^T, whose copy the rows' products then repay (scores_by_rows).
  template <typename V>
  void block_scores(const StepRows<T>& step, int64_t n, int64_t first, int64_t rows, int64_t per_head,
                    float* ws) const {
    const int64_t dk = s.head_dim_qk, dkp = layout.dkp, nk = step.count;
    const float* q_pack = ws + layout.q + first * dkp;  // [rows][dkp]
    float* keys = ws + layout.k;                         // K^T [dk][kBlockKv]
    float* scores = ws + layout.s + first * kBlockKv;    // [rows][kBlockKv]
    if constexpr (Dots::kCompiled) {
      if (dots) return bf16_block_scores(step, n, first, rows, per_head, ws);
    }
    if (attention_layout::scores_by_rows(per_head)) {
      dot_rows<V>(q_pack, dkp, step.keys, dk, rows, nk, scores, kBlockKv, step.keys_ahead, step.ahead);
      return;
    }
    pack_transposed<V>(step.keys, nk, n, dk, keys, kBlockKv);  // K^T: [dk][n], keys past nk zero
    std::fill(scores, scores + rows * kBlockKv, 0.0f);
    gemm_acc<V>(q_pack, dkp, keys, kBlockKv, scores, kBlockKv, rows, n, dk);
  }

  // block_scores on the bf16 dot products: the queries packed as bf16 rows [rows][wq] (wq the
  // head dim padded to 32), the keys read as they lie or packed as K^T's pairs
  // [(dk + 1) / 2][kBlockKv]. Instantiated only where Dots is compiled (block_scores).
  void bf16_block_scores(const StepRows<T>& step, int64_t n, int64_t first, int64_t rows, int64_t per_head,
                         float* ws) const {
    const int64_t dk = s.head_dim_qk, wq = padded_bf16(dk);
    const uint16_t* q16 = reinterpret_cast<const uint16_t*>(ws + layout.q) + first * wq;  // [rows][wq]
    float* scores = ws + layout.s + first * kBlockKv;                                     // [rows][kBlockKv]
    if (attention_layout::scores_by_rows(per_head)) {
      Dots::dot_rows(q16, wq, step.keys, dk, rows, step.count, scores, kBlockKv, step.keys_ahead, step.ahead);
      return;
    }
    uint32_t* key_pairs = reinterpret_cast<uint32_t*>(ws + layout.k);  // [(dk + 1) / 2][kBlockKv]
    Dots::pairs_of_columns([&](int64_t j) { return step.keys[j]; }, step.count, n, dk, key_pairs, kBlockKv);
    std::fill(scores, scores + rows * kBlockKv, 0.0f);
    Dots::pair_gemm(reinterpret_cast<const uint32_t*>(q16), wq / 2, key_pairs, kBlockKv, scores, kBlockKv, rows, n,
                    (dk + 1) / 2);
  }

  // The keys [k_lo, k_hi) of the task's rows into the slot's running output, row maxima and
  // row sums (started here), a key block of one key/value head at a time (a step): the rows of
  // the task's query heads that read it (the task's rows are head-major).
  template <typename V>
  void accumulate(const TaskRows& rows, const Sequence& seq, int64_t k_lo, int64_t k_hi, float* ws) const {
    const int64_t dk = s.head_dim_qk, dkp = layout.dkp, dvp = layout.dvp, count = rows.count();
    const int64_t ratio = s.heads / s.kv_heads, rows_per_kv = std::min(rows.heads, ratio) * rows.per_head;
    float* q_pack = ws + layout.q;  // [kBlockQ][dkp]
    float* acc = ws + layout.o;     // [kBlockQ][dvp]
    for (int64_t r = 0; r < count; ++r) {
      const T* q = static_cast<const T*>(p.q) +
                   attention_layout::row_offset(p.q_strides, rows.seq_index, rows.head(r), seq.start_q + rows.t(r));
      if (dots) {
        bf16_dots_pack_query(q, r, ws);
      } else {
        widen_row<V>(q, q_pack + r * dkp, dk, dkp);
      }
      std::fill(acc + r * dvp, acc + (r + 1) * dvp, 0.0f);
      ws[layout.m + r] = kMinusInf;
      ws[layout.l + r] = 0.0f;
      if (pass == FwdPass::kValues) {  // the row's lse, from kStats, as hi + lo (as the backward splits it)
        const double lse = p.lse[attention_layout::row_offset(p.lse_strides, rows.seq_index, rows.head(r),
                                                              seq.start_q + rows.t(r))];
        ws[layout.m + r] = float(lse);
        ws[layout.l + r] = std::isfinite(lse) ? float(lse - double(float(lse))) : 0.0f;
      }
    }
    // The steps (a key block of one key/value head each) in the order that reads the cache as it
    // lies: where each key/value head's rows lie together ([b, h, s, d]), each head's blocks in
    // turn (two streams the hardware prefetcher follows); where heads share each token's row
    // (bshd, sbhd, thd, paged caches), each block's heads in turn, reading its token rows whole.
    // A row sees its blocks in order either way. The next step's rows are asked for while this
    // step's are read, so that memory streams them during this step's products (decoding over a
    // cache beyond the caches: 10-20% faster on Zen 1, where the loads otherwise wait in turn
    // with the FMAs).
    const int64_t blocks = (k_hi - k_lo + kBlockKv - 1) / kBlockKv, kv_groups = count / rows_per_kv;
    const bool heads_apart = s.page_table == nullptr && p.k_strides.head > p.k_strides.token &&
                             p.v_strides.head > p.v_strides.token;
    const auto block_of = [&](int64_t step) { return heads_apart ? step % blocks : step / kv_groups; };
    const auto first_row_of = [&](int64_t step) {
      return (heads_apart ? step / blocks : step % kv_groups) * rows_per_kv;
    };
    int64_t token_rows[2][kBlockKv];  // the token rows of this step's block and of the next one
    int64_t* tokens = token_rows[0];
    int64_t* next = token_rows[1];
    const auto block_keys = [&](int64_t block) { return std::min(kBlockKv, k_hi - k_lo - block * kBlockKv); };
    key_tokens(seq, rows.seq_index, k_lo, block_keys(0), tokens);
    for (int64_t step = 0, steps = blocks * kv_groups; step < steps; ++step) {
      const bool last = step + 1 == steps;
      const int64_t block = block_of(step), next_block = last ? block : block_of(step + 1);
      const bool block_ends = next_block != block;
      if (block_ends) key_tokens(seq, rows.seq_index, k_lo + next_block * kBlockKv, block_keys(next_block), next);
      const NextRows step_after{block_ends ? next : tokens, last ? 0 : block_keys(next_block),
                                last ? 0 : rows.head(first_row_of(step + 1)) / ratio};
      key_block<V>(rows, seq, first_row_of(step), rows_per_kv, block * kBlockKv, k_lo + block * kBlockKv,
                   block_keys(block), tokens, step_after, ws);
      if (block_ends) std::swap(tokens, next);
    }
  }

  // One key block [k0, k0 + nk) (its token rows `tokens`, the task's keys from `offset` on)
  // for the task rows [first, first + count), which read one key/value head: scores, the online
  // softmax of each row, O += P V. Few queries per head read the value rows where they lie
  // (value_rows); more repay a packed fp32 copy of them. FP8 attention's stats pass keeps the
  // logits of the task's first kept_keys keys, which its values pass reads back.
  template <typename V>
  void key_block(const TaskRows& rows, const Sequence& seq, int64_t first, int64_t count, int64_t offset, int64_t k0,
                 int64_t nk, const int64_t* tokens, const NextRows& next, float* ws) const {
    const int64_t dv = s.head_dim_v, dvp = layout.dvp, seq_index = rows.seq_index, n = round_up(nk, V::kWidth);
    const int64_t kv_head = rows.head(first) / (s.heads / s.kv_heads);
    const bool by_rows = attention_layout::scores_by_rows(rows.per_head);
    const StepRows<T> step = step_rows(seq_index, kv_head, tokens, nk, next);
    float* v_pack = ws + layout.v;  // [kBlockKv][dvp]
    float* scores = ws + layout.s;  // [kBlockQ][kBlockKv]
    float* acc = ws + layout.o;     // [kBlockQ][dvp]
    float* row_max = ws + layout.m;
    float* row_sum = ws + layout.l;
    const bool kept = pass != FwdPass::kOnline && offset + nk <= layout.kept_keys;
    float* kept_logits = ws + layout.kept + offset;  // row r's at r * kept_keys
    if (!(kept && pass == FwdPass::kValues)) block_scores<V>(step, n, first, count, rows.per_head, ws);
    // FP8 attention's P V on the bf16 dot products: P's codes and V's (bf16 inputs) are bf16
    // values, so each product is exact as it is with the fp32 FMAs, at half their instructions.
    const bool fp8_dots = dots && !by_rows && pass == FwdPass::kValues;
    if (fp8_dots) {
      fp8_pack_values(step, n, ws);
    } else if (!by_rows && pass != FwdPass::kStats) {
      for (int64_t j = 0; j < nk; ++j) {
        widen_row<V>(step.values[j], v_pack + j * dvp, dv, dvp);
        if (j < step.ahead) ask_for(step.values_ahead[j], dv * int64_t(sizeof(T)));
      }
      std::fill(v_pack + nk * dvp, v_pack + n * dvp, 0.0f);
    }
    for (int64_t r = first; r < first + count; ++r) {
      float* row = scores + r * kBlockKv;
      const int64_t t = rows.t(r), head = rows.head(r);
      const int64_t j_lo = std::max<int64_t>(key_lo(seq, s, t) - k0, 0);
      const int64_t j_hi = std::min<int64_t>(key_hi(seq, s, t) - k0, nk);
      if (j_lo >= j_hi) {
        std::fill(row, row + n, 0.0f);
        continue;
      }
      float* kept_row = kept_logits + r * layout.kept_keys;
      if (pass == FwdPass::kValues) {
        if (!kept) {
          const float slope = attention_layout::alibi_slope(s, seq_index, head);
          logits_in_place<V>(row, j_lo, j_hi, row_terms<T>(s, seq, seq_index, head, slope, t, k0), nullptr);
        }
        fp8_probabilities<V>(kept ? kept_row : row, row, n, j_lo, j_hi, row_max[r], row_sum[r], seq_index, head, t,
                             k0, ws);
        continue;
      }
      const float slope = attention_layout::alibi_slope(s, seq_index, head);
      logits_in_place<V>(row, j_lo, j_hi, row_terms<T>(s, seq, seq_index, head, slope, t, k0), nullptr);
      if (kept) std::copy(row + j_lo, row + j_hi, kept_row + j_lo);
      const float block_max = softmax_row::max_logit<V>(j_hi - j_lo, [&](auto* tag, int64_t j) {
        return VecOf<decltype(tag)>::load(row + j_lo + j);
      });
      const float new_max = std::max(row_max[r], block_max);
      if (new_max == kMinusInf) {  // every logit so far -inf: nothing attended yet
        std::fill(row, row + n, 0.0f);
        continue;
      }
      const float block_sum = softmax_row::exp_into<V>(j_hi - j_lo, new_max, row + j_lo, [&](auto* tag, int64_t j) {
        return VecOf<decltype(tag)>::load(row + j_lo + j);
      });
      const float rescale = std::exp(row_max[r] - new_max);  // 0 on the first block a row sees
      row_sum[r] = row_sum[r] * rescale + block_sum;
      row_max[r] = new_max;
      if (pass == FwdPass::kStats) continue;  // the row's lse alone
      std::fill(row, row + j_lo, 0.0f);
      std::fill(row + j_hi, row + n, 0.0f);
      // The sum l takes every probability; only the product with V sees the dropped ones.
      drop_out<V>(row, j_lo, j_hi, seq_index, head, t, k0, ws);
      if (rescale != 1.0f) narrow_row<V>(acc + r * dvp, rescale, acc + r * dvp, dvp);
    }
    if (pass == FwdPass::kStats) return;
    if (fp8_dots) {
      fp8_dot_values(scores + first * kBlockKv, n, first, count, ws);
    } else if (by_rows) {
      value_rows<V>(scores + first * kBlockKv, kBlockKv, step.values, nk, dv, acc + first * dvp, dvp, count,
                    step.values_ahead, step.ahead);
    } else {
      gemm_acc<V>(scores + first * kBlockKv, kBlockKv, v_pack, dvp, acc + first * dvp, dvp, count, dvp, n);
    }
  }

  // Dropout's keep factors (0 or 1 / (1 - p)) times the row's probabilities of keys [j_lo, j_hi).
  template <typename V>
  void drop_out(float* row, int64_t j_lo, int64_t j_hi, int64_t seq_index, int64_t head, int64_t t, int64_t k0,
                float* ws) const {
    if (s.dropout == 0.0f) return;
    float* factors = ws + layout.keep;  // [kBlockKv]
    keep_factors<V>(s, dropout_row(s, seq_index, head, t), k0, j_lo, j_hi, factors);
    sweep<V>(j_lo, j_hi, [&](auto* tag, int64_t j) {
      using W = VecOf<decltype(tag)>;
      (W::load(row + j) * W::load(factors + j)).store(row + j);
    });
  }

  // FP8 attention's kValues pass, one row of the block's logits (`logits`, keys [j_lo, j_hi)
  // seen) into `row`: P = exp((s - lse_hi) - lse_lo), as the backward recomputes it, dropout's
  // keep factors applied, then the values of P's E4M3 codes; the slot's max of P kept for the
  // amax.
  template <typename V>
  void fp8_probabilities(const float* logits, float* row, int64_t n, int64_t j_lo, int64_t j_hi, float lse_hi,
                         float lse_lo, int64_t seq_index, int64_t head, int64_t t, int64_t k0, float* ws) const {
    std::fill(row, row + j_lo, 0.0f);
    std::fill(row + j_hi, row + n, 0.0f);
    if (lse_hi == kMinusInf) {  // the row sees no key
      std::fill(row + j_lo, row + j_hi, 0.0f);
      return;
    }
    float amax = 0.0f;
    if (s.dropout == 0.0f) {  // P onto the grid as it is made: one sweep
      Fp8Rounding<V, Fp8Format::kE4M3> rounding{s.fp8.probs_scale};
      sweep<V>(j_lo, j_hi, [&](auto* tag, int64_t j) {
        using W = VecOf<decltype(tag)>;
        rounding.round(exp((W::load(logits + j) - W::broadcast(lse_hi)) - W::broadcast(lse_lo))).store(row + j);
      });
      amax = rounding.amax();
    } else {
      sweep<V>(j_lo, j_hi, [&](auto* tag, int64_t j) {
        using W = VecOf<decltype(tag)>;
        exp((W::load(logits + j) - W::broadcast(lse_hi)) - W::broadcast(lse_lo)).store(row + j);
      });
      drop_out<V>(row, j_lo, j_hi, seq_index, head, t, k0, ws);
      amax = fp8_values_in_place<V, Fp8Format::kE4M3>(row, j_lo, j_hi, s.fp8.probs_scale);
    }
    ws[layout.amax] = std::max(ws[layout.amax], amax);
  }

  // FP8 attention's dot products (reached only where dots is set): the block's value rows as
  // pairs along the keys [n / 2][dvp] in the slot's v.
  void fp8_pack_values(const StepRows<T>& step, int64_t n, float* ws) const {
    if constexpr (Dots::kCompiled) {
      Dots::pairs_of_rows([&](int64_t j) { return step.values[j]; }, step.count, s.head_dim_v, layout.dvp, n / 2,
                          reinterpret_cast<uint32_t*>(ws + layout.v), layout.dvp);
    }
  }

  // acc [count][dvp] (from the task's row `first`) += P V: P's codes [count][n] as pairs (the
  // slot's p16), times the value pairs of fp8_pack_values.
  void fp8_dot_values(const float* probs, int64_t n, int64_t first, int64_t count, float* ws) const {
    if constexpr (Dots::kCompiled) {
      uint32_t* prob_pairs = reinterpret_cast<uint32_t*>(ws + layout.p16);  // [count][kBlockKv / 2]
      for (int64_t r = 0; r < count; ++r) Dots::pairs_of_values(probs + r * kBlockKv, n, prob_pairs + r * kBlockKv / 2);
      Dots::pair_gemm(prob_pairs, kBlockKv / 2, reinterpret_cast<const uint32_t*>(ws + layout.v), layout.dvp,
                      ws + layout.o + first * layout.dvp, layout.dvp, count, layout.dvp, n / 2);
    }
  }

  // Query row r as bf16 [wq], zero past the head dim, for bf16_block_scores.
  void bf16_dots_pack_query(const T* q, int64_t r, float* ws) const {
    if constexpr (Dots::kCompiled) {
      const int64_t wq = padded_bf16(s.head_dim_qk);
      Dots::copy_row(q, s.head_dim_qk, wq, reinterpret_cast<uint16_t*>(ws + layout.q) + r * wq);
    }
  }

  // out, lse (and the row maxima) of the task's rows from the slot's running output, row
  // maxima and row sums.
  template <typename V>
  void finish(const TaskRows& rows, const Sequence& seq, float* ws) const {
    const int64_t dv = s.head_dim_v, dvp = layout.dvp;
    const float* acc = ws + layout.o;
    const float* row_max = ws + layout.m;
    const float* row_sum = ws + layout.l;
    for (int64_t r = 0; r < rows.count(); ++r) {
      const int64_t head = rows.head(r), token = seq.start_q + rows.t(r);
      const int64_t at_out = attention_layout::row_offset(p.out_strides, rows.seq_index, head, token);
      if (pass == FwdPass::kValues) {  // P was normalised: the sums times the scale_invs' product, in fp32
        float* out = static_cast<float*>(p.out) + at_out;
        if (row_max[r] != kMinusInf) narrow_row<V>(acc + r * dvp, s.fp8.out_factor, out, dv);
        continue;
      }
      T* out = static_cast<T*>(p.out) + at_out;
      const int64_t row_stats = attention_layout::row_offset(p.lse_strides, rows.seq_index, head, token);
      if (p.row_max != nullptr) p.row_max[row_stats] = row_max[r];  // laid out as lse
      float m = row_max[r], l = row_sum[r], carry = 1.0f;
      if (s.softmax_offset != nullptr) {  // the sink's exp(offset) joins the sum
        const float sink = s.softmax_offset[head], joint = std::max(m, sink);
        carry = std::exp(m - joint);  // 0 when the row saw no key
        l = l * carry + std::exp(sink - joint);
        m = joint;
      }
      if (!(l > 0.0f)) continue;  // no key seen and no sink: out stays zero, lse -inf
      if (pass == FwdPass::kOnline) narrow_row<V>(acc + r * dvp, carry / l, out, dv);
      p.lse[row_stats] = double(m) + std::log(double(l));
    }
  }

  template <typename V>
  void block(int64_t seq_index, int64_t group, int64_t q_block, float* ws) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const TaskRows rows = rows_of(seq_index, group, seq, q_block * kBlockQ);
    if (rows.per_head <= 0) return;
    accumulate<V>(rows, seq, key_lo(seq, s, rows.t0), key_hi(seq, s, rows.t0 + rows.per_head - 1), ws);
    finish<V>(rows, seq, ws);
  }

  // Flash-decoding (one query block per (sequence, group)): part `split` of the block's keys,
  // whole key blocks from the first the block sees, kept in its part of the workspace.
  template <typename V>
  void part(int64_t seq_index, int64_t group, int64_t split, float* ws) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const TaskRows rows = rows_of(seq_index, group, seq, 0);
    float* kept = part_of(seq_index, group, split);
    std::fill(kept + layout.part_m, kept + layout.part_m + rows.count(), kMinusInf);
    std::fill(kept + layout.part_l, kept + layout.part_l + rows.count(), 0.0f);
    if (rows.per_head <= 0) return;
    const int64_t lo = key_lo(seq, s, 0), hi = key_hi(seq, s, seq.lq - 1);
    const int64_t blocks = (std::max<int64_t>(hi - lo, 0) + kBlockKv - 1) / kBlockKv;
    const int64_t per_split = (blocks + layout.splits - 1) / layout.splits;
    const int64_t k_lo = lo + split * per_split * kBlockKv, k_hi = std::min(hi, k_lo + per_split * kBlockKv);
    if (k_lo >= k_hi) return;
    accumulate<V>(rows, seq, k_lo, k_hi, ws);
    std::copy(ws + layout.o, ws + layout.o + rows.count() * layout.dvp, kept);
    std::copy(ws + layout.m, ws + layout.m + rows.count(), kept + layout.part_m);
    std::copy(ws + layout.l, ws + layout.l + rows.count(), kept + layout.part_l);
  }

  // The parts of (sequence, group) merged in split order (each rescaled to the joint row max),
  // then finished as one block.
  template <typename V>
  void combine(int64_t seq_index, int64_t group, float* ws) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const TaskRows rows = rows_of(seq_index, group, seq, 0);
    if (rows.per_head <= 0) return;
    const int64_t dvp = layout.dvp;
    float* acc = ws + layout.o;
    float* row_max = ws + layout.m;
    float* row_sum = ws + layout.l;
    for (int64_t r = 0; r < rows.count(); ++r) {
      float joint = kMinusInf;
      for (int64_t split = 0; split < layout.splits; ++split) joint = std::max(joint, part_of(seq_index, group, split)[layout.part_m + r]);
      std::fill(acc + r * dvp, acc + (r + 1) * dvp, 0.0f);
      row_max[r] = joint;
      row_sum[r] = 0.0f;
      if (joint == kMinusInf) continue;
      for (int64_t split = 0; split < layout.splits; ++split) {
        const float* kept = part_of(seq_index, group, split);
        const float factor = std::exp(kept[layout.part_m + r] - joint);  // 0 for a part that saw nothing
        if (factor == 0.0f) continue;
        row_sum[r] += kept[layout.part_l + r] * factor;
        sweep<V>(0, dvp, [&](auto* tag, int64_t c) {
          using W = VecOf<decltype(tag)>;
          fmadd(W::load(kept + r * dvp + c), W::broadcast(factor), W::load(acc + r * dvp + c)).store(acc + r * dvp + c);
        });
      }
    }
    finish<V>(rows, seq, ws);
  }

  float* part_of(int64_t seq_index, int64_t group, int64_t split) const {
    return static_cast<float*>(p.workspace) + layout.parts +
           ((seq_index * layout.groups + group) * layout.splits + split) * layout.part_floats;
  }

  // The online pass over every query block (flash-decoding's parts and their merge when split).
  void run_online(const ThreadPool& pool) const {
    const int64_t groups = layout.groups;
    float* slots = static_cast<float*>(p.workspace);
    if (layout.splits > 1) {
      const int64_t splits = layout.splits;
      for_each_task(s.batch * groups * splits, pool, [&](int64_t task, int64_t slot) {
        part<Vec>(task / splits / groups, task / splits % groups, task % splits, slots + slot * layout.floats);
      });
      for_each_task(s.batch * groups, pool, [&](int64_t task, int64_t slot) {
        combine<Vec>(task / groups, task % groups, slots + slot * layout.floats);
      });
      return;
    }
    for_each_block(pool, [&](int64_t seq_index, int64_t group, int64_t q_block, float* ws) {
      block<Vec>(seq_index, group, q_block, ws);
    });
  }

  // body(sequence, group, query block, slot workspace) for every query block, a task each.
  template <typename Body>
  void for_each_block(const ThreadPool& pool, Body&& body) const {
    const int64_t q_blocks = layout.q_blocks, groups = layout.groups;
    float* slots = static_cast<float*>(p.workspace);
    for_each_task(s.batch * groups * q_blocks, pool, [&](int64_t task, int64_t slot) {
      // Late query blocks first: under a causal mask they see the most keys.
      const int64_t q_block = q_blocks - 1 - task % q_blocks, group = task / q_blocks % groups;
      body(task / q_blocks / groups, group, q_block, slots + slot * layout.floats);
    });
  }

  static void run(const AttentionFwdParams& p, const ThreadPool& pool) {
    const AttentionShape& s = p.shape;
    const attention_layout::FwdSlot layout = attention_layout::fwd_slot(s, pool);
    if (!s.fp8.enabled) return Forward{p, s, layout, use_bf16_dots<T>(), FwdPass::kOnline}.run_online(pool);
    // Each slot keeps the max of the P it quantises (0 before any); the max over slots is
    // the same whichever slot ran which task.
    float* slots = static_cast<float*>(p.workspace);
    const int64_t slot_count = attention_layout::slot_count(s.batch * layout.groups * layout.q_blocks, pool);
    for (int64_t slot = 0; slot < slot_count; ++slot) slots[slot * layout.floats + layout.amax] = 0.0f;
    // FP8 attention never splits the keys (fwd_splits): each query block's lse, then its P and
    // O while its keys and values are still in cache.
    const Forward stats{p, s, layout, use_bf16_dots<T>(), FwdPass::kStats};
    const Forward values{p, s, layout, use_bf16_dots<T>(), FwdPass::kValues};
    stats.for_each_block(pool, [&](int64_t seq_index, int64_t group, int64_t q_block, float* ws) {
      stats.template block<Vec>(seq_index, group, q_block, ws);
      values.template block<Vec>(seq_index, group, q_block, ws);
    });
    float amax = 0.0f;
    for (int64_t slot = 0; slot < slot_count; ++slot) amax = std::max(amax, slots[slot * layout.floats + layout.amax]);
    if (s.fp8.probs_amax != nullptr) *s.fp8.probs_amax = amax;
  }
};

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail
