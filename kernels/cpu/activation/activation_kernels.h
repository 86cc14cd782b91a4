// Activation forward, backward (with the fused bias gradient) and forward-to-FP8, written
// once over the tier's vector type Vec (see cpu/isa/tier_<tier>.h) and once over the
// activation functors of activation_math.h.
//
// Work is the flat range of *output* elements, cut into at most one chunk per thread at
// multiples of kBlock elements (so every vector store of a chunk stays aligned), and each
// chunk is walked in pieces that end at row ends: within a piece, a gated activation's b
// half lies `half` elements after its a half, and the bias is indexed by column. A plain
// activation without bias has no use for rows and runs as one flat row (no row tails).
// The bias gradient is summed per chunk into its own fp32 partial [cols], and the partials
// are reduced in chunk order at the end: one pass over dy and x, deterministic, no atomics.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including activation_kernels.h"
#endif

#include "cpu/activation/activation_math.h"
#include "cpu/fp8/byte_transpose.h"
#include "cpu/fp8/fp8_chunk.h"
#include "cpu/simd/prefetch.h"
#include "te_kernels/activation.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace activations {

using Scalar = VecPortable<float, 1>;

// How the kernels see [rows, cols] of input: rows of in_cols elements in, out_cols out.
struct Layout {
  int64_t rows, in_cols, out_cols;
  int64_t half;  // from an a element to its b element (gated), else 0

  Layout(int64_t rows_, int64_t cols, bool gated, bool has_bias) {
    const bool flat = !gated && !has_bias;
    rows = flat ? 1 : rows_;
    in_cols = flat ? rows_ * cols : cols;
    out_cols = gated ? cols / 2 : in_cols;
    half = gated ? out_cols : 0;
  }
  int64_t out_numel() const { return rows * out_cols; }
};

inline int64_t chunk_count(int64_t elements, const ThreadPool& pool) {
  return std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), elements / kMinElementsPerTask));
}

// Calls piece(row, col, count) over output elements [begin, end), cut at row ends.
template <typename Piece>
void for_each_row_piece(const Layout& l, int64_t begin, int64_t end, Piece&& piece) {
  while (begin < end) {
    const int64_t row = begin / l.out_cols, col = begin - row * l.out_cols;
    const int64_t count = std::min(end - begin, l.out_cols - col);
    piece(row, col, count);
    begin += count;
  }
}

template <typename V, typename T>
V load_input(const T* x, const T* bias, int64_t j) {
  const V v = V::load(x + j);
  return bias != nullptr ? v + V::load(bias + j) : v;
}

// The activation of the elements at j (and j + half for the b half of a gated one).
template <typename V, typename F, typename T>
V forward_at(const F& f, const T* x, const T* bias, int64_t half, int64_t j) {
  if constexpr (F::kGated) {
    return f.gate.value(load_input<V>(x, bias, j)) * f.linear.value(load_input<V>(x, bias, j + half));
  } else {
    return f.act.value(load_input<V>(x, bias, j));
  }
}

// y[0, n) of one piece; x and bias point at its first (a) element.
template <typename V, bool kStream, typename F, typename T>
void forward_piece(const F& f, const T* x, const T* bias, int64_t half, T* y, int64_t n) {
  int64_t j = 0;
  for (; j + V::kWidth <= n; j += V::kWidth) {
    prefetch_ahead(x, j);
    if constexpr (F::kGated) prefetch_ahead(x + half, j);
    put<kStream>(forward_at<V>(f, x, bias, half, j), y + j);
  }
  for (; j < n; ++j) forward_at<Scalar>(f, x, bias, half, j).store(y + j);
}

// Where backward_at writes the input gradient: dx[j] for a plain activation and for a gated
// one's a half, dx_linear[j] for its b half (dx + half in the input's layout, or a buffer of
// its own); the bias partial, when given, indexed as x's columns.
template <typename T>
struct GradOut {
  T* dx;
  T* dx_linear;
  float* partial;
};

