// CUDA kernel of memsave::batch_norm_act_backward (schemas, forward and CPU kernels: batch_norm_act.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_kernels.cuh"

namespace memsave {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd, bool training,
    c10::string_view act, double act_param) {
  const Act a = check_batch_norm_act_backward_args(grad_out, input, weight, bias, mean, invstd, act);
  const c10::cuda::CUDAGuard guard(input.device());

  const at::MemoryFormat fmt = bn_memory_format(input);
  const at::Tensor x = input.contiguous(fmt);
  const at::Tensor go = grad_out.to(x.scalar_type()).contiguous(fmt);
  const BnLayout l = bn_layout(x, fmt);
  const at::ScalarType sd = bn_stat_dtype(x);
  const ChannelTensors ct = make_channel_tensors(x, weight, bias, mean, invstd, sd, false);
  at::Tensor grad_in = at::empty_like(x);
  at::Tensor sums = at::empty({2, l.C}, x.options().dtype(sd));
  cuda::bn::backward<false>(go, x, ct, a, act_param, training, l, grad_in, sums);
  const at::ScalarType pd = is_defined(weight) ? weight->scalar_type() : sd;
  return {grad_in, sums[1].to(pd, false, true), sums[0].to(pd, false, true)};
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("batch_norm_act_backward", &batch_norm_act_backward_cuda);
}

}  // namespace memsave
