#include "te_kernels/fp8.h"

#include <cmath>
#include <limits>

namespace te_kernels {
namespace {

// Per-format constants: fp32 exponent rebias, mantissa bits kept, smallest normal.
struct Fp8Layout {
  int mantissa_bits;     // 3 (E4M3) or 2 (E5M2)
  uint32_t rebias;       // fp32 bias - fp8 bias: 120 or 112
  float min_normal;      // 2^-6 or 2^-14
  float subnormal_step;  // 2^-9 or 2^-16
  float max;             // 448 or 57344
};

constexpr Fp8Layout layout(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? Fp8Layout{3, 120, 0.015625f, 0.001953125f, 448.0f}
                                    : Fp8Layout{2, 112, 6.103515625e-05f, 1.52587890625e-05f, 57344.0f};
}

}  // namespace

float fp8_max(Fp8Format format) { return layout(format).max; }

uint8_t to_fp8(float value, Fp8Format format) {
  const Fp8Layout l = layout(format);
  const uint8_t sign = uint8_t((float_bits(value) >> 24) & 0x80u);
  if (std::isnan(value)) return uint8_t(sign | 0x7f);
  const float magnitude = std::fmin(std::fabs(value), l.max);  // saturate
  if (magnitude < l.min_normal) {
    // Subnormal: a whole number of steps, rounded to nearest even (the default FP mode).
    return uint8_t(sign | uint32_t(std::nearbyint(magnitude / l.subnormal_step)));
  }
  // Normal: round the fp32 mantissa to `mantissa_bits` (ties to even) on the bit pattern,
  // then rebias the exponent. A carry out of the mantissa bumps the exponent, as it should.
  const int shift = 23 - l.mantissa_bits;
  uint32_t bits = float_bits(magnitude);
  bits += ((1u << (shift - 1)) - 1) + ((bits >> shift) & 1u);
  return uint8_t(sign | ((bits >> shift) - (l.rebias << l.mantissa_bits)));
}

float fp8_to_float(uint8_t code, Fp8Format format) {
  const Fp8Layout l = layout(format);
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const uint32_t magnitude = code & 0x7fu;
  const uint32_t exponent = magnitude >> l.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << l.mantissa_bits) - 1);
  if (format == Fp8Format::kE4M3 && magnitude == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (format == Fp8Format::kE5M2 && exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  if (exponent == 0) return sign * float(mantissa) * l.subnormal_step;
  return sign * bits_float(((exponent + l.rebias) << 23) | (mantissa << (23 - l.mantissa_bits)));
}

}  // namespace te_kernels
