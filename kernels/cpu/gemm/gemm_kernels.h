// The blocked GEMM of gemm.h for one SIMD tier. Included by cpu/gemm/gemm_<tier>.cpp after the
// tier's header; everything here compiles into te_kernels::cpu::<tier>.
//
// Work split: b is packed once, in strips of at most kNcMax columns, into panels of kNr columns
// in the layout the micro-kernel reads (Kernel::pack). A task is one block of kMc rows and a
// group of strips: it packs its rows of a (all of k) into tiles of kMr rows,
// then for each strip and each Kernel::kKc slice of k, every packed b panel (in L1) meets every
// tile of the block (in L2); the fp32 sums of the [kMc, nc] block wait between slices in a
// buffer (in L2), and the epilogue (alpha, bias, one rounding) turns them into the output once.
// Packing a as well as b keeps the micro-kernel's reads sequential: rows of a read in place,
// a power-of-two stride apart, all fall into one L1 set. FP8 and NVFP4 operands are widened to
// bf16 (exactly) as they are packed.
//
// A micro-kernel is a policy type:
//   kMr, kNr           the rows and columns of one tile of sums
//   kKc                the slice of k one tile() call sums (even; the AMX kernel's a multiple of 32)
//   kMc                the rows of a block of a (a multiple of kMr)
//   Packed             element type of packed operands
//   rows(kc)           rows of Packed (kMr or kNr wide) that kc values of k pack into
//   pack<side>(x, row0, count, k0, kc, out, staging)   rows [row0, row0 + count) of operand
//                      x, values [k0, k0 + kc) (count <= width) -> [rows(kc)][width]: a tile of
//                      a (side kA, width kMr) or a panel of b (side kB, width kNr); missing
//                      rows and padding in k are zero; FP8 and NVFP4 codes widened to bf16 on
//                      the way (staging: kKc bf16 for a row, where the kernel widens through memory)
//   tile(a_tile, kc, b_panel, c, ldc, accumulate)    c[kMr, kNr] (+)= a_tile . b_panel
//   Scope              constructed on a thread before its first tile() and destroyed after
//                      its last (the AMX kernel configures and releases its tiles)
// The FMA and AVX512-BF16 micro-kernels add the products of a pair of k values odd element
// first, then even, in fp32: the order of the AVX512-BF16 dot product, so that the tiers' FMA
// kernels sum alike. (The AMX tiles sum in an order of their own: gemm_amx.cpp. With 16 rows
// of a or fewer, the AVX512-BF16 path reads the operands in place and sums along k across the
// lanes of a register instead: gemm_avx512.cpp.)
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

#include "te_kernels/fp8_block.h"
#include "te_kernels/gemm.h"
#include "te_kernels/nvfp4.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace gemm_detail {

constexpr int64_t kNcMax = 512;

enum class Side { kA, kB };

// An operand of gemm.h as the packing reads it: rows ld elements apart, bf16 or FP8 codes (with
// their block scales where `blocks` has them); or NVFP4 codes, rows ld bytes apart, with their
// E4M3 block scales, rows ld_scales apart.
struct Operand {
  const void* data;
  GemmOperand format;
  int64_t ld;
  const uint8_t* scales;
  int64_t ld_scales;
  GemmFp8BlockScales blocks;
  int row_shift = 0, k_shift = 0;  // log2 of blocks.rows_per_scale and blocks.k_per_scale

  Operand(const void* data, GemmOperand format, int64_t ld, const uint8_t* scales, int64_t ld_scales,
          const GemmFp8BlockScales& blocks)
      : data(data), format(format), ld(ld), scales(scales), ld_scales(ld_scales), blocks(blocks),
        row_shift(__builtin_ctzll(uint64_t(blocks.rows_per_scale))),
        k_shift(__builtin_ctzll(uint64_t(blocks.k_per_scale))) {}

