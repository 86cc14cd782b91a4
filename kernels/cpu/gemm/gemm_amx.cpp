// The GEMM of gemm.h on AMX-BF16 tiles, for the amx tier: gemm_avx512.cpp calls it for more than
// 16 rows of a (fewer rows stay on the in-place dot products, where packing b would cost more
// than the GEMM). Built into te_kernels::cpu::avx512 beside that tier's kernels; the blocking,
// packing and fp32 epilogue are gemm_kernels.h's, shared with the other kernels.
//
// The micro-kernel holds a 32 x 32 block of fp32 sums in four tiles (tmm0-3) and, for every 32
// values of k, loads two tiles of a (16 rows x 32 bf16, tmm4-5) and two of b (16 pairs of k x
// 16 columns, tmm6-7) and issues four TDPBF16PS. Each bf16 product is exact in fp32 and the
// sums are fp32, as on the other tiers; the order differs. Measured on a Sapphire Rapids-class
// Xeon (tests/test_gemm.cpp bounds it, docs/fp8_numerics.md says more): one TDPBF16PS adds to
// each sum c the 32 products of its k block as c + (E + O), E the sum of the 16 products at
// even k in k order and O that of the odd ones, every addition rounded to nearest even. The
// dot-product tiers add each pair into the running sum instead, so the two agree to within
// fp32 summation error, not bit for bit.
#include "te_kernels/gemm.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx512.h"
#include "cpu/gemm/gemm_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include "cpu/gemm/fp8_to_bf16_avx512.h"

// Only AmxKernel uses the tiles; gemm_avx512.cpp calls gemm_amx at the amx tier alone, which
// cpu_isa.cpp selects only once the OS has granted the tile state.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-bf16")

namespace te_kernels::cpu::avx512::gemm_detail {

struct AmxKernel {
  static constexpr int kMr = 32;
  static constexpr int kNr = 32;
  // A tile call sums 256 values of k: 32 TDPBF16PS between loading and storing its 4 KiB of
  // sums. A block of 192 rows of a (six tiles) meets each 16 KiB panel of b while it is in L1:
  // on 2 Xeon cores, [4096]^3 ran at 2,160 GFLOP/s with 96 rows and 2,540 with 192; 128 or 512
  // values of k, or 384 rows, were no faster.
  static constexpr int64_t kKc = 256;
  static constexpr int64_t kMc = 192;
  using Packed = uint32_t;  // a pair of bf16, adjacent along k

  // Per 32 values of k (zeros past kc): 16 pairs for each of the 32 rows or columns.
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBlockPairs = kBlock / 2;
  static int64_t rows(int64_t kc) { return (kc + kBlock - 1) / kBlock * kBlockPairs; }

  // Packs each block of 32 values of k as two tiles of 16 rows (a) or 16 columns (b), 1 KiB
  // each, rows 64 bytes apart. a's tile is row-major: row r holds r's 16 pairs. b's tile is
  // what TDPBF16PS reads as its second operand: row q holds pair q of each of its 16 columns.
  // FP8 codes are widened in registers as they are read (fp8_to_bf16_avx512.h).
  template <Side kSide>
  static void pack(const Operand& x, int64_t row0, int64_t count, int64_t k0, int64_t kc, uint32_t* out, bf16_t*) {
    switch (x.format) {
      case GemmOperand::kBFloat16:
        return pack_as<kSide>(count, kc, out, [&](int64_t r, int64_t k, __mmask32 present) {
          return _mm512_maskz_loadu_epi16(present, x.bf16_row(row0 + r) + k0 + k);
        });
      case GemmOperand::kFp8E4M3: return pack_codes<kSide>(x, Fp8Format::kE4M3, row0, count, k0, kc, out);
      case GemmOperand::kFp8E5M2: return pack_codes<kSide>(x, Fp8Format::kE5M2, row0, count, k0, kc, out);
    }
  }

  template <Side kSide>
  static void pack_codes(const Operand& x, Fp8Format format, int64_t row0, int64_t count, int64_t k0, int64_t kc,
                         uint32_t* out) {
    const Fp8ToBf16 to_bf16{format};
    pack_as<kSide>(count, kc, out, [&](int64_t r, int64_t k, __mmask32 present) {
      return to_bf16.widen(_mm256_maskz_loadu_epi8(present, x.code_row(row0 + r) + k0 + k));
    });
  }

