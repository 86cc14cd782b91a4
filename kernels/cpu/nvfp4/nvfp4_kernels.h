// NVFP4 amax, quantize and dequantize (te_kernels/nvfp4.h), written once over the tier's
// vector type Vec and Nvfp4Lanes<Vec> (nvfp4_lanes.h and its x86 specialisations); each tier's
// units compile it through their entry points: nvfp4_<tier>.cpp those of nvfp4_entries.h,
// nvfp4_four_over_six_<tier>.cpp 4over6's (nvfp4_four_over_six_entry.h).
//
// The source is cut into tasks of one strip of up to 16 rows by one panel of columns. Rows
// whose values are contiguous (col_stride 1) are read in place; otherwise (the transposed
// usage, or any other strides) the task first gathers its strip into a buffer in L1, so no
// transposed copy of the input is ever made: the transposed usage (row_stride 1) in 16 x 16
// tiles (Nvfp4Lanes::transpose_tile: YMM unpacks on the x86 tiers), each input row's 16
// values read once, with a thread's consecutive tasks on the same panel's input rows. With
// rht a gathered strip is transformed as it is gathered (the transposed usage's tiles down
// their columns before the transpose, transform_tile), so only rows read in place go through
// the transform when they are loaded. A strip is worked in groups of 16 vectors: Vec's kWidth
// blocks of 16 values of a row (the ragged end of a row through a zero-padded copy), in
// three steps over all of a row's groups (quantize_groups):
//   1. each block's amax, from the values loaded (through the transform when rht and read in
//      place, rounded to the input dtype) or, for bf16 without it, from their bits (16 x 16:
//      the largest of the strip's rows' block amaxes);
//   2. the scales and encode factors of kWidth blocks at once, in vector fp32 (group_scales);
//   3. the codes of x * encode: nearest or stochastic with the group's Philox words
//      (Nvfp4Lanes::put_codes, put_stochastic_codes).
// 4over6 replaces step 2: both candidate casts of a group's blocks are coded and their errors
// summed (four_over_six_scales), and each block keeps the chosen cast's scale and encode
// factor; step 3 then codes the values with those, as for any cast.
// A row-scaled cast (one amax per row, 1 x 16 blocks) casts a task's rows one by one, each
// with its own global scales (quantize_strip); nvfp4_amax's per-row form gives each task a
// strip's rows over all of their panels. The amax of the transposed usage needs no gather:
// without rht it is the input's, and with it the blocks are transformed down the input's
// columns (transposed_transform_amax).
// Dequantize walks rows in groups the same way: factor = scale * g * fp32(1 / (6 E)) for
// kWidth blocks at once, then each vector of code values times its block's factor, rounded once.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including nvfp4_kernels.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace nvfp4_detail {

using Lanes = Nvfp4Lanes<Vec>;
constexpr int kWidth = Vec::kWidth;
constexpr int kPerBlock = Lanes::kPerBlock;
constexpr int kVectors = Lanes::kVectors;
constexpr int64_t kGroup = int64_t(kVectors) * kWidth;  // values of a row per group: kWidth blocks
constexpr int64_t kStripRows = kNvfp4Block;
// Columns per task: a gathered strip's buffer ([16][256] values, 16 KiB in fp32) stays in L1;
// rows read in place need no buffer, and wide panels keep each row's reads sequential.
constexpr int64_t kGatheredPanel = 256;
constexpr int64_t kInPlacePanel = 4096;
static_assert(kGatheredPanel % kGroup == 0 && kInPlacePanel % kGroup == 0, "panels of whole groups");
// Blocks of a row in a panel: the per-block buffers of a row live on the stack.
constexpr int64_t kPanelBlocks = kInPlacePanel / kNvfp4Block;
// At most this many per-chunk amaxes, on the stack.
constexpr int64_t kMaxAmaxChunks = 256;

// The transform of a gathered strip's rows (Strips::strip), in place: each block of 16 values
// through Lanes::rht, rounded to T as the reference's transform returns it. cols: whole blocks.
template <typename T>
inline void transform_rows(T* first, int64_t stride, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; j += kNvfp4Block) {
      Vec block[kPerBlock];
      for (int k = 0; k < kPerBlock; ++k) block[k] = Vec::load(first + i * stride + j + k * kWidth);
      Lanes::rht(block);
      for (int k = 0; k < kPerBlock; ++k) block[k].store(first + i * stride + j + k * kWidth);
    }
  }
}

// The transform of 16 blocks laid down the columns of y (row r: value r of each block; N
// vectors per row), in place, before the rounding to the input dtype: the fp32 steps of
// rht16_lanes (signs, strides 1, 2, 4, 8: a + b to the lower row, a - b to the upper, times
// 1/4), each column's block at once. The sign products are exact, so no FMA contraction can
// change a sum.
template <int kStride, int N>
inline void butterflies(Vec (&y)[kNvfp4Block][N]) {
  // Fixed trip counts, so that the compiler unrolls every loop over the rows and y stays in registers.
  for (int q = 0; q < kNvfp4Block / 2; ++q) {
    const int r = q / kStride * 2 * kStride + q % kStride;
    for (int k = 0; k < N; ++k) {
      const Vec a = y[r][k], b = y[r + kStride][k];
      y[r][k] = a + b;
      y[r + kStride][k] = a - b;
    }
  }
}

