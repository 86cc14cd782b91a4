// The GEMM of gemm.h on AMX-BF16 tiles, for the amx tier: gemm_avx512.cpp calls gemm_amx for more
// than 32 rows of a (the blocking, packing and fp32 epilogue of gemm_kernels.h, shared with the
// other kernels) and gemm_amx_few_rows for up to 32 (b read in place: packing it would cost
// more than the GEMM). Built into te_kernels::cpu::avx512 beside that tier's kernels.
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

// gemm_avx512.cpp calls this unit's entry points at the amx tier alone, which cpu_isa.cpp
// selects only once the OS has granted the tile state (and where the CPU has AVX512-VBMI).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,amx-tile,amx-bf16")
#include "cpu/gemm/fp8_to_bf16_avx512.h"  // after the pragma: built for this unit's target
#include "cpu/gemm/nvfp4_to_bf16_avx512.h"
#include "cpu/simd/transpose_avx512.h"

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
  // FP8 and NVFP4 codes are widened in registers as they are read (fp8_to_bf16_avx512.h,
  // nvfp4_to_bf16_avx512.h).
  template <Side kSide>
  static void pack(const Operand& x, int64_t row0, int64_t count, int64_t k0, int64_t kc, uint32_t* out, bf16_t*) {
    switch (x.format) {
      case GemmOperand::kBFloat16:
        return pack_as<kSide>(count, kc, out, [&](int64_t r, int64_t k, __mmask32 present) {
          return _mm512_maskz_loadu_epi16(present, x.bf16_row(row0 + r) + k0 + k);
        });
      case GemmOperand::kNvfp4: {
        const Nvfp4ToBf16& to_bf16 = Nvfp4ToBf16::get();
        return pack_as<kSide>(count, kc, out, [&](int64_t r, int64_t k, __mmask32 present) {
          return to_bf16.widen(x.code_row(row0 + r), x.scale_row(row0 + r), k0 + k, present);
        });
      }
      case GemmOperand::kFp8E4M3:
      case GemmOperand::kFp8E5M2: {
        const Fp8ToBf16& to_bf16 = *Fp8ToBf16::of(x.format);
        return pack_as<kSide>(count, kc, out, [&](int64_t r, int64_t k, __mmask32 present) {
          return to_bf16.widen(_mm256_maskz_loadu_epi8(present, x.code_row(row0 + r) + k0 + k));
        });
      }
    }
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
        if constexpr (kSide == Side::kB) transpose_16x16_epi32(pairs);  // -> [pair][row]
        for (int64_t r = 0; r < 16; ++r) _mm512_storeu_si512(tile + r * 16, pairs[r]);
      }
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

size_t amx_packed_b_bytes(int64_t n, int64_t k) { return packed_b_bytes<AmxKernel>(n, k); }

void amx_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool) {
  pack_b<AmxKernel>(params, packed, pool);
}

