// Flash-attention kernels of every SIMD tier this CPU has, against a double-precision
// evaluation of dropout(softmax(cap(scale q k^T) + alibi + bias, masked, sink)) v and its
// gradients (q, k, v, the bias, the sink): causal top-left and bottom-right, windows,
// per-sequence lengths, packed (thd) layouts with gaps, GQA, head dims whose vectors have
// scalar tails, sizes that cut the 64-row blocks, broadcast bias and mask, rows the mask
// empties. fp32 data, where the only differences are the kernels' fp32 rounding, and bf16 data
// (the reference takes the same bf16 values), where the outputs' rounding to bf16 joins it
// (and, on AVX512-BF16, the dot products' other order of sums); dropout's keep factors are drawn here
// from the header's Philox by its counter rule. The backward must give the same bits on one
// and on two threads.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <algorithm>
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
  float softcap = 0.0f;
  bool bias = false;  // [1, h, sq, skv]
  bool mask = false;  // [b, 1, sq, skv], about a third of the keys, and every key of query row 3
  bool sink = false;
  float dropout = 0.0f;
};

// The header's draw, restated: key k0 + j of counter row `row` is kept when its 24 bits are >= p.
float keep_factor(const AttentionShape& s, int64_t row, int64_t key) {
  const Philox4 bits = philox4x32(uint32_t(key / 4), uint32_t(row), uint32_t(s.dropout_offset),
                                  uint32_t(s.dropout_offset >> 32), s.dropout_seed);
  const float uniform = float(bits.word[key % 4] >> 8) / 16777216.0f;
  return uniform < s.dropout ? 0.0f : 1.0f / (1.0f - s.dropout);
}

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

// A tensor of the kernels' dtype: fp32 values as they are, or bf16 bits.
struct Stored {
  DType dtype;
  std::vector<float> fp32;
  std::vector<bf16_t> bf16;
  Stored(DType type, const std::vector<float>& values) : dtype(type) {
    if (dtype == DType::kFloat32) {
      fp32 = values;
    } else {
      for (float x : values) bf16.push_back(to_bf16(x));
    }
  }
  void* data() { return dtype == DType::kFloat32 ? static_cast<void*>(fp32.data()) : static_cast<void*>(bf16.data()); }
  std::vector<float> values() const {
    if (dtype == DType::kFloat32) return fp32;
    std::vector<float> out;
    for (bf16_t x : bf16) out.push_back(to_float(x));
    return out;
  }
};

