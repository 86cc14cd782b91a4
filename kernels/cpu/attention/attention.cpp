// Public flash-attention API: workspace sizes, the kernels' preconditions, the run-time SIMD tier.
#include <cassert>

#include "cpu/attention/attention_layout.h"
#include "cpu/isa/entries.h"
#include "te_kernels/attention.h"

namespace te_kernels {

// The entry points of attention_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(attention_fwd, AttentionFwdParams)
TE_CPU_TIER_ENTRY(attention_bwd, AttentionBwdParams)

namespace {

// bindings/attention_ops.cpp checks every argument, with messages naming it; these state what
// the kernels assume of a direct C++ caller, and run in debug builds.
void assert_shape(const AttentionShape& s) {
  assert(s.dtype != DType::kFloat64 && "attention: float64 is not supported");
  assert(s.batch >= 0 && s.heads >= 0 && s.max_sq >= 0 && s.max_skv >= 0 && "attention: negative size");
  assert(s.kv_heads > 0 && s.heads % s.kv_heads == 0 && "attention: kv_heads must divide heads");
  assert(s.head_dim_qk > 0 && s.head_dim_qk <= kAttentionMaxHeadDim && s.head_dim_v > 0 &&
         s.head_dim_v <= kAttentionMaxHeadDim && "attention: head dims must be in [1, kAttentionMaxHeadDim]");
  assert(s.window_left >= -1 && s.window_right >= -1 && "attention: window bounds are -1 or >= 0");
  assert((s.page_table == nullptr || (s.page_size > 0 && s.starts_kv == nullptr)) &&
         "attention: a paged cache needs a page size and no starts_kv");
  (void)s;
}

bool empty(const AttentionShape& s) { return s.batch == 0 || s.heads == 0 || s.max_sq == 0 || s.max_skv == 0; }

}  // namespace

size_t attention_fwd_workspace_bytes(const AttentionShape& s, const ThreadPool& pool) {
  if (empty(s)) return 0;
  return size_t(attention_layout::fwd_slot(s, pool).total_floats) * sizeof(float);
}

size_t attention_bwd_workspace_bytes(const AttentionShape& s, const ThreadPool& pool) {
  if (empty(s)) return 0;
  return size_t(attention_layout::bwd_slot(s, pool).total_floats) * sizeof(float);
}

void attention_fwd(const AttentionFwdParams& p, const ThreadPool& pool) {
  assert_shape(p.shape);
  if (empty(p.shape)) return;
  return TE_CPU_ACTIVE_TIER(attention_fwd)(p, pool);
}

void attention_bwd(const AttentionBwdParams& p, const ThreadPool& pool) {
  assert_shape(p.shape);
  assert(p.shape.page_table == nullptr && "attention: a paged cache has no backward");
  if (empty(p.shape)) return;
  return TE_CPU_ACTIVE_TIER(attention_bwd)(p, pool);
}

}  // namespace te_kernels
