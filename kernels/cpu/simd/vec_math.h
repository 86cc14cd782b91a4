// Transcendental functions written once over a tier's vector type V (and the scalar
// VecPortable<float, 1>), on top of the V-level exp: sigmoid in fp32.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including vec_math.h"
#endif
#pragma once

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// x * sigmoid(z) as x / (1 + e^-z): one rounding and no multiply (exp and the division bound
// the silu/gelu loops); 0 once e^-z overflows.
template <typename V>
inline V times_sigmoid(V x, V z) {
  return x / (V::broadcast(1.0f) + exp(V::zero() - z));
}

// 1 / (1 + e^-x): exact limits 0 and 1 (e^-x overflows to inf, or underflows to 0).
template <typename V>
inline V sigmoid(V x) {
  return times_sigmoid(V::broadcast(1.0f), x);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
