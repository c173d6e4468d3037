// Per-element math of the mask-saving operators (relu, leaky_relu, dropout), one definition for the host and the GPU:
// the portable CPU loops (mask_cpu.h) and the CUDA kernels (mask_kernels.cuh, dropout.cu) call these, so the CPU
// tests exercise the arithmetic the GPU runs. (mask_cpu.h's AVX2 paths compute the same bits and values with
// intrinsics; the last partial byte of every range goes through these functions.)
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

namespace memsave {

// relu's forward: torch.relu keeps -0.0 and NaN as they are (only negative values become +0); the element passes its
// gradient iff !(x <= 0), so NaN passes it and -0.0 does not (threshold_backward). Comparisons are in the op-math
// type: a tiny negative double must not round to -0.0 first.
struct ReluMask {
  template <typename T>
  C10_HOST_DEVICE static inline T forward(T v, at::opmath_type<T> /*unused*/, bool* bit) {
    const auto f = static_cast<at::opmath_type<T>>(v);
    *bit = !(f <= 0);
    return f < 0 ? T(0) : v;
  }
};

// leaky_relu's forward (torch.nn.functional.leaky_relu): v > 0 ? v : v * slope, the product in the op-math type; the
// bit records v > 0.
struct LeakyReluMask {
  template <typename T>
  C10_HOST_DEVICE static inline T forward(T v, at::opmath_type<T> slope, bool* bit) {
    const auto f = static_cast<at::opmath_type<T>>(v);
    *bit = f > 0;
    return *bit ? v : static_cast<T>(f * slope);
  }
};

// What a mask does to a value v (the backward of all three operators, and dropout's forward):
// kPass: bit ? v : 0; kPassScaled: bit ? v * a : 0; kLeaky: bit ? v : v * b (products in the op-math type, as
// torch's kernels compute them).
enum class Apply { kPass, kPassScaled, kLeaky };

template <Apply kMode, typename T>
C10_HOST_DEVICE inline T apply_mask_value(T v, bool bit, at::opmath_type<T> a, at::opmath_type<T> b) {
  using opmath_t = at::opmath_type<T>;
  if (kMode == Apply::kPass) {
    return bit ? v : T(0);
  } else if (kMode == Apply::kPassScaled) {
    return bit ? static_cast<T>(static_cast<opmath_t>(v) * a) : T(0);
  } else {
    return bit ? v : static_cast<T>(static_cast<opmath_t>(v) * b);
  }
}

}  // namespace memsave
