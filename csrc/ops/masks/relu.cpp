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

// out may alias in (the in-place form).
void relu_cpu_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask) {
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_relu_cpu", [&] {
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* y = out.mutable_data_ptr<scalar_t>();
    uint8_t* m = mask.mutable_data_ptr<uint8_t>();
    at::parallel_for(0, mask.numel(), cpu::kGrainBytes,
                     [&](int64_t b0, int64_t b1) { cpu::relu_forward<scalar_t>(in, y, m, n, b0, b1); });
  });
}

std::tuple<at::Tensor, at::Tensor> relu_cpu(const at::Tensor& self) {
  check_floating_input(self, "relu");
  return mask_forward(self, relu_cpu_into);
}

at::Tensor relu_inplace_cpu(at::Tensor& self) {
  check_floating_input(self, "relu_");
  return mask_forward_(self, relu_cpu_into);
}

at::Tensor relu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& mask) {
  check_mask_matches(grad_out, mask, "relu_backward");
  const at::Tensor g = grad_out.contiguous();
  const at::Tensor mk = mask.contiguous();
  at::Tensor grad_in = at::empty_like(g);
  const int64_t n = g.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_relu_backward_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* gi = g.const_data_ptr<scalar_t>();
    const uint8_t* m = mk.const_data_ptr<uint8_t>();
    scalar_t* out = grad_in.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, mk.numel(), cpu::kGrainBytes, [&](int64_t b0, int64_t b1) {
      cpu::apply_mask<Apply::kPass, scalar_t>(gi, m, out, n, b0, b1, opmath_t(1), opmath_t(0));
    });
  });
  return grad_in;
}

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

at::Tensor relu_inplace_autograd(at::Tensor& self) {
  return inplace_mask_autograd<ReluSpec>(self, 0.0);
}
at::Tensor relu_inplace_adinplace(at::Tensor& self) {
  return inplace_mask_adinplace<ReluSpec>(self, 0.0);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def("relu(Tensor self) -> (Tensor, Tensor)");
  m.def("relu_(Tensor(a!) self) -> Tensor");
  m.def("relu_backward(Tensor grad_out, Tensor mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("relu", &relu_cpu);
  m.impl("relu_", &relu_inplace_cpu);
  m.impl("relu_backward", &relu_backward_cpu);
}

TORCH_LIBRARY_IMPL(memsave, ADInplaceOrView, m) {
  m.impl("relu_", &relu_inplace_adinplace);
}

TORCH_LIBRARY_IMPL(memsave, Autograd, m) {
  m.impl("relu_", &relu_inplace_autograd);
}

}  // namespace memsave
