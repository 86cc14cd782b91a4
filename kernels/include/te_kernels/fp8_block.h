// Block-scaled FP8 casts: one scale per block of block_rows x block_cols elements of a
// row-major [rows, cols] matrix (ragged blocks at the right and bottom edges are allowed).
// The layouts in use: 1 x 128 and 128 x 128 (Float8BlockScaling, fp32 or power-of-two
// scales), 1 x 32 (MXFP8, E8M0 scales), and the column-wise variants 128 x 1 and 32 x 1 that
// the weight-gradient GEMM needs. The codes keep the input's layout; scales are row-major
// [ceil(rows / block_rows), ceil(cols / block_cols)].
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"

namespace te_kernels {

enum class BlockScaleMode : int {
  kFp32 = 0,  // scale = fp8_max / max(amax, epsilon); scale_inv (float) = 1 / scale
  kPow2 = 1,  // the same scale rounded down to a power of two
  kE8M0 = 2,  // MXFP8: scale_inv = 2^(e - 127), stored as the biased exponent e (uint8)
};

// One block's scales, from its amax (max |x| over the block, NaN elements
// skipped as in every amax: a NaN-only block has amax 0).
struct BlockScale {
  float scale;       // the multiplier applied before the saturating cast
  float scale_inv;   // the dequantisation factor
  uint8_t e8m0;      // kE8M0 only: the stored biased exponent
};

// 2^(e - 127) for a biased E8M0 exponent; 255 is NaN.
inline float e8m0_to_float(uint8_t e) {
  if (e == 0xFF) return NAN;
  return e == 0 ? bits_float(0x00400000u) : bits_float(uint32_t(e) << 23);  // e == 0: the subnormal 2^-127
}

// kFp32 / kPow2 (TE_API.md section 4, current scaling per block): an amax of 0, inf or NaN
// gives scale 1; a quotient that overflows gives FLT_MAX (then rounded down for kPow2).
// kE8M0: e = the biased exponent of amax * fp32(1 / fp8_max) (TransformerEngine multiplies
// by the reciprocal), plus one when it has mantissa bits, so no element saturates; amax 0
// gives e = 0, inf 254, NaN 255 (a NaN scale). scale = 2^(127 - e) exactly.
// Inline: the kernels call it once per block, and for 1 x 32 blocks a call would cost as
// much as the block's casts.
inline BlockScale block_scale(float amax, float fp8_max, BlockScaleMode mode, float amax_epsilon) {
  if (mode == BlockScaleMode::kE8M0) {
    const float value = amax * (1.0f / fp8_max);
    uint8_t e;
    if (std::isnan(value)) {
      e = 0xFF;
    } else if (std::isinf(value)) {
      e = 0xFE;
    } else {
      const uint32_t bits = float_bits(value), exponent = (bits >> 23) & 0xFF, mantissa = bits & 0x7FFFFF;
      // A subnormal value at most 2^-127 is covered by exponent 0 (scale_inv 2^-127) as it is.
      const bool round_up = mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000);
      e = uint8_t(exponent + (round_up ? 1 : 0));
    }
    // 2^(127 - e): 2^127 down to 2^-127 (subnormal); NaN for the NaN exponent.
    const float scale = e == 0xFF ? NAN : e == 0xFE ? bits_float(0x00400000u) : bits_float(uint32_t(254 - e) << 23);
    return {scale, e8m0_to_float(e), e};
  }
  const float bounded = amax_epsilon > 0.0f && amax < amax_epsilon ? amax_epsilon : amax;
  float scale = fp8_max / bounded;
  if (std::isinf(scale)) scale = FLT_MAX;
  if (!(bounded > 0.0f) || !std::isfinite(bounded)) scale = 1.0f;
  if (mode == BlockScaleMode::kPow2) scale = bits_float(float_bits(scale) & 0x7F800000u);
  return {scale, 1.0f / scale, 0};
}

// Widest block supported: a kernel task keeps per-column buffers of this many floats on its stack.
constexpr int64_t kMaxBlockCols = 1024;

struct Fp8BlockQuantizeParams {
  int64_t rows = 0, cols = 0;
  int64_t block_rows = 1, block_cols = 128;
  DType in_dtype = DType::kFloat32;  // float32, bfloat16 or float16
  const void* in = nullptr;          // [rows, cols]
  Fp8Format format = Fp8Format::kE4M3;
  BlockScaleMode mode = BlockScaleMode::kPow2;
  float amax_epsilon = 0.0f;  // kFp32 / kPow2: amaxes below it count as it
  uint8_t* out = nullptr;     // [rows, cols] FP8 codes: saturate(in * block scale)
  void* scale_inv = nullptr;  // [block grid]: float, or uint8 E8M0 exponents for kE8M0
};

struct Fp8BlockDequantizeParams {
  int64_t rows = 0, cols = 0;
  int64_t block_rows = 1, block_cols = 128;
  const uint8_t* in = nullptr;  // [rows, cols] FP8 codes
  Fp8Format format = Fp8Format::kE4M3;
  bool e8m0_scales = false;         // scale_inv holds uint8 E8M0 exponents, else float
  const void* scale_inv = nullptr;  // [block grid]
  DType out_dtype = DType::kFloat32;  // float32, bfloat16 or float16
  void* out = nullptr;                // [rows, cols] = in * scale_inv of its block
};

void fp8_block_quantize(const Fp8BlockQuantizeParams& params, const ThreadPool& pool);
void fp8_block_dequantize(const Fp8BlockDequantizeParams& params, const ThreadPool& pool);

}  // namespace te_kernels