  bool is_bf16() const { return format == GemmOperand::kBFloat16; }
  bool is_nvfp4() const { return format == GemmOperand::kNvfp4; }
  bool is_block_scaled() const { return blocks.data != nullptr; }
  const bf16_t* bf16_row(int64_t r) const { return static_cast<const bf16_t*>(data) + r * ld; }
  const uint8_t* code_row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * ld; }
  const uint8_t* scale_row(int64_t r) const { return scales + r * ld_scales; }
  // The block scale of a block-scaled FP8 operand's element [r, k].
  float block_scale(int64_t r, int64_t k) const {
    const int64_t slot = (r >> row_shift) * blocks.ld + (k >> k_shift);
    return blocks.e8m0 ? e8m0_to_float(static_cast<const uint8_t*>(blocks.data)[slot])
                       : static_cast<const float*>(blocks.data)[slot];
  }
};

// The FP8 format of an operand of FP8 codes (not called for bf16 or NVFP4 ones).
inline Fp8Format fp8_format_of(GemmOperand format) {
  return format == GemmOperand::kFp8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
}

inline Operand operand_a(const GemmBf16Params& p) {
  return Operand(p.a, p.a_format, p.lda, p.a_scales, p.lda_scales, p.a_blocks);
}
inline Operand operand_b(const GemmBf16Params& p) {
  return Operand(p.b, p.b_format, p.ldb, p.b_scales, p.ldb_scales, p.b_blocks);
}

// count FP8 codes as bf16: exact (every E4M3 and E5M2 value, NaN included, is a bf16 value),
// through the tier's fp32 decoding (Vec::load_fp8, the dequantize kernel's).
template <Fp8Format kFormat>
void widen_codes(const uint8_t* codes, int64_t count, bf16_t* out) {
  int64_t i = 0;
  for (; i + Vec::kWidth <= count; i += Vec::kWidth) Vec::template load_fp8<kFormat>(codes + i).store(out + i);
  for (; i < count; ++i) out[i] = to_bf16(fp8_to_float(codes[i], kFormat));
}

// Every E4M3 code's value, for NVFP4's block scales: a load where fp8_to_float is a call (one per
// 16 values of b: measured, it was most of a decoding NVFP4 GEMM's time).
inline const float* e4m3_values() {
  static const auto table = [] {
    std::array<float, 256> values;
    for (int code = 0; code < 256; ++code) values[code] = fp8_to_float(uint8_t(code), Fp8Format::kE4M3);
    return values;
  }();
  return table.data();
}

// Both values of every byte of E2M1 codes, the even k's (low nibble) first: two loads per byte
// where e2m1_value is a table read and a sign per nibble.
inline const float* e2m1_pair_values() {
  static const auto table = [] {
    std::array<float, 512> values;
    for (int byte = 0; byte < 256; ++byte) {
      values[2 * byte] = e2m1_value(uint8_t(byte & 0xf));
      values[2 * byte + 1] = e2m1_value(uint8_t(byte >> 4));
    }
    return values;
  }();
  return table.data();
}

// Values [k0, k0 + count) of an NVFP4 row (codes and scales as Operand holds them) as bf16: each
// code's E2M1 value times its block's E4M3 scale, exact in fp32 and in bf16. Whole blocks go
// through the tables and the tier's vectors (the per-element decode and bf16 rounding made the
// packing most of an NVFP4 GEMM's time on the FMA tiers: 6 ns a value on Zen 3).
inline void widen_nvfp4(const uint8_t* codes, const uint8_t* scales, int64_t k0, int64_t count, bf16_t* out) {
  static_assert(kNvfp4Block % Vec::kWidth == 0, "a block is whole vectors");
  const float* pairs = e2m1_pair_values();
  const float* scale_values = e4m3_values();
  const int64_t end = k0 + count;
  for (int64_t k = k0; k < end;) {
    const float scale = scale_values[scales[k / kNvfp4Block]];
    const int64_t block_end = std::min(end, (k / kNvfp4Block + 1) * kNvfp4Block);
    if (k % kNvfp4Block == 0 && block_end - k == kNvfp4Block) {
      alignas(64) float block[kNvfp4Block];
      for (int i = 0; i < kNvfp4Block; i += 2) {
        const float* pair = pairs + 2 * codes[(k + i) / 2];
        block[i] = pair[0];
        block[i + 1] = pair[1];
      }
      for (int i = 0; i < kNvfp4Block; i += Vec::kWidth) {
        (Vec::load(block + i) * Vec::broadcast(scale)).store(out + (k - k0) + i);
      }
      k = block_end;
      continue;
    }
    for (; k < block_end; ++k) out[k - k0] = to_bf16(e2m1_value(uint8_t(codes[k / 2] >> (4 * (k % 2)) & 0xf)) * scale);
  }
}

