// Shared by gated_act.cpp, gated_act.cu and gated_act_linear.cpp: the argument checks of the gated operators.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace memsave {

// gate and up: the two projections of a gated MLP, same shape, dtype and device, floating-point.
inline void check_gate_up(const at::Tensor& gate, const at::Tensor& up, const char* op) {
  TORCH_CHECK(at::isFloatingType(gate.scalar_type()), "memsave.", op,
              ": expected a floating-point gate (float32, float64, float16 or bfloat16), got ", gate.scalar_type());
  TORCH_CHECK_VALUE(up.sizes().equals(gate.sizes()), "memsave.", op, ": up must have gate's shape ", gate.sizes(),
                    ", got ", up.sizes());
  TORCH_CHECK(up.scalar_type() == gate.scalar_type(), "memsave.", op, ": up must have gate's dtype ",
              gate.scalar_type(), ", got ", up.scalar_type());
  TORCH_CHECK(up.device() == gate.device(), "memsave.", op, ": up is on ", up.device(), " but gate is on ",
              gate.device());
}

inline void check_gated_grad(const at::Tensor& grad, const at::Tensor& gate, const char* op) {
  TORCH_CHECK_VALUE(grad.sizes().equals(gate.sizes()), "memsave.", op, ": grad must have gate's shape ", gate.sizes(),
                    ", got ", grad.sizes());
  TORCH_CHECK(grad.device() == gate.device(), "memsave.", op, ": grad is on ", grad.device(), " but gate is on ",
              gate.device());
}

}  // namespace memsave