template <int N>
inline void transform_columns(Vec (&y)[kNvfp4Block][N]) {
  for (int r = 0; r < kNvfp4Block; ++r) {
    for (int k = 0; k < N; ++k) y[r][k] = y[r][k] * Vec::broadcast(kRhtSigns[r]);
  }
  butterflies<1>(y);
  butterflies<2>(y);
  butterflies<4>(y);
  butterflies<8>(y);
  for (int r = 0; r < kNvfp4Block; ++r) {
    for (int k = 0; k < N; ++k) y[r][k] = y[r][k] * Vec::broadcast(0.25f);
  }
}

// The transposed usage with the transform: a 16 x 16 tile (Lanes::transpose_tile's) whose
// source row r holds value r of 16 blocks, one per column, transformed down its columns
// before the transpose, rounded to T on the way to the tile that is transposed.
template <typename T>
inline void transform_tile(const T* src, int64_t src_stride, T* dst, int64_t dst_stride) {
  Vec y[kNvfp4Block][kPerBlock];
  for (int r = 0; r < kNvfp4Block; ++r) {
    for (int k = 0; k < kPerBlock; ++k) y[r][k] = Vec::load(src + r * src_stride + k * kWidth);
  }
  transform_columns(y);
  alignas(64) T tile[kNvfp4Block * kNvfp4Block];
  for (int r = 0; r < kNvfp4Block; ++r) {
    for (int k = 0; k < kPerBlock; ++k) y[r][k].store(tile + r * kNvfp4Block + k * kWidth);
  }
  Lanes::transpose_tile(tile, kNvfp4Block, dst, dst_stride);
}

// Rows [r0, r0 + rows) x columns [c0, c0 + cols) of the source; row i's values at first + i * stride.
template <typename T>
struct Strip {
  const T* first;
  int64_t stride, r0, rows, c0, cols;
};

// The strips of a source, and how a task reaches its own.
template <typename T>
class Strips {
 public:
  explicit Strips(const Nvfp4Source& s)
      : s_(s), in_place_(s.col_stride == 1), panel_(in_place_ ? kInPlacePanel : kGatheredPanel),
        panels_((s.cols + panel_ - 1) / panel_), strips_((s.rows + kStripRows - 1) / kStripRows) {}

  // Whether a strip's values still need the transform (rht rows read in place): a gathered
  // strip is transformed as it is gathered.
  bool untransformed() const { return s_.rht && in_place_; }

  int64_t count() const { return s_.rows == 0 ? 0 : strips_ * panels_; }
  // Strips of 16 rows, and panels of each. Read in place, task t is strip t / panels(), panel
  // t % panels(): each row's reads stay sequential. Gathered, task t is panel t / row_strips(),
  // strip t % row_strips(): a thread's consecutive tasks gather the same source lines (the
  // transposed usage: the same 256 input rows, 16 columns further), so each line and page
  // is fetched once for all of its strips rather than once per strip.
  int64_t row_strips() const { return strips_; }
  int64_t panels() const { return panels_; }
  // The task of strip row_strip's panel.
  int64_t task(int64_t row_strip, int64_t panel) const {
    return in_place_ ? row_strip * panels_ + panel : panel * strips_ + row_strip;
  }
  // Tasks per parallel_for grain: at least kMinElementsPerTask values.
  int64_t grain() const {
    return std::max<int64_t>(1, kMinElementsPerTask / (kStripRows * std::max<int64_t>(1, std::min(panel_, s_.cols))));
  }

  // Task t's strip, gathered into `buffer` ([kStripRows][kGatheredPanel]) unless read in place,
  // and then, with rht, transformed.
  Strip<T> strip(int64_t t, T* buffer) const {
    const int64_t strip = in_place_ ? t / panels_ : t % strips_, panel = in_place_ ? t % panels_ : t / strips_;
    const int64_t r0 = strip * kStripRows, c0 = panel * panel_;
    const int64_t rows = std::min(kStripRows, s_.rows - r0), cols = std::min(panel_, s_.cols - c0);
    const T* first = static_cast<const T*>(s_.data) + r0 * s_.row_stride + c0 * s_.col_stride;
    if (in_place_) return {first, s_.row_stride, r0, rows, c0, cols};
    const int64_t rs = s_.row_stride, cs = s_.col_stride;
    // Along whichever stride is shorter in the inner loop: the transposed usage (row_stride
    // 1) reads each input row's 16 values of the strip at once.
    if (rs == 1 && rows == kStripRows) {
      // The transposed usage: 16 x 16 tiles (Lanes::transpose_tile; transform_tile with rht),
      // each input row's 16 values of the strip read once; a ragged last tile of columns
      // element by element. Each input row's next cache line, which a following strip of the
      // thread reads, is asked for as the tile is read: the strips' 256 input rows are too
      // many streams for the hardware prefetcher, so without this each line was a miss
      // waited for in turn.
      const int64_t tiled = cols / kStripRows * kStripRows;
      for (int64_t j = 0; j < tiled; j += kStripRows) {
        for (int64_t i = 0; i < kStripRows; ++i) {
          __builtin_prefetch(reinterpret_cast<const char*>(first + (j + i) * cs) + 64, 0, 2);
        }
        if (s_.rht) transform_tile(first + j * cs, cs, buffer + j, kGatheredPanel);
        else Lanes::transpose_tile(first + j * cs, cs, buffer + j, kGatheredPanel);
      }
      for (int64_t j = tiled; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) buffer[i * kGatheredPanel + j] = first[i + j * cs];
      }
      return {buffer, kGatheredPanel, r0, rows, c0, cols};  // with rht, cols are whole tiles
    }
    if (rs < cs) {
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) buffer[i * kGatheredPanel + j] = first[i * rs + j * cs];
      }
    } else {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) buffer[i * kGatheredPanel + j] = first[i * rs + j * cs];
      }
    }
    if (s_.rht) transform_rows(buffer, kGatheredPanel, rows, cols);
    return {buffer, kGatheredPanel, r0, rows, c0, cols};
  }

 private:
  const Nvfp4Source& s_;
  bool in_place_;
  int64_t panel_, panels_, strips_;
};

