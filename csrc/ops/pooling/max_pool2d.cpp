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
  const Pool2dParams p = check_pool2d_params(kernel_size, stride, padding, dilation, "max_pool2d");
  const std::vector<int64_t> out_sizes = max_pool2d_output_sizes(self, p, ceil_mode, "max_pool2d");
  const at::Tensor x = self.contiguous();
  at::Tensor out = at::empty(out_sizes, x.options());
  at::Tensor argmax = at::empty(out_sizes, x.options().dtype(at::kByte));
  const int64_t dim = x.dim();
  const int64_t H = x.size(dim - 2), W = x.size(dim - 1);
  const int64_t OH = out_sizes[dim - 2], OW = out_sizes[dim - 1];
  const int64_t planes = H * W == 0 ? 0 : x.numel() / (H * W);
  if (planes == 0) {
    return {out, argmax};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_max_pool2d_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* y = out.mutable_data_ptr<scalar_t>();
    uint8_t* am = argmax.mutable_data_ptr<uint8_t>();
    // One task per output row of a plane; a row costs about OW * kH * kW comparisons.
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, OW * p.kH * p.kW));
    at::parallel_for(0, planes * OH, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t plane = r / OH;
        const int64_t oh = r % OH;
        const scalar_t* src = in + plane * H * W;
        const PoolSpan h = pool_span(oh, p.kH, p.sH, p.pH, p.dH, H);
        for (int64_t ow = 0; ow < OW; ++ow) {
          const PoolSpan w = pool_span(ow, p.kW, p.sW, p.pW, p.dW, W);
          int64_t code;
          const opmath_t best = max_pool2d_window(src, W, h, w, p, &code);
          y[r * OW + ow] = static_cast<scalar_t>(best);
          am[r * OW + ow] = static_cast<uint8_t>(code);
        }
      }
    });
  });
  return {out, argmax};
}

at::Tensor max_pool2d_backward_cpu(const at::Tensor& grad_out, const at::Tensor& argmax,
                                   c10::SymIntArrayRef input_size_sym, at::IntArrayRef kernel_size,
                                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  const Pool2dParams p = check_pool2d_params(kernel_size, stride, padding, dilation, "max_pool2d_backward");
  const at::IntArrayRef input_size = C10_AS_INTARRAYREF_SLOW(input_size_sym);
  const int64_t dim = check_max_pool2d_backward_args(grad_out, argmax, input_size);
  const at::Tensor g = grad_out.contiguous();
  const at::Tensor am = argmax.contiguous();
  at::Tensor grad_in = at::zeros(input_size, g.options());
  const int64_t H = input_size[dim - 2], W = input_size[dim - 1];
  const int64_t OH = g.size(dim - 2), OW = g.size(dim - 1);
  const int64_t planes = OH * OW == 0 ? 0 : g.numel() / (OH * OW);
  if (planes == 0) {
    return grad_in;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_max_pool2d_backward_cpu", [&] {
    const scalar_t* go = g.const_data_ptr<scalar_t>();
    const uint8_t* code = am.const_data_ptr<uint8_t>();
    scalar_t* gi = grad_in.mutable_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / (OH * OW));
    // One task per plane: overlapping windows add into the same input element, in torch's order.
    at::parallel_for(0, planes, grain, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        scalar_t* dst = gi + c * H * W;
        for (int64_t oh = 0; oh < OH; ++oh) {
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t o = (c * OH + oh) * OW + ow;
            int64_t ih, iw;
            max_pool2d_argmax_pos(code[o], oh, ow, p, &ih, &iw);
            if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
              dst[ih * W + iw] += go[o];
            }
          }
        }
      }
    });
  });
  return grad_in;
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
