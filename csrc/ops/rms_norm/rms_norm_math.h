// Per-element math of memsave::rms_norm and rms_norm_backward (and so of rms_norm_linear), one C10_HOST_DEVICE
// definition that the CPU kernels (rms_norm.cpp) and the CUDA kernels (rms_norm.cu) both call, so the CPU tests
// check the GPU's arithmetic.
//
// The forward is Hugging Face's LlamaRMSNorm, value for value:
//     variance = x.float().pow(2).mean(-1);  h = (x.float() * rsqrt(variance + eps)).to(input dtype);  out = w * h
// i.e. the normalized value is rounded to the input dtype before the weight multiplies it (a 16-bit input rounds
// twice, as in HF), and the product is taken in promote(input dtype, weight dtype). `acc_t` is float (double for
// double inputs); `in_t` is the input's dtype.
//
// Backward, with n = x * rstd (unrounded) and g = grad_out * w:
//     grad_x = rstd * (g - n * sum(g * n) / cols),   grad_w = sum over rows of grad_out * h
// (d rstd / d x_j = -rstd^3 x_j / cols); the rounding of h to the input dtype is treated as the identity, as
// autograd treats HF's .to(input_dtype).
#pragma once

#include <cmath>
#include <cstdint>

#include <c10/macros/Macros.h>

namespace memsave {

// 1 / sqrt(mean of squares + eps) of a row whose squares sum to `sum_sq`.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t rms_norm_rstd(acc_t sum_sq, int64_t cols, acc_t eps) {
  return acc_t(1) / ::sqrt(sum_sq / static_cast<acc_t>(cols) + eps);
}

// The normalized value as HF keeps it: x * rstd rounded to the input dtype (a no-op for float32/float64 inputs).
template <typename in_t, typename acc_t>
C10_HOST_DEVICE inline acc_t rms_norm_hidden(acc_t x, acc_t rstd) {
  return static_cast<acc_t>(static_cast<in_t>(x * rstd));
}

// One output element: the weight times the rounded normalized value (w = 1 without a weight).
template <typename in_t, typename acc_t>
C10_HOST_DEVICE inline acc_t rms_norm_element(acc_t x, acc_t rstd, acc_t w) {
  return w * rms_norm_hidden<in_t, acc_t>(x, rstd);
}

// One input-gradient element: g = grad_out * w at this element, n = x * rstd, mean_gn = sum(g * n) / cols.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t rms_norm_grad_input(acc_t g, acc_t n, acc_t rstd, acc_t mean_gn) {
  return rstd * (g - n * mean_gn);
}

}  // namespace memsave