// A group of kGroup values at p into x, through the transform when rht: each block's fp32
// butterflies, then rounded to the input dtype T as the reference's transform returns it.
template <typename T, bool kRht>
inline void load_group(const T* p, Vec* x) {
  for (int k = 0; k < kVectors; ++k) x[k] = Vec::load(p + k * kWidth);
  if constexpr (kRht) {
    for (int k = 0; k < kVectors; k += kPerBlock) Lanes::rht(x + k);
    for (int k = 0; k < kVectors; ++k) x[k] = x[k].template rounded_as<T>();
  }
}

// The last cols (< kGroup) values of each row of a strip, zero-padded to a whole group:
// padded [kStripRows][kGroup].
template <typename T>
inline void pad_tails(const Strip<T>& s, int64_t from, T* padded) {
  for (int64_t i = 0; i < s.rows; ++i) {
    T* row = padded + i * kGroup;
    std::copy(s.first + i * s.stride + from, s.first + i * s.stride + s.cols, row);
    std::fill(row + (s.cols - from), row + kGroup, T{});
  }
}

// --- amax ---------------------------------------------------------------------------------

// `running` and the magnitudes of a group of values at p (through the transform when rht):
// lane by lane, NaN skipped.
template <typename T, bool kRht>
inline Vec group_magnitude_max(const T* p, Vec running) {
  Vec x[kVectors];
  load_group<T, kRht>(p, x);
  for (int k = 0; k < kVectors; ++k) running = Vec::magnitude_max(running, x[k]);
  return running;
}

template <typename T, bool kRht>
float strip_amax(const Strip<T>& s) {
  if constexpr (std::is_same_v<T, bf16_t> && !kRht) {
    float amax = 0.0f;
    for (int64_t i = 0; i < s.rows; ++i) amax = std::max(amax, bf16_amax(s.first + i * s.stride, s.cols));
    return amax;
  }
  const int64_t whole = s.cols / kGroup * kGroup;
  Vec running = Vec::zero();
  for (int64_t i = 0; i < s.rows; ++i) {
    for (int64_t j = 0; j < whole; j += kGroup) {
      running = group_magnitude_max<T, kRht>(s.first + i * s.stride + j, running);
    }
  }
  if (whole < s.cols) {
    alignas(64) T padded[kStripRows * kGroup];
    pad_tails(s, whole, padded);
    for (int64_t i = 0; i < s.rows; ++i) running = group_magnitude_max<T, kRht>(padded + i * kGroup, running);
  }
  return running.reduce_magnitude_max();
}

// Each row's max |x| in a strip, merged into row_amax[i] (the strip's other panels' maxima).
template <typename T, bool kRht>
void strip_row_amaxes(const Strip<T>& s, float* row_amax) {
  if constexpr (std::is_same_v<T, bf16_t> && !kRht) {
    for (int64_t i = 0; i < s.rows; ++i) row_amax[i] = std::max(row_amax[i], bf16_amax(s.first + i * s.stride, s.cols));
    return;
  }
  const int64_t whole = s.cols / kGroup * kGroup;
  alignas(64) T padded[kStripRows * kGroup];
  if (whole < s.cols) pad_tails(s, whole, padded);
  for (int64_t i = 0; i < s.rows; ++i) {
    Vec running = Vec::zero();
    for (int64_t j = 0; j < whole; j += kGroup) {
      running = group_magnitude_max<T, kRht>(s.first + i * s.stride + j, running);
    }
    if (whole < s.cols) running = group_magnitude_max<T, kRht>(padded + i * kGroup, running);
    row_amax[i] = std::max(row_amax[i], running.reduce_magnitude_max());
  }
}

// Each source row's amax (row-scaled NVFP4): a task per strip of 16 rows, over all of its panels
// in turn, so that no two tasks write one row's amax.
template <typename T>
void row_amaxes(const Nvfp4AmaxParams& p, const ThreadPool& pool) {
  const Nvfp4Source& s = p.source;
  std::fill_n(p.amax, s.rows, 0.0f);  // rows of no values
  const Strips<T> strips(s);
  const int64_t panels = strips.panels();
  const int64_t grain = std::max<int64_t>(1, kMinElementsPerTask / (kStripRows * std::max<int64_t>(1, s.cols)));
  pool.parallel_for(strips.row_strips(), grain, [&](int64_t begin, int64_t end) {
    alignas(64) T buffer[kStripRows * kGatheredPanel];
    for (int64_t row_strip = begin; row_strip < end; ++row_strip) {
      for (int64_t panel = 0; panel < panels; ++panel) {
        const Strip<T> strip = strips.strip(strips.task(row_strip, panel), buffer);
        if (strips.untransformed()) strip_row_amaxes<T, true>(strip, p.amax + strip.r0);
        else strip_row_amaxes<T, false>(strip, p.amax + strip.r0);
      }
    }
  });
}

