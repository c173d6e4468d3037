// Autograd of the in-place mask-saving operators (relu_, leaky_relu_, dropout_): schema `op_(Tensor(a!) self, ...)
// -> Tensor mask`. It overwrites `self` with the result, bumps its version counter, marks it dirty so autograd
// re-bases its history onto this node (exactly as torch's own in-place ops do), and saves only the mask.
//
// Registered in C++ at the Autograd key because torch.library.register_autograd accepts functional schemas only.
// The Function returns `self` alone (autograd allows a single output when the dirty input is a view, e.g. a slice);
// the mask leaves through `mask_out`, as a plain tensor that is not part of the graph.
// Calls that never reach the Autograd key (inference mode on a normal tensor) still bump `self`'s version through
// inplace_mask_adinplace, registered at ADInplaceOrView. (torch's generic fallback for that key bumps only returns
// annotated `Tensor(a!)`, and these operators return the mask.)
#pragma once

#include <string>
#include <vector>

#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace memsave {

// Spec provides, for one operator with one float argument (ignored by operators without one):
//   static at::Tensor run(at::Tensor& self, double scalar);      the in-place operator, called below autograd
//   static at::Tensor backward(const at::Tensor& grad, const at::Tensor& mask, double scalar);
template <class Spec>
struct InplaceMaskFunction : public torch::autograd::Function<InplaceMaskFunction<Spec>> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor self, double scalar,
                                                at::Tensor* mask_out) {
    at::Tensor mask;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      mask = Spec::run(self, scalar);
    }
    ctx->mark_dirty({self});  // autograd bumps the version of dirty inputs
    ctx->save_for_backward({mask});
    ctx->saved_data["scalar"] = scalar;
    // The mask follows the memory order the kernel walked: self's, or a dense copy's in self's order.
    ctx->saved_data["strides"] = self.is_non_overlapping_and_dense()
                                     ? self.strides().vec()
                                     : at::infer_dense_strides(self.sizes(), self.strides());
    *mask_out = mask;
    return {self};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    const double scalar = ctx->saved_data["scalar"].toDouble();
    const std::vector<int64_t> strides = ctx->saved_data["strides"].toIntVector();
    at::Tensor grad = grads[0];
    if (grad.strides() != c10::IntArrayRef(strides)) {
      grad = at::empty_strided(grad.sizes(), strides, grad.options()).copy_(grad);
    }
    return {Spec::backward(grad, mask, scalar), at::Tensor(), at::Tensor()};
  }
};

// The Autograd-key kernel: returns the mask; `self` now holds the result and carries its new history.
template <class Spec>
at::Tensor inplace_mask_autograd(at::Tensor& self, double scalar) {
  at::Tensor mask;
  InplaceMaskFunction<Spec>::apply(self, scalar, &mask);
  return mask;
}

// The ADInplaceOrView-key kernel: run the operator below this key, then bump `self`'s version counter.
template <class Spec>
at::Tensor inplace_mask_adinplace(at::Tensor& self, double scalar) {
  at::Tensor mask;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    mask = Spec::run(self, scalar);
  }
  torch::autograd::increment_version(self);
  return mask;
}

// The Spec of an operator with one float argument (leaky_relu, dropout), from Op::kNames (as impl_mask_kernels takes
// them): calls `memsave::<name>_` and `memsave::<name>_backward` through the dispatcher.
template <class Op>
struct ScalarMaskSpec {
  static at::Tensor run(at::Tensor& self, double scalar) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow((std::string("memsave::") + Op::kNames[1]).c_str(), "")
                               .template typed<at::Tensor(at::Tensor&, double)>();
    return op.call(self, scalar);
  }
  static at::Tensor backward(const at::Tensor& grad, const at::Tensor& mask, double scalar) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow((std::string("memsave::") + Op::kNames[2]).c_str(), "")
                               .template typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
    return op.call(grad, mask, scalar);
  }
};

// Registers the ADInplaceOrView and Autograd kernels of Op's in-place operator (called from the family's
// TORCH_LIBRARY_FRAGMENT).
template <class Op>
void impl_inplace_mask_autograd(torch::Library& m) {
  m.impl(Op::kNames[1], c10::DispatchKey::ADInplaceOrView, &inplace_mask_adinplace<ScalarMaskSpec<Op>>);
  m.impl(Op::kNames[1], c10::DispatchKey::Autograd, &inplace_mask_autograd<ScalarMaskSpec<Op>>);
}

}  // namespace memsave