void check_case(const Case& c, DType dtype, std::mt19937& rng, const char* isa) {
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
  const bool bf16 = dtype == DType::kBFloat16;
  const auto random = [&](int64_t n) {  // values the dtype holds exactly
    std::vector<float> x(n);
    for (float& e : x) e = bf16 ? to_float(to_bf16(normal(rng))) : normal(rng);
    return x;
  };
  std::vector<float> q = random(lay.tokens_q * c.heads * c.dk), k = random(lay.tokens_kv * c.kv_heads * c.dk);
  std::vector<float> v = random(lay.tokens_kv * c.kv_heads * c.dv), dout = random(lay.tokens_q * c.heads * c.dv);
  Stored q_in(dtype, q), k_in(dtype, k), v_in(dtype, v), dout_in(dtype, dout);
  std::vector<float> slopes(c.heads);
  for (int64_t h = 0; h < c.heads; ++h) slopes[h] = c.alibi ? std::pow(2.0f, -8.0f * (h + 1) / c.heads) : 0.0f;
  const AttentionStrides qs = lay.strides(c, true, c.heads, c.dk), ks = lay.strides(c, false, c.kv_heads, c.dk);
  const AttentionStrides vs = lay.strides(c, false, c.kv_heads, c.dv), os = lay.strides(c, true, c.heads, c.dv);
  const AttentionStrides ls = c.packed ? AttentionStrides{0, 1, c.heads} : AttentionStrides{c.heads * c.sq, c.sq, 1};
  // Dense operands of [b, h, s, d] calls: bias [1, h, sq, skv], mask [b, 1, sq, skv], grad_bias [b, h, sq, skv].
  const int64_t plane = c.sq * c.skv;
  const std::vector<float> bias = c.bias ? random(c.heads * plane) : std::vector<float>();
  Stored bias_in(dtype, bias);  // q's dtype
  std::vector<uint8_t> mask(c.mask ? c.batch * plane : 0);
  for (int64_t n = 0; n < int64_t(mask.size()); ++n) mask[n] = n / c.skv % c.sq == 3 || rng() % 3 == 0;
  const AttentionDenseStrides bias_st{0, plane, c.skv}, mask_st{plane, 0, c.skv}, grad_bias_st{c.heads * plane, plane, c.skv};
  std::vector<float> sinks(c.heads);
  for (int64_t h = 0; h < c.heads; ++h) sinks[h] = 0.5f * float(h) - 1.0f;
  const auto at = [](const AttentionStrides& st, int64_t i, int64_t h, int64_t start, int64_t t) {
    return i * st.batch + h * st.head + (start + t) * st.token;
  };

  AttentionShape shape;
  shape.dtype = dtype;
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
  shape.softcap = c.softcap;
  if (c.bias) {
    shape.bias = bias_in.data();
    shape.bias_strides = bias_st;
  }
  if (c.mask) {
    shape.mask = mask.data();
    shape.mask_strides = mask_st;
  }
  if (c.sink) shape.softmax_offset = sinks.data();
  shape.dropout = c.dropout;
  shape.dropout_seed = 0x123456789abcdefull;
  shape.dropout_offset = 0x500000007ull;

  Stored out_kernel(dtype, std::vector<float>(lay.tokens_q * c.heads * c.dv, 0.0f));
  std::vector<double> lse(lay.tokens_q * c.heads, -INFINITY);
  std::vector<float> row_max(lse.size(), -INFINITY);
  AttentionFwdParams f;
  f.shape = shape;
  f.q = q_in.data();
  f.k = k_in.data();
  f.v = v_in.data();
  f.q_strides = qs;
  f.k_strides = ks;
  f.v_strides = vs;
  f.out = out_kernel.data();
  f.out_strides = os;
  f.lse = lse.data();
  f.lse_strides = ls;
  f.row_max = row_max.data();
  const test::TwoThreads two;
  Workspace fwd_ws(attention_fwd_workspace_bytes(shape, two));
  f.workspace = fwd_ws.data;
  attention_fwd(f, two);
  {  // The forward on one thread: the same bits.
    const SerialThreadPool serial;
    Stored out_serial(dtype, std::vector<float>(out_kernel.values().size(), 0.0f));
    std::vector<double> lse_serial(lse.size(), -INFINITY);
    AttentionFwdParams g = f;
    g.out = out_serial.data();
    g.lse = lse_serial.data();
    g.row_max = nullptr;
    Workspace serial_ws(attention_fwd_workspace_bytes(shape, serial));
    g.workspace = serial_ws.data;
    attention_fwd(g, serial);
    TE_CHECK(out_kernel.values() == out_serial.values() &&
                 std::memcmp(lse.data(), lse_serial.data(), lse.size() * sizeof(double)) == 0,
             "%s %s: the forward differs between one and two threads", isa, c.name);
  }

  const std::vector<float> out = out_kernel.values();

  // Backward on two threads and on one: the same bits.
  std::vector<std::vector<float>> grads[2];
  for (int run = 0; run < 2; ++run) {
    const SerialThreadPool serial;
    const ThreadPool& pool = run == 0 ? static_cast<const ThreadPool&>(two) : serial;
    Stored dq(dtype, std::vector<float>(q.size(), 0.0f)), dk(dtype, std::vector<float>(k.size(), 0.0f));
    Stored dv(dtype, std::vector<float>(v.size(), 0.0f));
    std::vector<float> dbias(c.bias ? c.batch * c.heads * plane : 0, 0.0f);
    std::vector<double> dsink(c.sink ? c.batch * c.heads : 0, 0.0);
    AttentionBwdParams b;
    b.shape = shape;
    b.q = q_in.data();
    b.k = k_in.data();
    b.v = v_in.data();
    b.out = out_kernel.data();
    b.grad_out = dout_in.data();
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
    if (c.bias) {
      b.grad_bias = dbias.data();
      b.grad_bias_strides = grad_bias_st;
    }
    if (c.sink) b.grad_softmax_offset = dsink.data();
    Workspace bwd_ws(attention_bwd_workspace_bytes(shape, pool));
    b.workspace = bwd_ws.data;
    attention_bwd(b, pool);
    std::vector<float> dsink_f(dsink.begin(), dsink.end());
    grads[run] = {dq.values(), dk.values(), dv.values(), dbias, dsink_f};
  }
  for (int g = 0; g < 5; ++g) {
    TE_CHECK(std::memcmp(grads[0][g].data(), grads[1][g].data(), grads[0][g].size() * sizeof(float)) == 0,
             "%s %s: gradient %d differs between one and two threads", isa, c.name, g);
  }

  // The double reference, dense per (sequence, head).
  std::vector<double> dq_ref(q.size(), 0.0), dk_ref(k.size(), 0.0), dv_ref(v.size(), 0.0);
  std::vector<double> dbias_ref(grads[0][3].size(), 0.0), dsink_ref(c.heads, 0.0);
  double worst_out = 0, worst_lse = 0, worst_max = 0;
  for (int64_t i = 0; i < c.batch; ++i) {
    const int64_t sq = lq[i], skv = lkv[i], offset = c.bottom_right ? skv - sq : 0;
    const int64_t sq0 = c.packed ? lay.start_q[i] : 0, skv0 = c.packed ? lay.start_kv[i] : 0;
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t g = h / ratio;
      for (int64_t t = 0; t < sq; ++t) {
        const int64_t pos = t + offset;
        std::vector<double> logit(skv, -INFINITY), cap_slope(skv, 1.0), keep(skv, 1.0);
        double max = -INFINITY;
        for (int64_t j = 0; j < skv; ++j) {
          if ((c.left >= 0 && j < pos - c.left) || (c.right >= 0 && j > pos + c.right)) continue;
          if (c.mask && mask[i * plane + t * c.skv + j]) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.dk; ++d) dot += double(q[at(qs, i, h, sq0, t) + d]) * k[at(ks, i, g, skv0, j) + d];
          double x = dot * shape.scale;
          if (c.softcap > 0) {
            const double th = std::tanh(x / c.softcap);
            x = c.softcap * th;
            cap_slope[j] = 1 - th * th;
          }
          logit[j] = x - double(slopes[h]) * std::abs(double(pos - j)) + (c.bias ? bias[h * plane + t * c.skv + j] : 0.0);
          if (c.dropout > 0) keep[j] = keep_factor(shape, (i * c.heads + h) * c.sq + t, j);
          max = std::max(max, logit[j]);
        }
        const int64_t o = at(os, i, h, sq0, t), l = at(ls, i, h, sq0, t);
        worst_max = std::max(worst_max, max == -INFINITY ? (std::isinf(row_max[l]) ? 0.0 : 1.0) : std::fabs(row_max[l] - max));
        const double sink = c.sink ? double(sinks[h]) : -INFINITY, joint = std::max(max, sink);
        if (joint == -INFINITY) {
          for (int64_t d = 0; d < c.dv; ++d) worst_out = std::max(worst_out, double(std::fabs(out[o + d])));
          TE_CHECK(std::isinf(lse[l]), "%s %s: a row without keys has lse %g", isa, c.name, lse[l]);
          continue;
        }
        double sum = c.sink ? std::exp(sink - joint) : 0.0;
        std::vector<double> p(skv, 0.0);
        for (int64_t j = 0; j < skv; ++j) sum += p[j] = std::exp(logit[j] - joint);
        worst_lse = std::max(worst_lse, std::fabs(lse[l] - (joint + std::log(sum))));
        std::vector<double> out_row(c.dv, 0.0);
        for (int64_t j = 0; j < skv; ++j) {
          p[j] /= sum;
          for (int64_t d = 0; d < c.dv; ++d) out_row[d] += p[j] * keep[j] * v[at(vs, i, g, skv0, j) + d];
        }
        for (int64_t d = 0; d < c.dv; ++d) worst_out = std::max(worst_out, std::fabs(out_row[d] - out[o + d]));
        // Gradients: dP = dO V^T, dS = P (dP - sum(dO * O)), dq = scale dS K, dk = scale dS^T q, dv = P^T dO.
        // D from the output the backward is given (bf16: rounded), as the kernel forms it.
        double delta = 0;
        for (int64_t d = 0; d < c.dv; ++d) delta += double(dout[o + d]) * out[o + d];
        if (c.sink) dsink_ref[h] -= std::exp(sink - joint) / sum * delta;
        for (int64_t j = 0; j < skv; ++j) {
          if (p[j] == 0) continue;
          double dp = 0;
          for (int64_t d = 0; d < c.dv; ++d) dp += double(dout[o + d]) * v[at(vs, i, g, skv0, j) + d];
          const double grad_logit = p[j] * (keep[j] * dp - delta);
          if (c.bias) dbias_ref[(i * c.heads + h) * plane + t * c.skv + j] = grad_logit;
          const double ds = grad_logit * cap_slope[j] * shape.scale;
          for (int64_t d = 0; d < c.dk; ++d) {
            dq_ref[at(qs, i, h, sq0, t) + d] += ds * k[at(ks, i, g, skv0, j) + d];
            dk_ref[at(ks, i, g, skv0, j) + d] += ds * q[at(qs, i, h, sq0, t) + d];
          }
          for (int64_t d = 0; d < c.dv; ++d) dv_ref[at(vs, i, g, skv0, j) + d] += p[j] * keep[j] * dout[o + d];
        }
      }
    }
  }
  // bf16: errors relative to the largest value of each reference (its rounding to bf16 alone
  // gives 2^-9 of it).
  const auto worst = [&](const std::vector<float>& got, const std::vector<double>& want) {
    double w = 0, largest = 0;
    for (size_t n = 0; n < got.size(); ++n) {
      w = std::max(w, std::fabs(got[n] - want[n]));
      largest = std::max(largest, std::fabs(want[n]));
    }
    return bf16 && largest > 0 ? w / largest : w;
  };
  const double wq = worst(grads[0][0], dq_ref), wk = worst(grads[0][1], dk_ref), wv = worst(grads[0][2], dv_ref);
  const double wb = worst(grads[0][3], dbias_ref);
  // The sink's gradient: the kernel's per-sequence shares, added here in sequence order.
  double ws = 0;
  for (int64_t h = 0; h < (c.sink ? c.heads : 0); ++h) {
    double total = 0;
    for (int64_t i = 0; i < c.batch; ++i) total += grads[0][4][i * c.heads + h];
    ws = std::max(ws, std::fabs(total - dsink_ref[h]));
  }
  const double tol = bf16 ? 1e-2 : 1e-5;  // bf16: the outputs' rounding, 2^-9 of each
  TE_CHECK(worst_out < 4 * tol && worst_lse < 1e-5 && worst_max < 1e-5 && wq < tol && wk < tol && wv < tol &&
               wb < tol && ws < 10 * tol,
           "%s %s %s: out err %g, lse err %g, row max %g, dq %g, dk %g, dv %g, dbias %g, dsink %g", isa,
           bf16 ? "bf16" : "fp32", c.name, worst_out, worst_lse, worst_max, wq, wk, wv, wb, ws);
}

