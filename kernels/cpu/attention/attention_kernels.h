// Flash attention (te_kernels/attention.h), written once over the tier's vector type and
// compiled once per SIMD tier.
//
// Forward, one task per (sequence, head, block of query rows), tasks handed out from a shared
// counter so that cheap (early causal) and dear blocks balance over the threads:
//   pack the block's queries (fp32);
//   for each key block the mask reaches: S = Q K^T (fp32 FMAs), turned into logits (scale,
//   softcap, ALiBi, bias, dense mask) within each row's key range; the online softmax rescales
//   the running output, P = exp(S - m), dropout's keep factors applied; O += P V;
//   the sink (if any) joins l; out = O / l rounded once, lse = m + log l.
// Backward (FlashAttention-2), one task per (sequence, query head): the task packs its
// queries and output gradient, D = rowsum(dO * out) (row_deltas: the same FMA chain as dP),
// then walks the key blocks; for each it walks the query blocks that reach it, recomputes
// P = exp(S - lse) from the fp64 lse (split into two floats, so no rounding of lse scales P),
// and accumulates, with Z dropout's keep factors (1 without dropout) and cap' the softcap's
// derivative (1 without),
//   dV += (P Z)^T dO,  G = P * (Z dO V^T - D) (dL/dS, the bias's gradient),
//   dS = G * cap' * scale,  dK += dS^T Q,  dQ += dS K
// in fp32; a sink's gradient is -sum over rows of exp(offset - lse) D. dK and dV of a block are final once its query blocks are done; with GQA each query
// head writes its share to an fp32 buffer and a second pass adds the shares in head order.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including attention_kernels.h"
#endif

#include <atomic>
#include <limits>

#include "cpu/attention/attention_layout.h"
#include "cpu/simd/vec_math.h"
#include "cpu/softmax/softmax_row.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace attention_detail {

using softmax_row::VecOf;
using softmax_row::sweep;
using Scalar = VecPortable<float, 1>;
using attention_layout::kBlockKv;
using attention_layout::kBlockQ;
using attention_layout::key_hi;
using attention_layout::key_lo;
using attention_layout::Sequence;
using attention_layout::dense_offset;

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// C[m x n] += A[m x k] B[k x n]: A read as scalars (rows lda apart), B and C as rows of
// vectors (ldb, ldc apart); n a multiple of V::kWidth. Register tiles of R rows by NV vectors:
// each step of k loads NV vectors of B and broadcasts R scalars of A into R * NV FMAs.
template <typename V, int R, int NV>
inline void tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t k) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) acc[r][n] = V::load(c + r * ldc + n * V::kWidth);
  for (int64_t kk = 0; kk < k; ++kk) {
    V bv[NV];
    for (int n = 0; n < NV; ++n) bv[n] = V::load(b + kk * ldb + n * V::kWidth);
    for (int r = 0; r < R; ++r) {
      const V av = V::broadcast(a[r * lda + kk]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fmadd(av, bv[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) acc[r][n].store(c + r * ldc + n * V::kWidth);
}

template <typename V, int R>
inline void tile_columns(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n,
                         int64_t k) {
  int64_t j = 0;
  for (; j + 2 * V::kWidth <= n; j += 2 * V::kWidth) tile<V, R, 2>(a, lda, b + j, ldb, c + j, ldc, k);
  for (; j < n; j += V::kWidth) tile<V, R, 1>(a, lda, b + j, ldb, c + j, ldc, k);
}

template <typename V>
void gemm_acc(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m, int64_t n,
              int64_t k) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) tile_columns<V, 4>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
  switch (m - i) {
    case 3: return tile_columns<V, 3>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    case 2: return tile_columns<V, 2>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    case 1: return tile_columns<V, 1>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    default: return;
  }
}

// dst[0, n) = src widened to fp32; dst[n, padded) = 0.
template <typename V, typename T>
inline void widen_row(const T* src, float* dst, int64_t n, int64_t padded) {
  sweep<V>(0, n, [&](auto* tag, int64_t c) { VecOf<decltype(tag)>::load(src + c).store(dst + c); });
  std::fill(dst + n, dst + padded, 0.0f);
}

template <typename V, typename T>
inline void narrow_row(const float* src, float factor, T* dst, int64_t n) {
  sweep<V>(0, n, [&](auto* tag, int64_t c) {
    using W = VecOf<decltype(tag)>;
    (W::load(src + c) * W::broadcast(factor)).store(dst + c);
  });
}

// dst[c][j] = src[j][c] (times factor[j][c], laid out as src, when given) for j < rows,
// c < cols (dst rows ld_dst apart), zero for j in [rows, padded_rows).
inline void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t padded_rows, int64_t cols, float* dst,
                      int64_t ld_dst, const float* factor = nullptr) {
  for (int64_t c = 0; c < cols; ++c) {
    float* out = dst + c * ld_dst;
    if (factor != nullptr) {
      for (int64_t j = 0; j < rows; ++j) out[j] = src[j * ld_src + c] * factor[j * ld_src + c];
    } else {
      for (int64_t j = 0; j < rows; ++j) out[j] = src[j * ld_src + c];
    }
    std::fill(out + rows, out + padded_rows, 0.0f);
  }
}

