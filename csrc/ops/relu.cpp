// memsave::relu — ReLU that saves a 1-bit mask for backward instead of its output.
//   relu(Tensor self) -> (Tensor out, Tensor mask)          mask: uint8[ceil(numel/8)], bit set where out passes grad
//   relu_backward(Tensor grad_out, Tensor mask) -> Tensor   grad_out where the bit is set, else 0
// Semantics match torch.relu / threshold_backward exactly: an element passes its gradient iff !(x <= 0), so NaN
// inputs give NaN outputs and pass their gradient, as in torch.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "bitmask.h"

namespace memsave {
namespace {

// Bytes of mask handled per parallel task: 4096 bytes = 32768 elements.
constexpr int64_t kGrainBytes = 4096;

std::tuple<at::Tensor, at::Tensor> relu_cpu(const at::Tensor& self) {
  check_floating_input(self, "relu");
  const at::Tensor x = self.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  at::Tensor mask = at::empty({packed_mask_bytes(n)}, x.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_relu_cpu", [&] {
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* y = out.mutable_data_ptr<scalar_t>();
    uint8_t* m = mask.mutable_data_ptr<uint8_t>();
    at::parallel_for(0, mask.numel(), kGrainBytes, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t i0 = b * 8;
        const int64_t count = std::min<int64_t>(8, n - i0);
        uint8_t bits = 0;
        for (int64_t j = 0; j < count; ++j) {
          const scalar_t v = in[i0 + j];
          const bool pass = !(static_cast<float>(v) <= 0.f);
          y[i0 + j] = pass ? v : scalar_t(0);
          bits |= static_cast<uint8_t>(pass) << j;
        }
        m[b] = bits;
      }
    });
  });
  return {out, mask};
}

at::Tensor relu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& mask) {
  check_mask_matches(grad_out, mask, "relu_backward");
  const at::Tensor g = grad_out.contiguous();
  const at::Tensor mk = mask.contiguous();
  at::Tensor grad_in = at::empty_like(g);
  const int64_t n = g.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_relu_backward_cpu", [&] {
    const scalar_t* gi = g.const_data_ptr<scalar_t>();
    const uint8_t* m = mk.const_data_ptr<uint8_t>();
    scalar_t* out = grad_in.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, mk.numel(), kGrainBytes, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t i0 = b * 8;
        const int64_t count = std::min<int64_t>(8, n - i0);
        const uint8_t bits = m[b];
        for (int64_t j = 0; j < count; ++j) {
          out[i0 + j] = ((bits >> j) & 1) ? gi[i0 + j] : scalar_t(0);
        }
      }
    });
  });
  return grad_in;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def("relu(Tensor self) -> (Tensor, Tensor)");
  m.def("relu_backward(Tensor grad_out, Tensor mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("relu", &relu_cpu);
  m.impl("relu_backward", &relu_backward_cpu);
}

}  // namespace memsave
