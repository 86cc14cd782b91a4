// Nvfp4Lanes (nvfp4_lanes.h) for the avx512 tier: a block is one ZMM register of 16 fp32 lanes.
#pragma once

#include <immintrin.h>

#include "cpu/nvfp4/nvfp4_lanes.h"
#include "cpu/nvfp4/nvfp4_transpose_x86.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

template <>
struct Nvfp4Lanes<VecAvx512> {
  static constexpr int kPerBlock = 1;
  static constexpr int kVectors = 16;

  // The 16 registers' maxima of |x|, register b's in lane b: NaN lanes become 0 first (vmaxps
  // returns its second operand when either is NaN), then four rounds each halve the lanes per
  // register while doubling the registers per vector (shuffles of 256-bit halves, 128-bit
  // blocks, then lane pairs within blocks), and one permutation puts the sources in order.
  static VecAvx512 block_amaxes(const VecAvx512* x) {
    __m512 m[16];
    for (int b = 0; b < 16; ++b) m[b] = _mm512_max_ps(_mm512_abs_ps(x[b].v), _mm512_setzero_ps());
    for (int b = 0; b < 8; ++b) {  // lanes 0-7: register b's 8 partial maxima, lanes 8-15: register b + 8's
      m[b] = _mm512_max_ps(_mm512_shuffle_f32x4(m[b], m[b + 8], 0x44), _mm512_shuffle_f32x4(m[b], m[b + 8], 0xEE));
    }
    for (int b = 0; b < 4; ++b) {  // 128-bit blocks of 4 partials: registers b, b + 8, b + 4, b + 12
      m[b] = _mm512_max_ps(_mm512_shuffle_f32x4(m[b], m[b + 4], 0x88), _mm512_shuffle_f32x4(m[b], m[b + 4], 0xDD));
    }
    for (int b = 0; b < 2; ++b) {  // pairs within each block: m[b]'s source, then m[b + 2]'s
      m[b] = _mm512_max_ps(_mm512_shuffle_ps(m[b], m[b + 2], 0x44), _mm512_shuffle_ps(m[b], m[b + 2], 0xEE));
    }
    const __m512 last = _mm512_max_ps(_mm512_shuffle_ps(m[0], m[1], 0x88), _mm512_shuffle_ps(m[0], m[1], 0xDD));
    // Lane L now holds register {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15}[L]'s maximum.
    const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return {_mm512_permutexvar_ps(order, last)};
  }

