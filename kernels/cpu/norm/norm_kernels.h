// The LayerNorm/RMSNorm algorithm, written once over a vector type and compiled once per
// SIMD tier. The including translation unit defines TE_CPU_ISA_NAMESPACE, sets the target
// ISA, includes the vector headers and aliases the tier's fp32 vector as Vec.
//
// Memory traffic is the minimum: each row of x (and dy) comes from DRAM once; the later
// passes over the same row hit L1/L2 (a 4096-wide bf16 row is 8 KiB).
//   forward:  pass 1 mean, pass 2 sum of squared deviations (two-pass: no cancellation
//             when |mean| >> std), pass 3 normalise, scale, shift, round, store.
//   backward: with xhat = (x - mean) * rstd and gdy = dy * g,
//             dx = rstd * (gdy - mean(gdy) - xhat * mean(gdy * xhat))   (LayerNorm)
//             dx = rstd * (gdy - xhat * mean(gdy * xhat))               (RMSNorm)
//             pass 1 reduces both means and adds dy*xhat (and dy) into this chunk's
//             partial dgamma (dbeta); pass 2 writes dx. Chunks' partials are summed at the
//             end, column-parallel, so no atomics and a fixed summation order.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including norm_kernels.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// Sweeps over one row: full vectors of V, then single elements. Bodies are generic lambdas
// taking a pointer whose pointee type is the vector type to use at this position.
template <typename V>
struct RowSweep {
  using Acc = typename V::Acc;
  using Scalar = VecPortable<Acc, 1>;

  template <typename Body>
  static void apply(int64_t cols, Body&& body) {
    int64_t j = 0;
    for (; j + V::kWidth <= cols; j += V::kWidth) body(static_cast<V*>(nullptr), j);
    for (; j < cols; ++j) body(static_cast<Scalar*>(nullptr), j);
  }

  // Returns N row sums; body(acc, j) adds its terms for elements [j, j + width) into
  // acc[0..N). Four accumulator sets rotate so that consecutive vectors never wait on the
  // latency of the previous add/FMA (4 cycles) for their own.
  template <int N, typename Body>
  static std::array<Acc, N> reduce(int64_t cols, Body&& body) {
    constexpr int kSets = 4;
    V acc[kSets][N];
    Scalar tail[N];
    for (int i = 0; i < N; ++i) {
      for (int k = 0; k < kSets; ++k) acc[k][i] = V::zero();
      tail[i] = Scalar::zero();
    }
    int64_t j = 0;
    for (; j + kSets * V::kWidth <= cols; j += kSets * V::kWidth) {
      for (int k = 0; k < kSets; ++k) body(acc[k], j + k * V::kWidth);
    }
    for (; j + V::kWidth <= cols; j += V::kWidth) body(acc[0], j);
    for (; j < cols; ++j) body(tail, j);
    std::array<Acc, N> sums;
    for (int i = 0; i < N; ++i) {
      sums[i] = ((acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i])).reduce_add() + tail[i].lane[0];
    }
    return sums;
  }
};

template <typename P>
using VecOf = std::remove_pointer_t<P>;

// Asks for the next row's cache line at column j (once per 64-byte line) while this row's
// L1-only pass runs, so DRAM keeps streaming. Spread over the pass: a burst of a whole row
// of prefetches fills the miss buffers and stalls the core instead.
template <typename XT>
inline void prefetch_line(const XT* next_row, int64_t j) {
  if (next_row != nullptr && (j * int64_t(sizeof(XT))) % 64 == 0) __builtin_prefetch(next_row + j, 0, 2);
}

// xhat = (x - mean) * rstd. Subtracting before scaling keeps xhat accurate relative to
// itself; the folded form x * rstd - mean * rstd loses digits when |mean| >> std.
template <typename W, NormKind kKind, typename XT>
inline W normalized(const XT* x, typename W::Acc mean, typename W::Acc rstd) {
  if constexpr (kKind == NormKind::kLayerNorm) return (W::load(x) - W::broadcast(mean)) * W::broadcast(rstd);
  else return W::load(x) * W::broadcast(rstd);
}

