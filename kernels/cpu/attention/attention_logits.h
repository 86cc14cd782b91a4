// How one query row's products q.k become its logits and probabilities in both passes of
// flash attention (attention_kernels.h): scale, softcap, ALiBi, bias and dense mask, and
// dropout's keep factors drawn from the header's Philox generator.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including attention_logits.h"
#endif
#pragma once

#include <cmath>
#include <cstdlib>
#include <limits>

#include "cpu/attention/attention_tiles.h"
#include "cpu/simd/vec_math.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail {

using attention_layout::dense_offset;
using attention_layout::kBlockKv;
using attention_layout::kBlockQ;
using attention_layout::key_hi;
using attention_layout::key_lo;
using attention_layout::padded_bf16;
using attention_layout::Sequence;

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

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

// factors[j] for the keys k0 + j, j in [lo, hi), of one row: 0 where dropout drops the key,
// 1 / (1 - p) where it keeps it. Key `key` takes word key % 4 of the Philox call with counter
// (key / 4, row, offset): one philox_lanes call (the tier's vector of counters) covers
// 4 V::kWidth consecutive keys.
template <typename V>
inline void keep_factors(const AttentionShape& s, uint64_t row, int64_t k0, int64_t lo, int64_t hi, float* factors) {
  constexpr int kLanes = V::kWidth;
  const float kept = 1.0f / (1.0f - s.dropout);
  for (int64_t group = (k0 + lo) / 4; group * 4 < k0 + hi; group += kLanes) {
    uint32_t words[4][kLanes];
    for (int i = 0; i < kLanes; ++i) {
      words[0][i] = uint32_t(group + i);
      words[1][i] = uint32_t(row);
      words[2][i] = uint32_t(s.dropout_offset);
      words[3][i] = uint32_t(s.dropout_offset >> 32);
    }
    philox_lanes<V>(words[0], words[1], words[2], words[3], s.dropout_seed);
    float drawn[4 * kLanes];  // keys 4 group .. 4 (group + kLanes) - 1 in order
    for (int w = 0; w < 4; ++w) {
      for (int i = 0; i < kLanes; ++i) drawn[4 * i + w] = float(words[w][i] >> 8) * 0x1p-24f < s.dropout ? 0.0f : kept;
    }
    const int64_t first = std::max<int64_t>(lo, 4 * group - k0), last = std::min<int64_t>(hi, 4 * (group + kLanes) - k0);
    std::copy(drawn + (first + k0 - 4 * group), drawn + (last + k0 - 4 * group), factors + first);
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail
