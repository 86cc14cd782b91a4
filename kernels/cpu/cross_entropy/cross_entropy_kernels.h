// The cross-entropy algorithm (see te_kernels/cross_entropy.h), written once over a vector
// type and compiled once per SIMD tier.
//
// Forward, per row of vocab logits (a 32k-vocabulary bf16 row is 64 KiB: the later passes
// hit L2, so the logits come from DRAM once and no fp32 copy of them is ever made):
//   pass 1  max m of the logits, and with label smoothing the mean of the halved gaps
//           (m - x_c) / 2, summed as (m - x_c) / 2 / vocab: a gap reaches 2 FLT_MAX (logits
//           [-3e38, 3e38]) where its half does not, and the sum of the halved gaps passes
//           FLT_MAX (logits [1e30, 1e30, 3e38]) where their mean does not;
//   pass 2  e_c = exp(x_c - m) into an fp32 scratch row, and their sum s (x_c - m below
//           -FLT_MAX is -inf, whose exp is 0 as the exact one rounds to);
//           loss = 2 ((1 - eps) (log s / 2 + (m - x_t) / 2) + eps (log s / 2 + mean (m - x) / 2)),
//           TE's (1 - eps) (lse - x_t) + eps (lse - mean x). Every term is relative to the max:
//           lse - x_t formed as (m + log s) - x_t rounds log s to the ulp of m first (logits of
//           1e30 gave a loss of 0 for log 2; near 1e5, where an fp32 ulp is 0.008, 3.99219 for
//           3.99270). And halved: the gaps are at most FLT_MAX, weighted by at most 1, and the
//           two weighted terms nonnegative, so their sum passes FLT_MAX only where the loss
//           passes 2 FLT_MAX, the doubling (exact) only where the loss passes FLT_MAX: the loss
//           is inf exactly where it is past fp32's range (over [-3e38, 3e38] with the target at
//           the max and eps 0.1 it is 3e37, where m - x and their sum overflowed);
//   pass 3  grad_c = k (e_c / s - eps / vocab - (1 - eps) [c == t]), k the grad_scale (of
//           the tensor or of the row), rounded once to the logits' dtype: one vector sweep, then
//           the target's element again, the one-hot term subtracted last and k applied after,
//           so that where the softmax is exactly 1 (one class) the two roundings of 1 - eps
//           cancel and the gradient is exactly 0.
// Backward: grad_logits = grad * grad_loss[row], one streaming pass (which the op's autograd
// skips when every factor is exactly 1: ops/cross_entropy.py).
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including cross_entropy_kernels.h"
#endif

#include "cpu/simd/prefetch.h"
#include "cpu/softmax/softmax_row.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace cross_entropy_detail {

using softmax_row::VecOf;
using softmax_row::sweep;
using softmax_row::write;

// next_x: the next row this thread takes (or null). Only pass 1 reads the logits from memory;
// the exp pass works from L2 and would leave the memory idle, so it prefetches the next row
// into L2 as it goes (bf16 [4096, 32000] forward without grad on the 2-core Sapphire Rapids
// VM: 29.2-31.5 -> 20.3-22.1 ms).
template <typename V, bool kStream, typename XT>
void forward_row(const CrossEntropyFwdParams& p, const XT* x, const XT* next_x, int64_t target,
                 typename V::Acc grad_scale, typename V::Acc* loss, XT* grad, typename V::Acc* scratch) {
  using Acc = typename V::Acc;
  const int64_t vocab = p.vocab;
  if (target == p.ignore_index) {
    *loss = Acc(0);
    if (grad != nullptr) {
      sweep<V>(0, vocab, [&](auto* tag, int64_t j) { write<kStream>(VecOf<decltype(tag)>::zero(), grad + j); });
    }
    return;
  }
  const Acc eps = Acc(p.label_smoothing);
  const auto logit = [&](auto* tag, int64_t j) { return VecOf<decltype(tag)>::load(x + j); };
  const Acc max = softmax_row::max_logit<V>(vocab, [&](auto* tag, int64_t j) {
    prefetch_ahead(x, j);
    return logit(tag, j);
  });
  const Acc inv_vocab = Acc(1) / Acc(vocab), half_max = max * Acc(0.5);
  // mean (m - x) / 2 as the sum of x * -1/2 + m / 2 (one rounding, that of (m - x) / 2), each at
  // most FLT_MAX, times 1 / vocab. A -inf logit makes it inf: skipped where eps is 0 (0 * inf).
  const Acc mean_gap = eps == Acc(0) ? Acc(0) : softmax_row::block_sum<V>(vocab, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    return fmadd(logit(tag, j), W::broadcast(Acc(-0.5)), W::broadcast(half_max)) * W::broadcast(inv_vocab);
  });
  const auto logit_prefetching_next = [&](auto* tag, int64_t j) {
    prefetch_line(next_x, j);
    return logit(tag, j);
  };
  const Acc sum_exp = softmax_row::exp_into<V>(vocab, max, scratch, logit_prefetching_next);
  const Acc half_log_sum = std::log(sum_exp) * Acc(0.5);
  const Acc target_gap = std::fma(VecPortable<Acc, 1>::load(x + target).lane[0], Acc(-0.5), half_max);
  const Acc half_nll = half_log_sum + target_gap;
  *loss = Acc(2) * (eps == Acc(0) ? half_nll : (Acc(1) - eps) * half_nll + eps * (half_log_sum + mean_gap));
  if (grad == nullptr) return;
  const Acc scaled_inv_sum = grad_scale / sum_exp, scaled_smoothing = grad_scale * eps / Acc(vocab);
  sweep<V>(0, vocab, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    write<kStream>(fmadd(W::load(scratch + j), W::broadcast(scaled_inv_sum), W::broadcast(-scaled_smoothing)),
                   grad + j);
  });
  if constexpr (kStream) V::stream_fence();  // the row's streamed stores land before the store below
  const Acc smoothed = std::fma(scratch[target], Acc(1) / sum_exp, -eps / Acc(vocab));
  grad[target] = Convert<XT>::from((smoothed - (Acc(1) - eps)) * grad_scale);
}

