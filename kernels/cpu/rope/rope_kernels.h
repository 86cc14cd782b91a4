// The RoPE main pass, written once over a vector type and compiled once per SIMD tier (see
// te_kernels/rope.h for the formula). rope.cpp has already filled the per-position table in
// params.workspace: row p holds cos[rotary_dim] then the signed sine S[rotary_dim], with
//   y[j] = x[j] * cos[j] + x[partner(j)] * S[j]
// where partner(j) = j +- rotary_dim/2 (halves) or j ^ 1 (adjacent pairs); the sign of
// rot(), and for the backward the transpose, are folded into S. So forward and backward are
// the same loop: one read of x, one write of y, fp32 FMAs in between.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including rope_kernels.h"
#endif

#include "cpu/simd/prefetch.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

using Scalar1 = VecPortable<float, 1>;

// y = x * c + partner * s for one vector (or, with Scalar1, one element) at offset j.
template <bool kStream, typename W, typename T>
inline void rotate_at(const T* x, const T* partner, T* y, const float* cos, const float* sin, int64_t j) {
  put<kStream>(fmadd(W::load(partner + j), W::load(sin + j), W::load(x + j) * W::load(cos + j)), y + j);
}

// One head: x, y [head_dim]; cos, sin [rotary_dim].
template <typename V, bool kInterleaved, bool kStream, typename T>
void rope_head(const T* x, T* y, const float* cos, const float* sin, int64_t rotary_dim, int64_t head_dim) {
  int64_t j = 0;
  if constexpr (kInterleaved) {
    for (; j + V::kWidth <= rotary_dim; j += V::kWidth) {
      prefetch_ahead(x, j);
      const V v = V::load(x + j);
      put<kStream>(fmadd(v.swap_pairs(), V::load(sin + j), v * V::load(cos + j)), y + j);
    }
    for (; j < rotary_dim; ++j) {  // whole pairs are left: kWidth and rotary_dim are even
      const float partner = to_float(x[j ^ 1]);
      y[j] = Convert<T>::from(to_float(x[j]) * cos[j] + partner * sin[j]);
    }
  } else {
    // Both halves advance together: each vector of the first half meets its partner vector
    // of the second half, so every element is loaded once.
    const int64_t half = rotary_dim / 2;
    for (; j + V::kWidth <= half; j += V::kWidth) {
      prefetch_ahead(x, j);
      prefetch_ahead(x + half, j);
      rotate_at<kStream, V>(x, x + half, y, cos, sin, j);
      rotate_at<kStream, V>(x + half, x, y + half, cos + half, sin + half, j);
    }
    for (; j < half; ++j) {
      rotate_at<false, Scalar1>(x, x + half, y, cos, sin, j);
      rotate_at<false, Scalar1>(x + half, x, y + half, cos + half, sin + half, j);
    }
    j = rotary_dim;
  }
  // Channels past rotary_dim are copied (through fp32, which is exact for every dtype here).
  for (; j + V::kWidth <= head_dim; j += V::kWidth) {
    prefetch_ahead(x, j);
    put<kStream>(V::load(x + j), y + j);
  }
  for (; j < head_dim; ++j) y[j] = x[j];
}

// Which sequence token n belongs to, and its index in it.
struct TokenPlace {
  int64_t sequence, index;
};

inline TokenPlace place_of(const RopeParams& p, int64_t n) {
  switch (p.format) {
    case RopeFormat::kSbhd: return {n % p.batch, n / p.batch};
    case RopeFormat::kBshd: return {n / p.seq_len, n % p.seq_len};
    case RopeFormat::kThd: break;
  }
  // cu_seqlens is non-decreasing from 0: the sequence is the last b with cu_seqlens[b] <= n.
  int64_t low = 0, high = p.batch;  // invariant: cu_seqlens[low] <= n < cu_seqlens[high]
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    if (p.cu_seqlens[mid] <= n) low = mid;
    else high = mid;
  }
  return {low, n - p.cu_seqlens[low]};
}

template <typename V, bool kInterleaved, bool kStream, typename T>
void rope_tokens(const RopeParams& p, const ThreadPool& pool) {
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const float* table = static_cast<const float*>(p.workspace);
  const int64_t token_size = p.heads * p.head_dim;
  const int64_t x_token_stride = p.x_token_stride != 0 ? p.x_token_stride : token_size;
  const int64_t x_head_stride = p.x_head_stride != 0 ? p.x_head_stride : p.head_dim;
  const int64_t tokens = p.format == RopeFormat::kThd ? p.seq_len : p.seq_len * p.batch;
  const int64_t grain = std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, token_size));
  pool.parallel_for(tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const TokenPlace place = place_of(p, n);
      const int64_t position = place.index + (p.start_positions ? p.start_positions[place.sequence] : 0);
      const float* cos = table + position * 2 * p.rotary_dim;
      const float* sin = cos + p.rotary_dim;
      for (int64_t h = 0; h < p.heads; ++h) {
        rope_head<V, kInterleaved, kStream>(x + n * x_token_stride + h * x_head_stride,
                                            y + n * token_size + h * p.head_dim, cos, sin, p.rotary_dim, p.head_dim);
      }
    }
    if constexpr (kStream) V::stream_fence();
  });
}

template <typename V, bool kInterleaved, typename T>
void rope_typed(const RopeParams& p, const ThreadPool& pool) {
  // Streaming stores need every vector store aligned: no scalar tails anywhere in a head.
  const int64_t rotary_step = kInterleaved ? V::kWidth : 2 * V::kWidth;
  const int64_t tokens = p.format == RopeFormat::kThd ? p.seq_len : p.seq_len * p.batch;
  const bool stream = p.rotary_dim % rotary_step == 0 && p.head_dim % V::kWidth == 0 &&
                      use_streaming_stores<V, T>(p.y, tokens * p.heads, p.head_dim, 2 * size_t(tokens * p.heads * p.head_dim) * sizeof(T));
  if (stream) rope_tokens<V, kInterleaved, true, T>(p, pool);
  else rope_tokens<V, kInterleaved, false, T>(p, pool);
}

template <typename T>
void rope_dispatch_layout(const RopeParams& p, const ThreadPool& pool) {
  if (p.interleaved) rope_typed<Vec, true, T>(p, pool);
  else rope_typed<Vec, false, T>(p, pool);
}

void rope(const RopeParams& p, const ThreadPool& pool) {
  switch (p.dtype) {
    case DType::kFloat32: return rope_dispatch_layout<float>(p, pool);
    case DType::kBFloat16: return rope_dispatch_layout<bf16_t>(p, pool);
    case DType::kFloat16: return rope_dispatch_layout<fp16_t>(p, pool);
    case DType::kFloat64: break;  // rejected by rope.cpp
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