// Values [k0, k0 + count) of row r of a block-scaled FP8 operand as bf16: each code times its
// block's scale in fp32, rounded to bf16 (fp8_block_dequantize's steps, so its values bit for bit).
template <Fp8Format kFormat>
void widen_scaled_codes(const Operand& x, int64_t r, int64_t k0, int64_t count, bf16_t* out) {
  using Scalar = VecPortable<float, 1>;
  const uint8_t* codes = x.code_row(r);
  for (int64_t k = k0; k < k0 + count;) {
    const int64_t block_end = std::min(k0 + count, (k / x.blocks.k_per_scale + 1) * x.blocks.k_per_scale);
    const float scale = x.block_scale(r, k);
    for (; k + Vec::kWidth <= block_end; k += Vec::kWidth) {
      (Vec::template load_fp8<kFormat>(codes + k) * Vec::broadcast(scale)).store(out + (k - k0));
    }
    for (; k < block_end; ++k) {
      (Scalar::template load_fp8<kFormat>(codes + k) * Scalar::broadcast(scale)).store(out + (k - k0));
    }
  }
}

// Row r of x, values [k0, k0 + kc), as bf16: in place, or widened into `staging`.
inline const bf16_t* row_as_bf16(const Operand& x, int64_t r, int64_t k0, int64_t kc, bf16_t* staging) {
  if (x.is_bf16()) return x.bf16_row(r) + k0;
  if (x.is_nvfp4()) {
    widen_nvfp4(x.code_row(r), x.scale_row(r), k0, kc, staging);
    return staging;
  }
  const bool e4m3 = fp8_format_of(x.format) == Fp8Format::kE4M3;
  if (x.is_block_scaled()) {
    if (e4m3) widen_scaled_codes<Fp8Format::kE4M3>(x, r, k0, kc, staging);
    else widen_scaled_codes<Fp8Format::kE5M2>(x, r, k0, kc, staging);
  } else if (e4m3) {
    widen_codes<Fp8Format::kE4M3>(x.code_row(r) + k0, kc, staging);
  } else {
    widen_codes<Fp8Format::kE5M2>(x.code_row(r) + k0, kc, staging);
  }
  return staging;
}

// Scratch of one GEMM call (the packed b) or of one thread (its packed rows of a, its block
// of sums), never allocated inside the loops.
template <typename T>
struct AlignedArray {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data;
  explicit AlignedArray(size_t count) {
    const size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    data.reset(static_cast<T*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes)));
    if (!data) throw std::bad_alloc();
  }
  T* get() const { return data.get(); }
};

// Scratch a thread keeps from one GEMM call to its next: memory freshly allocated for every
// call comes from the OS, which faults it in and zeroes it page by page; measured on 2 Xeon
// cores, that was a tenth of a [512, 4096] x [4096, 4096] GEMM's time on AMX. It grows to the
// largest request; trim() gives back more than kMaxKeptBytes at the end of a call.
constexpr size_t kMaxKeptBytes = size_t(256) << 20;

class KeptScratch {
 public:
  template <typename T>
  T* reserve(size_t count) {
    const size_t bytes = std::max<size_t>(64, (count * sizeof(T) + 63) / 64 * 64);
    if (bytes > bytes_) {
      buffer_.reset();  // before the new one: the old is not needed, and both may be large
      buffer_ = std::make_unique<AlignedArray<unsigned char>>(bytes);
      bytes_ = bytes;
    }
    return reinterpret_cast<T*>(buffer_->get());
  }
  void trim() {
    if (bytes_ > kMaxKeptBytes) {
      buffer_.reset();
      bytes_ = 0;
    }
  }

 private:
  std::unique_ptr<AlignedArray<unsigned char>> buffer_;
  size_t bytes_ = 0;
};

// fp32 FMAs on any vector type: both operands packed widened to fp32, one k per row.
template <typename V, int Mr>
struct FmaKernel {
  static constexpr int kMr = Mr;
  static constexpr int kNr = 2 * V::kWidth;
  static constexpr int64_t kKc = 256;
  static constexpr int64_t kMc = 96;
  using Packed = float;
  struct Scope {};

