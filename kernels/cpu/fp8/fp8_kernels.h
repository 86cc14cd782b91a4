// FP8 quantize (scale, saturate, round, store codes, and amax of the input, in one pass) and
// dequantize, written once over the tier's vector type Vec (see cpu/isa/tier_<tier>.h).
//
// The amax is the max of |x| over the *unscaled* input with fmaxf semantics (NaN elements
// are skipped, inf counts; the codes of NaN elements are still NaN), reduced without
// atomics: the range is cut into at most one chunk per thread, each chunk writes its own
// partial, and the partials are combined in chunk order. Work is split at multiples of
// kBlock elements so that every vector store of a chunk stays aligned (streaming stores
// require it).
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including fp8_kernels.h"
#endif

#include "cpu/fp8/byte_transpose.h"
#include "cpu/fp8/fp8_chunk.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

template <typename V, Fp8Format kFormat, typename T>
void quantize(const Fp8QuantizeParams& p, const ThreadPool& pool) {
  const T* in = static_cast<const T*>(p.in);
  float* partial = static_cast<float*>(p.workspace);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), p.numel / kMinElementsPerTask));
  const float scale = *p.scale;
  // Chunks start at multiples of kBlock bytes: with a line-aligned output every group store is aligned.
  const bool stream = use_streaming_stores<V, uint8_t>(p.out, p.numel, size_t(p.numel) * (sizeof(T) + 1)) &&
                      reinterpret_cast<uintptr_t>(p.out) % kBlock == 0;
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      const auto [begin, end] = block_aligned_part(p.numel, c, chunks);
      partial[c] = stream ? quantize_chunk<V, kFormat, true>(in, p.out, begin, end, scale)
                          : quantize_chunk<V, kFormat, false>(in, p.out, begin, end, scale);
    }
    if (stream) V::stream_fence();
  });
  *p.amax = combine_amaxes(partial, chunks);
}

// Quantize + transpose over tiles of kTile rows x kPanel columns. Each strip of kStrip rows
// of a tile is quantised into an L1 staging buffer (and, in the same store loop, streamed to
// `out` when its rows are aligned for it), then transposed from there into the tile's
// transpose buffer; when the tile is complete, each of its kPanel columns goes to `out_t` as
// one run of kTile bytes. Streaming stores from outputs of kTransposeStreamMinBytes on.
template <typename V, Fp8Format kFormat, typename T>
void quantize_transpose(const Fp8QuantizeParams& p, const ThreadPool& pool) {
  const T* in = static_cast<const T*>(p.in);
  float* partial = static_cast<float*>(p.workspace);
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t tiles = (rows + kTile - 1) / kTile;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({pool.num_threads(), tiles,
                                                                  p.numel / kMinElementsPerTask + 1}));
  const float scale = *p.scale;
  const bool stream = size_t(p.numel) >= kTransposeStreamMinBytes;
  // The segments are prefetched kPrefetchRows rows ahead below.
  constexpr InputReads kReads = InputReads::kPreparedByCaller;
  // Every row of `out` starts on a group boundary: the codes go there straight from registers.
  constexpr int64_t kGroupBytes = V::kFp8Group * V::kWidth;
  const bool stream_rows = stream && cols % kGroupBytes == 0 && reinterpret_cast<uintptr_t>(p.out) % kGroupBytes == 0;
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    alignas(64) uint8_t staged[kStrip * kPanel];   // [rows of the strip, columns of the panel]
    alignas(64) uint8_t staged_t[kPanel * kTile];  // [columns of the panel, rows of the tile]
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      using Scalar = VecPortable<float, 1>;
      Scalar amax = Scalar::zero();
      for (int64_t tile = tiles * c / chunks; tile < tiles * (c + 1) / chunks; ++tile) {
        const int64_t r0 = tile * kTile, height = std::min(rows, r0 + kTile) - r0;
        for (int64_t c0 = 0; c0 < cols; c0 += kPanel) {
          const int64_t width = std::min(cols - c0, kPanel);
          // Where the segments of the panel after this one start: the next panel of this
          // tile, or the next tile's first one.
          const bool last_panel = c0 + kPanel >= cols;
          const int64_t next = last_panel ? (r0 + kTile) * cols : r0 * cols + c0 + kPanel;
          const int64_t next_count = last_panel ? std::min(cols, kPanel) : std::min(cols - c0 - kPanel, kPanel);
          for (int64_t i0 = 0; i0 < height; i0 += kStrip) {
            const int64_t strip_rows = std::min(kStrip, height - i0);
            for (int64_t i = i0; i < i0 + strip_rows; ++i) {
              // The segment kPrefetchRows rows ahead, running on into the next panel's first rows.
              if (i + kPrefetchRows < height) prefetch_elements(in, (r0 + i + kPrefetchRows) * cols + c0, width, p.numel);
              else prefetch_elements(in, next + (i + kPrefetchRows - height) * cols, next_count, p.numel);
              const T* segment = in + (r0 + i) * cols + c0;
              uint8_t* staged_row = staged + (i - i0) * kPanel;
              uint8_t* out_row = p.out + (r0 + i) * cols + c0;
              float row_amax;
              if (stream_rows) {
                row_amax = quantize_into<V, kFormat, true, kReads>(segment, CodesToStagedAndStreamed{staged_row, out_row},
                                                                   0, width, scale);
              } else {
                row_amax = quantize_chunk<V, kFormat, false, T, true, kReads>(segment, staged_row, 0, width, scale);
                write_bytes(out_row, staged_row, width, stream);
              }
              amax = Scalar::magnitude_max(amax, Scalar::broadcast(row_amax));
            }
            transpose_bytes(staged, kPanel, staged_t + i0, kTile, strip_rows, width);
          }
          for (int64_t j = 0; j < width; ++j) write_bytes(p.out_t + (c0 + j) * rows + r0, staged_t + j * kTile, height, stream);
        }
      }
      partial[c] = amax.lane[0];
    }
    if (stream) fence_streaming_stores();
  });
  *p.amax = combine_amaxes(partial, chunks);
}

