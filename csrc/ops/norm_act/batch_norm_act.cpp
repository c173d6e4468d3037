// memsave::batch_norm_act — batch norm followed by an activation, keeping only the batch-norm input and the
// per-channel statistics for backward (torch keeps the input, the normalized output and, for gelu/silu/leaky_relu,
// the activation's input too).
//
//   batch_norm_act(input, weight?, bias?, running_mean(a!)?, running_var(b!)?, training, momentum, eps, act,
//                  act_param) -> (out, mean, invstd)
//       The normalization is torch's own batch norm kernel (cuDNN where torch would pick it), so outputs and
//       running statistics equal nn.BatchNorm2d + the activation; the activation is then applied in place.
//       mean/invstd: float (double for double input), the batch statistics in training, the running ones in eval.
//   batch_norm_act_backward(grad_out, input, weight?, bias?, mean, invstd, training, act, act_param)
//       -> (grad_input, grad_weight, grad_bias)
//       One fused kernel recomputes xhat = (x - mean) * invstd and y = xhat * w + b, multiplies grad_out by act'(y),
//       reduces sum(g) and sum(g * xhat) per channel and writes the input gradient. grad_weight/grad_bias are
//       always returned (dtype of weight, or of the statistics when there is none).
// (batch_norm_act_apply, the recompute of this output from the saved statistics, lives with its user,
// batch_norm_act_conv2d.cpp.)
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_batch_norm_impl_index.h>
#include <ATen/ops/elu.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/silu.h>
#include <torch/library.h>

#include "common/registration.h"
#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_cpu.h"

namespace memsave {
namespace {

void apply_act_inplace(at::Tensor& out, Act a, double p) {
  switch (a) {
    case Act::Identity:
      break;
    case Act::ReLU:
      at::relu_(out);
      break;
    case Act::LeakyReLU:
      at::leaky_relu_(out, p);
      break;
    case Act::ELU:
      at::elu_(out, p);
      break;
    case Act::GELU:
      at::gelu_(out, "none");
      break;
    case Act::GELUTanh:
      at::gelu_(out, "tanh");
      break;
    case Act::SiLU:
      at::silu_(out);
      break;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_forward(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& running_mean, const c10::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, c10::string_view act, double act_param) {
  constexpr const char* op = "batch_norm_act";
  const Act a = parse_act(act, op);
  check_bn_forward_args(input, weight, bias, running_mean, running_var, training, op);
  const at::MemoryFormat fmt = bn_memory_format(input);
  const at::Tensor x = input.contiguous(fmt);
  auto r = at::_batch_norm_impl_index(x, weight, bias, running_mean, running_var, training, momentum, eps,
                                      at::globalContext().userEnabledCuDNN());
  at::Tensor out = std::get<0>(r);
  if (!out.is_contiguous(fmt)) out = out.contiguous(fmt);
  apply_act_inplace(out, a, act_param);

  const at::ScalarType sd = bn_stat_dtype(input);
  at::Tensor mean, invstd;
  if (training) {
    // Native and cuDNN kernels both return the saved mean and the inverse standard deviation.
    mean = std::get<1>(r).to(sd, false, true);
    invstd = std::get<2>(r).to(sd, false, true);
  } else {
    mean = running_mean->to(sd, false, true);
    invstd = running_var->to(at::kDouble).add(eps).rsqrt().to(sd);
  }
  return {out, mean, invstd};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  // Torch's batch norm plus an in-place activation; the backward's CUDA kernel is in batch_norm_act.cu.
  def_cpu_and_cuda(m,
                   "batch_norm_act(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
                   "Tensor(b!)? running_var, bool training, float momentum, float eps, str act, float act_param) "
                   "-> (Tensor, Tensor, Tensor)",
                   &batch_norm_act_forward);
  m.def(
      "batch_norm_act_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor? bias, Tensor mean, "
      "Tensor invstd, bool training, str act, float act_param) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("batch_norm_act_backward", &batch_norm_act_backward_impl<cpu::BnActKernels>);
}

}  // namespace memsave