// The input gradient at j (and j + half for the b half of a gated activation), from dy at j.
template <typename V, bool kStream, typename F, typename T>
void backward_at(const F& f, const T* dy, const T* x, const T* bias, int64_t half, const GradOut<T>& out, int64_t j) {
  const V grad = V::load(dy + j);
  const auto emit = [&](V g, T* dx, int64_t partial_at) {
    put<kStream>(g, dx + j);
    if (out.partial != nullptr) (V::load(out.partial + partial_at) + g).store(out.partial + partial_at);
  };
  if constexpr (F::kGated) {
    V d_gate, d_linear;
    const V gate = f.gate.value_and_derivative(load_input<V>(x, bias, j), d_gate);
    const V linear = f.linear.value_and_derivative(load_input<V>(x, bias, j + half), d_linear);
    emit(grad * linear * d_gate, out.dx, j);
    emit(grad * gate * d_linear, out.dx_linear, j + half);
  } else {
    V derivative;
    f.act.value_and_derivative(load_input<V>(x, bias, j), derivative);
    emit(grad * derivative, out.dx, j);
  }
}

// The input gradient of n output elements; kPrefetch: ask for x and dy 4 KiB ahead (a stream
// along the row), else the caller reads segments it has prefetched itself.
template <typename V, bool kStream, bool kPrefetch, typename F, typename T>
void backward_piece(const F& f, const T* dy, const T* x, const T* bias, int64_t half, const GradOut<T>& out,
                    int64_t n) {
  int64_t j = 0;
  for (; j + V::kWidth <= n; j += V::kWidth) {
    if constexpr (kPrefetch) {
      prefetch_ahead(x, j);
      prefetch_ahead(dy, j);
      if constexpr (F::kGated) prefetch_ahead(x + half, j);
    }
    backward_at<V, kStream>(f, dy, x, bias, half, out, j);
  }
  for (; j < n; ++j) backward_at<Scalar, false>(f, dy, x, bias, half, out, j);
}

// FP8 codes of one piece: the activation goes through an L1 staging buffer in x's dtype
// (which rounds it exactly as activation_fwd's output is rounded) and is cast from there by
// the per-tensor cast's own quantize_chunk. Stages are whole vectors long, so the vector
// bodies and scalar tails fall on the same elements as in forward_piece. Returns max |y|.
constexpr int64_t kStage = 1024;

template <typename V, Fp8Format kFormat, bool kStream, typename F, typename T>
float fp8_piece(const F& f, const T* x, const T* bias, int64_t half, uint8_t* out, int64_t n, float scale) {
  alignas(64) T staged[kStage];
  Scalar amax = Scalar::zero();
  for (int64_t j = 0; j < n; j += kStage) {
    const int64_t count = std::min(kStage, n - j);
    forward_piece<V, false>(f, x + j, bias != nullptr ? bias + j : nullptr, half, staged, count);
    const float stage_amax =
        quantize_chunk<V, kFormat, kStream, T, true, InputReads::kPreparedByCaller>(staged, out + j, 0, count, scale);
    amax = Scalar::magnitude_max(amax, Scalar::broadcast(stage_amax));
  }
  return amax.lane[0];
}

template <typename V, typename T, typename F>
void forward(const F& f, const ActivationFwdParams& p, const ThreadPool& pool) {
  const Layout l(p.rows, p.cols, F::kGated, p.bias != nullptr);
  const T* x = static_cast<const T*>(p.x);
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
  const int64_t chunks = chunk_count(l.out_numel(), pool);
  const bool stream = use_streaming_stores<V, T>(y, l.rows, l.out_cols, size_t(l.rows * (l.in_cols + l.out_cols)) * sizeof(T));
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      const auto [begin, end] = block_aligned_part(l.out_numel(), c, chunks);
      for_each_row_piece(l, begin, end, [&](int64_t row, int64_t col, int64_t count) {
        const T* x_at = x + row * l.in_cols + col;
        const T* bias_at = bias != nullptr ? bias + col : nullptr;
        T* y_at = y + row * l.out_cols + col;
        if (stream) forward_piece<V, true>(f, x_at, bias_at, l.half, y_at, count);
        else forward_piece<V, false>(f, x_at, bias_at, l.half, y_at, count);
      });
    }
    if (stream) V::stream_fence();
  });
}