// What turns one query row's products q.k into its logits (te_kernels/attention.h), the dense
// operands pointed at the row's entry for the block's first key k0.
template <typename T>
struct RowTerms {
  float scale, softcap, slope;
  int64_t distance_at_0;  // pos - k0: ALiBi's distance to the block's first key
  const T* bias;          // or null
  const uint8_t* mask;    // or null
};

template <typename T>
inline RowTerms<T> row_terms(const AttentionShape& s, const Sequence& seq, int64_t seq_index, int64_t head, float slope,
                             int64_t t, int64_t k0) {
  RowTerms<T> terms{s.scale, s.softcap, slope, t + seq.offset - k0, nullptr, nullptr};
  if (s.bias != nullptr) terms.bias = static_cast<const T*>(s.bias) + dense_offset(s.bias_strides, seq_index, head, t) + k0;
  if (s.mask != nullptr) terms.mask = s.mask + dense_offset(s.mask_strides, seq_index, head, t) + k0;
  return terms;
}

// The logits of one score row, in place over the keys [lo, hi) it sees (block-relative); the
// caller zeroes the row outside them. With a softcap, cap_slope (when given) receives its
// derivative 1 - tanh^2 over [lo, hi).
template <typename V, typename T>
inline void logits_in_place(float* row, int64_t lo, int64_t hi, const RowTerms<T>& terms, float* cap_slope) {
  if (terms.softcap > 0.0f) {
    sweep<V>(lo, hi, [&](auto* tag, int64_t j) {
      using W = VecOf<decltype(tag)>;
      const W cap = W::broadcast(terms.softcap);
      const W t = tanh(W::load(row + j) * W::broadcast(terms.scale) / cap);
      (t * cap).store(row + j);
      if (cap_slope != nullptr) (W::broadcast(1.0f) - t * t).store(cap_slope + j);
    });
  } else {
    sweep<V>(lo, hi, [&](auto* tag, int64_t j) {
      using W = VecOf<decltype(tag)>;
      (W::load(row + j) * W::broadcast(terms.scale)).store(row + j);
    });
  }
  if (terms.slope != 0.0f) {
    // ALiBi: -slope * |pos - key|, key = block start + j; distance_at_0 = pos - block start.
    for (int64_t j = lo; j < hi; ++j) row[j] -= terms.slope * float(std::abs(terms.distance_at_0 - j));
  }
  if (terms.bias != nullptr) {
    sweep<V>(lo, hi, [&](auto* tag, int64_t j) {
      using W = VecOf<decltype(tag)>;
      (W::load(row + j) + W::load(terms.bias + j)).store(row + j);
    });
  }
  if (terms.mask != nullptr) {
    sweep<V>(lo, hi, [&](auto* tag, int64_t j) {
      using W = VecOf<decltype(tag)>;
      W::select(terms.mask + j, W::broadcast(kMinusInf), W::load(row + j)).store(row + j);
    });
  }
}

// Dropout's counter row of (sequence, query head, query t): the header's Philox counter.
inline uint64_t dropout_row(const AttentionShape& s, int64_t seq_index, int64_t head, int64_t t) {
  return uint64_t((seq_index * s.heads + head) * s.max_sq + t);
}

// visit(j, factor) for the keys k0 + j, j in [lo, hi), of one row: factor 0 where dropout drops
// the key, 1 / (1 - p) where it keeps it. One Philox call serves four consecutive keys.
template <typename Visit>
inline void for_each_keep_factor(const AttentionShape& s, uint64_t row, int64_t k0, int64_t lo, int64_t hi,
                                 Visit&& visit) {
  const float kept = 1.0f / (1.0f - s.dropout);
  for (int64_t j = lo; j < hi;) {
    const int64_t key = k0 + j;
    const Philox4 bits = philox4x32(uint32_t(key / 4), uint32_t(row), uint32_t(s.dropout_offset),
                                    uint32_t(s.dropout_offset >> 32), s.dropout_seed);
    for (int64_t lane = key % 4; lane < 4 && j < hi; ++lane, ++j) {
      const float uniform = float(bits.word[lane] >> 8) * 0x1p-24f;
      visit(j, uniform < s.dropout ? 0.0f : kept);
    }
  }
}

