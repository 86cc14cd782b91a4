// DelayedScaling's update of per-tensor FP8 scaling state (TE_API.md section 4), the step that
// runs after every forward (and backward) of an FP8 module: from the amax history to the next
// scale. One call updates one state's slots in place; bindings/delayed_scaling_ops.cpp runs it
// over every state an autocast region used, as TE's fused update of its global buffers does.
#pragma once

#include <cstdint>

namespace te_kernels {

enum class AmaxAlgo : int { kMax = 0, kMostRecent = 1 };

// history [history_len, slots] fp32, row 0 the live amaxes of this step; scale, scale_inv
// [slots] fp32; recorded [slots]: true where a cast recorded into the slot this step.
// A slot takes part when recorded or when its live amax is not 0. For those:
//   amax = max over the rows of |h| with NaN skipped (kMax), or the live amax (kMostRecent);
//   the history rolls one row to the front (the live row becomes the last, the oldest is
//   dropped) and the new live row is 0;
//   scale = (fp8_max / amax) / margin_divisor in fp32, kept where amax is 0, inf or NaN, and
//   FLT_MAX where the quotient overflows.
// Other slots keep their history and scale. Every slot's scale_inv becomes 1 / scale, and
// recorded is cleared. Each step is the fp32 operation of scaling.py's update, so the bits
// are those of the plain-PyTorch update.
struct DelayedScalingUpdateParams {
  int64_t history_len = 0, slots = 0;
  float* history = nullptr;
  float* scale = nullptr;
  float* scale_inv = nullptr;
  bool* recorded = nullptr;
  AmaxAlgo algo = AmaxAlgo::kMax;
  float fp8_max = 0.0f;
  float margin_divisor = 1.0f;  // 2^margin rounded to fp32
};

void delayed_scaling_update(const DelayedScalingUpdateParams& params);

}  // namespace te_kernels
