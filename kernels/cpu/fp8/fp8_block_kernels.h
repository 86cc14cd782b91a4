// Block-scaled FP8 quantize and dequantize, written once over the tier's vector type Vec.
//
// The matrix is cut into tasks of one block row (block_rows rows) by one panel of columns
// (a whole number of blocks, at most kPanelColumns wide). A task runs in three steps, all
// within L1/L2:
//   1. the column-wise max |x| over the block row, vector by vector, into col_amax;
//   2. each block's amax from its columns of col_amax, then its scale (block_scale, the
//      scalar definition), spread into col_scale, one entry per column;
//   3. every row again: codes = saturate(x * col_scale), vector by vector.
// The same code serves square blocks and column blocks (128 x 1: step 2 is one scale per
// column); row blocks (1 x 128, 1 x 32) take a shorter path, row_block_quantize.
// Dequantize mirrors the tasks with col_scale holding each column's scale_inv.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including fp8_block_kernels.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// Widest panel of columns one task covers (whole blocks): its per-column buffers live on the stack.
constexpr int64_t kPanelColumns = kMaxBlockCols;

template <typename V>
inline void fill_floats(float* dst, int64_t count, float value) {
  int64_t j = 0;
  for (; j + V::kWidth <= count; j += V::kWidth) V::broadcast(value).store(dst + j);
  for (; j < count; ++j) dst[j] = value;
}

// max |x| over count elements, NaN kept.
template <typename V, typename T>
inline float span_amax(const T* x, int64_t count) {
  using Scalar = VecPortable<float, 1>;
  V running = V::zero();
  int64_t j = 0;
  for (; j + V::kWidth <= count; j += V::kWidth) running = V::magnitude_max(running, V::load(x + j));
  Scalar amax = Scalar::broadcast(running.reduce_magnitude_max());
  for (; j < count; ++j) amax = Scalar::magnitude_max(amax, Scalar::load(x + j));
  return amax.lane[0];
}

// Stores one block's scale_inv (float, or its E8M0 exponent).
inline void put_scale_inv(const Fp8BlockQuantizeParams& p, int64_t slot, const BlockScale& s) {
  if (p.mode == BlockScaleMode::kE8M0) static_cast<uint8_t*>(p.scale_inv)[slot] = s.e8m0;
  else static_cast<float*>(p.scale_inv)[slot] = s.scale_inv;
}

// Row blocks narrower than a group of FP8 stores (1 x 32 on AVX-512: two blocks per 64-byte
// store), kPerBlock vectors each: a group's vectors are loaded once, each block's amax and
// scale taken from its own vectors in registers, and the group stored whole. Covers the
// row's whole groups; returns where the rest begins.
template <typename V, Fp8Format kFormat, bool kStream, int kPerBlock, typename T>
int64_t narrow_row_blocks(const Fp8BlockQuantizeParams& p, const T* row, uint8_t* codes, int64_t first_slot,
                          float max_code) {
  constexpr int64_t kGroup = V::kFp8Group * V::kWidth;
  static_assert(V::kFp8Group % kPerBlock == 0 && kPerBlock < V::kFp8Group, "whole blocks per group");
  int64_t j = 0;
  for (; j + kGroup <= p.cols; j += kGroup) {
    V x[V::kFp8Group];
    for (int g = 0; g < V::kFp8Group; ++g) {
      prefetch_ahead(row, j + g * V::kWidth);
      x[g] = V::load(row + j + g * V::kWidth);
    }
    for (int g0 = 0; g0 < V::kFp8Group; g0 += kPerBlock) {
      V running = V::zero();
      for (int g = g0; g < g0 + kPerBlock; ++g) running = V::magnitude_max(running, x[g]);
      const BlockScale s = block_scale(running.reduce_magnitude_max(), max_code, p.mode, p.amax_epsilon);
      put_scale_inv(p, first_slot + (j + g0 * V::kWidth) / p.block_cols, s);
      for (int g = g0; g < g0 + kPerBlock; ++g) x[g] = x[g] * V::broadcast(s.scale);
    }
    put_fp8_group<V, kFormat, kStream>(x, codes + j);
  }
  return j;
}

