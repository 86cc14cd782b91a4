// x itself, opaque to the optimiser, as te_kernels::unfused (nvfp4.h) is for a scalar: a product
// passed through it is rounded on its own, never fused into an FMA with the sum that follows.
// The avx2 and avx512 tiers have FMA, GCC fuses by default (-ffp-contract=fast), and whether it
// does depends on the code around the product (measured: the same GEMM epilogue inlined into two
// kernels rounded alike in one and fused in the other); the value goes through memory.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including unfused.h"
#endif
#pragma once

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

template <typename V>
inline V unfused(V x) {
  asm("" : "+m"(x));
  return x;
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