  static int64_t rows(int64_t kc) { return kc; }

  template <Side kSide>
  static void pack(const Operand& x, int64_t row0, int64_t count, int64_t k0, int64_t kc, float* out,
                   bf16_t* staging) {
    constexpr int kWidth = kSide == Side::kA ? kMr : kNr;
    for (int64_t r = 0; r < kWidth; ++r) {
      if (r >= count) {
        for (int64_t k = 0; k < kc; ++k) out[k * kWidth + r] = 0.0f;
        continue;
      }
      const bf16_t* row = row_as_bf16(x, row0 + r, k0, kc, staging);
      for (int64_t k = 0; k < kc; ++k) out[k * kWidth + r] = to_float(row[k]);
    }
  }

  static void tile(const float* a, int64_t kc, const float* b, float* c, int64_t ldc, bool accumulate) {
    V acc[kMr][2];
    for (int r = 0; r < kMr; ++r) {
      acc[r][0] = accumulate ? V::load(c + r * ldc) : V::zero();
      acc[r][1] = accumulate ? V::load(c + r * ldc + V::kWidth) : V::zero();
    }
    const auto step = [&](int64_t k) {
      const V b0 = V::load(b + k * kNr), b1 = V::load(b + k * kNr + V::kWidth);
      for (int r = 0; r < kMr; ++r) {
        const V x = V::broadcast(a[k * kMr + r]);
        acc[r][0] = fmadd(x, b0, acc[r][0]);
        acc[r][1] = fmadd(x, b1, acc[r][1]);
      }
    };
    int64_t k = 0;
    for (; k + 1 < kc; k += 2) {
      step(k + 1);
      step(k);
    }
    if (k < kc) step(k);
    for (int r = 0; r < kMr; ++r) {
      acc[r][0].store(c + r * ldc);
      acc[r][1].store(c + r * ldc + V::kWidth);
    }
  }
};

// out[i, j] = round(alpha * sums[i, j] + bias[j] (+ out[i, j])) for a block of rows x cols, the
// product rounded to fp32 before the bias joins it (unfused: the reference's two roundings, in
// every kernel this is inlined into).
template <typename T>
void store_block(const GemmBf16Params& p, const float* sums, int64_t ld_sums, int64_t i0, int64_t j0, int64_t rows,
                 int64_t cols) {
  T* out = static_cast<T*>(p.out);
  const Vec alpha = Vec::broadcast(p.alpha);
  for (int64_t i = 0; i < rows; ++i) {
    const float* s = sums + i * ld_sums;
    T* o = out + (i0 + i) * p.ldc + j0;
    int64_t j = 0;
    for (; j + Vec::kWidth <= cols; j += Vec::kWidth) {
      Vec value = unfused(Vec::load(s + j) * alpha);
      if (p.bias != nullptr) value = value + Vec::load(p.bias + j0 + j);
      if (p.accumulate) value = value + Vec::load(o + j);
      value.store(o + j);
    }
    for (; j < cols; ++j) {
      float value = unfused(s[j] * p.alpha);
      if (p.bias != nullptr) value += p.bias[j0 + j];
      if (p.accumulate) value += to_float(o[j]);
      o[j] = Convert<T>::from(value);
    }
  }
}

inline void store_output(const GemmBf16Params& p, const float* sums, int64_t ld_sums, int64_t i0, int64_t j0,
                         int64_t rows, int64_t cols) {
  switch (p.out_dtype) {
    case DType::kFloat32: return store_block<float>(p, sums, ld_sums, i0, j0, rows, cols);
    case DType::kBFloat16: return store_block<bf16_t>(p, sums, ld_sums, i0, j0, rows, cols);
    case DType::kFloat16: return store_block<fp16_t>(p, sums, ld_sums, i0, j0, rows, cols);
    case DType::kFloat64: break;  // refused by gemm.cpp
  }
}

