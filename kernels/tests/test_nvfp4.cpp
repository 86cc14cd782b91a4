// NVFP4 casts: the scalar definitions on ties and edge amaxes, and every tier's amax, quantize
// and dequantize against those definitions (a plain loop per element here) for both block
// shapes, ragged edges, the transposed source (swapped strides), the random Hadamard
// transform, stochastic rounding, 4over6 (each error rule, its tile tree), row-scaled amaxes,
// the global scale's bound 256, each input dtype, and two threads.
#include <cfloat>
#include <cmath>
#include <limits>
#include <utility>
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
  TE_CHECK(e2m1_code_stochastic(1.25f, 0) == 3 && e2m1_code_stochastic(1.25f, 0xFF) == 2,
           "half way: up for the smallest draw, down for the largest");
  TE_CHECK(e2m1_code_stochastic(6.0f, 0xFF) == 7 && e2m1_code_stochastic(4.0f, 0) == 6, "grid points stay");
  // A fraction k / 256 of the step goes up for exactly k of the 256 draws: unbiased there.
  for (const int k : {1, 3, 128, 255}) {
    int up = 0;
    const float v = 4.0f + 2.0f * float(k) / 256.0f;
    for (int draw = 0; draw < 256; ++draw) up += e2m1_code_stochastic(v, uint8_t(draw)) == 7;
    TE_CHECK(up == k, "fraction %d / 256: %d of 256 draws go up", k, up);
  }
  const uint32_t counting[4] = {0x03020100u, 0x07060504u, 0x0B0A0908u, 0x0F0E0D0Cu};
  for (int64_t c = 0; c < 40; ++c) TE_CHECK(nvfp4_draw(counting, c) == c % 16, "column %lld's draw", (long long)c);
  TE_CHECK(e2m1_value(8) == 0.0f && std::signbit(e2m1_value(8)) && e2m1_value(15) == -6.0f, "code values");
  TE_CHECK(nvfp4_global_scale(1536.0f, 256.0f).encode == 1.0f, "e4m3_max 256: S_enc = 1536 / g");
  TE_CHECK(nvfp4_dequantize_factor(0x38, 1536.0f, 256.0f) == 1.0f, "e4m3_max 256: factor scale * g / 1536");
  // base = (6 / 6) * 1 = 1: map-to-6's scale 1 (0x38), map-to-4's 1.5 (0x3C); 448 bounds both.
  TE_CHECK(nvfp4_four_over_six_scale(6.0f, 1.0f, false) == 0x38 && nvfp4_four_over_six_scale(6.0f, 1.0f, true) == 0x3C,
           "4over6 candidates");
  TE_CHECK(nvfp4_four_over_six_scale(kInf, 1.0f, true) == 0x7E, "4over6 saturates at 448");
  // 4.5 with scale 1.5 is code 3 (value 3): exact; with scale 1, code 6 (value 4): 0.5 off.
  const Nvfp4GlobalScale unit_g = nvfp4_global_scale(2688.0f);
  TE_CHECK(nvfp4_error_term(4.5f, 5, 1.5f, unit_g, 448.0f, Nvfp4FourOverSix::kMae, false) == 0.0f &&
               nvfp4_error_term(4.5f, 6, 1.0f, unit_g, 448.0f, Nvfp4FourOverSix::kMse, true) == 0.25f,
           "4over6 error terms");
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
  bool per_row = false;  // row-scaled: each row's amax
  float e4m3_max = kNvfp4ScaleMax;
  Nvfp4FourOverSix four_over_six = Nvfp4FourOverSix::kOff;
  bool scaled_error = false;
};

