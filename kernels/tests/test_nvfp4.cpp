// NVFP4 casts: the scalar definitions on ties and edge amaxes, and every tier's amax, quantize
// and dequantize against those definitions (a plain loop per element here) for both block
// shapes, ragged edges, the transposed source (swapped strides), the random Hadamard
// transform, stochastic rounding, each input dtype, and two threads.
#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "check.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/nvfp4.h"
#include "te_kernels/philox.h"
#include "two_threads.h"

using namespace te_kernels;
using te_kernels::test::TwoThreads;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

void check_scalar_rules() {
  TE_CHECK(nvfp4_global_scale(0.0f).encode == FLT_MAX, "amax 0: S_enc is FLT_MAX");
  TE_CHECK(nvfp4_global_scale(kInf).encode == 1.0f, "amax inf: S_enc is 1");
  const Nvfp4GlobalScale unit = nvfp4_global_scale(2688.0f);
  TE_CHECK(unit.encode == 1.0f && unit.decode == 1.0f, "amax 2688: S_enc 1");
  TE_CHECK(nvfp4_block_scale(6.0f, unit.multiplier) == 0x38, "6 * fp32(1/6) rounds to 1.0 (E4M3 0x38)");
  TE_CHECK(nvfp4_block_encode(0x38, unit.decode) == 1.0f, "scale 1, S_dec 1: encode 1");
  TE_CHECK(nvfp4_block_encode(0, unit.decode) == FLT_MAX, "a zero scale: encode FLT_MAX");
  TE_CHECK(nvfp4_block_scale(1e30f, unit.multiplier) == 0x7E, "saturates at 448");
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t even[] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) {
    TE_CHECK(e2m1_code(ties[i]) == even[i], "tie %g: code %d", ties[i], e2m1_code(ties[i]));
    TE_CHECK(e2m1_code(-ties[i]) == (even[i] | 8), "tie %g: code %d", -ties[i], e2m1_code(-ties[i]));
  }
  TE_CHECK(e2m1_code(-0.1f) == 8 && e2m1_code(-0.0f) == 0 && e2m1_code(std::nanf("")) == 0, "-0, +0, NaN");
  TE_CHECK(e2m1_code(7.0f) == 7 && e2m1_code(-kInf) == 15, "saturation");
  TE_CHECK(e2m1_code_stochastic(1.25f, 0) == 3 && e2m1_code_stochastic(1.25f, 0xFFFFFFFFu) == 2,
           "half way: up for the smallest draw, down for the largest");
  TE_CHECK(e2m1_code_stochastic(6.0f, 0xFFFFFFFFu) == 7 && e2m1_code_stochastic(4.0f, 0) == 6, "grid points stay");
  TE_CHECK(e2m1_value(8) == 0.0f && std::signbit(e2m1_value(8)) && e2m1_value(15) == -6.0f, "code values");
}

// The source as float values, through the transform and its rounding to T when rht.
template <typename T>
std::vector<float> source_values(const std::vector<T>& in, int64_t rows, int64_t cols, bool transpose, bool rht) {
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      v[size_t(r * cols + c)] = to_float(in[size_t(transpose ? c * rows + r : r * cols + c)]);
    }
  if (!rht) return v;
  for (size_t b = 0; b < v.size(); b += kNvfp4Block) {
    float* y = v.data() + b;
    for (int i = 0; i < kNvfp4Block; ++i) y[i] *= kRhtSigns[i];
    for (int stride = 1; stride < kNvfp4Block; stride *= 2)
      for (int i = 0; i < kNvfp4Block; ++i)
        if (!(i & stride)) {
          const float a = y[i], b2 = y[i + stride];
          y[i] = a + b2, y[i + stride] = a - b2;
        }
    for (int i = 0; i < kNvfp4Block; ++i) y[i] = to_float(Convert<T>::from(y[i] * 0.25f));
  }
  return v;
}

struct Case {
  int64_t rows, cols;  // of what is cast
  int64_t block_rows;
  bool transpose, rht, stochastic;
};

