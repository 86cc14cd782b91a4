// The bf16 GEMM (te_kernels/gemm.h) of every SIMD tier this CPU has (the AMX tiles included),
// serial and on two threads, against a double-precision evaluation: bf16 operands, FP8 codes
// (E4M3, E5M2, mixed with each other and with bf16; per tensor, or with block scales in fp32 or
// E8M0) and NVFP4 codes with their block scales;
// shapes with partial tiles in m, n and k (odd k, k past a slice, n past a strip, m past a block
// of rows), every output dtype, alpha, bias and accumulation into the output, row strides longer
// than the rows, and empty sizes. Each result must be the exact value rounded once, up to fp32
// summation error. Also: a NaN code (an NVFP4 block's NaN scale) reaches exactly its row's
// outputs; where the CPU has AMX, the tiles agree with the avx512 tier's dot products within
// fp32 summation error and sum in the order gemm_amx.cpp states, few rows of a (the in-place
// path) and many; the avx2 tier's NVFP4 products sum in the order nvfp4_byte_kernel_avx2.h states.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8.h"
#include "te_kernels/gemm.h"
#include "te_kernels/nvfp4.h"
#include "two_threads.h"

using namespace te_kernels;

namespace {

struct Shape {
  int64_t m, n, k;
};

const char* operand_name(GemmOperand format) {
  switch (format) {
    case GemmOperand::kBFloat16: return "bf16";
    case GemmOperand::kFp8E4M3: return "e4m3";
    case GemmOperand::kFp8E5M2: return "e5m2";
    case GemmOperand::kNvfp4: return "nvfp4";
  }
  return "?";
}

// Block scales for an FP8 operand (gemm.h's GemmFp8BlockScales): none where rows_per_scale is 0.
struct BlockOption {
  int64_t rows_per_scale = 0, k_per_scale = 0;
  bool e8m0 = false;
};

// One operand [rows, stride] in its format, and the values it holds, as the GEMM multiplies them
// (value(r, q)). NVFP4: codes two a byte, ld = ceil(stride / 2) bytes, and an E4M3 scale per 16
// values; every code and scale is random (scales below 2, down to E4M3's subnormals).
struct Matrix {
  GemmOperand format;
  int64_t ld, values_ld;
  std::vector<bf16_t> bf16;
  std::vector<uint8_t> codes, scales;
  int64_t ld_scales = 0;
  std::vector<float> values;
  BlockOption blocks;
  std::vector<float> block_scales;       // fp32 block scales, powers of two
  std::vector<uint8_t> block_exponents;  // or E8M0
  int64_t grid_cols = 0;

