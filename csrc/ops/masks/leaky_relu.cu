// CUDA kernels of memsave::leaky_relu / leaky_relu_ / leaky_relu_backward (schemas, CPU kernels and semantics:
// leaky_relu.cpp; per-element math shared with the CPU: LeakyReluMask in mask_math.h).
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

struct LeakyReluCuda : LeakyReluOp {
  static void forward_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask, double slope) {
    const int64_t n = x.numel();
    if (n == 0) return;
    const auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_leaky_relu_cuda", [&] {
      using opmath_t = at::opmath_type<scalar_t>;
      cuda::mask_forward_kernel<scalar_t, LeakyReluMask><<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
          x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), mask.mutable_data_ptr<uint8_t>(), n,
          static_cast<opmath_t>(slope));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  static void backward_into(const at::Tensor& g, const at::Tensor& mask, const at::Tensor& grad_in, double slope) {
    cuda::launch_apply_mask<Apply::kLeaky>(g, mask, grad_in, 1.0, slope);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  impl_mask_kernels<LeakyReluCuda>(m);
}

}  // namespace memsave