template <typename V, Fp8Format kFormat, typename T>
void dequantize(const Fp8DequantizeParams& p, const ThreadPool& pool) {
  T* out = static_cast<T*>(p.out);
  const float scale_inv = *p.scale_inv;
  const auto run = [&](auto stream, int64_t begin, int64_t end) {
    using Scalar = VecPortable<float, 1>;
    int64_t j = begin;
    for (; j + V::kWidth <= end; j += V::kWidth) {
      prefetch_ahead(p.in, j);
      put<decltype(stream)::value>(V::template load_fp8<kFormat>(p.in + j) * V::broadcast(scale_inv), out + j);
    }
    for (; j < end; ++j) (Scalar::template load_fp8<kFormat>(p.in + j) * Scalar::broadcast(scale_inv)).store(out + j);
    if constexpr (decltype(stream)::value) V::stream_fence();
  };
  const bool stream = use_streaming_stores<V, T>(out, p.numel, size_t(p.numel) * (sizeof(T) + 1));
  const int64_t blocks = (p.numel + kBlock - 1) / kBlock;
  pool.parallel_for(blocks, kMinElementsPerTask / kBlock, [&](int64_t block_begin, int64_t block_end) {
    const int64_t begin = block_begin * kBlock, end = std::min(p.numel, block_end * kBlock);
    if (stream) run(std::true_type{}, begin, end);
    else run(std::false_type{}, begin, end);
  });
}

// Runs Fn<Vec, format, T> for the params' FP8 format and high-precision dtype.
template <template <typename, Fp8Format, typename> class Fn, typename Params>
void dispatch_fp8(const Params& p, DType dtype, const ThreadPool& pool) {
  const auto with_format = [&](auto format) {
    constexpr Fp8Format kFormat = decltype(format)::value;
    switch (dtype) {
      case DType::kFloat32: return Fn<Vec, kFormat, float>::run(p, pool);
      case DType::kBFloat16: return Fn<Vec, kFormat, bf16_t>::run(p, pool);
      case DType::kFloat16: return Fn<Vec, kFormat, fp16_t>::run(p, pool);
      case DType::kFloat64: return;  // rejected by the API (fp8_cast.cpp)
    }
  };
  if (p.format == Fp8Format::kE4M3) with_format(std::integral_constant<Fp8Format, Fp8Format::kE4M3>{});
  else with_format(std::integral_constant<Fp8Format, Fp8Format::kE5M2>{});
}

template <typename V, Fp8Format kFormat, typename T>
struct Quantize {
  static void run(const Fp8QuantizeParams& p, const ThreadPool& pool) {
    if (p.out_t != nullptr) quantize_transpose<V, kFormat, T>(p, pool);
    else quantize<V, kFormat, T>(p, pool);
  }
};
template <typename V, Fp8Format kFormat, typename T>
struct Dequantize {
  static void run(const Fp8DequantizeParams& p, const ThreadPool& pool) { dequantize<V, kFormat, T>(p, pool); }
};

// Tiles of kTile x kPanel codes, each transposed through registers 16 x 16 at a time
// (byte_transpose.h), handed to threads a row of tiles per task.
void fp8_transpose(const Fp8TransposeParams& p, const ThreadPool& pool) {
  const int64_t row_tiles = (p.rows + kTile - 1) / kTile;
  pool.parallel_for(row_tiles, std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, kTile * p.cols)),
                    [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile * kTile, height = std::min(kTile, p.rows - r0);
      for (int64_t c0 = 0; c0 < p.cols; c0 += kPanel) {
        transpose_bytes(p.in + r0 * p.cols + c0, p.cols, p.out + c0 * p.rows + r0, p.rows, height,
                        std::min(kPanel, p.cols - c0));
      }
    }
  });
}

void fp8_quantize(const Fp8QuantizeParams& p, const ThreadPool& pool) { dispatch_fp8<Quantize>(p, p.in_dtype, pool); }
void fp8_dequantize(const Fp8DequantizeParams& p, const ThreadPool& pool) { dispatch_fp8<Dequantize>(p, p.out_dtype, pool); }

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE

// The block casts reuse dispatch_fp8 and the chunk helpers, so they are built in the same units.
#include "cpu/fp8/fp8_block_kernels.h"
