#include "te_kernels/dtype.h"

namespace te_kernels {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown";
}

float to_float(fp16_t value) {
  const uint32_t h = value.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = float(mantissa) * 5.9604644775390625e-8f;
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Round to nearest, ties to even, exactly as F16C's VCVTPS2PH with imm 0 does, so that the
// portable path and the SIMD paths store identical bits.
fp16_t to_fp16(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet it, keep the top payload bits
    return fp16_t{uint16_t(sign | 0x7e00u | ((magnitude & 0x7fffffu) >> 13))};
  }
  if (magnitude >= 0x477ff000u) return fp16_t{uint16_t(sign | 0x7c00u)};  // >= 65520 -> inf
  const uint32_t exponent = magnitude >> 23;
  if (exponent < 113) {
    // fp16 subnormal (or zero): count units of 2^-24 with the implicit bit made explicit.
    if (exponent == 0) return fp16_t{sign};  // fp32 subnormals are far below 2^-25
    const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent;
    if (shift > 31u) shift = 31u;
    uint32_t units = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (units & 1u))) ++units;
    return fp16_t{uint16_t(sign | units)};
  }
  uint32_t result = ((exponent - 112u) << 10) | ((magnitude & 0x7fffffu) >> 13);
  const uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;  // may carry into exponent
  return fp16_t{uint16_t(sign | result)};
}

}  // namespace te_kernels
