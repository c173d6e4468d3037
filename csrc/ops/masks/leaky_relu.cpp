// memsave::leaky_relu — LeakyReLU that saves a 1-bit sign mask for backward instead of its input.
//   leaky_relu(Tensor self, float negative_slope) -> (Tensor out, Tensor mask)   bit set where self > 0
//   leaky_relu_(Tensor(a!) self, float negative_slope) -> Tensor mask            in place
//   leaky_relu_backward(Tensor grad_out, Tensor mask, float negative_slope) -> Tensor
// Semantics match torch.nn.functional.leaky_relu and its backward exactly: out = x > 0 ? x : x * slope and
// grad_in = x > 0 ? grad : grad * slope, products in the op-math type (float for half/bfloat16). Unlike torch's
// in-place form, any slope works in place (the mask, not the output, decides the backward).
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

struct LeakyReluCpu : LeakyReluOp {
  static void forward_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask, double slope) {
    const int64_t n = x.numel();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_leaky_relu_cpu", [&] {
      using opmath_t = at::opmath_type<scalar_t>;
      const scalar_t* in = x.const_data_ptr<scalar_t>();
      scalar_t* y = out.mutable_data_ptr<scalar_t>();
      uint8_t* m = mask.mutable_data_ptr<uint8_t>();
      const opmath_t s = static_cast<opmath_t>(slope);
      at::parallel_for(0, mask.numel(), cpu::kGrainBytes, [&](int64_t b0, int64_t b1) {
        cpu::forward_with_mask<LeakyReluMask, scalar_t>(in, y, m, n, b0, b1, s);
      });
    });
  }
  static void backward_into(const at::Tensor& g, const at::Tensor& mask, const at::Tensor& grad_in, double slope) {
    cpu::launch_apply_mask<Apply::kLeaky>(g, mask, grad_in, 1.0, slope);
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def("leaky_relu(Tensor self, float negative_slope) -> (Tensor, Tensor)");
  m.def("leaky_relu_(Tensor(a!) self, float negative_slope) -> Tensor");
  m.def("leaky_relu_backward(Tensor grad_out, Tensor mask, float negative_slope) -> Tensor");
  impl_inplace_mask_autograd<LeakyReluOp>(m);
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  impl_mask_kernels<LeakyReluCpu>(m);
}

}  // namespace memsave
