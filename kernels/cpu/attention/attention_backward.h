// Flash attention's backward pass (attention_kernels.h says how it runs), written over the
// tier's vector type.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including attention_backward.h"
#endif
#pragma once

#include "cpu/attention/attention_logits.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail {

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
struct Backward {
  const AttentionBwdParams& p;
  const AttentionShape& s;
  attention_layout::BwdSlot layout;
  using Dots = Bf16Dots<T>;
  // S, dP and D on Bf16Dots<T> (bf16 inputs, AVX512-BF16), as the forward's S; the products
  // with P and dS stay fp32 FMAs. The bf16 rows live in the slot's q16 and dout16, the pairs
  // of K^T and V^T in kt and vt.
  bool dots;
  // FP8 attention (AttentionFp8): P's and G's codes in the products, and the factors that
  // scale the gradients' sums (1 without FP8).
  bool fp8;
  float dk_factor, dv_factor;

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
      if (dots) bf16_pack_rows(q + t * p.q_strides.token, dout + t * p.grad_out_strides.token, t, ws);
      const double row_lse = lse[t * p.lse_strides.token];
      lse_hi[t] = float(row_lse);
      lse_lo[t] = std::isfinite(row_lse) ? float(row_lse - double(lse_hi[t])) : 0.0f;
    }
    if (dots) {
      bf16_row_deltas(out, seq.lq, ws, delta);
    } else {
      row_deltas<V>(out, p.out_strides.token, do_pack, dvp, dv, seq.lq, ws + layout.o_cols, ws + layout.o_diag, delta);
    }
    if (fp8) {  // the sums of code products times the scale_invs' product
      for (int64_t t = 0; t < seq.lq; ++t) delta[t] *= s.fp8.delta_factor;
    }
    const bool fp8_dots = fp8 && dots;  // dV, dK and dQ on the bf16 dot products too
    if (fp8_dots) fp8_pack_queries(seq.lq, ws);
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
      const float* key_rows[kBlockKv];  // the packed rows, for dot_rows
      for (int64_t j = 0; j < nk; ++j) {
        widen_row<V>(k + (k0 + j) * p.k_strides.token, k_pack + j * dkp, dk, dkp);
        key_rows[j] = k_pack + j * dkp;
      }
      std::fill(k_pack + nk * dkp, k_pack + n * dkp, 0.0f);
      if (dots) {
        bf16_pack_keys(k + k0 * p.k_strides.token, v + k0 * p.v_strides.token, nk, n, ws);
      } else {
        transpose(k_pack, dkp, nk, n, dk, kt, kBlockKv);
        for (int64_t c = 0; c < dv; ++c) {
          float* col = vt + c * kBlockKv;
          for (int64_t j = 0; j < nk; ++j) col[j] = float(to_float(v[(k0 + j) * p.v_strides.token + c]));
          std::fill(col + nk, col + n, 0.0f);
        }
      }
      if (fp8_dots) fp8_pack_keys(k_pack, nk, n, ws);
      std::fill(dk_acc, dk_acc + nk * dkp, 0.0f);
      std::fill(dv_acc, dv_acc + nk * dvp, 0.0f);
      for (int64_t t0 = 0; t0 < seq.lq; t0 += kBlockQ) {
        const int64_t rows = std::min(kBlockQ, seq.lq - t0);
        if (key_hi(seq, s, t0 + rows - 1) <= k0 || key_lo(seq, s, t0) >= k0 + nk) continue;
        // S as the forward computed it, bit for bit (attention_layout::scores_by_rows).
        if (dots) {
          bf16_scores(k + k0 * p.k_strides.token, t0, rows, nk, n, probs, ws);
        } else if (attention_layout::scores_by_rows(rows)) {
          dot_rows<V>(q_pack + t0 * dkp, dkp, key_rows, dk, rows, nk, probs, kBlockKv);
        } else {
          std::fill(probs, probs + rows * kBlockKv, 0.0f);
          gemm_acc<V>(q_pack + t0 * dkp, dkp, kt, kBlockKv, probs, kBlockKv, rows, n, dk);
        }
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
          if (dropout) keep_factors<V>(s, dropout_row(s, seq_index, head, t), k0, j_lo, j_hi, keep + r * kBlockKv);
        }
        // dV += (P Z)^T dO; with FP8, P Z's E4M3 codes as the forward quantised them (rows
        // padded to an even count with zeros: the dot products take queries in pairs)
        const int64_t rows_even = round_up(rows, 2);
        transpose(probs, kBlockKv, rows, rows_even, nk, probs_t, kBlockQ, dropout ? keep : nullptr);
        if (fp8) {
          for (int64_t j = 0; j < nk; ++j) {
            fp8_values_in_place<V, Fp8Format::kE4M3>(probs_t + j * kBlockQ, 0, rows, s.fp8.probs_scale);
          }
        }
        if (fp8_dots) {
          fp8_dot(probs_t, kBlockQ, nk, rows_even, layout.dout_pairs, t0, dvp, dv_acc, ws);
        } else {
          gemm_acc<V>(probs_t, kBlockQ, do_pack + t0 * dvp, dvp, dv_acc, dvp, nk, dvp, rows);
        }
        // G = P * (Z dO V^T - D), dS = G * cap' * scale
        std::fill(dscores, dscores + rows * kBlockKv, 0.0f);
        if (dots) {
          bf16_dp(t0, rows, n, dscores, ws);
        } else {
          gemm_acc<V>(do_pack + t0 * dvp, dvp, vt, kBlockKv, dscores, kBlockKv, rows, n, dv);
        }
        for (int64_t r = 0; r < rows; ++r) {
          float* ds = dscores + r * kBlockKv;
          const float* pr = probs + r * kBlockKv;
          const float* factors = keep + r * kBlockKv;
          const float d = delta[t0 + r], dp_factor = fp8 ? s.fp8.dp_factor : 1.0f;
          sweep<V>(0, n, [&](auto* tag, int64_t j) {
            using W = VecOf<decltype(tag)>;
            const W sums = fp8 ? W::load(ds + j) * W::broadcast(dp_factor) : W::load(ds + j);
            const W dp = dropout ? sums * W::load(factors + j) : sums;
            (W::load(pr + j) * (dp - W::broadcast(d))).store(ds + j);
          });
          if (p.grad_bias != nullptr) {
            float* grad_bias = p.grad_bias + dense_offset(p.grad_bias_strides, seq_index, head, t0 + r) + k0;
            std::copy(ds, ds + nk, grad_bias);
          }
          if (fp8) {  // G's codes; the softmax scale waits in dq_factor and dk_factor
            const float amax = fp8_values_in_place<V>(ds, 0, n, s.fp8.grad_scores_scale, s.fp8.grad_scores_format);
            ws[layout.amax] = std::max(ws[layout.amax], amax);
            continue;
          }
          const float* slopes = cap_slope + r * kBlockKv;
          sweep<V>(0, n, [&](auto* tag, int64_t j) {
            using W = VecOf<decltype(tag)>;
            const W g = capped ? W::load(ds + j) * W::load(slopes + j) : W::load(ds + j);
            (g * W::broadcast(s.scale)).store(ds + j);
          });
        }
        // dK += dS^T Q, dQ += dS K
        transpose(dscores, kBlockKv, rows, rows_even, nk, dscores_t, kBlockQ);
        if (fp8_dots) {
          fp8_dot(dscores_t, kBlockQ, nk, rows_even, layout.q_pairs, t0, dkp, dk_acc, ws);
          fp8_dot(dscores, kBlockKv, rows, n, layout.k_pairs, 0, dkp, dq_acc + t0 * dkp, ws);
        } else {
          gemm_acc<V>(dscores_t, kBlockQ, q_pack + t0 * dkp, dkp, dk_acc, dkp, nk, dkp, rows);
          gemm_acc<V>(dscores, kBlockKv, k_pack, dkp, dq_acc + t0 * dkp, dkp, rows, dkp, n);
        }
      }
      if (ratio > 1) {
        std::copy(dk_acc, dk_acc + nk * dkp, shares_k + k0 * dkp);
        std::copy(dv_acc, dv_acc + nk * dvp, shares_v + k0 * dvp);
      } else {
        with_grad(p.grad_k, [&](auto* grad) {
          for (int64_t j = 0; j < nk; ++j) {
            narrow_row<V>(dk_acc + j * dkp, dk_factor, grad + at(p.grad_k_strides, kv_head, seq.start_kv + k0 + j), dk);
          }
        });
        with_grad(p.grad_v, [&](auto* grad) {
          for (int64_t j = 0; j < nk; ++j) {
            narrow_row<V>(dv_acc + j * dvp, dv_factor, grad + at(p.grad_v_strides, kv_head, seq.start_kv + k0 + j), dv);
          }
        });
      }
    }
    const float dq_factor = fp8 ? s.fp8.dq_factor : 1.0f;
    with_grad(p.grad_q, [&](auto* grad) {
      for (int64_t t = 0; t < seq.lq; ++t) narrow_row<V>(dq_acc + t * dkp, dq_factor, grad + at(p.grad_q_strides, head, seq.start_q + t), dk);
    });
  }

  // body(grad) with the gradient tensor `base` as its elements: T, or fp32 for FP8 attention
  // (whose caller rounds each gradient once, in its FP8 cast).
  template <typename Body>
  void with_grad(void* base, Body&& body) const {
    if (fp8) {
      body(static_cast<float*>(base));
    } else {
      body(static_cast<T*>(base));
    }
  }

  // The bf16 dot products' parts of head_task (reached only where dots is set).
  // Query row t and output-gradient row t as bf16 rows.
  void bf16_pack_rows(const T* q, const T* dout, int64_t t, float* ws) const {
    if constexpr (Dots::kCompiled) {
      const int64_t wq = padded_bf16(s.head_dim_qk), wv = padded_bf16(s.head_dim_v);
      Dots::copy_row(q, s.head_dim_qk, wq, reinterpret_cast<uint16_t*>(ws + layout.q16) + t * wq);
      Dots::copy_row(dout, s.head_dim_v, wv, reinterpret_cast<uint16_t*>(ws + layout.dout16) + t * wv);
    }
  }

  // D as row_deltas, on the dot products in dP's order: out^T's pairs of 16 rows at a time are
  // B, dO's rows A, and D the diagonal.
  void bf16_row_deltas(const T* out, int64_t rows, float* ws, float* delta) const {
    if constexpr (Dots::kCompiled) {
      const int64_t dv = s.head_dim_v, wv = padded_bf16(dv);
      const uint32_t* dout_pairs = reinterpret_cast<const uint32_t*>(ws + layout.dout16);  // [rows][wv / 2]
      uint32_t* out_pairs = reinterpret_cast<uint32_t*>(ws + layout.o_cols);              // [(dv + 1) / 2][16]
      float* diag = ws + layout.o_diag;                                                    // [16][16]
      for (int64_t t0 = 0; t0 < rows; t0 += 16) {
        const int64_t group = std::min<int64_t>(16, rows - t0);
        Dots::pairs_of_columns([&](int64_t r) { return out + (t0 + r) * p.out_strides.token; }, group, 16, dv,
                               out_pairs, 16);
        std::fill(diag, diag + 16 * 16, 0.0f);
        Dots::pair_gemm(dout_pairs + t0 * wv / 2, wv / 2, out_pairs, 16, diag, 16, group, 16, (dv + 1) / 2);
        for (int64_t r = 0; r < group; ++r) delta[t0 + r] = diag[r * 16 + r];
      }
    }
  }

  // The key block's rows (k, v at its first key) for S and dP: keys as K^T's pairs (kt), values
  // as V^T's pairs (vt).
  void bf16_pack_keys(const T* k, const T* v, int64_t nk, int64_t n, float* ws) const {
    if constexpr (Dots::kCompiled) {
      const int64_t dk = s.head_dim_qk;
      Dots::pairs_of_columns([&](int64_t j) { return k + j * p.k_strides.token; }, nk, n, dk,
                             reinterpret_cast<uint32_t*>(ws + layout.kt), kBlockKv);
      Dots::pairs_of_columns([&](int64_t j) { return v + j * p.v_strides.token; }, nk, n, s.head_dim_v,
                             reinterpret_cast<uint32_t*>(ws + layout.vt), kBlockKv);
    }
  }

  // S of queries [t0, t0 + rows) against the block (k at its first key), as
  // Forward::bf16_block_scores computes it.
  void bf16_scores(const T* k, int64_t t0, int64_t rows, int64_t nk, int64_t n, float* probs, float* ws) const {
    if constexpr (Dots::kCompiled) {
      const int64_t dk = s.head_dim_qk, wq = padded_bf16(dk);
      const uint16_t* q16 = reinterpret_cast<const uint16_t*>(ws + layout.q16) + t0 * wq;
      if (attention_layout::scores_by_rows(rows)) {
        const T* keys[kBlockKv];
        for (int64_t j = 0; j < nk; ++j) keys[j] = k + j * p.k_strides.token;
        Dots::dot_rows(q16, wq, keys, dk, rows, nk, probs, kBlockKv);
        return;
      }
      std::fill(probs, probs + rows * kBlockKv, 0.0f);
      Dots::pair_gemm(reinterpret_cast<const uint32_t*>(q16), wq / 2, reinterpret_cast<const uint32_t*>(ws + layout.kt),
                      kBlockKv, probs, kBlockKv, rows, n, (dk + 1) / 2);
    }
  }

  // dP += dO V^T of queries [t0, t0 + rows).
  void bf16_dp(int64_t t0, int64_t rows, int64_t n, float* dscores, float* ws) const {
    if constexpr (Dots::kCompiled) {
      const int64_t dv = s.head_dim_v, wv = padded_bf16(dv);
      Dots::pair_gemm(reinterpret_cast<const uint32_t*>(ws + layout.dout16) + t0 * wv / 2, wv / 2,
                      reinterpret_cast<const uint32_t*>(ws + layout.vt), kBlockKv, dscores, kBlockKv, rows, n,
                      (dv + 1) / 2);
    }
  }

  // FP8 attention's dot products (reached only where dots is set). Every operand holds FP8
  // code values, which bf16 holds exactly, so each product is exact, as with the fp32 FMAs.
  // The task's queries and output gradients as pairs of consecutive queries.
  void fp8_pack_queries(int64_t lq, float* ws) const {
    if constexpr (Dots::kCompiled) {
      const int64_t dkp = layout.dkp, dvp = layout.dvp, pairs = (lq + 1) / 2;
      const float* q_pack = ws + layout.q;
      const float* do_pack = ws + layout.dout;
      Dots::pairs_of_rows([&](int64_t t) { return q_pack + t * dkp; }, lq, s.head_dim_qk, dkp, pairs,
                          reinterpret_cast<uint32_t*>(ws + layout.q_pairs), dkp);
      Dots::pairs_of_rows([&](int64_t t) { return do_pack + t * dvp; }, lq, s.head_dim_v, dvp, pairs,
                          reinterpret_cast<uint32_t*>(ws + layout.dout_pairs), dvp);
    }
  }

  // The key block's rows (k_pack [nk][dkp]) as pairs of consecutive keys [n / 2][dkp].
  void fp8_pack_keys(const float* k_pack, int64_t nk, int64_t n, float* ws) const {
    if constexpr (Dots::kCompiled) {
      Dots::pairs_of_rows([&](int64_t j) { return k_pack + j * layout.dkp; }, nk, s.head_dim_qk, layout.dkp, n / 2,
                          reinterpret_cast<uint32_t*>(ws + layout.k_pairs), layout.dkp);
    }
  }

  // c [m][width] += a [m][len] (ld_a apart, len even, code values) times the pairs at `pairs`
  // (a slot buffer of rows `width` apart) from pair first / 2: the pairs along len of each row
  // of a made in the slot's a_pairs first.
  void fp8_dot(const float* a, int64_t ld_a, int64_t m, int64_t len, int64_t pairs, int64_t first, int64_t width,
               float* c, float* ws) const {
    if constexpr (Dots::kCompiled) {
      uint32_t* a_pairs = reinterpret_cast<uint32_t*>(ws + layout.a_pairs);  // [m][len / 2]
      for (int64_t r = 0; r < m; ++r) Dots::pairs_of_values(a + r * ld_a, len, a_pairs + r * (len / 2));
      Dots::pair_gemm(a_pairs, len / 2, reinterpret_cast<const uint32_t*>(ws + pairs) + first / 2 * width, width, c,
                      width, m, width, len / 2);
    }
  }

  // GQA: dk, dv of (sequence, key/value head, block of keys) = the sum of its query heads'
  // shares, in head order.
  template <typename V>
  void add_shares(int64_t seq_index, int64_t kv_head, int64_t k0) const {
    const Sequence seq = attention_layout::sequence(s, seq_index);
    const int64_t ratio = s.heads / s.kv_heads, nk = std::min(kBlockKv, seq.lkv - k0);
    const int64_t dkp = layout.dkp, dvp = layout.dvp;
    const auto add = [&](int64_t width, int64_t padded, auto share_of, float factor, void* base,
                         const AttentionStrides& strides) {
      with_grad(base, [&](auto* grad) {
        for (int64_t j = k0; j < k0 + nk; ++j) {
          auto* row = grad + attention_layout::row_offset(strides, seq_index, kv_head, seq.start_kv + j);
          sweep<V>(0, width, [&](auto* tag, int64_t c) {
            using W = VecOf<decltype(tag)>;
            W sum = W::load(share_of(kv_head * ratio) + j * padded + c);
            for (int64_t h = kv_head * ratio + 1; h < (kv_head + 1) * ratio; ++h) sum = sum + W::load(share_of(h) + j * padded + c);
            (sum * W::broadcast(factor)).store(row + c);
          });
        }
      });
    };
    add(s.head_dim_qk, dkp, [&](int64_t h) { return share_k(seq_index, h); }, dk_factor, p.grad_k, p.grad_k_strides);
    add(s.head_dim_v, dvp, [&](int64_t h) { return share_v(seq_index, h); }, dv_factor, p.grad_v, p.grad_v_strides);
  }

  static void run(const AttentionBwdParams& p, const ThreadPool& pool) {
    const AttentionShape& s = p.shape;
    const Backward self{p, s, attention_layout::bwd_slot(s, pool), use_bf16_dots<T>(), s.fp8.enabled,
                        s.fp8.enabled ? s.fp8.dk_factor : 1.0f, s.fp8.enabled ? s.fp8.dv_factor : 1.0f};
    // Each slot keeps the max |G| it quantises (FP8); the max over slots is the same whichever
    // slot ran which task.
    float* slots = static_cast<float*>(p.workspace);
    const int64_t slot_count = attention_layout::slot_count(s.batch * s.heads, pool);
    for (int64_t slot = 0; slot < slot_count; ++slot) slots[slot * self.layout.floats + self.layout.amax] = 0.0f;
    for_each_task(s.batch * s.heads, pool, [&](int64_t task, int64_t slot) {
      self.template head_task<Vec>(task / s.heads, task % s.heads, slots + slot * self.layout.floats);
    });
    if (s.fp8.enabled && s.fp8.grad_scores_amax != nullptr) {
      float amax = 0.0f;
      for (int64_t slot = 0; slot < slot_count; ++slot) amax = std::max(amax, slots[slot * self.layout.floats + self.layout.amax]);
      *s.fp8.grad_scores_amax = amax;
    }
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

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail
