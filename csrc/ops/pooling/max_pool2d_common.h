// Host-side steps memsave::max_pool2d's CPU and CUDA kernels share: argument checks, output sizes (torch's formula)
// and strides. Outputs, argmax and the input gradient take the input's suggested memory format, as torch's do. The
// per-element math (windows, the one-byte argmax code) is in pool_math.h.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include "common/checks.h"
#include "pooling/pool_math.h"

namespace memsave {

constexpr int64_t kMaxPoolWindowPositions = 256;

// torch's pooling_output_shape: the last window must start inside the input or its left/top padding.
inline int64_t pool_output_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dilation, bool ceil) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1 + (ceil ? stride - 1 : 0);
  // floor division, also for a negative span (the caller reports an output size below 1)
  int64_t out = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
  if (ceil && (out - 1) * stride >= in + pad) {
    --out;
  }
  return out;
}

inline Pool2dParams check_pool2d_params(c10::IntArrayRef kernel_size, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                        c10::IntArrayRef dilation, const char* op) {
  TORCH_CHECK(kernel_size.size() == 2 && stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, "memsave.",
              op, ": kernel_size, stride, padding and dilation must each have 2 values, got ", kernel_size, ", ",
              stride, ", ", padding, ", ", dilation);
  const Pool2dParams p{kernel_size[0], kernel_size[1], stride[0],   stride[1],
                       padding[0],     padding[1],     dilation[0], dilation[1]};
  TORCH_CHECK(p.kH > 0 && p.kW > 0, "memsave.", op, ": kernel_size must be greater than zero, but got ", kernel_size);
  TORCH_CHECK(p.sH > 0 && p.sW > 0, "memsave.", op, ": stride must be greater than zero, but got ", stride);
  TORCH_CHECK(p.dH > 0 && p.dW > 0, "memsave.", op, ": dilation must be greater than zero, but got ", dilation);
  TORCH_CHECK(p.pH >= 0 && p.pW >= 0, "memsave.", op, ": padding must be non-negative, but got ", padding);
  TORCH_CHECK(p.pH <= p.kH / 2 && p.pW <= p.kW / 2, "memsave.", op,
              ": pad should be smaller than or equal to half of kernel size, but got padding=", padding,
              " and kernel_size=", kernel_size);
  TORCH_CHECK(p.kH * p.kW <= kMaxPoolWindowPositions, "memsave.", op,
              ": the argmax is kept in one byte, so a window may hold at most 256 positions (16x16), but "
              "kernel_size=",
              kernel_size, " has ", p.kH * p.kW, "; use torch.nn.functional.max_pool2d for it");
  return p;
}

// Checks the input and returns its output sizes ([C, OH, OW] or [N, C, OH, OW]).
inline std::vector<int64_t> max_pool2d_output_sizes(const at::Tensor& x, const Pool2dParams& p, bool ceil_mode,
                                                    const char* op) {
  check_floating(x, "self", op);
  const int64_t dim = x.dim();
  TORCH_CHECK((dim == 3 || dim == 4) && x.size(dim - 1) > 0 && x.size(dim - 2) > 0 && x.size(dim - 3) > 0, "memsave.",
              op,
              ": expected a 3D (C, H, W) or 4D (N, C, H, W) input with non-zero C, H, W "
              "(N may be 0), got sizes ",
              x.sizes());
  const int64_t H = x.size(dim - 2);
  const int64_t W = x.size(dim - 1);
  const int64_t OH = pool_output_size(H, p.kH, p.pH, p.sH, p.dH, ceil_mode);
  const int64_t OW = pool_output_size(W, p.kW, p.pW, p.sW, p.dW, ceil_mode);
  TORCH_CHECK(OH >= 1 && OW >= 1, "memsave.", op, ": given input size (", x.size(dim - 3), "x", H, "x", W,
              "), the calculated output size (", x.size(dim - 3), "x", OH, "x", OW, ") is too small");
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes[dim - 2] = OH;
  sizes[dim - 1] = OW;
  return sizes;
}

inline Pool2dStrides pool2d_strides(const at::Tensor& t) {
  const int64_t d = t.dim();
  return {d == 4 ? t.stride(0) : 0, t.stride(d - 3), t.stride(d - 2), t.stride(d - 1)};
}

