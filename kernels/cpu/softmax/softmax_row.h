// Row primitives shared by the softmax and cross-entropy kernels, written once over the
// tier's vector type: a sweep that hands out full vectors then single elements, and the
// two reductions every softmax needs (max, then sum of exp(z - max) kept in a scratch row).
// Included by softmax_kernels.h and cross_entropy_kernels.h inside the tier's namespace.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including softmax_row.h"
#endif
#pragma once

#include <limits>

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::softmax_row {

template <typename P>
using VecOf = std::remove_pointer_t<P>;

// body(tag, j) for j in [begin, end): tag is a null pointer to the vector type to use at j
// (V for full vectors, a one-lane vector for the tail).
template <typename V, typename Body>
inline void sweep(int64_t begin, int64_t end, Body&& body) {
  using Scalar = VecPortable<typename V::Acc, 1>;
  int64_t j = begin;
  for (; j + V::kWidth <= end; j += V::kWidth) body(static_cast<V*>(nullptr), j);
  for (; j < end; ++j) body(static_cast<Scalar*>(nullptr), j);
}

// A row's writer: full vectors streamed when asked (the caller then guarantees aligned
// rows), one-lane tails stored normally.
template <bool kStream, typename W, typename XT>
inline void write(const W& value, XT* out) {
  if constexpr (W::kWidth > 1) put<kStream>(value, out);
  else value.store(out);
}

template <typename Acc>
constexpr Acc kMinusInf = -std::numeric_limits<Acc>::infinity();

// Both reductions keep four vectors running, fed in turn: with one, every vector of the row
// would wait for the previous one's max or add (4 cycles), which bound these row passes.
constexpr int64_t kLanesInFlight = 4;  // the combining below names all four

// max over j in [0, len) of logit(W-tag, j); -inf for an empty range; NaN if any is NaN.
template <typename V, typename Logit>
inline typename V::Acc max_logit(int64_t len, Logit&& logit) {
  using Acc = typename V::Acc;
  using Scalar = VecPortable<Acc, 1>;
  V running[kLanesInFlight];
  for (V& r : running) r = V::broadcast(kMinusInf<Acc>);
  int64_t j = 0;
  for (; j + kLanesInFlight * V::kWidth <= len; j += kLanesInFlight * V::kWidth) {
    for (int k = 0; k < kLanesInFlight; ++k) running[k] = V::max(running[k], logit(static_cast<V*>(nullptr), j + k * V::kWidth));
  }
  for (; j + V::kWidth <= len; j += V::kWidth) running[0] = V::max(running[0], logit(static_cast<V*>(nullptr), j));
  Scalar tail = Scalar::broadcast(kMinusInf<Acc>);
  for (; j < len; ++j) tail = Scalar::max(tail, logit(static_cast<Scalar*>(nullptr), j));
  const V all = V::max(V::max(running[0], running[1]), V::max(running[2], running[3]));
  return Scalar::max(Scalar::broadcast(all.reduce_max()), tail).lane[0];
}

// Sum over j in [0, len) of term(tag, j), a W-vector of terms at column j. The lanes add up
// blocks of kBlock columns that then go into the total, so the rounding error grows with the
// block length plus the number of blocks instead of with the row length (summed lane by
// lane, a 32k-vocabulary row of exponentials drifts by ~1e-5 relative); within a block, the
// kLanesInFlight partial sums take every fourth vector.
template <typename V, typename Term>
inline typename V::Acc block_sum(int64_t len, Term&& term) {
  using Scalar = VecPortable<typename V::Acc, 1>;
  constexpr int64_t kBlock = 32 * V::kWidth, kStep = kLanesInFlight * V::kWidth;
  const int64_t vector_end = len - len % V::kWidth;
  V total = V::zero();
  for (int64_t begin = 0; begin < vector_end; begin += kBlock) {
    const int64_t end = std::min(begin + kBlock, vector_end);
    V partial[kLanesInFlight] = {V::zero(), V::zero(), V::zero(), V::zero()};
    int64_t j = begin;
    for (; j + kStep <= end; j += kStep) {
      for (int k = 0; k < kLanesInFlight; ++k) partial[k] = partial[k] + term(static_cast<V*>(nullptr), j + k * V::kWidth);
    }
    for (; j < end; j += V::kWidth) partial[0] = partial[0] + term(static_cast<V*>(nullptr), j);
    total = total + ((partial[0] + partial[1]) + (partial[2] + partial[3]));
  }
  Scalar tail = Scalar::zero();
  for (int64_t j = vector_end; j < len; ++j) tail = tail + term(static_cast<Scalar*>(nullptr), j);
  return total.reduce_add() + tail.lane[0];
}

// scratch[j] = exp(logit(j) - max) for j in [0, len); returns their sum.
template <typename V, typename Logit>
inline typename V::Acc exp_into(int64_t len, typename V::Acc max, typename V::Acc* scratch, Logit&& logit) {
  return block_sum<V>(len, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    const W e = exp(logit(tag, j) - W::broadcast(max));
    e.store(scratch + j);
    return e;
  });
}

// Runs Rows<V, XT>::run(p, pool) for the element type `dtype`; fp64 (for gradcheck) runs on a
// 4-lane array vector the compiler vectorises for the tier.
template <template <typename, typename> class Rows, typename Params>
void dispatch_dtype(DType dtype, const Params& p, const ThreadPool& pool) {
  switch (dtype) {
    case DType::kFloat32: return Rows<Vec, float>::run(p, pool);
    case DType::kBFloat16: return Rows<Vec, bf16_t>::run(p, pool);
    case DType::kFloat16: return Rows<Vec, fp16_t>::run(p, pool);
    case DType::kFloat64: return Rows<VecPortable<double, 4>, double>::run(p, pool);
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::softmax_row
