// NVFP4 casts (TransformerEngine's NVFP4BlockScaling), defined in plain PyTorch by
// transformer_engine/pytorch/reference/nvfp4.py, whose bits the kernels reproduce. A tensor
// [rows, cols] holds 4-bit E2M1 codes (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; sign in
// bit 3), two per byte with the even column in the low nibble, an E4M3 scale per block of 16
// consecutive values of a row (block_rows = 1) or per 16 x 16 tile (block_rows = 16, the
// tile's scale stored on each of its rows), and one fp32 amax g for the whole tensor. Ragged
// edges count as zeros. The scalar definitions below are the rules every vector path must
// reproduce bit for bit (fp32 arithmetic in the stated order, NaN propagating as torch's
// minimum and clamp propagate it).
#pragma once

#include <cfloat>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

constexpr int64_t kNvfp4Block = 16;
constexpr float kE2m1Max = 6.0f;
constexpr float kNvfp4ScaleMax = 448.0f;               // E4M3's largest value
constexpr float kNvfp4Range = 448.0f * 6.0f;           // 2688: the largest scaled value
// TE's fixed signs of the random Hadamard transform (get_wgrad_sign_vector).
constexpr float kRhtSigns[kNvfp4Block] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

// torch.minimum(x, FLT_MAX): inf becomes FLT_MAX, NaN stays NaN (the comparison fails).
inline float below_flt_max(float x) { return x > FLT_MAX ? FLT_MAX : x; }

// The global scales of a tensor of amax g: S_enc = min(2688 / g, FLT_MAX), 1 where that is 0
// (g = inf), S_dec = 1 / S_enc, and the blocks' multiplier S_enc * fp32(1 / 6).
struct Nvfp4GlobalScale {
  float encode, decode, multiplier;
};
inline Nvfp4GlobalScale nvfp4_global_scale(float amax) {
  float encode = below_flt_max(kNvfp4Range / amax);
  if (encode == 0.0f) encode = 1.0f;
  return {encode, 1.0f / encode, encode * (1.0f / kE2m1Max)};
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

// Stochastic rounding: |v| between grid neighbours lo <= |v| < hi (|v| = 6: lo 4, hi 6) goes
// up when the Philox word's top 24 bits over 2^24 are below (|v| - lo) / (hi - lo), in fp32.
inline uint8_t e2m1_code_stochastic(float v, uint32_t word) {
  const float m = e2m1_magnitude(v);
  int below = 0;
  while (below < 6 && m >= kE2m1Values[below + 1]) ++below;
  const float lo = kE2m1Values[below], hi = kE2m1Values[below + 1];
  const bool up = float(word >> 8) * 0x1p-24f < (m - lo) / (hi - lo);
  return uint8_t((below + up) | e2m1_sign(v));
}

// Dequantisation: value = code * factor, factor = scale * g * fp32(1 / 2688), left to right.
inline float nvfp4_dequantize_factor(uint8_t scale, float amax) {
  return fp8_to_float(scale, Fp8Format::kE4M3) * amax * (1.0f / kNvfp4Range);
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
  float* amax = nullptr;  // [1]: max |x| of the source (after the transform), NaN skipped
};

struct Nvfp4QuantizeParams {
  Nvfp4Source source;
  const float* amax = nullptr;  // [1]: the tensor's amax g (nvfp4_amax's, or reduced over ranks)
  int64_t block_rows = 1;       // 1 (1 x 16 blocks) or 16 (16 x 16 tiles)
  // Stochastic rounding by Philox4x32-10 keyed by seed, counter (col / 4, row, offset low,
  // offset high), word col % 4; else nearest.
  bool stochastic = false;
  uint64_t seed = 0, offset = 0;
  uint8_t* data = nullptr;    // [rows, ceil(cols / 2)] packed codes
  uint8_t* scales = nullptr;  // [rows, ceil(cols / 16)] E4M3 scales
};

struct Nvfp4DequantizeParams {
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;    // [rows, ceil(cols / 2)]
  const uint8_t* scales = nullptr;  // [rows, ceil(cols / 16)]
  const float* amax = nullptr;      // [1]
  DType out_dtype = DType::kFloat32;  // float32, bfloat16 or float16
  void* out = nullptr;                // [rows, cols]
};

void nvfp4_amax(const Nvfp4AmaxParams& params, const ThreadPool& pool);
void nvfp4_quantize(const Nvfp4QuantizeParams& params, const ThreadPool& pool);
void nvfp4_dequantize(const Nvfp4DequantizeParams& params, const ThreadPool& pool);

}  // namespace te_kernels