// The largest of task(t) (>= 0) over tasks [0, tasks) of `elements` values in all: in up to
// kMaxAmaxChunks chunks of consecutive tasks across the pool, each chunk's maximum its own.
template <typename Task>
float max_over_tasks(const ThreadPool& pool, int64_t tasks, int64_t elements, const Task& task) {
  const int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>({pool.num_threads(), kMaxAmaxChunks, tasks, elements / kMinElementsPerTask}));
  float partial[kMaxAmaxChunks] = {};
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      float running = 0.0f;
      for (int64_t t = tasks * c / chunks; t < tasks * (c + 1) / chunks; ++t) running = std::max(running, task(t));
      partial[c] = running;
    }
  });
  return *std::max_element(partial, partial + chunks);
}

// The amax of the transposed usage's transform (row_stride 1), with no transpose: the source's
// columns 16 b .. 16 b + 15, one block along each source row, are 16 consecutive input rows
// (s.rows values each, at s.col_stride from one another), so kWidth source rows' blocks at a
// time are transformed down the columns of those rows' vectors (transform_columns) and their
// magnitudes kept (NaN skipped); the ragged end of the rows through a zero-padded copy (zero
// blocks transform to zero). The rounding to T is monotonic and odd, so the largest rounded
// magnitude is the largest magnitude rounded: once, at the end.
template <typename T>
float transposed_transform_amax(const Nvfp4Source& s, int64_t b) {
  const T* first = static_cast<const T*>(s.data) + b * kNvfp4Block * s.col_stride;
  const auto running_max = [](const T* p, int64_t stride, Vec running) {
    Vec y[kNvfp4Block][1];
    for (int r = 0; r < kNvfp4Block; ++r) y[r][0] = Vec::load(p + r * stride);
    transform_columns(y);
    for (int r = 0; r < kNvfp4Block; ++r) running = Vec::magnitude_max(running, y[r][0]);
    return running;
  };
  const int64_t whole = s.rows / kWidth * kWidth;
  Vec running = Vec::zero();
  for (int64_t i = 0; i < whole; i += kWidth) running = running_max(first + i, s.col_stride, running);
  if (whole < s.rows) {
    alignas(64) T padded[kNvfp4Block * kWidth] = {};
    for (int r = 0; r < kNvfp4Block; ++r) std::copy(first + r * s.col_stride + whole, first + r * s.col_stride + s.rows,
                                                    padded + r * kWidth);
    running = running_max(padded, kWidth, running);
  }
  return running.template rounded_as<T>().reduce_magnitude_max();
}

template <typename T>
void amax(const Nvfp4AmaxParams& p, const ThreadPool& pool) {
  if (p.per_row) return row_amaxes<T>(p, pool);
  Nvfp4Source s = p.source;
  if (s.col_stride != 1 && s.row_stride == 1) {
    if (s.rht) {
      *p.amax = max_over_tasks(pool, s.cols / kNvfp4Block, s.rows * s.cols,
                               [&](int64_t b) { return transposed_transform_amax<T>(s, b); });
      return;
    }
    // Without the transform the amax of the transpose is the input's: read its rows in place.
    std::swap(s.rows, s.cols);
    std::swap(s.row_stride, s.col_stride);
  }
  const Strips<T> strips(s);
  *p.amax = max_over_tasks(pool, strips.count(), s.rows * s.cols, [&](int64_t t) {
    alignas(64) T buffer[kStripRows * kGatheredPanel];
    const Strip<T> strip = strips.strip(t, buffer);
    return strips.untransformed() ? strip_amax<T, true>(strip) : strip_amax<T, false>(strip);
  });
}

// --- quantize -----------------------------------------------------------------------------

// Where a group's codes and scales go: row i's at codes + i * code_stride, scales + i * scale_stride.
struct GroupOut {
  uint8_t* codes;
  int64_t code_stride;
  uint8_t* scales;
  int64_t scale_stride;
};

// The global scales of each source row: the tensor's, or each row's own (row-scaled).
class GlobalScales {
 public:
  explicit GlobalScales(const Nvfp4QuantizeParams& p)
      : p_(p), tensor_(p.amax_per_row ? Nvfp4GlobalScale{} : nvfp4_global_scale(p.amax[0], p.e4m3_max)) {}

  const Nvfp4GlobalScale& tensor() const { return tensor_; }
  Nvfp4GlobalScale of_row(int64_t row) const {
    return p_.amax_per_row ? nvfp4_global_scale(p_.amax[row], p_.e4m3_max) : tensor_;
  }

 private:
  const Nvfp4QuantizeParams& p_;
  Nvfp4GlobalScale tensor_;
};

// The E4M3 scales e4m3(clamp(decode, -448, 448)) of kWidth blocks (bytes to `scales`) and the
// blocks' encode factors, in the scalar definitions' fp32 order (nvfp4_block_scale,
// nvfp4_block_encode). Nothing here is NaN (block amaxes skip NaN, and a NaN global amax
// takes put_nan_amax), so the bound at FLT_MAX is the clamp's: inf becomes +-448.
inline Vec clamped_scales(Vec decode, const Nvfp4GlobalScale& g, uint8_t* scales) {
  const Vec flt_max = Vec::broadcast(FLT_MAX), top = Vec::broadcast(kNvfp4ScaleMax);
  const Vec bottom = Vec::broadcast(-kNvfp4ScaleMax);
  decode = where_less(top, decode, top, decode);
  decode = where_less(decode, bottom, bottom, decode);
  decode.template store_fp8<Fp8Format::kE4M3>(scales);
  const Vec scale = Vec::template load_fp8<Fp8Format::kE4M3>(scales);
  const Vec encode = Vec::broadcast(1.0f) / (scale * Vec::broadcast(g.decode));
  return where_less(flt_max, encode, flt_max, encode);
}

