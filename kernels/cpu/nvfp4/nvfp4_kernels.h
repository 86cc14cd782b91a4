// NVFP4 amax, quantize and dequantize (te_kernels/nvfp4.h), written once over the tier's
// vector type Vec and Nvfp4Lanes<Vec> (nvfp4_lanes.h and its x86 specialisations); each
// nvfp4_<tier>.cpp compiles it for its tier.
//
// The source is cut into tasks of one strip of up to 16 rows by one panel of columns. Rows
// whose values are contiguous (col_stride 1) are read in place; otherwise (the transposed
// usage, or any other strides) the task first gathers its strip into a buffer in L1, so no
// transposed copy of the input is ever made. A strip is worked in groups of 16 vectors: Vec's
// kWidth blocks of 16 values of a row (the ragged end of a row through a zero-padded copy),
// in three steps over all of a row's groups (quantize_groups):
//   1. each block's amax, from the values loaded (through the transform when rht, rounded to
//      the input dtype) or, for bf16 without it, from their bits (16 x 16: the largest of the
//      strip's rows' block amaxes);
//   2. the scales and encode factors of kWidth blocks at once, in vector fp32 (group_scales);
//   3. the codes of x * encode: nearest (Nvfp4Lanes), or stochastic with the group's Philox
//      words (philox_lanes over the tier's vector of counters).
// Dequantize walks rows in groups the same way: factor = scale * g * fp32(1 / 2688) for kWidth
// blocks at once, then each vector of code values times its block's factor, rounded once.
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

  int64_t count() const { return s_.rows == 0 ? 0 : strips_ * panels_; }
  // Tasks per parallel_for grain: at least kMinElementsPerTask values.
  int64_t grain() const {
    return std::max<int64_t>(1, kMinElementsPerTask / (kStripRows * std::max<int64_t>(1, std::min(panel_, s_.cols))));
  }

  // Task t's strip, gathered into `buffer` ([kStripRows][kGatheredPanel]) unless read in place.
  Strip<T> strip(int64_t t, T* buffer) const {
    const int64_t r0 = t / panels_ * kStripRows, c0 = t % panels_ * panel_;
    const int64_t rows = std::min(kStripRows, s_.rows - r0), cols = std::min(panel_, s_.cols - c0);
    const T* first = static_cast<const T*>(s_.data) + r0 * s_.row_stride + c0 * s_.col_stride;
    if (in_place_) return {first, s_.row_stride, r0, rows, c0, cols};
    const int64_t rs = s_.row_stride, cs = s_.col_stride;
    // Along whichever stride is shorter in the inner loop: the transposed usage (row_stride
    // 1) reads each input row's 16 values of the strip at once.
    if (rs < cs) {
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) buffer[i * kGatheredPanel + j] = first[i * rs + j * cs];
      }
    } else {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) buffer[i * kGatheredPanel + j] = first[i * rs + j * cs];
      }
    }
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

template <typename T, bool kRht>
float strip_amax(const Strip<T>& s) {
  if constexpr (std::is_same_v<T, bf16_t> && !kRht) {
    float amax = 0.0f;
    for (int64_t i = 0; i < s.rows; ++i) amax = std::max(amax, bf16_amax(s.first + i * s.stride, s.cols));
    return amax;
  }
  const int64_t whole = s.cols / kGroup * kGroup;
  Vec x[kVectors];
  Vec running = Vec::zero();
  const auto take = [&](const T* p) {
    load_group<T, kRht>(p, x);
    for (int k = 0; k < kVectors; ++k) running = Vec::magnitude_max(running, x[k]);
  };
  for (int64_t i = 0; i < s.rows; ++i) {
    for (int64_t j = 0; j < whole; j += kGroup) take(s.first + i * s.stride + j);
  }
  if (whole < s.cols) {
    alignas(64) T padded[kStripRows * kGroup];
    pad_tails(s, whole, padded);
    for (int64_t i = 0; i < s.rows; ++i) take(padded + i * kGroup);
  }
  return running.reduce_magnitude_max();
}