// A paged cache: the keys and values of [b, s, g, d] tensors scattered over shuffled pages of
// a pool; the paged forward gives the bits of the contiguous one, and of its flash-decoding split.
void check_paged(std::mt19937& rng, const char* isa) {
  const int64_t b = 3, h = 4, g = 2, sq = 2, skv = 1100, d = 16, page = 16, pages_per_seq = skv / page + 1;
  const std::vector<int64_t> lq = {2, 1, 0}, lkv = {1100, 37, 0};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(b * h * sq * d), k(b * skv * g * d), v(b * skv * g * d);
  for (float& e : q) e = normal(rng);
  for (float& e : k) e = normal(rng);
  for (float& e : v) e = normal(rng);
  std::vector<int32_t> order(b * pages_per_seq);
  for (int32_t n = 0; n < int32_t(order.size()); ++n) order[n] = n;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> k_pool(order.size() * page * g * d, 0.0f), v_pool(k_pool.size(), 0.0f);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < skv; ++j) {
      const int64_t token = int64_t(order[i * pages_per_seq + j / page]) * page + j % page;
      std::copy_n(&k[(i * skv + j) * g * d], g * d, &k_pool[token * g * d]);
      std::copy_n(&v[(i * skv + j) * g * d], g * d, &v_pool[token * g * d]);
    }
  }
  AttentionShape shape;
  shape.batch = b;
  shape.heads = h;
  shape.kv_heads = g;
  shape.max_sq = sq;
  shape.max_skv = skv;
  shape.head_dim_qk = shape.head_dim_v = d;
  shape.seqlens_q = lq.data();
  shape.seqlens_kv = lkv.data();
  shape.scale = 0.25f;
  shape.window_left = -1;
  shape.window_right = 0;
  shape.bottom_right = true;
  const auto run = [&](const void* keys, const void* values, AttentionStrides kv_strides, const int32_t* table) {
    AttentionFwdParams f;
    f.shape = shape;
    f.shape.page_table = table;
    f.shape.page_table_stride = table != nullptr ? pages_per_seq : 0;
    f.shape.page_size = table != nullptr ? page : 0;
    std::vector<float> out(q.size(), 0.0f);
    std::vector<double> lse(b * h * sq, -INFINITY);
    f.q = q.data();
    f.k = keys;
    f.v = values;
    f.q_strides = {h * sq * d, sq * d, d};
    f.k_strides = f.v_strides = kv_strides;
    f.out = out.data();
    f.out_strides = f.q_strides;
    f.lse = lse.data();
    f.lse_strides = {h * sq, sq, 1};
    const test::TwoThreads two;
    Workspace ws(attention_fwd_workspace_bytes(f.shape, two));
    f.workspace = ws.data;
    attention_fwd(f, two);
    return out;
  };
  const std::vector<float> contiguous = run(k.data(), v.data(), {skv * g * d, d, g * d}, nullptr);
  const std::vector<float> paged = run(k_pool.data(), v_pool.data(), {0, d, g * d}, order.data());
  TE_CHECK(std::memcmp(contiguous.data(), paged.data(), paged.size() * sizeof(float)) == 0,
           "%s paged: differs from the contiguous cache", isa);
}