template <typename V, typename T, typename F>
void backward(const F& f, const ActivationBwdParams& p, const ThreadPool& pool) {
  const Layout l(p.rows, p.cols, F::kGated, p.bias != nullptr || p.dbias != nullptr);
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  const T* bias = static_cast<const T*>(p.bias);
  T* dx = static_cast<T*>(p.dx);
  const int64_t stride = padded_cols(p.cols, sizeof(float));
  float* partials = static_cast<float*>(p.workspace);  // [num_chunks, stride]
  // dx, the only large output, has the input's layout. A gated activation writes it as two
  // interleaved streams (a and b halves of each row), which streaming stores handle badly:
  // swiglu bf16 [4096, 8192] backward took 42 ms with them and 19 ms with ordinary stores.
  const bool stream = !F::kGated && use_streaming_stores<V, T>(dx, l.rows, l.in_cols,  // dy, x, dx
                                                                  size_t(l.rows * (l.out_cols + 2 * l.in_cols)) * sizeof(T));
  pool.parallel_for(p.num_chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      float* partial = p.dbias != nullptr ? partials + c * stride : nullptr;
      if (partial != nullptr) std::fill(partial, partial + p.cols, 0.0f);
      const auto [begin, end] = block_aligned_part(l.out_numel(), c, p.num_chunks);
      for_each_row_piece(l, begin, end, [&](int64_t row, int64_t col, int64_t count) {
        const T* dy_at = dy + row * l.out_cols + col;
        const T* x_at = x + row * l.in_cols + col;
        const T* bias_at = bias != nullptr ? bias + col : nullptr;
        T* dx_at = dx + row * l.in_cols + col;
        const GradOut<T> out{dx_at, dx_at + l.half, partial != nullptr ? partial + col : nullptr};
        if (stream) backward_piece<V, true, true>(f, dy_at, x_at, bias_at, l.half, out, count);
        else backward_piece<V, false, true>(f, dy_at, x_at, bias_at, l.half, out, count);
      });
    }
    if (stream) V::stream_fence();
  });
  if (p.dbias == nullptr) return;
  T* dbias = static_cast<T*>(p.dbias);
  for (int64_t col = 0; col < p.cols; ++col) {
    float sum = 0.0f;
    for (int64_t c = 0; c < p.num_chunks; ++c) sum += partials[c * stride + col];
    dbias[col] = Convert<T>::from(sum);
  }
}

template <typename V, Fp8Format kFormat, typename T, typename F>
void forward_fp8(const F& f, const ActivationFp8Params& p, const ThreadPool& pool) {
  const Layout l(p.rows, p.cols, F::kGated, p.bias != nullptr);
  const T* x = static_cast<const T*>(p.x);
  const T* bias = static_cast<const T*>(p.bias);
  float* partial = static_cast<float*>(p.workspace);
  const float scale = *p.scale;
  const int64_t chunks = chunk_count(l.out_numel(), pool);
  // Group stores need each piece to start on a kBlock boundary: chunks do, and rows do when
  // their length is a multiple of it.
  const bool stream = use_streaming_stores<V, uint8_t>(p.out, l.out_numel(), size_t(l.rows * l.in_cols) * sizeof(T) + l.out_numel()) &&
                      reinterpret_cast<uintptr_t>(p.out) % kBlock == 0 && l.out_cols % kBlock == 0;
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      Scalar amax = Scalar::zero();
      const auto [begin, end] = block_aligned_part(l.out_numel(), c, chunks);
      for_each_row_piece(l, begin, end, [&](int64_t row, int64_t col, int64_t count) {
        const T* x_at = x + row * l.in_cols + col;
        const T* bias_at = bias != nullptr ? bias + col : nullptr;
        uint8_t* out_at = p.out + row * l.out_cols + col;
        const float piece_amax = stream ? fp8_piece<V, kFormat, true>(f, x_at, bias_at, l.half, out_at, count, scale)
                                        : fp8_piece<V, kFormat, false>(f, x_at, bias_at, l.half, out_at, count, scale);
        amax = Scalar::magnitude_max(amax, Scalar::broadcast(piece_amax));
      });
      partial[c] = amax.lane[0];
    }
    if (stream) V::stream_fence();
  });
  *p.amax = combine_amaxes(partial, chunks);
}

