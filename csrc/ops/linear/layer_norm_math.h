// Per-element math of memsave::layer_norm_apply (the recompute step of layer_norm_linear's backward) for the host and
// the GPU. Here the two devices deliberately do NOT share one formula: layer_norm_apply must reproduce the normalized
// tensor that torch's layer norm computed in layer_norm_linear's forward, and torch orders the arithmetic differently
// on each device, so each kernel keeps its device's order (one rounding apart otherwise):
//   CPU  (torch's LayerNormKernelImpl):       (x * scale + shift) * w + b, per-row scale = rstd, shift = -mean * rstd
//   CUDA (torch's LayerNormForwardCUDAKernel): (x - mean) * rstd * w + b
// Both are here, side by side, so that a change to one is made knowingly against the other.
#pragma once

#include <cstdint>

#include <c10/macros/Macros.h>

namespace memsave {

template <typename T>
C10_HOST_DEVICE inline T layer_norm_affine_cpu(T x, T scale, T shift, T w, T b) {
  return (x * scale + shift) * w + b;
}

// w / b may be null (no affine parameters): the product / sum is then skipped.
template <typename T>
C10_HOST_DEVICE inline T layer_norm_affine_cuda(T x, T mean, T rstd, const T* w, const T* b, int64_t col) {
  T v = (x - mean) * rstd;
  if (w != nullptr) v *= w[col];
  if (b != nullptr) v += b[col];
  return v;
}

}  // namespace memsave
