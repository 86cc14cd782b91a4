// The activation functions, one small functor per kind, each giving the value and the
// derivative at x in fp32, over any vector type V (a tier's Vec, or the scalar
// VecPortable<float, 1> for row tails). activation_kernels.h composes them into the plain
// (act(x)) and gated (act(a) * linear(b)) forms and owns every loop.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including activation_math.h"
#endif
#pragma once

#include "cpu/simd/vec_math.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::activations {

// x * (0.5 + 0.5 tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3), computed as x * sigmoid(2u)
// (0.5 + 0.5 tanh(u) = sigmoid(2u) exactly): one exp and one division, where tanh would need
// a polynomial besides near 0, and no cancellation in 1 + tanh(u) for very negative x.
struct Gelu {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCubic = 0.044715f;

  template <typename V>
  V value(V x) const {
    return times_sigmoid(x, two_u(x));
  }
  // d/dx = s + 2 x s (1 - s) du/dx,  s = sigmoid(2u),  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    const V one = V::broadcast(1.0f), s = sigmoid(two_u(x));
    const V two_du_dx = V::broadcast(2.0f * kSqrt2OverPi) * fmadd(V::broadcast(3.0f * kCubic), x * x, one);
    derivative = fmadd(x * s * (one - s), two_du_dx, s);
    return x * s;
  }
  template <typename V>
  static V two_u(V x) {
    return V::broadcast(2.0f * kSqrt2OverPi) * x * fmadd(V::broadcast(kCubic), x * x, V::broadcast(1.0f));
  }
};

// x * sigmoid(alpha x): qgelu with alpha = 1.702, silu (swish) with alpha = 1.
struct XSigmoid {
  float alpha;

  template <typename V>
  V value(V x) const {
    return times_sigmoid(x, V::broadcast(alpha) * x);
  }
  // d/dx = s + alpha x s (1 - s) = s (1 + alpha x (1 - s))
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    const V one = V::broadcast(1.0f);
    const V s = sigmoid(V::broadcast(alpha) * x);
    derivative = s * fmadd(V::broadcast(alpha) * x, one - s, one);
    return x * s;
  }
};

// The gate of glu.
struct Sigmoid {
  template <typename V>
  V value(V x) const {
    return sigmoid(x);
  }
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    const V s = sigmoid(x);
    derivative = s * (V::broadcast(1.0f) - s);
    return s;
  }
};

// max(x, 0); a NaN stays NaN (x < 0 is false for it), and the derivative is 1 only for x > 0.
struct Relu {
  template <typename V>
  V value(V x) const {
    return where_less(x, V::zero(), V::zero(), x);
  }
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    derivative = where_less(V::zero(), x, V::broadcast(1.0f), V::zero());
    return value(x);
  }
};

// relu(x)^2, derivative 2 relu(x).
struct SquaredRelu {
  template <typename V>
  V value(V x) const {
    const V r = Relu{}.value(x);
    return r * r;
  }
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    const V r = Relu{}.value(x);
    derivative = r + r;
    return r * r;
  }
};

// clamped_swiglu's gate: x * sigmoid(alpha x) at min(x, limit); no gradient above the limit.
struct ClampedXSigmoid {
  float alpha, limit;

  template <typename V>
  V value(V x) const {
    return XSigmoid{alpha}.value(clamp_above(x));
  }
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    const V y = XSigmoid{alpha}.value_and_derivative(clamp_above(x), derivative);
    derivative = where_less(V::broadcast(limit), x, V::zero(), derivative);
    return y;
  }
  template <typename V>
  V clamp_above(V x) const {
    return where_less(V::broadcast(limit), x, V::broadcast(limit), x);
  }
};

// The linear half of a gated activation.
struct Identity {
  template <typename V>
  V value(V x) const {
    return x;
  }
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    derivative = V::broadcast(1.0f);
    return x;
  }
};

// clamped_swiglu's linear half: clamp(x, -limit, limit) + 1; no gradient outside the clamp.
struct ClampedPlusOne {
  float limit;

  template <typename V>
  V value(V x) const {
    const V lo = V::broadcast(-limit), hi = V::broadcast(limit);
    return where_less(hi, x, hi, where_less(x, lo, lo, x)) + V::broadcast(1.0f);
  }
  template <typename V>
  V value_and_derivative(V x, V& derivative) const {
    const V lo = V::broadcast(-limit), hi = V::broadcast(limit);
    derivative = where_less(hi, x, V::zero(), where_less(x, lo, V::zero(), V::broadcast(1.0f)));
    return value(x);
  }
};

// y = act(x).
template <typename Act>
struct Plain {
  static constexpr bool kGated = false;
  Act act;
};

// y = gate(a) * linear(b) for x = [a, b] along the last dimension.
template <typename Gate, typename Linear>
struct Gated {
  static constexpr bool kGated = true;
  Gate gate;
  Linear linear;
};

// Calls fn with the composed functor of the activation.
template <typename Fn>
void with_activation(const Activation& a, Fn&& fn) {
  constexpr float kQGeluAlpha = 1.702f;
  switch (a.kind) {
    case ActivationKind::kGelu: return fn(Plain<Gelu>{});
    case ActivationKind::kQGelu: return fn(Plain<XSigmoid>{{kQGeluAlpha}});
    case ActivationKind::kRelu: return fn(Plain<Relu>{});
    case ActivationKind::kSRelu: return fn(Plain<SquaredRelu>{});
    case ActivationKind::kSilu: return fn(Plain<XSigmoid>{{1.0f}});
    case ActivationKind::kGlu: return fn(Gated<Sigmoid, Identity>{});
    case ActivationKind::kGeglu: return fn(Gated<Gelu, Identity>{});
    case ActivationKind::kQGeglu: return fn(Gated<XSigmoid, Identity>{{kQGeluAlpha}, {}});
    case ActivationKind::kReglu: return fn(Gated<Relu, Identity>{});
    case ActivationKind::kSReglu: return fn(Gated<SquaredRelu, Identity>{});
    case ActivationKind::kSwiglu: return fn(Gated<XSigmoid, Identity>{{1.0f}, {}});
    case ActivationKind::kClampedSwiglu:
      return fn(Gated<ClampedXSigmoid, ClampedPlusOne>{{a.alpha, a.limit}, {a.limit}});
  }
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::activations