// Random123's known answers for Philox4x32-10 (counter, key, output).
void check_philox() {
  struct Kat {
    uint32_t counter[4];
    uint64_t key;
    uint32_t words[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, ~0ull, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0x299f31d0a4093822ull,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& kat : kats) {
    const Philox4 got = philox4x32(kat.counter[0], kat.counter[1], kat.counter[2], kat.counter[3], kat.key);
    for (int w = 0; w < 4; ++w) {
      TE_CHECK(got.word[w] == kat.words[w], "philox word %d: %08x, want %08x", w, got.word[w], kat.words[w]);
    }
  }
}

}  // namespace

int main() {
  check_philox();
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
      {"softcap", 1, 2, 2, 70, 90, 16, 16, -1, 0, true, false, false, {}, {}, 2.0f},
      {"bias mask sink", 2, 4, 2, 67, 80, 12, 20, -1, -1, false, false, true, {}, {}, 0.0f, true, true, true},
      {"padded sink window", 3, 2, 1, 80, 75, 16, 16, 9, 0, true, false, false, {80, 1, 0}, {75, 20, 5}, 0.0f,
       false, false, true},
      {"dropout", 2, 2, 1, 70, 130, 16, 8, -1, 0, false, false, false, {}, {}, 0.0f, false, false, false, 0.3f},
      {"packed dropout softcap sink", 2, 4, 2, 90, 100, 8, 8, -1, 0, true, true, true, {90, 33}, {100, 40}, 1.5f,
       false, false, true, 0.2f},
      {"everything", 2, 2, 2, 66, 70, 20, 12, 30, 4, true, false, true, {}, {}, 3.0f, true, true, true, 0.1f},
      // Flash-decoding: few (sequence, head) tasks, keys split into parts.
      {"decode split", 1, 2, 1, 1, 1500, 16, 8, -1, 0, true, false, true, {}, {}},
      {"decode split lengths sink", 2, 2, 2, 3, 1300, 8, 8, 700, 0, true, false, false, {3, 1}, {1300, 600}, 0.0f,
       false, false, true, 0.1f},
      {"packed decode split", 2, 1, 1, 4, 1100, 8, 8, -1, 0, true, true, false, {4, 2}, {1100, 513}},
      // Decoding rows: a task of few query rows reads the key rows as they lie; the query heads
      // of a key/value head share it (every per-head term on grouped rows).
      {"decode gqa group", 1, 8, 2, 1, 900, 20, 12, -1, 0, true, false, false, {}, {}},
      {"decode gqa rows every term", 2, 8, 2, 3, 600, 20, 12, 300, 0, true, false, true, {3, 2}, {600, 41}, 2.5f,
       true, true, true, 0.2f},
      {"mqa half groups", 1, 32, 1, 1, 300, 16, 16, -1, 0, true, false, true, {}, {}},
      {"gqa rows 5 pairs", 1, 4, 1, 5, 200, 24, 8, -1, 0, true, false, false, {}, {}},
      {"packed gqa rows", 3, 6, 2, 2, 140, 16, 16, -1, 0, true, true, false, {2, 1, 0}, {140, 70, 3}},
      {"gqa rows batch no split", 40, 4, 2, 1, 30, 8, 8, -1, -1, false, false, true, {}, {}},
      // Whole key/value heads share a task (a token-major cache read a token row at a time).
      {"packed mha decode", 2, 6, 6, 1, 700, 16, 16, -1, 0, true, true, false, {1, 1}, {700, 300}},
      {"gqa 3 queries whole kv heads", 2, 8, 4, 3, 140, 12, 20, 50, 0, true, false, true, {3, 3}, {140, 90}, 0.0f,
       false, true, true, 0.1f},
  };
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    for (const Case& c : cases) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) check_case(c, dtype, rng, cpu_isa_name(CpuIsa(tier)));
    }
    check_paged(rng, cpu_isa_name(CpuIsa(tier)));
  }
  TE_TEST_MAIN_RETURN();
}
