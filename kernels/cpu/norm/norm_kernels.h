// The LayerNorm/RMSNorm algorithm, written once over a vector type and compiled once per
// SIMD tier. The including translation unit defines TE_CPU_ISA_NAMESPACE, sets the target
// ISA, includes the vector headers and aliases the tier's fp32 vector as Vec.
//
// Memory traffic is the minimum: each row of x (and dy) comes from DRAM once; the later
// passes over the same row hit L1/L2 (a 4096-wide bf16 row is 8 KiB).
//   forward:  pass 1 mean, pass 2 sum of squared deviations (two-pass: no cancellation
//             when |mean| >> std), pass 3 normalise, scale, shift, round, store. A row
//             whose fp32 sums overflow (finite values beyond ~1.8e19) has its statistics
//             recomputed in fp64 (wide_row_stats).
//   backward: with xhat = (x - mean) * rstd and gdy = dy * g,
//             dx = rstd * (gdy - mean(gdy) - xhat * mean(gdy * xhat))   (LayerNorm)
//             dx = rstd * (gdy - xhat * mean(gdy * xhat))               (RMSNorm)
//             pass 1 reduces both means and adds dy*xhat (and dy) into this chunk's
//             partial dgamma (dbeta); pass 2 writes dx. Chunks' partials are summed at the
//             end, column-parallel, so no atomics and a fixed summation order.
// Fusions (norm.h): a residual add stages s = x + residual in a scratch row during the
// forward's first pass (later passes read it from cache; the last one writes it out), and
// its backward adds dsum in pass 2. The FP8 output is made in pass 3 by the per-tensor cast's
// own quantize_values (fp8_chunk.h), from y rounded to XT in registers.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including norm_kernels.h"
#endif

#include "cpu/fp8/fp8_chunk.h"

#include "cpu/simd/prefetch.h"

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

// The row whose lines the passes over row r ask for (prefetch_line, prefetch.h): the first
// at least kPrefetchAheadBytes on. Rows of 4 KiB or more: the next one; shorter rows look
// further, where the next row alone came too late (bf16 [16384, 768] on the 2-core Sapphire
// Rapids VM: rmsnorm fwd+bwd 6.0-6.8 -> 5.5-5.7 ms). Null past the chunk's last row.
template <typename XT>
inline const XT* row_to_prefetch(const XT* tensor, int64_t r, int64_t row_end, int64_t cols) {
  const int64_t row_bytes = std::max<int64_t>(1, cols * int64_t(sizeof(XT)));
  const int64_t ahead = std::max<int64_t>(1, (kPrefetchAheadBytes + row_bytes - 1) / row_bytes);
  return tensor != nullptr && r + ahead < row_end ? tensor + (r + ahead) * cols : nullptr;
}

// xhat = (x - mean) * rstd. Subtracting before scaling keeps xhat accurate relative to
// itself; the folded form x * rstd - mean * rstd loses digits when |mean| >> std.
template <typename W, NormKind kKind, typename XT>
inline W normalized(const XT* x, typename W::Acc mean, typename W::Acc rstd) {
  if constexpr (kKind == NormKind::kLayerNorm) return (W::load(x) - W::broadcast(mean)) * W::broadcast(rstd);
  else return W::load(x) * W::broadcast(rstd);
}

// Where a forward row's values come from: x itself, or s = x + residual, which the first
// pass adds in fp32, rounds once to XT (s is an XT tensor: the next residual stream) and
// stages in a row of scratch that stays in L1/L2; the later passes read s there.
template <typename XT, bool kResidual>
struct RowInput {
  const XT* x;
  const XT* residual;  // with kResidual
  XT* staged;          // [cols] scratch, with kResidual

  template <typename W>
  W first_pass(int64_t j) const {
    if constexpr (kResidual) {
      (W::load(x + j) + W::load(residual + j)).store(staged + j);
      return W::load(staged + j);  // s as rounded to XT
    } else {
      return W::load(x + j);
    }
  }
  const XT* values() const { return kResidual ? staged : x; }
};

