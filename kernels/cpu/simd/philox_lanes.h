// Philox4x32-10 (te_kernels/philox.h) over a vector's worth of counters at once: c0..c3 hold
// V::kWidth words each (word i of lane i's counter) and are replaced by the lanes' output words.
// This version runs the lanes one after another; the tiers with 32 x 32 -> 64-bit vector
// multiplies specialise it (philox_avx2.h, philox_avx512.h).
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including philox_lanes.h"
#endif
#pragma once

#include <cstdint>

#include "te_kernels/philox.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

template <typename V>
inline void philox_lanes(uint32_t* c0, uint32_t* c1, uint32_t* c2, uint32_t* c3, uint64_t key) {
  for (int i = 0; i < V::kWidth; ++i) {
    const Philox4 out = philox4x32(c0[i], c1[i], c2[i], c3[i], key);
    c0[i] = out.word[0];
    c1[i] = out.word[1];
    c2[i] = out.word[2];
    c3[i] = out.word[3];
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
