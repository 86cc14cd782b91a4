// Transcendental functions written once over a tier's vector type V (and the scalar
// VecPortable<float, 1>), on top of the V-level exp: sigmoid and tanh in fp32.
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

// tanh within a few ulp. Near 0 the closed form 1 - 2 / (e^2x + 1) would cancel, so for
// |x| < 0.625 an odd polynomial x + x^3 P(x^2) is used instead (Cephes' tanhf
// coefficients); beyond, the closed form is at most 2 ulp off and reaches exactly +-1.
template <typename V>
inline V tanh(V x) {
  const V one = V::broadcast(1.0f);
  const V x2 = x * x;
  V p = V::broadcast(-5.70498872745e-3f);
  p = fmadd(p, x2, V::broadcast(2.06390887954e-2f));
  p = fmadd(p, x2, V::broadcast(-5.37397155531e-2f));
  p = fmadd(p, x2, V::broadcast(1.33314422036e-1f));
  p = fmadd(p, x2, V::broadcast(-3.33332819422e-1f));
  const V near_zero = fmadd(p * x2, x, x);
  const V closed_form = one - V::broadcast(2.0f) / (exp(x + x) + one);
  return where_less(x2, V::broadcast(0.390625f), near_zero, closed_form);  // 0.390625 = 0.625^2
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
