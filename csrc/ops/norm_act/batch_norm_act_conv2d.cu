// CUDA kernel of memsave::batch_norm_act_apply, the recompute step of batch_norm_act_conv2d's backward (schemas, CPU
// kernel and the composite forward/backward: batch_norm_act_conv2d.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_kernels.cuh"

namespace memsave {
namespace {

at::Tensor batch_norm_act_apply_cuda(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                                     const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                                     c10::string_view act, double act_param) {
  const Act a = check_batch_norm_act_apply_args(input, mean, invstd, weight, bias, act);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat fmt = bn_memory_format(input);
  const at::Tensor x = input.contiguous(fmt);
  at::Tensor out = at::empty_like(x);
  const ChannelTensors ct = make_channel_tensors(x, weight, bias, mean, invstd, bn_stat_dtype(x), false);
  cuda::bn::transform(x, out, ct, a, act_param, bn_layout(x, fmt));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("batch_norm_act_apply", &batch_norm_act_apply_cuda);
}

}  // namespace memsave
