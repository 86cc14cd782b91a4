// LayerNorm/RMSNorm kernels of every SIMD tier this CPU has, against a double-precision
// reference, over odd widths (vector bodies and scalar tails), zero rows, mixed
// activation/parameter dtypes and a multi-threaded pool (several dgamma chunks).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "check.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/norm.h"

using namespace te_kernels;

namespace {

// Splits the range into num_threads pieces on std::threads (the binding uses PyTorch's pool).
class StdThreadPool final : public ThreadPool {
 public:
  explicit StdThreadPool(int threads) : threads_(threads) {}
  int num_threads() const override { return threads_; }
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) const override {
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(threads_, n / std::max<int64_t>(grain, 1)));
    std::vector<std::thread> workers;
    for (int64_t i = 0; i < pieces; ++i) {
      const int64_t begin = n * i / pieces, end = n * (i + 1) / pieces;
      if (begin < end) workers.emplace_back([&body, begin, end] { body(begin, end); });
    }
    for (auto& w : workers) w.join();
  }

 private:
  int threads_;
};

// Typed buffer holding values as DType `dtype`, built from and read back as double.
struct Buffer {
  DType dtype;
  std::vector<uint8_t> bytes;
  Buffer(DType d, size_t n) : dtype(d), bytes(n * size_of(d)) {}
  static size_t size_of(DType d) { return d == DType::kFloat64 ? 8 : d == DType::kFloat32 ? 4 : 2; }
  void* data() { return bytes.data(); }
  void set(size_t i, double v) {
    switch (dtype) {
      case DType::kFloat32: reinterpret_cast<float*>(data())[i] = float(v); break;
      case DType::kFloat64: reinterpret_cast<double*>(data())[i] = v; break;
      case DType::kBFloat16: reinterpret_cast<bf16_t*>(data())[i] = to_bf16(float(v)); break;
      case DType::kFloat16: reinterpret_cast<fp16_t*>(data())[i] = to_fp16(float(v)); break;
    }
  }
  double get(size_t i) const {
    const void* p = bytes.data();
    switch (dtype) {
      case DType::kFloat32: return static_cast<const float*>(p)[i];
      case DType::kFloat64: return static_cast<const double*>(p)[i];
      case DType::kBFloat16: return to_float(static_cast<const bf16_t*>(p)[i]);
      case DType::kFloat16: return to_float(static_cast<const fp16_t*>(p)[i]);
    }
    return 0;
  }
};

// Relative precision of one rounding to `dtype` (the output's last rounding dominates).
double unit_roundoff(DType d) {
  switch (d) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 2e-6;
    case DType::kBFloat16: return 1.0 / 128;
    case DType::kFloat16: return 1.0 / 1024;
  }
  return 0;
}

struct Case {
  NormKind kind;
  int64_t rows, cols;
  DType x_dtype, w_dtype;
  bool zero_centered;
  bool with_beta;
};

