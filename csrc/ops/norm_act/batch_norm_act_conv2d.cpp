// memsave::batch_norm_act_conv2d — BatchNorm2d -> activation -> Conv2d, keeping the batch-norm input and two
// per-channel vectors. The convolution would keep the activation's output (torch keeps it for every activation,
// relu included); here it is recomputed in backward from the saved input with one elementwise pass.
//
//   batch_norm_act_conv2d(input, bn_weight?, bn_bias?, running_mean(a!)?, running_var(b!)?, training, momentum,
//                         eps, act, act_param, weight, bias?, stride, padding, dilation, groups)
//       -> (out, mean, invstd)
//       The batch norm + activation is memsave::batch_norm_act (torch's batch-norm kernel, running statistics as
//       torch updates them); its output is cast to the conv weight's dtype (what autocast does) and convolved.
//   batch_norm_act_conv2d_backward(grad_out, input, bn_weight?, bn_bias?, mean, invstd, training, act, act_param,
//                                  weight, has_bias, stride, padding, dilation, groups)
//       -> (grad_input, grad_bn_weight, grad_bn_bias, grad_weight, grad_bias)
//       batch_norm_act_apply recomputes the activation output, torch's convolution backward gives its gradient and
//       the conv's, batch_norm_act_backward the rest. grad_bias is empty when has_bias is false.
//   batch_norm_act_apply(input, mean, invstd, weight?, bias?, act, act_param) -> act((input - mean) * invstd * w + b)
//       That recompute: the batch-norm + activation output from saved statistics, in one elementwise pass (CPU kernel
//       here, CUDA kernel in batch_norm_act_conv2d.cu; the normalization in the order of torch's batch norm on each
//       device, see bn_act_math.h).
//
// batch_norm_act_conv2d and its backward are torch ops plus memsave operators called through the dispatcher, so one
// implementation serves CPU and CUDA.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "common/registration.h"
#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_cpu.h"

namespace memsave {
namespace {

using OptTensor = c10::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_batch_norm_act(const at::Tensor& input, const OptTensor& weight,
                                                                   const OptTensor& bias, const OptTensor& running_mean,
                                                                   const OptTensor& running_var, bool training,
                                                                   double momentum, double eps, c10::string_view act,
                                                                   double act_param) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("memsave::batch_norm_act", "")
                                 .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                     const at::Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                     const OptTensor&, bool, double, double, c10::string_view, double)>();
  return handle.call(input, weight, bias, running_mean, running_var, training, momentum, eps, act, act_param);
}

at::Tensor call_batch_norm_act_apply(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                                     const OptTensor& weight, const OptTensor& bias, c10::string_view act,
                                     double act_param) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("memsave::batch_norm_act_apply", "")
                                 .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const OptTensor&, const OptTensor&, c10::string_view, double)>();
  return handle.call(input, mean, invstd, weight, bias, act, act_param);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_batch_norm_act_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const OptTensor& weight, const OptTensor& bias,
    const at::Tensor& mean, const at::Tensor& invstd, bool training, c10::string_view act, double act_param) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("memsave::batch_norm_act_backward", "")
                                 .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                     const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                                     const at::Tensor&, const at::Tensor&, bool, c10::string_view, double)>();
  return handle.call(grad_out, input, weight, bias, mean, invstd, training, act, act_param);
}