// How the output is cut into tasks: strips of nc columns; a task is one block of kMc rows and
// a group of consecutive strips, enough tasks that threads finishing at different times
// still share the work evenly, and as few as that allows (each task packs its rows of a).
struct Plan {
  int64_t nc;             // columns of a strip (a multiple of kNr, at most kNcMax)
  int64_t ld_sums;        // row stride of a block of sums: nc and one cache line, so that the
                          // rows of a tile of sums (a power of two apart otherwise) spread over
                          // the L1 sets instead of all falling into two
  int64_t strips;         // ceil(n / nc)
  int64_t m_blocks;       // ceil(m / kMc)
  int64_t strips_per_task;
  int64_t groups;         // ceil(strips / strips_per_task)
};

template <typename Kernel>
Plan plan(const GemmBf16Params& p, int threads) {
  Plan plan;
  const int64_t n_padded = (p.n + Kernel::kNr - 1) / Kernel::kNr * Kernel::kNr;
  plan.nc = std::min(kNcMax, n_padded);
  plan.ld_sums = plan.nc + 16;
  plan.strips = (p.n + plan.nc - 1) / plan.nc;
  plan.m_blocks = (p.m + Kernel::kMc - 1) / Kernel::kMc;
  const int64_t wanted_tasks = 8 * int64_t(threads);
  plan.strips_per_task = std::max<int64_t>(1, plan.strips * plan.m_blocks / wanted_tasks);
  plan.strips_per_task = std::min(plan.strips_per_task, plan.strips);
  plan.groups = (plan.strips + plan.strips_per_task - 1) / plan.strips_per_task;
  return plan;
}

// Packs rows [row0, row0 + count) of x, tile by tile of `width` rows, slice by slice: slice s
// (k from s * kKc) starts at rows(s * kKc) * padded_count; within it tile t at t * rows(kc) * width.
// staging: kKc bf16, for the kernels that widen FP8 rows through memory.
template <typename Kernel, Side kSide>
void pack_rows(const Operand& x, int64_t row0, int64_t count, int64_t padded_count, int64_t k,
               typename Kernel::Packed* out, bf16_t* staging) {
  constexpr int kWidth = kSide == Side::kA ? Kernel::kMr : Kernel::kNr;
  for (int64_t k0 = 0; k0 < k; k0 += Kernel::kKc) {
    const int64_t kc = std::min(Kernel::kKc, k - k0);
    typename Kernel::Packed* slice = out + Kernel::rows(k0) * padded_count;
    for (int64_t r = 0; r < padded_count; r += kWidth) {
      const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(kWidth, count - r));
      Kernel::template pack<kSide>(x, row0 + r, rows, k0, kc, slice + r * Kernel::rows(kc), staging);
    }
  }
}

// The block of rows [i0, i0 + mc) against the strip at column j0; a_packed holds the block's
// rows of a, b_packed the strip's b.
template <typename Kernel>
void run_block(const GemmBf16Params& p, const Plan& plan, int64_t i0, int64_t j0,
               const typename Kernel::Packed* a_packed, const typename Kernel::Packed* b_packed, float* sums) {
  const int64_t cols = std::min(plan.nc, p.n - j0), mc = std::min(Kernel::kMc, p.m - i0);
  for (int64_t k0 = 0; k0 < p.k; k0 += Kernel::kKc) {
    const int64_t kc = std::min(Kernel::kKc, p.k - k0);
    const typename Kernel::Packed* a_slice = a_packed + Kernel::rows(k0) * Kernel::kMc;
    const typename Kernel::Packed* b_slice = b_packed + Kernel::rows(k0) * plan.nc;
    for (int64_t jr = 0; jr < cols; jr += Kernel::kNr) {
      for (int64_t ir = 0; ir < mc; ir += Kernel::kMr) {
        Kernel::tile(a_slice + ir * Kernel::rows(kc), kc, b_slice + jr * Kernel::rows(kc), sums + ir * plan.ld_sums + jr,
                     plan.ld_sums, /*accumulate=*/k0 > 0);
      }
    }
  }
  if (p.k == 0) std::fill(sums, sums + mc * plan.ld_sums, 0.0f);  // the sum over no k
  store_output(p, sums, plan.ld_sums, i0, j0, mc, cols);
}