// 4over6's scale of the block (tile) at (r0, c0) of the source values v: both candidates'
// codes and error terms, each row's sum in order, a tile's row sums as a tree (its padding
// rows and columns counted as zeros), map-to-4 where its error is smaller.
uint8_t four_over_six_scale(const std::vector<float>& v, const Case& k, int64_t r0, int64_t c0, float block_amax,
                            const Nvfp4GlobalScale& g) {
  uint8_t scale[2];
  float error[2];
  for (int c = 0; c < 2; ++c) {  // map-to-4, map-to-6
    scale[c] = nvfp4_four_over_six_scale(block_amax, g.encode, c == 0);
    const float s = fp8_to_float(scale[c], Fp8Format::kE4M3), encode = nvfp4_block_encode(scale[c], g.decode);
    float row_error[kNvfp4Block] = {};
    for (int64_t i = 0; i < k.block_rows; ++i)
      for (int64_t j = 0; j < kNvfp4Block; ++j) {
        const int64_t r = r0 + i, col = c0 + j;
        const float x = r < k.rows && col < k.cols ? v[size_t(r * k.cols + col)] : 0.0f;
        row_error[i] = row_error[i] + nvfp4_error_term(x, e2m1_code(x * encode), s, g, k.e4m3_max, k.four_over_six,
                                                       k.scaled_error);
      }
    for (int64_t half = k.block_rows / 2; half > 0; half /= 2)
      for (int64_t i = 0; i < half; ++i) row_error[i] = row_error[i] + row_error[i + half];
    error[c] = row_error[0];
  }
  return error[0] < error[1] ? scale[0] : scale[1];
}

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
  // (a caller's amax below some values, as one reduced elsewhere can be: they saturate); each
  // row's when row-scaled.
  const int64_t amaxes = k.per_row ? k.rows : 1;
  std::vector<float> amax(size_t(amaxes), -1.0f), want_amax(size_t(amaxes), 0.0f), finite_amax(size_t(amaxes), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const size_t row = k.per_row ? size_t(i / k.cols) : 0;
    want_amax[row] = std::fmax(want_amax[row], std::fabs(v[size_t(i)]));
    if (std::isfinite(v[size_t(i)])) finite_amax[row] = std::fmax(finite_amax[row], std::fabs(v[size_t(i)]));
  }
  Nvfp4AmaxParams a;
  a.source = s, a.per_row = k.per_row, a.amax = amax.data();
  nvfp4_amax(a, pool);
  for (int64_t i = 0; i < amaxes; ++i) {
    TE_CHECK(float_bits(amax[size_t(i)]) == float_bits(want_amax[size_t(i)]), "%s: amax[%lld] %g want %g", isa,
             (long long)i, amax[size_t(i)], want_amax[size_t(i)]);
  }

  const int64_t data_cols = (k.cols + 1) / 2, scale_cols = (k.cols + kNvfp4Block - 1) / kNvfp4Block;
  std::vector<uint8_t> data(size_t(k.rows * data_cols)), scales(size_t(k.rows * scale_cols));
  Nvfp4QuantizeParams q;
  q.source = s, q.amax = finite_amax.data(), q.amax_per_row = k.per_row, q.e4m3_max = k.e4m3_max;
  q.block_rows = k.block_rows, q.stochastic = k.stochastic;
  q.four_over_six = k.four_over_six, q.scaled_error = k.scaled_error;
  q.seed = 0x1234'5678'9ABC'DEF0ull, q.offset = (uint64_t(3) << 32) + 11;
  q.data = data.data(), q.scales = scales.data();
  nvfp4_quantize(q, pool);
  std::vector<float> back(static_cast<size_t>(n));
  Nvfp4DequantizeParams d;
  d.rows = k.rows, d.cols = k.cols, d.data = data.data(), d.scales = scales.data(), d.amax = finite_amax.data();
  d.amax_per_row = k.per_row, d.e4m3_max = k.e4m3_max;
  d.out = back.data();
  nvfp4_dequantize(d, pool);

  int reported = 0;
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.cols; ++c) {
      const float g_amax = finite_amax[k.per_row ? size_t(r) : 0];
      const Nvfp4GlobalScale g = nvfp4_global_scale(g_amax, k.e4m3_max);
      const int64_t r0 = r / k.block_rows * k.block_rows, c0 = c / kNvfp4Block * kNvfp4Block;
      float block_amax = 0.0f;
      for (int64_t i = r0; i < std::min(k.rows, r0 + k.block_rows); ++i)
        for (int64_t j = c0; j < std::min(k.cols, c0 + kNvfp4Block); ++j)
          block_amax = std::fmax(block_amax, std::fabs(v[size_t(i * k.cols + j)]));
      const uint8_t scale = k.four_over_six == Nvfp4FourOverSix::kOff
                                ? nvfp4_block_scale(block_amax, g.multiplier)
                                : four_over_six_scale(v, k, r0, c0, block_amax, g);
      const float scaled = v[size_t(r * k.cols + c)] * nvfp4_block_encode(scale, g.decode);
      const Philox4 draw = philox4x32(uint32_t(c / kNvfp4Block), uint32_t(r), uint32_t(q.offset),
                                      uint32_t(q.offset >> 32), q.seed);
      const uint8_t code = k.stochastic ? e2m1_code_stochastic(scaled, nvfp4_draw(draw.word, c)) : e2m1_code(scaled);
      const uint8_t got = data[size_t(r * data_cols + c / 2)] >> (4 * (c % 2)) & 0xF;
      const float value = e2m1_value(code) * nvfp4_dequantize_factor(scale, g_amax, k.e4m3_max);
      const bool scale_ok = c % kNvfp4Block != 0 || scales[size_t(r * scale_cols + c / kNvfp4Block)] == scale;
      const float got_value = back[size_t(r * k.cols + c)];
      if ((!scale_ok || got != code || float_bits(got_value) != float_bits(value)) && reported++ < 5) {
        TE_CHECK(false, "%s [%lld x %lld] %lldx16 t%d r%d s%d row-scaled %d E %g 4over6 %d%s at (%lld, %lld): "
                 "scale ok %d, code %d want %d, value %g want %g", isa, (long long)k.rows, (long long)k.cols,
                 (long long)k.block_rows, k.transpose, k.rht, k.stochastic, k.per_row, k.e4m3_max,
                 int(k.four_over_six), k.scaled_error ? " scaled" : "", (long long)r, (long long)c, scale_ok, got,
                 code, got_value, value);
      }
    }
}

