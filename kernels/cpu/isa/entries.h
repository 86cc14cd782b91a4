// How a kernel family's public API file (cpu/<family>/<family>.cpp) reaches the builds of its
// *_kernels.h, one per SIMD tier: setup.py and CMakeLists.txt compile every family's
// cpu/<family>/<family>_kernels.h once per tier, into te_kernels::cpu::{portable, avx2, avx512}. The API file
// declares those entry points with TE_CPU_TIER_ENTRY and calls the active tier's with
// TE_CPU_ACTIVE_TIER; nothing else calls them. Also the workspace and threading helpers that
// API files and kernels share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/cpu_isa.h"
#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

// Declares `void name(const Params&, const ThreadPool&)` in each tier's namespace; used at
// te_kernels namespace scope. Every entry point has this signature, so one macro serves all;
// a definition that drifts from it is an undefined reference at link time.
#define TE_CPU_TIER_ENTRY(name, Params)                                               \
  namespace cpu::portable { void name(const Params& params, const ThreadPool& pool); } \
  namespace cpu::avx2 { void name(const Params& params, const ThreadPool& pool); }     \
  namespace cpu::avx512 { void name(const Params& params, const ThreadPool& pool); }

// The build of an entry point for the tier active_cpu_isa() picks at run time (the best the
// CPU supports, unless capped by limit_cpu_isa()): TE_CPU_ACTIVE_TIER(rope)(params, pool).
#define TE_CPU_ACTIVE_TIER(name)                                                          \
  ::te_kernels::cpu::active_tier(&::te_kernels::cpu::portable::name, &::te_kernels::cpu::avx2::name, \
                                 &::te_kernels::cpu::avx512::name)

namespace te_kernels::cpu {

template <typename Entry>
Entry* active_tier(Entry* portable, Entry* avx2, Entry* avx512) {
  switch (active_cpu_isa()) {
    case CpuIsa::kAmx:  // the tiles serve the GEMM alone (gemm_avx512.cpp); the rest is avx512 code
    case CpuIsa::kAvx512: return avx512;
    case CpuIsa::kAvx2: return avx2;
    case CpuIsa::kPortable: break;
  }
  return portable;
}

// Workspace layout shared by norm.cpp (sizing) and norm_kernels.h (use): each [cols]
// vector of accumulators starts on a 64-byte boundary.
inline int64_t padded_cols(int64_t cols, size_t acc_bytes) {
  const int64_t per_line = int64_t(64 / acc_bytes);
  return (cols + per_line - 1) / per_line * per_line;
}
inline size_t accumulator_bytes(DType x_dtype) { return x_dtype == DType::kFloat64 ? 8 : 4; }

// Rows are handed to threads in tasks of at least this many elements, so that a task's
// work dwarfs the cost of waking a thread.
constexpr int64_t kMinElementsPerTask = 32768;

}  // namespace te_kernels::cpu
