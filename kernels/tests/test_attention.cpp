// Flash-attention kernels of every SIMD tier this CPU has, against a double-precision
// evaluation of softmax(scale q k^T + alibi, masked) v and its gradients: causal top-left and
// bottom-right, windows, per-sequence lengths, packed (thd) layouts with gaps, GQA, head dims
// whose vectors have scalar tails, and sizes that cut the 64-row blocks. fp32 data, so the only
// differences are the kernels' fp32 rounding. The backward must give the same bits on one and
// on two threads.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "check.h"
#include "workspace.h"
#include "te_kernels/attention.h"
#include "te_kernels/cpu_isa.h"
#include "two_threads.h"

using namespace te_kernels;
using te_kernels::test::Workspace;

namespace {

struct Case {
  const char* name;
  int64_t batch, heads, kv_heads, sq, skv, dk, dv;
  int64_t left, right;
  bool bottom_right, packed, alibi;
  std::vector<int64_t> lq, lkv;  // empty: every sequence full
};

// Packed thd tensors: [tokens, heads, dim], sequence i starting at start[i] with a gap of 3
// tokens after it. Padded [b, h, s, d] otherwise.
struct Layout {
  std::vector<int64_t> start_q, start_kv;
  int64_t tokens_q = 0, tokens_kv = 0;
  AttentionStrides strides(const Case& c, bool query, int64_t heads, int64_t dim) const {
    if (c.packed) return {0, dim, heads * dim};
    const int64_t s = query ? c.sq : c.skv;
    return {heads * s * dim, s * dim, dim};
  }
};

void check_case(const Case& c, std::mt19937& rng, const char* isa) {
  Layout lay;
  std::vector<int64_t> lq(c.batch), lkv(c.batch);
  for (int64_t i = 0; i < c.batch; ++i) {
    lq[i] = c.lq.empty() ? c.sq : c.lq[i];
    lkv[i] = c.lkv.empty() ? c.skv : c.lkv[i];
  }
  if (c.packed) {
    for (int64_t i = 0; i < c.batch; ++i) {
      lay.start_q.push_back(lay.tokens_q);
      lay.start_kv.push_back(lay.tokens_kv);
      lay.tokens_q += lq[i] + 3;
      lay.tokens_kv += lkv[i] + 3;
    }
  } else {
    lay.tokens_q = c.batch * c.sq;
    lay.tokens_kv = c.batch * c.skv;
  }
  const int64_t ratio = c.heads / c.kv_heads;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](int64_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng);
    return x;
  };
  std::vector<float> q = random(lay.tokens_q * c.heads * c.dk), k = random(lay.tokens_kv * c.kv_heads * c.dk);
  std::vector<float> v = random(lay.tokens_kv * c.kv_heads * c.dv), dout = random(lay.tokens_q * c.heads * c.dv);
  std::vector<float> slopes(c.heads);
  for (int64_t h = 0; h < c.heads; ++h) slopes[h] = c.alibi ? std::pow(2.0f, -8.0f * (h + 1) / c.heads) : 0.0f;
  const AttentionStrides qs = lay.strides(c, true, c.heads, c.dk), ks = lay.strides(c, false, c.kv_heads, c.dk);
  const AttentionStrides vs = lay.strides(c, false, c.kv_heads, c.dv), os = lay.strides(c, true, c.heads, c.dv);
  const AttentionStrides ls = c.packed ? AttentionStrides{0, 1, c.heads} : AttentionStrides{c.heads * c.sq, c.sq, 1};
  const auto at = [](const AttentionStrides& st, int64_t i, int64_t h, int64_t start, int64_t t) {
    return i * st.batch + h * st.head + (start + t) * st.token;
  };

  AttentionShape shape;
  shape.dtype = DType::kFloat32;
  shape.batch = c.batch;
  shape.heads = c.heads;
  shape.kv_heads = c.kv_heads;
  shape.max_sq = c.sq;
  shape.max_skv = c.skv;
  shape.head_dim_qk = c.dk;
  shape.head_dim_v = c.dv;
  if (!c.lq.empty() || c.packed) {
    shape.seqlens_q = lq.data();
    shape.seqlens_kv = lkv.data();
  }
  if (c.packed) {
    shape.starts_q = lay.start_q.data();
    shape.starts_kv = lay.start_kv.data();
  }
  shape.scale = 1.0f / std::sqrt(float(c.dk));
  shape.window_left = c.left;
  shape.window_right = c.right;
  shape.bottom_right = c.bottom_right;
  if (c.alibi) shape.alibi_slopes = slopes.data();

  std::vector<float> out(lay.tokens_q * c.heads * c.dv, 0.0f);
  std::vector<double> lse(lay.tokens_q * c.heads, -INFINITY);
  AttentionFwdParams f;
  f.shape = shape;
  f.q = q.data();
  f.k = k.data();
  f.v = v.data();
  f.q_strides = qs;
  f.k_strides = ks;
  f.v_strides = vs;
  f.out = out.data();
  f.out_strides = os;
  f.lse = lse.data();
  f.lse_strides = ls;
  const test::TwoThreads two;
  Workspace fwd_ws(attention_fwd_workspace_bytes(shape, two));
  f.workspace = fwd_ws.data;
  attention_fwd(f, two);

  // Backward on two threads and on one: the same bits.
  std::vector<std::vector<float>> grads[2];
  for (int run = 0; run < 2; ++run) {
    const SerialThreadPool serial;
    const ThreadPool& pool = run == 0 ? static_cast<const ThreadPool&>(two) : serial;
    std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
    AttentionBwdParams b;
    b.shape = shape;
    b.q = q.data();
    b.k = k.data();
    b.v = v.data();
    b.out = out.data();
    b.grad_out = dout.data();
    b.lse = lse.data();
    b.q_strides = qs;
    b.k_strides = ks;
    b.v_strides = vs;
    b.out_strides = os;
    b.grad_out_strides = os;
    b.lse_strides = ls;
    b.grad_q = dq.data();
    b.grad_k = dk.data();
    b.grad_v = dv.data();
    b.grad_q_strides = qs;
    b.grad_k_strides = ks;
    b.grad_v_strides = vs;
    Workspace bwd_ws(attention_bwd_workspace_bytes(shape, pool));
    b.workspace = bwd_ws.data;
    attention_bwd(b, pool);
    grads[run] = {dq, dk, dv};
  }
  for (int g = 0; g < 3; ++g) {
    TE_CHECK(std::memcmp(grads[0][g].data(), grads[1][g].data(), grads[0][g].size() * sizeof(float)) == 0,
             "%s %s: gradient %d differs between one and two threads", isa, c.name, g);
  }

  // The double reference, dense per (sequence, head).
  std::vector<double> dq_ref(q.size(), 0.0), dk_ref(k.size(), 0.0), dv_ref(v.size(), 0.0);
  double worst_out = 0, worst_lse = 0;
  for (int64_t i = 0; i < c.batch; ++i) {
    const int64_t sq = lq[i], skv = lkv[i], offset = c.bottom_right ? skv - sq : 0;
    const int64_t sq0 = c.packed ? lay.start_q[i] : 0, skv0 = c.packed ? lay.start_kv[i] : 0;
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t g = h / ratio;
      for (int64_t t = 0; t < sq; ++t) {
        const int64_t pos = t + offset;
        std::vector<double> logit(skv, -INFINITY);
        double max = -INFINITY;
        for (int64_t j = 0; j < skv; ++j) {
          if ((c.left >= 0 && j < pos - c.left) || (c.right >= 0 && j > pos + c.right)) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.dk; ++d) dot += double(q[at(qs, i, h, sq0, t) + d]) * k[at(ks, i, g, skv0, j) + d];
          logit[j] = dot * shape.scale - double(slopes[h]) * std::abs(double(pos - j));
          max = std::max(max, logit[j]);
        }
        const int64_t o = at(os, i, h, sq0, t);
        if (max == -INFINITY) {
          for (int64_t d = 0; d < c.dv; ++d) worst_out = std::max(worst_out, double(std::fabs(out[o + d])));
          TE_CHECK(std::isinf(lse[at(ls, i, h, sq0, t)]), "%s %s: a row without keys has lse %g", isa, c.name,
                   lse[at(ls, i, h, sq0, t)]);
          continue;
        }
        double sum = 0;
        std::vector<double> p(skv, 0.0);
        for (int64_t j = 0; j < skv; ++j) sum += p[j] = std::exp(logit[j] - max);
        worst_lse = std::max(worst_lse, std::fabs(lse[at(ls, i, h, sq0, t)] - (max + std::log(sum))));
        std::vector<double> out_row(c.dv, 0.0);
        for (int64_t j = 0; j < skv; ++j) {
          p[j] /= sum;
          for (int64_t d = 0; d < c.dv; ++d) out_row[d] += p[j] * v[at(vs, i, g, skv0, j) + d];
        }
        for (int64_t d = 0; d < c.dv; ++d) worst_out = std::max(worst_out, std::fabs(out_row[d] - out[o + d]));
        // Gradients: dP = dO V^T, dS = P (dP - sum(dO * O)), dq = scale dS K, dk = scale dS^T q, dv = P^T dO.
        double delta = 0;
        for (int64_t d = 0; d < c.dv; ++d) delta += double(dout[o + d]) * out_row[d];
        for (int64_t j = 0; j < skv; ++j) {
          if (p[j] == 0) continue;
          double dp = 0;
          for (int64_t d = 0; d < c.dv; ++d) dp += double(dout[o + d]) * v[at(vs, i, g, skv0, j) + d];
          const double ds = p[j] * (dp - delta) * shape.scale;
          for (int64_t d = 0; d < c.dk; ++d) {
            dq_ref[at(qs, i, h, sq0, t) + d] += ds * k[at(ks, i, g, skv0, j) + d];
            dk_ref[at(ks, i, g, skv0, j) + d] += ds * q[at(qs, i, h, sq0, t) + d];
          }
          for (int64_t d = 0; d < c.dv; ++d) dv_ref[at(vs, i, g, skv0, j) + d] += p[j] * dout[o + d];
        }
      }
    }
  }
  const auto worst = [](const std::vector<float>& got, const std::vector<double>& want) {
    double w = 0;
    for (size_t n = 0; n < got.size(); ++n) w = std::max(w, std::fabs(got[n] - want[n]));
    return w;
  };
  const double wq = worst(grads[0][0], dq_ref), wk = worst(grads[0][1], dk_ref), wv = worst(grads[0][2], dv_ref);
  TE_CHECK(worst_out < 1e-5 && worst_lse < 1e-5 && wq < 1e-5 && wk < 1e-5 && wv < 1e-5,
           "%s %s: out err %g, lse err %g, dq %g, dk %g, dv %g", isa, c.name, worst_out, worst_lse, wq, wk, wv);
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const std::vector<Case> cases = {
      {"plain", 2, 2, 2, 70, 70, 16, 16, -1, -1, false, false, false, {}, {}},
      {"causal top-left sq<skv", 1, 2, 1, 37, 69, 24, 20, -1, 0, false, false, false, {}, {}},
      {"causal bottom-right sq<skv", 1, 4, 2, 37, 130, 8, 8, -1, 0, true, false, false, {}, {}},
      {"causal bottom-right sq>skv", 1, 2, 2, 69, 37, 8, 12, -1, 0, true, false, false, {}, {}},
      {"window", 1, 2, 2, 150, 150, 16, 16, 20, 0, true, false, false, {}, {}},
      {"two-sided window alibi", 2, 4, 1, 90, 90, 12, 9, 7, 5, true, false, true, {}, {}},
      {"padded lengths", 3, 2, 2, 80, 75, 16, 16, -1, 0, true, false, false, {80, 1, 0}, {75, 20, 5}},
      {"packed gqa", 3, 4, 2, 130, 140, 20, 12, -1, 0, true, true, true, {130, 0, 1}, {140, 7, 1}},
      {"packed window", 2, 2, 2, 100, 100, 64, 64, 31, 0, false, true, false, {100, 64}, {100, 64}},
  };
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    for (const Case& c : cases) check_case(c, rng, cpu_isa_name(CpuIsa(tier)));
  }
  TE_TEST_MAIN_RETURN();
}