  Matrix(GemmOperand f, int64_t rows, int64_t stride, std::mt19937& rng, BlockOption block_option = {})
      : format(f), ld(stride), values_ld(stride), blocks(block_option) {
    std::normal_distribution<float> normal;
    values.resize(rows * stride);
    if (format == GemmOperand::kBFloat16) {
      bf16.resize(rows * ld);
      for (int64_t i = 0; i < rows * ld; ++i) values[i] = to_float(bf16[i] = to_bf16(normal(rng)));
    } else if (format == GemmOperand::kNvfp4) {
      ld = (stride + 1) / 2;
      ld_scales = (stride + kNvfp4Block - 1) / kNvfp4Block;
      codes.resize(rows * ld);
      scales.resize(rows * ld_scales);
      for (uint8_t& code : codes) code = uint8_t(rng());
      for (uint8_t& scale : scales) scale = uint8_t(rng() % 0x40);  // up to 1.875: the sums stay in fp16
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t q = 0; q < stride; ++q) update_nvfp4_value(r, q);
      }
    } else {
      const Fp8Format fp8 = format == GemmOperand::kFp8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
      codes.resize(rows * ld);
      // Scaled into the formats' range, down to their subnormals.
      for (int64_t i = 0; i < rows * ld; ++i) values[i] = fp8_to_float(codes[i] = to_fp8(normal(rng) * 20.0f, fp8), fp8);
      if (blocks.rows_per_scale > 0) scale_blocks(rows, stride, rng);
    }
  }
  // Random power-of-two block scales 2^-6 .. 1 (the sums stay in fp16), each element's value times its block's.
  void scale_blocks(int64_t rows, int64_t stride, std::mt19937& rng) {
    grid_cols = (stride + blocks.k_per_scale - 1) / blocks.k_per_scale;
    const int64_t grid = (rows + blocks.rows_per_scale - 1) / blocks.rows_per_scale * grid_cols;
    block_scales.resize(grid);
    block_exponents.resize(grid);
    for (int64_t g = 0; g < grid; ++g) {
      const int exponent = int(rng() % 7) - 6;
      block_scales[g] = std::ldexp(1.0f, exponent);
      block_exponents[g] = uint8_t(127 + exponent);
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t q = 0; q < stride; ++q) {
        values[r * values_ld + q] *= block_scales[r / blocks.rows_per_scale * grid_cols + q / blocks.k_per_scale];
      }
    }
  }
  GemmFp8BlockScales block_scales_param() const {
    GemmFp8BlockScales p;
    if (blocks.rows_per_scale == 0) return p;
    p.data = blocks.e8m0 ? static_cast<const void*>(block_exponents.data()) : block_scales.data();
    p.e8m0 = blocks.e8m0;
    p.ld = grid_cols;
    p.rows_per_scale = blocks.rows_per_scale;
    p.k_per_scale = blocks.k_per_scale;
    return p;
  }
  float value(int64_t r, int64_t q) const { return values[r * values_ld + q]; }
  void update_nvfp4_value(int64_t r, int64_t q) {
    const uint8_t code = uint8_t(codes[r * ld + q / 2] >> (4 * (q % 2)) & 0xf);
    const float scale = fp8_to_float(scales[r * ld_scales + q / kNvfp4Block], Fp8Format::kE4M3);
    values[r * values_ld + q] = e2m1_value(code) * scale;
  }
  const void* data() const { return format == GemmOperand::kBFloat16 ? static_cast<const void*>(bf16.data()) : codes.data(); }
  // Value q of row r is NaN (an NVFP4 operand: its block's 16 values).
  void set_nan(int64_t r, int64_t q) {
    if (format == GemmOperand::kBFloat16) bf16[r * ld + q] = bf16_t{0x7fc0};
    else if (format != GemmOperand::kNvfp4) codes[r * ld + q] = format == GemmOperand::kFp8E4M3 ? 0x7f : 0x7e;
    if (format != GemmOperand::kNvfp4) {
      values[r * values_ld + q] = std::nanf("");
      return;
    }
    scales[r * ld_scales + q / kNvfp4Block] = 0x7f;
    for (int64_t v = q / kNvfp4Block * kNvfp4Block; v < std::min(values_ld, (q / kNvfp4Block + 1) * kNvfp4Block); ++v) {
      update_nvfp4_value(r, v);
    }
  }
  void zero() {
    std::fill(bf16.begin(), bf16.end(), bf16_t{0});
    std::fill(codes.begin(), codes.end(), uint8_t(0));
    std::fill(scales.begin(), scales.end(), uint8_t(0));
  }
};

double output_value(const std::vector<uint16_t>& out, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBFloat16: return to_float(bf16_t{out[i]});
    case DType::kFloat16: return to_float(fp16_t{out[i]});
    default: break;
  }
  return 0.0;
}

// Half a unit in the last place of `value` stored with `mantissa_bits` bits after the point.
double half_ulp(double value, int mantissa_bits) {
  int exponent = 0;
  std::frexp(value, &exponent);
  return std::ldexp(1.0, std::max(exponent, -125) - 2 - mantissa_bits);
}

GemmBf16Params params_of(Shape s, const Matrix& a, const Matrix& b, const float* bias, DType out_dtype, void* out) {
  GemmBf16Params p;
  p.m = s.m, p.n = s.n, p.k = s.k;
  p.a = a.data(), p.a_format = a.format, p.lda = a.ld;
  p.a_scales = a.scales.data(), p.lda_scales = a.ld_scales;
  p.b = b.data(), p.b_format = b.format, p.ldb = b.ld;
  p.b_scales = b.scales.data(), p.ldb_scales = b.ld_scales;
  p.a_blocks = a.block_scales_param(), p.b_blocks = b.block_scales_param();
  p.alpha = 0.75f;
  p.bias = bias;
  p.out_dtype = out_dtype;
  p.out = out;
  p.ldc = s.n;
  return p;
}

