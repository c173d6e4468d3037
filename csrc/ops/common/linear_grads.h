// The Linear at the end of the fused "... -> Linear" operators (act_linear, gated_act_linear, layer_norm_linear):
// its parameter gradients in their composite backwards.
#pragma once

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>

namespace memsave {

// The rows of a Linear's input or output t: the product of its leading sizes. Never numel / last size (a zero-width
// tensor would divide by zero) nor reshape({-1, 0}) (ambiguous for a zero-width tensor).
inline int64_t linear_rows(const at::Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

// grad_out of the Linear as [rows, out_features] in weight's dtype (rows taken from grad_out's leading sizes).
inline at::Tensor linear_grad_2d(const at::Tensor& grad_out, const at::Tensor& weight) {
  return grad_out.to(weight.scalar_type()).reshape({linear_rows(grad_out), weight.size(0)});
}

// (grad_weight, grad_bias) of the Linear, from go2 (grad_out as [rows, out_features] in weight's dtype) and h, the
// Linear's input recomputed by the backward. h is taken by value and released before the bias gradient, so that a
// recomputed temporary lives only for the weight gradient. grad_bias is empty without a bias.
inline std::tuple<at::Tensor, at::Tensor> linear_param_grads(const at::Tensor& go2, at::Tensor h,
                                                             const at::Tensor& weight, bool has_bias) {
  if (h.scalar_type() != weight.scalar_type()) h = h.to(weight.scalar_type());
  at::Tensor grad_weight = at::mm(go2.t(), h.reshape({go2.size(0), weight.size(1)}));
  h.reset();
  at::Tensor grad_bias = has_bias ? at::sum(go2, 0) : at::empty({0}, weight.options());
  return {grad_weight, grad_bias};
}

}  // namespace memsave
