// Public block-scaled FP8 cast API: the scalar scale definitions, argument checks the
// kernels rely on, and the run-time tier choice.
#include <cfloat>
#include <cmath>
#include <stdexcept>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8_block.h"

namespace te_kernels {
namespace {

// The biased exponent of amax / fp8_max rounded up (see block_scale in fp8_block.h). The
// division is a multiplication by the fp32 reciprocal, as TransformerEngine computes it.
uint8_t e8m0_exponent(float amax, float fp8_max) {
  const float value = amax * (1.0f / fp8_max);
  if (std::isnan(value)) return 0xFF;
  if (std::isinf(value)) return 0xFE;
  const uint32_t bits = float_bits(value);
  const uint32_t exponent = (bits >> 23) & 0xFF, mantissa = bits & 0x7FFFFF;
  // A subnormal value at most 2^-127 is covered by exponent 0 (scale_inv 2^-127) as it is.
  const bool round_up = mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000);
  return uint8_t(exponent + (round_up ? 1 : 0));
}

void check_blocks(const char* op, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument(std::string(op) + ": negative matrix size");
  if (block_rows < 1 || block_cols < 1 || block_cols > 1024) {
    throw std::invalid_argument(std::string(op) + ": blocks must be at least 1 x 1 and at most 1024 columns wide");
  }
}

}  // namespace

float e8m0_to_float(uint8_t e) {
  if (e == 0xFF) return NAN;
  // 2^(e - 127): a normal float for e >= 1, the subnormal 2^-127 for e == 0.
  return e == 0 ? bits_float(0x00400000u) : bits_float(uint32_t(e) << 23);
}

BlockScale block_scale(float amax, float fp8_max, BlockScaleMode mode, float amax_epsilon) {
  if (mode == BlockScaleMode::kE8M0) {
    const uint8_t e = e8m0_exponent(amax, fp8_max);
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

void fp8_block_quantize(const Fp8BlockQuantizeParams& params, const ThreadPool& pool) {
  check_blocks("fp8_block_quantize", params.rows, params.cols, params.block_rows, params.block_cols);
  if (params.in_dtype == DType::kFloat64) throw std::invalid_argument("fp8_block_quantize: float64 input is not supported");
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::fp8_block_quantize(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::fp8_block_quantize(params, pool);
    case CpuIsa::kPortable: return cpu::portable::fp8_block_quantize(params, pool);
  }
}

void fp8_block_dequantize(const Fp8BlockDequantizeParams& params, const ThreadPool& pool) {
  check_blocks("fp8_block_dequantize", params.rows, params.cols, params.block_rows, params.block_cols);
  if (params.out_dtype == DType::kFloat64) throw std::invalid_argument("fp8_block_dequantize: float64 output is not supported");
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::fp8_block_dequantize(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::fp8_block_dequantize(params, pool);
    case CpuIsa::kPortable: return cpu::portable::fp8_block_dequantize(params, pool);
  }
}

}  // namespace te_kernels