// accumulate: out starts as values it keeps adding to (main_grad); else as garbage.
void check_gemm(Shape s, GemmOperand a_format, GemmOperand b_format, DType out_dtype, bool with_bias,
                bool accumulate, const ThreadPool& pool, std::mt19937& rng, const char* isa,
                BlockOption a_blocks = {}, BlockOption b_blocks = {}) {
  const Matrix a(a_format, s.m, s.k + 3, rng, a_blocks), b(b_format, s.n, s.k + 5, rng, b_blocks);  // strides honoured
  std::normal_distribution<float> normal;
  std::vector<float> bias(s.n);
  for (float& v : bias) v = normal(rng);
  std::vector<float> out32(s.m * s.n, -1.0f), before(s.m * s.n, 0.0f);
  std::vector<uint16_t> out16(s.m * s.n, 0xffff);
  if (accumulate) {
    for (int64_t i = 0; i < s.m * s.n; ++i) {
      out32[i] = normal(rng) * 8.0f;
      out16[i] = out_dtype == DType::kBFloat16 ? to_bf16(out32[i]).bits : to_fp16(out32[i]).bits;
      before[i] = out_dtype == DType::kFloat32 ? out32[i] : float(output_value(out16, out_dtype, i));
    }
  }
  void* out = out_dtype == DType::kFloat32 ? static_cast<void*>(out32.data()) : static_cast<void*>(out16.data());
  GemmBf16Params p = params_of(s, a, b, with_bias ? bias.data() : nullptr, out_dtype, out);
  p.accumulate = accumulate;
  gemm_bf16(p, pool);

  const int mantissa_bits = out_dtype == DType::kFloat32 ? 23 : out_dtype == DType::kBFloat16 ? 7 : 10;
  int bad = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t q = 0; q < s.k; ++q) {
        const double term = double(a.value(i, q)) * b.value(j, q);
        exact += term;
        magnitude += std::fabs(term);
      }
      exact = 0.75 * exact + (with_bias ? bias[j] : 0.0) + before[i * s.n + j];
      magnitude = 0.75 * magnitude + (with_bias ? std::fabs(bias[j]) : 0.0) + std::fabs(before[i * s.n + j]);
      const double got = out_dtype == DType::kFloat32 ? out32[i * s.n + j] : output_value(out16, out_dtype, i * s.n + j);
      const double tolerance = half_ulp(exact, mantissa_bits) + std::ldexp(magnitude, -20);
      if (!(std::fabs(got - exact) <= tolerance) && bad++ < 3) {
        TE_CHECK(false, "%s %s%s x %s%s -> %s%s m=%lld n=%lld k=%lld at (%lld, %lld): got %.9g, exact %.9g", isa,
                 operand_name(a_format), a_blocks.rows_per_scale ? " (blocks)" : "", operand_name(b_format),
                 b_blocks.rows_per_scale ? " (blocks)" : "", dtype_name(out_dtype), accumulate ? " (+=)" : "",
                 (long long)s.m,
                 (long long)s.n, (long long)s.k, (long long)i, (long long)j, got, exact);
      }
    }
  }
}

// A NaN in row 2 of a (or in row 1 of b) makes exactly row 2 (column 1) of the output NaN.
void check_nan(Shape s, GemmOperand format, bool in_a, const ThreadPool& pool, std::mt19937& rng, const char* isa) {
  Matrix a(format, s.m, s.k, rng), b(format, s.n, s.k, rng);
  if (in_a) a.set_nan(2, s.k - 1);
  else b.set_nan(1, s.k / 2);
  std::vector<float> out(s.m * s.n);
  gemm_bf16(params_of(s, a, b, nullptr, DType::kFloat32, out.data()), pool);
  int bad = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const bool want_nan = in_a ? i == 2 : j == 1;
      if (std::isnan(out[i * s.n + j]) != want_nan && bad++ < 3) {
        TE_CHECK(false, "%s %s NaN in %s, m=%lld n=%lld k=%lld: output (%lld, %lld) is %g", isa, operand_name(format),
                 in_a ? "a" : "b", (long long)s.m, (long long)s.n, (long long)s.k, (long long)i, (long long)j,
                 out[i * s.n + j]);
      }
    }
  }
}

