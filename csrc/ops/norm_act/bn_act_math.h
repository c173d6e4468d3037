// Per-element math of the batch-norm + activation operators (batch_norm_act_backward, batch_norm_act_apply,
// inplace_abn, inplace_abn_backward), one definition for the host and the GPU: the CPU kernels (bn_act_cpu.h) and the
// CUDA kernels (bn_act_kernels.cuh) both call these, so the CPU tests exercise the arithmetic the GPU runs. The
// activations themselves are common/fused_act.h's.
//
// One exception, on purpose: the "normalize + activate" transform keeps the operation order of torch's batch norm on
// each device (bn_act_affine_cpu / bn_act_affine_cuda below), so that batch_norm_act_apply's recompute and
// inplace_abn's output match what torch's kernel computes there; the activation applied after it is shared.
#pragma once

#include <cstdint>

#include <c10/macros/Macros.h>

#include "common/fused_act.h"

namespace memsave {

// Per-channel values as raw pointers in the accumulation type; used on the host and in CUDA kernels.
template <typename acc_t>
struct ChannelParams {
  const acc_t* mean;  // batch_norm_act only
  const acc_t* invstd;
  const acc_t* weight;      // 1 when the layer is not affine
  const acc_t* bias;        // 0 when the layer is not affine
  const acc_t* inv_weight;  // inplace_abn only: 1 / weight, NaN where weight == 0
  Act act;
  acc_t act_param;
};

// (normalized input, activation derivative at the pre-activation) of element value v, given its channel's mean,
// invstd, w, b and inv_w (= 1 / w; only the values the direction needs are read):
//   from the input (batch_norm_act): xhat = (v - mean) * invstd, y = xhat * w + b;
//   from the output (inplace_abn):   y = act^-1(v), xhat = (y - b) * inv_w.
template <bool FromOutput, typename T>
C10_HOST_DEVICE inline void bn_act_recover(Act a, T act_param, T mean, T invstd, T w, T b, T inv_w, T v, T& xhat,
                                           T& dact) {
  if constexpr (FromOutput) {
    const T y = act_invert(a, v, act_param);
    dact = act_grad_from_output(a, v, act_param);
    xhat = (y - b) * inv_w;
  } else {
    xhat = (v - mean) * invstd;
    dact = act_grad(a, xhat * w + b, act_param);
  }
}

// The same, reading channel c's values from `p` (the CUDA kernels' form).
template <bool FromOutput, typename acc_t>
C10_HOST_DEVICE inline void bn_act_recover(const ChannelParams<acc_t>& p, int64_t c, acc_t v, acc_t& xhat,
                                           acc_t& dact) {
  if constexpr (FromOutput) {
    bn_act_recover<true>(p.act, p.act_param, acc_t(0), acc_t(0), acc_t(0), p.bias[c], p.inv_weight[c], v, xhat, dact);
  } else {
    bn_act_recover<false>(p.act, p.act_param, p.mean[c], p.invstd[c], p.weight[c], p.bias[c], acc_t(0), v, xhat, dact);
  }
}

// Input gradient of batch norm given g = grad_out * act'(y): k = w * invstd; mg, mgx = mean(g), mean(g * xhat) in
// training and 0 in eval. A channel with w == 0 has zero input gradient; from the output its xhat is unknown (NaN),
// so it is returned as 0 explicitly.
template <bool FromOutput, typename acc_t>
C10_HOST_DEVICE inline acc_t bn_act_dx(acc_t k, acc_t g, acc_t mg, acc_t xhat, acc_t mgx) {
  if constexpr (FromOutput) {
    if (k == acc_t(0)) return acc_t(0);
  }
  return k * (g - mg - xhat * mgx);
}

// The pre-activation of the transform, y = (x - mean) * invstd * w + b, in the order of torch's batch norm on each
// device. CPU (torch's batch_norm_cpu_transform_input): x * scale + shift with per-channel scale = invstd * w and
// shift = b - mean * scale. CUDA (torch's batch_norm_elementwise): ((x - mean) * invstd) * w + b.
template <typename T>
C10_HOST_DEVICE inline T bn_act_affine_cpu(T x, T scale, T shift) {
  return x * scale + shift;
}

template <typename T>
C10_HOST_DEVICE inline T bn_act_affine_cuda(T x, T mean, T invstd, T w, T b) {
  return (x - mean) * invstd * w + b;
}

}  // namespace memsave
