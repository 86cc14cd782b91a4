// NVFP4 casts (TransformerEngine's NVFP4BlockScaling), defined in plain PyTorch by
// transformer_engine/pytorch/reference/nvfp4.py, whose bits the kernels reproduce. A tensor
// [rows, cols] holds 4-bit E2M1 codes (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; sign in
// bit 3), two per byte with the even column in the low nibble, an E4M3 scale per block of 16
// consecutive values of a row (block_rows = 1) or per 16 x 16 tile (block_rows = 16, the
// tile's scale stored on each of its rows), and an fp32 amax g for the whole tensor or one per
// row (row-scaled NVFP4). The global scale's E4M3 bound E is 448, or 256 (TE's 4over6
// tensors); the block scales are always bounded by 448. Ragged edges count as zeros. The
// scalar definitions below are the rules every vector path must reproduce bit for bit (fp32
// arithmetic in the stated order, NaN propagating as torch's minimum and clamp propagate it).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

constexpr int64_t kNvfp4Block = 16;
constexpr float kE2m1Max = 6.0f;
constexpr float kNvfp4ScaleMax = 448.0f;               // E4M3's largest value: the block scales' bound
// TE's fixed signs of the random Hadamard transform (get_wgrad_sign_vector).
constexpr float kRhtSigns[kNvfp4Block] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

// torch.minimum(x, FLT_MAX): inf becomes FLT_MAX, NaN stays NaN (the comparison fails).
inline float below_flt_max(float x) { return x > FLT_MAX ? FLT_MAX : x; }

// x itself, through a volatile: a product passed through it is rounded to fp32 on its own.
// GCC's default -ffp-contract=fast fuses a product and a sum that follows it into one FMA (one
// rounding) wherever the target has FMA, where the reference rounds twice. (The kernels have
// the same for their vectors, nvfp4_kernels.h.)
inline float unfused(float x) {
  const volatile float rounded = x;
  return rounded;
}

// The global scales of a tensor (or a row) of amax g with the bound E (e4m3_max):
// S_enc = min(6 E / g, FLT_MAX), 1 where that is 0 (g = inf), S_dec = 1 / S_enc, and the blocks'
// multiplier S_enc * fp32(1 / 6); g itself for 4over6's errors.
struct Nvfp4GlobalScale {
  float encode, decode, multiplier, amax;
};
inline Nvfp4GlobalScale nvfp4_global_scale(float amax, float e4m3_max = kNvfp4ScaleMax) {
  float encode = below_flt_max(e4m3_max * kE2m1Max / amax);  // 6 E is exact: 2688 or 1536
  if (encode == 0.0f) encode = 1.0f;
  return {encode, 1.0f / encode, encode * (1.0f / kE2m1Max), amax};
}

// A block's E4M3 scale: e4m3(clamp(min(block_amax * multiplier, FLT_MAX), -448, 448)), nearest even.
inline uint8_t nvfp4_block_scale(float block_amax, float multiplier) {
  float decode = below_flt_max(block_amax * multiplier);
  decode = decode > kNvfp4ScaleMax ? kNvfp4ScaleMax : decode < -kNvfp4ScaleMax ? -kNvfp4ScaleMax : decode;
  return to_fp8(decode, Fp8Format::kE4M3);
}

// What a block's values are multiplied by before rounding: min(1 / (scale * S_dec), FLT_MAX).
inline float nvfp4_block_encode(uint8_t scale, float global_decode) {
  return below_flt_max(1.0f / (fp8_to_float(scale, Fp8Format::kE4M3) * global_decode));
}

// The magnitude of each code 0..7.
constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline float e2m1_value(uint8_t code) {
  const float magnitude = kE2m1Values[code & 7];
  return code & 8 ? -magnitude : magnitude;
}

// v = x * encode clamped to [-6, 6] (NaN stays NaN); its magnitude, NaN counting as 0.
inline float e2m1_magnitude(float v) {
  const float magnitude = v < 0.0f ? -v : v;
  return magnitude > kE2m1Max ? kE2m1Max : magnitude == magnitude ? magnitude : 0.0f;
}

