// memsave::act_linear — an elementwise activation followed by Linear, keeping only the activation's input for
// backward. torch keeps two tensors here for gelu/silu/leaky_relu/elu (the activation's input, and its output for the
// Linear); for relu it keeps one (relu's output serves both), so relu gains nothing and is accepted for uniformity.
//
//   act_linear(input, weight, bias?, act, act_param) -> out = linear(act(input), weight, bias)
//       The activation runs in input's dtype and is cast to weight's dtype for the matmul (what autocast does).
//   act_linear_backward(grad_out, input, weight, has_bias, act, act_param)
//       -> (grad_input, grad_weight, grad_bias)
//       Recomputes act(input) for the weight gradient; the input gradient uses torch's own activation backward
//       kernels, so it equals eager's. grad_bias is empty when has_bias is false.
//
// Everything here is torch ops (matmuls dominate), so one device-independent implementation serves CPU and CUDA.
#include <ATen/core/Tensor.h>
#include <ATen/ops/elu.h>
#include <ATen/ops/elu_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/leaky_relu_backward.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/threshold_backward.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/fused_act.h"
#include "common/linear_grads.h"
#include "common/registration.h"

namespace memsave {
namespace {

at::Tensor activation(const at::Tensor& x, Act a, double p) {
  switch (a) {
    case Act::Identity:
      return x;
    case Act::ReLU:
      return at::relu(x);
    case Act::LeakyReLU:
      return at::leaky_relu(x, p);
    case Act::ELU:
      return at::elu(x, p);
    case Act::GELU:
      return at::gelu(x, "none");
    case Act::GELUTanh:
      return at::gelu(x, "tanh");
    case Act::SiLU:
      return at::silu(x);
  }
  return x;
}

// d act(x) / dx * grad, by torch's own backward kernels. relu's threshold_backward is given the input rather than
// the output: both are <= 0 at the same places, so the result is identical.
at::Tensor activation_backward(const at::Tensor& grad, const at::Tensor& x, Act a, double p) {
  switch (a) {
    case Act::Identity:
      return grad;
    case Act::ReLU:
      return at::threshold_backward(grad, x, 0);
    case Act::LeakyReLU:
      return at::leaky_relu_backward(grad, x, p, false);
    case Act::ELU:
      return at::elu_backward(grad, p, 1, 1, false, x);
    case Act::GELU:
      return at::gelu_backward(grad, x, "none");
    case Act::GELUTanh:
      return at::gelu_backward(grad, x, "tanh");
    case Act::SiLU:
      return at::silu_backward(grad, x);
  }
  return grad;
}

void check_args(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                const char* op) {
  check_floating(input, "input", op);
  TORCH_CHECK_VALUE(input.dim() >= 1, "memsave.", op, ": input must have at least one dimension (in_features)");
  check_linear_params(weight, bias, input.size(-1), input, "input", "weight", "bias", op);
}

at::Tensor act_linear_forward(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                              c10::string_view act, double act_param) {
  const Act a = parse_act(act, "act_linear");
  check_args(input, weight, bias, "act_linear");
  // The caller already cast for autocast; the inner ops must not be cast again.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::Tensor h = activation(input, a, act_param);
  if (h.scalar_type() != weight.scalar_type()) h = h.to(weight.scalar_type());
  return at::linear(h, weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> act_linear_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                                   const at::Tensor& weight, bool has_bias,
                                                                   c10::string_view act, double act_param) {
  constexpr const char* op = "act_linear_backward";
  const Act a = parse_act(act, op);
  check_args(input, weight, c10::nullopt, op);
  check_linear_grad_out(grad_out, "grad_out", input, "input", weight, op);
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor x = input.contiguous();  // so the input gradient is contiguous whatever the input's strides
  const at::Tensor go2 = linear_grad_2d(grad_out, weight);
  auto [grad_weight, grad_bias] = linear_param_grads(go2, activation(x, a, act_param), weight, has_bias);
  const at::Tensor grad_h = at::mm(go2, weight).reshape(x.sizes()).to(x.scalar_type());
  return {activation_backward(grad_h, x, a, act_param), grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  def_cpu_and_cuda(m, "act_linear(Tensor input, Tensor weight, Tensor? bias, str act, float act_param) -> Tensor",
                   &act_linear_forward);
  def_cpu_and_cuda(m,
                   "act_linear_backward(Tensor grad_out, Tensor input, Tensor weight, bool has_bias, str act, "
                   "float act_param) -> (Tensor, Tensor, Tensor)",
                   &act_linear_backward);
}

}  // namespace memsave