// The packed b of gemm.h's gemm_bf16_pack_b: strip by strip, each strip_count Packed; the layout
// depends on n and k alone (the plan's nc), not on m or the threads.
template <typename Kernel>
size_t packed_b_bytes(int64_t n, int64_t k) {
  GemmBf16Params shape;
  shape.n = n;
  shape.k = k;
  const Plan plan = gemm_detail::plan<Kernel>(shape, 1);
  return size_t(plan.strips * Kernel::rows(k) * plan.nc) * sizeof(typename Kernel::Packed);
}

template <typename Kernel>
void pack_b(const GemmBf16Params& p, const Plan& plan, typename Kernel::Packed* out, const ThreadPool& pool) {
  thread_local KeptScratch staging_scratch;
  const Operand b = operand_b(p);
  const int64_t strip_count = Kernel::rows(p.k) * plan.nc;
  pool.parallel_for(plan.strips, 1, [&](int64_t begin, int64_t end) {
    bf16_t* const staging = staging_scratch.reserve<bf16_t>(size_t(Kernel::kKc));
    for (int64_t strip = begin; strip < end; ++strip) {
      pack_rows<Kernel, Side::kB>(b, strip * plan.nc, std::min(plan.nc, p.n - strip * plan.nc), plan.nc, p.k,
                                  out + strip * strip_count, staging);
    }
  });
}

template <typename Kernel>
void pack_b(const GemmBf16Params& p, void* out, const ThreadPool& pool) {
  pack_b<Kernel>(p, gemm_detail::plan<Kernel>(p, 1), static_cast<typename Kernel::Packed*>(out), pool);
}

// b is packed once (unless the caller packed it ahead: p.b_packed), strip by strip, into one
// buffer every thread reads. The tasks are then handed out one at a time from a shared counter,
// so that a thread slowed by another process on its core (2 shared cores in CI) leaves its
// share to the others instead of holding all up.
template <typename Kernel>
void gemm(const GemmBf16Params& p, const ThreadPool& pool) {
  using Packed = typename Kernel::Packed;
  const int threads = std::max(1, pool.num_threads());
  const Plan plan = gemm_detail::plan<Kernel>(p, threads);
  const int64_t strip_count = Kernel::rows(p.k) * plan.nc, block_count = Kernel::rows(p.k) * Kernel::kMc;
  // One scratch per use and thread: the caller's packed b is still being read while the
  // caller, as one of the pool's threads, packs rows of a.
  thread_local KeptScratch b_scratch, a_scratch, sums_scratch, staging_scratch;
  const Packed* b_packed = static_cast<const Packed*>(p.b_packed);
  if (b_packed == nullptr) {
    Packed* const packed = b_scratch.reserve<Packed>(size_t(plan.strips * strip_count));
    pack_b<Kernel>(p, plan, packed, pool);
    b_packed = packed;
  }
  const Operand a = operand_a(p);
  // Row-block major: threads working at once share the rows of a and read different strips.
  const int64_t tasks = plan.m_blocks * plan.groups;
  std::atomic<int64_t> next_task{0};
  pool.parallel_for(threads, 1, [&](int64_t, int64_t) {
    Packed* const a_packed = a_scratch.reserve<Packed>(size_t(block_count));
    float* const sums = sums_scratch.reserve<float>(size_t(Kernel::kMc * plan.ld_sums));
    bf16_t* const staging = staging_scratch.reserve<bf16_t>(size_t(Kernel::kKc));
    [[maybe_unused]] const typename Kernel::Scope scope;
    int64_t packed_block = -1;
    for (int64_t task = next_task.fetch_add(1); task < tasks; task = next_task.fetch_add(1)) {
      const int64_t block = task / plan.groups, first_strip = task % plan.groups * plan.strips_per_task;
      const int64_t i0 = block * Kernel::kMc;
      if (block != packed_block) {
        pack_rows<Kernel, Side::kA>(a, i0, std::min(Kernel::kMc, p.m - i0), Kernel::kMc, p.k, a_packed, staging);
        packed_block = block;
      }
      for (int64_t strip = first_strip; strip < std::min(plan.strips, first_strip + plan.strips_per_task); ++strip) {
        run_block<Kernel>(p, plan, i0, strip * plan.nc, a_packed, b_packed + strip * strip_count, sums);
      }
    }
  });
  b_scratch.trim();
}

}  // namespace gemm_detail
}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
