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
#include "te_kernels/philox.h"

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

// The Philox draws of a group's stochastic rounding: keyed by the seed, the counter (counter + n,
// row, offset low, offset high) for the group's n-th four values (its first at column 4 counter).
struct Nvfp4Draws {
  uint64_t seed;
  uint32_t counter, row, offset_low, offset_high;
};

// e2m1_code_stochastic of the lanes of v, with the draws' uniforms u (nvfp4_uniform),
// as float codes, in the same fp32 steps on the vectors: hi - lo is the step 0.5, 1, 2 below
// 2, below 4, from 4 on (where_less for the branches).
template <typename V>
inline V stochastic_code_values(V v, V u) {
  const V zero = V::zero(), half = V::broadcast(0.5f), one = V::broadcast(1.0f);
  const V two = V::broadcast(2.0f), four = V::broadcast(4.0f), six = V::broadcast(kE2m1Max);
  V m = V::magnitude_max(zero, v);  // |v|, NaN 0
  m = where_less(six, m, six, m);
  const V step = where_less(m, two, half, where_less(m, four, one, two));
  // lo: the grid point at or below m (4 for 6); its code 2 lo below 2, lo + 2 below 4, lo / 2 + 4.
  V lo = zero;
  for (const float point : {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f}) {
    lo = where_less(m, V::broadcast(point), lo, V::broadcast(point));
  }
  const V lo_code = where_less(lo, two, lo * two, where_less(lo, four, lo + two, lo * half + four));
  const V up = where_less(u, (m - lo) / step, one, zero);
  return lo_code + up + where_less(v, zero, V::broadcast(8.0f), zero);
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

  // The stochastic codes of the group's values v = x * encode (not yet clamped), packed: one
  // philox_lanes call for the group's kWidth blocks (counters d.counter .. + kWidth - 1), value e
  // of block n taking nvfp4_draw of counter d.counter + n's words.
  static void put_stochastic_codes(const V* v, const Nvfp4Draws& d, uint8_t* out) {
    alignas(64) uint32_t words[4][kWidth];
    for (int n = 0; n < kWidth; ++n) {
      words[0][n] = d.counter + uint32_t(n);
      words[1][n] = d.row;
      words[2][n] = d.offset_low;
      words[3][n] = d.offset_high;
    }
    philox_lanes<V>(words[0], words[1], words[2], words[3], d.seed);
    alignas(64) float uniform[kVectors * kWidth];
    for (int n = 0; n < kWidth; ++n) {
      const uint32_t block_words[4] = {words[0][n], words[1][n], words[2][n], words[3][n]};
      for (int e = 0; e < int(kNvfp4Block); ++e) {
        uniform[n * kNvfp4Block + e] = nvfp4_uniform(nvfp4_draw(block_words, e));
      }
    }
    alignas(64) float codes[kVectors * kWidth];
    for (int k = 0; k < kVectors; ++k) {
      stochastic_code_values(v[k], V::load(uniform + k * kWidth)).store(codes + k * kWidth);
    }
    for (int e = 0; e < kVectors * kWidth / 2; ++e) out[e] = uint8_t(int(codes[2 * e]) | int(codes[2 * e + 1]) << 4);
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