// One row segment of the input gradient for the output columns dy and x start at: grad_a[0, n)
// (a plain activation's, or a gated one's a half) and grad_b[0, n) (a gated one's b half, `half`
// columns on in x), rounded to T as activation_bwd rounds its output. A function pointer, so that
// the tile walk below is compiled once per FP8 format and dtype rather than once per activation
// too (each walk inlines the cast and the transposes: 72 of them took the unit from 25 s to over
// 10 minutes of compiling).
template <typename T>
using GradSegment = void (*)(const void* functor, const T* dy, const T* x, int64_t half, T* grad_a, T* grad_b,
                             int64_t n);

template <typename V, typename F, typename T>
void grad_segment(const void* functor, const T* dy, const T* x, int64_t half, T* grad_a, T* grad_b, int64_t n) {
  backward_piece<V, false, false>(*static_cast<const F*>(functor), dy, x, static_cast<const T*>(nullptr), half,
                                  GradOut<T>{grad_a, grad_b, nullptr}, n);
}

// backward_fp8's tiles: kGradTile rows by kGradPanel output columns. Its three input streams (dy
// and x's two halves) have rows a power of two apart in the usual shapes, so a tile's row
// segments fall into few cache sets: wide panels over fewer rows keep more of each line in use.
// On 2 Zen 3 cores (bf16 [4096, 8192] swiglu) 128 x 128 took 37 ms, 128 x 64 69 ms, 64 x 256
// 33 ms, the unfused passes 32 ms.
constexpr int64_t kGradPanel = 256, kGradTile = 64;

// The input gradient as FP8 codes and their transpose (ActivationBwdFp8Params), never written
// in x's dtype: the quantize_transpose pass of fp8_kernels.h with each input segment computed
// (by `segment`) instead of read. Threads take tiles of kGradTile rows; a tile is walked in
// panels of kGradPanel output columns (gated: the a half's columns and the same columns of the b
// half together, so that each element's gate and linear parts are evaluated once) and strips
// of kStrip rows. A row's segment of the gradient is staged in L1 in x's dtype and cast from
// there by quantize_chunk (the codes and amax of fp8_quantize_transpose of activation_bwd's
// output, bit for bit) into the strip's staged codes, which go to `out` and are transposed into
// the tile's transpose buffers; a finished panel gives each of its rows of `out_t` one run of
// kGradTile bytes (a cache line, streamed for large outputs; the row-wise codes go out with
// ordinary stores). Panels start at multiples of kGradPanel, so the vector bodies and scalar
// tails of each row fall on the elements activation_bwd gives them.
template <typename V, Fp8Format kFormat, typename T>
void backward_fp8(const ActivationBwdFp8Params& p, bool gated, const void* functor, GradSegment<T> segment,
                  const ThreadPool& pool) {
  const int halves = gated ? 2 : 1;
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  const int64_t rows = p.rows, in_cols = p.cols, out_cols = gated ? p.cols / 2 : p.cols;
  const int64_t half = gated ? out_cols : 0;  // from an a column to its b column
  const int64_t numel = rows * in_cols;
  const int64_t tiles = (rows + kGradTile - 1) / kGradTile;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({pool.num_threads(), tiles,
                                                                  numel / kMinElementsPerTask + 1}));
  float* partial = static_cast<float*>(p.workspace);
  const float scale = *p.scale;
  const bool stream = size_t(numel) >= kTransposeStreamMinBytes;
  // The inputs of a later row (in this panel, or the next panel's first rows).
  const auto prefetch_row = [&](int64_t row, int64_t col, int64_t count) {
    prefetch_elements(dy, row * out_cols + col, count, rows * out_cols);
    for (int h = 0; h < halves; ++h) prefetch_elements(x, row * in_cols + col + h * half, count, numel);
  };
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    alignas(64) T grad[2][kGradPanel];                        // one row's segment of each half
    alignas(64) uint8_t staged[2][kStrip * kGradPanel];       // [rows of the strip, columns of the panel]
    alignas(64) uint8_t staged_t[2][kGradPanel * kGradTile];  // [columns of the panel, rows of the tile]
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      Scalar amax = Scalar::zero();
      for (int64_t tile = tiles * c / chunks; tile < tiles * (c + 1) / chunks; ++tile) {
        const int64_t r0 = tile * kGradTile, height = std::min(rows, r0 + kGradTile) - r0;
        for (int64_t c0 = 0; c0 < out_cols; c0 += kGradPanel) {
          const int64_t width = std::min(out_cols - c0, kGradPanel);
          const int64_t next_width = std::min(out_cols - c0 - kGradPanel, kGradPanel);
          for (int64_t i0 = 0; i0 < height; i0 += kStrip) {
            const int64_t strip_rows = std::min(kStrip, height - i0);
            for (int64_t i = i0; i < i0 + strip_rows; ++i) {
              if (i + kPrefetchRows < height) prefetch_row(r0 + i + kPrefetchRows, c0, width);
              else if (next_width > 0) prefetch_row(r0 + i + kPrefetchRows - height, c0 + kGradPanel, next_width);
              const int64_t row = r0 + i;
              segment(functor, dy + row * out_cols + c0, x + row * in_cols + c0, half, grad[0], grad[1], width);
              for (int h = 0; h < halves; ++h) {
                uint8_t* staged_row = staged[h] + (i - i0) * kGradPanel;
                const float row_amax = quantize_chunk<V, kFormat, false, T, true, InputReads::kPreparedByCaller>(
                    grad[h], staged_row, 0, width, scale);
                write_bytes(p.out + row * in_cols + c0 + h * half, staged_row, width, false);
                amax = Scalar::magnitude_max(amax, Scalar::broadcast(row_amax));
              }
            }
            if (p.out_t == nullptr) continue;
            for (int h = 0; h < halves; ++h) {
              transpose_bytes(staged[h], kGradPanel, staged_t[h] + i0, kGradTile, strip_rows, width);
            }
          }
          if (p.out_t == nullptr) continue;
          for (int h = 0; h < halves; ++h) {
            for (int64_t j = 0; j < width; ++j) {
              write_bytes(p.out_t + (c0 + h * half + j) * rows + r0, staged_t[h] + j * kGradTile, height, stream);
            }
          }
        }
      }
      partial[c] = amax.lane[0];
    }
    if (stream) fence_streaming_stores();
  });
  *p.amax = combine_amaxes(partial, chunks);
}