template <typename T>
void amax(const Nvfp4AmaxParams& p, const ThreadPool& pool) {
  Nvfp4Source s = p.source;
  if (!s.rht && s.col_stride != 1 && s.row_stride == 1) {
    // Without the transform the amax of the transpose is the input's: read its rows in place.
    std::swap(s.rows, s.cols);
    std::swap(s.row_stride, s.col_stride);
  }
  const Strips<T> strips(s);
  const int64_t tasks = strips.count();
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({pool.num_threads(), kMaxAmaxChunks, tasks,
                                                                 s.rows * s.cols / kMinElementsPerTask}));
  float partial[kMaxAmaxChunks] = {};
  pool.parallel_for(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    alignas(64) T buffer[kStripRows * kGatheredPanel];
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      float running = 0.0f;
      for (int64_t t = tasks * c / chunks; t < tasks * (c + 1) / chunks; ++t) {
        const Strip<T> strip = strips.strip(t, buffer);
        running = std::max(running, s.rht ? strip_amax<T, true>(strip) : strip_amax<T, false>(strip));
      }
      partial[c] = running;
    }
  });
  *p.amax = *std::max_element(partial, partial + chunks);
}

// --- quantize -----------------------------------------------------------------------------

// Where a group's codes and scales go: row i's at codes + i * code_stride, scales + i * scale_stride.
struct GroupOut {
  uint8_t* codes;
  int64_t code_stride;
  uint8_t* scales;
  int64_t scale_stride;
};

// The kWidth blocks' scales of a group from their amaxes (kWidth E4M3 bytes to `scales`) and
// the blocks' encode factors, in the scalar definitions' fp32 order (nvfp4_block_scale,
// nvfp4_block_encode). Nothing here is NaN (block amaxes skip NaN, and a NaN global amax
// takes quantize_nan_amax), so the bound at FLT_MAX is the clamp's: inf becomes +-448.
inline Vec group_scales(Vec amax, const Nvfp4GlobalScale& g, uint8_t* scales) {
  const Vec flt_max = Vec::broadcast(FLT_MAX), top = Vec::broadcast(kNvfp4ScaleMax);
  const Vec bottom = Vec::broadcast(-kNvfp4ScaleMax);
  Vec decode = amax * Vec::broadcast(g.multiplier);
  decode = where_less(top, decode, top, decode);
  decode = where_less(decode, bottom, bottom, decode);
  decode.template store_fp8<Fp8Format::kE4M3>(scales);
  const Vec scale = Vec::template load_fp8<Fp8Format::kE4M3>(scales);
  const Vec encode = Vec::broadcast(1.0f) / (scale * Vec::broadcast(g.decode));
  return where_less(flt_max, encode, flt_max, encode);
}

// e2m1_code_stochastic of the lanes of v, with the uniform draws u (top 24 bits over 2^24),
// as float codes, in the same fp32 steps on the tier's vectors: hi - lo is the step 0.5, 1, 2
// below 2, below 4, from 4 on (where_less for the branches).
inline Vec stochastic_codes(Vec v, Vec u) {
  const Vec zero = Vec::zero(), half = Vec::broadcast(0.5f), one = Vec::broadcast(1.0f);
  const Vec two = Vec::broadcast(2.0f), four = Vec::broadcast(4.0f), six = Vec::broadcast(kE2m1Max);
  Vec m = Vec::magnitude_max(zero, v);  // |v|, NaN 0
  m = where_less(six, m, six, m);
  const Vec step = where_less(m, two, half, where_less(m, four, one, two));
  // lo: the grid point at or below m (4 for 6); its code 2 lo below 2, lo + 2 below 4, lo / 2 + 4.
  Vec lo = zero;
  for (const float point : {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f}) {
    lo = where_less(m, Vec::broadcast(point), lo, Vec::broadcast(point));
  }
  const Vec lo_code = where_less(lo, two, lo * two, where_less(lo, four, lo + two, lo * half + four));
  const Vec up = where_less(u, (m - lo) / step, one, zero);
  return lo_code + up + where_less(v, zero, Vec::broadcast(8.0f), zero);
}