// Bit 3: v < 0, so a negative value that rounds to zero is -0 (code 8); -0 and NaN are +0.
inline uint8_t e2m1_sign(float v) { return v < 0.0f ? 8 : 0; }

// The code of v = x * encode, nearest with ties to the even code: the magnitude rises past
// 0.25, 1.25, 2.5 and 5 (ties stay below) and from 0.75, 1.75 and 3.5 on (ties go up).
inline uint8_t e2m1_code(float v) {
  const float m = e2m1_magnitude(v);
  const int code = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) + (m >= 3.5f) + (m > 5.0f);
  return uint8_t(code | e2m1_sign(v));
}

// Stochastic rounding draws 8 bits per value, as TE's conversion takes one 32-bit word for
// every 4 values: one Philox call per 16 values of a row (counter: column / 16, row, offset low,
// offset high), column c taking byte c % 4 of word (c % 16) / 4.
inline uint8_t nvfp4_draw(const uint32_t (&words)[4], int64_t col) {
  return uint8_t(words[col % 16 / 4] >> (8 * (col % 4)));
}

// A draw as the uniform (draw + 1/2) / 256 (exact in fp32): rounding goes up with probability
// the fraction rounded to a multiple of 1/256, so each value's mean error is within 1/512 of
// its grid step.
inline float nvfp4_uniform(uint8_t draw) { return (float(draw) + 0.5f) * 0x1p-8f; }

// Stochastic rounding: |v| between grid neighbours lo <= |v| < hi (|v| = 6: lo 4, hi 6) goes
// up when its uniform is below (|v| - lo) / (hi - lo), in fp32 (exact: hi - lo is a power of
// two and |v| - lo exact).
inline uint8_t e2m1_code_stochastic(float v, uint8_t draw) {
  const float m = e2m1_magnitude(v);
  int below = 0;
  while (below < 6 && m >= kE2m1Values[below + 1]) ++below;
  const float lo = kE2m1Values[below], hi = kE2m1Values[below + 1];
  const bool up = nvfp4_uniform(draw) < (m - lo) / (hi - lo);
  return uint8_t((below + up) | e2m1_sign(v));
}

// 4over6 (TE's adaptive block scaling): each block is cast twice, with the scale of its largest
// value landing on 4 (map-to-4) and on 6 (map-to-6), and keeps the cast whose error is smaller,
// map-to-6 on a tie or a NaN error. The error sums |d| (kMae) or d * d (kMse) over the block's
// 16 values in order; a 16 x 16 tile's row sums add up as a tree (row r + row r + 8, then + 4,
// + 2, + 1).
enum class Nvfp4FourOverSix { kOff, kMae, kMse };

// A candidate's E4M3 scale: e4m3(clamp(base, -448, 448)) for map-to-6, e4m3(clamp(base * 1.5,
// -448, 448)) for map-to-4, with base = (block_amax / 6) * S_enc: a true division, not the
// standard scale's multiplier.
inline uint8_t nvfp4_four_over_six_scale(float block_amax, float global_encode, bool map_to_4) {
  float decode = (block_amax / kE2m1Max) * global_encode;
  if (map_to_4) decode = decode * 1.5f;
  decode = decode > kNvfp4ScaleMax ? kNvfp4ScaleMax : decode < -kNvfp4ScaleMax ? -kNvfp4ScaleMax : decode;
  return to_fp8(decode, Fp8Format::kE4M3);
}

// The error of the value x cast to `code` with the fp32 block scale `scale`:
// d = ((code value * scale) * g) / (6 E) - x, or, scaled_error (TE's fast-math error),
// d = code value * scale - x * S_enc with each product rounded; |d| (kMae) or d * d (kMse).
inline float nvfp4_error_term(float x, uint8_t code, float scale, const Nvfp4GlobalScale& g, float e4m3_max,
                              Nvfp4FourOverSix rule, bool scaled_error) {
  const float value = e2m1_value(code);
  const float d = scaled_error ? unfused(value * scale) - unfused(x * g.encode)
                               : ((value * scale) * g.amax) / (kE2m1Max * e4m3_max) - x;
  return rule == Nvfp4FourOverSix::kMse ? unfused(d * d) : std::fabs(d);
}

