// CUDA kernel of memsave::layer_norm_apply, the recompute step of layer_norm_linear's backward (schemas, CPU kernels
// and the composite forward/backward: layer_norm_linear.cpp; the per-element formula: layer_norm_math.h).
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/launch.cuh"
#include "linear/layer_norm_linear.h"
#include "linear/layer_norm_math.h"

namespace memsave {
namespace {

// One thread per element: y = (x - mean[row]) * rstd[row] * w[col] + b[col] in torch's CUDA order; w/b may be null.
template <typename in_t, typename out_t, typename acc_t>
__global__ void layer_norm_apply_kernel(const in_t* __restrict__ x, const acc_t* __restrict__ mean,
                                        const acc_t* __restrict__ rstd, const acc_t* __restrict__ w,
                                        const acc_t* __restrict__ b, int64_t cols, int64_t numel,
                                        out_t* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const int64_t row = i / cols;
    const int64_t col = i - row * cols;
    y[i] = static_cast<out_t>(layer_norm_affine_cuda(static_cast<acc_t>(x[i]), mean[row], rstd[row], w, b, col));
  }
}

at::Tensor layer_norm_apply_cuda(const at::Tensor& input, c10::IntArrayRef normalized_shape, const at::Tensor& mean,
                                 const at::Tensor& rstd, const c10::optional<at::Tensor>& weight,
                                 const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> dtype) {
  const LnShape s = check_layer_norm_apply_args(input, normalized_shape, mean, rstd, weight, bias);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  at::Tensor out = at::empty(input.sizes(), input.options().dtype(dtype.value_or(input.scalar_type())));
  const int64_t numel = x.numel();
  if (numel == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor m = mean.to(acc).contiguous();
  const at::Tensor r = rstd.to(acc).contiguous();
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  const at::Tensor w = has_w ? weight->to(acc).contiguous() : at::Tensor();
  const at::Tensor b = has_b ? bias->to(acc).contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_layer_norm_apply_cuda", [&] {
    using in_t = scalar_t;
    using acc_t = at::acc_type<in_t, true>;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "memsave_layer_norm_apply_out", [&] {
      layer_norm_apply_kernel<in_t, scalar_t, acc_t><<<cuda::grid_for(numel), cuda::kThreads, 0, stream>>>(
          x.const_data_ptr<in_t>(), m.const_data_ptr<acc_t>(), r.const_data_ptr<acc_t>(),
          has_w ? w.const_data_ptr<acc_t>() : nullptr, has_b ? b.const_data_ptr<acc_t>() : nullptr, s.cols, numel,
          out.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("layer_norm_apply", &layer_norm_apply_cuda);
}

}  // namespace memsave