// Up to 32 rows of a (a decoding step's tokens), without packing b: packing the weight would
// cost more than the GEMM. The tiles compute the output's transpose, c^T = b a^T: 32 rows of b
// at a time are the first operand, two tiles loaded in place (bf16 rows read as they are; FP8
// and NVFP4 codes, and the edges of b, staged 32 values of k at a time, 2 KiB in L1), a^T the
// second, packed once as the main path packs b. Each output sums its products in the tiles'
// order, as on the main path. The [32 of b, 32 of a] block of sums is transposed into the epilogue's
// [rows of a, columns] layout.
void gemm_amx_few_rows(const GemmBf16Params& p, const ThreadPool& pool) {
  constexpr int64_t kRows = 32, kBlock = AmxKernel::kBlock, kTile = AmxKernel::kBlockPairs * 16;
  const Operand a = operand_a(p), b = operand_b(p);
  const int64_t k_blocks = (p.k + kBlock - 1) / kBlock;
  thread_local KeptScratch a_scratch;
  uint32_t* const a_packed = a_scratch.reserve<uint32_t>(size_t(AmxKernel::rows(p.k) * kRows));
  AmxKernel::pack<Side::kB>(a, 0, p.m, 0, p.k, a_packed, nullptr);  // [k_blocks][2 tiles of 16 rows of a]
  const Fp8ToBf16* const codes = b.is_nvfp4() ? nullptr : Fp8ToBf16::of(b.format);  // FP8 b alone
  const Nvfp4ToBf16* const nvfp4 = b.is_nvfp4() ? &Nvfp4ToBf16::get() : nullptr;
  const int64_t b_blocks = (p.n + kRows - 1) / kRows;
  pool.parallel_for(b_blocks, 4, [&](int64_t begin, int64_t end) {
    [[maybe_unused]] const AmxKernel::Scope scope;
    alignas(64) bf16_t staged[kRows * kBlock];       // [32 rows of b][32 values of k]
    alignas(64) bf16_t next_staged[kRows * kBlock];  // the next 32 values, where 64 codes were widened at once
    alignas(64) float sums_t[kRows * kRows];          // [32 rows of b][32 rows of a]
    alignas(64) float sums[kRows * kRows];            // [32 rows of a][32 rows of b]
    for (int64_t block = begin; block < end; ++block) {
      const int64_t j0 = block * kRows, rows = std::min(kRows, p.n - j0);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const int64_t k0 = kb * kBlock, values = std::min(kBlock, p.k - k0);
        // FP8 codes of a whole block of rows are widened 64 at a time, for this pair of blocks of k
        // (pairs that k fills); the rest is staged 32 at a time, bf16 rows read in place.
        const bool in_pairs = codes != nullptr && rows == kRows && (kb / 2 + 1) * 2 * kBlock <= p.k;
        if (in_pairs) {
          if (kb % 2 == 0) {
            for (int64_t r = 0; r < kRows; ++r) {
              __m512i first, second;
              codes->widen64(_mm512_loadu_si512(b.code_row(j0 + r) + k0), first, second);
              _mm512_store_si512(staged + r * kBlock, first);
              _mm512_store_si512(next_staged + r * kBlock, second);
            }
          }
          const bf16_t* block_staged = kb % 2 == 0 ? staged : next_staged;
          _tile_loadd(4, block_staged, 64);
          _tile_loadd(5, block_staged + 16 * kBlock, 64);
        } else if (codes != nullptr || nvfp4 != nullptr || rows < kRows || values < kBlock) {
          const __mmask32 present = __mmask32((uint64_t(1) << values) - 1);
          for (int64_t r = 0; r < kRows; ++r) {
            const __m512i row = r >= rows ? _mm512_setzero_si512()
                                : codes   ? codes->widen(_mm256_maskz_loadu_epi8(present, b.code_row(j0 + r) + k0))
                                : nvfp4   ? nvfp4->widen(b.code_row(j0 + r), b.scale_row(j0 + r), k0, present)
                                          : _mm512_maskz_loadu_epi16(present, b.bf16_row(j0 + r) + k0);
            _mm512_store_si512(staged + r * kBlock, row);
          }
          _tile_loadd(4, staged, 64);
          _tile_loadd(5, staged + 16 * kBlock, 64);
        } else {
          const int64_t stride = b.ld * int64_t(sizeof(bf16_t));
          _tile_loadd(4, b.bf16_row(j0) + k0, stride);
          _tile_loadd(5, b.bf16_row(j0 + 16) + k0, stride);
        }
        const uint32_t* a_tiles = a_packed + kb * 2 * kTile;
        _tile_loadd(6, a_tiles, 64);
        _tile_loadd(7, a_tiles + kTile, 64);
        _tile_dpbf16ps(0, 4, 6);  // b rows 0-15 x a rows 0-15
        _tile_dpbf16ps(1, 4, 7);  // b rows 0-15 x a rows 16-31
        _tile_dpbf16ps(2, 5, 6);  // b rows 16-31 x a rows 0-15
        _tile_dpbf16ps(3, 5, 7);
      }
      constexpr int64_t kStride = kRows * int64_t(sizeof(float));
      _tile_stored(0, sums_t, kStride);
      _tile_stored(1, sums_t + 16, kStride);
      _tile_stored(2, sums_t + 16 * kRows, kStride);
      _tile_stored(3, sums_t + 16 * kRows + 16, kStride);
      for (int64_t half_b = 0; half_b < 2; ++half_b) {  // sums[i][j] = sums_t[j][i], 16 x 16 at a time
        for (int64_t half_a = 0; half_a < 2; ++half_a) {
          __m512i lanes[16];
          for (int64_t r = 0; r < 16; ++r) {
            lanes[r] = _mm512_load_si512(sums_t + (half_b * 16 + r) * kRows + half_a * 16);
          }
          transpose_16x16_epi32(lanes);
          for (int64_t r = 0; r < 16; ++r) _mm512_store_si512(sums + (half_a * 16 + r) * kRows + half_b * 16, lanes[r]);
        }
      }
      store_output(p, sums, kRows, 0, j0, p.m, rows);
    }
  });
}

}  // namespace te_kernels::cpu::avx512::gemm_detail
#endif