// Row blocks (1 x block_cols): each block's amax and codes come straight from its input
// row, two passes over a block that stays in L1, with no per-column buffers; narrow blocks
// by narrow_row_blocks. Large outputs are streamed when every group store is aligned: rows
// of whole groups, and blocks that are whole groups or narrow ones.
template <typename V, Fp8Format kFormat, typename T>
void row_block_quantize(const Fp8BlockQuantizeParams& p, const ThreadPool& pool) {
  constexpr int64_t kGroup = V::kFp8Group * V::kWidth;
  const T* in = static_cast<const T*>(p.in);
  const int64_t cols = p.cols, bc = p.block_cols;
  const int64_t grid_cols = (cols + bc - 1) / bc;
  const float max_code = fp8_max(kFormat);
  if (p.rows == 0 || cols == 0) return;
  const int64_t per_block = bc % V::kWidth == 0 && bc < kGroup && kGroup % bc == 0 ? bc / V::kWidth : 0;
  const bool stream = worth_streaming(size_t(p.rows * cols), size_t(p.rows * cols) * (sizeof(T) + 1)) &&
                      reinterpret_cast<uintptr_t>(p.out) % kGroup == 0 &&
                      cols % kGroup == 0 && (bc % kGroup == 0 || per_block != 0);
  const auto run_rows = [&](auto streamed, int64_t r0, int64_t r1) {
    constexpr bool kStream = decltype(streamed)::value;
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = in + r * cols;
      uint8_t* codes = p.out + r * cols;
      int64_t b = 0;
      if constexpr (V::kFp8Group == 4) {  // per_block is 1 or 2 there, 0 for wider blocks
        if (per_block == 1) b = narrow_row_blocks<V, kFormat, kStream, 1>(p, row, codes, r * grid_cols, max_code);
        if (per_block == 2) b = narrow_row_blocks<V, kFormat, kStream, 2>(p, row, codes, r * grid_cols, max_code);
      }
      for (; b < cols; b += bc) {
        const int64_t end = std::min(cols, b + bc);
        const BlockScale s = block_scale(span_amax<V>(row + b, end - b), max_code, p.mode, p.amax_epsilon);
        put_scale_inv(p, r * grid_cols + b / bc, s);
        quantize_chunk<V, kFormat, kStream, T, /*kAmax=*/false>(row, codes, b, end, s.scale);
      }
    }
    if constexpr (kStream) V::stream_fence();
  };
  pool.parallel_for(p.rows, std::max<int64_t>(1, kMinElementsPerTask / cols), [&](int64_t r0, int64_t r1) {
    if (stream) run_rows(std::true_type{}, r0, r1);
    else run_rows(std::false_type{}, r0, r1);
  });
}

// One task's rectangle: rows [r0, r1) of block row `grid_row`, columns [c0, c1).
struct BlockTask {
  int64_t grid_row, r0, r1, c0, c1;
};

// Calls fn(task) for every block row x panel, in parallel tasks of at least
// kMinElementsPerTask elements.
template <typename Fn>
void for_each_block_task(int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols, const ThreadPool& pool,
                         const Fn& fn) {
  if (rows == 0 || cols == 0) return;
  const int64_t panel = kPanelColumns / block_cols * block_cols;
  const int64_t panels = (cols + panel - 1) / panel;
  const int64_t grid_rows = (rows + block_rows - 1) / block_rows;
  const int64_t grain = std::max<int64_t>(1, kMinElementsPerTask / (block_rows * panel));
  pool.parallel_for(grid_rows * panels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t grid_row = t / panels, c0 = t % panels * panel;
      const int64_t r0 = grid_row * block_rows;
      fn(BlockTask{grid_row, r0, std::min(rows, r0 + block_rows), c0, std::min(cols, c0 + panel)});
    }
  });
}

