// Transcendental functions written once over a tier's vector type V (and the scalar
// VecPortable<float, 1>), on top of the V-level exp: sigmoid in fp32.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including vec_math.h"
#endif
#pragma once

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// 1 / (1 + e^-x): exact limits 0 and 1 (e^-x overflows to inf, or underflows to 0).
template <typename V>
inline V sigmoid(V x) {
  const V one = V::broadcast(1.0f);
  return one / (one + exp(V::zero() - x));
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
