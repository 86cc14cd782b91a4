// Attention-softmax and cross-entropy kernels of every SIMD tier this CPU has, against a
// double-precision evaluation of the same formulas (te_kernels/softmax.h, cross_entropy.h),
// over every mask kind, widths with vector bodies and scalar tails, long rows and ignored
// targets. fp32 data, so the only differences are the kernels' fp32 rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "check.h"
#include "workspace.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/cross_entropy.h"
#include "te_kernels/softmax.h"

using namespace te_kernels;
using te_kernels::test::Workspace;

namespace {

int64_t visible_keys(SoftmaxMask kind, int64_t i, int64_t sq, int64_t sk) {
  if (kind == SoftmaxMask::kCausal) return std::min(sk, i + 1);
  if (kind == SoftmaxMask::kCausalBottomRight) return std::clamp<int64_t>(i + 1 + sk - sq, 0, sk);
  return sk;
}

void check_softmax(SoftmaxMask kind, int64_t sq, int64_t sk, std::mt19937& rng, const char* isa) {
  const int64_t batch = 2, heads = 3, rows = batch * heads * sq;
  const double scale = 0.37;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(rows * sk), y(x.size()), dy(x.size()), dx(x.size());
  for (float& v : x) v = normal(rng);
  for (float& v : dy) v = normal(rng);
  std::vector<uint8_t> mask(batch * sq * sk);  // [batch, 1, sq, sk]
  for (uint8_t& m : mask) m = rng() % 3 == 0;
  if (sq > 1) std::fill(mask.begin() + sk, mask.begin() + 2 * sk, 1);  // a fully masked row

  SoftmaxFwdParams fwd;
  fwd.shape = {kind, DType::kFloat32, batch, heads, sq, sk, scale};
  if (kind == SoftmaxMask::kPadding) {
    fwd.shape.mask = mask.data();
    fwd.shape.mask_batch_stride = sq * sk;
    fwd.shape.mask_row_stride = sk;
  }
  fwd.x = x.data();
  fwd.y = y.data();
  const SerialThreadPool pool;
  softmax_fwd_plan(fwd, pool);
  Workspace workspace(softmax_fwd_workspace_bytes(fwd));
  fwd.workspace = workspace.data;
  softmax_fwd(fwd, pool);
  SoftmaxBwdParams bwd;
  bwd.shape = fwd.shape;
  bwd.dy = dy.data();
  bwd.y = y.data();
  bwd.dx = dx.data();
  softmax_bwd(bwd, pool);

  double worst_y = 0, worst_dx = 0;
  std::vector<double> z(sk), want(sk);  // one row of scaled logits and of expected outputs
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % sq, b = r / sq / heads, visible = visible_keys(kind, i, sq, sk);
    const uint8_t* row_mask = kind == SoftmaxMask::kPadding ? mask.data() + (b * sq + i) * sk : nullptr;
    std::fill(want.begin(), want.end(), 0.0);
    double max = -INFINITY, sum = 0, dot = 0;
    for (int64_t j = 0; j < visible; ++j) {
      z[j] = row_mask != nullptr && row_mask[j] ? kSoftmaxMaskedLogit : x[r * sk + j] * scale;
      max = std::max(max, z[j]);
    }
    for (int64_t j = 0; j < visible; ++j) sum += std::exp(z[j] - max);
    for (int64_t j = 0; j < visible; ++j) want[j] = std::exp(z[j] - max) / sum;
    for (int64_t j = 0; j < sk; ++j) dot += dy[r * sk + j] * want[j];
    for (int64_t j = 0; j < sk; ++j) {
      const bool cut = j >= visible || (row_mask != nullptr && row_mask[j]);
      const double grad = cut ? 0.0 : scale * want[j] * (dy[r * sk + j] - dot);
      worst_y = std::max(worst_y, std::fabs(y[r * sk + j] - want[j]) / (1e-6 + want[j]));
      worst_dx = std::max(worst_dx, std::fabs(dx[r * sk + j] - grad));
      if (j >= visible) TE_CHECK(y[r * sk + j] == 0.0f && dx[r * sk + j] == 0.0f, "%s: dropped key not 0", isa);
    }
  }
  TE_CHECK(worst_y < 2e-5 && worst_dx < 2e-6, "%s softmax kind %d sq %lld sk %lld: y rel err %g, dx err %g", isa,
           int(kind), (long long)sq, (long long)sk, worst_y, worst_dx);
}