template <typename V, typename XT>
void forward_rows(const CrossEntropyFwdParams& p, const ThreadPool& pool) {
  using Acc = typename V::Acc;
  const XT* x = static_cast<const XT*>(p.logits);
  XT* grad = static_cast<XT*>(p.grad);
  Acc* loss = static_cast<Acc*>(p.loss);
  const int64_t rows = p.rows, chunks = p.num_chunks;
  const int64_t stride = padded_cols(p.vocab, sizeof(Acc));
  const Acc* grad_scale_rows = static_cast<const Acc*>(p.grad_scale_rows);
  const auto grad_scale = [&](int64_t r) { return grad_scale_rows != nullptr ? grad_scale_rows[r] : Acc(p.grad_scale); };
  const bool stream = grad != nullptr && use_streaming_stores<V, XT>(grad, rows, p.vocab, 2 * size_t(rows * p.vocab) * sizeof(XT));
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      Acc* scratch = static_cast<Acc*>(p.workspace) + c * stride;
      const int64_t row_end = rows * (c + 1) / chunks;
      for (int64_t r = rows * c / chunks; r < row_end; ++r) {
        const int64_t offset = r * p.vocab;
        XT* grad_row = grad != nullptr ? grad + offset : nullptr;
        const XT* next_x = r + 1 < row_end ? x + offset + p.vocab : nullptr;
        const Acc scale = grad_scale(r);
        if (stream) forward_row<V, true>(p, x + offset, next_x, p.target[r], scale, loss + r, grad_row, scratch);
        else forward_row<V, false>(p, x + offset, next_x, p.target[r], scale, loss + r, grad_row, scratch);
      }
    }
    if (stream) V::stream_fence();
  });
}

template <typename V, typename XT>
void backward_rows(const CrossEntropyBwdParams& p, const ThreadPool& pool) {
  using Acc = typename V::Acc;
  const XT* grad = static_cast<const XT*>(p.grad);
  const Acc* grad_loss = static_cast<const Acc*>(p.grad_loss);
  XT* out = static_cast<XT*>(p.grad_logits);
  const bool stream = use_streaming_stores<V, XT>(out, p.rows, p.vocab, 2 * size_t(p.rows * p.vocab) * sizeof(XT));
  const int64_t grain = std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, p.vocab));
  const auto rows = [&](auto stream_tag, int64_t begin, int64_t end) {
    constexpr bool kStream = decltype(stream_tag)::value;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t offset = r * p.vocab;
      const Acc factor = grad_loss[r];
      sweep<V>(0, p.vocab, [&](auto* tag, int64_t j) {
        using W = VecOf<decltype(tag)>;
        write<kStream>(W::load(grad + offset + j) * W::broadcast(factor), out + offset + j);
      });
    }
    if constexpr (kStream) V::stream_fence();
  };
  pool.parallel_for(p.rows, grain, [&](int64_t begin, int64_t end) {
    if (stream) rows(std::true_type{}, begin, end);
    else rows(std::false_type{}, begin, end);
  });
}

template <typename V, typename XT>
struct ForwardRows {
  static void run(const CrossEntropyFwdParams& p, const ThreadPool& pool) { forward_rows<V, XT>(p, pool); }
};
template <typename V, typename XT>
struct BackwardRows {
  static void run(const CrossEntropyBwdParams& p, const ThreadPool& pool) { backward_rows<V, XT>(p, pool); }
};

}  // namespace cross_entropy_detail

void cross_entropy_fwd(const CrossEntropyFwdParams& p, const ThreadPool& pool) {
  softmax_row::dispatch_dtype<cross_entropy_detail::ForwardRows>(p.dtype, p, pool);
}

void cross_entropy_bwd(const CrossEntropyBwdParams& p, const ThreadPool& pool) {
  softmax_row::dispatch_dtype<cross_entropy_detail::BackwardRows>(p.dtype, p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
