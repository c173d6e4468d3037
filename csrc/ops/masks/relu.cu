// CUDA kernels of memsave::relu / relu_ / relu_backward (schemas and CPU kernels: relu.cpp; per-element math shared
// with the CPU: ReluMask in mask_math.h).
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "common/launch.cuh"
#include "masks/bitmask.h"
#include "masks/mask_kernels.cuh"
#include "masks/mask_math.h"

namespace memsave {
namespace {

struct ReluCuda : NoScalar {
  static void forward_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask, double /*unused*/) {
    const int64_t n = x.numel();
    if (n == 0) return;
    const auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_relu_cuda", [&] {
      cuda::mask_forward_kernel<scalar_t, ReluMask><<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
          x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), mask.mutable_data_ptr<uint8_t>(), n, 0);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  static void backward_into(const at::Tensor& g, const at::Tensor& mask, const at::Tensor& grad_in, double) {
    cuda::launch_apply_mask<Apply::kPass>(g, mask, grad_in, 1.0, 0.0);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("relu", [](const at::Tensor& self) { return mask_forward<ReluCuda>(self, 0.0, "relu"); });
  m.impl("relu_", [](at::Tensor& self) { return mask_forward_<ReluCuda>(self, 0.0, "relu_"); });
  m.impl("relu_backward", [](const at::Tensor& grad_out, const at::Tensor& mask) {
    return mask_backward<ReluCuda>(grad_out, mask, 0.0, "relu_backward");
  });
}

}  // namespace memsave