// grad_scale: the factor the forward writes the gradient with (a mean's 1 / kept tokens).
void check_cross_entropy(int64_t rows, int64_t vocab, double eps, double grad_scale, std::mt19937& rng,
                         const char* isa) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(rows * vocab), grad(x.size()), loss(rows), grad_loss(rows), dx(x.size());
  std::vector<int64_t> target(rows);
  for (float& v : x) v = normal(rng);
  for (float& v : grad_loss) v = normal(rng);
  for (int64_t r = 0; r < rows; ++r) target[r] = r % 4 == 1 ? -100 : int64_t(rng() % vocab);
  TE_CHECK(cross_entropy_first_bad_target(target.data(), rows, vocab, -100) == -1, "%s: valid targets", isa);

  CrossEntropyFwdParams fwd;
  fwd.rows = rows;
  fwd.vocab = vocab;
  fwd.logits = x.data();
  fwd.target = target.data();
  fwd.label_smoothing = eps;
  fwd.loss = loss.data();
  fwd.grad = grad.data();
  fwd.grad_scale = grad_scale;
  const SerialThreadPool pool;
  cross_entropy_fwd_plan(fwd, pool);
  Workspace workspace(cross_entropy_fwd_workspace_bytes(fwd));
  fwd.workspace = workspace.data;
  cross_entropy_fwd(fwd, pool);
  CrossEntropyBwdParams bwd;
  bwd.rows = rows;
  bwd.vocab = vocab;
  bwd.grad = grad.data();
  bwd.grad_loss = grad_loss.data();
  bwd.grad_logits = dx.data();
  cross_entropy_bwd(bwd, pool);

  double worst_loss = 0, worst_grad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * vocab;
    const bool ignored = target[r] == -100;
    double max = -INFINITY, sum = 0, sum_x = 0;
    for (int64_t c = 0; c < vocab; ++c) max = std::max(max, double(row[c]));
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(row[c] - max), sum_x += row[c];
    const double lse = max + std::log(sum);
    const double want = ignored ? 0.0 : (1 - eps) * (lse - row[target[r]]) + eps * (lse - sum_x / vocab);
    worst_loss = std::max(worst_loss, std::fabs(loss[r] - want) / (1 + std::fabs(want)));
    for (int64_t c = 0; c < vocab; ++c) {
      const double g =
          ignored ? 0.0 : grad_scale * (std::exp(row[c] - max) / sum - eps / vocab - (c == target[r]) * (1 - eps));
      worst_grad = std::max({worst_grad, std::fabs(grad[r * vocab + c] - g),
                             std::fabs(dx[r * vocab + c] - g * grad_loss[r]) / (1 + std::fabs(grad_loss[r]))});
    }
  }
  TE_CHECK(worst_loss < 2e-6 && worst_grad < 1e-6,
           "%s cross-entropy %lld x %lld eps %g grad_scale %g: loss err %g, grad err %g", isa, (long long)rows,
           (long long)vocab, eps, grad_scale, worst_loss, worst_grad);
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const int64_t widths[] = {1, 7, 8, 69, 20000};
  for (int tier = 0; tier <= int(detected_cpu_isa()); ++tier) {
    limit_cpu_isa(CpuIsa(tier));
    const char* isa = cpu_isa_name(CpuIsa(tier));
    for (int64_t sk : widths) {
      check_softmax(SoftmaxMask::kNone, 5, sk, rng, isa);
      check_softmax(SoftmaxMask::kPadding, 5, sk, rng, isa);
      check_softmax(SoftmaxMask::kCausalBottomRight, 5, sk, rng, isa);
      if (sk <= 69) check_softmax(SoftmaxMask::kCausal, sk, sk, rng, isa);
    }
    check_softmax(SoftmaxMask::kCausalBottomRight, 9, 3, rng, isa);  // rows with no key
    for (int64_t vocab : {1, 13, 32000}) {
      check_cross_entropy(6, vocab, 0.0, 1.0, rng, isa);
      check_cross_entropy(6, vocab, 0.1, 1.0, rng, isa);
      check_cross_entropy(6, vocab, 0.1, 1.0 / 3, rng, isa);
    }
    std::printf("%s: softmax and cross-entropy cases run\n", isa);
  }
  limit_cpu_isa(CpuIsa::kAmx);  // uncapped again
  TE_TEST_MAIN_RETURN();
}
