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
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_cpu.h"
#include "norm_act/inplace_abn_common.h"

namespace memsave {
namespace {

std::tuple<at::Tensor, at::Tensor> inplace_abn_cpu(at::Tensor& self, const c10::optional<at::Tensor>& weight,
                                                   const c10::optional<at::Tensor>& bias,
                                                   const c10::optional<at::Tensor>& running_mean,
                                                   const c10::optional<at::Tensor>& running_var, bool training,
                                                   double momentum, double eps, c10::string_view act,
                                                   double act_param) {
  const Act a = check_inplace_abn_args(self, weight, bias, running_mean, running_var, training, act, act_param);
  const at::MemoryFormat fmt = bn_memory_format(self);
  // A non-dense self is transformed in a dense copy that is written back.
  at::Tensor x = self.is_contiguous(fmt) ? self : self.contiguous(fmt);
  auto stats = inplace_abn_stats(x, running_mean, running_var, training, momentum, eps);
  const ChannelTensors ct =
      make_channel_tensors(x, weight, bias, std::get<0>(stats), std::get<1>(stats), at::kDouble, false);
  cpu::bn_act_transform(x, x, ct.params<double>(a, act_param), bn_layout(x, fmt));
  if (!x.is_same(self)) self.copy_(x);
  return stats;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> inplace_abn_backward_cpu(const at::Tensor& grad_out,
                                                                        const at::Tensor& output,
                                                                        const c10::optional<at::Tensor>& weight,
                                                                        const c10::optional<at::Tensor>& bias,
                                                                        const at::Tensor& invstd, bool training,
                                                                        c10::string_view act, double act_param) {
  const Act a = check_inplace_abn_backward_args(grad_out, output, weight, bias, invstd, act, act_param);

  const at::MemoryFormat fmt = bn_memory_format(output);
  const at::Tensor z = output.contiguous(fmt);
  const at::Tensor go = grad_out.to(z.scalar_type()).contiguous(fmt);
  const BnLayout l = bn_layout(z, fmt);
  const ChannelTensors ct = make_channel_tensors(z, weight, bias, at::Tensor(), invstd, at::kDouble, true);
  at::Tensor grad_in = at::empty_like(z);
  at::Tensor sums = at::empty({2, l.C}, z.options().dtype(at::kDouble));
  double* sum_g = sums.mutable_data_ptr<double>();
  cpu::bn_act_backward_kernel<true>(go, z, ct.params<double>(a, act_param), training, l, grad_in, sum_g, sum_g + l.C);
  const at::ScalarType pd = is_defined(weight) ? weight->scalar_type() : bn_stat_dtype(output);
  return {grad_in, sums[1].to(pd, false, true), sums[0].to(pd, false, true)};
}

}  // namespace

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
  m.impl("inplace_abn", &inplace_abn_cpu);
  m.impl("inplace_abn_backward", &inplace_abn_backward_cpu);
}

}  // namespace memsave