// Where a forward row's results go; every pointer may be null.
template <typename XT>
struct RowOutput {
  XT* y;           // [cols] y
  uint8_t* codes;  // [cols] FP8 codes of y as rounded to XT
  XT* sum;         // [cols] s, copied out of RowInput::staged
};

// The FP8 cast of a forward's y: its format and scale, and whether the codes are streamed.
struct Fp8Cast {
  Fp8Format format;
  float scale;
  bool stream;
};

// Codes (into `codes`) and max |y| of one row's y, y_at(tag, j) giving y at j in fp32 lanes:
// the per-tensor cast's quantize_values on y rounded to XT, so the codes and the amax are
// those of fp8_quantize(y) for the stored y.
template <typename V, typename XT, typename YAt>
float quantize_row(YAt y_at, uint8_t* codes, int64_t cols, const Fp8Cast& cast) {
  const auto rounded_y = [y_at](auto* tag, int64_t j) { return y_at(tag, j).template rounded_as<XT>(); };
  const auto run = [&](auto format, auto stream) {
    return quantize_values<V, decltype(format)::value>(rounded_y, CodesTo<decltype(stream)::value>{codes}, 0, cols,
                                                       cast.scale);
  };
  using E4M3 = std::integral_constant<Fp8Format, Fp8Format::kE4M3>;
  using E5M2 = std::integral_constant<Fp8Format, Fp8Format::kE5M2>;
  if (cast.format == Fp8Format::kE4M3) return cast.stream ? run(E4M3{}, std::true_type{}) : run(E4M3{}, std::false_type{});
  return cast.stream ? run(E5M2{}, std::true_type{}) : run(E5M2{}, std::false_type{});
}

// The statistics of a row whose fp32 sums overflowed, recomputed in fp64, where they cannot
// (x^2 overflows fp32 from |x| ~ 1.8e19, a LayerNorm's sum from a few values near FLT_MAX).
// Rows take this scalar pass only when the fast pass's sum of squares is not finite, so
// ordinary rows pay one compare. Returns false when the row itself holds an inf or a NaN:
// then the fp32 results, non-finite as they should be, stand.
template <NormKind kKind, typename XT>
bool wide_row_stats(const XT* x, int64_t cols, double eps, float* mean, float* rstd) {
  using Wide = VecPortable<double, 1>;
  double sum = 0.0, sum_sq = 0.0;
  if constexpr (kKind == NormKind::kLayerNorm) {
    for (int64_t j = 0; j < cols; ++j) sum += Wide::load(x + j).lane[0];
  }
  const double wide_mean = sum / double(cols);
  for (int64_t j = 0; j < cols; ++j) {
    const double centered = Wide::load(x + j).lane[0] - wide_mean;
    sum_sq += centered * centered;
  }
  if (!std::isfinite(sum_sq)) return false;
  *mean = float(wide_mean);
  *rstd = float(1.0 / std::sqrt(sum_sq / double(cols) + eps));  // may be subnormal: 1 / std of ~1e38
  return true;
}

