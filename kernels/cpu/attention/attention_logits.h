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

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail
