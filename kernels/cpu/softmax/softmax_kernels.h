// The attention-softmax algorithm (see te_kernels/softmax.h), written once over a vector
// type and compiled once per SIMD tier.
//
// Forward, per row of sk logits (a row of a 16k-key bf16 score matrix is 32 KiB, so the
// later passes hit L1/L2 and x comes from DRAM once):
//   pass 1  max of the visible logits;
//   pass 2  e_j = exp(z_j - max) into an fp32 scratch row, and their sum (one exp per
//           element: recomputing it in pass 3 would make the kernel compute-bound);
//   pass 3  y_j = e_j / sum, rounded once; zeros past the causal limit, in the same sweep.
// Backward, per row: pass 1 dot = sum(dy * y), pass 2 dx = scale * y * (dy - dot).
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including softmax_kernels.h"
#endif

#include "cpu/simd/prefetch.h"
#include "cpu/softmax/softmax_row.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace softmax_detail {

using softmax_row::VecOf;
using softmax_row::sweep;
using softmax_row::write;

// Where row (b, h, i) may be non-zero: keys [0, visible) and, for the padding mask, only
// where its byte is clear.
struct RowMask {
  int64_t visible;
  const uint8_t* padding;  // [sk] or null
};

inline RowMask row_mask(const SoftmaxShape& s, int64_t row) {
  const int64_t i = row % s.sq, batch_head = row / s.sq;
  switch (s.mask_kind) {
    case SoftmaxMask::kNone: return {s.sk, nullptr};
    case SoftmaxMask::kPadding: {
      const int64_t b = batch_head / s.heads, h = batch_head % s.heads;
      return {s.sk, s.mask + b * s.mask_batch_stride + h * s.mask_head_stride + i * s.mask_row_stride};
    }
    case SoftmaxMask::kCausal: return {std::min(s.sk, i + 1), nullptr};
    case SoftmaxMask::kCausalBottomRight: return {std::clamp<int64_t>(i + 1 + s.sk - s.sq, 0, s.sk), nullptr};
  }
  return {s.sk, nullptr};
}

// Lane flags for the vector that straddles the causal limit: kPrefixFlags + kMaxLanes - n
// starts with n ones. Every row is then written by one sweep of whole vectors (streamed
// when large): a line half written by streaming and half by ordinary stores would be
// flushed partially, at many times the cost of a full line.
constexpr int kMaxLanes = 16;
alignas(64) constexpr uint8_t kPrefixFlags[2 * kMaxLanes] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

// value() for the W-vector at column j, with the lanes at or past `visible` set to 0.
template <typename W, typename Value>
inline W visible_part(int64_t j, int64_t visible, Value&& value) {
  static_assert(W::kWidth <= kMaxLanes);
  if (j >= visible) return W::zero();
  if (j + W::kWidth <= visible) return value();
  return W::select(kPrefixFlags + kMaxLanes - (visible - j), value(), W::zero());
}

template <typename V, bool kStream, typename XT>
void forward_row(const SoftmaxShape& s, const RowMask& mask, const XT* x, XT* y, typename V::Acc* scratch) {
  using Acc = typename V::Acc;
  const Acc scale = Acc(s.scale);
  const auto logit = [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    const W z = W::load(x + j) * W::broadcast(scale);
    if (mask.padding == nullptr) return z;
    return W::select(mask.padding + j, W::broadcast(Acc(kSoftmaxMaskedLogit)), z);
  };
  // Only this first pass reads memory; the later ones find the row in L1/L2.
  const Acc max = softmax_row::max_logit<V>(mask.visible, [&](auto* tag, int64_t j) {
    prefetch_ahead(x, j);
    return logit(tag, j);
  });
  const Acc inv_sum = Acc(1) / softmax_row::exp_into<V>(mask.visible, max, scratch, logit);
  sweep<V>(0, s.sk, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    write<kStream>(visible_part<W>(j, mask.visible, [&] { return W::load(scratch + j) * W::broadcast(inv_sum); }),
                   y + j);
  });
}

