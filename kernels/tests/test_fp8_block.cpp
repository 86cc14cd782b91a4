// Block-scaled FP8 casts: the scale definitions on edge amaxes, and every tier's quantize
// and dequantize against the scalar definitions for all block layouts, ragged edges and
// two threads.
#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "check.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8_block.h"
#include "two_threads.h"

using namespace te_kernels;
using te_kernels::test::TwoThreads;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

void check_scale_rules() {
  const auto fp32 = [](float amax, float eps = 0.0f) { return block_scale(amax, 448.0f, BlockScaleMode::kFp32, eps); };
  TE_CHECK(fp32(2.0f).scale == 224.0f && fp32(2.0f).scale_inv == 1.0f / 224.0f, "448 / 2");
  TE_CHECK(fp32(0.0f).scale == 1.0f && fp32(kInf).scale == 1.0f && fp32(std::nanf("")).scale == 1.0f,
           "amax 0, inf, NaN give scale 1");
  TE_CHECK(fp32(1e-40f).scale == FLT_MAX, "a tiny amax gives FLT_MAX");
  TE_CHECK(fp32(0.0f, 0.5f).scale == 896.0f, "amax_epsilon bounds the amax");
  const BlockScale pow2 = block_scale(3.0f, 448.0f, BlockScaleMode::kPow2, 0.0f);
  TE_CHECK(pow2.scale == 128.0f && pow2.scale_inv == 1.0f / 128.0f, "448 / 3 rounds down to 128, got %g", pow2.scale);
  const auto mx = [](float amax) { return block_scale(amax, 448.0f, BlockScaleMode::kE8M0, 0.0f); };
  TE_CHECK(mx(448.0f).e8m0 == 127 && mx(448.0f).scale == 1.0f, "amax 448 is exponent 127");
  TE_CHECK(mx(449.0f).e8m0 == 128 && mx(449.0f).scale == 0.5f, "amax 449 rounds the exponent up");
  TE_CHECK(mx(224.0f).e8m0 == 126 && mx(224.0f).scale_inv == 0.5f, "amax 224 is exponent 126");
  TE_CHECK(mx(0.0f).e8m0 == 0 && mx(0.0f).scale == std::ldexp(1.0f, 127), "amax 0 is exponent 0");
  TE_CHECK(mx(kInf).e8m0 == 254 && mx(std::nanf("")).e8m0 == 255 && std::isnan(mx(std::nanf("")).scale),
           "inf is 254, NaN is 255");
  TE_CHECK(e8m0_to_float(0) == std::ldexp(1.0f, -127) && e8m0_to_float(254) == std::ldexp(1.0f, 127) &&
               std::isnan(e8m0_to_float(255)), "E8M0 decoding");
}

struct Layout {
  int64_t rows, cols, block_rows, block_cols;
  BlockScaleMode mode;
};