// Dequantisation: value = code * factor, factor = scale * g * fp32(1 / (6 E)), left to right.
inline float nvfp4_dequantize_factor(uint8_t scale, float amax, float e4m3_max = kNvfp4ScaleMax) {
  return fp8_to_float(scale, Fp8Format::kE4M3) * amax * (1.0f / (kE2m1Max * e4m3_max));
}

// What is cast: a [rows, cols] matrix of float32, bfloat16 or float16 at any strides (in
// elements; the transposed usage is the input with its strides swapped), optionally after the
// random Hadamard transform of each 16 consecutive values of a row (cols a multiple of 16):
// y = (x * kRhtSigns) H16 / 4 as fp32 butterflies of strides 1, 2, 4, 8 (each a + b, then
// a - b), times 1/4, rounded to the input's dtype.
struct Nvfp4Source {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kFloat32;
  const void* data = nullptr;
  int64_t row_stride = 0, col_stride = 1;
  bool rht = false;
};

struct Nvfp4AmaxParams {
  Nvfp4Source source;
  bool per_row = false;   // each source row's amax (row-scaled NVFP4), else the whole source's
  float* amax = nullptr;  // [1] or [rows]: max |x| (after the transform), NaN skipped, 0 over no values
};

struct Nvfp4QuantizeParams {
  Nvfp4Source source;
  const float* amax = nullptr;       // [1]: the tensor's amax g (nvfp4_amax's, or reduced over ranks)
  bool amax_per_row = false;         // amax holds [rows] instead: each source row's own g (block_rows 1)
  float e4m3_max = kNvfp4ScaleMax;   // E, the global scale's bound: 448 or 256
  int64_t block_rows = 1;            // 1 (1 x 16 blocks) or 16 (16 x 16 tiles)
  Nvfp4FourOverSix four_over_six = Nvfp4FourOverSix::kOff;  // not with stochastic rounding
  bool scaled_error = false;         // 4over6's error in the scaled domain (nvfp4_error_term)
  // Stochastic rounding by Philox4x32-10 keyed by seed (nvfp4_draw: a byte per value, one
  // call per 16 values of a row); else nearest.
  bool stochastic = false;
  uint64_t seed = 0, offset = 0;
  uint8_t* data = nullptr;    // [rows, ceil(cols / 2)] packed codes
  uint8_t* scales = nullptr;  // [rows, ceil(cols / 16)] E4M3 scales
};

struct Nvfp4DequantizeParams {
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;    // [rows, ceil(cols / 2)]
  const uint8_t* scales = nullptr;  // [rows, ceil(cols / 16)]
  const float* amax = nullptr;      // [1], or [rows] when amax_per_row
  bool amax_per_row = false;
  float e4m3_max = kNvfp4ScaleMax;  // E of the cast: factor = scale * g * fp32(1 / (6 E))
  DType out_dtype = DType::kFloat32;  // float32, bfloat16 or float16
  void* out = nullptr;                // [rows, cols]
};

// The column-wise usage of a 16 x 16-tile cast (block_rows 16) from its row-wise one: both
// cast the same tiles with the same global amax, so the transpose's codes are the row-wise
// codes transposed and its scales the tiles' scales, bit for bit (nearest rounding, no
// transform, no 4over6: those casts differ between the usages).
struct Nvfp4TransposeTilesParams {
  int64_t rows = 0, cols = 0;           // of the row-wise usage's matrix
  const uint8_t* data = nullptr;        // [rows, ceil(cols / 2)]
  const uint8_t* scales = nullptr;      // [rows, ceil(cols / 16)], each tile's on its 16 rows
  uint8_t* transposed_data = nullptr;   // [cols, ceil(rows / 2)]
  uint8_t* transposed_scales = nullptr;  // [cols, ceil(rows / 16)]
};

void nvfp4_amax(const Nvfp4AmaxParams& params, const ThreadPool& pool);
void nvfp4_quantize(const Nvfp4QuantizeParams& params, const ThreadPool& pool);
void nvfp4_dequantize(const Nvfp4DequantizeParams& params, const ThreadPool& pool);
void nvfp4_transpose_tiles(const Nvfp4TransposeTilesParams& params, const ThreadPool& pool);

}  // namespace te_kernels
