// Activations shared by memsave's fused operators of three families (norm_act: batch_norm_act, inplace_abn; linear:
// act_linear; gated_mlp: gated_act, gated_act_linear): the name parser and the per-element forward, derivative and
// inverse, one C10_HOST_DEVICE definition that the CPU and CUDA kernels both call.
//
// Semantics follow torch's kernels: relu passes a gradient iff !(y <= 0) (threshold_backward on the output);
// leaky_relu uses y > 0 ? 1 : slope (leaky_relu_backward on the input); elu is x <= 0 ? alpha * expm1(x) : x with
// derivative x <= 0 ? alpha * exp(x) : 1; gelu is the erf form, gelu_tanh the tanh approximation; silu is
// x * sigmoid(x).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

namespace memsave {

enum class Act : int32_t { Identity = 0, ReLU, LeakyReLU, ELU, GELU, GELUTanh, SiLU };

// The activations' names, indexed by Act.
inline constexpr const char* kActNames[] = {"identity", "relu", "leaky_relu", "elu", "gelu", "gelu_tanh", "silu"};
inline constexpr int32_t kNumActs = sizeof(kActNames) / sizeof(kActNames[0]);

inline const char* act_name(Act a) {
  const auto i = static_cast<int32_t>(a);
  return i >= 0 && i < kNumActs ? kActNames[i] : "?";
}

// Parses an activation name; `op` names the operator in the error message.
inline Act parse_act(c10::string_view name, const char* op) {
  for (int32_t i = 0; i < kNumActs; ++i) {
    if (name == c10::string_view(kActNames[i])) return static_cast<Act>(i);
  }
  TORCH_CHECK_VALUE(false, "memsave.", op, ": unknown activation '", std::string(name.data(), name.size()),
                    "'; use one of identity, relu, leaky_relu, elu, gelu, gelu_tanh, silu");
}

// Calls f(std::integral_constant<Act, A>{}) for the A among `As` equal to `a`, so that the activation is a
// compile-time constant in the kernels' inner loops; only the listed activations are instantiated.
template <Act... As, typename F>
inline void with_act_among(Act a, const F& f) {
  const bool found = ((a == As && (f(std::integral_constant<Act, As>{}), true)) || ...);
  TORCH_INTERNAL_ASSERT(found, "memsave: no kernel instantiated for activation ", act_name(a));
}

// In-place ABN recovers the pre-activation from the output, so the activation must be strictly increasing.
inline void check_invertible(Act a, double param, const char* op) {
  TORCH_CHECK_VALUE(a == Act::Identity || a == Act::LeakyReLU || a == Act::ELU, "memsave.", op, ": activation '",
                    act_name(a),
                    "' is not invertible, so its input cannot be recovered from its output; use identity, "
                    "leaky_relu (negative_slope > 0) or elu (alpha > 0), or BatchNormAct2d for this activation");
  TORCH_CHECK_VALUE(a == Act::Identity || param > 0, "memsave.", op, ": ", act_name(a),
                    " needs a positive parameter to be invertible (negative_slope / alpha), got ", param,
                    "; with 0 it is relu, which loses its negative inputs");
}

// Activation of the pre-activation y.
template <typename T>
C10_HOST_DEVICE inline T act_forward(Act a, T y, T p) {
  switch (a) {
    case Act::Identity:
      return y;
    case Act::ReLU:
      return y <= T(0) ? T(0) : y;
    case Act::LeakyReLU:
      return y > T(0) ? y : y * p;
    case Act::ELU:
      return y <= T(0) ? p * ::expm1(y) : y;
    case Act::GELU:
      return T(0.5) * y * (T(1) + ::erf(y * T(M_SQRT1_2)));
    case Act::GELUTanh: {
      const T k_beta = T(M_SQRT2 * M_2_SQRTPI * 0.5);
      const T inner = k_beta * (y + T(0.044715) * y * y * y);
      return T(0.5) * y * (T(1) + ::tanh(inner));
    }
    case Act::SiLU:
      return y / (T(1) + ::exp(-y));
  }
  return y;
}

// Derivative of the activation at the pre-activation y.
template <typename T>
C10_HOST_DEVICE inline T act_grad(Act a, T y, T p) {
  switch (a) {
    case Act::Identity:
      return T(1);
    case Act::ReLU:
      return y <= T(0) ? T(0) : T(1);
    case Act::LeakyReLU:
      return y > T(0) ? T(1) : p;
    case Act::ELU:
      return y <= T(0) ? p * ::exp(y) : T(1);
    case Act::GELU: {
      const T cdf = T(0.5) * (T(1) + ::erf(y * T(M_SQRT1_2)));
      const T pdf = ::exp(T(-0.5) * y * y) * T(M_2_SQRTPI * M_SQRT1_2 * 0.5);
      return cdf + y * pdf;
    }
    case Act::GELUTanh: {
      const T k_beta = T(M_SQRT2 * M_2_SQRTPI * 0.5);
      const T k_kappa = T(0.044715);
      const T y_sq = y * y;
      const T inner = k_beta * (y + k_kappa * y_sq * y);
      const T t = ::tanh(inner);
      const T left = T(0.5) * y;
      const T right = T(1) + t;
      const T right_derivative = (T(1) - t * t) * k_beta * (T(1) + T(3) * k_kappa * y_sq);
      return T(0.5) * right + left * right_derivative;
    }
    case Act::SiLU: {
      const T s = T(1) / (T(1) + ::exp(-y));
      return s * (T(1) + y * (T(1) - s));
    }
  }
  return T(1);
}

// Pre-activation from the output z (invertible activations only; see check_invertible). For elu the output
// saturates at -alpha: below about log(machine epsilon) the input is no longer recoverable, so the ratio is clamped
// to stay finite (documented on InPlaceABN2d).
template <typename T>
C10_HOST_DEVICE inline T act_invert(Act a, T z, T p) {
  switch (a) {
    case Act::LeakyReLU:
      return z > T(0) ? z : z / p;
    case Act::ELU: {
      if (z > T(0)) return z;
      const T floor = T(-1) + (sizeof(T) >= 8 ? T(1e-15) : T(1.2e-7));
      const T r = z / p;
      return ::log1p(r > floor ? r : floor);
    }
    default:
      return z;
  }
}

// Derivative of the activation, expressed through its output z (invertible activations only).
template <typename T>
C10_HOST_DEVICE inline T act_grad_from_output(Act a, T z, T p) {
  switch (a) {
    case Act::LeakyReLU:
      return z > T(0) ? T(1) : p;
    case Act::ELU:
      return z <= T(0) ? z + p : T(1);
    default:
      return T(1);
  }
}

}  // namespace memsave
