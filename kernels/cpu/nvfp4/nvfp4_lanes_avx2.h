// Nvfp4Lanes (nvfp4_lanes.h) for the avx2 tier: a block is two YMM registers of 8 fp32 lanes
// (values 0-7, then 8-15); the rounding and packing follow nvfp4_lanes_avx512.h.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "cpu/nvfp4/nvfp4_lanes.h"
#include "cpu/nvfp4/nvfp4_transpose_x86.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

template <>
struct Nvfp4Lanes<VecAvx2> {
  static constexpr int kPerBlock = 2;
  static constexpr int kVectors = 16;

  // The 8 blocks' maxima of |x|, block b's in lane b: NaN lanes become 0 first (vmaxps returns
  // its second operand when either is NaN), each block's two registers are joined, then three
  // rounds halve the lanes per register while doubling the registers per vector, and one
  // permutation puts the blocks in order.
  static VecAvx2 block_amaxes(const VecAvx2* x) {
    __m256 m[8];
    for (int b = 0; b < 8; ++b) m[b] = _mm256_max_ps(magnitude(x[2 * b].v), magnitude(x[2 * b + 1].v));
    for (int b = 0; b < 4; ++b) {  // lanes 0-3: block b's partial maxima, lanes 4-7: block b + 4's
      m[b] = _mm256_max_ps(_mm256_permute2f128_ps(m[b], m[b + 4], 0x20), _mm256_permute2f128_ps(m[b], m[b + 4], 0x31));
    }
    for (int b = 0; b < 2; ++b) {  // pairs within each half: m[b]'s block, then m[b + 2]'s
      m[b] = _mm256_max_ps(_mm256_shuffle_ps(m[b], m[b + 2], 0x44), _mm256_shuffle_ps(m[b], m[b + 2], 0xEE));
    }
    const __m256 last = _mm256_max_ps(_mm256_shuffle_ps(m[0], m[1], 0x88), _mm256_shuffle_ps(m[0], m[1], 0xDD));
    // Lane L now holds block {0, 2, 1, 3, 4, 6, 5, 7}[L]'s maximum.
    return {_mm256_permutevar8x32_ps(last, _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7))};
  }

  // The 8 block amaxes of 128 bf16 values from their bits (bf16_magnitude_key), one block
  // per register, vpmaxsw skipping NaN; three rounds each halve the words per block while
  // doubling the blocks per register (128-bit halves, 64-bit halves, 32-bit pairs), then the
  // two words of each pair, and the maxima, back to fp32, are put in order.
  static VecAvx2 raw_block_amaxes(const bf16_t* p) {
    __m256i w[8];
    for (int k = 0; k < 8; ++k) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
      w[k] = _mm256_add_epi16(_mm256_and_si256(bits, _mm256_set1_epi16(0x7FFF)), _mm256_set1_epi16(0x7F));
    }
    for (int k = 0; k < 4; ++k) {  // 128-bit halves: block k, then block k + 4
      w[k] = _mm256_max_epi16(_mm256_permute2x128_si256(w[k], w[k + 4], 0x20),
                              _mm256_permute2x128_si256(w[k], w[k + 4], 0x31));
    }
    for (int k = 0; k < 2; ++k) {  // 64-bit halves of each 128-bit half: w[k]'s block, then w[k + 2]'s
      w[k] = _mm256_max_epi16(_mm256_unpacklo_epi64(w[k], w[k + 2]), _mm256_unpackhi_epi64(w[k], w[k + 2]));
    }
    const __m256 a = _mm256_castsi256_ps(w[0]), b = _mm256_castsi256_ps(w[1]);
    __m256i pairs = _mm256_max_epi16(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)),
                                     _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)));
    pairs = _mm256_max_epi16(pairs, _mm256_srli_epi32(pairs, 16));  // each 32-bit lane's low word: its block's
    // At least 0's key: a block of NaNs alone has the amax 0 (as bf16_amax starts from it).
    pairs = _mm256_max_epi16(pairs, _mm256_set1_epi16(0x7F));
    const __m256i amax = _mm256_sub_epi32(_mm256_slli_epi32(pairs, 16), _mm256_set1_epi32(0x7F << 16));
    // Lane L holds block {0, 2, 1, 3, 4, 6, 5, 7}[L]'s maximum.
    return {_mm256_castsi256_ps(_mm256_permutevar8x32_epi32(amax, _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7)))};
  }

  // E2M1 codes as int32 lanes, by nvfp4_lanes_avx512.h's one fp32 addition (here the low 3
  // bits of binades 124 .. 129 tell them apart).
  static __m256i codes(__m256 v) {
    const __m256 m = _mm256_min_ps(_mm256_max_ps(magnitude_bits(v), _mm256_set1_ps(0.125f)), _mm256_set1_ps(6.0f));
    const int below = 149 << 23, two = (150 << 23) + 2, four = (151 << 23) + 4;
    const __m256i c = _mm256_permutevar8x32_epi32(_mm256_setr_epi32(two, four, 0, 0, below, below, below, below),
                                                  _mm256_srli_epi32(_mm256_castps_si256(m), 23));
    const __m256i code = _mm256_and_si256(_mm256_castps_si256(_mm256_add_ps(m, _mm256_castsi256_ps(c))),
                                          _mm256_set1_epi32(7));
    const __m256 negative = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);  // not -0, not NaN
    return _mm256_or_si256(code, _mm256_and_si256(_mm256_castps_si256(negative), _mm256_set1_epi32(8)));
  }

  // Eight registers' codes (int32 lanes, column order) packed: 32 bytes. As in the avx512
  // tier, the packs keep four consecutive codes of each register together per 128-bit half
  // and vpmaddubsw joins each pair; then word j of the low half (register j's codes 0-3) and
  // word j of the high half (its codes 4-7) are interleaved.
  static void put_packed_codes(const __m256i* c, uint8_t* out) {
    __m256i bytes[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i* q = c + 4 * h;
      const __m256i ab = _mm256_packus_epi32(q[0], q[1]), cd = _mm256_packus_epi32(q[2], q[3]);
      bytes[h] = _mm256_maddubs_epi16(_mm256_packus_epi16(ab, cd), _mm256_set1_epi16(0x1001));
    }
    const __m256i packed = _mm256_packus_epi16(bytes[0], bytes[1]);
    const __m128i low = _mm256_castsi256_si128(packed), high = _mm256_extracti128_si256(packed, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi16(low, high));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm_unpackhi_epi16(low, high));
  }

  static void put_codes(const VecAvx2* v, uint8_t* out) {
    __m256i c[16];
    for (int j = 0; j < 16; ++j) c[j] = codes(v[j].v);
    put_packed_codes(c, out);
    put_packed_codes(c + 8, out + 32);
  }

  // The stochastic codes of a group (Nvfp4Lanes::put_stochastic_codes), Philox in registers:
  // one run of 8 counters, lane n block n's. The dword and qword unpacks of its four words (a
  // 4 x 4 transpose within each 128-bit half) leave half h of blocks[m] holding the four words
  // of block 4 h + m in order: its 16 draws as bytes, whose two 8-byte halves widen to the
  // draws of the block's two registers.
  static void put_stochastic_codes(const VecAvx2* v, const Nvfp4Draws& d, uint8_t* out) {
    __m256i w[4];
    philox(_mm256_add_epi32(_mm256_set1_epi32(int(d.counter)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), d, w);
    const __m256i w01_low = _mm256_unpacklo_epi32(w[0], w[1]), w01_high = _mm256_unpackhi_epi32(w[0], w[1]);
    const __m256i w23_low = _mm256_unpacklo_epi32(w[2], w[3]), w23_high = _mm256_unpackhi_epi32(w[2], w[3]);
    const __m256i blocks[4] = {_mm256_unpacklo_epi64(w01_low, w23_low), _mm256_unpackhi_epi64(w01_low, w23_low),
                               _mm256_unpacklo_epi64(w01_high, w23_high), _mm256_unpackhi_epi64(w01_high, w23_high)};
    __m256i c[16];
    for (int n = 0; n < 8; ++n) {
      const __m128i draws = n < 4 ? _mm256_castsi256_si128(blocks[n]) : _mm256_extracti128_si256(blocks[n - 4], 1);
      c[2 * n] = stochastic_codes(v[2 * n].v, _mm256_cvtepu8_epi32(draws));
      c[2 * n + 1] = stochastic_codes(v[2 * n + 1].v, _mm256_cvtepu8_epi32(_mm_srli_si128(draws, 8)));
    }
    put_packed_codes(c, out);
    put_packed_codes(c + 8, out + 32);
  }

  static void put_bf16_codes(const bf16_t* p, const float* encode, uint8_t* out) {
    put_scaled_codes<VecAvx2, Nvfp4Lanes>(p, encode, out);
  }

  // 8 codes from 4 bytes: the nibbles interleaved into bytes and widened; the magnitude looked
  // up in a register of the 8 values, bit 3 moved to the sign (code 8 is -0).
  static VecAvx2 values(const uint8_t* packed) {
    int32_t four;
    std::memcpy(&four, packed, sizeof(four));
    const __m128i bytes = _mm_cvtsi32_si128(four);
    const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    const __m256i code = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(low, high));
    const __m256 table = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(code, 28), _mm256_set1_epi32(int32_t(0x80000000u)));
    return {_mm256_or_ps(_mm256_permutevar8x32_ps(table, code), _mm256_castsi256_ps(sign))};
  }

  // A 16 x 16 tile transposed (Nvfp4Lanes::transpose_tile) on YMM registers (nvfp4_transpose_x86.h).
  template <typename T>
  static void transpose_tile(const T* src, int64_t src_stride, T* dst, int64_t dst_stride) {
    transpose_tile_x86(src, src_stride, dst, dst_stride);
  }

  // The transform of one block: signs; strides 1, 2, 4 within each register (the partner p is
  // lane i ^ s: a lane whose bit s is clear becomes itself + p, one whose bit is set p - itself);
  // stride 8 between the two registers; times 1/4.
  static void rht(VecAvx2* block) {
    __m256 y[2];
    for (int h = 0; h < 2; ++h) {
      y[h] = _mm256_mul_ps(block[h].v, _mm256_loadu_ps(kRhtSigns + 8 * h));
      y[h] = _mm256_blend_ps(_mm256_add_ps(y[h], swap_1(y[h])), _mm256_sub_ps(swap_1(y[h]), y[h]), 0xAA);
      y[h] = _mm256_blend_ps(_mm256_add_ps(y[h], swap_2(y[h])), _mm256_sub_ps(swap_2(y[h]), y[h]), 0xCC);
      y[h] = _mm256_blend_ps(_mm256_add_ps(y[h], swap_4(y[h])), _mm256_sub_ps(swap_4(y[h]), y[h]), 0xF0);
    }
    const __m256 quarter = _mm256_set1_ps(0.25f);
    block[0].v = _mm256_mul_ps(_mm256_add_ps(y[0], y[1]), quarter);
    block[1].v = _mm256_mul_ps(_mm256_sub_ps(y[0], y[1]), quarter);
  }

 private:
  // Philox4x32-10 of 8 counters c0, even and odd lanes apart, as the avx512 tier's philox.
  static void philox(__m256i c0, const Nvfp4Draws& d, __m256i (&w)[4]) {
    const __m256i m0 = _mm256_set1_epi32(int(kPhiloxM0)), m1 = _mm256_set1_epi32(int(kPhiloxM1));
    __m256i x[2][4];  // [even lanes, odd lanes][word]
    x[0][0] = c0;
    x[1][0] = _mm256_srli_epi64(c0, 32);
    for (int h = 0; h < 2; ++h) {
      x[h][1] = _mm256_set1_epi32(int(d.row));
      x[h][2] = _mm256_set1_epi32(int(d.offset_low));
      x[h][3] = _mm256_set1_epi32(int(d.offset_high));
    }
    uint32_t k0 = uint32_t(d.seed), k1 = uint32_t(d.seed >> 32);
    for (int round = 0; round < kPhiloxRounds; ++round) {
      const __m256i key0 = _mm256_set1_epi32(int(k0)), key1 = _mm256_set1_epi32(int(k1));
      for (int h = 0; h < 2; ++h) {
        const __m256i p0 = _mm256_mul_epu32(x[h][0], m0), p1 = _mm256_mul_epu32(x[h][2], m1);
        x[h][0] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), x[h][1]), key0);
        x[h][1] = p1;
        x[h][2] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), x[h][3]), key1);
        x[h][3] = p0;
      }
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    for (int k = 0; k < 4; ++k) w[k] = _mm256_blend_epi32(x[0][k], _mm256_slli_epi64(x[1][k], 32), 0xAA);
  }

  // e2m1_code_stochastic of v's lanes with their draws (bytes in int32 lanes), as int32 codes:
  // the avx512 tier's steps (nvfp4_lanes_avx512.h), the binade's low 3 bits indexing the tables.
  static __m256i stochastic_codes(__m256 v, __m256i draw) {
    const __m256 m = _mm256_min_ps(magnitude(v), _mm256_set1_ps(kE2m1Max));
    const __m256i binade = _mm256_max_epi32(_mm256_srli_epi32(_mm256_castps_si256(m), 23), _mm256_set1_epi32(127));
    const __m256 per_step = _mm256_permutevar8x32_ps(_mm256_setr_ps(1.0f, 0.5f, 0, 0, 0, 0, 0, 2.0f), binade);
    const __m256i first = _mm256_permutevar8x32_epi32(_mm256_setr_epi32(2, 4, 0, 0, 0, 0, 0, 0), binade);
    const __m256 steps = _mm256_mul_ps(m, per_step);
    const __m256i whole = _mm256_cvttps_epi32(steps);
    const __m256 fraction = _mm256_sub_ps(steps, _mm256_cvtepi32_ps(whole));
    const __m256 up = _mm256_cmp_ps(_mm256_add_ps(_mm256_cvtepi32_ps(draw), _mm256_set1_ps(0.5f)),
                                    _mm256_mul_ps(fraction, _mm256_set1_ps(256.0f)), _CMP_LT_OQ);
    const __m256i code = _mm256_sub_epi32(_mm256_add_epi32(whole, first), _mm256_castps_si256(up));  // up: -1
    const __m256 negative = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);  // not -0, not NaN
    return _mm256_or_si256(code, _mm256_and_si256(_mm256_castps_si256(negative), _mm256_set1_epi32(8)));
  }

  static __m256 magnitude_bits(__m256 v) {
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  }
  // |v| with NaN lanes 0.
  static __m256 magnitude(__m256 v) { return _mm256_max_ps(magnitude_bits(v), _mm256_setzero_ps()); }
  static __m256 swap_1(__m256 y) { return _mm256_permute_ps(y, 0xB1); }
  static __m256 swap_2(__m256 y) { return _mm256_permute_ps(y, 0x4E); }
  static __m256 swap_4(__m256 y) { return _mm256_permute2f128_ps(y, y, 0x01); }
};

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
