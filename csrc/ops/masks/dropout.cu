// CUDA kernels of memsave::dropout / dropout_ / dropout_backward (schemas, CPU kernels and semantics:
// dropout.cpp). The bits come from Philox4x32-10 keyed by a (seed, offset) reservation from PyTorch's
// default CUDA generator of the tensor's device, taken under the generator's lock; at::cuda::philox::unpack makes it
// safe under CUDA graph capture. The keep decision (philox::keeps) and the kept value (apply_mask_value) are the
// functions the CPU kernel calls.
#include <mutex>

#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxUtils.cuh>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "common/launch.cuh"
#include "masks/bitmask.h"
#include "masks/dropout_common.h"
#include "masks/mask_kernels.cuh"
#include "masks/mask_math.h"
#include "masks/philox.h"

namespace memsave {
namespace {

// Four elements of one Philox group, loaded and stored as one aligned vector when possible.
template <typename scalar_t>
struct alignas(4 * sizeof(scalar_t)) Vec4 {
  scalar_t v[4];
};

// One thread per group of 4 elements (one Philox call). A warp covers 128 elements = 16 mask bytes: even lanes
// merge their odd neighbour's 4 bits and write one byte each. The loop bound is warp-uniform for the shuffle.
// `out` may alias `in` (dropout_). draw == false: no random bits, `threshold` alone decides (p == 0 or p == 1).
template <typename scalar_t>
__global__ void dropout_forward_kernel(const scalar_t* in, scalar_t* out, uint8_t* __restrict__ mask, int64_t n,
                                       at::PhiloxCudaState rng, uint64_t threshold, bool draw, bool vectorized,
                                       at::opmath_type<scalar_t> scale) {
  using opmath_t = at::opmath_type<scalar_t>;
  uint64_t seed = 0;
  uint64_t offset = 0;
  if (draw) {
    const auto unpacked = at::cuda::philox::unpack(rng);
    seed = std::get<0>(unpacked);
    offset = std::get<1>(unpacked);
  }
  const uint32_t k0 = static_cast<uint32_t>(seed);
  const uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  const uint64_t counter = offset / 4;  // curand's convention: 4 words per counter step
  const uint32_t c0 = static_cast<uint32_t>(counter);
  const uint32_t c1 = static_cast<uint32_t>(counter >> 32);

  const int lane = threadIdx.x % cuda::kWarp;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / cuda::kWarp);
  const int64_t groups = (n + 3) / 4;
  const int64_t nbytes = packed_mask_bytes(n);
  for (int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / cuda::kWarp;
       warp * cuda::kWarp < groups; warp += warps_total) {
    const int64_t g = warp * cuda::kWarp + lane;
    uint32_t nibble = 0;
    if (g < groups) {
      uint32_t words[4] = {0, 0, 0, 0};
      if (draw) {
        const philox::Words w = philox::philox4x32(c0, c1, static_cast<uint32_t>(g),
                                                   static_cast<uint32_t>(static_cast<uint64_t>(g) >> 32), k0, k1);
        for (int j = 0; j < 4; ++j) {
          words[j] = w.v[j];
        }
      }
      const int64_t i0 = g * 4;
      if (vectorized && i0 + 4 <= n) {
        const Vec4<scalar_t> x = *reinterpret_cast<const Vec4<scalar_t>*>(in + i0);
        Vec4<scalar_t> y;
        for (int j = 0; j < 4; ++j) {
          const bool keep = philox::keeps(words[j], threshold);
          nibble |= static_cast<uint32_t>(keep) << j;
          y.v[j] = apply_mask_value<Apply::kPassScaled>(x.v[j], keep, scale, opmath_t(0));
        }
        *reinterpret_cast<Vec4<scalar_t>*>(out + i0) = y;
      } else {
        for (int j = 0; j < 4; ++j) {
          if (i0 + j < n) {
            const bool keep = philox::keeps(words[j], threshold);
            nibble |= static_cast<uint32_t>(keep) << j;
            out[i0 + j] = apply_mask_value<Apply::kPassScaled>(in[i0 + j], keep, scale, opmath_t(0));
          }
        }
      }
    }
    const uint32_t upper = __shfl_down_sync(0xffffffffu, nibble, 1);
    const int64_t byte = warp * (cuda::kWarp / 2) + lane / 2;
    if ((lane & 1) == 0 && byte < nbytes) {
      mask[byte] = static_cast<uint8_t>(nibble | (upper << 4));
    }
  }
}

bool aligned_for_vec4(const void* p, size_t elem_size) {
  return reinterpret_cast<uintptr_t>(p) % (4 * elem_size) == 0;
}

struct DropoutCuda : DropoutOp {
  static void forward_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask, double p);
  static void backward_into(const at::Tensor& g, const at::Tensor& mask, const at::Tensor& grad_in, double p) {
    cuda::launch_apply_mask<Apply::kPassScaled>(g, mask, grad_in, dropout_scale(g.scalar_type(), p), 0.0);
  }
};

void DropoutCuda::forward_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask, double p) {
  const int64_t n = x.numel();
  if (n == 0) {
    return;
  }
  const uint64_t threshold = philox::keep_threshold(p);
  const bool draw = threshold != 0 && threshold < (uint64_t{1} << 32);
  at::PhiloxCudaState rng;
  if (draw) {
    auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(x.device().index()));
    std::lock_guard<std::mutex> lock(gen->mutex_);
    rng = gen->philox_cuda_state(4);  // one counter step per call: every group uses counter offset / 4
  }
  const double scale = dropout_scale(x.scalar_type(), p);
  const int64_t groups = (n + 3) / 4;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_dropout_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const bool vectorized = aligned_for_vec4(x.const_data_ptr(), sizeof(scalar_t)) &&
                            aligned_for_vec4(out.const_data_ptr(), sizeof(scalar_t));
    dropout_forward_kernel<scalar_t><<<cuda::grid_for(groups), cuda::kThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), mask.mutable_data_ptr<uint8_t>(), n, rng,
        threshold, draw, vectorized, static_cast<opmath_t>(scale));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  impl_mask_kernels<DropoutCuda>(m);
}

}  // namespace memsave
