// Bit-packed masks shared by the mask-saving operators (relu, leaky_relu, dropout).
// Layout: element i of the (contiguous, row-major) tensor is bit (i % 8) of byte (i / 8); the mask holds
// ceil(numel / 8) bytes, the trailing bits of the last byte are zero.
#pragma once

#include <cstdint>
#include <tuple>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

namespace memsave {

C10_HOST_DEVICE inline int64_t packed_mask_bytes(int64_t numel) {
  return (numel + 7) / 8;
}

// The checks every mask-saving operator makes on its floating-point input.
inline void check_floating_input(const at::Tensor& x, const char* op) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "memsave.", op,
              ": expected a floating-point tensor (float32, float64, float16 or bfloat16), got ", x.scalar_type(),
              "; convert the input with .float() first");
}

// A mask must have been produced for a tensor with as many elements as `grad`.
inline void check_mask_matches(const at::Tensor& grad, const at::Tensor& mask, const char* op) {
  TORCH_CHECK(mask.scalar_type() == at::kByte, "memsave.", op, ": the mask must be uint8, got ", mask.scalar_type());
  TORCH_CHECK(mask.dim() == 1 && mask.numel() == packed_mask_bytes(grad.numel()), "memsave.", op, ": the mask has ",
              mask.numel(), " bytes but a gradient of ", grad.numel(), " elements needs ",
              packed_mask_bytes(grad.numel()), "; pass the mask the forward returned for this tensor");
  TORCH_CHECK(mask.device() == grad.device(), "memsave.", op, ": the mask is on ", mask.device(),
              " but the gradient is on ", grad.device());
}

// A fresh mask for a tensor of `numel` elements on `like`'s device.
inline at::Tensor empty_mask(int64_t numel, const at::Tensor& like) {
  return at::empty({packed_mask_bytes(numel)}, like.options().dtype(at::kByte));
}

// The out-of-place forward of a mask-saving operator: `into(x, out, mask)` fills out and mask from contiguous x.
template <typename Into>
std::tuple<at::Tensor, at::Tensor> mask_forward(const at::Tensor& self, Into&& into) {
  const at::Tensor x = self.contiguous();
  at::Tensor out = at::empty_like(x);
  at::Tensor mask = empty_mask(x.numel(), x);
  into(x, out, mask);
  return {out, mask};
}

// The in-place forward: `into(x, x, mask)` on self, or on a contiguous copy written back when self is strided.
template <typename Into>
at::Tensor mask_forward_(at::Tensor& self, Into&& into) {
  at::assert_no_internal_overlap(self);
  at::Tensor mask = empty_mask(self.numel(), self);
  if (self.is_contiguous()) {
    into(self, self, mask);
  } else {
    const at::Tensor x = self.contiguous();
    into(x, x, mask);
    self.copy_(x);
  }
  return mask;
}

}  // namespace memsave