// b packed ahead (gemm_bf16_pack_b) gives the same bits as b packed inside the call, for many
// rows of a and for few (which read b in place and leave the packed copy unused); with more rows
// than any in-place path takes, the packed copy is what is read (b zeroed after packing).
void check_packed_b(Shape s, GemmOperand b_format, const ThreadPool& pool, std::mt19937& rng, const char* isa) {
  const Matrix a(GemmOperand::kFp8E4M3, s.m, s.k, rng);
  Matrix b(b_format, s.n, s.k + 7, rng);
  std::vector<float> bias(s.n, 0.5f), inside(s.m * s.n), ahead(s.m * s.n);
  GemmBf16Params p = params_of(s, a, b, bias.data(), DType::kFloat32, inside.data());
  gemm_bf16(p, pool);
  std::vector<uint64_t> packed((gemm_bf16_packed_b_bytes(s.n, s.k) + 7) / 8 + 8);  // 64-byte aligned below
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(packed.data()) + 63) / 64 * 64);
  gemm_bf16_pack_b(p, aligned, pool);
  const bool reads_packed = s.m > 32;
  if (reads_packed) b.zero();
  p.out = ahead.data();
  p.b_packed = aligned;
  gemm_bf16(p, pool);
  TE_CHECK(std::memcmp(inside.data(), ahead.data(), inside.size() * sizeof(float)) == 0,
           "%s packed b (%s) m=%lld n=%lld k=%lld: not the bits of b packed in the call", isa, operand_name(b_format),
           (long long)s.m, (long long)s.n, (long long)s.k);
}

// fp32 outputs of the amx and avx512 tiers on the same operands: within fp32 summation error of
// each other.
void check_amx_against_avx512(Shape s, GemmOperand a_format, GemmOperand b_format, std::mt19937& rng) {
  const Matrix a(a_format, s.m, s.k, rng), b(b_format, s.n, s.k, rng);
  std::vector<float> amx(s.m * s.n), avx512(s.m * s.n);
  const test::TwoThreads two;
  limit_cpu_isa(CpuIsa::kAmx);
  gemm_bf16(params_of(s, a, b, nullptr, DType::kFloat32, amx.data()), two);
  limit_cpu_isa(CpuIsa::kAvx512);
  gemm_bf16(params_of(s, a, b, nullptr, DType::kFloat32, avx512.data()), two);
  limit_cpu_isa(CpuIsa::kAmx);
  int bad = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double magnitude = 0.0;
      for (int64_t q = 0; q < s.k; ++q) magnitude += std::fabs(double(a.value(i, q)) * b.value(j, q));
      // Each is within (additions on a product's path) * 2^-24 * magnitude of the exact sum:
      // at most k for the dot products, 16 + 2 * ceil(k / 32) for the tiles.
      const double bound = 0.75 * std::ldexp(magnitude, -24) * double(s.k + 16 + 2 * (s.k + 31) / 32);
      const double diff = std::fabs(double(amx[i * s.n + j]) - avx512[i * s.n + j]);
      if (!(diff <= bound) && bad++ < 3) {
        TE_CHECK(false, "amx against avx512 (%s x %s), m=%lld n=%lld k=%lld at (%lld, %lld): %.9g and %.9g",
                 operand_name(a_format), operand_name(b_format), (long long)s.m,
                 (long long)s.n, (long long)s.k, (long long)i, (long long)j, amx[i * s.n + j], avx512[i * s.n + j]);
      }
    }
  }
}