void run_case(const Case& c, const ThreadPool& pool, const char* isa) {
  const bool ln = c.kind == NormKind::kLayerNorm;
  const size_t n = size_t(c.rows * c.cols);
  std::mt19937 rng(1234 + c.rows * 7 + c.cols);
  std::normal_distribution<double> normal(0.0, 1.0);
  Buffer x(c.x_dtype, n), dy(c.x_dtype, n), gamma(c.w_dtype, c.cols), beta(c.w_dtype, c.cols);
  for (size_t i = 0; i < n; ++i) x.set(i, 3.0 + 2.0 * normal(rng)), dy.set(i, normal(rng));
  for (int64_t j = 0; j < c.cols; ++j) gamma.set(j, normal(rng) * 0.5 + (c.zero_centered ? 0 : 1)), beta.set(j, normal(rng));
  const DType acc = c.x_dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  Buffer y(c.x_dtype, n), mean(acc, c.rows), rstd(acc, c.rows), dx(c.x_dtype, n);
  Buffer dgamma(c.w_dtype, c.cols), dbeta(c.w_dtype, c.cols);
  const double eps = 1e-5;

  NormFwdParams f;
  f.kind = c.kind, f.rows = c.rows, f.cols = c.cols, f.x_dtype = c.x_dtype, f.w_dtype = c.w_dtype;
  f.x = x.data(), f.gamma = gamma.data(), f.beta = ln && c.with_beta ? beta.data() : nullptr;
  f.y = y.data(), f.mean = ln ? mean.data() : nullptr, f.rstd = rstd.data();
  f.eps = eps, f.zero_centered_gamma = c.zero_centered;
  std::vector<double> fwd_ws((norm_fwd_workspace_bytes(f) + 7) / 8 + 8);
  f.workspace = fwd_ws.data();
  norm_fwd(f, pool);

  NormBwdParams b;
  b.kind = c.kind, b.rows = c.rows, b.cols = c.cols, b.x_dtype = c.x_dtype, b.w_dtype = c.w_dtype;
  b.dy = dy.data(), b.x = x.data(), b.mean = ln ? mean.data() : nullptr, b.rstd = rstd.data();
  b.gamma = gamma.data(), b.dx = dx.data(), b.dgamma = dgamma.data(), b.dbeta = ln ? dbeta.data() : nullptr;
  b.zero_centered_gamma = c.zero_centered;
  norm_bwd_plan(b, pool);
  std::vector<double> bwd_ws((norm_bwd_workspace_bytes(b) + 7) / 8 + 8);
  b.workspace = bwd_ws.data();
  norm_bwd(b, pool);

  // Reference in double from the same (already rounded) inputs.
  const double u = unit_roundoff(c.x_dtype);
  const double uw = unit_roundoff(c.w_dtype);
  std::vector<double> ref_dgamma(c.cols, 0.0), ref_dbeta(c.cols, 0.0);
  int reported = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c.cols; ++j) mu += x.get(r * c.cols + j);
    mu = ln ? mu / c.cols : 0.0;
    for (int64_t j = 0; j < c.cols; ++j) var += std::pow(x.get(r * c.cols + j) - mu, 2);
    const double rs = 1.0 / std::sqrt(var / c.cols + eps);
    if (ln) TE_CHECK(std::fabs(mean.get(r) - mu) <= 1e-5 * (1 + std::fabs(mu)), "%s mean row %lld", isa, (long long)r);
    TE_CHECK(std::fabs(rstd.get(r) - rs) <= 1e-5 * rs, "%s rstd row %lld: %g vs %g", isa, (long long)r, rstd.get(r), rs);
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < c.cols; ++j) {
      const size_t i = size_t(r * c.cols + j);
      const double g = gamma.get(j) + (c.zero_centered ? 1.0 : 0.0);
      const double xhat = (x.get(i) - mu) * rs;
      const double want = xhat * g + (ln && c.with_beta ? beta.get(j) : 0.0);
      if (std::fabs(y.get(i) - want) > 4 * u * (std::fabs(want) + 1) && reported++ < 5)
        TE_CHECK(false, "%s y[%lld,%lld] = %g, want %g", isa, (long long)r, (long long)j, y.get(i), want);
      sum_g += dy.get(i) * g;
      sum_gx += dy.get(i) * g * xhat;
      ref_dgamma[j] += dy.get(i) * xhat;
      ref_dbeta[j] += dy.get(i);
    }
    for (int64_t j = 0; j < c.cols; ++j) {
      const size_t i = size_t(r * c.cols + j);
      const double g = gamma.get(j) + (c.zero_centered ? 1.0 : 0.0);
      const double xhat = (x.get(i) - mu) * rs;
      const double want = rs * (dy.get(i) * g - (ln ? sum_g / c.cols : 0.0) - xhat * sum_gx / c.cols);
      const double scale = rs * (std::fabs(dy.get(i) * g) + 1);
      if (std::fabs(dx.get(i) - want) > 8 * u * scale && reported++ < 5)
        TE_CHECK(false, "%s dx[%lld,%lld] = %g, want %g", isa, (long long)r, (long long)j, dx.get(i), want);
    }
  }
  for (int64_t j = 0; j < c.cols; ++j) {
    // One rounding to the parameter dtype, plus fp32 accumulation error growing with rows.
    const auto tol = [&](double ref) { return 2 * uw * std::fabs(ref) + 1e-5 * std::sqrt(double(c.rows) + 1); };
    TE_CHECK(std::fabs(dgamma.get(j) - ref_dgamma[j]) <= tol(ref_dgamma[j]), "%s dgamma[%lld] = %g, want %g", isa,
             (long long)j, dgamma.get(j), ref_dgamma[j]);
    if (ln)
      TE_CHECK(std::fabs(dbeta.get(j) - ref_dbeta[j]) <= tol(ref_dbeta[j]), "%s dbeta[%lld] = %g, want %g", isa,
               (long long)j, dbeta.get(j), ref_dbeta[j]);
  }
}