// Runs body(functor, T{}) for the params' activation and dtype.
template <typename Params, typename Body>
void dispatch(const Params& p, Body&& body) {
  with_activation(p.act, [&](const auto& f) {
    switch (p.dtype) {
      case DType::kFloat32: return body(f, float{});
      case DType::kBFloat16: return body(f, bf16_t{});
      case DType::kFloat16: return body(f, fp16_t{});
      case DType::kFloat64: return;  // rejected by the API (activation.cpp)
    }
  });
}

}  // namespace activations

void activation_fwd(const ActivationFwdParams& p, const ThreadPool& pool) {
  activations::dispatch(p, [&](const auto& f, auto t) { activations::forward<Vec, decltype(t)>(f, p, pool); });
}

void activation_bwd(const ActivationBwdParams& p, const ThreadPool& pool) {
  activations::dispatch(p, [&](const auto& f, auto t) { activations::backward<Vec, decltype(t)>(f, p, pool); });
}

void activation_fp8(const ActivationFp8Params& p, const ThreadPool& pool) {
  activations::dispatch(p, [&](const auto& f, auto t) {
    using T = decltype(t);
    if (p.format == Fp8Format::kE4M3) activations::forward_fp8<Vec, Fp8Format::kE4M3, T>(f, p, pool);
    else activations::forward_fp8<Vec, Fp8Format::kE5M2, T>(f, p, pool);
  });
}

void activation_bwd_fp8(const ActivationBwdFp8Params& p, const ThreadPool& pool) {
  activations::dispatch(p, [&](const auto& f, auto t) {
    using T = decltype(t);
    using F = std::decay_t<decltype(f)>;
    const activations::GradSegment<T> segment = &activations::grad_segment<Vec, F, T>;
    if (p.format == Fp8Format::kE4M3) {
      activations::backward_fp8<Vec, Fp8Format::kE4M3, T>(p, F::kGated, &f, segment, pool);
    } else {
      activations::backward_fp8<Vec, Fp8Format::kE5M2, T>(p, F::kGated, &f, segment, pool);
    }
  });
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