inline int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Runs body(task, slot) for every task in [0, tasks): each of the pool's bodies takes a
// workspace slot and pulls tasks from a shared counter until none is left. Which thread runs
// a task never changes its result.
template <typename Body>
void for_each_task(int64_t tasks, const ThreadPool& pool, Body&& body) {
  const int64_t slots = attention_layout::slot_count(tasks, pool);
  std::atomic<int64_t> next{0};
  pool.parallel_for(slots, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slot = begin; slot < end; ++slot) {
      for (int64_t task = next.fetch_add(1); task < tasks; task = next.fetch_add(1)) body(task, slot);
    }
  });
}

// D[t] = dO[t] . out[t] for t < rows, each the same chain of fp32 FMAs over the channels as the
// entries of dP = dO V^T (gemm_acc): where a row's softmax is one-hot, out[t] is the value row it
// picked, bit for bit, and dP - D is then exactly 0 (a sum in another order leaves rounding
// noise times |dO| |v| there, which dS = P (dP - D) passes on whole). Rows go in groups of one
// vector's width: out^T of the group is B, and D is the diagonal of the product.
template <typename V, typename T>
void row_deltas(const T* out, int64_t out_token_stride, const float* dout, int64_t ld_dout, int64_t dv, int64_t rows,
                float* cols, float* diag, float* delta) {
  constexpr int64_t W = V::kWidth;
  for (int64_t t0 = 0; t0 < rows; t0 += W) {
    const int64_t group = std::min(W, rows - t0);
    std::fill(cols, cols + dv * W, 0.0f);
    for (int64_t r = 0; r < group; ++r) {
      const T* row = out + (t0 + r) * out_token_stride;
      for (int64_t c = 0; c < dv; ++c) cols[c * W + r] = float(to_float(row[c]));
    }
    std::fill(diag, diag + W * W, 0.0f);
    gemm_acc<V>(dout + t0 * ld_dout, ld_dout, cols, W, diag, W, group, W, dv);
    for (int64_t r = 0; r < group; ++r) delta[t0 + r] = diag[r * W + r];
  }
}

template <typename T>
struct Forward {
  const AttentionFwdParams& p;
  const AttentionShape& s;
  attention_layout::FwdSlot layout;

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

