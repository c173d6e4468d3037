// memsave::relu — ReLU that saves a 1-bit mask for backward instead of its output.
//   relu(Tensor self) -> (Tensor out, Tensor mask)          mask: uint8[ceil(numel/8)], bit set where out passes grad
//   relu_(Tensor(a!) self) -> Tensor mask                   in place: self becomes relu(self)
//   relu_backward(Tensor grad_out, Tensor mask) -> Tensor   grad_out where the bit is set, else 0
// Semantics match torch.relu / threshold_backward exactly: out = (x < 0 ? 0 : x), so -0.0 and NaN pass through
// unchanged; an element passes its gradient iff !(x <= 0), so NaN passes it and -0.0 does not.
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "masks/bitmask.h"
#include "masks/inplace_autograd.h"
#include "masks/mask_cpu.h"

namespace memsave {
namespace {

struct ReluCpu : NoScalar {
  // out may alias x (the in-place form).
  static void forward_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask, double /*unused*/) {
    const int64_t n = x.numel();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_relu_cpu", [&] {
      const scalar_t* in = x.const_data_ptr<scalar_t>();
      scalar_t* y = out.mutable_data_ptr<scalar_t>();
      uint8_t* m = mask.mutable_data_ptr<uint8_t>();
      at::parallel_for(0, mask.numel(), cpu::kGrainBytes, [&](int64_t b0, int64_t b1) {
        cpu::forward_with_mask<ReluMask, scalar_t>(in, y, m, n, b0, b1, 0);
      });
    });
  }
  static void backward_into(const at::Tensor& g, const at::Tensor& mask, const at::Tensor& grad_in, double) {
    cpu::launch_apply_mask<Apply::kPass>(g, mask, grad_in, 1.0, 0.0);
  }
};

// Autograd of relu_ (C++: register_autograd takes functional schemas only).
struct ReluSpec {
  static at::Tensor run(at::Tensor& self, double /*unused*/) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("memsave::relu_", "").typed<at::Tensor(at::Tensor&)>();
    return op.call(self);
  }
  static at::Tensor backward(const at::Tensor& grad, const at::Tensor& mask, double /*unused*/) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("memsave::relu_backward", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
    return op.call(grad, mask);
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def("relu(Tensor self) -> (Tensor, Tensor)");
  m.def("relu_(Tensor(a!) self) -> Tensor");
  m.def("relu_backward(Tensor grad_out, Tensor mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("relu", [](const at::Tensor& self) { return mask_forward<ReluCpu>(self, 0.0, "relu"); });
  m.impl("relu_", [](at::Tensor& self) { return mask_forward_<ReluCpu>(self, 0.0, "relu_"); });
  m.impl("relu_backward", [](const at::Tensor& grad_out, const at::Tensor& mask) {
    return mask_backward<ReluCpu>(grad_out, mask, 0.0, "relu_backward");
  });
}

TORCH_LIBRARY_IMPL(memsave, ADInplaceOrView, m) {
  m.impl("relu_", [](at::Tensor& self) { return inplace_mask_adinplace<ReluSpec>(self, 0.0); });
}

TORCH_LIBRARY_IMPL(memsave, Autograd, m) {
  m.impl("relu_", [](at::Tensor& self) { return inplace_mask_autograd<ReluSpec>(self, 0.0); });
}

}  // namespace memsave
