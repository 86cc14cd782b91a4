// Transcendental functions written once over a tier's vector type V (and the scalar
// VecPortable<float, 1>), on top of the V-level exp: sigmoid and tanh in fp32.
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

// tanh in fp32, within a few ulp: 1 - 2 / (e^2x + 1) for |x| >= 1/4 (exact limits -1 and 1
// as e^2x under- or overflows); below, where that difference would cancel, the odd Taylor
// series to x^9 (its first dropped term is under 2^-30 relative there).
template <typename V>
inline V tanh(V x) {
  const V one = V::broadcast(1.0f);
  const V away = one - V::broadcast(2.0f) / (exp(x + x) + one);
  const V x2 = x * x;
  V series = fmadd(x2, V::broadcast(62.0f / 2835.0f), V::broadcast(-17.0f / 315.0f));
  series = fmadd(x2, series, V::broadcast(2.0f / 15.0f));
  series = fmadd(x2, series, V::broadcast(-1.0f / 3.0f));
  const V near = fmadd(x * x2, series, x);
  return where_less(V::max(x, V::zero() - x), V::broadcast(0.25f), near, away);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
