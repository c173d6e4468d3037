// CUDA kernels of memsave::relu / relu_ / relu_backward (schemas and CPU kernels: csrc/ops/relu.cpp).
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "../bitmask.h"
#include "launch.cuh"

namespace memsave {
namespace {

// One thread per element; a warp's 32 pass bits are gathered with a ballot and written as 4 bytes by lanes 0..3,
// so mask writes are coalesced. The loop bound is warp-uniform so every lane takes part in each ballot.
// `out` may alias `in` (relu_), so neither is __restrict__.
template <typename scalar_t>
__global__ void relu_forward_kernel(const scalar_t* in, scalar_t* out, uint8_t* __restrict__ mask, int64_t n) {
  const int lane = threadIdx.x % cuda::kWarp;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / cuda::kWarp);
  const int64_t nbytes = packed_mask_bytes(n);
  for (int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / cuda::kWarp;
       warp * cuda::kWarp < n; warp += warps_total) {
    const int64_t i = warp * cuda::kWarp + lane;
    bool pass = false;
    if (i < n) {
      const scalar_t v = in[i];
      // Compare in the op-math type: a tiny negative double must not round to -0.0 first.
      const auto f = static_cast<at::opmath_type<scalar_t>>(v);
      pass = !(f <= 0);               // NaN passes its gradient, -0.0 does not (threshold_backward)
      out[i] = f < 0 ? scalar_t(0) : v;  // -0.0 and NaN stay as they are (torch.relu)
    }
    const unsigned bits = __ballot_sync(0xffffffffu, pass);
    const int64_t byte = warp * 4 + lane;
    if (lane < 4 && byte < nbytes) {
      mask[byte] = static_cast<uint8_t>(bits >> (8 * lane));
    }
  }
}

template <typename scalar_t>
__global__ void relu_backward_kernel(const scalar_t* __restrict__ grad_out, const uint8_t* __restrict__ mask,
                                     scalar_t* __restrict__ grad_in, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const bool pass = (mask[i >> 3] >> (i & 7)) & 1;
    grad_in[i] = pass ? grad_out[i] : scalar_t(0);
  }
}

void relu_cuda_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask) {
  const int64_t n = x.numel();
  if (n == 0) {
    return;
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_relu_cuda", [&] {
    relu_forward_kernel<scalar_t><<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), mask.mutable_data_ptr<uint8_t>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> relu_cuda(const at::Tensor& self) {
  check_floating_input(self, "relu");
  const c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = self.contiguous();
  at::Tensor out = at::empty_like(x);
  at::Tensor mask = at::empty({packed_mask_bytes(x.numel())}, x.options().dtype(at::kByte));
  relu_cuda_into(x, out, mask);
  return {out, mask};
}

at::Tensor relu_inplace_cuda(at::Tensor& self) {
  check_floating_input(self, "relu_");
  at::assert_no_internal_overlap(self);
  const c10::cuda::CUDAGuard guard(self.device());
  at::Tensor mask = at::empty({packed_mask_bytes(self.numel())}, self.options().dtype(at::kByte));
  if (self.is_contiguous()) {
    relu_cuda_into(self, self, mask);
  } else {
    const at::Tensor x = self.contiguous();
    relu_cuda_into(x, x, mask);
    self.copy_(x);
  }
  return mask;
}

at::Tensor relu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& mask) {
  check_mask_matches(grad_out, mask, "relu_backward");
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const at::Tensor g = grad_out.contiguous();
  const at::Tensor mk = mask.contiguous();
  at::Tensor grad_in = at::empty_like(g);
  const int64_t n = g.numel();
  if (n == 0) {
    return grad_in;
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_relu_backward_cuda", [&] {
    relu_backward_kernel<scalar_t><<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
        g.const_data_ptr<scalar_t>(), mk.const_data_ptr<uint8_t>(), grad_in.mutable_data_ptr<scalar_t>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_in;
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("relu", &relu_cuda);
  m.impl("relu_", &relu_inplace_cuda);
  m.impl("relu_backward", &relu_backward_cuda);
}

}  // namespace memsave
