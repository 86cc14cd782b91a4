// Scalar FP8 conversions: saturation, rounding ties, subnormals, NaN, and round trips.
#include <cmath>
#include <limits>

#include <utility>
#include <vector>

#include "check.h"
#include "two_threads.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8.h"

using namespace te_kernels;
using te_kernels::test::TwoThreads;

namespace {

// Vector quantize of every tier against the scalar definition: codes bit for bit, amax
// with fmaxf semantics (NaN skipped, inf counts); inputs sweep the fp32 range (normals, subnormal FP8 range, ties,
// overflow, inf, NaN) and the length leaves a scalar tail.
void check_quantize(Fp8Format f, float scale, bool with_nan, const char* isa) {
  std::vector<float> x;
  for (uint32_t bits = 0x30000000u; bits < 0x48000000u; bits += 0x00001357u) {
    x.push_back(bits_float(bits));
    x.push_back(-bits_float(bits + 0x100u));
  }
  for (float v : {0.0f, -0.0f, 448.0f, 464.0f, 57344.0f, 61440.0f, 1e30f, -1e30f}) x.push_back(v);
  x.push_back(std::numeric_limits<float>::infinity());
  if (with_nan) x.insert(x.begin() + 1000, std::nanf(""));
  x.push_back(0.3f);  // odd length: a scalar tail
  std::vector<uint8_t> codes(x.size());
  float amax = -1.0f;
  std::vector<float> workspace(64);
  Fp8QuantizeParams p;
  p.numel = int64_t(x.size()), p.in_dtype = DType::kFloat32, p.in = x.data(), p.format = f;
  p.scale = &scale, p.out = codes.data(), p.amax = &amax, p.workspace = workspace.data();
  fp8_quantize(p, SerialThreadPool());
  int reported = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint8_t want = to_fp8(x[i] * scale, f);
    if (codes[i] != want && reported++ < 5)
      TE_CHECK(false, "%s: %g * %g -> %#x, scalar %#x", isa, x[i], scale, codes[i], want);
  }
  TE_CHECK(amax == std::numeric_limits<float>::infinity(), "%s: amax %g%s", isa, amax, with_nan ? " (with a NaN)" : "");
}

// The amax of x (NaNs at the front, in the vector body and in the scalar tail) through
// fp8_quantize; the codes of the NaN elements stay NaN.
float amax_of(const std::vector<float>& x, const ThreadPool& pool) {
  std::vector<uint8_t> codes(x.size());
  std::vector<float> workspace(64);
  float scale = 1.0f, amax = -1.0f;
  Fp8QuantizeParams p;
  p.numel = int64_t(x.size()), p.in_dtype = DType::kFloat32, p.in = x.data(), p.format = Fp8Format::kE4M3;
  p.scale = &scale, p.out = codes.data(), p.amax = &amax, p.workspace = workspace.data();
  fp8_quantize(p, pool);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) TE_CHECK((codes[i] & 0x7f) == 0x7f, "NaN at %zu gave code %#x", i, codes[i]);
  }
  return amax;
}

// TransformerEngine's amax semantics: NaN elements never enter an amax (one NaN would
// otherwise freeze delayed scaling for a whole history); inf does; NaN alone gives 0.
void check_amax_skips_nan(const char* isa) {
  const float nan = std::nanf("");
  for (size_t n : {size_t(1), size_t(15), size_t(200), size_t(70000)}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = float((i * 37) % 101) * 0.25f - 12.0f;  // max |x| 13.0
    for (size_t i : {size_t(0), n / 2, n - 1}) x[i] = nan;
    float want = 0.0f;
    for (float v : x) want = std::isnan(v) ? want : std::fmax(want, std::fabs(v));
    TE_CHECK(amax_of(x, SerialThreadPool()) == want, "%s: n=%zu amax skips NaN", isa, n);
    TE_CHECK(amax_of(x, TwoThreads()) == want, "%s: n=%zu amax skips NaN (two threads)", isa, n);
    x[n / 3] = -std::numeric_limits<float>::infinity();
    TE_CHECK(std::isinf(amax_of(x, TwoThreads())), "%s: n=%zu inf counts beside NaN", isa, n);
    std::fill(x.begin(), x.end(), nan);
    TE_CHECK(amax_of(x, TwoThreads()) == 0.0f, "%s: n=%zu all NaN gives amax 0", isa, n);
  }
}

void check_dequantize(Fp8Format f, const char* isa) {
  std::vector<uint8_t> codes(256 + 5);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i);
  const float scale_inv = 0.375f;
  std::vector<float> out(codes.size());
  Fp8DequantizeParams p;
  p.numel = int64_t(codes.size()), p.in = codes.data(), p.format = f, p.scale_inv = &scale_inv;
  p.out_dtype = DType::kFloat32, p.out = out.data();
  fp8_dequantize(p, SerialThreadPool());
  for (size_t i = 0; i < codes.size(); ++i) {
    const float want = fp8_to_float(codes[i], f) * scale_inv;
    TE_CHECK(float_bits(out[i]) == float_bits(want) || (std::isnan(out[i]) && std::isnan(want)),
             "%s: code %#x -> %g, scalar %g", isa, codes[i], out[i], want);
  }
}

