// The bf16 GEMM (te_kernels/gemm.h) of every SIMD tier this CPU has, serial and on two threads,
// against a double-precision evaluation: shapes with partial tiles in m, n and k (odd k, k past
// a slice, n past a strip), every output dtype, alpha and bias, row strides longer than the
// rows, and empty sizes. Each result must be the exact value rounded once, up to fp32
// summation error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "check.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/gemm.h"
#include "two_threads.h"

using namespace te_kernels;

namespace {

struct Shape {
  int64_t m, n, k;
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

void check_gemm(Shape s, DType out_dtype, bool with_bias, const ThreadPool& pool, std::mt19937& rng,
                const char* isa) {
  const int64_t lda = s.k + 3, ldb = s.k + 5;  // rows longer than k: strides are honoured
  std::normal_distribution<float> normal;
  std::vector<bf16_t> a(s.m * lda), b(s.n * ldb);
  for (bf16_t& v : a) v = to_bf16(normal(rng));
  for (bf16_t& v : b) v = to_bf16(normal(rng));
  std::vector<float> bias(s.n);
  for (float& v : bias) v = normal(rng);
  std::vector<float> out32(s.m * s.n, -1.0f);
  std::vector<uint16_t> out16(s.m * s.n, 0xffff);

  GemmBf16Params p;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.a = a.data();
  p.lda = lda;
  p.b = b.data();
  p.ldb = ldb;
  p.alpha = 0.75f;
  p.bias = with_bias ? bias.data() : nullptr;
  p.out_dtype = out_dtype;
  p.out = out_dtype == DType::kFloat32 ? static_cast<void*>(out32.data()) : static_cast<void*>(out16.data());
  p.ldc = s.n;
  gemm_bf16(p, pool);

  const int mantissa_bits = out_dtype == DType::kFloat32 ? 23 : out_dtype == DType::kBFloat16 ? 7 : 10;
  int bad = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t q = 0; q < s.k; ++q) {
        const double term = double(to_float(a[i * lda + q])) * to_float(b[j * ldb + q]);
        exact += term;
        magnitude += std::fabs(term);
      }
      exact = 0.75 * exact + (with_bias ? bias[j] : 0.0);
      magnitude = 0.75 * magnitude + (with_bias ? std::fabs(bias[j]) : 0.0);
      const double got = out_dtype == DType::kFloat32 ? out32[i * s.n + j] : output_value(out16, out_dtype, i * s.n + j);
      const double tolerance = half_ulp(exact, mantissa_bits) + std::ldexp(magnitude, -20);
      if (!(std::fabs(got - exact) <= tolerance) && bad++ < 3) {
        TE_CHECK(false, "%s %s m=%lld n=%lld k=%lld at (%lld, %lld): got %.9g, exact %.9g", isa, dtype_name(out_dtype),
                 (long long)s.m, (long long)s.n, (long long)s.k, (long long)i, (long long)j, got, exact);
      }
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const Shape shapes[] = {{1, 1, 1},    {13, 33, 3}, {29, 70, 513}, {5, 1100, 17}, {16, 7, 95},
                          {9, 40, 64}, {0, 4, 4},   {4, 0, 4},    {3, 5, 0}};
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const SerialThreadPool serial;
  const test::TwoThreads two;
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    for (const Shape& s : shapes) {
      for (DType dtype : dtypes) {
        check_gemm(s, dtype, /*with_bias=*/true, serial, rng, isa);
        check_gemm(s, dtype, /*with_bias=*/false, two, rng, isa);
      }
    }
  }
  TE_TEST_MAIN_RETURN();
}
