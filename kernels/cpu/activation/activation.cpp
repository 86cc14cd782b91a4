// Public activation API: workspace sizing, chunk planning and the run-time choice of SIMD tier.
#include <algorithm>
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/activation.h"
#include "te_kernels/cpu_isa.h"

namespace te_kernels {

// The entry points of activation_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(activation_fwd, ActivationFwdParams)
TE_CPU_TIER_ENTRY(activation_bwd, ActivationBwdParams)
TE_CPU_TIER_ENTRY(activation_fp8, ActivationFp8Params)
TE_CPU_TIER_ENTRY(activation_bwd_fp8, ActivationBwdFp8Params)

namespace {

// bindings/activation_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
// Non-negative sizes, no float64, an even last dimension for a gated activation.
[[maybe_unused]] bool supported(int64_t rows, int64_t cols, DType dtype, ActivationKind kind) {
  return rows >= 0 && cols >= 0 && dtype != DType::kFloat64 && (!is_gated(kind) || cols % 2 == 0);
}

}  // namespace

bool is_gated(ActivationKind kind) { return kind >= ActivationKind::kGlu; }

void activation_fwd(const ActivationFwdParams& p, const ThreadPool& pool) {
  assert(supported(p.rows, p.cols, p.dtype, p.act.kind) && "activation: unsupported arguments");
  if (p.rows == 0 || p.cols == 0) return;
  return TE_CPU_ACTIVE_TIER(activation_fwd)(p, pool);
}

void activation_bwd_plan(ActivationBwdParams& p, const ThreadPool& pool) {
  // One chunk per thread at most, and none smaller than a task's worth of elements: each
  // chunk costs a [cols] partial to zero and to reduce.
  const int64_t by_size = std::max<int64_t>(1, p.rows * p.cols / cpu::kMinElementsPerTask);
  p.num_chunks = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), by_size));
}

size_t activation_bwd_workspace_bytes(const ActivationBwdParams& p) {
  if (p.dbias == nullptr) return 0;
  return size_t(p.num_chunks) * size_t(cpu::padded_cols(p.cols, sizeof(float))) * sizeof(float);
}

void activation_bwd(const ActivationBwdParams& p, const ThreadPool& pool) {
  assert(supported(p.rows, p.cols, p.dtype, p.act.kind) && "activation: unsupported arguments");
  if (p.cols == 0) return;
  return TE_CPU_ACTIVE_TIER(activation_bwd)(p, pool);
}

size_t activation_fp8_workspace_bytes(const ThreadPool& pool) { return size_t(pool.num_threads()) * sizeof(float); }

void activation_fp8(const ActivationFp8Params& p, const ThreadPool& pool) {
  assert(supported(p.rows, p.cols, p.dtype, p.act.kind) && "activation: unsupported arguments");
  if (p.rows == 0 || p.cols == 0) {
    *p.amax = 0.0f;
    return;
  }
  return TE_CPU_ACTIVE_TIER(activation_fp8)(p, pool);
}

void activation_bwd_fp8(const ActivationBwdFp8Params& p, const ThreadPool& pool) {
  assert(supported(p.rows, p.cols, p.dtype, p.act.kind) && "activation: unsupported arguments");
  if (p.rows == 0 || p.cols == 0) {
    *p.amax = 0.0f;
    return;
  }
  return TE_CPU_ACTIVE_TIER(activation_bwd_fp8)(p, pool);
}

}  // namespace te_kernels