template <typename V, NormKind kKind, bool kStream, typename XT>
void norm_fwd_row(const XT* x, const XT* next_x, XT* y, const typename V::Acc* gamma,
                  const typename V::Acc* beta, int64_t cols, typename V::Acc eps, typename V::Acc* mean_out,
                  typename V::Acc* rstd_out) {
  using Acc = typename V::Acc;
  using Sweep = RowSweep<V>;
  const Acc inv_cols = Acc(1) / Acc(cols);
  Acc mean = 0;
  if constexpr (kKind == NormKind::kLayerNorm) {
    mean = Sweep::template reduce<1>(cols, [&](auto* acc, int64_t j) {
             using W = VecOf<decltype(acc)>;
             acc[0] = acc[0] + W::load(x + j);
           })[0] * inv_cols;
  }
  const Acc sum_sq = Sweep::template reduce<1>(cols, [&](auto* acc, int64_t j) {
    using W = VecOf<decltype(acc)>;
    W centered = W::load(x + j);
    if constexpr (kKind == NormKind::kLayerNorm) centered = centered - W::broadcast(mean);
    acc[0] = fmadd(centered, centered, acc[0]);
  })[0];
  const Acc rstd = Acc(1) / std::sqrt(sum_sq * inv_cols + eps);
  Sweep::apply(cols, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    prefetch_line(next_x, j);
    const W xhat = normalized<W, kKind>(x + j, mean, rstd);
    if constexpr (kKind == NormKind::kLayerNorm) {
      put<kStream>(fmadd(xhat, W::load(gamma + j), W::load(beta + j)), y + j);
    } else {
      put<kStream>(xhat * W::load(gamma + j), y + j);
    }
  });
  if constexpr (kKind == NormKind::kLayerNorm) *mean_out = mean;
  *rstd_out = rstd;
}

template <typename V, NormKind kKind, bool kStream, typename XT>
void norm_bwd_row(const XT* dy, const XT* x, const XT* next_dy, const XT* next_x, typename V::Acc mean,
                  typename V::Acc rstd,
                  const typename V::Acc* gamma, typename V::Acc* dgamma_part,
                  typename V::Acc* dbeta_part, XT* dx, int64_t cols) {
  using Acc = typename V::Acc;
  using Sweep = RowSweep<V>;
  constexpr bool kLayerNorm = kKind == NormKind::kLayerNorm;
  // sums[0] = sum(gdy * xhat); sums[1] = sum(gdy) (LayerNorm only)
  const auto sums = Sweep::template reduce<kLayerNorm ? 2 : 1>(cols, [&](auto* acc, int64_t j) {
    using W = VecOf<decltype(acc)>;
    const W dyv = W::load(dy + j);
    const W xhat = normalized<W, kKind>(x + j, mean, rstd);
    const W gdy = dyv * W::load(gamma + j);
    acc[0] = fmadd(gdy, xhat, acc[0]);
    fmadd(dyv, xhat, W::load(dgamma_part + j)).store(dgamma_part + j);
    if constexpr (kLayerNorm) {
      acc[1] = acc[1] + gdy;
      (W::load(dbeta_part + j) + dyv).store(dbeta_part + j);
    }
  });
  const Acc inv_cols = Acc(1) / Acc(cols);
  const Acc proj = sums[0] * inv_cols;
  Acc offset = 0;
  if constexpr (kLayerNorm) offset = sums[1] * inv_cols;
  // dx = rstd * (gdy - xhat * proj - offset), regrouped with xhat = (x - mean) * rstd as
  //    = gdy * rstd + ((x - mean) * slope + intercept); x - mean is still formed first.
  const Acc slope = -rstd * rstd * proj, intercept = -offset * rstd;
  Sweep::apply(cols, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    prefetch_line(next_x, j);
    prefetch_line(next_dy, j);
    W centered = W::load(x + j);
    if constexpr (kLayerNorm) centered = centered - W::broadcast(mean);
    const W linear = fmadd(centered, W::broadcast(slope), W::broadcast(intercept));
    const W gdy = W::load(dy + j) * W::load(gamma + j);
    put<kStream>(fmadd(gdy, W::broadcast(rstd), linear), dx + j);
  });
}

// gamma (+1 when zero-centred) and beta widened once per call into the workspace, so the
// row loops read one dtype whatever the parameters' dtype is.
template <typename Acc, typename WT>
void widen(const WT* src, Acc one, int64_t cols, Acc* dst) {
  for (int64_t j = 0; j < cols; ++j) dst[j] = Acc(VecPortable<Acc, 1>::load(src + j).lane[0]) + one;
}