  // The keys [k_lo, k_hi) of the query rows [t0, t0 + rows) into the slot's running output,
  // row maxima and row sums (started here).
  template <typename V>
  void accumulate(int64_t seq_index, int64_t head, const Sequence& seq, int64_t t0, int64_t rows, int64_t k_lo,
                  int64_t k_hi, float* ws) const {
    const int64_t dk = s.head_dim_qk, dv = s.head_dim_v, dvp = layout.dvp, kv_head = head / (s.heads / s.kv_heads);
    const float slope = attention_layout::alibi_slope(s, seq_index, head);
    float* q_pack = ws + layout.q;  // [kBlockQ][dk]
    float* kt = ws + layout.kt;     // [dk][kBlockKv]
    float* v_pack = ws + layout.v;  // [kBlockKv][dvp]
    float* scores = ws + layout.s;  // [kBlockQ][kBlockKv]
    float* acc = ws + layout.o;     // [kBlockQ][dvp]
    float* row_max = ws + layout.m;
    float* row_sum = ws + layout.l;
    const T* q = static_cast<const T*>(p.q) + attention_layout::row_offset(p.q_strides, seq_index, head, seq.start_q);
    const T* k = static_cast<const T*>(p.k) + attention_layout::row_offset(p.k_strides, seq_index, kv_head, 0);
    const T* v = static_cast<const T*>(p.v) + attention_layout::row_offset(p.v_strides, seq_index, kv_head, 0);
    for (int64_t r = 0; r < rows; ++r) {
      widen_row<V>(q + (t0 + r) * p.q_strides.token, q_pack + r * dk, dk, dk);
      std::fill(acc + r * dvp, acc + (r + 1) * dvp, 0.0f);
      row_max[r] = kMinusInf;
      row_sum[r] = 0.0f;
    }
    int64_t tokens[kBlockKv];
    for (int64_t k0 = k_lo; k0 < k_hi; k0 += kBlockKv) {
      const int64_t nk = std::min(kBlockKv, k_hi - k0), n = round_up(nk, V::kWidth);
      key_tokens(seq, seq_index, k0, nk, tokens);
      // K^T: [dk][n], keys past nk zero.
      for (int64_t c = 0; c < dk; ++c) {
        float* col = kt + c * kBlockKv;
        for (int64_t j = 0; j < nk; ++j) col[j] = float(to_float(k[tokens[j] * p.k_strides.token + c]));
        std::fill(col + nk, col + n, 0.0f);
      }
      for (int64_t j = 0; j < nk; ++j) widen_row<V>(v + tokens[j] * p.v_strides.token, v_pack + j * dvp, dv, dvp);
      std::fill(v_pack + nk * dvp, v_pack + n * dvp, 0.0f);
      std::fill(scores, scores + rows * kBlockKv, 0.0f);
      gemm_acc<V>(q_pack, dk, kt, kBlockKv, scores, kBlockKv, rows, n, dk);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores + r * kBlockKv;
        const int64_t t = t0 + r;
        const int64_t j_lo = std::max<int64_t>(key_lo(seq, s, t) - k0, 0);
        const int64_t j_hi = std::min<int64_t>(key_hi(seq, s, t) - k0, nk);
        if (j_lo >= j_hi) {
          std::fill(row, row + n, 0.0f);
          continue;
        }
        logits_in_place<V>(row, j_lo, j_hi, row_terms<T>(s, seq, seq_index, head, slope, t, k0), nullptr);
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
        std::fill(row, row + j_lo, 0.0f);
        std::fill(row + j_hi, row + n, 0.0f);
        // The sum l takes every probability; only the product with V sees the dropped ones.
        if (s.dropout > 0.0f) {
          for_each_keep_factor(s, dropout_row(s, seq_index, head, t), k0, j_lo, j_hi,
                               [&](int64_t j, float factor) { row[j] *= factor; });
        }
        const float rescale = std::exp(row_max[r] - new_max);  // 0 on the first block a row sees
        if (rescale != 1.0f) narrow_row<V>(acc + r * dvp, rescale, acc + r * dvp, dvp);
        row_sum[r] = row_sum[r] * rescale + block_sum;
        row_max[r] = new_max;
      }
      gemm_acc<V>(scores, kBlockKv, v_pack, dvp, acc, dvp, rows, dvp, n);
    }
  }

  // out, lse (and the row maxima) of the rows [t0, t0 + rows) from the slot's running output,
  // row maxima and row sums.
  template <typename V>
  void finish(int64_t seq_index, int64_t head, const Sequence& seq, int64_t t0, int64_t rows, float* ws) const {
    const int64_t dv = s.head_dim_v, dvp = layout.dvp;
    const float* acc = ws + layout.o;
    const float* row_max = ws + layout.m;
    const float* row_sum = ws + layout.l;
    T* out = static_cast<T*>(p.out) + attention_layout::row_offset(p.out_strides, seq_index, head, seq.start_q);
    const int64_t row_stats = attention_layout::row_offset(p.lse_strides, seq_index, head, seq.start_q);
    double* lse = p.lse + row_stats;
    float* max_out = p.row_max != nullptr ? p.row_max + row_stats : nullptr;  // laid out as lse
    for (int64_t r = 0; r < rows; ++r) {
      if (max_out != nullptr) max_out[(t0 + r) * p.lse_strides.token] = row_max[r];
      float m = row_max[r], l = row_sum[r], carry = 1.0f;
      if (s.softmax_offset != nullptr) {  // the sink's exp(offset) joins the sum
        const float sink = s.softmax_offset[head], joint = std::max(m, sink);
        carry = std::exp(m - joint);  // 0 when the row saw no key
        l = l * carry + std::exp(sink - joint);
        m = joint;
      }
      if (!(l > 0.0f)) continue;  // no key seen and no sink: out stays zero, lse -inf
      narrow_row<V>(acc + r * dvp, carry / l, out + (t0 + r) * p.out_strides.token, dv);
      lse[(t0 + r) * p.lse_strides.token] = double(m) + std::log(double(l));
    }
  }

  template <typename V>
  void block(int64_t seq_index, int64_t head, int64_t q_block, float* ws) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const int64_t t0 = q_block * kBlockQ, rows = std::min(kBlockQ, seq.lq - t0);
    if (rows <= 0) return;
    accumulate<V>(seq_index, head, seq, t0, rows, key_lo(seq, s, t0), key_hi(seq, s, t0 + rows - 1), ws);
    finish<V>(seq_index, head, seq, t0, rows, ws);
  }

  // Flash-decoding (one query block per (sequence, head)): part `split` of the block's keys,
  // whole key blocks from the first the block sees, kept in its part of the workspace.
  template <typename V>
  void part(int64_t seq_index, int64_t head, int64_t split, float* ws) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    float* kept = part_of(seq_index, head, split);
    const int64_t rows = seq.lq;
    std::fill(kept + layout.part_m, kept + layout.part_m + rows, kMinusInf);
    std::fill(kept + layout.part_l, kept + layout.part_l + rows, 0.0f);
    if (rows <= 0) return;
    const int64_t lo = key_lo(seq, s, 0), hi = key_hi(seq, s, rows - 1);
    const int64_t blocks = (std::max<int64_t>(hi - lo, 0) + kBlockKv - 1) / kBlockKv;
    const int64_t per_split = (blocks + layout.splits - 1) / layout.splits;
    const int64_t k_lo = lo + split * per_split * kBlockKv, k_hi = std::min(hi, k_lo + per_split * kBlockKv);
    if (k_lo >= k_hi) return;
    accumulate<V>(seq_index, head, seq, 0, rows, k_lo, k_hi, ws);
    std::copy(ws + layout.o, ws + layout.o + rows * layout.dvp, kept);
    std::copy(ws + layout.m, ws + layout.m + rows, kept + layout.part_m);
    std::copy(ws + layout.l, ws + layout.l + rows, kept + layout.part_l);
  }

  // The parts of (sequence, head) merged in split order (each rescaled to the joint row max),
  // then finished as one block.
  template <typename V>
  void combine(int64_t seq_index, int64_t head, float* ws) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const int64_t rows = seq.lq, dvp = layout.dvp;
    if (rows <= 0) return;
    float* acc = ws + layout.o;
    float* row_max = ws + layout.m;
    float* row_sum = ws + layout.l;
    for (int64_t r = 0; r < rows; ++r) {
      float joint = kMinusInf;
      for (int64_t split = 0; split < layout.splits; ++split) joint = std::max(joint, part_of(seq_index, head, split)[layout.part_m + r]);
      std::fill(acc + r * dvp, acc + (r + 1) * dvp, 0.0f);
      row_max[r] = joint;
      row_sum[r] = 0.0f;
      if (joint == kMinusInf) continue;
      for (int64_t split = 0; split < layout.splits; ++split) {
        const float* kept = part_of(seq_index, head, split);
        const float factor = std::exp(kept[layout.part_m + r] - joint);  // 0 for a part that saw nothing
        if (factor == 0.0f) continue;
        row_sum[r] += kept[layout.part_l + r] * factor;
        sweep<V>(0, dvp, [&](auto* tag, int64_t c) {
          using W = VecOf<decltype(tag)>;
          fmadd(W::load(kept + r * dvp + c), W::broadcast(factor), W::load(acc + r * dvp + c)).store(acc + r * dvp + c);
        });
      }
    }
    finish<V>(seq_index, head, seq, 0, rows, ws);
  }

  float* part_of(int64_t seq_index, int64_t head, int64_t split) const {
    return static_cast<float*>(p.workspace) + layout.parts + ((seq_index * s.heads + head) * layout.splits + split) * layout.part_floats;
  }

  static void run(const AttentionFwdParams& p, const ThreadPool& pool) {
    const AttentionShape& s = p.shape;
    const Forward self{p, s, attention_layout::fwd_slot(s, pool)};
    float* slots = static_cast<float*>(p.workspace);
    if (self.layout.splits > 1) {
      const int64_t splits = self.layout.splits;
      for_each_task(s.batch * s.heads * splits, pool, [&](int64_t task, int64_t slot) {
        self.template part<Vec>(task / splits / s.heads, task / splits % s.heads, task % splits,
                                slots + slot * self.layout.floats);
      });
      for_each_task(s.batch * s.heads, pool, [&](int64_t task, int64_t slot) {
        self.template combine<Vec>(task / s.heads, task % s.heads, slots + slot * self.layout.floats);
      });
      return;
    }
    const int64_t q_blocks = (s.max_sq + kBlockQ - 1) / kBlockQ;
    const int64_t tasks = s.batch * s.heads * q_blocks;
    for_each_task(tasks, pool, [&](int64_t task, int64_t slot) {
      // Late query blocks first: under a causal mask they see the most keys.
      const int64_t q_block = q_blocks - 1 - task % q_blocks, head = task / q_blocks % s.heads;
      self.template block<Vec>(task / q_blocks / s.heads, head, q_block, slots + slot * self.layout.floats);
    });
  }
};