// Checks max_pool2d_backward's gradient and argmax against input_size (3 or 4 values) and returns its rank.
inline int64_t check_max_pool2d_backward_args(const at::Tensor& grad_out, const at::Tensor& argmax,
                                              c10::IntArrayRef input_size) {
  const int64_t dim = static_cast<int64_t>(input_size.size());
  TORCH_CHECK(dim == 3 || dim == 4, "memsave.max_pool2d_backward: input_size must have 3 or 4 values, got ",
              input_size);
  constexpr const char* op = "max_pool2d_backward";
  check_floating(grad_out, "grad_out", op);
  check_same_device(argmax, "argmax", grad_out, "grad_out", op);
  check_dtype(argmax, at::kByte, "argmax", op);
  TORCH_CHECK(argmax.sizes() == grad_out.sizes(), "memsave.max_pool2d_backward: argmax must have the gradient's sizes ",
              grad_out.sizes(), ", got ", argmax.sizes(), "; pass the argmax the forward returned");
  TORCH_CHECK(
      grad_out.dim() == dim && grad_out.size(0) == input_size[0] && (dim == 3 || grad_out.size(1) == input_size[1]),
      "memsave.max_pool2d_backward: gradient sizes ", grad_out.sizes(), " do not fit input_size ", input_size);
  return dim;
}

// The tensors and sizes of one max_pool2d forward: the input and both outputs in the input's suggested memory format.
struct MaxPool2dForward {
  at::Tensor x, out, argmax;
  int64_t channels, H, W, OH, OW;
};

inline MaxPool2dForward max_pool2d_forward_prepare(const at::Tensor& self, c10::IntArrayRef kernel_size,
                                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                   c10::IntArrayRef dilation, bool ceil_mode, Pool2dParams* p) {
  *p = check_pool2d_params(kernel_size, stride, padding, dilation, "max_pool2d");
  const std::vector<int64_t> sizes = max_pool2d_output_sizes(self, *p, ceil_mode, "max_pool2d");
  const at::MemoryFormat fmt = self.suggest_memory_format();
  MaxPool2dForward f;
  f.x = self.contiguous(fmt);
  f.out = at::empty(sizes, f.x.options().memory_format(fmt));
  f.argmax = at::empty(sizes, f.x.options().dtype(at::kByte).memory_format(fmt));
  const int64_t d = self.dim();
  f.channels = self.size(d - 3);
  f.H = self.size(d - 2);
  f.W = self.size(d - 1);
  f.OH = sizes[d - 2];
  f.OW = sizes[d - 1];
  return f;
}

// The tensors and sizes of one max_pool2d backward: the gradient and argmax in the gradient's suggested memory
// format, and the input gradient (zeros when `zero`, else uninitialised) in the same format.
struct MaxPool2dBackward {
  at::Tensor g, argmax, grad_in;
  int64_t channels, H, W, OH, OW;
};

inline MaxPool2dBackward max_pool2d_backward_prepare(const at::Tensor& grad_out, const at::Tensor& argmax,
                                                     c10::SymIntArrayRef input_size_sym, c10::IntArrayRef kernel_size,
                                                     c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                     c10::IntArrayRef dilation, bool zero, Pool2dParams* p) {
  *p = check_pool2d_params(kernel_size, stride, padding, dilation, "max_pool2d_backward");
  const c10::IntArrayRef input_size = C10_AS_INTARRAYREF_SLOW(input_size_sym);
  const int64_t d = check_max_pool2d_backward_args(grad_out, argmax, input_size);
  const at::MemoryFormat fmt = grad_out.suggest_memory_format();
  MaxPool2dBackward b;
  b.g = grad_out.contiguous(fmt);
  b.argmax = argmax.contiguous(fmt);
  const auto opts = b.g.options().memory_format(fmt);
  // at::zeros drops the options' memory format; empty + zero_ keeps it.
  b.grad_in = at::empty(input_size, opts);
  if (zero) b.grad_in.zero_();
  b.channels = input_size[d - 3];
  b.H = input_size[d - 2];
  b.W = input_size[d - 1];
  b.OH = grad_out.size(d - 2);
  b.OW = grad_out.size(d - 1);
  return b;
}

}  // namespace memsave
