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

// A running vector value plus its one-lane twin for the row tail.
template <typename V>
struct Running {
  using Scalar = VecPortable<typename V::Acc, 1>;
  V vec;
  Scalar tail;
  explicit Running(typename V::Acc init) : vec(V::broadcast(init)), tail(Scalar::broadcast(init)) {}
  template <typename W>
  W& at() {
    if constexpr (std::is_same_v<W, V>) return vec;
    else return tail;
  }
};

template <typename Acc>
constexpr Acc kMinusInf = -std::numeric_limits<Acc>::infinity();

// max over j in [0, len) of logit(W-tag, j); -inf for an empty range; NaN if any is NaN.
template <typename V, typename Logit>
inline typename V::Acc max_logit(int64_t len, Logit&& logit) {
  using Acc = typename V::Acc;
  Running<V> running(kMinusInf<Acc>);
  sweep<V>(0, len, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    running.template at<W>() = W::max(running.template at<W>(), logit(tag, j));
  });
  using Scalar = typename Running<V>::Scalar;
  return Scalar::max(Scalar::broadcast(running.vec.reduce_max()), running.tail).lane[0];
}

// Sum over j in [0, len) of term(tag, j), a W-vector of terms at column j. The lanes add up
// blocks of kBlock columns that then go into the total, so the rounding error grows with the
// block length plus the number of blocks instead of with the row length (summed lane by
// lane, a 32k-vocabulary row of exponentials drifts by ~1e-5 relative).
template <typename V, typename Term>
inline typename V::Acc block_sum(int64_t len, Term&& term) {
  using Scalar = VecPortable<typename V::Acc, 1>;
  constexpr int64_t kBlock = 32 * V::kWidth;
  const int64_t vector_end = len - len % V::kWidth;
  V total = V::zero();
  for (int64_t begin = 0; begin < vector_end; begin += kBlock) {
    const int64_t end = std::min(begin + kBlock, vector_end);
    V block = V::zero();
    for (int64_t j = begin; j < end; j += V::kWidth) block = block + term(static_cast<V*>(nullptr), j);
    total = total + block;
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
