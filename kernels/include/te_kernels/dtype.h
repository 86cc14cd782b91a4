// Element types the kernels understand, and exact scalar conversions between the 16-bit
// floating formats and fp32. The SIMD paths convert whole vectors with the same rounding
// rule (round to nearest, ties to even; NaN stays NaN), so scalar tails and vector bodies
// agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace te_kernels {

enum class DType : int { kFloat32, kFloat64, kBFloat16, kFloat16 };

const char* dtype_name(DType dtype);

// Storage types: 16 raw bits; arithmetic always happens after widening to fp32.
struct bf16_t {
  uint16_t bits;
};
struct fp16_t {
  uint16_t bits;
};

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float to_float(bf16_t value) { return bits_float(uint32_t(value.bits) << 16); }

// fp32 -> bf16 keeps the top 16 bits after adding half an ulp of bf16 (plus the tie bit,
// which gives ties-to-even). The add could carry a NaN into infinity, so every NaN becomes
// the canonical quiet NaN 0x7fc0 instead, as c10::BFloat16 does.
inline bf16_t to_bf16(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16_t{0x7fc0};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return bf16_t{uint16_t(bits >> 16)};
}

// IEEE binary16 <-> binary32 by bit manipulation (the portable path has no F16C).
float to_float(fp16_t value);
fp16_t to_fp16(float value);

inline float to_float(float value) { return value; }
inline double to_double(double value) { return value; }

// Generic "store an accumulator value as T" used by scalar code and vector tails.
template <typename T>
struct Convert;
template <>
struct Convert<float> {
  static float from(float v) { return v; }
  static float from(double v) { return float(v); }
};
template <>
struct Convert<double> {
  static double from(double v) { return v; }
};
template <>
struct Convert<bf16_t> {
  static bf16_t from(float v) { return to_bf16(v); }
};
template <>
struct Convert<fp16_t> {
  static fp16_t from(float v) { return to_fp16(v); }
};

}  // namespace te_kernels