template <typename T>
struct Backward {
  const AttentionBwdParams& p;
  const AttentionShape& s;
  attention_layout::BwdSlot layout;

  // The fp32 shares of dk and dv of (sequence, query head), GQA only: [max_skv][dkp] and [max_skv][dvp].
  float* share_k(int64_t seq_index, int64_t head) const {
    return static_cast<float*>(p.workspace) + layout.shares + (seq_index * s.heads + head) * s.max_skv * (layout.dkp + layout.dvp);
  }
  float* share_v(int64_t seq_index, int64_t head) const { return share_k(seq_index, head) + s.max_skv * layout.dkp; }

  template <typename V>
  void head_task(int64_t seq_index, int64_t head, float* ws) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const int64_t ratio = s.heads / s.kv_heads, kv_head = head / ratio;
    const int64_t dk = s.head_dim_qk, dv = s.head_dim_v, dkp = layout.dkp, dvp = layout.dvp;
    float* shares_k = ratio > 1 ? share_k(seq_index, head) : nullptr;
    float* shares_v = ratio > 1 ? share_v(seq_index, head) : nullptr;
    if (ratio > 1) {
      std::fill(shares_k, shares_k + seq.lkv * dkp, 0.0f);
      std::fill(shares_v, shares_v + seq.lkv * dvp, 0.0f);
    }
    if (seq.lq == 0 || seq.lkv == 0) return;
    const float slope = attention_layout::alibi_slope(s, seq_index, head);
    float* q_pack = ws + layout.q;        // [lq][dkp]
    float* do_pack = ws + layout.dout;    // [lq][dvp]
    float* delta = ws + layout.delta;     // [lq] D = rowsum(dO * out)
    float* lse_hi = ws + layout.lse_hi;   // [lq] the fp64 lse as hi + lo
    float* lse_lo = ws + layout.lse_lo;   // [lq]
    float* dq_acc = ws + layout.dq;       // [lq][dkp]
    float* kt = ws + layout.kt;           // [dk][kBlockKv]
    float* k_pack = ws + layout.k;        // [kBlockKv][dkp]
    float* vt = ws + layout.vt;           // [dv][kBlockKv]
    float* probs = ws + layout.p;         // [kBlockQ][kBlockKv]
    float* probs_t = ws + layout.pt;      // [kBlockKv][kBlockQ]
    float* dscores = ws + layout.ds;      // [kBlockQ][kBlockKv]
    float* dscores_t = ws + layout.dst;   // [kBlockKv][kBlockQ]
    float* dk_acc = ws + layout.dk;       // [kBlockKv][dkp]
    float* dv_acc = ws + layout.dv;       // [kBlockKv][dvp]
    float* keep = ws + layout.keep;       // [kBlockQ][kBlockKv] dropout's keep factors
    float* cap_slope = ws + layout.cap;   // [kBlockQ][kBlockKv] the softcap's derivative
    const bool dropout = s.dropout > 0.0f, capped = s.softcap > 0.0f;

