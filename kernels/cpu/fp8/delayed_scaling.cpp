// DelayedScaling's update (te_kernels/delayed_scaling.h). Scalar code: a state holds a few
// slots and a history of at most a few thousand rows, read once.
#include "te_kernels/delayed_scaling.h"

#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

namespace te_kernels {

void delayed_scaling_update(const DelayedScalingUpdateParams& p) {
  assert(p.history_len >= 1 && p.slots >= 0);
  const int64_t n = p.slots;
  float* live = p.history;  // row 0
  std::vector<uint8_t> takes_part(n);  // the slots that take part
  std::vector<float> amax(n);
  for (int64_t j = 0; j < n; ++j) {
    takes_part[j] = p.recorded[j] || live[j] != 0.0f;  // a NaN live amax is not 0
    amax[j] = p.algo == AmaxAlgo::kMostRecent ? live[j] : 0.0f;
  }
  if (p.algo == AmaxAlgo::kMax) {
    for (int64_t row = 0; row < p.history_len; ++row) {
      const float* h = p.history + row * n;
      for (int64_t j = 0; j < n; ++j) {
        const float magnitude = std::fabs(h[j]);
        if (magnitude > amax[j]) amax[j] = magnitude;  // false for NaN: skipped
      }
    }
  }
  // The roll, row by row: row r takes row r + 1, the last row the live amaxes, row 0 zeros.
  std::vector<float> rolled_out(live, live + n);
  for (int64_t row = 0; row + 1 < p.history_len; ++row) {
    float* to = p.history + row * n;
    const float* from = to + n;
    for (int64_t j = 0; j < n; ++j) {
      if (takes_part[j]) to[j] = from[j];
    }
  }
  float* last = p.history + (p.history_len - 1) * n;
  for (int64_t j = 0; j < n; ++j) {
    if (!takes_part[j]) continue;
    last[j] = rolled_out[j];
    live[j] = 0.0f;
    float scale = (p.fp8_max / amax[j]) / p.margin_divisor;
    if (!(amax[j] > 0.0f) || !std::isfinite(amax[j])) scale = p.scale[j];
    p.scale[j] = std::isinf(scale) ? FLT_MAX : scale;
  }
  for (int64_t j = 0; j < n; ++j) {
    p.scale_inv[j] = 1.0f / p.scale[j];
    p.recorded[j] = false;
  }
}

}  // namespace te_kernels