// The kWidth blocks' scales of a group from their amaxes (block_amax * multiplier, clamped)
// and the blocks' encode factors.
inline Vec group_scales(Vec amax, const Nvfp4GlobalScale& g, uint8_t* scales) {
  return clamped_scales(amax * Vec::broadcast(g.multiplier), g, scales);
}

// The codes of one row's group x, each block times its encode factor.
template <bool kStochastic>
inline void put_codes(const Vec* x, const float* encode, const Nvfp4QuantizeParams& p, int64_t row, int64_t col,
                      uint8_t* out) {
  Vec v[kVectors];
  for (int k = 0; k < kVectors; ++k) v[k] = x[k] * Vec::broadcast(encode[k / kPerBlock]);
  if constexpr (kStochastic) {
    const Nvfp4Draws draws{p.seed, uint32_t(col / kNvfp4Block), uint32_t(row), uint32_t(p.offset),
                           uint32_t(p.offset >> 32)};
    Lanes::put_stochastic_codes(v, draws, out);
  }
  else Lanes::put_codes(v, out);
}

// The codes of `groups` groups of one row (its values at `values`), each block times its
// encode factor. Each group asks for the same columns of the source row `ahead` (the row the
// next amax step reads; nullptr for none) into L2: the amax step does little work per byte
// and the codes step much, so without this the two take turns, memory idle during the codes
// and the core waiting on it during the amaxes (a bf16 cast of rows beyond the caches: 30% of
// its time in the amax step's loads on Zen 3).
template <bool kStochastic, typename S, typename T>
inline void put_row_codes(const Nvfp4QuantizeParams& p, const S* values, const float* encode, int64_t groups,
                          int64_t row, int64_t col, uint8_t* codes, const T* ahead) {
  constexpr int64_t kGroupBytes = kGroup * int64_t(sizeof(T));
  Vec x[kVectors];
  for (int64_t j = 0; j < groups; ++j) {
    if (ahead != nullptr) {
      const char* next = reinterpret_cast<const char*>(ahead + j * kGroup);
      for (int64_t b = 0; b < kGroupBytes; b += 64) __builtin_prefetch(next + b, 0, 2);
    }
    if constexpr (std::is_same_v<S, bf16_t> && !kStochastic) {
      Lanes::put_bf16_codes(values + j * kGroup, encode + j * kWidth, codes + j * kGroup / 2);
    } else {
      load_group<S, false>(values + j * kGroup, x);
      put_codes<kStochastic>(x, encode + j * kWidth, p, row, col + j * kGroup, codes + j * kGroup / 2);
    }
  }
}

// --- 4over6 -------------------------------------------------------------------------------

// How a cast measures 4over6's errors (nvfp4_error_term).
struct ErrorRule {
  bool squared;       // kMse: d * d, else |d|
  bool scaled;        // d = value * scale - x * S_enc, else ((value * scale) * g) / (6 E) - x
  float six_e4m3_max;  // 6 E: 2688 or 1536, exact
};

inline ErrorRule error_rule(const Nvfp4QuantizeParams& p) {
  return {p.four_over_six == Nvfp4FourOverSix::kMse, p.scaled_error, kE2m1Max * p.e4m3_max};
}

// One of 4over6's two casts of a group's kWidth blocks: their E4M3 scales, those scales' fp32
// values and the blocks' encode factors.
struct Candidate {
  alignas(64) uint8_t scales[kWidth];
  alignas(64) float scale[kWidth];
  alignas(64) float encode[kWidth];
};

inline void make_candidate(Vec decode, const Nvfp4GlobalScale& g, Candidate& c) {
  clamped_scales(decode, g, c.scales).store(c.encode);
  Vec::template load_fp8<Fp8Format::kE4M3>(c.scales).store(c.scale);
}

// nvfp4_error_term of kWidth values x whose codes have the values `value`, in a block of scale
// `scale`. The products that a sum follows go through unfused: the reference rounds them.
inline Vec error_terms(Vec value, Vec scale, Vec x, const Nvfp4GlobalScale& g, const ErrorRule& rule) {
  const Vec d = rule.scaled ? unfused(value * scale) - unfused(x * Vec::broadcast(g.encode))
                            : ((value * scale) * Vec::broadcast(g.amax)) / Vec::broadcast(rule.six_e4m3_max) - x;
  if (rule.squared) return unfused(d * d);
  const Vec zero = Vec::zero();
  return where_less(d, zero, zero - d, d);  // |d|, NaN kept (a -0 adds as +0 would)
}

