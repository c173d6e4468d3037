// Per-element math of memsave::gated_act and gated_act_backward (and so of gated_act_linear, the core of a gated
// MLP: SwiGLU, GeGLU), one C10_HOST_DEVICE definition that the CPU kernels (gated_act.cpp) and the CUDA kernels
// (gated_act.cu) both call. The activations are common/fused_act.h's, so they match torch's silu/gelu formulas.
//
//   forward:  p = act(gate) * up
//   backward: grad_gate = grad * up * act'(gate),  grad_up = grad * act(gate)
//             (relu: grad_gate = gate <= 0 ? 0 : grad * up, a select as torch's threshold_backward)
// Each element is computed in float (double for double tensors) and rounded once to the result dtype; torch's
// composition rounds act(gate) before the product, and each of its backward products, once more.
#pragma once

#include <type_traits>

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include "common/fused_act.h"

namespace memsave {

// The activations of a gated linear unit (leaky_relu and elu take a parameter no GLU variant uses).
inline Act parse_gated_act(c10::string_view name, const char* op) {
  const Act a = parse_act(name, op);
  TORCH_CHECK_VALUE(a == Act::SiLU || a == Act::GELU || a == Act::GELUTanh || a == Act::ReLU || a == Act::Identity,
                    "memsave.", op,
                    ": act must be one of silu (SwiGLU), gelu (GeGLU), gelu_tanh, relu (ReGLU) or "
                    "identity (bilinear), got '",
                    act_name(a), "'");
  return a;
}

// with_act_among over the activations parse_gated_act accepts.
template <typename F>
inline void with_gated_act(Act a, const F& f) {
  with_act_among<Act::SiLU, Act::GELU, Act::GELUTanh, Act::ReLU, Act::Identity>(a, f);
}

template <Act A, typename T>
C10_HOST_DEVICE inline T gated_act_forward(T gate, T up) {
  return act_forward<T>(A, gate, T(0)) * up;
}

// act(y) and act'(y) with the transcendental evaluated once: the operations of fused_act.h's act_forward and act_grad,
// so the same values (for gelu_tanh, act' takes tanh of act_forward's argument, which act_grad rounds differently).
template <Act A, typename T>
C10_HOST_DEVICE inline void act_value_and_grad(T y, T& value, T& grad) {
  if constexpr (A == Act::SiLU) {
    const T d = T(1) + ::exp(-y);
    const T s = T(1) / d;
    value = y / d;
    grad = s * (T(1) + y * (T(1) - s));
  } else if constexpr (A == Act::GELU) {
    const T e = ::erf(y * T(M_SQRT1_2));
    value = T(0.5) * y * (T(1) + e);
    grad = T(0.5) * (T(1) + e) + y * (::exp(T(-0.5) * y * y) * T(M_2_SQRTPI * M_SQRT1_2 * 0.5));
  } else if constexpr (A == Act::GELUTanh) {
    const T k_beta = T(M_SQRT2 * M_2_SQRTPI * 0.5);
    const T k_kappa = T(0.044715);
    const T y_sq = y * y;
    const T t = ::tanh(k_beta * (y + T(0.044715) * y * y * y));
    value = T(0.5) * y * (T(1) + t);
    grad = T(0.5) * (T(1) + t) + T(0.5) * y * ((T(1) - t * t) * k_beta * (T(1) + T(3) * k_kappa * y_sq));
  } else {
    value = act_forward<T>(A, y, T(0));
    grad = act_grad<T>(A, y, T(0));
  }
}

template <Act A, typename T>
C10_HOST_DEVICE inline void gated_act_grads(T grad, T gate, T up, T& grad_gate, T& grad_up) {
  T value, slope;
  act_value_and_grad<A, T>(gate, value, slope);
  if constexpr (A == Act::ReLU) {
    // torch's threshold_backward selects instead of multiplying by 0, so a gate <= 0 gets 0 even where grad * up is
    // inf or NaN (inf * 0 would be NaN).
    grad_gate = gate <= T(0) ? T(0) : grad * up;
  } else {
    grad_gate = grad * up * slope;
  }
  grad_up = grad * value;
}

}  // namespace memsave
