// The NVFP4 steps the vector types lack (integer codes, nibble packing, lane shuffles), over a
// group of 16 vectors: V::kWidth blocks of 16 values, block b in vectors b * kPerBlock ..
// (b + 1) * kPerBlock - 1. This version works lane by lane through arrays, with the scalar
// definitions of te_kernels/nvfp4.h (the compiler vectorises the loops for the tier's
// target); the x86 tiers specialise it (nvfp4_lanes_avx2.h, nvfp4_lanes_avx512.h).
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including nvfp4_lanes.h"
#endif
#pragma once

#include <algorithm>
#include <cstdint>

#include "te_kernels/nvfp4.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// The fp32 butterflies of the random Hadamard transform of 16 values, in place: the signs,
// strides 1, 2, 4, 8 (a + b to the lower index, a - b to the upper), then times 1/4.
inline void rht16_lanes(float* y) {
  for (int i = 0; i < kNvfp4Block; ++i) y[i] *= kRhtSigns[i];
  for (int stride = 1; stride < kNvfp4Block; stride *= 2) {
    for (int i = 0; i < kNvfp4Block; ++i) {
      if (i & stride) continue;
      const float a = y[i], b = y[i + stride];
      y[i] = a + b;
      y[i + stride] = a - b;
    }
  }
  for (int i = 0; i < kNvfp4Block; ++i) y[i] *= 0.25f;
}

// A magnitude's bf16 bits plus 0x7F, as a signed 16-bit integer, order the magnitudes (inf is
// 0x7FFF) and put every NaN below them all (0x8000 on): the largest of those skips NaN.
inline int16_t bf16_magnitude_key(bf16_t x) { return int16_t(uint16_t((x.bits & 0x7FFF) + 0x7F)); }

// max |x| of n bf16 values, NaN skipped, on 16-bit integers: a loop the compiler vectorises
// for the tier's target (twice the values per instruction of widening them to fp32 first).
inline float bf16_amax(const bf16_t* p, int64_t n) {
  int16_t most = 0x7F;
  for (int64_t i = 0; i < n; ++i) most = std::max(most, bf16_magnitude_key(p[i]));
  return to_float(bf16_t{uint16_t(most - 0x7F)});
}

// The codes of a group of values at p, each block times encode[block], through the lanes'
// put_codes: put_bf16_codes where a tier has no fused load, scale and rounding of its own.
template <typename V, typename Lanes, typename T>
inline void put_scaled_codes(const T* p, const float* encode, uint8_t* out) {
  V v[Lanes::kVectors];
  for (int k = 0; k < Lanes::kVectors; ++k) {
    v[k] = V::load(p + k * V::kWidth) * V::broadcast(encode[k / Lanes::kPerBlock]);
  }
  Lanes::put_codes(v, out);
}

template <typename V>
struct Nvfp4Lanes {
  static constexpr int kWidth = V::kWidth;
  static constexpr int kPerBlock = int(kNvfp4Block) / kWidth;  // vectors per block
  static constexpr int kVectors = int(kNvfp4Block);            // vectors per group
  static_assert(kNvfp4Block % kWidth == 0, "a block is a whole number of vectors");

  // Block b's max |x| in lane b, NaN skipped (V::magnitude_max).
  static V block_amaxes(const V* x) {
    alignas(64) float amax[kWidth];
    for (int b = 0; b < kWidth; ++b) {
      V running = V::zero();
      for (int k = 0; k < kPerBlock; ++k) running = V::magnitude_max(running, x[b * kPerBlock + k]);
      amax[b] = running.reduce_magnitude_max();
    }
    return V::load(amax);
  }

  // block_amaxes of a group of bf16 values from their bits (bf16_amax), without widening
  // them to fp32.
  static V raw_block_amaxes(const bf16_t* p) {
    alignas(64) float amax[kWidth];
    for (int b = 0; b < kWidth; ++b) amax[b] = bf16_amax(p + b * kNvfp4Block, kNvfp4Block);
    return V::load(amax);
  }

  // The codes of the group's values v = x * encode (not yet clamped), nearest even, packed:
  // 8 * kWidth bytes.
  static void put_codes(const V* v, uint8_t* out) {
    alignas(64) float lanes[kVectors * kWidth];
    for (int k = 0; k < kVectors; ++k) v[k].store(lanes + k * kWidth);
    for (int i = 0; i < kVectors * kWidth / 2; ++i) {
      out[i] = uint8_t(e2m1_code(lanes[2 * i]) | e2m1_code(lanes[2 * i + 1]) << 4);
    }
  }

  // The nearest codes of a group of bf16 values at p, each block times encode[block].
  static void put_bf16_codes(const bf16_t* p, const float* encode, uint8_t* out) {
    put_scaled_codes<V, Nvfp4Lanes>(p, encode, out);
  }

  // The values of kWidth codes, packed in kWidth / 2 bytes.
  static V values(const uint8_t* packed) {
    alignas(64) float lanes[kWidth];
    for (int i = 0; i < kWidth; ++i) lanes[i] = e2m1_value(uint8_t(packed[i / 2] >> (4 * (i & 1)) & 0xF));
    return V::load(lanes);
  }

  // dst[c * dst_stride + r] = src[r * src_stride + c] for a 16 x 16 tile (r, c < 16): each
  // source row's run of 16 values read once, lane by lane.
  template <typename T>
  static void transpose_tile(const T* src, int64_t src_stride, T* dst, int64_t dst_stride) {
    for (int r = 0; r < kNvfp4Block; ++r) {
      for (int c = 0; c < kNvfp4Block; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
    }
  }

  // The transform of one block (kPerBlock vectors) in place, before its rounding to the input dtype.
  static void rht(V* block) {
    alignas(64) float lanes[kNvfp4Block];
    for (int k = 0; k < kPerBlock; ++k) block[k].store(lanes + k * kWidth);
    rht16_lanes(lanes);
    for (int k = 0; k < kPerBlock; ++k) block[k] = V::load(lanes + k * kWidth);
  }
};

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
