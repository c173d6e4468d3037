// Host-side steps of memsave::inplace_abn shared by its CPU (inplace_abn.cpp) and CUDA (cuda/inplace_abn.cu) kernels:
// argument checks and the per-channel statistics (batch statistics with the running-statistics update in training,
// running statistics in eval).
#pragma once

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/batch_norm_update_stats.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Optional.h>

#include "bn_act_common.h"

namespace memsave {

inline bool is_defined(const c10::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// Checks the arguments of inplace_abn and returns its activation.
inline Act check_inplace_abn_args(const at::Tensor& self, const c10::optional<at::Tensor>& weight,
                                  const c10::optional<at::Tensor>& bias,
                                  const c10::optional<at::Tensor>& running_mean,
                                  const c10::optional<at::Tensor>& running_var, bool training, c10::string_view act,
                                  double act_param) {
  constexpr const char* op = "inplace_abn";
  const Act a = parse_act(act, op);
  check_invertible(a, act_param, op);
  check_bn_input(self, op);
  check_channel_vector(weight, self, "weight", op);
  check_channel_vector(bias, self, "bias", op);
  check_channel_vector(running_mean, self, "running_mean", op);
  check_channel_vector(running_var, self, "running_var", op);
  TORCH_CHECK_VALUE(is_defined(running_mean) == is_defined(running_var), "memsave.", op,
                    ": pass both running_mean and running_var, or neither");
  TORCH_CHECK_VALUE(training || is_defined(running_mean), "memsave.", op,
                    ": eval mode (training=False) normalizes with running_mean/running_var, which were not given; "
                    "pass them, or training=True to use the batch statistics");
  if (training) {
    TORCH_CHECK_VALUE(self.numel() / self.size(1) > 1 || self.numel() == 0, "memsave.", op,
                      ": expected more than 1 value per channel when training, got input size ", self.sizes());
  }
  return a;
}

// (mean, invstd) in bn_stat_dtype(x). In training the running statistics are updated exactly as torch's batch norm
// updates them (same kernel: momentum, unbiased variance).
inline std::tuple<at::Tensor, at::Tensor> inplace_abn_stats(const at::Tensor& x,
                                                            const c10::optional<at::Tensor>& running_mean,
                                                            const c10::optional<at::Tensor>& running_var,
                                                            bool training, double momentum, double eps) {
  const at::ScalarType sd = bn_stat_dtype(x);
  if (!training) {
    return {running_mean->to(sd, false, true), running_var->to(at::kDouble).add(eps).rsqrt().to(sd)};
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

}  // namespace memsave