template <typename Acc>
void widen_weights(DType dtype, const void* src, bool add_one, int64_t cols, Acc* dst) {
  const Acc one = add_one ? Acc(1) : Acc(0);
  if (src == nullptr) return std::fill(dst, dst + cols, one);
  switch (dtype) {
    case DType::kFloat32: return widen(static_cast<const float*>(src), one, cols, dst);
    case DType::kFloat64: return widen(static_cast<const double*>(src), one, cols, dst);
    case DType::kBFloat16: return widen(static_cast<const bf16_t*>(src), one, cols, dst);
    case DType::kFloat16: return widen(static_cast<const fp16_t*>(src), one, cols, dst);
  }
}

template <typename V, typename WT>
void sum_partials(const typename V::Acc* partials, int64_t chunks, int64_t chunk_stride, int64_t begin,
                  int64_t end, WT* dst) {
  using Acc = typename V::Acc;
  // The SIMD vectors store 32/16-bit floats only: fp64 parameters with fp32 data go one by one.
  using Vec = std::conditional_t<std::is_same_v<WT, double> && !std::is_same_v<Acc, double>, VecPortable<Acc, 1>, V>;
  RowSweep<Vec>::apply(end - begin, [&](auto* tag, int64_t k) {
    using W = VecOf<decltype(tag)>;
    const int64_t j = begin + k;
    W total = W::load(partials + j);
    for (int64_t c = 1; c < chunks; ++c) total = total + W::load(partials + c * chunk_stride + j);
    total.store(dst + j);
  });
}

// dst[j] = sum over chunks of partials[c * chunk_stride + j], for j in [begin, end), stored in dtype.
template <typename V>
void reduce_partials(const typename V::Acc* partials, int64_t chunks, int64_t chunk_stride, int64_t begin,
                     int64_t end, DType dtype, void* dst) {
  switch (dtype) {
    case DType::kFloat32: return sum_partials<V>(partials, chunks, chunk_stride, begin, end, static_cast<float*>(dst));
    case DType::kFloat64: return sum_partials<V>(partials, chunks, chunk_stride, begin, end, static_cast<double*>(dst));
    case DType::kBFloat16: return sum_partials<V>(partials, chunks, chunk_stride, begin, end, static_cast<bf16_t*>(dst));
    case DType::kFloat16: return sum_partials<V>(partials, chunks, chunk_stride, begin, end, static_cast<fp16_t*>(dst));
  }
}

template <typename V, NormKind kKind, typename XT>
void norm_fwd_rows(const NormFwdParams& p, const ThreadPool& pool) {
  using Acc = typename V::Acc;
  const int64_t stride = padded_cols(p.cols, sizeof(Acc));
  Acc* gamma = static_cast<Acc*>(p.workspace);
  Acc* beta = gamma + stride;
  widen_weights(p.w_dtype, p.gamma, p.zero_centered_gamma, p.cols, gamma);
  widen_weights(p.w_dtype, p.beta, false, p.cols, beta);
  const XT* x = static_cast<const XT*>(p.x);
  XT* y = static_cast<XT*>(p.y);
  Acc* mean = static_cast<Acc*>(p.mean);
  Acc* rstd = static_cast<Acc*>(p.rstd);
  const int64_t grain = std::max<int64_t>(1, kMinElementsPerTask / p.cols);
  const auto rows = [&](auto stream, int64_t begin, int64_t end) {
    Acc unused_mean;
    for (int64_t r = begin; r < end; ++r) {
      const XT* next_x = r + 1 < end ? x + (r + 1) * p.cols : nullptr;
      norm_fwd_row<V, kKind, decltype(stream)::value>(x + r * p.cols, next_x, y + r * p.cols, gamma, beta, p.cols,
                                                      Acc(p.eps), kKind == NormKind::kLayerNorm ? mean + r : &unused_mean,
                                                      rstd + r);
    }
    if constexpr (decltype(stream)::value) V::stream_fence();
  };
  const bool stream = use_streaming_stores<V, XT>(y, p.rows, p.cols);
  pool.parallel_for(p.rows, grain, [&](int64_t begin, int64_t end) {
    if (stream) rows(std::true_type{}, begin, end);
    else rows(std::false_type{}, begin, end);
  });
}

