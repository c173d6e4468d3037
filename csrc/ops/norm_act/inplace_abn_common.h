// Host side of memsave::inplace_abn shared by its CPU (inplace_abn.cpp) and CUDA (inplace_abn.cu) kernels: argument
// checks, the per-channel statistics (batch statistics with the running-statistics update in training, running
// statistics in eval) and the operators themselves over the device's Kernels (see bn_act_common.h).
#pragma once

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/batch_norm_update_stats.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Optional.h>

#include "norm_act/bn_act_common.h"

namespace memsave {

// Checks the arguments of inplace_abn and returns its activation.
inline Act check_inplace_abn_args(const at::Tensor& self, const c10::optional<at::Tensor>& weight,
                                  const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& running_mean,
                                  const c10::optional<at::Tensor>& running_var, bool training, c10::string_view act,
                                  double act_param) {
  constexpr const char* op = "inplace_abn";
  const Act a = parse_act(act, op);
  check_invertible(a, act_param, op);
  check_bn_forward_args(self, weight, bias, running_mean, running_var, training, op, "self");
  return a;
}

// Checks the arguments of inplace_abn_backward (CPU and CUDA) and returns its activation.
inline Act check_inplace_abn_backward_args(const at::Tensor& grad_out, const at::Tensor& output,
                                           const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, const at::Tensor& invstd,
                                           c10::string_view act, double act_param) {
  constexpr const char* op = "inplace_abn_backward";
  const Act a = parse_act(act, op);
  check_invertible(a, act_param, op);
  check_bn_input(output, op, "output");
  check_same_shape(grad_out, output, op, "output");
  check_channel_vectors(output, "output", op, {{"weight", weight}, {"bias", bias}, {"invstd", invstd}});
  return a;
}

// (mean, invstd) in bn_stat_dtype(x). In training the running statistics are updated exactly as torch's batch norm
// updates them (same kernel: momentum, unbiased variance).
inline std::tuple<at::Tensor, at::Tensor> inplace_abn_stats(const at::Tensor& x,
                                                            const c10::optional<at::Tensor>& running_mean,
                                                            const c10::optional<at::Tensor>& running_var, bool training,
                                                            double momentum, double eps) {
  const at::ScalarType sd = bn_stat_dtype(x);
  if (!training) {
    return {running_mean->to(sd, false, true), running_var->to(at::kDouble).add(eps).rsqrt().to(sd)};
  }
  if (x.numel() == 0) {
    // An empty batch: torch's batch norm leaves the running statistics as they are (batch_norm_update_stats would
    // refuse it); the statistics of no values are returned as 0 and 1, and nothing reads them.
    const auto opts = x.options().dtype(sd);
    return {at::zeros({x.size(1)}, opts), at::ones({x.size(1)}, opts)};
  }
  at::Tensor rm, rv;
  if (is_defined(running_mean)) {
    rm = *running_mean;
    rv = *running_var;
  } else {
    // Scratch running statistics in the statistics dtype, so reduced-precision inputs get float statistics.
    const auto opts = x.options().dtype(sd);
    rm = at::zeros({x.size(1)}, opts);
    rv = at::ones({x.size(1)}, opts);
  }
  auto r = at::batch_norm_update_stats(x, rm, rv, momentum);
  at::Tensor mean = std::get<0>(r).to(sd, false, true);
  at::Tensor invstd = std::get<1>(r).to(at::kDouble).add(eps).rsqrt().to(sd);
  return {mean, invstd};
}

template <class Kernels>
std::tuple<at::Tensor, at::Tensor> inplace_abn_impl(at::Tensor& self, const c10::optional<at::Tensor>& weight,
                                                    const c10::optional<at::Tensor>& bias,
                                                    const c10::optional<at::Tensor>& running_mean,
                                                    const c10::optional<at::Tensor>& running_var, bool training,
                                                    double momentum, double eps, c10::string_view act,
                                                    double act_param) {
  const Act a = check_inplace_abn_args(self, weight, bias, running_mean, running_var, training, act, act_param);
  const c10::DeviceGuard guard(self.device());
  const at::MemoryFormat fmt = bn_memory_format(self);
  // A non-dense self is transformed in a dense copy that is written back.
  at::Tensor x = self.is_contiguous(fmt) ? self : self.contiguous(fmt);
  auto stats = inplace_abn_stats(x, running_mean, running_var, training, momentum, eps);
  const ChannelTensors ct =
      make_channel_tensors(x, weight, bias, std::get<0>(stats), std::get<1>(stats), Kernels::acc_dtype(x), false);
  Kernels::transform(x, x, ct, a, act_param, bn_layout(x, fmt));
  if (!x.is_same(self)) self.copy_(x);
  return stats;
}

template <class Kernels>
std::tuple<at::Tensor, at::Tensor, at::Tensor> inplace_abn_backward_impl(const at::Tensor& grad_out,
                                                                         const at::Tensor& output,
                                                                         const c10::optional<at::Tensor>& weight,
                                                                         const c10::optional<at::Tensor>& bias,
                                                                         const at::Tensor& invstd, bool training,
                                                                         c10::string_view act, double act_param) {
  const Act a = check_inplace_abn_backward_args(grad_out, output, weight, bias, invstd, act, act_param);
  return bn_act_backward<Kernels, true>(grad_out, output, weight, bias, at::Tensor(), invstd, training, a, act_param);
}

}  // namespace memsave
