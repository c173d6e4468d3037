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

// Sizes and strides of one launch: the input's (or input gradient's) and the output's (or its gradient's).
struct PoolGeometry {
  int64_t channels, H, W, OH, OW;
  Pool2dStrides in, out;
};

template <typename scalar_t>
__global__ void max_pool2d_forward_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                                          uint8_t* __restrict__ argmax, int64_t total, PoolGeometry g, Pool2dParams p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += step) {
    const int64_t ow = o % g.OW;
    const int64_t oh = (o / g.OW) % g.OH;
    const int64_t plane = o / (g.OW * g.OH);
    const PoolSpan h = pool_span(oh, p.kH, p.sH, p.pH, p.dH, g.H);
    const PoolSpan w = pool_span(ow, p.kW, p.sW, p.pW, p.dW, g.W);
    const scalar_t* src = in + pool2d_plane_offset(plane, g.channels, g.in);
    const int64_t dst = pool2d_plane_offset(plane, g.channels, g.out) + oh * g.out.h + ow * g.out.w;
    int64_t code;
    out[dst] = static_cast<scalar_t>(max_pool2d_window(src, g.in.h, g.in.w, h, w, p, &code));
    argmax[dst] = static_cast<uint8_t>(code);
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
                                           scalar_t* __restrict__ grad_in, int64_t total, PoolGeometry g,
                                           Pool2dParams p) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t iw = i % g.W;
    const int64_t ih = (i / g.W) % g.H;
    const int64_t plane = i / (g.W * g.H);
    const int64_t src = pool2d_plane_offset(plane, g.channels, g.out);
    int64_t oh0, oh1, ow0, ow1;
    covering_outputs(ih, p.kH, p.sH, p.pH, p.dH, g.OH, &oh0, &oh1);
    covering_outputs(iw, p.kW, p.sW, p.pW, p.dW, g.OW, &ow0, &ow1);
    opmath_t sum = 0;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      if ((ih - (oh * p.sH - p.pH)) % p.dH != 0) {
        continue;  // row ih is between two dilated taps of this window: no argmax of it can point here
      }
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        if ((iw - (ow * p.sW - p.pW)) % p.dW != 0) {
          continue;
        }
        const int64_t o = src + oh * g.out.h + ow * g.out.w;
        int64_t ah, aw;
        max_pool2d_argmax_pos(argmax[o], oh, ow, p, &ah, &aw);  // the decoding the CPU backward scatters with
        if (ah == ih && aw == iw) {
          sum += static_cast<opmath_t>(grad_out[o]);
        }
      }
    }
    grad_in[pool2d_plane_offset(plane, g.channels, g.in) + ih * g.in.h + iw * g.in.w] = static_cast<scalar_t>(sum);
  }
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_cuda(const at::Tensor& self, at::IntArrayRef kernel_size,
                                                   at::IntArrayRef stride, at::IntArrayRef padding,
                                                   at::IntArrayRef dilation, bool ceil_mode) {
  const c10::cuda::CUDAGuard guard(self.device());
  Pool2dParams p;
  const MaxPool2dForward f = max_pool2d_forward_prepare(self, kernel_size, stride, padding, dilation, ceil_mode, &p);
  const int64_t total = f.out.numel();
  if (total == 0) {
    return {f.out, f.argmax};
  }
  const PoolGeometry g{f.channels, f.H, f.W, f.OH, f.OW, pool2d_strides(f.x), pool2d_strides(f.out)};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, f.x.scalar_type(), "memsave_max_pool2d_cuda", [&] {
    max_pool2d_forward_kernel<scalar_t><<<cuda::grid_for(total), cuda::kThreads, 0, stream>>>(
        f.x.const_data_ptr<scalar_t>(), f.out.mutable_data_ptr<scalar_t>(), f.argmax.mutable_data_ptr<uint8_t>(), total,
        g, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {f.out, f.argmax};
}

at::Tensor max_pool2d_backward_cuda(const at::Tensor& grad_out, const at::Tensor& argmax,
                                    c10::SymIntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  Pool2dParams p;
  const MaxPool2dBackward b =
      max_pool2d_backward_prepare(grad_out, argmax, input_size, kernel_size, stride, padding, dilation, false, &p);
  const int64_t total = b.grad_in.numel();
  if (total == 0) {
    return b.grad_in;
  }
  const PoolGeometry g{b.channels, b.H, b.W, b.OH, b.OW, pool2d_strides(b.grad_in), pool2d_strides(b.g)};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, b.g.scalar_type(), "memsave_max_pool2d_backward_cuda", [&] {
    max_pool2d_backward_kernel<scalar_t><<<cuda::grid_for(total), cuda::kThreads, 0, stream>>>(
        b.g.const_data_ptr<scalar_t>(), b.argmax.const_data_ptr<uint8_t>(), b.grad_in.mutable_data_ptr<scalar_t>(),
        total, g, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return b.grad_in;
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("max_pool2d", &max_pool2d_cuda);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cuda);
}

}  // namespace memsave
