// CUDA kernels of memsave::max_pool2d / max_pool2d_backward (schemas, CPU kernels and semantics:
// max_pool2d.cpp). The backward gathers: one thread per input element sums the gradients of the outputs
// whose argmax points at it, in output order, so it needs no atomics and is deterministic. The window scan and the
// argmax decoding are pool_math.h's, the functions the CPU kernels call.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/launch.cuh"
#include "pooling/max_pool2d_common.h"
#include "pooling/pool_math.h"

namespace memsave {
namespace {

template <typename scalar_t>
__global__ void max_pool2d_forward_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                                          uint8_t* __restrict__ argmax, int64_t total, int64_t H, int64_t W, int64_t OH,
                                          int64_t OW, Pool2dParams p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += step) {
    const int64_t ow = o % OW;
    const int64_t oh = (o / OW) % OH;
    const int64_t plane = o / (OW * OH);
    const PoolSpan h = pool_span(oh, p.kH, p.sH, p.pH, p.dH, H);
    const PoolSpan w = pool_span(ow, p.kW, p.sW, p.pW, p.dW, W);
    int64_t code;
    out[o] = static_cast<scalar_t>(max_pool2d_window(in + plane * H * W, W, h, w, p, &code));
    argmax[o] = static_cast<uint8_t>(code);
  }
}

// Outputs whose window can hold input row i: those o with o * stride - pad <= i <= o * stride - pad + (k-1) * dil.
__device__ __forceinline__ void covering_outputs(int64_t i, int64_t k, int64_t stride, int64_t pad, int64_t dil,
                                                 int64_t out_size, int64_t* first, int64_t* last) {
  const int64_t extent = (k - 1) * dil + 1;
  const int64_t lo = i + pad - extent + 1;  // o * stride >= lo
  *first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  *last = min((i + pad) / stride, out_size - 1);
}

template <typename scalar_t>
__global__ void max_pool2d_backward_kernel(const scalar_t* __restrict__ grad_out, const uint8_t* __restrict__ argmax,
                                           scalar_t* __restrict__ grad_in, int64_t total, int64_t H, int64_t W,
                                           int64_t OH, int64_t OW, Pool2dParams p) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t iw = i % W;
    const int64_t ih = (i / W) % H;
    const int64_t plane = i / (W * H);
    int64_t oh0, oh1, ow0, ow1;
    covering_outputs(ih, p.kH, p.sH, p.pH, p.dH, OH, &oh0, &oh1);
    covering_outputs(iw, p.kW, p.sW, p.pW, p.dW, OW, &ow0, &ow1);
    opmath_t sum = 0;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      if ((ih - (oh * p.sH - p.pH)) % p.dH != 0) {
        continue;  // row ih is between two dilated taps of this window: no argmax of it can point here
      }
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        if ((iw - (ow * p.sW - p.pW)) % p.dW != 0) {
          continue;
        }
        const int64_t o = (plane * OH + oh) * OW + ow;
        int64_t ah, aw;
        max_pool2d_argmax_pos(argmax[o], oh, ow, p, &ah, &aw);  // the decoding the CPU backward scatters with
        if (ah == ih && aw == iw) {
          sum += static_cast<opmath_t>(grad_out[o]);
        }
      }
    }
    grad_in[i] = static_cast<scalar_t>(sum);
  }
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_cuda(const at::Tensor& self, at::IntArrayRef kernel_size,
                                                   at::IntArrayRef stride, at::IntArrayRef padding,
                                                   at::IntArrayRef dilation, bool ceil_mode) {
  const Pool2dParams p = check_pool2d_params(kernel_size, stride, padding, dilation, "max_pool2d");
  const std::vector<int64_t> out_sizes = max_pool2d_output_sizes(self, p, ceil_mode, "max_pool2d");
  const c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = self.contiguous();
  at::Tensor out = at::empty(out_sizes, x.options());
  at::Tensor argmax = at::empty(out_sizes, x.options().dtype(at::kByte));
  const int64_t dim = x.dim();
  const int64_t H = x.size(dim - 2), W = x.size(dim - 1);
  const int64_t OH = out_sizes[dim - 2], OW = out_sizes[dim - 1];
  const int64_t total = out.numel();
  if (total == 0) {
    return {out, argmax};
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_max_pool2d_cuda", [&] {
    max_pool2d_forward_kernel<scalar_t><<<cuda::grid_for(total), cuda::kThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), argmax.mutable_data_ptr<uint8_t>(), total, H, W,
        OH, OW, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, argmax};
}

at::Tensor max_pool2d_backward_cuda(const at::Tensor& grad_out, const at::Tensor& argmax,
                                    c10::SymIntArrayRef input_size_sym, at::IntArrayRef kernel_size,
                                    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  const Pool2dParams p = check_pool2d_params(kernel_size, stride, padding, dilation, "max_pool2d_backward");
  const at::IntArrayRef input_size = C10_AS_INTARRAYREF_SLOW(input_size_sym);
  const int64_t dim = check_max_pool2d_backward_args(grad_out, argmax, input_size);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const at::Tensor g = grad_out.contiguous();
  const at::Tensor am = argmax.contiguous();
  at::Tensor grad_in = at::empty(input_size, g.options());
  const int64_t H = input_size[dim - 2], W = input_size[dim - 1];
  const int64_t OH = g.size(dim - 2), OW = g.size(dim - 1);
  const int64_t total = grad_in.numel();
  if (total == 0) {
    return grad_in;
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_max_pool2d_backward_cuda", [&] {
    max_pool2d_backward_kernel<scalar_t><<<cuda::grid_for(total), cuda::kThreads, 0, stream>>>(
        g.const_data_ptr<scalar_t>(), am.const_data_ptr<uint8_t>(), grad_in.mutable_data_ptr<scalar_t>(), total, H, W,
        OH, OW, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_in;
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("max_pool2d", &max_pool2d_cuda);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cuda);
}

}  // namespace memsave