    const auto at = [&](const AttentionStrides& st, int64_t h, int64_t start) {
      return attention_layout::row_offset(st, seq_index, h, start);
    };
    const T* q = static_cast<const T*>(p.q) + at(p.q_strides, head, seq.start_q);
    const T* out = static_cast<const T*>(p.out) + at(p.out_strides, head, seq.start_q);
    const T* dout = static_cast<const T*>(p.grad_out) + at(p.grad_out_strides, head, seq.start_q);
    const double* lse = p.lse + at(p.lse_strides, head, seq.start_q);
    const T* k = static_cast<const T*>(p.k) + at(p.k_strides, kv_head, seq.start_kv);
    const T* v = static_cast<const T*>(p.v) + at(p.v_strides, kv_head, seq.start_kv);
    for (int64_t t = 0; t < seq.lq; ++t) {
      widen_row<V>(q + t * p.q_strides.token, q_pack + t * dkp, dk, dkp);
      widen_row<V>(dout + t * p.grad_out_strides.token, do_pack + t * dvp, dv, dvp);
      const double row_lse = lse[t * p.lse_strides.token];
      lse_hi[t] = float(row_lse);
      lse_lo[t] = std::isfinite(row_lse) ? float(row_lse - double(lse_hi[t])) : 0.0f;
    }
    row_deltas<V>(out, p.out_strides.token, do_pack, dvp, dv, seq.lq, ws + layout.o_cols, ws + layout.o_diag, delta);
    if (s.softmax_offset != nullptr && p.grad_softmax_offset != nullptr) {
      // dL/d offset = -sum_t P_sink(t) D(t), P_sink = exp(offset - lse): the sink's probability.
      const double sink = s.softmax_offset[head];
      double share = 0.0;
      for (int64_t t = 0; t < seq.lq; ++t) {
        const double row_lse = lse[t * p.lse_strides.token];
        if (std::isfinite(row_lse)) share -= std::exp(sink - row_lse) * double(delta[t]);
      }
      p.grad_softmax_offset[seq_index * s.heads + head] = share;
    }
    std::fill(dq_acc, dq_acc + seq.lq * dkp, 0.0f);