// Stochastic codes of a group's values v = x * encode at source (row, col): the Philox words
// of counters col / 4 .. col / 4 + 4 kWidth - 1, kWidth per philox_lanes call; value col + e
// takes word e % 4 of counter col / 4 + e / 4.
inline void put_stochastic_codes(const Vec* v, const Nvfp4QuantizeParams& p, int64_t row, int64_t col, uint8_t* out) {
  alignas(64) float uniform[kGroup];
  alignas(64) float codes[kGroup];
  for (int64_t call = 0; call < 4; ++call) {
    alignas(64) uint32_t words[4][kWidth];
    for (int i = 0; i < kWidth; ++i) {
      words[0][i] = uint32_t(col / 4 + call * kWidth + i);
      words[1][i] = uint32_t(row);
      words[2][i] = uint32_t(p.offset);
      words[3][i] = uint32_t(p.offset >> 32);
    }
    philox_lanes<Vec>(words[0], words[1], words[2], words[3], p.seed);
    for (int i = 0; i < kWidth; ++i) {
      for (int w = 0; w < 4; ++w) uniform[4 * (call * kWidth + i) + w] = float(words[w][i] >> 8) * 0x1p-24f;
    }
  }
  for (int k = 0; k < kVectors; ++k) {
    stochastic_codes(v[k], Vec::load(uniform + k * kWidth)).store(codes + k * kWidth);
  }
  for (int64_t e = 0; e < kGroup / 2; ++e) out[e] = uint8_t(int(codes[2 * e]) | int(codes[2 * e + 1]) << 4);
}

// The codes of one row's group x, each block times its encode factor.
template <bool kStochastic>
inline void put_codes(const Vec* x, const float* encode, const Nvfp4QuantizeParams& p, int64_t row, int64_t col,
                      uint8_t* out) {
  Vec v[kVectors];
  for (int k = 0; k < kVectors; ++k) v[k] = x[k] * Vec::broadcast(encode[k / kPerBlock]);
  if constexpr (kStochastic) put_stochastic_codes(v, p, row, col, out);
  else Lanes::put_codes(v, out);
}

// The codes of `groups` groups of one row (its values at `values`), each block times its
// encode factor.
template <bool kStochastic, typename S>
inline void put_row_codes(const Nvfp4QuantizeParams& p, const S* values, const float* encode, int64_t groups,
                          int64_t row, int64_t col, uint8_t* codes) {
  Vec x[kVectors];
  for (int64_t j = 0; j < groups; ++j) {
    if constexpr (std::is_same_v<S, bf16_t> && !kStochastic) {
      Lanes::put_bf16_codes(values + j * kGroup, encode + j * kWidth, codes + j * kGroup / 2);
    } else {
      load_group<S, false>(values + j * kGroup, x);
      put_codes<kStochastic>(x, encode + j * kWidth, p, row, col + j * kGroup, codes + j * kGroup / 2);
    }
  }
}

