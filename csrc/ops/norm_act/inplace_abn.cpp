// memsave::inplace_abn — In-Place Activated BatchNorm: batch norm + an invertible activation written over its input,
// keeping only that output for backward (plus per-channel statistics), in the standard parametrization
// y = act(w * (x - mean) * invstd + b), so nn.BatchNorm2d weights load unchanged.
//
//   inplace_abn(self(a!), weight?, bias?, running_mean(b!)?, running_var(c!)?, training, momentum, eps, act,
//               act_param) -> (mean, invstd)
//       self is overwritten with the activated output; running statistics are updated as torch's batch norm does.
//       act: identity, leaky_relu (act_param = negative_slope > 0) or elu (act_param = alpha > 0).
//   inplace_abn_backward(grad_out, output, weight?, bias?, invstd, training, act, act_param)
//       -> (grad_input, grad_weight, grad_bias)
//       One fused kernel inverts the activation (y = act^-1(output)), recovers xhat = (y - b) / w, reduces
//       sum(g) and sum(g * xhat) per channel (g = grad_out * act'(y)) and writes the input gradient.
//       A channel whose weight is exactly 0 has lost xhat: its input gradient is 0 (exact), its bias gradient exact,
//       its weight gradient NaN. Near-zero weights amplify the rounding of the stored output by |b| / |w|.
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_cpu.h"
#include "norm_act/inplace_abn_common.h"

namespace memsave {

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def(
      "inplace_abn(Tensor(a!) self, Tensor? weight, Tensor? bias, Tensor(b!)? running_mean, "
      "Tensor(c!)? running_var, bool training, float momentum, float eps, str act, float act_param) "
      "-> (Tensor, Tensor)");
  m.def(
      "inplace_abn_backward(Tensor grad_out, Tensor output, Tensor? weight, Tensor? bias, Tensor invstd, "
      "bool training, str act, float act_param) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("inplace_abn", &inplace_abn_impl<cpu::BnActKernels>);
  m.impl("inplace_abn_backward", &inplace_abn_backward_impl<cpu::BnActKernels>);
}

}  // namespace memsave