// The errors of one row's group x under a candidate, block b's to sums[b]: the codes of
// x * encode as the cast stores them, each value's error term, then each block's 16 terms
// added in their order, as the reference's loop adds them.
inline void row_errors(const Vec* x, const Candidate& c, const Nvfp4GlobalScale& g, const ErrorRule& rule,
                       float* sums) {
  Vec v[kVectors];
  for (int k = 0; k < kVectors; ++k) v[k] = x[k] * Vec::broadcast(c.encode[k / kPerBlock]);
  alignas(64) uint8_t codes[kGroup / 2];
  Lanes::put_codes(v, codes);
  alignas(64) float terms[kGroup];
  for (int k = 0; k < kVectors; ++k) {
    const Vec value = Lanes::values(codes + k * kWidth / 2);
    error_terms(value, Vec::broadcast(c.scale[k / kPerBlock]), x[k], g, rule).store(terms + k * kWidth);
  }
  for (int b = 0; b < kWidth; ++b) {
    float sum = 0.0f;
    for (int i = 0; i < kNvfp4Block; ++i) sum = sum + terms[b * kNvfp4Block + i];
    sums[b] = sum;
  }
}

// The errors of a group's kWidth blocks (1 x 16, tile_rows 1) or tiles (16 x 16, tile_rows
// 16) under both candidates, errors[candidate][block]: each of the `rows` rows (at first +
// i * stride, through the transform when kRht) summed per block, then a tile's row sums added
// as a tree (row r + row r + half, halving). The rows past `rows` of a ragged tile add 0: a
// zero row's error for every finite g; for g = inf every error is inf or NaN, so no tile picks
// map-to-4 either way.
template <typename S, bool kRht>
void candidate_errors(const Candidate (&candidates)[2], const Nvfp4GlobalScale& g, const ErrorRule& rule,
                      const S* first, int64_t stride, int64_t rows, int64_t tile_rows, float (&errors)[2][kWidth]) {
  alignas(64) float sums[2][kStripRows][kWidth];  // [candidate][row][block]
  Vec x[kVectors];
  for (int64_t i = 0; i < tile_rows; ++i) {
    if (i < rows) load_group<S, kRht>(first + i * stride, x);
    for (int c = 0; c < 2; ++c) {
      if (i < rows) row_errors(x, candidates[c], g, rule, sums[c][i]);
      else std::fill_n(sums[c][i], kWidth, 0.0f);
    }
  }
  for (int c = 0; c < 2; ++c) {
    for (int64_t half = tile_rows / 2; half > 0; half /= 2) {
      for (int64_t r = 0; r < half; ++r) (Vec::load(sums[c][r]) + Vec::load(sums[c][r + half])).store(sums[c][r]);
    }
    std::copy_n(sums[c][0], kWidth, errors[c]);
  }
}

// 4over6's scales (kWidth E4M3 bytes to `scales`) and encode factors of a group's blocks of
// amaxes `amax`: from base = (amax / 6) * S_enc (a true division), map-to-4's scale
// e4m3(clamp(base * 1.5)) and map-to-6's e4m3(clamp(base)); a block keeps map-to-4 only where
// its error is the smaller (a tie or a NaN keeps map-to-6). The blocks' values: see
// candidate_errors.
template <typename S, bool kRht>
Vec four_over_six_scales(Vec amax, const Nvfp4GlobalScale& g, const ErrorRule& rule, const S* first, int64_t stride,
                         int64_t rows, int64_t tile_rows, uint8_t* scales) {
  const Vec base = (amax / Vec::broadcast(kE2m1Max)) * Vec::broadcast(g.encode);
  Candidate candidates[2];  // map-to-4, map-to-6
  make_candidate(base * Vec::broadcast(1.5f), g, candidates[0]);
  make_candidate(base, g, candidates[1]);
  float errors[2][kWidth];
  candidate_errors<S, kRht>(candidates, g, rule, first, stride, rows, tile_rows, errors);
  alignas(64) float encode[kWidth];
  for (int b = 0; b < kWidth; ++b) {
    const Candidate& kept = errors[0][b] < errors[1][b] ? candidates[0] : candidates[1];
    scales[b] = kept.scales[b];
    encode[b] = kept.encode[b];
  }
  return Vec::load(encode);
}

// --- the cast -----------------------------------------------------------------------------

