// Per-element math of memsave::max_pool2d, one definition for the host and the GPU: the CPU kernels (max_pool2d.cpp)
// and the CUDA kernels (max_pool2d.cu) both call these, so the CPU tests exercise the window and argmax arithmetic
// the GPU runs.
//
// The argmax of an output element is its window position kh * kW + kw (kh, kw counted from the window's nominal
// top-left corner, padding included), so windows of up to 256 positions (16x16) fit a byte.
#pragma once

#include <cstdint>
#include <limits>

#include <ATen/NumericUtils.h>
#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

namespace memsave {

struct Pool2dParams {
  int64_t kH, kW, sH, sW, pH, pW, dH, dW;
};

// The part of one output position's window that lies inside the input, along one axis: input positions
// start + k * dilation for k = k0, k0 + 1, ... while the position is < end (start itself may be negative, padding).
struct PoolSpan {
  int64_t start;  // input position of window index 0: o * stride - pad
  int64_t end;    // one past the last input position the window can reach, clipped to the input size
  int64_t k0;     // first window index whose input position is >= 0
};

C10_HOST_DEVICE inline PoolSpan pool_span(int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                                          int64_t size) {
  const int64_t start = o * stride - pad;
  const int64_t last = start + (k - 1) * dilation + 1;
  return PoolSpan{start, last < size ? last : size, start < 0 ? (-start + dilation - 1) / dilation : 0};
}

// Element strides of a [N, C, H, W] tensor ([C, H, W]: n = 0), so the kernels read and write any layout torch's
// max_pool2d keeps (contiguous, channels-last).
struct Pool2dStrides {
  int64_t n, c, h, w;
};

// Offset of plane `plane` (= n * C + c) of a tensor with `channels` channels.
C10_HOST_DEVICE inline int64_t pool2d_plane_offset(int64_t plane, int64_t channels, const Pool2dStrides& s) {
  return (plane / channels) * s.n + (plane % channels) * s.c;
}

// The maximum of one window of a plane (row stride sh, column stride sw), in the op-math type, and its argmax code
// (*code). torch's rule: the first maximum wins, scanning rows then columns, and NaN wins over anything. A window with
// no input element gives -inf and the code of its first position.
template <typename scalar_t>
C10_HOST_DEVICE inline at::opmath_type<scalar_t> max_pool2d_window(const scalar_t* plane, int64_t sh, int64_t sw,
                                                                   const PoolSpan& h, const PoolSpan& w,
                                                                   const Pool2dParams& p, int64_t* code) {
  using opmath_t = at::opmath_type<scalar_t>;
  opmath_t best = -std::numeric_limits<opmath_t>::infinity();
  *code = h.k0 * p.kW + w.k0;
  for (int64_t kh = h.k0, ih = h.start + h.k0 * p.dH; ih < h.end; ++kh, ih += p.dH) {
    for (int64_t kw = w.k0, iw = w.start + w.k0 * p.dW; iw < w.end; ++kw, iw += p.dW) {
      const opmath_t v = static_cast<opmath_t>(plane[ih * sh + iw * sw]);
      if (v > best || at::_isnan(v)) {
        best = v;
        *code = kh * p.kW + kw;
      }
    }
  }
  return best;
}

// The input row/column an argmax code points at, for output row/column o (may fall outside the input only for a
// window that holds no input element at all, which the backward skips).
C10_HOST_DEVICE inline int64_t pool_input_pos(int64_t o, int64_t k_index, int64_t stride, int64_t pad,
                                              int64_t dilation) {
  return o * stride - pad + k_index * dilation;
}

// The input element (*ih, *iw) that output (oh, ow) with argmax `code` took its value from.
C10_HOST_DEVICE inline void max_pool2d_argmax_pos(int64_t code, int64_t oh, int64_t ow, const Pool2dParams& p,
                                                  int64_t* ih, int64_t* iw) {
  *ih = pool_input_pos(oh, code / p.kW, p.sH, p.pH, p.dH);
  *iw = pool_input_pos(ow, code % p.kW, p.sW, p.pW, p.dW);
}

}  // namespace memsave
