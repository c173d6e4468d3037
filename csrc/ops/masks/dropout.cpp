// memsave::dropout — Dropout that saves a 1-bit keep mask for backward (torch keeps a byte or more per element).
//   dropout(Tensor self, float p) -> (Tensor out, Tensor mask)   out = kept ? self * scale : 0
//   dropout_(Tensor(a!) self, float p) -> Tensor mask            in place
//   dropout_backward(Tensor grad_out, Tensor mask, float p) -> Tensor
// Each element is kept with probability 1 - p (up to 2^-32) and scaled by 1 / (1 - p) as torch computes it
// (dropout_common.h). The bits come from Philox4x32-10 (philox.h) keyed by PyTorch's generator of the device:
// on CPU one 64-bit draw from the default CPU generator per call, on CUDA a (seed, offset) reservation from the
// default CUDA generator. So torch.manual_seed reproduces a mask, torch.get_rng_state / set_rng_state (and
// therefore checkpoint recompute) replay it, and the bits never depend on the number of threads.
// p == 0 keeps everything and p == 1 drops everything without drawing (as torch, which draws nothing there either).
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "masks/bitmask.h"
#include "masks/dropout_common.h"
#include "masks/inplace_autograd.h"
#include "masks/mask_cpu.h"
#include "masks/philox.h"

namespace memsave {
namespace {

struct DropoutCpu : DropoutOp {
  static void forward_into(const at::Tensor& x, const at::Tensor& out, const at::Tensor& mask, double p) {
    const int64_t n = x.numel();
    if (n == 0) {
      return;
    }
    const uint64_t threshold = philox::keep_threshold(p);
    uint64_t seed = 0;
    if (threshold != 0 && threshold < (uint64_t{1} << 32)) {
      auto* gen =
          at::get_generator_or_default<at::CPUGeneratorImpl>(std::nullopt, at::detail::getDefaultCPUGenerator());
      std::lock_guard<std::mutex> lock(gen->mutex_);
      seed = gen->random64();
    }
    const double scale = dropout_scale(x.scalar_type(), p);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_dropout_cpu", [&] {
      using opmath_t = at::opmath_type<scalar_t>;
      const scalar_t* in = x.const_data_ptr<scalar_t>();
      scalar_t* y = out.mutable_data_ptr<scalar_t>();
      uint8_t* m = mask.mutable_data_ptr<uint8_t>();
      const opmath_t a = static_cast<opmath_t>(scale);
      at::parallel_for(0, mask.numel(), cpu::kGrainBytes, [&](int64_t b0, int64_t b1) {
        cpu::dropout_mask(m, n, b0, b1, threshold, seed);
        cpu::apply_mask<Apply::kPassScaled, scalar_t>(in, m, y, n, b0, b1, a, opmath_t(0));
      });
    });
  }

  static void backward_into(const at::Tensor& g, const at::Tensor& mask, const at::Tensor& grad_in, double p) {
    cpu::launch_apply_mask<Apply::kPassScaled>(g, mask, grad_in, dropout_scale(g.scalar_type(), p), 0.0);
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  // nondeterministic_seeded: compilers must neither deduplicate calls nor recompute one in backward.
  m.def("dropout(Tensor self, float p) -> (Tensor, Tensor)", {at::Tag::nondeterministic_seeded});
  m.def("dropout_(Tensor(a!) self, float p) -> Tensor", {at::Tag::nondeterministic_seeded});
  m.def("dropout_backward(Tensor grad_out, Tensor mask, float p) -> Tensor");
  impl_inplace_mask_autograd<DropoutOp>(m);
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  impl_mask_kernels<DropoutCpu>(m);
}

}  // namespace memsave
