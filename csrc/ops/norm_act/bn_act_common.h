// Host-side steps shared by the batch-norm + activation operators (batch_norm_act, batch_norm_act_apply,
// inplace_abn; CPU and CUDA): argument checks, the memory layout the kernels read and the per-channel tensors. The
// per-element math is in bn_act_math.h.
//
// Layouts: "NC*" contiguous, read as (N, C, inner), or channels-last (ChannelsLast / ChannelsLast3d), read as
// N * inner rows of C channels. Any other strides are made contiguous first.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include "common/checks.h"
#include "common/fused_act.h"
#include "norm_act/bn_act_math.h"

namespace memsave {

// The layout the kernels read `x` in: channels-last only when x is channels-last and not plain contiguous, so an
// ambiguous tensor (C == 1, or spatial size 1) is always treated as contiguous. Mirrored by the fake kernels.
inline at::MemoryFormat bn_memory_format(const at::Tensor& x) {
  if (x.is_contiguous()) return at::MemoryFormat::Contiguous;
  if (x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast)) return at::MemoryFormat::ChannelsLast;
  if (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return at::MemoryFormat::ChannelsLast3d;
  return at::MemoryFormat::Contiguous;
}

struct BnLayout {
  int64_t N;
  int64_t C;
  int64_t inner;  // product of the spatial sizes
  bool channels_last;
};

inline BnLayout bn_layout(const at::Tensor& x, at::MemoryFormat fmt) {
  BnLayout l;
  l.N = x.size(0);
  l.C = x.size(1);
  l.inner = 1;
  for (int64_t d = 2; d < x.dim(); ++d) l.inner *= x.size(d);
  l.channels_last = fmt != at::MemoryFormat::Contiguous;
  return l;
}

// Statistics are kept in float (double for double inputs), as torch's batch norm does for mixed-precision inputs.
inline at::ScalarType bn_stat_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// A per-channel tensor of the batch norm over x (the argument named `x_name`): [C], floating, on x's device.
inline void check_channel_vector(const c10::optional<at::Tensor>& t, const at::Tensor& x, const char* what,
                                 const char* op, const char* x_name = "input") {
  if (!is_defined(t)) return;
  check_float_arg(*t, what, x, x_name, op);
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == x.size(1), "memsave.", op, ": ", what, " must have shape [",
                    x.size(1), "] (one value per channel of ", x_name, "), got ", t->sizes());
}

inline void check_bn_input(const at::Tensor& x, const char* op, const char* name = "input") {
  check_floating(x, name, op);
  TORCH_CHECK_VALUE(x.dim() >= 2, "memsave.", op, ": expected ", name,
                    " of shape [N, C, ...] (at least 2-D), got a tensor of shape ", x.sizes());
}

// grad_out of a backward: floating, on the saved tensor's device, with its shape.
inline void check_same_shape(const at::Tensor& grad, const at::Tensor& x, const char* op,
                             const char* x_name = "input") {
  check_float_arg(grad, "grad_out", x, x_name, op);
  TORCH_CHECK_VALUE(grad.sizes() == x.sizes(), "memsave.", op, ": grad_out has shape ", grad.sizes(), " but ", x_name,
                    " has shape ", x.sizes());
}

// The per-channel tensors of a batch norm over x: affine parameters and either statistics or running statistics.
inline void check_channel_vectors(const at::Tensor& x, const char* x_name, const char* op,
                                  std::initializer_list<std::pair<const char*, c10::optional<at::Tensor>>> vectors) {
  for (const auto& v : vectors) check_channel_vector(v.second, x, v.first, op, x_name);
}

// Checks the input, affine parameters and running statistics of a batch-norm forward (batch_norm_act, inplace_abn).
inline void check_bn_forward_args(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                                  const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& running_mean,
                                  const c10::optional<at::Tensor>& running_var, bool training, const char* op,
                                  const char* input_name = "input") {
  check_bn_input(input, op, input_name);
  check_channel_vectors(
      input, input_name, op,
      {{"weight", weight}, {"bias", bias}, {"running_mean", running_mean}, {"running_var", running_var}});
  TORCH_CHECK_VALUE(is_defined(running_mean) == is_defined(running_var), "memsave.", op,
                    ": pass both running_mean and running_var, or neither");
  TORCH_CHECK_VALUE(training || is_defined(running_mean), "memsave.", op,
                    ": eval mode (training=False) normalizes with running_mean/running_var, which were not given; "
                    "pass them, or training=True to use the batch statistics");
  if (training) {
    // Zero channels first: the division below would be by zero (SIGFPE).
    TORCH_CHECK_VALUE(input.size(1) > 0, "memsave.", op, ": input has no channels (size ", input.sizes(),
                      "); training computes statistics per channel, so it needs at least one");
    TORCH_CHECK_VALUE(input.numel() == 0 || input.numel() / input.size(1) > 1, "memsave.", op,
                      ": expected more than 1 value per channel when training, got input size ", input.sizes());
  }
}

// Checks the arguments of batch_norm_act_backward (CPU and CUDA) and returns its activation.
inline Act check_batch_norm_act_backward_args(const at::Tensor& grad_out, const at::Tensor& input,
                                              const c10::optional<at::Tensor>& weight,
                                              const c10::optional<at::Tensor>& bias, const at::Tensor& mean,
                                              const at::Tensor& invstd, c10::string_view act) {
  constexpr const char* op = "batch_norm_act_backward";
  const Act a = parse_act(act, op);
  check_bn_input(input, op);
  check_same_shape(grad_out, input, op);
  check_channel_vectors(input, "input", op, {{"weight", weight}, {"bias", bias}, {"mean", mean}, {"invstd", invstd}});
  return a;
}