// x holds the input: [rows, cols] of the cast, or [cols, rows] read transposed.
template <typename T>
void check_case(const Case& k, DType dtype, const ThreadPool& pool, const char* isa) {
  const int64_t n = k.rows * k.cols;
  std::vector<T> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float value = std::sin(float(i) * 0.37f) * std::ldexp(1.0f, int(i % 19) - 9) * (i % 641 == 7 ? 1e3f : 1.0f);
    x[size_t(i)] = Convert<T>::from(i % 97 == 3 ? std::nanf("") : i % 211 == 5 ? -kInf : value);
  }
  Nvfp4Source s;
  s.rows = k.rows, s.cols = k.cols, s.dtype = dtype, s.data = x.data(), s.rht = k.rht;
  s.row_stride = k.transpose ? 1 : k.cols, s.col_stride = k.transpose ? k.rows : 1;
  const std::vector<float> v = source_values(x, k.rows, k.cols, k.transpose, k.rht);

  // The amax (inf: the input holds -inf), and the finite values' one, which the cast is given
  // (a caller's amax below some values, as one reduced elsewhere can be: they saturate).
  float amax = -1.0f, want_amax = 0.0f, finite_amax = 0.0f;
  for (float value : v) {
    want_amax = std::fmax(want_amax, std::fabs(value));
    if (std::isfinite(value)) finite_amax = std::fmax(finite_amax, std::fabs(value));
  }
  Nvfp4AmaxParams a;
  a.source = s, a.amax = &amax;
  nvfp4_amax(a, pool);
  TE_CHECK(float_bits(amax) == float_bits(want_amax), "%s: amax %g want %g", isa, amax, want_amax);

  const int64_t data_cols = (k.cols + 1) / 2, scale_cols = (k.cols + kNvfp4Block - 1) / kNvfp4Block;
  std::vector<uint8_t> data(size_t(k.rows * data_cols)), scales(size_t(k.rows * scale_cols));
  Nvfp4QuantizeParams q;
  q.source = s, q.amax = &finite_amax, q.block_rows = k.block_rows, q.stochastic = k.stochastic;
  q.seed = 0x1234'5678'9ABC'DEF0ull, q.offset = (uint64_t(3) << 32) + 11;
  q.data = data.data(), q.scales = scales.data();
  nvfp4_quantize(q, pool);
  std::vector<float> back(static_cast<size_t>(n));
  Nvfp4DequantizeParams d;
  d.rows = k.rows, d.cols = k.cols, d.data = data.data(), d.scales = scales.data(), d.amax = &finite_amax;
  d.out = back.data();
  nvfp4_dequantize(d, pool);

  const Nvfp4GlobalScale g = nvfp4_global_scale(finite_amax);
  int reported = 0;
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.cols; ++c) {
      const int64_t r0 = r / k.block_rows * k.block_rows, c0 = c / kNvfp4Block * kNvfp4Block;
      float block_amax = 0.0f;
      for (int64_t i = r0; i < std::min(k.rows, r0 + k.block_rows); ++i)
        for (int64_t j = c0; j < std::min(k.cols, c0 + kNvfp4Block); ++j)
          block_amax = std::fmax(block_amax, std::fabs(v[size_t(i * k.cols + j)]));
      const uint8_t scale = nvfp4_block_scale(block_amax, g.multiplier);
      const float scaled = v[size_t(r * k.cols + c)] * nvfp4_block_encode(scale, g.decode);
      const Philox4 draw = philox4x32(uint32_t(c / 4), uint32_t(r), uint32_t(q.offset), uint32_t(q.offset >> 32),
                                      q.seed);
      const uint8_t code = k.stochastic ? e2m1_code_stochastic(scaled, draw.word[c % 4]) : e2m1_code(scaled);
      const uint8_t got = data[size_t(r * data_cols + c / 2)] >> (4 * (c % 2)) & 0xF;
      const float value = e2m1_value(code) * nvfp4_dequantize_factor(scale, finite_amax);
      const bool scale_ok = c % kNvfp4Block != 0 || scales[size_t(r * scale_cols + c / kNvfp4Block)] == scale;
      const float got_value = back[size_t(r * k.cols + c)];
      if ((!scale_ok || got != code || float_bits(got_value) != float_bits(value)) && reported++ < 5) {
        TE_CHECK(false, "%s [%lld x %lld] %lldx16 t%d r%d s%d at (%lld, %lld): scale ok %d, code %d want %d, "
                 "value %g want %g", isa, (long long)k.rows, (long long)k.cols, (long long)k.block_rows, k.transpose,
                 k.rht, k.stochastic, (long long)r, (long long)c, scale_ok, got, code, got_value, value);
      }
    }
}

void check_all(const ThreadPool& pool, const char* isa) {
  for (bool transpose : {false, true})
    for (bool rht : {false, true})
      for (bool stochastic : {false, true})
        for (int64_t block_rows : {int64_t(1), kNvfp4Block}) {
          const Case k{37, rht ? 304 : 299, block_rows, transpose, rht, stochastic};
          check_case<float>(k, DType::kFloat32, pool, isa);
          check_case<bf16_t>(k, DType::kBFloat16, pool, isa);
          check_case<fp16_t>(k, DType::kFloat16, pool, isa);
        }
  check_case<bf16_t>({20, 4400, 16, false, false, false}, DType::kBFloat16, pool, isa);  // two panels of a row
  check_case<bf16_t>({1, 1, 1, false, false, false}, DType::kBFloat16, pool, isa);
}

}  // namespace

int main() {
  check_scalar_rules();
  for (int tier = 0; tier <= int(std::min(detected_cpu_isa(), CpuIsa::kAvx512)); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    check_all(SerialThreadPool(), isa);
    check_all(TwoThreads(), isa);
  }
  limit_cpu_isa(CpuIsa::kAmx);  // uncapped again
  TE_TEST_MAIN_RETURN();
}