// Quantize with the fused transpose, odd shapes, on several threads: both layouts hold the
// scalar codes and the amax is the input's.
void check_quantize_transpose(Fp8Format f, int64_t rows, int64_t cols, const ThreadPool& pool, const char* isa) {
  std::vector<bf16_t> x(size_t(rows * cols));
  float want_amax = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = to_bf16(std::sin(float(i) * 0.37f) * float(1 + i % 13) * 40.0f);
    want_amax = std::fmax(want_amax, std::fabs(to_float(x[i])));
  }
  std::vector<uint8_t> out(x.size()), out_t(x.size());
  float scale = 0.75f, amax = -1;
  std::vector<float> workspace(64);
  Fp8QuantizeParams p;
  p.numel = rows * cols, p.in_dtype = DType::kBFloat16, p.in = x.data(), p.format = f, p.scale = &scale;
  p.out = out.data(), p.amax = &amax, p.workspace = workspace.data(), p.out_t = out_t.data(), p.rows = rows, p.cols = cols;
  fp8_quantize(p, pool);
  int reported = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t want = to_fp8(to_float(x[size_t(r * cols + c)]) * scale, f);
      if ((out[size_t(r * cols + c)] != want || out_t[size_t(c * rows + r)] != want) && reported++ < 5)
        TE_CHECK(false, "%s [%lld x %lld] at (%lld, %lld): %#x / transposed %#x, want %#x", isa, (long long)rows,
                 (long long)cols, (long long)r, (long long)c, out[size_t(r * cols + c)], out_t[size_t(c * rows + r)], want);
    }
  TE_CHECK(amax == want_amax, "%s: amax %g, want %g", isa, amax, want_amax);
}

}  // namespace

// fp8_transpose: every byte where the transpose puts it, partial blocks and tiles included.
void check_transpose(int64_t rows, int64_t cols, const ThreadPool& pool, const char* isa) {
  std::vector<uint8_t> in(rows * cols), out(rows * cols, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i * 37 + 11);
  Fp8TransposeParams p;
  p.rows = rows, p.cols = cols, p.in = in.data(), p.out = out.data();
  fp8_transpose(p, pool);
  int bad = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      if (out[j * rows + i] != in[i * cols + j] && bad++ < 3) {
        TE_CHECK(false, "%s transpose %lldx%lld at (%lld, %lld)", isa, (long long)rows, (long long)cols, (long long)i,
                 (long long)j);
      }
    }
  }
}

int main() {
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (float scale : {1.0f, 3.7f, 1.0f / 1024}) check_quantize(f, scale, false, isa);
      check_quantize(f, 1.0f, true, isa);
      check_dequantize(f, isa);
      check_amax_skips_nan(isa);
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 70}, {130, 65}, {64, 64}, {257, 129}}) {
        check_quantize_transpose(f, rows, cols, SerialThreadPool(), isa);
        check_quantize_transpose(f, rows, cols, TwoThreads(), isa);
        check_transpose(rows, cols, TwoThreads(), isa);
      }
    }
    // Past the streaming threshold: rows aligned for the codes to be streamed straight from
    // registers (cols % 32 == 0, a ragged last strip), and rows that are not.
    check_quantize_transpose(Fp8Format::kE4M3, 4099, 4096, TwoThreads(), isa);
    check_quantize_transpose(Fp8Format::kE5M2, 4097, 4100, TwoThreads(), isa);
  }
  limit_cpu_isa(CpuIsa::kAmx);  // uncapped again

  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const char* name = f == Fp8Format::kE4M3 ? "e4m3" : "e5m2";
    // Every code that is a number converts back to itself.
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(uint8_t(c), f);
      if (std::isnan(v)) continue;
      if (std::isinf(v)) {
        TE_CHECK(to_fp8(v, f) == ((c & 0x80) | 0x7b), "%s: inf saturates to max", name);
        continue;
      }
      TE_CHECK(to_fp8(v, f) == (v == 0 ? (c & 0x80) : c), "%s: round trip of code %#x (%g)", name, c, v);
    }
    const float max = fp8_max(f);
    TE_CHECK(fp8_to_float(to_fp8(1e30f, f), f) == max, "%s saturates", name);
    TE_CHECK(fp8_to_float(to_fp8(-1e30f, f), f) == -max, "%s saturates negative", name);
    TE_CHECK(fp8_to_float(to_fp8(std::numeric_limits<float>::infinity(), f), f) == max, "%s inf saturates", name);
    TE_CHECK(std::isnan(fp8_to_float(to_fp8(std::nanf(""), f), f)), "%s NaN stays NaN", name);
    // Midpoints between neighbouring codes round to the even code.
    for (int c = 1; c < 0x7e; ++c) {
      const float lo = fp8_to_float(uint8_t(c), f), hi = fp8_to_float(uint8_t(c + 1), f);
      if (std::isnan(hi) || std::isinf(hi)) continue;
      const uint8_t got = to_fp8((lo + hi) / 2, f);
      TE_CHECK(got == ((c & 1) ? c + 1 : c), "%s: midpoint of %#x and %#x gave %#x", name, c, c + 1, got);
    }
  }
  TE_CHECK(fp8_max(Fp8Format::kE4M3) == 448.0f && fp8_max(Fp8Format::kE5M2) == 57344.0f, "maxima");
  TE_CHECK(to_fp8(448.0f, Fp8Format::kE4M3) == 0x7e, "448 is e4m3 0x7e");
  TE_CHECK(to_fp8(464.0f, Fp8Format::kE4M3) == 0x7e, "464 saturates to 448");
  TE_CHECK(to_fp8(57344.0f, Fp8Format::kE5M2) == 0x7b, "57344 is e5m2 0x7b");
  TE_CHECK(to_fp8(std::ldexp(1.0f, -10), Fp8Format::kE4M3) == 0x00, "half the smallest e4m3 subnormal ties to 0");
  TE_CHECK(to_fp8(std::ldexp(1.5f, -10), Fp8Format::kE4M3) == 0x01, "above the tie rounds up");
  TE_CHECK(to_fp8(std::ldexp(1.0f, -17), Fp8Format::kE5M2) == 0x00, "half the smallest e5m2 subnormal ties to 0");
  TE_TEST_MAIN_RETURN();
}