// Checks the arguments of batch_norm_act_apply (CPU and CUDA) and returns its activation.
inline Act check_batch_norm_act_apply_args(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                                           const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, c10::string_view act) {
  constexpr const char* op = "batch_norm_act_apply";
  const Act a = parse_act(act, op);
  check_bn_input(input, op);
  check_channel_vectors(input, "input", op, {{"weight", weight}, {"bias", bias}, {"mean", mean}, {"invstd", invstd}});
  return a;
}

// Owns the per-channel tensors a ChannelParams points into.
struct ChannelTensors {
  at::Tensor mean, invstd, weight, bias, inv_weight;

  template <typename acc_t>
  ChannelParams<acc_t> params(Act act, double act_param) const {
    ChannelParams<acc_t> p;
    p.mean = mean.defined() ? mean.const_data_ptr<acc_t>() : nullptr;
    p.invstd = invstd.const_data_ptr<acc_t>();
    p.weight = weight.const_data_ptr<acc_t>();
    p.bias = bias.const_data_ptr<acc_t>();
    p.inv_weight = inv_weight.defined() ? inv_weight.const_data_ptr<acc_t>() : nullptr;
    p.act = act;
    p.act_param = static_cast<acc_t>(act_param);
    return p;
  }
};

// Converts the per-channel tensors to `acc` (contiguous, on x's device). `mean` may be undefined (inplace_abn);
// `with_inverse` adds 1 / weight with NaN where the weight is exactly 0 (the normalized input is then lost).
inline ChannelTensors make_channel_tensors(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, const at::Tensor& mean,
                                           const at::Tensor& invstd, at::ScalarType acc, bool with_inverse) {
  const auto opts = x.options().dtype(acc);
  const int64_t C = x.size(1);
  ChannelTensors t;
  if (mean.defined()) t.mean = mean.to(acc).contiguous();
  t.invstd = invstd.to(acc).contiguous();
  t.weight = (weight.has_value() && weight->defined()) ? weight->to(acc).contiguous() : at::ones({C}, opts);
  t.bias = (bias.has_value() && bias->defined()) ? bias->to(acc).contiguous() : at::zeros({C}, opts);
  if (with_inverse) {
    t.inv_weight = at::reciprocal(t.weight).masked_fill_(at::eq(t.weight, 0), std::numeric_limits<double>::quiet_NaN());
  }
  return t;
}

// The host functions below serve CPU and CUDA alike; `Kernels` is the device's kernels (cpu::BnActKernels in
// bn_act_cpu.h, cuda::bn::BnActKernels in bn_act_kernels.cuh): the dtype of the per-channel constants,
// transform(src, dst, ct, act, act_param, layout) and backward<FromOutput>(go, src, ct, act, act_param, training,
// layout, grad_in, sums).

// The fused backward from the saved input (batch_norm_act, FromOutput = false; mean given) or the saved output
// (inplace_abn, FromOutput = true; no mean): (grad_input, grad_weight, grad_bias), the parameter gradients in weight's
// dtype (the statistics' when there is no weight).
template <class Kernels, bool FromOutput>
std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_act_backward(const at::Tensor& grad_out, const at::Tensor& saved,
                                                               const c10::optional<at::Tensor>& weight,
                                                               const c10::optional<at::Tensor>& bias,
                                                               const at::Tensor& mean, const at::Tensor& invstd,
                                                               bool training, Act act, double act_param) {
  const c10::DeviceGuard guard(saved.device());
  const at::MemoryFormat fmt = bn_memory_format(saved);
  const at::Tensor x = saved.contiguous(fmt);
  const at::Tensor go = grad_out.to(x.scalar_type()).contiguous(fmt);
  const BnLayout l = bn_layout(x, fmt);
  const at::ScalarType acc = Kernels::acc_dtype(x);
  const ChannelTensors ct = make_channel_tensors(x, weight, bias, mean, invstd, acc, FromOutput);
  at::Tensor grad_in = at::empty_like(x);
  at::Tensor sums = at::empty({2, l.C}, x.options().dtype(acc));
  Kernels::template backward<FromOutput>(go, x, ct, act, act_param, training, l, grad_in, sums);
  const at::ScalarType pd = is_defined(weight) ? weight->scalar_type() : bn_stat_dtype(x);
  return {grad_in, sums[1].to(pd, false, true), sums[0].to(pd, false, true)};
}

template <class Kernels>
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward_impl(
    const at::Tensor& grad_out, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd, bool training,
    c10::string_view act, double act_param) {
  const Act a = check_batch_norm_act_backward_args(grad_out, input, weight, bias, mean, invstd, act);
  return bn_act_backward<Kernels, false>(grad_out, input, weight, bias, mean, invstd, training, a, act_param);
}

template <class Kernels>
at::Tensor batch_norm_act_apply_impl(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                                     const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                                     c10::string_view act, double act_param) {
  const Act a = check_batch_norm_act_apply_args(input, mean, invstd, weight, bias, act);
  const c10::DeviceGuard guard(input.device());
  const at::MemoryFormat fmt = bn_memory_format(input);
  const at::Tensor x = input.contiguous(fmt);
  at::Tensor out = at::empty_like(x);
  const ChannelTensors ct = make_channel_tensors(x, weight, bias, mean, invstd, Kernels::acc_dtype(x), false);
  Kernels::transform(x, out, ct, a, act_param, bn_layout(x, fmt));
  return out;
}

}  // namespace memsave
