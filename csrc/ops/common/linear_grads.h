// The Linear at the end of the fused "... -> Linear" operators (act_linear, gated_act_linear, layer_norm_linear):
// its parameter gradients in their composite backwards.
#pragma once

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>

namespace memsave {

// (grad_weight, grad_bias) of the Linear, from go2 (grad_out as [rows, out_features] in weight's dtype) and h, the
// Linear's input recomputed by the backward. h is taken by value and released before the bias gradient, so that a
// recomputed temporary lives only for the weight gradient. grad_bias is empty without a bias.
inline std::tuple<at::Tensor, at::Tensor> linear_param_grads(const at::Tensor& go2, at::Tensor h,
                                                             const at::Tensor& weight, bool has_bias) {
  if (h.scalar_type() != weight.scalar_type()) h = h.to(weight.scalar_type());
  at::Tensor grad_weight = at::mm(go2.t(), h.reshape({-1, weight.size(1)}));
  h.reset();
  at::Tensor grad_bias = has_bias ? at::sum(go2, 0) : at::empty({0}, weight.options());
  return {grad_weight, grad_bias};
}

}  // namespace memsave
