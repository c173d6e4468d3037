// Bit-packed masks shared by the mask-saving operators (relu, leaky_relu, dropout).
// Layout: the i-th element of the tensor in memory order (row-major for a contiguous tensor, NHWC for channels-last)
// is bit (i % 8) of byte (i / 8); the mask holds ceil(numel / 8) bytes, the trailing bits of the last byte are zero.
#pragma once

#include <cstdint>
#include <tuple>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "common/checks.h"

namespace memsave {

C10_HOST_DEVICE inline int64_t packed_mask_bytes(int64_t numel) {
  return (numel + 7) / 8;
}

// A mask must have been produced for a tensor with as many elements as `grad`.
inline void check_mask_matches(const at::Tensor& grad, const at::Tensor& mask, const char* op) {
  check_floating(grad, "grad_out", op);
  check_same_device(mask, "mask", grad, "grad_out", op);
  check_dtype(mask, at::kByte, "mask", op);
  TORCH_CHECK(mask.dim() == 1 && mask.numel() == packed_mask_bytes(grad.numel()), "memsave.", op, ": the mask has ",
              mask.numel(), " bytes but a gradient of ", grad.numel(), " elements needs ",
              packed_mask_bytes(grad.numel()), "; pass the mask the forward returned for this tensor");
}

// A fresh mask for a tensor of `numel` elements on `like`'s device.
inline at::Tensor empty_mask(int64_t numel, const at::Tensor& like) {
  return at::empty({packed_mask_bytes(numel)}, like.options().dtype(at::kByte));
}

// The kernels walk a tensor in memory order (bit i of the mask is the i-th element in memory), so they take a dense
// tensor: `t` itself, or a dense copy with strides in t's order (what empty_like gives a non-dense tensor).
inline at::Tensor dense(const at::Tensor& t) {
  return t.is_non_overlapping_and_dense() ? t : at::empty_like(t).copy_(t);
}

// The three kernels of a mask-saving operator on one device, from `Spec`:
//   static void check(double scalar, const char* op);                       checks the operator's scalar
//   static void forward_into(x, out, mask, double scalar);                  fills out (may alias x) and mask
//   static void backward_into(grad, mask, grad_in, double scalar);          applies the mask to grad
// where x, out, grad and grad_in are dense with the same strides. Outputs keep the input's memory format
// (empty_like), and the backward takes the gradient in the forward output's strides (the autograd formulas
// restride it), so the mask's element order is the same in both.
template <class Spec>
std::tuple<at::Tensor, at::Tensor> mask_forward(const at::Tensor& self, double scalar, const char* op) {
  check_floating(self, "self", op);
  Spec::check(scalar, op);
  const c10::DeviceGuard guard(self.device());
  const at::Tensor x = dense(self);
  at::Tensor out = at::empty_like(x);
  at::Tensor mask = empty_mask(x.numel(), x);
  Spec::forward_into(x, out, mask, scalar);
  return {out, mask};
}

// The in-place forward: on self, or on a dense copy written back when self is not dense.
template <class Spec>
at::Tensor mask_forward_(at::Tensor& self, double scalar, const char* op) {
  check_floating(self, "self", op);
  Spec::check(scalar, op);
  at::assert_no_internal_overlap(self);
  const c10::DeviceGuard guard(self.device());
  at::Tensor mask = empty_mask(self.numel(), self);
  const at::Tensor x = dense(self);
  Spec::forward_into(x, x, mask, scalar);
  if (!x.is_same(self)) self.copy_(x);
  return mask;
}

template <class Spec>
at::Tensor mask_backward(const at::Tensor& grad_out, const at::Tensor& mask, double scalar, const char* op) {
  check_mask_matches(grad_out, mask, op);
  Spec::check(scalar, op);
  const c10::DeviceGuard guard(grad_out.device());
  const at::Tensor g = dense(grad_out);
  at::Tensor grad_in = at::empty_like(g);
  Spec::backward_into(g, mask.contiguous(), grad_in, scalar);
  return grad_in;
}

// For operators without a scalar check (relu, leaky_relu).
struct NoScalar {
  static void check(double, const char*) {}
};

// leaky_relu's operators, as its CPU and CUDA kernels register them.
struct LeakyReluOp : NoScalar {
  static constexpr const char* kNames[3] = {"leaky_relu", "leaky_relu_", "leaky_relu_backward"};
};

// Registers the kernels of `<name>`, `<name>_` and `<name>_backward` for an operator with one float argument
// (leaky_relu, dropout); Spec also names them: static constexpr const char* kNames[3].
template <class Spec>
void impl_mask_kernels(torch::Library& m) {
  m.impl(Spec::kNames[0],
         [](const at::Tensor& self, double s) { return mask_forward<Spec>(self, s, Spec::kNames[0]); });
  m.impl(Spec::kNames[1], [](at::Tensor& self, double s) { return mask_forward_<Spec>(self, s, Spec::kNames[1]); });
  m.impl(Spec::kNames[2], [](const at::Tensor& grad_out, const at::Tensor& mask, double s) {
    return mask_backward<Spec>(grad_out, mask, s, Spec::kNames[2]);
  });
}

}  // namespace memsave