// Two blocks whose 4over6 choice flips where a kernel fuses the scaled error's x * S_enc into
// its difference (one rounding where the reference rounds twice): with amax 15.5625 both keep
// map-to-6, with the error "mae" and "mse".
void check_scaled_error_rounds_its_products(const ThreadPool& pool, const char* isa) {
  const float blocks[2][kNvfp4Block] = {
      {-1.2265625f, -4.25f, -0.1669921875f, -0.97265625f, 2.765625f, 3.3125f, 6.59375f, -1.7734375f, 5.1875f,
       -0.0791015625f, -2.578125f, -0.08642578125f, -0.47265625f, 0.2431640625f, -1.828125f, -0.06201171875f},
      {1.046875f, 1.3203125f, -7.75f, -2.203125f, 2.421875f, 1.7734375f, -3.75f, -2.6875f, 0.7265625f, -0.98828125f,
       3.046875f, 3.390625f, 1.265625f, 1.328125f, 0.953125f, 3.15625f}};
  const float amax = 15.5625f;
  const Nvfp4GlobalScale g = nvfp4_global_scale(amax);
  for (int b = 0; b < 2; ++b) {
    Nvfp4QuantizeParams q;
    q.source.rows = 1, q.source.cols = kNvfp4Block, q.source.data = blocks[b], q.source.row_stride = kNvfp4Block;
    q.amax = &amax, q.four_over_six = b == 0 ? Nvfp4FourOverSix::kMae : Nvfp4FourOverSix::kMse, q.scaled_error = true;
    uint8_t data[kNvfp4Block / 2], scale = 0;
    q.data = data, q.scales = &scale;
    nvfp4_quantize(q, pool);
    float block_amax = 0.0f;
    for (float x : blocks[b]) block_amax = std::fmax(block_amax, std::fabs(x));
    const uint8_t map_to_6 = nvfp4_four_over_six_scale(block_amax, g.encode, false);
    TE_CHECK(scale == map_to_6, "%s: block %d keeps map-to-6 (%g), got %g", isa, b,
             fp8_to_float(map_to_6, Fp8Format::kE4M3), fp8_to_float(scale, Fp8Format::kE4M3));
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
  // 4over6 with each error rule, both block shapes, through the transpose and the transform.
  int variant = 0;
  for (Nvfp4FourOverSix rule : {Nvfp4FourOverSix::kMae, Nvfp4FourOverSix::kMse})
    for (bool scaled_error : {false, true})
      for (int64_t block_rows : {int64_t(1), kNvfp4Block}) {
        const bool transpose = variant % 2, rht = variant / 2 % 2;
        Case k{37, rht ? 304 : 299, block_rows, transpose, rht, false};
        k.e4m3_max = variant++ % 3 == 0 ? 256.0f : 448.0f, k.four_over_six = rule, k.scaled_error = scaled_error;
        check_case<float>(k, DType::kFloat32, pool, isa);
        check_case<bf16_t>(k, DType::kBFloat16, pool, isa);
        check_case<fp16_t>(k, DType::kFloat16, pool, isa);
      }
  // Row-scaled, with and without 4over6, and e4m3_max 256 alone.
  for (bool transpose : {false, true})
    for (bool rht : {false, true}) {
      Case k{37, rht ? 304 : 299, 1, transpose, rht, false};
      k.per_row = true, k.four_over_six = rht ? Nvfp4FourOverSix::kMse : Nvfp4FourOverSix::kOff;
      check_case<float>(k, DType::kFloat32, pool, isa);
      check_case<bf16_t>(k, DType::kBFloat16, pool, isa);
    }
  Case bound{37, 299, 16, false, false, true};
  bound.e4m3_max = 256.0f;
  check_case<fp16_t>(bound, DType::kFloat16, pool, isa);
  check_case<bf16_t>({20, 4400, 16, false, false, false}, DType::kBFloat16, pool, isa);  // two panels of a row
  check_case<bf16_t>({1, 1, 1, false, false, false}, DType::kBFloat16, pool, isa);
  // The transposed gather's 16 x 16 tiles: casts whose columns (the input's rows) end inside a
  // tile or past a panel of 256, and whose rows end inside a strip of 16.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{70, 33}, {300, 257}, {48, 4100}, {4096, 16}}) {
    const bool rht = cols % kNvfp4Block == 0;
    check_case<float>({rows, cols, 16, true, rht, true}, DType::kFloat32, pool, isa);
    check_case<bf16_t>({rows, cols, 1, true, false, false}, DType::kBFloat16, pool, isa);
    check_case<fp16_t>({rows, cols, 16, true, rht, false}, DType::kFloat16, pool, isa);
  }
}

}  // namespace

