// Shared by gated_act.cpp, gated_act.cu and gated_act_linear.cpp: the argument checks of the gated operators.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "common/checks.h"

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

}  // namespace memsave
