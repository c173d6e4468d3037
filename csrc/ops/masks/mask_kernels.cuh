// CUDA kernels shared by the mask-saving operators (relu, leaky_relu, dropout): the elementwise forward that writes a
// bit-packed mask, and the backward that applies one. Mask layout: bitmask.h; per-element math: mask_math.h (the same
// functions the CPU loops call).
#pragma once

#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>

#include "common/launch.cuh"
#include "masks/bitmask.h"
#include "masks/mask_math.h"

namespace memsave {
namespace cuda {

// One thread per element; a warp's 32 bits are gathered with a ballot and written as 4 bytes by lanes 0..3. The
// loop bound is warp-uniform so every lane takes part in each ballot. `out` may alias `in` (in-place forms).
// Op: ReluMask or LeakyReluMask (mask_math.h).
template <typename scalar_t, typename Op>
__global__ void mask_forward_kernel(const scalar_t* in, scalar_t* out, uint8_t* __restrict__ mask, int64_t n,
                                    at::opmath_type<scalar_t> a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  const int64_t nbytes = packed_mask_bytes(n);
  for (int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; warp * kWarp < n;
       warp += warps_total) {
    const int64_t i = warp * kWarp + lane;
    bool bit = false;
    if (i < n) {
      out[i] = Op::forward(in[i], a, &bit);
    }
    const unsigned bits = __ballot_sync(0xffffffffu, bit);
    const int64_t byte = warp * 4 + lane;
    if (lane < 4 && byte < nbytes) {
      mask[byte] = static_cast<uint8_t>(bits >> (8 * lane));
    }
  }
}

// out[i] = apply_mask_value<kMode>(in[i], bit i of mask, a, b).
template <typename scalar_t, Apply kMode>
__global__ void apply_mask_kernel(const scalar_t* __restrict__ in, const uint8_t* __restrict__ mask,
                                  scalar_t* __restrict__ out, int64_t n, at::opmath_type<scalar_t> a,
                                  at::opmath_type<scalar_t> b) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const bool bit = (mask[i >> 3] >> (i & 7)) & 1;
    out[i] = apply_mask_value<kMode>(in[i], bit, a, b);
  }
}

// out = mask applied to `in` (both contiguous, same dtype and numel), on the current stream; `a`, `b` as in Apply.
template <Apply kMode>
void launch_apply_mask(const at::Tensor& in, const at::Tensor& mask, const at::Tensor& out, double a, double b) {
  const int64_t n = in.numel();
  if (n == 0) {
    return;
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in.scalar_type(), "memsave_apply_mask_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    apply_mask_kernel<scalar_t, kMode><<<grid_for(n), kThreads, 0, stream>>>(
        in.const_data_ptr<scalar_t>(), mask.const_data_ptr<uint8_t>(), out.mutable_data_ptr<scalar_t>(), n,
        static_cast<opmath_t>(a), static_cast<opmath_t>(b));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace memsave
