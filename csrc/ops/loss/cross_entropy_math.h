// Per-element math of memsave::linear_cross_entropy's tile kernels, for the host and the GPU: the CPU kernels
// (linear_cross_entropy.cpp) and the CUDA kernels (linear_cross_entropy.cu) call these same functions, so the CPU
// tests check the arithmetic the GPU runs (up to the FMA contraction nvcc applies).
//
// Notation, for one row of logits z over V classes with target t and label smoothing eps:
//   lse  = log(sum_j exp(z_j))                                  (online: a running max m and sum s = sum exp(z - m))
//   loss = lse - (1 - eps) * z_t - (eps / V) * sum_j z_j        (torch's cross_entropy with label_smoothing)
//   dloss/dz_j = softmax_j - (1 - eps) * [j == t] - eps / V     (times the row's incoming gradient)
// A row whose target is ignore_index has loss 0 and gradient 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <c10/macros/Macros.h>

namespace memsave {

// 2^n for an integer n in [-126, 127], built from its exponent bits.
C10_HOST_DEVICE inline float pow2_int(int32_t n) {
  const uint32_t bits = static_cast<uint32_t>(n + 127) << 23;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// exp(x) for the softmax terms. float: Cody-Waite range reduction and Cephes' degree-7 polynomial (within 2 ulp of
// exp on [-87.3, 88.7]), branch-free so that the CPU loops vectorize (glibc's expf does not); rounding to an integer
// uses the 1.5 * 2^23 trick for the same reason. Below -87.3 (exp < 1.2e-38, nothing next to a softmax's largest
// term, which is 1) it returns 0; above 88.7, +inf; NaN stays NaN. double: exp().
C10_HOST_DEVICE inline float softmax_exp(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.72283f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: (v + kRound) - kRound rounds v to the nearest integer
  const bool is_nan = !(x == x);
  float xc = is_nan ? 0.0f : x;
  xc = xc < kLo ? kLo : xc;
  xc = xc > kHi ? kHi : xc;
  float fn = (xc * kLog2e + kRound) - kRound;  // in [-126, 128]
  fn = fn > 127.0f ? 127.0f : fn;
  const float r = (xc - fn * kLn2Hi) - fn * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const float y = p * pow2_int(static_cast<int32_t>(fn));
  const float inf = std::numeric_limits<float>::infinity();
  return is_nan ? x : (x < kLo ? 0.0f : (x > kHi ? inf : y));
}

C10_HOST_DEVICE inline double softmax_exp(double x) {
  return exp(x);
}

// Merges the partial sum (m2, s2) into (m, s), where each pair stands for s * exp(m): the online log-sum-exp step.
// A part with no finite term (m2 = -inf, s2 = 0) changes nothing; a NaN propagates.
template <typename T>
C10_HOST_DEVICE inline void lse_merge(T& m, T& s, T m2, T s2) {
  if (m2 == -std::numeric_limits<T>::infinity()) return;
  if (m2 > m) {
    s = s * softmax_exp(m - m2) + s2;
    m = m2;
  } else {
    s = s + s2 * softmax_exp(m2 - m);
  }
}

// One more logit x into the running (m, s).
template <typename T>
C10_HOST_DEVICE inline void lse_update(T& m, T& s, T x) {
  lse_merge(m, s, x, T(1));
}

// The part of a row's loss that is linear in its logits, over one tile of them: sum_z is the tile's sum of logits,
// z_target the target's logit when the tile holds it (target_weight = 1 - eps then, 0 otherwise), smooth = eps / V.
// A row's loss is its log-sum-exp minus the sum of these parts over its tiles.
template <typename T>
C10_HOST_DEVICE inline T cross_entropy_linear_part(T sum_z, T z_target, T target_weight, T smooth) {
  // A zero weight drops its term outright: 0 * inf would be NaN where torch's loss is finite (an -inf logit that is
  // not the target, without smoothing).
  return (target_weight != T(0) ? target_weight * z_target : T(0)) + (smooth != T(0) ? smooth * sum_z : T(0));
}

// A row's log-sum-exp (kept in float64) as hi + lo in the kernels' type: z - lse is computed as (z - hi) - lo, so
// that rounding lse to float32 does not scale a whole row of softmax values by the same error.
template <typename T>
struct LseParts {
  T hi;
  T lo;
};

template <typename T>
C10_HOST_DEVICE inline LseParts<T> split_lse(double lse) {
  const T hi = static_cast<T>(lse);
  return {hi, static_cast<T>(lse - static_cast<double>(hi))};
}

// d(loss)/d(z) for one logit, times the row's incoming gradient `scale`.
template <typename T>
C10_HOST_DEVICE inline T cross_entropy_grad(T z, LseParts<T> lse, T target_weight, T smooth, T scale) {
  return scale * (softmax_exp((z - lse.hi) - lse.lo) - target_weight - smooth);
}

}  // namespace memsave
