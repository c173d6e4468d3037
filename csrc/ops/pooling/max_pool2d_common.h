// Host-side steps memsave::max_pool2d's CPU and CUDA kernels share: argument checks and output sizes (torch's
// formula). The per-element math (windows, the one-byte argmax code) is in pool_math.h.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

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
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "memsave.", op,
              ": expected a floating-point tensor (float32, float64, float16 or bfloat16), got ", x.scalar_type());
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

// Checks max_pool2d_backward's gradient and argmax against input_size (3 or 4 values) and returns its rank.
inline int64_t check_max_pool2d_backward_args(const at::Tensor& grad_out, const at::Tensor& argmax,
                                              c10::IntArrayRef input_size) {
  const int64_t dim = static_cast<int64_t>(input_size.size());
  TORCH_CHECK(dim == 3 || dim == 4, "memsave.max_pool2d_backward: input_size must have 3 or 4 values, got ",
              input_size);
  TORCH_CHECK(argmax.scalar_type() == at::kByte && argmax.sizes() == grad_out.sizes(),
              "memsave.max_pool2d_backward: argmax must be uint8 with the gradient's sizes ", grad_out.sizes(),
              ", got ", argmax.scalar_type(), " ", argmax.sizes(), "; pass the argmax the forward returned");
  TORCH_CHECK(argmax.device() == grad_out.device(), "memsave.max_pool2d_backward: argmax is on ", argmax.device(),
              " but the gradient is on ", grad_out.device());
  TORCH_CHECK(
      grad_out.dim() == dim && grad_out.size(0) == input_size[0] && (dim == 3 || grad_out.size(1) == input_size[1]),
      "memsave.max_pool2d_backward: gradient sizes ", grad_out.sizes(), " do not fit input_size ", input_size);
  return dim;
}

}  // namespace memsave
