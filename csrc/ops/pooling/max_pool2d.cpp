// memsave::max_pool2d — 2D max pooling that saves the in-window argmax as one byte per output element for backward
// (torch saves int64 indices, 8 bytes, and its input).
//   max_pool2d(Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode)
//       -> (Tensor out, Tensor argmax)                       argmax: uint8, the shape of out (code: pool_math.h)
//   max_pool2d_backward(Tensor grad_out, Tensor argmax, SymInt[] input_size, int[2] kernel_size, int[2] stride,
//       int[2] padding, int[2] dilation) -> Tensor
// The backward needs only the input's sizes, so the input itself is not kept. Semantics match torch's CPU kernels
// exactly: the first maximum of a window wins, scanning rows then columns, NaN wins over anything; the backward adds
// gradients in output order (rows, then columns) in the input dtype, as torch's CPU backward does. The window scan and
// the argmax decoding are pool_math.h's, which the CUDA kernels (max_pool2d.cu) call too.
#include <algorithm>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "pooling/max_pool2d_common.h"
#include "pooling/pool_math.h"

namespace memsave {
namespace {

std::tuple<at::Tensor, at::Tensor> max_pool2d_cpu(const at::Tensor& self, at::IntArrayRef kernel_size,
                                                  at::IntArrayRef stride, at::IntArrayRef padding,
                                                  at::IntArrayRef dilation, bool ceil_mode) {
  Pool2dParams p;
  const MaxPool2dForward f = max_pool2d_forward_prepare(self, kernel_size, stride, padding, dilation, ceil_mode, &p);
  const int64_t planes = f.out.numel() == 0 ? 0 : f.out.numel() / (f.OH * f.OW);
  const Pool2dStrides xs = pool2d_strides(f.x), os = pool2d_strides(f.out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, f.x.scalar_type(), "memsave_max_pool2d_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* in = f.x.const_data_ptr<scalar_t>();
    scalar_t* y = f.out.mutable_data_ptr<scalar_t>();
    uint8_t* am = f.argmax.mutable_data_ptr<uint8_t>();
    // One task per output row of a plane; a row costs about OW * kH * kW comparisons.
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, f.OW * p.kH * p.kW));
    at::parallel_for(0, planes * f.OH, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t plane = r / f.OH;
        const int64_t oh = r % f.OH;
        const scalar_t* src = in + pool2d_plane_offset(plane, f.channels, xs);
        const int64_t row = pool2d_plane_offset(plane, f.channels, os) + oh * os.h;
        const PoolSpan h = pool_span(oh, p.kH, p.sH, p.pH, p.dH, f.H);
        for (int64_t ow = 0; ow < f.OW; ++ow) {
          const PoolSpan w = pool_span(ow, p.kW, p.sW, p.pW, p.dW, f.W);
          int64_t code;
          const opmath_t best = max_pool2d_window(src, xs.h, xs.w, h, w, p, &code);
          y[row + ow * os.w] = static_cast<scalar_t>(best);
          am[row + ow * os.w] = static_cast<uint8_t>(code);
        }
      }
    });
  });
  return {f.out, f.argmax};
}

at::Tensor max_pool2d_backward_cpu(const at::Tensor& grad_out, const at::Tensor& argmax, c10::SymIntArrayRef input_size,
                                   at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                   at::IntArrayRef dilation) {
  Pool2dParams p;
  const MaxPool2dBackward b =
      max_pool2d_backward_prepare(grad_out, argmax, input_size, kernel_size, stride, padding, dilation, true, &p);
  const int64_t planes = b.g.numel() == 0 ? 0 : b.g.numel() / (b.OH * b.OW);
  const Pool2dStrides gs = pool2d_strides(b.g), is = pool2d_strides(b.grad_in);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, b.g.scalar_type(), "memsave_max_pool2d_backward_cpu", [&] {
    const scalar_t* go = b.g.const_data_ptr<scalar_t>();
    const uint8_t* code = b.argmax.const_data_ptr<uint8_t>();
    scalar_t* gi = b.grad_in.mutable_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, b.OH * b.OW));
    // One task per plane: overlapping windows add into the same input element, in torch's order.
    at::parallel_for(0, planes, grain, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        scalar_t* dst = gi + pool2d_plane_offset(c, b.channels, is);
        const int64_t src = pool2d_plane_offset(c, b.channels, gs);
        for (int64_t oh = 0; oh < b.OH; ++oh) {
          for (int64_t ow = 0; ow < b.OW; ++ow) {
            const int64_t o = src + oh * gs.h + ow * gs.w;
            int64_t ih, iw;
            max_pool2d_argmax_pos(code[o], oh, ow, p, &ih, &iw);
            if (ih >= 0 && ih < b.H && iw >= 0 && iw < b.W) {
              dst[ih * is.h + iw * is.w] += go[o];
            }
          }
        }
      }
    });
  });
  return b.grad_in;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def(
      "max_pool2d(Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, "
      "bool ceil_mode) -> (Tensor, Tensor)");
  m.def(
      "max_pool2d_backward(Tensor grad_out, Tensor argmax, SymInt[] input_size, int[2] kernel_size, "
      "int[2] stride, int[2] padding, int[2] dilation) -> Tensor");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("max_pool2d", &max_pool2d_cpu);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cpu);
}

}  // namespace memsave