// Groups [0, groups) of a strip's rows (row i's values at first + i * stride), from source
// column col, in three steps per row (1 x 16) or per strip (16 x 16): every block's amax, then
// all their scales and encode factors, then the codes. Each step's work is independent from
// group to group, so the long chain from a block's amax to its encode factor (a division
// among it) overlaps with the other groups' instead of stalling every group in turn. The
// codes step reads the fp32 values the amax step loaded (and transformed) into a buffer in
// L1; or, for bf16 rows without the transform, whose block amaxes come from their bits
// (Nvfp4Lanes::raw_block_amaxes), the row itself again. 4over6's errors read the same values
// (a tile's rows again from the source, through the transform).
template <typename T, bool kRht, bool kStochastic, bool kFourOverSix>
void quantize_groups(const Nvfp4QuantizeParams& p, const Nvfp4GlobalScale& g, const T* first, int64_t stride,
                     int64_t row0, int64_t rows, int64_t col, int64_t groups, const GroupOut& out) {
  constexpr bool kRaw = std::is_same_v<T, bf16_t> && !kRht;
  const int64_t blocks = groups * kWidth;
  Vec x[kVectors];
  alignas(64) float amax[kPanelBlocks];
  alignas(64) float encode[kPanelBlocks];
  alignas(64) float values[kRaw ? 1 : kInPlacePanel];
  // Group j of row i into x and `values`.
  const auto load_values = [&](int64_t i, int64_t j) {
    load_group<T, kRht>(first + i * stride + j * kGroup, x);
    for (int k = 0; k < kVectors; ++k) x[k].store(values + j * kGroup + k * kWidth);
  };
  const auto block_amaxes = [&](int64_t i, int64_t j) {
    if constexpr (kRaw) return Lanes::raw_block_amaxes(first + i * stride + j * kGroup);
    load_values(i, j);
    return Lanes::block_amaxes(x);
  };
  // Row i's codes, asking for row `ahead`'s values as they go (put_row_codes; -1 for none).
  const auto put_codes_of_row = [&](int64_t i, int64_t ahead) {
    uint8_t* codes = out.codes + i * out.code_stride;
    const T* next = ahead >= 0 ? first + ahead * stride : nullptr;
    if constexpr (kRaw) put_row_codes<kStochastic>(p, first + i * stride, encode, groups, row0 + i, col, codes, next);
    else put_row_codes<kStochastic>(p, values, encode, groups, row0 + i, col, codes, next);
  };
  if (p.block_rows == 1) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < groups; ++j) block_amaxes(i, j).store(amax + j * kWidth);
      uint8_t* scales = out.scales + i * out.scale_stride;
      for (int64_t b = 0; b < blocks; b += kWidth) {
        Vec block_encode;
        if constexpr (!kFourOverSix) {
          block_encode = group_scales(Vec::load(amax + b), g, scales + b);
        } else if constexpr (kRaw) {  // the row's own values
          block_encode = four_over_six_scales<T, false>(Vec::load(amax + b), g, error_rule(p),
                                                        first + i * stride + b * kNvfp4Block, 0, 1, 1, scales + b);
        } else {  // the values loaded (and transformed)
          block_encode = four_over_six_scales<float, false>(Vec::load(amax + b), g, error_rule(p),
                                                            values + b * kNvfp4Block, 0, 1, 1, scales + b);
        }
        block_encode.store(encode + b);
      }
      put_codes_of_row(i, i + 1 < rows ? i + 1 : -1);
    }
    return;
  }
  // 16 x 16 tiles: a tile's amax is the largest of its rows' block amaxes; its scale is
  // stored on each of its rows. Their values are loaded again for the codes, the last row's
  // first (they are still in the buffer).
  std::fill_n(amax, blocks, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < groups; ++j) {
      Vec::magnitude_max(Vec::load(amax + j * kWidth), block_amaxes(i, j)).store(amax + j * kWidth);
    }
  }
  alignas(64) uint8_t scales[kPanelBlocks];
  for (int64_t b = 0; b < blocks; b += kWidth) {
    if constexpr (kFourOverSix) {
      four_over_six_scales<T, kRht>(Vec::load(amax + b), g, error_rule(p), first + b * kNvfp4Block, stride, rows,
                                    kStripRows, scales + b)
          .store(encode + b);
    } else {
      group_scales(Vec::load(amax + b), g, scales + b).store(encode + b);
    }
  }
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t i = n == 0 ? rows - 1 : n - 1;
    if (!kRaw && n > 0) {
      for (int64_t j = 0; j < groups; ++j) load_values(i, j);
    }
    std::copy_n(scales, blocks, out.scales + i * out.scale_stride);
    put_codes_of_row(i, -1);  // the tile's rows were all read for its amax
  }
}

// A strip (one panel of up to 16 rows) cast with the global scales g.
template <typename T, bool kRht, bool kStochastic, bool kFourOverSix>
void quantize_panel(const Nvfp4QuantizeParams& p, const Nvfp4GlobalScale& g, const Strip<T>& s) {
  const int64_t code_stride = (p.source.cols + 1) / 2, scale_stride = (p.source.cols + kNvfp4Block - 1) / kNvfp4Block;
  uint8_t* codes = p.data + s.r0 * code_stride + s.c0 / 2;
  uint8_t* scales = p.scales + s.r0 * scale_stride + s.c0 / kNvfp4Block;
  const int64_t whole = s.cols / kGroup * kGroup;
  quantize_groups<T, kRht, kStochastic, kFourOverSix>(p, g, s.first, s.stride, s.r0, s.rows, s.c0, whole / kGroup,
                                                      {codes, code_stride, scales, scale_stride});
  if (whole == s.cols) return;
  // The ragged end: a zero-padded group, its codes and scales through buffers.
  alignas(64) T padded[kStripRows * kGroup];
  alignas(64) uint8_t tail_codes[kStripRows * kGroup / 2];
  alignas(64) uint8_t tail_scales[kStripRows * kWidth];
  pad_tails(s, whole, padded);
  quantize_groups<T, kRht, kStochastic, kFourOverSix>(p, g, padded, kGroup, s.r0, s.rows, s.c0 + whole, 1,
                                                      {tail_codes, kGroup / 2, tail_scales, kWidth});
  const int64_t tail = s.cols - whole;
  for (int64_t i = 0; i < s.rows; ++i) {
    std::copy_n(tail_codes + i * kGroup / 2, (tail + 1) / 2, codes + i * code_stride + whole / 2);
    std::copy_n(tail_scales + i * kWidth, (tail + kNvfp4Block - 1) / kNvfp4Block,
                scales + i * scale_stride + whole / kNvfp4Block);
  }
}