// Groups [0, groups) of a strip's rows (row i's values at first + i * stride), from source
// column col, in three steps per row (1 x 16) or per strip (16 x 16): every block's amax, then
// all their scales and encode factors, then the codes. Each step's work is independent from
// group to group, so the long chain from a block's amax to its encode factor (a division
// among it) overlaps with the other groups' instead of stalling every group in turn. The
// codes step reads the fp32 values the amax step loaded (and transformed) into a buffer in
// L1; or, for bf16 rows without the transform, whose block amaxes come from their bits
// (Nvfp4Lanes::raw_block_amaxes), the row itself again.
template <typename T, bool kRht, bool kStochastic>
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
  const auto put_codes_of_row = [&](int64_t i) {
    uint8_t* codes = out.codes + i * out.code_stride;
    if constexpr (kRaw) put_row_codes<kStochastic>(p, first + i * stride, encode, groups, row0 + i, col, codes);
    else put_row_codes<kStochastic>(p, values, encode, groups, row0 + i, col, codes);
  };
  if (p.block_rows == 1) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < groups; ++j) block_amaxes(i, j).store(amax + j * kWidth);
      for (int64_t b = 0; b < blocks; b += kWidth) {
        group_scales(Vec::load(amax + b), g, out.scales + i * out.scale_stride + b).store(encode + b);
      }
      put_codes_of_row(i);
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
  for (int64_t b = 0; b < blocks; b += kWidth) group_scales(Vec::load(amax + b), g, scales + b).store(encode + b);
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t i = n == 0 ? rows - 1 : n - 1;
    if (!kRaw && n > 0) {
      for (int64_t j = 0; j < groups; ++j) load_values(i, j);
    }
    std::copy_n(scales, blocks, out.scales + i * out.scale_stride);
    put_codes_of_row(i);
  }
}

template <typename T, bool kRht, bool kStochastic>
void quantize_strip(const Nvfp4QuantizeParams& p, const Nvfp4GlobalScale& g, const Strip<T>& s) {
  const int64_t code_stride = (p.source.cols + 1) / 2, scale_stride = (p.source.cols + kNvfp4Block - 1) / kNvfp4Block;
  uint8_t* codes = p.data + s.r0 * code_stride + s.c0 / 2;
  uint8_t* scales = p.scales + s.r0 * scale_stride + s.c0 / kNvfp4Block;
  const int64_t whole = s.cols / kGroup * kGroup;
  quantize_groups<T, kRht, kStochastic>(p, g, s.first, s.stride, s.r0, s.rows, s.c0, whole / kGroup,
                                        {codes, code_stride, scales, scale_stride});
  if (whole == s.cols) return;
  // The ragged end: a zero-padded group, its codes and scales through buffers.
  alignas(64) T padded[kStripRows * kGroup];
  alignas(64) uint8_t tail_codes[kStripRows * kGroup / 2];
  alignas(64) uint8_t tail_scales[kStripRows * kWidth];
  pad_tails(s, whole, padded);
  quantize_groups<T, kRht, kStochastic>(p, g, padded, kGroup, s.r0, s.rows, s.c0 + whole, 1,
                                        {tail_codes, kGroup / 2, tail_scales, kWidth});
  const int64_t tail = s.cols - whole;
  for (int64_t i = 0; i < s.rows; ++i) {
    std::copy_n(tail_codes + i * kGroup / 2, (tail + 1) / 2, codes + i * code_stride + whole / 2);
    std::copy_n(tail_scales + i * kWidth, (tail + kNvfp4Block - 1) / kNvfp4Block,
                scales + i * scale_stride + whole / kNvfp4Block);
  }
}

// A NaN global amax makes every block's scale NaN (block_amax * NaN, with the amax's sign)
// and every code 0 (x * NaN is NaN, code 0, rounded either way).
inline void quantize_nan_amax(const Nvfp4QuantizeParams& p, const Nvfp4GlobalScale& g) {
  const int64_t rows = p.source.rows, cols = p.source.cols;
  std::fill_n(p.data, rows * ((cols + 1) / 2), uint8_t(0));
  std::fill_n(p.scales, rows * ((cols + kNvfp4Block - 1) / kNvfp4Block), to_fp8(g.multiplier, Fp8Format::kE4M3));
}