// Quantize then dequantize x [rows, cols] (bf16, with a NaN-free wide range and a hot
// outlier block) and compare every code, scale and value with the scalar definitions.
void check_layout(const Layout& l, Fp8Format f, const ThreadPool& pool, const char* isa) {
  std::vector<bf16_t> x(size_t(l.rows * l.cols));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = to_bf16(std::sin(float(i) * 0.37f) * std::ldexp(1.0f, int(i % 23) - 11) * (i % 997 == 5 ? 1e6f : 1.0f));
  }
  const int64_t grid_rows = (l.rows + l.block_rows - 1) / l.block_rows;
  const int64_t grid_cols = (l.cols + l.block_cols - 1) / l.block_cols;
  const bool e8m0 = l.mode == BlockScaleMode::kE8M0;
  std::vector<uint8_t> codes(x.size()), exponents(size_t(grid_rows * grid_cols));
  std::vector<float> scale_inv(size_t(grid_rows * grid_cols)), back(x.size());
  Fp8BlockQuantizeParams q;
  q.rows = l.rows, q.cols = l.cols, q.block_rows = l.block_rows, q.block_cols = l.block_cols;
  q.in_dtype = DType::kBFloat16, q.in = x.data(), q.format = f, q.mode = l.mode, q.out = codes.data();
  q.scale_inv = e8m0 ? static_cast<void*>(exponents.data()) : static_cast<void*>(scale_inv.data());
  fp8_block_quantize(q, pool);
  Fp8BlockDequantizeParams d;
  d.rows = l.rows, d.cols = l.cols, d.block_rows = l.block_rows, d.block_cols = l.block_cols, d.in = codes.data();
  d.format = f, d.e8m0_scales = e8m0, d.scale_inv = q.scale_inv, d.out_dtype = DType::kFloat32, d.out = back.data();
  fp8_block_dequantize(d, pool);

  int reported = 0;
  for (int64_t br = 0; br < grid_rows; ++br)
    for (int64_t bc = 0; bc < grid_cols; ++bc) {
      float amax = 0.0f;
      const int64_t r1 = std::min(l.rows, (br + 1) * l.block_rows), c1 = std::min(l.cols, (bc + 1) * l.block_cols);
      for (int64_t r = br * l.block_rows; r < r1; ++r)
        for (int64_t c = bc * l.block_cols; c < c1; ++c) amax = std::fmax(amax, std::fabs(to_float(x[size_t(r * l.cols + c)])));
      const BlockScale want = block_scale(amax, fp8_max(f), l.mode, 0.0f);
      const size_t slot = size_t(br * grid_cols + bc);
      if (e8m0) TE_CHECK(exponents[slot] == want.e8m0, "%s: block (%lld, %lld) exponent", isa, (long long)br, (long long)bc);
      else TE_CHECK(scale_inv[slot] == want.scale_inv, "%s: block (%lld, %lld) scale_inv", isa, (long long)br, (long long)bc);
      for (int64_t r = br * l.block_rows; r < r1; ++r)
        for (int64_t c = bc * l.block_cols; c < c1; ++c) {
          const size_t i = size_t(r * l.cols + c);
          const uint8_t code = to_fp8(to_float(x[i]) * want.scale, f);
          const float value = fp8_to_float(code, f) * want.scale_inv;
          if ((codes[i] != code || float_bits(back[i]) != float_bits(value)) && reported++ < 5) {
            TE_CHECK(false, "%s [%lld x %lld] / [%lld x %lld] at (%lld, %lld): code %#x want %#x, value %g want %g", isa,
                     (long long)l.rows, (long long)l.cols, (long long)l.block_rows, (long long)l.block_cols,
                     (long long)r, (long long)c, codes[i], code, back[i], value);
          }
        }
    }
}

// A NaN stays in its own code: its block's amax skips it (fmaxf semantics, as every amax),
// so that block's scale is the one of its finite values, and the other elements cast as usual.
void check_nan_stays_in_its_block(const char* isa) {
  std::vector<float> x(2 * 32, 1.0f);
  x[3] = std::nanf("");
  std::vector<uint8_t> codes(x.size()), exponents(2);
  Fp8BlockQuantizeParams q;
  q.rows = 1, q.cols = 64, q.block_rows = 1, q.block_cols = 32, q.in = x.data(), q.mode = BlockScaleMode::kE8M0;
  q.out = codes.data(), q.scale_inv = exponents.data();
  fp8_block_quantize(q, SerialThreadPool());
  TE_CHECK(exponents[0] == 127 - 8 && exponents[1] == 127 - 8, "%s: exponents %d %d", isa, exponents[0], exponents[1]);
  TE_CHECK(std::isnan(fp8_to_float(codes[3], Fp8Format::kE4M3)), "%s: the NaN is a NaN code", isa);
  TE_CHECK(fp8_to_float(codes[4], Fp8Format::kE4M3) == 256.0f, "%s: its neighbours are scaled by 2^8", isa);
  TE_CHECK(fp8_to_float(codes[40], Fp8Format::kE4M3) == 256.0f, "%s: the clean block is scaled by 2^8", isa);
}

}  // namespace

int main() {
  check_scale_rules();
  const std::vector<Layout> layouts = {
      {5, 300, 1, 128, BlockScaleMode::kPow2},     {5, 300, 1, 128, BlockScaleMode::kFp32},
      {300, 260, 128, 128, BlockScaleMode::kPow2}, {300, 7, 128, 1, BlockScaleMode::kPow2},
      {3, 100, 1, 32, BlockScaleMode::kE8M0},      {70, 45, 32, 1, BlockScaleMode::kE8M0},
      {2, 2500, 1, 128, BlockScaleMode::kFp32},    {1, 1, 128, 128, BlockScaleMode::kE8M0},
  };
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (const Layout& l : layouts) {
        check_layout(l, f, SerialThreadPool(), isa);
        check_layout(l, f, TwoThreads(), isa);
      }
    check_nan_stays_in_its_block(isa);
  }
  limit_cpu_isa(CpuIsa::kAmx);  // uncapped again
  TE_TEST_MAIN_RETURN();
}
