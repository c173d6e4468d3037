// CUDA kernels of memsave::inplace_abn / inplace_abn_backward (schemas, CPU kernels and the description:
// inplace_abn.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/inplace_abn_common.h"
#include "norm_act/bn_act_kernels.cuh"

namespace memsave {
namespace {

std::tuple<at::Tensor, at::Tensor> inplace_abn_cuda(at::Tensor& self, const c10::optional<at::Tensor>& weight,
                                                    const c10::optional<at::Tensor>& bias,
                                                    const c10::optional<at::Tensor>& running_mean,
                                                    const c10::optional<at::Tensor>& running_var, bool training,
                                                    double momentum, double eps, c10::string_view act,
                                                    double act_param) {
  const Act a = check_inplace_abn_args(self, weight, bias, running_mean, running_var, training, act, act_param);
  const c10::cuda::CUDAGuard guard(self.device());
  const at::MemoryFormat fmt = bn_memory_format(self);
  at::Tensor x = self.is_contiguous(fmt) ? self : self.contiguous(fmt);
  auto stats = inplace_abn_stats(x, running_mean, running_var, training, momentum, eps);
  const ChannelTensors ct =
      make_channel_tensors(x, weight, bias, std::get<0>(stats), std::get<1>(stats), bn_stat_dtype(x), false);
  cuda::bn::transform(x, x, ct, a, act_param, bn_layout(x, fmt));
  if (!x.is_same(self)) self.copy_(x);
  return stats;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> inplace_abn_backward_cuda(const at::Tensor& grad_out,
                                                                         const at::Tensor& output,
                                                                         const c10::optional<at::Tensor>& weight,
                                                                         const c10::optional<at::Tensor>& bias,
                                                                         const at::Tensor& invstd, bool training,
                                                                         c10::string_view act, double act_param) {
  const Act a = check_inplace_abn_backward_args(grad_out, output, weight, bias, invstd, act, act_param);
  const c10::cuda::CUDAGuard guard(output.device());

  const at::MemoryFormat fmt = bn_memory_format(output);
  const at::Tensor z = output.contiguous(fmt);
  const at::Tensor go = grad_out.to(z.scalar_type()).contiguous(fmt);
  const BnLayout l = bn_layout(z, fmt);
  const at::ScalarType sd = bn_stat_dtype(z);
  const ChannelTensors ct = make_channel_tensors(z, weight, bias, at::Tensor(), invstd, sd, true);
  at::Tensor grad_in = at::empty_like(z);
  at::Tensor sums = at::empty({2, l.C}, z.options().dtype(sd));
  cuda::bn::backward<true>(go, z, ct, a, act_param, training, l, grad_in, sums);
  const at::ScalarType pd = is_defined(weight) ? weight->scalar_type() : sd;
  return {grad_in, sums[1].to(pd, false, true), sums[0].to(pd, false, true)};
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("inplace_abn", &inplace_abn_cuda);
  m.impl("inplace_abn_backward", &inplace_abn_backward_cuda);
}

}  // namespace memsave