template <typename V, bool kStream, typename XT>
void backward_row(const SoftmaxShape& s, const RowMask& mask, const XT* dy, const XT* y, XT* dx) {
  using Acc = typename V::Acc;
  // Past the causal limit y is exactly 0, so the dot runs over the visible keys only; a
  // padding-masked y is not 0 in general (a fully masked row is uniform) and counts.
  const Acc dot = softmax_row::block_sum<V>(mask.visible, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    prefetch_ahead(dy, j);
    prefetch_ahead(y, j);
    return W::load(dy + j) * W::load(y + j);
  });
  const Acc scale = Acc(s.scale);
  sweep<V>(0, s.sk, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    const W grad = visible_part<W>(j, mask.visible, [&] {
      const W g = W::broadcast(scale) * W::load(y + j) * (W::load(dy + j) - W::broadcast(dot));
      return mask.padding != nullptr ? W::select(mask.padding + j, W::zero(), g) : g;
    });
    write<kStream>(grad, dx + j);
  });
}

// Rows in num_chunks contiguous ranges, one scratch row each (the workspace layout
// matches softmax_fwd_workspace_bytes: chunks of padded sk accumulators).
template <typename V, typename XT>
void forward_rows(const SoftmaxFwdParams& p, const ThreadPool& pool) {
  using Acc = typename V::Acc;
  const SoftmaxShape& s = p.shape;
  const XT* x = static_cast<const XT*>(p.x);
  XT* y = static_cast<XT*>(p.y);
  const int64_t rows = s.rows(), chunks = p.num_chunks;
  const int64_t stride = padded_cols(s.sk, sizeof(Acc));
  const bool stream = use_streaming_stores<V, XT>(y, rows, s.sk, 2 * size_t(rows * s.sk) * sizeof(XT));
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      Acc* scratch = static_cast<Acc*>(p.workspace) + c * stride;
      for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) {
        const int64_t offset = r * s.sk;
        if (stream) forward_row<V, true>(s, row_mask(s, r), x + offset, y + offset, scratch);
        else forward_row<V, false>(s, row_mask(s, r), x + offset, y + offset, scratch);
      }
    }
    if (stream) V::stream_fence();
  });
}

template <typename V, typename XT>
void backward_rows(const SoftmaxBwdParams& p, const ThreadPool& pool) {
  const SoftmaxShape& s = p.shape;
  const XT* dy = static_cast<const XT*>(p.dy);
  const XT* y = static_cast<const XT*>(p.y);
  XT* dx = static_cast<XT*>(p.dx);
  const bool stream = use_streaming_stores<V, XT>(dx, s.rows(), s.sk, 3 * size_t(s.rows() * s.sk) * sizeof(XT));  // y, dy, dx
  const int64_t grain = std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, s.sk));
  pool.parallel_for(s.rows(), grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t offset = r * s.sk;
      if (stream) backward_row<V, true>(s, row_mask(s, r), dy + offset, y + offset, dx + offset);
      else backward_row<V, false>(s, row_mask(s, r), dy + offset, y + offset, dx + offset);
    }
    if (stream) V::stream_fence();
  });
}

template <typename V, typename XT>
struct ForwardRows {
  static void run(const SoftmaxFwdParams& p, const ThreadPool& pool) { forward_rows<V, XT>(p, pool); }
};
template <typename V, typename XT>
struct BackwardRows {
  static void run(const SoftmaxBwdParams& p, const ThreadPool& pool) { backward_rows<V, XT>(p, pool); }
};

}  // namespace softmax_detail

void softmax_fwd(const SoftmaxFwdParams& p, const ThreadPool& pool) {
  softmax_row::dispatch_dtype<softmax_detail::ForwardRows>(p.shape.dtype, p, pool);
}

void softmax_bwd(const SoftmaxBwdParams& p, const ThreadPool& pool) {
  softmax_row::dispatch_dtype<softmax_detail::BackwardRows>(p.shape.dtype, p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