template <typename T, bool kRht, bool kStochastic>
void quantize(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
  const Nvfp4GlobalScale g = nvfp4_global_scale(*p.amax);
  if (std::isnan(g.multiplier)) return quantize_nan_amax(p, g);
  const Strips<T> strips(p.source);
  pool.parallel_for(strips.count(), strips.grain(), [&](int64_t begin, int64_t end) {
    alignas(64) T buffer[kStripRows * kGatheredPanel];
    for (int64_t t = begin; t < end; ++t) quantize_strip<T, kRht, kStochastic>(p, g, strips.strip(t, buffer));
  });
}

// --- dequantize ---------------------------------------------------------------------------

// kGroup values of a row from their codes (kGroup / 2 bytes) and kWidth scales.
template <typename T>
inline void dequantize_group(const uint8_t* codes, const uint8_t* scales, float amax, T* out) {
  alignas(64) float factor[kWidth];
  (Vec::template load_fp8<Fp8Format::kE4M3>(scales) * Vec::broadcast(amax) * Vec::broadcast(1.0f / kNvfp4Range))
      .store(factor);
  for (int k = 0; k < kVectors; ++k) {
    (Lanes::values(codes + k * kWidth / 2) * Vec::broadcast(factor[k / kPerBlock])).store(out + k * kWidth);
  }
}

template <typename T>
void dequantize(const Nvfp4DequantizeParams& p, const ThreadPool& pool) {
  const int64_t cols = p.cols, code_stride = (cols + 1) / 2, scale_stride = (cols + kNvfp4Block - 1) / kNvfp4Block;
  const int64_t whole = cols / kGroup * kGroup, tail = cols - whole;
  const float amax = *p.amax;
  if (cols == 0) return;
  pool.parallel_for(p.rows, std::max<int64_t>(1, kMinElementsPerTask / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* codes = p.data + r * code_stride;
      const uint8_t* scales = p.scales + r * scale_stride;
      T* out = static_cast<T*>(p.out) + r * cols;
      for (int64_t j = 0; j < whole; j += kGroup) {
        dequantize_group<T>(codes + j / 2, scales + j / kNvfp4Block, amax, out + j);
      }
      if (tail == 0) continue;
      // The ragged end through zero-padded copies.
      alignas(64) uint8_t tail_codes[kGroup / 2] = {};
      alignas(64) uint8_t tail_scales[kWidth] = {};
      alignas(64) T values[kGroup];
      std::copy_n(codes + whole / 2, (tail + 1) / 2, tail_codes);
      std::copy_n(scales + whole / kNvfp4Block, (tail + kNvfp4Block - 1) / kNvfp4Block, tail_scales);
      dequantize_group<T>(tail_codes, tail_scales, amax, values);
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

template <typename T>
struct Amax {
  static void run(const Nvfp4AmaxParams& p, const ThreadPool& pool) { amax<T>(p, pool); }
};
// The transform and the stochastic rounding are compiled in or out: the plain cast keeps its
// group in registers.
template <typename T>
struct Quantize {
  static void run(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
    if (p.source.rht) {
      if (p.stochastic) quantize<T, true, true>(p, pool);
      else quantize<T, true, false>(p, pool);
    } else {
      if (p.stochastic) quantize<T, false, true>(p, pool);
      else quantize<T, false, false>(p, pool);
    }
  }
};
template <typename T>
struct Dequantize {
  static void run(const Nvfp4DequantizeParams& p, const ThreadPool& pool) { dequantize<T>(p, pool); }
};

}  // namespace nvfp4_detail

void nvfp4_amax(const Nvfp4AmaxParams& p, const ThreadPool& pool) {
  nvfp4_detail::dispatch<nvfp4_detail::Amax>(p.source.dtype, p, pool);
}
void nvfp4_quantize(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
  nvfp4_detail::dispatch<nvfp4_detail::Quantize>(p.source.dtype, p, pool);
}
void nvfp4_dequantize(const Nvfp4DequantizeParams& p, const ThreadPool& pool) {
  nvfp4_detail::dispatch<nvfp4_detail::Dequantize>(p.out_dtype, p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
