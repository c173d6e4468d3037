// CUDA kernels of memsave::gated_act and gated_act_backward (schemas and CPU kernels: gated_act.cpp; per-element
// math: gated_act_math.h, the functions the CPU kernels call; host side: gated_act.h). Elementwise grid-stride
// loops on the current stream.
#include <ATen/AccumulateType.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "common/launch.cuh"
#include "gated_mlp/gated_act.h"
#include "gated_mlp/gated_act_math.h"

namespace memsave {
namespace {

template <Act A, typename scalar_t, typename acc_t>
__global__ void gated_act_kernel(const scalar_t* __restrict__ gate, const scalar_t* __restrict__ up, int64_t n,
                                 scalar_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<scalar_t>(gated_act_forward<A, acc_t>(static_cast<acc_t>(gate[i]), static_cast<acc_t>(up[i])));
  }
}

template <Act A, typename scalar_t, typename acc_t>
__global__ void gated_act_backward_kernel(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ gate,
                                          const scalar_t* __restrict__ up, int64_t n, scalar_t* __restrict__ grad_gate,
                                          scalar_t* __restrict__ grad_up) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    acc_t dg, du;
    gated_act_grads<A, acc_t>(static_cast<acc_t>(grad[i]), static_cast<acc_t>(gate[i]), static_cast<acc_t>(up[i]), dg,
                              du);
    grad_gate[i] = static_cast<scalar_t>(dg);
    grad_up[i] = static_cast<scalar_t>(du);
  }
}

struct GatedActCuda {
  template <Act A, typename scalar_t>
  static void forward(const scalar_t* gate, const scalar_t* up, int64_t n, scalar_t* out) {
    using acc_t = at::acc_type<scalar_t, true>;
    gated_act_kernel<A, scalar_t, acc_t>
        <<<cuda::grid_for(n), cuda::kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(gate, up, n, out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <Act A, typename scalar_t>
  static void backward(const scalar_t* grad, const scalar_t* gate, const scalar_t* up, int64_t n, scalar_t* grad_gate,
                       scalar_t* grad_up) {
    using acc_t = at::acc_type<scalar_t, true>;
    gated_act_backward_kernel<A, scalar_t, acc_t>
        <<<cuda::grid_for(n), cuda::kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(grad, gate, up, n, grad_gate,
                                                                                      grad_up);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("gated_act", &gated_act_impl<GatedActCuda>);
  m.impl("gated_act_backward", &gated_act_backward_impl<GatedActCuda>);
}

}  // namespace memsave