// The order gemm_amx.cpp states for the tiles, emulated in fp32 (each bf16 product is exact):
// per 32 values of k, c += (E + O), E and O the running sums of the products at even and odd k.
void check_amx_order(Shape s, std::mt19937& rng) {
  const Matrix a(GemmOperand::kBFloat16, s.m, s.k, rng), b(GemmOperand::kBFloat16, s.n, s.k, rng);
  std::vector<float> out(s.m * s.n);
  GemmBf16Params p = params_of(s, a, b, nullptr, DType::kFloat32, out.data());
  p.alpha = 1.0f;
  gemm_bf16(p, SerialThreadPool());
  int bad = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      float c = 0.0f;
      for (int64_t k0 = 0; k0 < s.k; k0 += 32) {
        float even = 0.0f, odd = 0.0f;
        for (int64_t q = k0; q < std::min(k0 + 32, s.k); ++q) {
          const float product = a.values[i * s.k + q] * b.values[j * s.k + q];
          (q % 2 == 0 ? even : odd) += product;
        }
        c += even + odd;
      }
      if (c != out[i * s.n + j] && bad++ < 3) {
        TE_CHECK(false, "amx order, m=%lld n=%lld k=%lld at (%lld, %lld): got %.9g, the stated order gives %.9g",
                 (long long)s.m, (long long)s.n, (long long)s.k, (long long)i, (long long)j, out[i * s.n + j], c);
      }
    }
  }
}

