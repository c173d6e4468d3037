// Shared by gated_act.cpp, gated_act.cu and gated_act_linear.cpp: the argument checks of the gated operators, and
// the host side of gated_act / gated_act_backward that the CPU and CUDA kernels share.
#pragma once

#include <cstdint>
#include <tuple>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "common/checks.h"
#include "gated_mlp/gated_act_math.h"

namespace memsave {

// gate and up: the two projections of a gated MLP, same shape, dtype and device, floating-point.
inline void check_gate_up(const at::Tensor& gate, const at::Tensor& up, const char* op) {
  check_floating(gate, "gate", op);
  check_same_device(up, "up", gate, "gate", op);
  TORCH_CHECK_VALUE(up.sizes().equals(gate.sizes()), "memsave.", op, ": up must have gate's shape ", gate.sizes(),
                    ", got ", up.sizes());
  TORCH_CHECK(up.scalar_type() == gate.scalar_type(), "memsave.", op, ": up must have gate's dtype ",
              gate.scalar_type(), ", got ", up.scalar_type());
}

inline void check_gated_grad(const at::Tensor& grad, const at::Tensor& gate, const char* op) {
  check_float_arg(grad, "grad", gate, "gate", op);
  TORCH_CHECK_VALUE(grad.sizes().equals(gate.sizes()), "memsave.", op, ": grad must have gate's shape ", gate.sizes(),
                    ", got ", grad.sizes());
}

// The host functions below serve CPU and CUDA alike; `Kernels` is the device's elementwise loops over n dense
// elements (gated_act.cpp, gated_act.cu), both running gated_act_math.h per element:
//   forward<A>(gate, up, n, out) and backward<A>(grad, gate, up, n, grad_gate, grad_up), on scalar_t pointers.
template <class Kernels>
at::Tensor gated_act_impl(const at::Tensor& gate, const at::Tensor& up, c10::string_view act) {
  const Act a = parse_gated_act(act, "gated_act");
  check_gate_up(gate, up, "gated_act");
  const c10::DeviceGuard guard(gate.device());
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  const int64_t n = g.numel();
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_gated_act", [&] {
    with_gated_act(a, [&](auto act_c) {
      Kernels::template forward<decltype(act_c)::value>(g.const_data_ptr<scalar_t>(), u.const_data_ptr<scalar_t>(), n,
                                                        out.mutable_data_ptr<scalar_t>());
    });
  });
  return out;
}

template <class Kernels>
std::tuple<at::Tensor, at::Tensor> gated_act_backward_impl(const at::Tensor& grad, const at::Tensor& gate,
                                                           const at::Tensor& up, c10::string_view act) {
  const Act a = parse_gated_act(act, "gated_act_backward");
  check_gate_up(gate, up, "gated_act_backward");
  check_gated_grad(grad, gate, "gated_act_backward");
  const c10::DeviceGuard guard(gate.device());
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  const at::Tensor gr = grad.to(gate.scalar_type()).contiguous();
  at::Tensor grad_gate = at::empty(gate.sizes(), gate.options());
  at::Tensor grad_up = at::empty(gate.sizes(), gate.options());
  const int64_t n = g.numel();
  if (n == 0) return {grad_gate, grad_up};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_gated_act_backward", [&] {
    with_gated_act(a, [&](auto act_c) {
      Kernels::template backward<decltype(act_c)::value>(
          gr.const_data_ptr<scalar_t>(), g.const_data_ptr<scalar_t>(), u.const_data_ptr<scalar_t>(), n,
          grad_gate.mutable_data_ptr<scalar_t>(), grad_up.mutable_data_ptr<scalar_t>());
    });
  });
  return {grad_gate, grad_up};
}

}  // namespace memsave
