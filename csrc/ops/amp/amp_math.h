// Per-element math of dynamic loss scaling (memsave::unscale_and_check_, memsave::amp_update_scale_), one definition
// for the host and the GPU: the CPU kernels (unscale_and_check.cpp, amp_update_scale.cpp) and the CUDA kernels
// (unscale_and_check.cu, amp_update_scale.cu) call these, so the CPU tests exercise the arithmetic the GPU runs. The
// CPU's vector bodies (AVX2/F16C intrinsics, and the branch-free bfloat16 rounding the compiler vectorizes) compute
// the same values; their scalar fallbacks and tails use these functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace memsave {

// The bit pattern of a gradient dtype and its exponent field: a value is inf or NaN iff every exponent bit is set.
template <typename T>
struct FloatBits;
template <>
struct FloatBits<float> {
  using Raw = uint32_t;
  static constexpr Raw kExponent = 0x7f800000u;
};
template <>
struct FloatBits<double> {
  using Raw = uint64_t;
  static constexpr Raw kExponent = 0x7ff0000000000000ull;
};
template <>
struct FloatBits<c10::Half> {
  using Raw = uint16_t;
  static constexpr Raw kExponent = 0x7c00u;
};
template <>
struct FloatBits<c10::BFloat16> {
  using Raw = uint16_t;
  static constexpr Raw kExponent = 0x7f80u;
};

// Whether the raw bits of a T are inf or NaN.
template <typename T>
C10_HOST_DEVICE inline bool nonfinite_bits(typename FloatBits<T>::Raw bits) {
  return (bits & FloatBits<T>::kExponent) == FloatBits<T>::kExponent;
}

template <typename T>
C10_HOST_DEVICE inline bool nonfinite(T v) {
  typename FloatBits<T>::Raw bits;
  ::memcpy(&bits, &v, sizeof(bits));
  return nonfinite_bits<T>(bits);
}

// v * inv as torch._amp_foreach_non_finite_check_and_unscale_ computes it: the product in float (double for double
// tensors), rounded back to T (round to nearest even).
template <typename T>
C10_HOST_DEVICE inline T unscaled(T v, float inv) {
  using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
  return static_cast<T>(static_cast<acc_t>(v) * static_cast<acc_t>(inv));
}

// The scale-update rule, on one element each (run on the host for CPU tensors, by one thread on the GPU). Arithmetic
// follows torch._amp_update_scale_: the float scale times the double factor, rounded back to float.
C10_HOST_DEVICE inline void update_scale_step(float* scale, int32_t* growth_tracker, int32_t* overflow_tracker,
                                              const float* found_inf, double growth_factor, double backoff_factor,
                                              int64_t growth_interval, int64_t hysteresis) {
  if (*found_inf != 0.f) {
    *growth_tracker = 0;
    const int64_t overflows = static_cast<int64_t>(*overflow_tracker) + 1;
    if (overflows >= hysteresis) {
      *scale = static_cast<float>(static_cast<double>(*scale) * backoff_factor);
    }
    // Saturate: only "reached hysteresis" matters once it is reached.
    *overflow_tracker = static_cast<int32_t>(overflows < hysteresis ? overflows : hysteresis);
  } else {
    *overflow_tracker = 0;
    const int64_t successful = static_cast<int64_t>(*growth_tracker) + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(*scale) * growth_factor);
      if (!nonfinite(grown)) {  // never grow past the float range to inf
        *scale = grown;
      }
      *growth_tracker = 0;
    } else {
      *growth_tracker = static_cast<int32_t>(successful);
    }
  }
}

}  // namespace memsave