// Returns max |y| when out.codes is set (else 0).
template <typename V, NormKind kKind, bool kStream, bool kResidual, typename XT>
float norm_fwd_row(const RowInput<XT, kResidual>& in, const XT* next_x, const XT* next_residual,
                   const RowOutput<XT>& out, const Fp8Cast& cast, const typename V::Acc* gamma,
                   const typename V::Acc* beta, int64_t cols, typename V::Acc eps, typename V::Acc* mean_out,
                   typename V::Acc* rstd_out) {
  using Acc = typename V::Acc;
  using Sweep = RowSweep<V>;
  const Acc inv_cols = Acc(1) / Acc(cols);
  const XT* x = in.values();  // valid for the passes after the first
  Acc mean = 0, sum_sq = 0;
  if constexpr (kKind == NormKind::kLayerNorm) {
    mean = Sweep::template reduce<1>(cols, [&](auto* acc, int64_t j) {
             using W = VecOf<decltype(acc)>;
             acc[0] = acc[0] + in.template first_pass<W>(j);
           })[0] * inv_cols;
    sum_sq = Sweep::template reduce<1>(cols, [&](auto* acc, int64_t j) {
      using W = VecOf<decltype(acc)>;
      const W centered = W::load(x + j) - W::broadcast(mean);
      acc[0] = fmadd(centered, centered, acc[0]);
    })[0];
  } else {
    sum_sq = Sweep::template reduce<1>(cols, [&](auto* acc, int64_t j) {
      using W = VecOf<decltype(acc)>;
      const W value = in.template first_pass<W>(j);
      acc[0] = fmadd(value, value, acc[0]);
    })[0];
  }
  Acc rstd = Acc(1) / std::sqrt(sum_sq * inv_cols + eps);
  if constexpr (std::is_same_v<Acc, float>) {
    if (!std::isfinite(sum_sq)) wide_row_stats<kKind>(x, cols, eps, &mean, &rstd);
  }
  // Pass 3: y at j (fp32 lanes), after writing it and s where wanted. Captures are copies:
  // the stores through out.y could alias a referenced capture, which would then be reloaded
  // from memory at every vector.
  const auto y_at = [=](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    prefetch_line(next_x, j);
    if constexpr (kResidual) prefetch_line(next_residual, j);
    const W xhat = normalized<W, kKind>(x + j, mean, rstd);
    W y;
    if constexpr (kKind == NormKind::kLayerNorm) y = fmadd(xhat, W::load(gamma + j), W::load(beta + j));
    else y = xhat * W::load(gamma + j);
    if (out.y != nullptr) put<kStream>(y, out.y + j);
    if constexpr (kResidual) put<kStream>(W::load(x + j), out.sum + j);
    return y;
  };
  float amax = 0.0f;
  if constexpr (!std::is_same_v<XT, double>) {  // the API refuses FP8 output for fp64
    if (out.codes != nullptr) amax = quantize_row<V, XT>(y_at, out.codes, cols, cast);
  }
  if (out.codes == nullptr) Sweep::apply(cols, y_at);
  if constexpr (kKind == NormKind::kLayerNorm) *mean_out = mean;
  *rstd_out = rstd;
  return amax;
}