template <typename V, Fp8Format kFormat, typename T>
void block_quantize(const Fp8BlockQuantizeParams& p, const ThreadPool& pool) {
  using Scalar = VecPortable<float, 1>;
  const T* in = static_cast<const T*>(p.in);
  const int64_t cols = p.cols, bc = p.block_cols;
  const int64_t grid_cols = (cols + bc - 1) / bc;
  const float max_code = fp8_max(kFormat);
  for_each_block_task(p.rows, cols, p.block_rows, bc, pool, [&](const BlockTask& task) {
    alignas(64) float col_amax[kPanelColumns];
    alignas(64) float col_scale[kPanelColumns];
    const int64_t width = task.c1 - task.c0;
    fill_floats<V>(col_amax, width, 0.0f);
    for (int64_t r = task.r0; r < task.r1; ++r) {
      const T* row = in + r * cols + task.c0;
      int64_t j = 0;
      for (; j + V::kWidth <= width; j += V::kWidth) V::magnitude_max(V::load(col_amax + j), V::load(row + j)).store(col_amax + j);
      for (; j < width; ++j) {
        Scalar::magnitude_max(Scalar::broadcast(col_amax[j]), Scalar::load(row + j)).store(col_amax + j);
      }
    }
    for (int64_t b = 0; b < width; b += bc) {
      const int64_t count = std::min(bc, width - b);
      const BlockScale s = block_scale(span_amax<V>(col_amax + b, count), max_code, p.mode, p.amax_epsilon);
      put_scale_inv(p, task.grid_row * grid_cols + (task.c0 + b) / bc, s);
      fill_floats<V>(col_scale + b, count, s.scale);
    }
    for (int64_t r = task.r0; r < task.r1; ++r) {
      const T* row = in + r * cols + task.c0;
      uint8_t* codes = p.out + r * cols + task.c0;
      int64_t j = 0;
      for (; j + V::kFp8Group * V::kWidth <= width; j += V::kFp8Group * V::kWidth) {
        V scaled[V::kFp8Group];
        for (int g = 0; g < V::kFp8Group; ++g) scaled[g] = V::load(row + j + g * V::kWidth) * V::load(col_scale + j + g * V::kWidth);
        put_fp8_group<V, kFormat, false>(scaled, codes + j);
      }
      for (; j + V::kWidth <= width; j += V::kWidth) (V::load(row + j) * V::load(col_scale + j)).template store_fp8<kFormat>(codes + j);
      for (; j < width; ++j) (Scalar::load(row + j) * Scalar::broadcast(col_scale[j])).template store_fp8<kFormat>(codes + j);
    }
  });
}

template <typename V, Fp8Format kFormat, typename T>
void block_dequantize(const Fp8BlockDequantizeParams& p, const ThreadPool& pool) {
  using Scalar = VecPortable<float, 1>;
  T* out = static_cast<T*>(p.out);
  const int64_t cols = p.cols, bc = p.block_cols;
  const int64_t grid_cols = (cols + bc - 1) / bc;
  for_each_block_task(p.rows, cols, p.block_rows, bc, pool, [&](const BlockTask& task) {
    alignas(64) float col_scale_inv[kPanelColumns];
    const int64_t width = task.c1 - task.c0;
    for (int64_t b = 0; b < width; b += bc) {
      const int64_t slot = task.grid_row * grid_cols + (task.c0 + b) / bc;
      const float scale_inv = p.e8m0_scales ? e8m0_to_float(static_cast<const uint8_t*>(p.scale_inv)[slot])
                                            : static_cast<const float*>(p.scale_inv)[slot];
      fill_floats<V>(col_scale_inv + b, std::min(bc, width - b), scale_inv);
    }
    for (int64_t r = task.r0; r < task.r1; ++r) {
      const uint8_t* codes = p.in + r * cols + task.c0;
      T* row = out + r * cols + task.c0;
      int64_t j = 0;
      for (; j + V::kWidth <= width; j += V::kWidth) (V::template load_fp8<kFormat>(codes + j) * V::load(col_scale_inv + j)).store(row + j);
      for (; j < width; ++j) (Scalar::template load_fp8<kFormat>(codes + j) * Scalar::broadcast(col_scale_inv[j])).store(row + j);
    }
  });
}

template <typename V, Fp8Format kFormat, typename T>
struct BlockQuantize {
  static void run(const Fp8BlockQuantizeParams& p, const ThreadPool& pool) {
    if (p.block_rows == 1) row_block_quantize<V, kFormat, T>(p, pool);
    else block_quantize<V, kFormat, T>(p, pool);
  }
};
template <typename V, Fp8Format kFormat, typename T>
struct BlockDequantize {
  static void run(const Fp8BlockDequantizeParams& p, const ThreadPool& pool) { block_dequantize<V, kFormat, T>(p, pool); }
};

void fp8_block_quantize(const Fp8BlockQuantizeParams& p, const ThreadPool& pool) {
  dispatch_fp8<BlockQuantize>(p, p.in_dtype, pool);
}
void fp8_block_dequantize(const Fp8BlockDequantizeParams& p, const ThreadPool& pool) {
  dispatch_fp8<BlockDequantize>(p, p.out_dtype, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