template <typename V, NormKind kKind, typename XT>
void norm_bwd_rows(const NormBwdParams& p, const ThreadPool& pool) {
  using Acc = typename V::Acc;
  constexpr bool kLayerNorm = kKind == NormKind::kLayerNorm;
  const int64_t stride = padded_cols(p.cols, sizeof(Acc));
  Acc* gamma = static_cast<Acc*>(p.workspace);
  Acc* partials = gamma + stride;  // [num_chunks][2][stride]: dgamma, dbeta per chunk
  widen_weights(p.w_dtype, p.gamma, p.zero_centered_gamma, p.cols, gamma);
  const XT* dy = static_cast<const XT*>(p.dy);
  const XT* x = static_cast<const XT*>(p.x);
  XT* dx = static_cast<XT*>(p.dx);
  const Acc* mean = static_cast<const Acc*>(p.mean);
  const Acc* rstd = static_cast<const Acc*>(p.rstd);
  const int64_t chunks = p.num_chunks;
  const auto chunk_rows = [&](auto stream, int64_t c) {
    Acc* dgamma_part = partials + c * 2 * stride;
    Acc* dbeta_part = dgamma_part + stride;
    std::fill(dgamma_part, dgamma_part + 2 * stride, Acc(0));
    const int64_t row_begin = p.rows * c / chunks, row_end = p.rows * (c + 1) / chunks;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const int64_t offset = r * p.cols;
      const bool has_next = r + 1 < row_end;
      norm_bwd_row<V, kKind, decltype(stream)::value>(dy + offset, x + offset, has_next ? dy + offset + p.cols : nullptr,
                                                      has_next ? x + offset + p.cols : nullptr,
                                                      kLayerNorm ? mean[r] : Acc(0),
                                                      rstd[r], gamma, dgamma_part, dbeta_part, dx + offset, p.cols);
    }
    if constexpr (decltype(stream)::value) V::stream_fence();
  };
  const bool stream = use_streaming_stores<V, XT>(dx, p.rows, p.cols);
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      if (stream) chunk_rows(std::true_type{}, c);
      else chunk_rows(std::false_type{}, c);
    }
  });
  pool.parallel_for(p.cols, 4096, [&](int64_t col_begin, int64_t col_end) {
    reduce_partials<V>(partials, chunks, 2 * stride, col_begin, col_end, p.w_dtype, p.dgamma);
    if (kLayerNorm && p.dbeta != nullptr) {
      reduce_partials<V>(partials + stride, chunks, 2 * stride, col_begin, col_end, p.w_dtype, p.dbeta);
    }
  });
}

// Runs Fn for the x dtype. fp64 (for gradcheck) uses a 4-lane array vector, which the
// compiler vectorises for this tier's target.
template <NormKind kKind, template <typename, NormKind, typename> class Fn, typename Params>
void dispatch_x_dtype(const Params& p, const ThreadPool& pool) {
  switch (p.x_dtype) {
    case DType::kFloat32: Fn<Vec, kKind, float>::run(p, pool); break;
    case DType::kBFloat16: Fn<Vec, kKind, bf16_t>::run(p, pool); break;
    case DType::kFloat16: Fn<Vec, kKind, fp16_t>::run(p, pool); break;
    case DType::kFloat64: Fn<VecPortable<double, 4>, kKind, double>::run(p, pool); break;
  }
}

template <typename V, NormKind kKind, typename XT>
struct FwdRows {
  static void run(const NormFwdParams& p, const ThreadPool& pool) { norm_fwd_rows<V, kKind, XT>(p, pool); }
};
template <typename V, NormKind kKind, typename XT>
struct BwdRows {
  static void run(const NormBwdParams& p, const ThreadPool& pool) { norm_bwd_rows<V, kKind, XT>(p, pool); }
};

void norm_fwd(const NormFwdParams& p, const ThreadPool& pool) {
  if (p.kind == NormKind::kLayerNorm) dispatch_x_dtype<NormKind::kLayerNorm, FwdRows>(p, pool);
  else dispatch_x_dtype<NormKind::kRMSNorm, FwdRows>(p, pool);
}

void norm_bwd(const NormBwdParams& p, const ThreadPool& pool) {
  if (p.kind == NormKind::kLayerNorm) dispatch_x_dtype<NormKind::kLayerNorm, BwdRows>(p, pool);
  else dispatch_x_dtype<NormKind::kRMSNorm, BwdRows>(p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
