// Public RoPE API: the per-position cos/sin table and the run-time SIMD tier.
#include <algorithm>
#include <cassert>
#include <cmath>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/rope.h"

namespace te_kernels {

// The entry points of rope_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(rope, RopeParams)

namespace {

int64_t token_count(const RopeParams& p) { return p.format == RopeFormat::kThd ? p.seq_len : p.seq_len * p.batch; }

// Row p of the table: cos(a) [rotary_dim], then S [rotary_dim] such that
// y[j] = x[j] cos[j] + x[partner(j)] S[j]. Forward: S[j] = -sin(a[j]) for the first channel
// of each pair (rot() puts -x[partner] there) and +sin(a[j]) for the second. Backward
// (the transpose, dx[j] = dy[j] cos[j] + dy[partner(j)] S_fwd[partner(j)]): each channel
// takes its partner's forward S.
// The trigonometry costs as much as the whole pass over a [2048, 4, 16, 128] bf16 tensor, so
// the usual angles, equal on both channels of a pair (RotaryPositionEmbedding's layout), are
// evaluated once per pair.
void fill_table(const RopeParams& p, float* table, const ThreadPool& pool) {
  const int64_t d2 = p.rotary_dim, half = d2 / 2;
  // Pair k: its first and second channel.
  const auto first = [&](int64_t k) { return p.interleaved ? 2 * k : k; };
  const auto second = [&](int64_t k) { return p.interleaved ? 2 * k + 1 : k + half; };
  const int64_t grain = std::max<int64_t>(1, 4096 / d2);
  pool.parallel_for(p.table_rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* angles = p.freqs + row * d2;
      float* cos = table + row * 2 * d2;
      float* sin = cos + d2;
      for (int64_t k = 0; k < half; ++k) {
        const int64_t a = first(k), b = second(k);
        const float sin_a = std::sin(angles[a]), cos_a = std::cos(angles[a]);
        const bool same = angles[b] == angles[a];
        const float sin_b = same ? sin_a : std::sin(angles[b]), cos_b = same ? cos_a : std::cos(angles[b]);
        cos[a] = cos_a;
        cos[b] = cos_b;
        sin[a] = p.backward ? sin_b : -sin_a;
        sin[b] = p.backward ? -sin_a : sin_b;
      }
    }
  });
}

}  // namespace

int64_t rope_table_rows(const RopeParams& p) {
  int64_t rows = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t length = p.format == RopeFormat::kThd ? p.cu_seqlens[b + 1] - p.cu_seqlens[b] : p.seq_len;
    if (length > 0) rows = std::max(rows, length + (p.start_positions ? p.start_positions[b] : 0));
  }
  return rows;
}

size_t rope_workspace_bytes(const RopeParams& p) { return size_t(p.table_rows) * 2 * size_t(p.rotary_dim) * sizeof(float); }

// bindings/rope_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
void rope(const RopeParams& p, const ThreadPool& pool) {
  assert(p.dtype != DType::kFloat64 && "rope: float64 tensors are not supported");
  assert(p.seq_len >= 0 && p.batch >= 0 && p.heads >= 0 && p.head_dim >= 0 && "rope: negative size");
  assert(p.rotary_dim > 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim &&
         "rope: rotary_dim must be even, positive and at most head_dim");
  assert((p.format != RopeFormat::kThd || p.cu_seqlens != nullptr) && "rope: the thd format needs cu_seqlens");
  assert(p.table_rows <= p.freqs_rows && "rope: freqs has fewer rows than the positions in use");
  if (token_count(p) == 0 || p.heads == 0) return;
  fill_table(p, static_cast<float*>(p.workspace), pool);
  return TE_CPU_ACTIVE_TIER(rope)(p, pool);
}

}  // namespace te_kernels
