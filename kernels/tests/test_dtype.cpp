// Exactness of the scalar bf16/fp16 conversions, which every SIMD path must reproduce.
#include <cmath>
#include <cstdint>
#include <limits>

#include "check.h"
#include "te_kernels/dtype.h"

using namespace te_kernels;

static void test_bf16() {
  // Round to nearest even at the 16-bit boundary.
  TE_CHECK(to_bf16(bits_float(0x3f808000u)).bits == 0x3f80, "tie rounds down to even");
  TE_CHECK(to_bf16(bits_float(0x3f818000u)).bits == 0x3f82, "tie rounds up to even");
  TE_CHECK(to_bf16(bits_float(0x3f808001u)).bits == 0x3f81, "above tie rounds up");
  TE_CHECK(to_bf16(std::numeric_limits<float>::infinity()).bits == 0x7f80, "inf");
  const bf16_t nan = to_bf16(std::numeric_limits<float>::quiet_NaN());
  TE_CHECK(std::isnan(to_float(nan)), "NaN stays NaN");
  TE_CHECK(std::isnan(to_float(to_bf16(bits_float(0x7f800001u)))), "signalling NaN with low payload stays NaN");
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = to_float(bf16_t{uint16_t(b)});
    if (!std::isnan(f)) TE_CHECK(to_bf16(f).bits == b, "bf16 round trip of %#x", b);
  }
}

static void test_fp16() {
  // Every fp16 value widens exactly and narrows back to itself.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = to_float(fp16_t{uint16_t(h)});
    if (std::isnan(f)) {
      TE_CHECK(std::isnan(to_float(to_fp16(f))), "NaN %#x", h);
      continue;
    }
    TE_CHECK(to_fp16(f).bits == h, "fp16 round trip of %#x gave %#x", h, to_fp16(f).bits);
  }
  TE_CHECK(to_float(fp16_t{0x3c00}) == 1.0f, "one");
  TE_CHECK(to_float(fp16_t{0x0001}) == std::ldexp(1.0f, -24), "smallest subnormal");
  TE_CHECK(to_fp16(65504.0f).bits == 0x7bff, "max");
  TE_CHECK(to_fp16(65519.0f).bits == 0x7bff, "below the overflow tie");
  TE_CHECK(to_fp16(65520.0f).bits == 0x7c00, "overflow tie goes to inf");
  TE_CHECK(to_fp16(std::ldexp(1.0f, -25)).bits == 0x0000, "half the smallest subnormal ties to 0");
  TE_CHECK(to_fp16(std::ldexp(1.5f, -25)).bits == 0x0001, "above the tie rounds up");
  TE_CHECK(to_fp16(std::ldexp(3.0f, -25)).bits == 0x0002, "1.5 units ties to even 2");
  TE_CHECK(to_fp16(-0.0f).bits == 0x8000, "negative zero");
  // Midpoints between consecutive normal fp16 values go to the even neighbour.
  for (uint32_t h = 0x0400; h < 0x7bff; h += 97) {
    const double lo = to_float(fp16_t{uint16_t(h)}), hi = to_float(fp16_t{uint16_t(h + 1)});
    const uint16_t got = to_fp16(float((lo + hi) / 2)).bits;
    TE_CHECK(got == ((h & 1) ? h + 1 : h), "midpoint above %#x gave %#x", h, got);
  }
}

int main() {
  test_bf16();
  test_fp16();
  TE_TEST_MAIN_RETURN();
}