// A NaN global amax makes every block's scale NaN (block_amax * NaN, with the amax's sign)
// and every code 0 (x * NaN is NaN, code 0, rounded either way): for source rows [r0, r0 +
// rows), columns [c0, c0 + cols) (c0 a multiple of 16).
inline void put_nan_amax(const Nvfp4QuantizeParams& p, const Nvfp4GlobalScale& g, int64_t r0, int64_t rows,
                         int64_t c0, int64_t cols) {
  const int64_t code_stride = (p.source.cols + 1) / 2, scale_stride = (p.source.cols + kNvfp4Block - 1) / kNvfp4Block;
  for (int64_t r = r0; r < r0 + rows; ++r) {
    std::fill_n(p.data + r * code_stride + c0 / 2, (cols + 1) / 2, uint8_t(0));
    std::fill_n(p.scales + r * scale_stride + c0 / kNvfp4Block, (cols + kNvfp4Block - 1) / kNvfp4Block,
                to_fp8(g.multiplier, Fp8Format::kE4M3));
  }
}

// A strip with the tensor's global scales, or, row-scaled, each row with its own.
template <typename T, bool kRht, bool kStochastic, bool kFourOverSix>
void quantize_strip(const Nvfp4QuantizeParams& p, const GlobalScales& globals, const Strip<T>& s) {
  if (!p.amax_per_row) return quantize_panel<T, kRht, kStochastic, kFourOverSix>(p, globals.tensor(), s);
  for (int64_t i = 0; i < s.rows; ++i) {
    const Nvfp4GlobalScale g = globals.of_row(s.r0 + i);
    if (std::isnan(g.multiplier)) {
      put_nan_amax(p, g, s.r0 + i, 1, s.c0, s.cols);
    } else {
      const Strip<T> row{s.first + i * s.stride, s.stride, s.r0 + i, 1, s.c0, s.cols};
      quantize_panel<T, kRht, kStochastic, kFourOverSix>(p, g, row);
    }
  }
}

template <typename T, bool kRht, bool kStochastic, bool kFourOverSix>
void quantize(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
  const GlobalScales globals(p);
  if (!p.amax_per_row && std::isnan(globals.tensor().multiplier)) {
    return put_nan_amax(p, globals.tensor(), 0, p.source.rows, 0, p.source.cols);
  }
  const Strips<T> strips(p.source);
  // A gathered strip comes transformed (Strips::strip): its values are cast as they are.
  const auto cast = [&](const Strip<T>& strip) {
    if constexpr (kRht) {
      if (strips.untransformed()) return quantize_strip<T, true, kStochastic, kFourOverSix>(p, globals, strip);
    }
    quantize_strip<T, false, kStochastic, kFourOverSix>(p, globals, strip);
  };
  pool.parallel_for(strips.count(), strips.grain(), [&](int64_t begin, int64_t end) {
    alignas(64) T buffer[kStripRows * kGatheredPanel];
    for (int64_t t = begin; t < end; ++t) cast(strips.strip(t, buffer));
  });
}

// --- dequantize ---------------------------------------------------------------------------

// kGroup values of a row from their codes (kGroup / 2 bytes) and kWidth scales.
template <typename T>
inline void dequantize_group(const uint8_t* codes, const uint8_t* scales, float amax, float inverse_range, T* out) {
  alignas(64) float factor[kWidth];
  (Vec::template load_fp8<Fp8Format::kE4M3>(scales) * Vec::broadcast(amax) * Vec::broadcast(inverse_range))
      .store(factor);
  for (int k = 0; k < kVectors; ++k) {
    (Lanes::values(codes + k * kWidth / 2) * Vec::broadcast(factor[k / kPerBlock])).store(out + k * kWidth);
  }
}

template <typename T>
void dequantize(const Nvfp4DequantizeParams& p, const ThreadPool& pool) {
  const int64_t cols = p.cols, code_stride = (cols + 1) / 2, scale_stride = (cols + kNvfp4Block - 1) / kNvfp4Block;
  const int64_t whole = cols / kGroup * kGroup, tail = cols - whole;
  const float inverse_range = 1.0f / (kE2m1Max * p.e4m3_max);  // fp32(1 / (6 E))
  if (cols == 0) return;
  pool.parallel_for(p.rows, std::max<int64_t>(1, kMinElementsPerTask / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float amax = p.amax[p.amax_per_row ? r : 0];
      const uint8_t* codes = p.data + r * code_stride;
      const uint8_t* scales = p.scales + r * scale_stride;
      T* out = static_cast<T*>(p.out) + r * cols;
      for (int64_t j = 0; j < whole; j += kGroup) {
        dequantize_group<T>(codes + j / 2, scales + j / kNvfp4Block, amax, inverse_range, out + j);
      }
      if (tail == 0) continue;
      // The ragged end through zero-padded copies.
      alignas(64) uint8_t tail_codes[kGroup / 2] = {};
      alignas(64) uint8_t tail_scales[kWidth] = {};
      alignas(64) T values[kGroup];
      std::copy_n(codes + whole / 2, (tail + 1) / 2, tail_codes);
      std::copy_n(scales + whole / kNvfp4Block, (tail + kNvfp4Block - 1) / kNvfp4Block, tail_scales);
      dequantize_group<T>(tail_codes, tail_scales, amax, inverse_range, values);
      std::copy_n(values, tail, out + whole);
    }
  });
}

// Runs Op<T>::run for the dtype.
template <template <typename> class Op, typename Params>
void dispatch(DType dtype, const Params& p, const ThreadPool& pool) {
  switch (dtype) {
    case DType::kFloat32: return Op<float>::run(p, pool);
    case DType::kBFloat16: return Op<bf16_t>::run(p, pool);
    case DType::kFloat16: return Op<fp16_t>::run(p, pool);
    case DType::kFloat64: return;  // refused by the API (nvfp4.cpp)
  }
}

}  // namespace nvfp4_detail
}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