// The convolution's arguments (the batch norm's are checked by the batch_norm_act operators it calls, and here too so
// that messages name this operator).
void check_conv(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias, c10::IntArrayRef stride,
                c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups, const char* op) {
  check_bn_input(input, op);
  TORCH_CHECK_VALUE(input.dim() == 4, "memsave.", op, ": expected a 4-D input [N, C, H, W], got ", input.dim(),
                    "-D input of shape ", input.sizes());
  check_float_arg(weight, "weight", input, "input", op);
  TORCH_CHECK_VALUE(groups >= 1 && weight.dim() == 4 && weight.size(1) * groups == input.size(1), "memsave.", op,
                    ": conv weight of shape ", weight.sizes(), " with groups=", groups, " does not take ",
                    input.size(1), " input channels");
  TORCH_CHECK_VALUE(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, "memsave.", op,
                    ": stride, padding and dilation must have 2 entries each");
  if (!is_defined(bias)) return;
  check_float_arg(*bias, "bias", input, "input", op);
  TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "memsave.", op, ": bias must have shape [",
                    weight.size(0), "], got ", bias->sizes());
  check_dtype(*bias, weight.scalar_type(), "bias", op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_conv2d_forward(
    const at::Tensor& input, const OptTensor& bn_weight, const OptTensor& bn_bias, const OptTensor& running_mean,
    const OptTensor& running_var, bool training, double momentum, double eps, c10::string_view act, double act_param,
    const at::Tensor& weight, const OptTensor& bias, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "batch_norm_act_conv2d";
  check_conv(input, weight, bias, stride, padding, dilation, groups, op);
  check_channel_vectors(
      input, "input", op,
      {{"bn_weight", bn_weight}, {"bn_bias", bn_bias}, {"running_mean", running_mean}, {"running_var", running_var}});
  // The caller already cast for autocast; the inner ops must not be cast again.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  auto r = call_batch_norm_act(input, bn_weight, bn_bias, running_mean, running_var, training, momentum, eps, act,
                               act_param);
  at::Tensor h = std::get<0>(r);
  if (h.scalar_type() != weight.scalar_type()) h = h.to(weight.scalar_type());
  at::Tensor out = at::convolution(h, weight, bias, stride, padding, dilation, false, {0, 0}, groups);
  // One layout rule (the input's), so that the fake kernel can predict the strides.
  const at::MemoryFormat fmt = bn_memory_format(input);
  if (!out.is_contiguous(fmt)) out = out.contiguous(fmt);
  return {out, std::get<1>(r), std::get<2>(r)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_act_conv2d_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const OptTensor& bn_weight, const OptTensor& bn_bias,
    const at::Tensor& mean, const at::Tensor& invstd, bool training, c10::string_view act, double act_param,
    const at::Tensor& weight, bool has_bias, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "batch_norm_act_conv2d_backward";
  check_conv(input, weight, c10::nullopt, stride, padding, dilation, groups, op);
  check_float_arg(grad_out, "grad_out", input, "input", op);
  check_channel_vectors(input, "input", op,
                        {{"bn_weight", bn_weight}, {"bn_bias", bn_bias}, {"mean", mean}, {"invstd", invstd}});
  TORCH_CHECK_VALUE(grad_out.dim() == 4 && grad_out.size(0) == input.size(0) && grad_out.size(1) == weight.size(0),
                    "memsave.", op, ": grad_out of shape ", grad_out.sizes(), " does not match the output of ",
                    "input ", input.sizes(), " and weight ", weight.sizes());
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::Tensor grad_h, grad_weight, grad_bias;
  {
    // The recomputed activation output lives only for the convolution's backward.
    at::Tensor h = call_batch_norm_act_apply(input, mean, invstd, bn_weight, bn_bias, act, act_param);
    if (h.scalar_type() != weight.scalar_type()) h = h.to(weight.scalar_type());
    const std::vector<int64_t> bias_sizes{weight.size(0)};
    auto g = at::convolution_backward(grad_out.to(weight.scalar_type()), h, weight,
                                      has_bias ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(),
                                      stride, padding, dilation, false, {0, 0}, groups, {true, true, has_bias});
    grad_h = std::get<0>(g).to(input.scalar_type());
    grad_weight = std::get<1>(g).contiguous(bn_memory_format(weight));
    grad_bias = has_bias ? std::get<2>(g) : at::empty({0}, weight.options());
  }
  auto b = call_batch_norm_act_backward(grad_h, input, bn_weight, bn_bias, mean, invstd, training, act, act_param);
  return {std::get<0>(b), std::get<1>(b), std::get<2>(b), grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def(
      "batch_norm_act_apply(Tensor input, Tensor mean, Tensor invstd, Tensor? weight, Tensor? bias, str act, "
      "float act_param) -> Tensor");
  // Torch ops plus the batch_norm_act operators (CUDA kernels: batch_norm_act.cu, batch_norm_act_conv2d.cu).
  def_cpu_and_cuda(m,
                   "batch_norm_act_conv2d(Tensor input, Tensor? bn_weight, Tensor? bn_bias, Tensor(a!)? running_mean, "
                   "Tensor(b!)? running_var, bool training, float momentum, float eps, str act, float act_param, "
                   "Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation, int groups) "
                   "-> (Tensor, Tensor, Tensor)",
                   &batch_norm_act_conv2d_forward);
  def_cpu_and_cuda(m,
                   "batch_norm_act_conv2d_backward(Tensor grad_out, Tensor input, Tensor? bn_weight, Tensor? bn_bias, "
                   "Tensor mean, Tensor invstd, bool training, str act, float act_param, Tensor weight, "
                   "bool has_bias, int[2] stride, int[2] padding, int[2] dilation, int groups) "
                   "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
                   &batch_norm_act_conv2d_backward);
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("batch_norm_act_apply", &batch_norm_act_apply_impl<cpu::BnActKernels>);
}

}  // namespace memsave
