// CUDA kernels of memsave::gated_act and gated_act_backward (schemas and CPU kernels: gated_act.cpp; per-element
// math: gated_act_math.h, the functions the CPU kernels call). Elementwise grid-stride loops on the current stream.
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
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

at::Tensor gated_act_cuda(const at::Tensor& gate, const at::Tensor& up, c10::string_view act) {
  const Act a = parse_gated_act(act, "gated_act");
  check_gate_up(gate, up, "gated_act");
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  const int64_t n = g.numel();
  if (n == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_gated_act_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    with_gated_act(a, [&](auto act_c) {
      constexpr Act A = decltype(act_c)::value;
      gated_act_kernel<A, scalar_t, acc_t><<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
          g.const_data_ptr<scalar_t>(), u.const_data_ptr<scalar_t>(), n, out.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gated_act_backward_cuda(const at::Tensor& grad, const at::Tensor& gate,
                                                           const at::Tensor& up, c10::string_view act) {
  const Act a = parse_gated_act(act, "gated_act_backward");
  check_gate_up(gate, up, "gated_act_backward");
  check_gated_grad(grad, gate, "gated_act_backward");
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  const at::Tensor gr = grad.to(gate.scalar_type()).contiguous();
  at::Tensor grad_gate = at::empty(gate.sizes(), gate.options());
  at::Tensor grad_up = at::empty(gate.sizes(), gate.options());
  const int64_t n = g.numel();
  if (n == 0) return {grad_gate, grad_up};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_gated_act_backward_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    with_gated_act(a, [&](auto act_c) {
      constexpr Act A = decltype(act_c)::value;
      gated_act_backward_kernel<A, scalar_t, acc_t><<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
          gr.const_data_ptr<scalar_t>(), g.const_data_ptr<scalar_t>(), u.const_data_ptr<scalar_t>(), n,
          grad_gate.mutable_data_ptr<scalar_t>(), grad_up.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {grad_gate, grad_up};
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("gated_act", &gated_act_cuda);
  m.impl("gated_act_backward", &gated_act_backward_cuda);
}

}  // namespace memsave
