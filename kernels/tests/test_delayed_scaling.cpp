// DelayedScaling's update (te_kernels/delayed_scaling.h) against the rule written out per slot:
// which slots take part, the roll, the "max" and "most_recent" amaxes (NaN skipped by "max"),
// the kept scale for an amax of 0, inf or NaN, FLT_MAX for an overflowing quotient, the margin.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "te_kernels/delayed_scaling.h"

using namespace te_kernels;

namespace {

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// `len` rows of history over seven slots; row 0 is live. The lengths cover the kernel's whole
// blocks of 8 rows and the rows after them.
struct State {
  static constexpr int64_t kSlots = 7;
  int64_t len;
  std::vector<float> history;
  std::vector<float> scale = {1, 2, 3, 4, 5, 6, 7};
  std::vector<float> scale_inv = std::vector<float>(kSlots, 0.5f);
  bool recorded[kSlots] = {true, true, false, true, true, false, true};
  explicit State(int64_t len_) : len(len_), history(len_ * kSlots) {
    const float live[kSlots] = {3.0f, 0.0f, 0.0f, NAN, INFINITY, 8.0f, 1e-44f};
    for (int64_t j = 0; j < kSlots; ++j) {
      history[j] = live[j];
      // Older rows: distinct values, the largest in a different row for each slot, a NaN in one.
      for (int64_t row = 1; row < len; ++row) history[row * kSlots + j] = float((row * 7 + j * 3) % (len + 5));
      if (len > 2) history[(len / 2) * kSlots + 1] = NAN;
    }
  }
  DelayedScalingUpdateParams params(AmaxAlgo algo, float margin_divisor) {
    DelayedScalingUpdateParams p;
    p.history_len = len, p.slots = kSlots, p.history = history.data(), p.scale = scale.data();
    p.scale_inv = scale_inv.data(), p.recorded = recorded, p.algo = algo, p.fp8_max = 448.0f;
    p.margin_divisor = margin_divisor;
    return p;
  }
};

void check(int64_t len, AmaxAlgo algo, float margin_divisor) {
  State before(len), after(len);
  delayed_scaling_update(after.params(algo, margin_divisor));
  for (int64_t j = 0; j < State::kSlots; ++j) {
    const float live = before.history[j];
    const bool takes_part = before.recorded[j] || live != 0.0f;  // slot 2: neither
    float amax = live;
    if (algo == AmaxAlgo::kMax) {
      amax = 0.0f;
      for (int64_t row = 0; row < len; ++row) {
        const float v = std::fabs(before.history[row * State::kSlots + j]);
        if (v > amax) amax = v;
      }
    }
    float scale = before.scale[j];
    if (takes_part && amax > 0.0f && std::isfinite(amax)) scale = (448.0f / amax) / margin_divisor;
    if (takes_part && std::isinf(scale)) scale = FLT_MAX;
    TE_CHECK(same(after.scale[j], scale), "len %lld slot %lld: scale %g, want %g", (long long)len, (long long)j,
             after.scale[j], scale);
    TE_CHECK(after.scale_inv[j] == 1.0f / after.scale[j], "slot %lld: scale_inv", (long long)j);
    TE_CHECK(!after.recorded[j], "slot %lld: recorded not cleared", (long long)j);
    for (int64_t row = 0; row < len; ++row) {
      // The roll: row r takes row r + 1, the last row the live amax, row 0 zero.
      float want = before.history[row * State::kSlots + j];
      if (takes_part) {
        want = row == 0 ? 0.0f
                        : row == len - 1 ? live : before.history[(row + 1) * State::kSlots + j];
      }
      TE_CHECK(same(after.history[row * State::kSlots + j], want), "len %lld slot %lld row %lld: %g, want %g",
               (long long)len, (long long)j, (long long)row, after.history[row * State::kSlots + j], want);
    }
  }
}

}  // namespace

int main() {
  for (int64_t len : {1, 2, 4, 8, 9, 17, 1024, 1030}) {
    for (AmaxAlgo algo : {AmaxAlgo::kMax, AmaxAlgo::kMostRecent}) {
      for (float margin_divisor : {1.0f, 4.0f, 1.41421354f}) check(len, algo, margin_divisor);
    }
  }
  // "most_recent" over a tiny live amax: the quotient overflows, the scale is FLT_MAX.
  State tiny(4);
  delayed_scaling_update(tiny.params(AmaxAlgo::kMostRecent, 1.0f));
  TE_CHECK(tiny.scale[6] == FLT_MAX, "an overflowing quotient gives FLT_MAX, got %g", tiny.scale[6]);
  TE_TEST_MAIN_RETURN();
}