// The avx2 tier's NVFP4 x NVFP4 path past the few rows read in place (nvfp4_byte_kernel_avx2.h),
// emulated: each block of 16 k summed exactly (the sum must be exact in fp32, as that header
// argues), the blocks added in fp32 in k order, then alpha in fp32. Bit for bit, serial and on
// two threads, ragged k and row strides longer than the rows included.
void check_nvfp4_block_order(Shape s, const ThreadPool& pool, std::mt19937& rng) {
  const Matrix a(GemmOperand::kNvfp4, s.m, s.k + 3, rng), b(GemmOperand::kNvfp4, s.n, s.k + 5, rng);
  std::vector<float> out(s.m * s.n);
  gemm_bf16(params_of(s, a, b, nullptr, DType::kFloat32, out.data()), pool);
  int bad = 0, unlike_k_order = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      float sums = 0.0f, k_order = 0.0f;
      for (int64_t k0 = 0; k0 < s.k; k0 += kNvfp4Block) {
        double block = 0.0;
        for (int64_t q = k0; q < std::min(k0 + kNvfp4Block, s.k); ++q) {
          block += double(a.value(i, q)) * b.value(j, q);
          k_order += a.value(i, q) * b.value(j, q);
        }
        TE_CHECK(double(float(block)) == block, "nvfp4 block sum %.17g is not exact in fp32", block);
        sums += float(block);
      }
      const float want = sums * 0.75f;
      unlike_k_order += sums != k_order;
      if (out[i * s.n + j] != want && bad++ < 3) {
        TE_CHECK(false, "avx2 nvfp4 block order, m=%lld n=%lld k=%lld at (%lld, %lld): got %.9g, the order gives %.9g",
                 (long long)s.m, (long long)s.n, (long long)s.k, (long long)i, (long long)j, out[i * s.n + j], want);
      }
    }
  }
  // The operands' sums round, so the check tells the block order from the fp32 FMAs' k order.
  TE_CHECK(s.k < 500 || unlike_k_order > 0, "nvfp4 block order: m=%lld n=%lld k=%lld never differs from k order",
           (long long)s.m, (long long)s.n, (long long)s.k);
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const Shape shapes[] = {{1, 1, 1},    {13, 33, 3}, {29, 70, 513}, {5, 1100, 17}, {16, 7, 95},    {9, 40, 64},
                          {200, 45, 70}, {40, 600, 1100}, {3, 61, 200}, {2, 13, 97}, {0, 4, 4},   {4, 0, 4},
                          {3, 5, 0}};
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const GemmOperand formats[][2] = {{GemmOperand::kBFloat16, GemmOperand::kBFloat16},
                                    {GemmOperand::kFp8E4M3, GemmOperand::kFp8E4M3},
                                    {GemmOperand::kFp8E5M2, GemmOperand::kFp8E4M3},
                                    {GemmOperand::kFp8E4M3, GemmOperand::kBFloat16},
                                    {GemmOperand::kNvfp4, GemmOperand::kNvfp4},
                                    {GemmOperand::kBFloat16, GemmOperand::kNvfp4}};
  const SerialThreadPool serial;
  const test::TwoThreads two;
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    for (const Shape& s : shapes) {
      for (const auto& [a_format, b_format] : formats) {
        for (DType dtype : dtypes) {
          check_gemm(s, a_format, b_format, dtype, /*with_bias=*/true, /*accumulate=*/false, serial, rng, isa);
          check_gemm(s, a_format, b_format, dtype, /*with_bias=*/false, /*accumulate=*/false, two, rng, isa);
          check_gemm(s, a_format, b_format, dtype, /*with_bias=*/false, /*accumulate=*/true, two, rng, isa);
        }
      }
    }
    // Block-scaled FP8 (Float8BlockScaling's 1 x 128 activations and 128 x 128 weights, MXFP8's 1 x
    // 32 E8M0, a 2 x 64 grid), against bf16 and each other, few rows of a (the in-place path) and many.
    const BlockOption activation{1, 128, false}, weight{128, 128, false}, mx{1, 32, true}, small{2, 64, false};
    for (const Shape& s : {Shape{1, 70, 300}, Shape{16, 33, 129}, Shape{29, 70, 513}, Shape{200, 300, 260},
                           Shape{3, 5, 0}}) {
      for (DType dtype : dtypes) {
        check_gemm(s, GemmOperand::kFp8E4M3, GemmOperand::kFp8E4M3, dtype, true, false, two, rng, isa, activation,
                   weight);
        check_gemm(s, GemmOperand::kFp8E5M2, GemmOperand::kFp8E4M3, dtype, false, true, serial, rng, isa, mx, mx);
        check_gemm(s, GemmOperand::kBFloat16, GemmOperand::kFp8E4M3, dtype, false, false, two, rng, isa, {}, small);
        check_gemm(s, GemmOperand::kFp8E4M3, GemmOperand::kFp8E5M2, dtype, true, false, two, rng, isa, small, {});
      }
    }
    for (GemmOperand format :
         {GemmOperand::kBFloat16, GemmOperand::kFp8E4M3, GemmOperand::kFp8E5M2, GemmOperand::kNvfp4}) {
      for (const Shape& s : {Shape{5, 33, 70}, Shape{70, 600, 300}, Shape{230, 45, 1100}}) {
        check_packed_b(s, format, two, rng, isa);
      }
      for (const Shape& s : {Shape{8, 9, 40}, Shape{8, 40, 130}, Shape{70, 40, 300}}) {
        check_nan(s, format, /*in_a=*/true, two, rng, isa);
        check_nan(s, format, /*in_a=*/false, two, rng, isa);
      }
    }
  }
  if (detected_cpu_isa() >= CpuIsa::kAvx2) {
    limit_cpu_isa(CpuIsa::kAvx2);
    for (const Shape& s : {Shape{17, 16, 16}, Shape{29, 70, 513}, Shape{100, 33, 95}, Shape{230, 530, 1100}}) {
      check_nvfp4_block_order(s, serial, rng);
      check_nvfp4_block_order(s, two, rng);
    }
  }
  limit_cpu_isa(CpuIsa::kAmx);  // uncapped again
  if (detected_cpu_isa() == CpuIsa::kAmx) {
    for (const Shape& s : {Shape{12, 50, 300}, Shape{16, 33, 64}, Shape{17, 50, 300}, Shape{230, 530, 1100}}) {
      check_amx_against_avx512(s, GemmOperand::kFp8E4M3, GemmOperand::kFp8E5M2, rng);
      check_amx_against_avx512(s, GemmOperand::kNvfp4, GemmOperand::kNvfp4, rng);
    }
    for (const Shape& s : {Shape{1, 40, 64}, Shape{5, 70, 300}, Shape{32, 33, 100}, Shape{33, 40, 64},
                           Shape{40, 35, 600}}) {
      check_amx_order(s, rng);
    }
    std::printf("amx: checked against avx512 and the stated order\n");
  } else {
    std::printf("amx: not on this CPU (%s), its checks skipped\n", cpu_isa_name(detected_cpu_isa()));
  }
  TE_TEST_MAIN_RETURN();
}