    const int64_t lo = key_lo(seq, s, 0), hi = key_hi(seq, s, seq.lq - 1);
    for (int64_t k0 = lo; k0 < hi; k0 += kBlockKv) {
      const int64_t nk = std::min(kBlockKv, hi - k0), n = round_up(nk, V::kWidth);
      for (int64_t j = 0; j < nk; ++j) widen_row<V>(k + (k0 + j) * p.k_strides.token, k_pack + j * dkp, dk, dkp);
      std::fill(k_pack + nk * dkp, k_pack + n * dkp, 0.0f);
      transpose(k_pack, dkp, nk, n, dk, kt, kBlockKv);
      for (int64_t c = 0; c < dv; ++c) {
        float* col = vt + c * kBlockKv;
        for (int64_t j = 0; j < nk; ++j) col[j] = float(to_float(v[(k0 + j) * p.v_strides.token + c]));
        std::fill(col + nk, col + n, 0.0f);
      }
      std::fill(dk_acc, dk_acc + nk * dkp, 0.0f);
      std::fill(dv_acc, dv_acc + nk * dvp, 0.0f);
      for (int64_t t0 = 0; t0 < seq.lq; t0 += kBlockQ) {
        const int64_t rows = std::min(kBlockQ, seq.lq - t0);
        if (key_hi(seq, s, t0 + rows - 1) <= k0 || key_lo(seq, s, t0) >= k0 + nk) continue;
        std::fill(probs, probs + rows * kBlockKv, 0.0f);
        gemm_acc<V>(q_pack + t0 * dkp, dkp, kt, kBlockKv, probs, kBlockKv, rows, n, dk);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = probs + r * kBlockKv;
          const int64_t t = t0 + r;
          const int64_t j_lo = std::max<int64_t>(key_lo(seq, s, t) - k0, 0);
          const int64_t j_hi = std::min<int64_t>(key_hi(seq, s, t) - k0, nk);
          if (capped) std::fill(cap_slope + r * kBlockKv, cap_slope + r * kBlockKv + n, 0.0f);
          if (dropout) std::fill(keep + r * kBlockKv, keep + r * kBlockKv + n, 0.0f);
          if (j_lo >= j_hi || lse_hi[t] == kMinusInf) {
            std::fill(row, row + n, 0.0f);
            continue;
          }
          logits_in_place<V>(row, j_lo, j_hi, row_terms<T>(s, seq, seq_index, head, slope, t, k0),
                             capped ? cap_slope + r * kBlockKv : nullptr);
          // P = exp((s - lse_hi) - lse_lo): s - lse_hi is exact where P is not negligible, so P
          // carries no rounding of lse (an fp32 lse would scale the whole row by 1 + 1e-6 at
          // logits near 30, 1 + 3e-5 near 600, which dS = P (dP - D) multiplies by |D|).
          const float hi_part = lse_hi[t], lo_part = lse_lo[t];
          sweep<V>(j_lo, j_hi, [&](auto* tag, int64_t j) {
            using W = VecOf<decltype(tag)>;
            exp((W::load(row + j) - W::broadcast(hi_part)) - W::broadcast(lo_part)).store(row + j);
          });
          std::fill(row, row + j_lo, 0.0f);
          std::fill(row + j_hi, row + n, 0.0f);
          if (dropout) {
            float* factors = keep + r * kBlockKv;
            for_each_keep_factor(s, dropout_row(s, seq_index, head, t), k0, j_lo, j_hi,
                                 [&](int64_t j, float factor) { factors[j] = factor; });
          }
        }
        // dV += (P Z)^T dO
        transpose(probs, kBlockKv, rows, rows, nk, probs_t, kBlockQ, dropout ? keep : nullptr);
        gemm_acc<V>(probs_t, kBlockQ, do_pack + t0 * dvp, dvp, dv_acc, dvp, nk, dvp, rows);
        // G = P * (Z dO V^T - D), dS = G * cap' * scale
        std::fill(dscores, dscores + rows * kBlockKv, 0.0f);
        gemm_acc<V>(do_pack + t0 * dvp, dvp, vt, kBlockKv, dscores, kBlockKv, rows, n, dv);
        for (int64_t r = 0; r < rows; ++r) {
          float* ds = dscores + r * kBlockKv;
          const float* pr = probs + r * kBlockKv;
          const float* factors = keep + r * kBlockKv;
          const float d = delta[t0 + r];
          sweep<V>(0, n, [&](auto* tag, int64_t j) {
            using W = VecOf<decltype(tag)>;
            const W dp = dropout ? W::load(ds + j) * W::load(factors + j) : W::load(ds + j);
            (W::load(pr + j) * (dp - W::broadcast(d))).store(ds + j);
          });
          if (p.grad_bias != nullptr) {
            float* grad_bias = p.grad_bias + dense_offset(p.grad_bias_strides, seq_index, head, t0 + r) + k0;
            std::copy(ds, ds + nk, grad_bias);
          }
          const float* slopes = cap_slope + r * kBlockKv;
          sweep<V>(0, n, [&](auto* tag, int64_t j) {
            using W = VecOf<decltype(tag)>;
            const W g = capped ? W::load(ds + j) * W::load(slopes + j) : W::load(ds + j);
            (g * W::broadcast(s.scale)).store(ds + j);
          });
        }
        // dK += dS^T Q, dQ += dS K
        transpose(dscores, kBlockKv, rows, rows, nk, dscores_t, kBlockQ);
        gemm_acc<V>(dscores_t, kBlockQ, q_pack + t0 * dkp, dkp, dk_acc, dkp, nk, dkp, rows);
        gemm_acc<V>(dscores, kBlockKv, k_pack, dkp, dq_acc + t0 * dkp, dkp, rows, dkp, n);
      }
      if (ratio > 1) {
        std::copy(dk_acc, dk_acc + nk * dkp, shares_k + k0 * dkp);
        std::copy(dv_acc, dv_acc + nk * dvp, shares_v + k0 * dvp);
      } else {
        T* grad_k = static_cast<T*>(p.grad_k) + at(p.grad_k_strides, kv_head, seq.start_kv);
        T* grad_v = static_cast<T*>(p.grad_v) + at(p.grad_v_strides, kv_head, seq.start_kv);
        for (int64_t j = 0; j < nk; ++j) {
          narrow_row<V>(dk_acc + j * dkp, 1.0f, grad_k + (k0 + j) * p.grad_k_strides.token, dk);
          narrow_row<V>(dv_acc + j * dvp, 1.0f, grad_v + (k0 + j) * p.grad_v_strides.token, dv);
        }
      }
    }
    T* grad_q = static_cast<T*>(p.grad_q) + at(p.grad_q_strides, head, seq.start_q);
    for (int64_t t = 0; t < seq.lq; ++t) narrow_row<V>(dq_acc + t * dkp, 1.0f, grad_q + t * p.grad_q_strides.token, dk);
  }

  // GQA: dk, dv of (sequence, key/value head, block of keys) = the sum of its query heads'
  // shares, in head order.
  template <typename V>
  void add_shares(int64_t seq_index, int64_t kv_head, int64_t k0) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const int64_t ratio = s.heads / s.kv_heads, nk = std::min(kBlockKv, seq.lkv - k0);
    const int64_t dkp = layout.dkp, dvp = layout.dvp;
    T* grad_k = static_cast<T*>(p.grad_k) + attention_layout::row_offset(p.grad_k_strides, seq_index, kv_head, seq.start_kv);
    T* grad_v = static_cast<T*>(p.grad_v) + attention_layout::row_offset(p.grad_v_strides, seq_index, kv_head, seq.start_kv);
    const auto add = [&](int64_t width, int64_t padded, auto share_of, T* grad, int64_t token_stride) {
      for (int64_t j = k0; j < k0 + nk; ++j) {
        sweep<V>(0, width, [&](auto* tag, int64_t c) {
          using W = VecOf<decltype(tag)>;
          W sum = W::load(share_of(kv_head * ratio) + j * padded + c);
          for (int64_t h = kv_head * ratio + 1; h < (kv_head + 1) * ratio; ++h) sum = sum + W::load(share_of(h) + j * padded + c);
          sum.store(grad + j * token_stride + c);
        });
      }
    };
    add(s.head_dim_qk, dkp, [&](int64_t h) { return share_k(seq_index, h); }, grad_k, p.grad_k_strides.token);
    add(s.head_dim_v, dvp, [&](int64_t h) { return share_v(seq_index, h); }, grad_v, p.grad_v_strides.token);
  }

  static void run(const AttentionBwdParams& p, const ThreadPool& pool) {
    const AttentionShape& s = p.shape;
    const Backward self{p, s, attention_layout::bwd_slot(s, pool)};
    for_each_task(s.batch * s.heads, pool, [&](int64_t task, int64_t slot) {
      self.template head_task<Vec>(task / s.heads, task % s.heads,
                                   static_cast<float*>(p.workspace) + slot * self.layout.floats);
    });
    if (s.heads == s.kv_heads) return;
    const int64_t k_blocks = (s.max_skv + kBlockKv - 1) / kBlockKv;
    pool.parallel_for(s.batch * s.kv_heads * k_blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t seq_index = task / (s.kv_heads * k_blocks), kv_head = task / k_blocks % s.kv_heads;
        const int64_t k0 = task % k_blocks * kBlockKv;
        if (k0 < attention_layout::sequence(s, seq_index).lkv) self.template add_shares<Vec>(seq_index, kv_head, k0);
      }
    });
  }
};

template <typename Params, template <typename> class Pass>
void dispatch(const Params& p, const ThreadPool& pool) {
  switch (p.shape.dtype) {
    case DType::kFloat32: return Pass<float>::run(p, pool);
    case DType::kBFloat16: return Pass<bf16_t>::run(p, pool);
    case DType::kFloat16: return Pass<fp16_t>::run(p, pool);
    case DType::kFloat64: return;  // refused by attention.cpp
  }
}

}  // namespace attention_detail

void attention_fwd(const AttentionFwdParams& p, const ThreadPool& pool) {
  attention_detail::dispatch<AttentionFwdParams, attention_detail::Forward>(p, pool);
}

void attention_bwd(const AttentionBwdParams& p, const ThreadPool& pool) {
  attention_detail::dispatch<AttentionBwdParams, attention_detail::Backward>(p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