// nvfp4_transpose_tiles of a 16 x 16-tile cast's row-wise codes gives the transposed cast's
// bytes: whole SIMD steps (16 rows x 32 columns) and ragged edges in both directions.
void check_transpose_tiles(const ThreadPool& pool, int64_t rows, int64_t cols) {
  std::vector<float> x(size_t(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.61f) * std::ldexp(1.0f, int(i % 23) - 11);
  float amax = 0.0f;
  for (const float value : x) amax = std::fmax(amax, std::fabs(value));
  // The row-wise cast of x [rows, cols] and the cast of x^T (x read with its strides swapped).
  const auto cast = [&](bool transpose, std::vector<uint8_t>& data, std::vector<uint8_t>& scales) {
    Nvfp4QuantizeParams q;
    q.source.rows = transpose ? cols : rows, q.source.cols = transpose ? rows : cols;
    q.source.row_stride = transpose ? 1 : cols, q.source.col_stride = transpose ? cols : 1;
    q.source.dtype = DType::kFloat32, q.source.data = x.data();
    q.amax = &amax, q.block_rows = kNvfp4Block;
    data.assign(size_t(q.source.rows * ((q.source.cols + 1) / 2)), 0xAA);
    scales.assign(size_t(q.source.rows * ((q.source.cols + kNvfp4Block - 1) / kNvfp4Block)), 0xAA);
    q.data = data.data(), q.scales = scales.data();
    nvfp4_quantize(q, pool);
  };
  std::vector<uint8_t> data, scales, want_data, want_scales;
  cast(false, data, scales);
  cast(true, want_data, want_scales);
  std::vector<uint8_t> got_data(want_data.size(), 0x55), got_scales(want_scales.size(), 0x55);
  Nvfp4TransposeTilesParams t;
  t.rows = rows, t.cols = cols, t.data = data.data(), t.scales = scales.data();
  t.transposed_data = got_data.data(), t.transposed_scales = got_scales.data();
  nvfp4_transpose_tiles(t, pool);
  TE_CHECK(got_data == want_data, "transpose_tiles [%lld x %lld]: the codes differ", (long long)rows, (long long)cols);
  TE_CHECK(got_scales == want_scales, "transpose_tiles [%lld x %lld]: the scales differ", (long long)rows,
           (long long)cols);
}

int main() {
  check_scalar_rules();
  for (const auto& shape : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {16, 32}, {17, 33}, {48, 96}, {130, 70},
                                                                    {257, 515}, {0, 5}, {6, 0}}) {
    check_transpose_tiles(SerialThreadPool(), shape.first, shape.second);
    check_transpose_tiles(TwoThreads(), shape.first, shape.second);
  }
  for (int tier = 0; tier <= int(std::min(detected_cpu_isa(), CpuIsa::kAvx512)); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    check_all(SerialThreadPool(), isa);
    check_all(TwoThreads(), isa);
    check_scaled_error_rounds_its_products(SerialThreadPool(), isa);
  }
  limit_cpu_isa(CpuIsa::kAmx);  // uncapped again
  TE_TEST_MAIN_RETURN();
}
