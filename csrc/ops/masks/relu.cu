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

void relu_cuda_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask) {
  const int64_t n = x.numel();
  if (n == 0) {
    return;
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_relu_cuda", [&] {
    cuda::mask_forward_kernel<scalar_t, ReluMask><<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), mask.mutable_data_ptr<uint8_t>(), n, 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> relu_cuda(const at::Tensor& self) {
  check_floating_input(self, "relu");
  const c10::cuda::CUDAGuard guard(self.device());
  return mask_forward(self, relu_cuda_into);
}

at::Tensor relu_inplace_cuda(at::Tensor& self) {
  check_floating_input(self, "relu_");
  const c10::cuda::CUDAGuard guard(self.device());
  return mask_forward_(self, relu_cuda_into);
}

at::Tensor relu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& mask) {
  check_mask_matches(grad_out, mask, "relu_backward");
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const at::Tensor g = grad_out.contiguous();
  const at::Tensor mk = mask.contiguous();
  at::Tensor grad_in = at::empty_like(g);
  cuda::launch_apply_mask<Apply::kPass>(g, mk, grad_in, 1.0, 0.0);
  return grad_in;
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("relu", &relu_cuda);
  m.impl("relu_", &relu_inplace_cuda);
  m.impl("relu_backward", &relu_backward_cuda);
}

}  // namespace memsave
