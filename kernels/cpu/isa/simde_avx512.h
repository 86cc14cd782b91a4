// SIMDe's portable AVX-512 (F, BW, VL, DQ, BF16) under the intrinsics' own names, for the
// emulated test build of the avx512 tier (tier_avx512.h), which compiles everything for AVX2:
// SIMDe builds each AVX-512 intrinsic from AVX2 instructions.
#pragma once
#if !defined(TE_KERNELS_EMULATE_AVX512)
#error "simde_avx512.h belongs to the emulated test build (TE_KERNELS_EMULATE_AVX512) only"
#endif
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>
#include <cstring>

// GCC notes that passing a 512-bit vector by value would change the ABI of a function compiled
// without AVX512F: every function here and in the tier is built alike, in this one test build.
#pragma GCC diagnostic ignored "-Wpsabi"


// What the kernels use that SIMDe 0.8.2 lacks or gets wrong for them, lane by lane (simde__m512
// is GCC's __m512 here). Masked loads and stores touch only the lanes the mask names, as the
// instructions do: the others may lie past the end of a buffer.
// The reduction adds in the order of GCC's _mm512_reduce_add_ps (halves, quarters, then
// pairs), so sums match the real instruction sequence bit for bit.
namespace te_kernels::simde_extra {

template <typename Lane, int kLanes, typename Vector>
inline void lanes(Vector v, Lane (&out)[kLanes]) {
  static_assert(sizeof(Vector) == sizeof(out), "lanes: sizes differ");
  std::memcpy(out, &v, sizeof(out));
}
template <typename Vector, typename Lane, int kLanes>
inline Vector vector_of(const Lane (&in)[kLanes]) {
  static_assert(sizeof(Vector) == sizeof(in), "vector_of: sizes differ");
  Vector v;
  std::memcpy(&v, in, sizeof(v));
  return v;
}

inline float reduce_add_ps(simde__m512 a) {
  float x[16], half[8], quarter[4];
  lanes(a, x);
  for (int i = 0; i < 8; ++i) half[i] = x[8 + i] + x[i];
  for (int i = 0; i < 4; ++i) quarter[i] = half[4 + i] + half[i];
  const float pair0 = quarter[0] + quarter[2], pair1 = quarter[1] + quarter[3];
  return pair0 + pair1;
}

inline simde__m512 permute_ps(simde__m512 a, int control) {
  float x[16], y[16];
  lanes(a, x);
  for (int i = 0; i < 16; ++i) y[i] = x[(i & ~3) + ((control >> (2 * (i & 3))) & 3)];
  return vector_of<simde__m512>(y);
}

inline simde__m128i cvtepi32_epi8(simde__m512i a) {
  int32_t x[16];
  int8_t y[16];
  lanes(a, x);
  for (int i = 0; i < 16; ++i) y[i] = int8_t(x[i]);  // truncation, as vpmovdb
  return vector_of<simde__m128i>(y);
}

inline simde__m512i cvtepu8_epi16(simde__m256i a) {
  uint8_t x[32];
  uint16_t y[32];
  lanes(a, x);
  for (int i = 0; i < 32; ++i) y[i] = x[i];
  return vector_of<simde__m512i>(y);
}

inline uint16_t cmpeq_epi16_mask(simde__m256i a, simde__m256i b) {
  int16_t x[16], y[16];
  lanes(a, x);
  lanes(b, y);
  uint16_t mask = 0;
  for (int i = 0; i < 16; ++i) mask |= uint16_t(x[i] == y[i]) << i;
  return mask;
}

inline uint16_t test_epi8_mask(simde__m128i a, simde__m128i b) {
  uint8_t x[16], y[16];
  lanes(a, x);
  lanes(b, y);
  uint16_t mask = 0;
  for (int i = 0; i < 16; ++i) mask |= uint16_t((x[i] & y[i]) != 0) << i;
  return mask;
}

// kBytes bytes, those the mask names (the 128- and 256-bit masked byte loads).
template <typename Vector, int kBytes>
inline Vector maskz_loadu_bytes(uint32_t mask, const void* p) {
  uint8_t y[kBytes] = {};
  for (int i = 0; i < kBytes; ++i)
    if (mask >> i & 1) y[i] = static_cast<const uint8_t*>(p)[i];
  return vector_of<Vector>(y);
}

inline simde__m512i cvtepu8_epi32(simde__m128i a) {
  uint8_t x[16];
  uint32_t y[16];
  lanes(a, x);
  for (int i = 0; i < 16; ++i) y[i] = x[i];
  return vector_of<simde__m512i>(y);
}

inline simde__m512i maskz_loadu_epi16(uint32_t mask, const void* p) {
  uint16_t y[32] = {};
  for (int i = 0; i < 32; ++i)
    if (mask >> i & 1) std::memcpy(&y[i], static_cast<const uint8_t*>(p) + 2 * i, 2);
  return vector_of<simde__m512i>(y);
}

// Writes only the lanes the mask names (SIMDe 0.8.2's writes zeros to the others).
inline void mask_storeu_epi16(void* p, uint32_t mask, simde__m512i a) {
  uint16_t x[32];
  lanes(a, x);
  for (int i = 0; i < 32; ++i)
    if (mask >> i & 1) std::memcpy(static_cast<uint8_t*>(p) + 2 * i, &x[i], 2);
}

inline void mask_storeu_ps_128(void* p, uint8_t mask, simde__m128 a) {
  float x[4];
  lanes(a, x);
  for (int i = 0; i < 4; ++i)
    if (mask >> i & 1) std::memcpy(static_cast<uint8_t*>(p) + 4 * i, &x[i], 4);
}

inline simde__m256i cvtps_ph(simde__m512 a, int rounding) {
  float x[16];
  lanes(a, x);
  uint16_t y[16];
  for (int i = 0; i < 16; ++i) y[i] = _cvtss_sh(x[i], 0);  // round to nearest even, as the kernels ask
  (void)rounding;
  return vector_of<simde__m256i>(y);
}

}  // namespace te_kernels::simde_extra