  // The 16 block amaxes of 256 bf16 values from their bits (bf16_magnitude_key), 32 per
  // register, vpmaxsw skipping NaN. Register k holds blocks 2k and 2k + 1; four rounds each
  // halve the words per block while doubling the blocks per register (128-bit blocks, 64-bit
  // halves, 32-bit pairs, the two words of a pair), and the maxima, back to fp32 (bits - 0x7F,
  // shifted up), are put in order. Not inlined: inlined into the 16 x 16 cast's loop over a
  // strip's rows it made that cast about 20% slower (GCC 12, Zen 4).
  static __attribute__((noinline)) VecAvx512 raw_block_amaxes(const bf16_t* p) {
    __m512i w[8];
    for (int k = 0; k < 8; ++k) {
      const __m512i bits = _mm512_loadu_si512(p + 32 * k);
      w[k] = _mm512_add_epi16(_mm512_and_si512(bits, _mm512_set1_epi16(0x7FFF)), _mm512_set1_epi16(0x7F));
    }
    for (int k = 0; k < 4; ++k) {  // 128-bit blocks: blocks 2k, 2k + 1, 2k + 8, 2k + 9
      w[k] = _mm512_max_epi16(_mm512_shuffle_i32x4(w[k], w[k + 4], 0x88), _mm512_shuffle_i32x4(w[k], w[k + 4], 0xDD));
    }
    for (int k = 0; k < 2; ++k) {  // 64-bit halves of each 128-bit block: w[k]'s block, then w[k + 2]'s
      w[k] = _mm512_max_epi16(_mm512_unpacklo_epi64(w[k], w[k + 2]), _mm512_unpackhi_epi64(w[k], w[k + 2]));
    }
    const __m512 a = _mm512_castsi512_ps(w[0]), b = _mm512_castsi512_ps(w[1]);
    __m512i pairs = _mm512_max_epi16(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                                     _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xDD)));
    pairs = _mm512_max_epi16(pairs, _mm512_srli_epi32(pairs, 16));  // each 32-bit lane's low word: its block's
    // At least 0's key: a block of NaNs alone has the amax 0 (as bf16_amax starts from it).
    pairs = _mm512_max_epi16(pairs, _mm512_set1_epi16(0x7F));
    const __m512i amax = _mm512_sub_epi32(_mm512_slli_epi32(pairs, 16), _mm512_set1_epi32(0x7F << 16));
    // Lane L holds block {0, 4, 2, 6, 1, 5, 3, 7, 8, 12, 10, 14, 9, 13, 11, 15}[L]'s maximum.
    const __m512i order = _mm512_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7, 8, 12, 10, 14, 9, 13, 11, 15);
    return {_mm512_castsi512_ps(_mm512_permutexvar_epi32(order, amax))};
  }

  // E2M1 codes as int32 lanes (sign in bit 3). The magnitude m, clamped to [1/8, 6] (NaN:
  // 1/8; everything below 1/4 is code 0), is rounded to the E2M1 grid by one fp32 addition, as
  // fp8_offset_codes.h does for FP8: c = 2^22, 2^23, 2^24 for m below 2, in [2, 4), from 4 on
  // has an ulp of exactly one step there (0.5, 1, 2), so m + c rounds m to its step, ties to
  // even, and the sum's low mantissa bits count the steps n. c carries the code of its first
  // step (0, 2, 4: even, so the ties still go to the even n) in its own mantissa, so those
  // bits are the code. c is looked up by m's binade (124 to 129: its low 4 bits tell them apart).
  static __m512i codes(__m512 v) {
    // vrangeps: max(|v|, 1/8), and 1/8 for NaN (a QNaN operand yields the other one; v, a
    // product, is never a signalling NaN); then at most 6, as integers (positive floats order
    // as their bits do), off the floating-point adders that the rest keeps busy.
    const __m512i magnitude = _mm512_castps_si512(_mm512_range_ps(v, _mm512_set1_ps(0.125f), 0x0B));
    const __m512 m = _mm512_castsi512_ps(_mm512_min_epi32(magnitude, _mm512_set1_epi32(0x40C00000)));  // 6.0f
    const int below = 149 << 23, two = (150 << 23) + 2, four = (151 << 23) + 4;
    const __m512i c = _mm512_permutexvar_epi32(_mm512_srli_epi32(_mm512_castps_si512(m), 23),
                                               _mm512_setr_epi32(two, four, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, below,
                                                                 below, below, below));
    const __m512i code = _mm512_and_si512(_mm512_castps_si512(_mm512_add_ps(m, _mm512_castsi512_ps(c))),
                                          _mm512_set1_epi32(7));
    const __mmask16 negative = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);  // not -0, not NaN
    return _mm512_mask_or_epi32(code, negative, code, _mm512_set1_epi32(8));
  }

  // Eight registers' codes packed into 64 bytes, 16-bit piece w of the result taken from piece
  // order[w] of the packs: the saturating packs narrow the codes to bytes (in each 128-bit
  // block: four consecutive codes of each register in turn, so adjacent bytes are still an even
  // and an odd column), vpmaddubsw joins each pair as even + 16 odd, one more pack narrows
  // those, and a 16-bit permutation puts the four-code pieces in order: piece 8 k + j of the
  // pack is register j's 128-bit block k.
  static __m512i packed_codes(const __m512i* codes, __m512i order) {
    __m512i bytes[2];
    for (int h = 0; h < 2; ++h) {
      const __m512i* q = codes + 4 * h;
      const __m512i ab = _mm512_packus_epi32(q[0], q[1]), cd = _mm512_packus_epi32(q[2], q[3]);
      bytes[h] = _mm512_maddubs_epi16(_mm512_packus_epi16(ab, cd), _mm512_set1_epi16(0x1001));
    }
    return _mm512_permutexvar_epi16(order, _mm512_packus_epi16(bytes[0], bytes[1]));
  }

  // The codes of 16 registers in column order (int32 lanes), packed: 128 bytes.
  static void put_code_lanes(const __m512i* c, uint8_t* out) {
    // Register j's block k (its codes 4 k .. 4 k + 3) is wanted at piece 4 j + k.
    const __m512i order = _mm512_set_epi16(31, 23, 15, 7, 30, 22, 14, 6, 29, 21, 13, 5, 28, 20, 12, 4,
                                           27, 19, 11, 3, 26, 18, 10, 2, 25, 17, 9, 1, 24, 16, 8, 0);
    for (int h = 0; h < 2; ++h) _mm512_storeu_si512(out + 64 * h, packed_codes(c + 8 * h, order));
  }

  static void put_codes(const VecAvx512* v, uint8_t* out) {
    __m512i c[16];
    for (int j = 0; j < 16; ++j) c[j] = codes(v[j].v);
    put_code_lanes(c, out);
  }

  // The stochastic codes of a group (Nvfp4Lanes::put_stochastic_codes), Philox in registers:
  // one run of 16 counters, lane n block n's. The dword and qword unpacks of its four words (a
  // 4 x 4 transpose within each 128-bit block) leave 128-bit block q of blocks[m] holding the
  // four words of block 4 q + m in order: its 16 draws as bytes, widened to its register's.
  static void put_stochastic_codes(const VecAvx512* v, const Nvfp4Draws& d, uint8_t* out) {
    PhiloxKeys keys;
    for (int round = 0; round < kPhiloxRounds; ++round) {
      keys.k[0][round] = _mm512_set1_epi32(int(uint32_t(d.seed) + uint32_t(round) * kPhiloxW0));
      keys.k[1][round] = _mm512_set1_epi32(int(uint32_t(d.seed >> 32) + uint32_t(round) * kPhiloxW1));
    }
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i w[4];
    philox(_mm512_add_epi32(_mm512_set1_epi32(int(d.counter)), lane), d, keys, w);
    const __m512i w01_low = _mm512_unpacklo_epi32(w[0], w[1]), w01_high = _mm512_unpackhi_epi32(w[0], w[1]);
    const __m512i w23_low = _mm512_unpacklo_epi32(w[2], w[3]), w23_high = _mm512_unpackhi_epi32(w[2], w[3]);
    alignas(64) uint8_t draws[4][64];
    _mm512_store_si512(draws[0], _mm512_unpacklo_epi64(w01_low, w23_low));
    _mm512_store_si512(draws[1], _mm512_unpackhi_epi64(w01_low, w23_low));
    _mm512_store_si512(draws[2], _mm512_unpacklo_epi64(w01_high, w23_high));
    _mm512_store_si512(draws[3], _mm512_unpackhi_epi64(w01_high, w23_high));
    __m512i c[16];
    for (int n = 0; n < 16; ++n) {
      const __m128i bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(draws[n % 4] + 16 * (n / 4)));
      c[n] = stochastic_codes(v[n].v, _mm512_cvtepu8_epi32(bytes));
    }
    put_code_lanes(c, out);
  }

  // The codes of a group of bf16 values straight from memory, each block times encode[block]:
  // each 64-byte load of 32 values (blocks 2 i and 2 i + 1) is widened by two word unpacks
  // with zero, one register holding values {0-3, 8-11 | 16-19, 24-27} of them, the other
  // {4-7, 12-15 | 20-23, 28-31}, so both take block 2 i's factor in their low half and block
  // 2 i + 1's in the high one; the packing's permutation puts the pieces back in order.
  static void put_bf16_codes(const bf16_t* p, const float* encode, uint8_t* out) {
    // Register j (of chunk j / 2, low or high unpack) block k is wanted at piece
    // 8 (j / 2) + 2 k + j % 2.
    const __m512i order = _mm512_set_epi16(31, 30, 23, 22, 15, 14, 7, 6, 29, 28, 21, 20, 13, 12, 5, 4,
                                           27, 26, 19, 18, 11, 10, 3, 2, 25, 24, 17, 16, 9, 8, 1, 0);
    for (int h = 0; h < 2; ++h) {
      __m512i c[8];
      for (int i = 0; i < 4; ++i) {
        const int chunk = 4 * h + i;
        const __m512i bits = _mm512_loadu_si512(p + 32 * chunk);
        const __m512 factor = _mm512_mask_broadcastss_ps(_mm512_set1_ps(encode[2 * chunk]), 0xFF00,
                                                         _mm_load_ss(encode + 2 * chunk + 1));
        const __m512 low = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), bits));
        const __m512 high = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), bits));
        c[2 * i] = codes(_mm512_mul_ps(low, factor));
        c[2 * i + 1] = codes(_mm512_mul_ps(high, factor));
      }
      _mm512_storeu_si512(out + 64 * h, packed_codes(c, order));
    }
  }

  // 16 codes from 8 bytes: the nibbles interleaved into bytes, widened, looked up in a
  // register holding the 16 values (code 8 is -0).
  static VecAvx512 values(const uint8_t* packed) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed));
    const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    const __m512i code = _mm512_cvtepu16_epi32(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(low, high)));
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                        -2.0f, -3.0f, -4.0f, -6.0f);
    return {_mm512_permutexvar_ps(code, table)};
  }

  // A 16 x 16 tile transposed (Nvfp4Lanes::transpose_tile) on YMM registers (nvfp4_transpose_x86.h).
  template <typename T>
  static void transpose_tile(const T* src, int64_t src_stride, T* dst, int64_t dst_stride) {
    transpose_tile_x86(src, src_stride, dst, dst_stride);
  }

  // The transform of one block in its register: signs, then for each stride s the partner p
  // (lane i ^ s): a lane whose bit s is clear becomes itself + p (a + b), one whose bit is set
  // p - itself (a - b); times 1/4.
  static void rht(VecAvx512* block) {
    __m512 y = _mm512_mul_ps(block->v, _mm512_loadu_ps(kRhtSigns));
    y = butterfly(y, _mm512_permute_ps(y, 0xB1), 0xAAAA);
    y = butterfly(y, _mm512_permute_ps(y, 0x4E), 0xCCCC);
    y = butterfly(y, _mm512_shuffle_f32x4(y, y, 0xB1), 0xF0F0);
    y = butterfly(y, _mm512_shuffle_f32x4(y, y, 0x4E), 0xFF00);
    block->v = _mm512_mul_ps(y, _mm512_set1_ps(0.25f));
  }

 private:
  // The round keys of Philox4x32-10, broadcast: k[0] the key's low word's, k[1] its high word's.
  struct PhiloxKeys {
    __m512i k[2][kPhiloxRounds];
  };

  // Philox4x32-10 (te_kernels/philox.h) of 16 counters c0 (c1, c2, c3: d's row and offset
  // words), their output words to w. The even lanes and the odd ones run apart, each lane's
  // words in the low halves of 64-bit lanes, where vpmuludq takes them: the high half of each
  // product, shifted down, is the next word as it is, its low half the word after (its high
  // half does not matter: vpmuludq and the unpacks read only low halves).
  static void philox(__m512i c0, const Nvfp4Draws& d, const PhiloxKeys& keys, __m512i (&w)[4]) {
    const __m512i m0 = _mm512_set1_epi32(int(kPhiloxM0)), m1 = _mm512_set1_epi32(int(kPhiloxM1));
    __m512i x[2][4];  // [even lanes, odd lanes][word]
    x[0][0] = c0;
    x[1][0] = _mm512_srli_epi64(c0, 32);
    for (int h = 0; h < 2; ++h) {
      x[h][1] = _mm512_set1_epi32(int(d.row));
      x[h][2] = _mm512_set1_epi32(int(d.offset_low));
      x[h][3] = _mm512_set1_epi32(int(d.offset_high));
    }
    for (int round = 0; round < kPhiloxRounds; ++round) {
      for (int h = 0; h < 2; ++h) {
        const __m512i p0 = _mm512_mul_epu32(x[h][0], m0), p1 = _mm512_mul_epu32(x[h][2], m1);
        x[h][0] = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p1, 32), x[h][1], keys.k[0][round], 0x96);  // a^b^c
        x[h][1] = p1;
        x[h][2] = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0, 32), x[h][3], keys.k[1][round], 0x96);
        x[h][3] = p0;
      }
    }
    for (int k = 0; k < 4; ++k) w[k] = _mm512_mask_blend_epi32(0xAAAA, x[0][k], _mm512_slli_epi64(x[1][k], 32));
  }

  // e2m1_code_stochastic of v's lanes with their draws (bytes in int32 lanes), as int32 codes. With m =
  // min(|v|, 6) (NaN 0) and the step s = 0.5, 1, 2 below 2, below 4, from 4 on (looked up by
  // m's binade, all below 2 as 127), m / s is exact (s a power of two), its integer part n plus
  // 0, 2, 4 is the code of the grid point lo at or below m, and its fraction m / s - n is the
  // reference's (m - lo) / (hi - lo) exactly (at 6: n 3, fraction 0, the code 7 the reference
  // reaches by always going up). The draw's uniform (draw + 1/2) / 256 is below that fraction
  // iff draw + 1/2 is below fraction * 256 (both exact in fp32). m / s being exact, an FMA
  // contraction of it into the fraction's subtraction would change nothing.
  static __m512i stochastic_codes(__m512 v, __m512i draw) {
    // vrangeps: max(|v|, 0), and 0 for NaN (see codes).
    const __m512 m = _mm512_min_ps(_mm512_range_ps(v, _mm512_setzero_ps(), 0x0B), _mm512_set1_ps(kE2m1Max));
    const __m512i binade = _mm512_max_epi32(_mm512_srli_epi32(_mm512_castps_si512(m), 23), _mm512_set1_epi32(127));
    // Indexed by the binade's low 4 bits: 128 (from 2), 129 (from 4), 127 (below 2).
    const __m512 per_step = _mm512_permutexvar_ps(
        binade, _mm512_setr_ps(1.0f, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2.0f));
    const __m512i first = _mm512_permutexvar_epi32(binade, _mm512_setr_epi32(2, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                             0, 0));
    const __m512 steps = _mm512_mul_ps(m, per_step);
    const __m512i whole = _mm512_cvttps_epi32(steps);
    const __m512 fraction = _mm512_sub_ps(steps, _mm512_cvtepi32_ps(whole));
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_add_ps(_mm512_cvtepi32_ps(draw), _mm512_set1_ps(0.5f)),
                                            _mm512_mul_ps(fraction, _mm512_set1_ps(256.0f)), _CMP_LT_OQ);
    __m512i code = _mm512_add_epi32(whole, first);
    code = _mm512_mask_add_epi32(code, up, code, _mm512_set1_epi32(1));
    const __mmask16 negative = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);  // not -0, not NaN
    return _mm512_mask_or_epi32(code, negative, code, _mm512_set1_epi32(8));
  }

  static __m512 butterfly(__m512 y, __m512 partner, __mmask16 upper) {
    return _mm512_mask_blend_ps(upper, _mm512_add_ps(y, partner), _mm512_sub_ps(partner, y));
  }
};

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