// With gamma = 0 the LayerNorm output is exactly beta, so fp32 beta values chosen to be
// rounding ties, NaNs with every payload shape, infinities and overflows check that the
// vector stores round bit-for-bit like the scalar to_bf16/to_fp16 (tails use the scalar).
void check_output_rounding(DType x_dtype, const char* isa) {
  std::vector<float> beta;
  for (uint32_t high : {0x3f80u, 0x3f81u, 0x477fu, 0x7f7fu, 0x0001u, 0xbf80u})
    for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1000u, 0x0fffu}) beta.push_back(bits_float((high << 16) | low));
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xffffffffu, 0xff800001u}) beta.push_back(bits_float(nan));
  for (float v : {65504.0f, 65519.0f, 65520.0f, 1e30f, -1e30f, 5.96e-8f, 2.98e-8f}) beta.push_back(v);
  while (beta.size() % 64 != 0) beta.push_back(float(beta.size()) * 0.37f);
  const int64_t rows = 3, cols = int64_t(beta.size()) + 5;  // + a scalar tail
  beta.resize(size_t(cols), 0.1f);
  std::vector<float> gamma(size_t(cols), 0.0f), mean(rows), rstd(rows);
  Buffer x(x_dtype, size_t(rows * cols)), y(x_dtype, size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) x.set(size_t(i), double(i % 7));
  NormFwdParams f;
  f.rows = rows, f.cols = cols, f.x_dtype = x_dtype, f.w_dtype = DType::kFloat32;
  f.x = x.data(), f.gamma = gamma.data(), f.beta = beta.data(), f.y = y.data(), f.mean = mean.data(), f.rstd = rstd.data();
  std::vector<double> ws((norm_fwd_workspace_bytes(f) + 7) / 8 + 8);
  f.workspace = ws.data();
  norm_fwd(f, SerialThreadPool());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const uint16_t got = reinterpret_cast<const uint16_t*>(y.data())[r * cols + j];
      const uint16_t want = x_dtype == DType::kBFloat16 ? to_bf16(beta[size_t(j)]).bits : to_fp16(beta[size_t(j)]).bits;
      TE_CHECK(got == want, "%s %s: column %lld, value bits %#x stored as %#x, scalar gives %#x", isa,
               dtype_name(x_dtype), (long long)j, float_bits(beta[size_t(j)]), got, want);
    }
}

}  // namespace

int main() {
  const SerialThreadPool serial;
  const StdThreadPool threaded(3);
  const DType types[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};
  const int64_t shapes[][2] = {{1, 1}, {3, 69}, {5, 17}, {0, 8}, {37, 256}, {64, 1000}, {9, 4096}};
  int cases = 0;
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRMSNorm})
      for (DType xt : types)
        for (const auto& shape : shapes)
          for (bool zero_centered : {false, true}) {
            const DType wt = xt == DType::kBFloat16 ? DType::kFloat32 : xt;  // mixed for bf16
            run_case({kind, shape[0], shape[1], xt, wt, zero_centered, true}, serial, isa);
            run_case({kind, shape[0], shape[1], xt, xt, zero_centered, shape[1] % 2 == 0}, threaded, isa);
            cases += 2;
          }
    check_output_rounding(DType::kBFloat16, isa);
    check_output_rounding(DType::kFloat16, isa);
    std::printf("%s: norm cases run\n", isa);
  }
  limit_cpu_isa(CpuIsa::kAmx);  // uncapped again
  std::printf("%d cases\n", cases);
  TE_TEST_MAIN_RETURN();
}