#define _mm512_reduce_add_ps(a) ::te_kernels::simde_extra::reduce_add_ps(a)
#define _mm512_permute_ps(a, control) ::te_kernels::simde_extra::permute_ps(a, control)
#define _mm512_cvtepi32_epi8(a) ::te_kernels::simde_extra::cvtepi32_epi8(a)
#define _mm512_cvtepu8_epi16(a) ::te_kernels::simde_extra::cvtepu8_epi16(a)
#define _mm256_cmpeq_epi16_mask(a, b) ::te_kernels::simde_extra::cmpeq_epi16_mask(a, b)
#define _mm_test_epi8_mask(a, b) ::te_kernels::simde_extra::test_epi8_mask(a, b)
#define _mm256_maskz_loadu_epi8(mask, p) ::te_kernels::simde_extra::maskz_loadu_bytes<simde__m256i, 32>(mask, p)
#define _mm_maskz_loadu_epi8(mask, p) ::te_kernels::simde_extra::maskz_loadu_bytes<simde__m128i, 16>(mask, p)
#define _mm512_cvtepu8_epi32(a) ::te_kernels::simde_extra::cvtepu8_epi32(a)
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16(mask, p) ::te_kernels::simde_extra::maskz_loadu_epi16(mask, p)
#undef _mm512_mask_storeu_epi16
#define _mm512_mask_storeu_epi16(p, mask, a) ::te_kernels::simde_extra::mask_storeu_epi16(p, mask, a)
#define _mm_mask_storeu_ps(p, mask, a) ::te_kernels::simde_extra::mask_storeu_ps_128(p, mask, a)
#define _mm512_cvtps_ph(a, rounding) ::te_kernels::simde_extra::cvtps_ph(a, rounding)
#define _mm512_stream_ps(p, a) simde_mm512_storeu_ps(p, a)  // no cache hint to emulate
#define _mm512_stream_si512(p, a) simde_mm512_storeu_si512(p, a)