// With kAddGrad, dsum (the gradient of the residual sum from its other uses) is added to dx
// in fp32 before the one rounding.
template <typename V, NormKind kKind, bool kStream, bool kAddGrad, typename XT>
void norm_bwd_row(const XT* dy, const XT* x, const XT* dsum, const XT* next_dy, const XT* next_x,
                  const XT* next_dsum, typename V::Acc mean, typename V::Acc rstd, const typename V::Acc* gamma,
                  typename V::Acc* dgamma_part, typename V::Acc* dbeta_part, XT* dx, int64_t cols) {
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
  // slope holds rstd^2, which underflows for rows of std beyond ~2^32 (values near the fp32
  // limit, wide_row_stats): those rows scale by rstd twice instead, one multiply more.
  const Acc intercept = -offset * rstd;
  const auto write_dx = [&](auto rstd_squared_underflows) {
    constexpr bool kTwice = decltype(rstd_squared_underflows)::value;
    const Acc slope = kTwice ? -rstd * proj : -rstd * rstd * proj;
    Sweep::apply(cols, [&](auto* tag, int64_t j) {
      using W = VecOf<decltype(tag)>;
      prefetch_line(next_x, j);
      prefetch_line(next_dy, j);
      if constexpr (kAddGrad) prefetch_line(next_dsum, j);
      W centered = W::load(x + j);
      if constexpr (kLayerNorm) centered = centered - W::broadcast(mean);
      if constexpr (kTwice) centered = centered * W::broadcast(rstd);
      W linear = fmadd(centered, W::broadcast(slope), W::broadcast(intercept));
      if constexpr (kAddGrad) linear = linear + W::load(dsum + j);
      const W gdy = W::load(dy + j) * W::load(gamma + j);
      put<kStream>(fmadd(gdy, W::broadcast(rstd), linear), dx + j);
    });
  };
  constexpr Acc kSmallestSafeRstd = Acc(1) / Acc(uint64_t(1) << 32);
  if (rstd < kSmallestSafeRstd) write_dx(std::true_type{});
  else write_dx(std::false_type{});
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

// The [rows, cols] tensors a forward reads and writes: x, and residual, y, sum, codes where present.
template <typename XT>
size_t norm_fwd_bytes(const NormFwdParams& p) {
  const size_t tensor = size_t(p.rows * p.cols) * sizeof(XT);
  return tensor * (1 + (p.residual != nullptr) + (p.y != nullptr) + (p.sum != nullptr)) +
         (p.y_fp8 != nullptr ? size_t(p.rows * p.cols) : 0);
}

// Streaming stores for the high-precision outputs present (y, sum), when all are large and aligned.
template <typename V, typename XT>
bool stream_outputs(const NormFwdParams& p) {
  const size_t op_bytes = norm_fwd_bytes<XT>(p);
  const bool y_ok = p.y == nullptr || use_streaming_stores<V, XT>(p.y, p.rows, p.cols, op_bytes);
  const bool sum_ok = p.sum == nullptr || use_streaming_stores<V, XT>(p.sum, p.rows, p.cols, op_bytes);
  return (p.y != nullptr || p.sum != nullptr) && y_ok && sum_ok;
}

// Streaming stores for the FP8 codes: every row's group stores must be aligned (64 bytes
// covers every tier's group).
template <typename XT>
bool stream_fp8_codes(const NormFwdParams& p) {
  return worth_streaming(size_t(p.rows * p.cols), norm_fwd_bytes<XT>(p)) && reinterpret_cast<uintptr_t>(p.y_fp8) % 64 == 0 &&
         p.cols % 64 == 0;
}

template <typename V, NormKind kKind, typename XT>
void norm_fwd_rows(const NormFwdParams& p, const ThreadPool& pool) {
  using Acc = typename V::Acc;
  constexpr bool kLayerNorm = kKind == NormKind::kLayerNorm;
  const int64_t stride = padded_cols(p.cols, sizeof(Acc));
  // Workspace: gamma [stride], beta [stride], per chunk a staging row for s of stride
  // accumulators, then the chunks' amax partials.
  Acc* gamma = static_cast<Acc*>(p.workspace);
  Acc* beta = gamma + stride;
  Acc* staging = beta + stride;
  float* amax_partial = reinterpret_cast<float*>(staging + p.num_chunks * stride);
  widen_weights(p.w_dtype, p.gamma, p.zero_centered_gamma, p.cols, gamma);
  widen_weights(p.w_dtype, p.beta, false, p.cols, beta);
  const XT* x = static_cast<const XT*>(p.x);
  const XT* residual = static_cast<const XT*>(p.residual);
  XT* y = static_cast<XT*>(p.y);
  XT* sum = static_cast<XT*>(p.sum);
  Acc* mean = static_cast<Acc*>(p.mean);
  Acc* rstd = static_cast<Acc*>(p.rstd);
  const bool fp8 = p.y_fp8 != nullptr;
  const bool stream_codes = fp8 && stream_fp8_codes<XT>(p);
  const Fp8Cast cast{p.fp8_format, fp8 ? *p.fp8_scale : 0.0f, stream_codes};
  const int64_t chunks = p.num_chunks;
  const auto chunk_rows = [&](auto stream, auto with_residual, int64_t c) {
    constexpr bool kStream = decltype(stream)::value, kResidual = decltype(with_residual)::value;
    XT* staged_sum = reinterpret_cast<XT*>(staging + c * stride);
    using Scalar = VecPortable<float, 1>;
    Scalar amax = Scalar::zero();
    Acc unused_mean;
    const int64_t row_begin = p.rows * c / chunks, row_end = p.rows * (c + 1) / chunks;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const int64_t offset = r * p.cols;
      const RowInput<XT, kResidual> in{x + offset, kResidual ? residual + offset : nullptr, staged_sum};
      const RowOutput<XT> out{y != nullptr ? y + offset : nullptr, fp8 ? p.y_fp8 + offset : nullptr,
                              kResidual ? sum + offset : nullptr};
      const float row_amax = norm_fwd_row<V, kKind, kStream>(
          in, row_to_prefetch(x, r, row_end, p.cols), kResidual ? row_to_prefetch(residual, r, row_end, p.cols) : nullptr,
          out, cast, gamma, beta, p.cols, Acc(p.eps), kLayerNorm ? mean + r : &unused_mean, rstd + r);
      if (fp8) amax = Scalar::magnitude_max(amax, Scalar::broadcast(row_amax));
    }
    amax_partial[c] = amax.lane[0];
    if (kStream || stream_codes) V::stream_fence();
  };
  const bool stream = stream_outputs<V, XT>(p);
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      const auto with_stream = [&](auto stream_tag) {
        if (residual != nullptr) chunk_rows(stream_tag, std::true_type{}, c);
        else chunk_rows(stream_tag, std::false_type{}, c);
      };
      if (stream) with_stream(std::true_type{});
      else with_stream(std::false_type{});
    }
  });
  if (fp8) *p.amax = combine_amaxes(amax_partial, chunks);
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
  const XT* dsum = static_cast<const XT*>(p.dsum);
  XT* dx = static_cast<XT*>(p.dx);
  const Acc* mean = static_cast<const Acc*>(p.mean);
  const Acc* rstd = static_cast<const Acc*>(p.rstd);
  const int64_t chunks = p.num_chunks;
  const auto chunk_rows = [&](auto stream, auto add_grad, int64_t c) {
    constexpr bool kStream = decltype(stream)::value, kAddGrad = decltype(add_grad)::value;
    Acc* dgamma_part = partials + c * 2 * stride;
    Acc* dbeta_part = dgamma_part + stride;
    std::fill(dgamma_part, dgamma_part + 2 * stride, Acc(0));
    const int64_t row_begin = p.rows * c / chunks, row_end = p.rows * (c + 1) / chunks;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const int64_t offset = r * p.cols;
      const XT* row_dsum = kAddGrad ? dsum + offset : nullptr;
      norm_bwd_row<V, kKind, kStream, kAddGrad>(dy + offset, x + offset, row_dsum, row_to_prefetch(dy, r, row_end, p.cols),
                                                row_to_prefetch(x, r, row_end, p.cols),
                                                kAddGrad ? row_to_prefetch(dsum, r, row_end, p.cols) : nullptr,
                                                kLayerNorm ? mean[r] : Acc(0), rstd[r], gamma, dgamma_part,
                                                dbeta_part, dx + offset, p.cols);
    }
    if constexpr (kStream) V::stream_fence();
  };
  const bool stream = use_streaming_stores<V, XT>(dx, p.rows, p.cols,  // dy, x, dx and dsum
                                                   size_t(p.rows * p.cols) * sizeof(XT) * (3 + (p.dsum != nullptr)));
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      const auto with_stream = [&](auto stream_tag) {
        if (dsum != nullptr) chunk_rows(stream_tag, std::true_type{}, c);
        else chunk_rows(stream_tag, std::false_type{}, c);
      };
      if (stream) with_stream(std::true_type{});
      else with_stream(std::false_type{});
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
