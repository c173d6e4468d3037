// memsave::gated_act_linear — the down projection of a gated MLP, linear(act(gate) * up, weight, bias), keeping gate
// and up for backward. torch's composition keeps gate, act(gate), up and the product (four tensors of the MLP
// width); this keeps two and recomputes the product for the weight gradient.
//
//   gated_act_linear(gate, up, weight, bias?, act) -> out
//       The product runs in gate's dtype (memsave::gated_act) and is cast to weight's dtype for the matmul.
//   gated_act_linear_backward(grad_out, gate, up, weight, has_bias, act) -> (grad_gate, grad_up, grad_weight,
//   grad_bias)
//       Recomputes the product for the weight gradient and frees it, then memsave::gated_act_backward on the
//       product's gradient. grad_bias is empty when has_bias is false.
//
// Everything is torch matmuls plus the gated_act operators (CPU kernels in gated_act.cpp, CUDA ones in
// gated_act.cu), called through the dispatcher, so one implementation serves both devices.
#include <algorithm>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/linear_grads.h"
#include "common/registration.h"
#include "gated_mlp/gated_act.h"
#include "gated_mlp/gated_act_math.h"

namespace memsave {
namespace {

at::Tensor call_gated_act(const at::Tensor& gate, const at::Tensor& up, c10::string_view act) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("memsave::gated_act", "")
                                 .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return handle.call(gate, up, act);
}

std::tuple<at::Tensor, at::Tensor> call_gated_act_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                           const at::Tensor& up, c10::string_view act) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("memsave::gated_act_backward", "")
                                 .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                           const at::Tensor&, c10::string_view)>();
  return handle.call(grad, gate, up, act);
}

at::Tensor gated_act_linear_forward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                                    const c10::optional<at::Tensor>& bias, c10::string_view act) {
  constexpr const char* op = "gated_act_linear";
  parse_gated_act(act, op);
  check_gate_up(gate, up, op);
  check_linear_params(weight, bias, gate.size(-1), gate, "gate", "weight", "bias", op);
  // The caller already cast for autocast; the inner ops must not be cast again.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::Tensor p = call_gated_act(gate, up, act);
  if (p.scalar_type() != weight.scalar_type()) p = p.to(weight.scalar_type());
  return at::linear(p, weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_act_linear_backward(
    const at::Tensor& grad_out, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight, bool has_bias,
    c10::string_view act) {
  constexpr const char* op = "gated_act_linear_backward";
  parse_gated_act(act, op);
  check_gate_up(gate, up, op);
  check_linear_params(weight, c10::nullopt, gate.size(-1), gate, "gate", "weight", "bias", op);
  check_linear_grad_out(grad_out, "grad_out", gate, "gate", weight, op);
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor go2 = linear_grad_2d(grad_out, weight);
  auto [grad_weight, grad_bias] = linear_param_grads(go2, call_gated_act(gate, up, act), weight, has_bias);
  auto grads = call_gated_act_backward(at::mm(go2, weight).view(gate.sizes()), gate, up, act);
  return {std::get<0>(grads), std::get<1>(grads), grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  def_cpu_and_cuda(m, "gated_act_linear(Tensor gate, Tensor up, Tensor weight, Tensor? bias, str act) -> Tensor",
                   &gated_act_linear_forward);
  def_cpu_and_cuda(m,
                   "gated_act_linear_backward(Tensor grad_out, Tensor gate, Tensor up, Tensor weight, bool has_bias, "
                   "str act) -> (Tensor, Tensor, Tensor, Tensor)",
                   &gated_act_linear_backward);
}

}  // namespace memsave