  // load(r, k, present): values [k, k + 32) of row r as 32 bf16, zeros where `present` is clear.
  // A block of b is 16 rows of 16 pairs, stored transposed: one 16 x 16 transpose of 32-bit
  // lanes in registers.
  template <Side kSide, typename Load>
  static void pack_as(int64_t count, int64_t kc, uint32_t* out, const Load& load) {
    constexpr int kWidth = kSide == Side::kA ? kMr : kNr;
    for (int64_t block = 0; block * kBlock < kc; ++block) {
      const int64_t values = std::min(kBlock, kc - block * kBlock);
      const __mmask32 present = __mmask32((uint64_t(1) << values) - 1);
      uint32_t* tiles = out + block * kBlockPairs * kWidth;
      for (int64_t r0 = 0; r0 < kWidth; r0 += 16) {
        __m512i pairs[16];  // [row][pair]
        for (int64_t r = 0; r < 16; ++r) {
          pairs[r] = r0 + r < count ? load(r0 + r, block * kBlock, present) : _mm512_setzero_si512();
        }
        uint32_t* tile = tiles + r0 * kBlockPairs;
        if constexpr (kSide == Side::kB) transpose_16x16(pairs);  // -> [pair][row]
        for (int64_t r = 0; r < 16; ++r) _mm512_storeu_si512(tile + r * 16, pairs[r]);
      }
    }
  }

  // x [16][16] of 32-bit lanes -> its transpose, in place.
  static void transpose_16x16(__m512i x[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      x[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      x[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      x[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      x[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8) {
      for (int j = 0; j < 4; ++j) {
        t[i + j] = _mm512_shuffle_i32x4(x[i + j], x[i + j + 4], 0x88);
        t[i + j + 4] = _mm512_shuffle_i32x4(x[i + j], x[i + j + 4], 0xdd);
      }
    }
    for (int j = 0; j < 8; ++j) {
      x[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
      x[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
  }

  // c[32, 32] (+)= a_tile . b_panel over kc values of k; c's rows ldc floats apart.
  static void tile(const uint32_t* a, int64_t kc, const uint32_t* b, float* c, int64_t ldc, bool accumulate) {
    const int64_t c_stride = ldc * int64_t(sizeof(float));
    float* c_low = c + 16 * ldc;
    if (accumulate) {
      _tile_loadd(0, c, c_stride);
      _tile_loadd(1, c + 16, c_stride);
      _tile_loadd(2, c_low, c_stride);
      _tile_loadd(3, c_low + 16, c_stride);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
    constexpr int64_t kTileBytes = 64, kTile = kBlockPairs * 16;  // a tile's row stride and its Packed count
    for (int64_t block = 0; block < rows(kc) / kBlockPairs; ++block) {
      const uint32_t* a_tiles = a + block * 2 * kTile;
      const uint32_t* b_tiles = b + block * 2 * kTile;
      _tile_loadd(4, a_tiles, kTileBytes);
      _tile_loadd(5, a_tiles + kTile, kTileBytes);
      _tile_loadd(6, b_tiles, kTileBytes);
      _tile_loadd(7, b_tiles + kTile, kTileBytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, c_stride);
    _tile_stored(1, c + 16, c_stride);
    _tile_stored(2, c_low, c_stride);
    _tile_stored(3, c_low + 16, c_stride);
  }

  // The tile shapes above, loaded on each thread that runs tile() (the configuration is
  // per thread) and released after, so that the OS stops saving the tile data on its switches.
  // The configuration is a constant in memory: GCC 12 drops stores into a local one that only
  // the tile-configuration load reads.
  struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
  };
  alignas(64) static constexpr TileConfig kTileConfig = {
      1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};  // 16 rows x 64 bytes
  struct Scope {
    Scope() { _tile_loadconfig(&kTileConfig); }
    ~Scope() { _tile_release(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };
};

void gemm_amx(const GemmBf16Params& params, const ThreadPool& pool) { gemm<AmxKernel>(params, pool); }

}  // namespace te_kernels::cpu::avx512::gemm_detail
#endif
