// memsave::gated_act — the gated linear unit act(gate) * up of a gated MLP (SwiGLU: silu, GeGLU: gelu), keeping
// gate and up for backward. torch's composition keeps gate, act(gate) and up (three tensors of the MLP width).
//
//   gated_act(gate, up, act) -> act(gate) * up, in gate's dtype
//   gated_act_backward(grad, gate, up, act) -> (grad_gate, grad_up)
//
// CPU loops here, CUDA kernels in gated_act.cu; both run gated_act_math.h per element, under the host side
// in gated_act.h.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "gated_mlp/gated_act.h"
#include "gated_mlp/gated_act_math.h"

namespace memsave {
namespace {

constexpr int64_t kGrain = 32768;

struct GatedActCpu {
  template <Act A, typename scalar_t>
  static void forward(const scalar_t* gate, const scalar_t* up, int64_t n, scalar_t* out) {
    using T = at::opmath_type<scalar_t>;
    at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        out[i] = static_cast<scalar_t>(gated_act_forward<A, T>(static_cast<T>(gate[i]), static_cast<T>(up[i])));
      }
    });
  }

  template <Act A, typename scalar_t>
  static void backward(const scalar_t* grad, const scalar_t* gate, const scalar_t* up, int64_t n, scalar_t* grad_gate,
                       scalar_t* grad_up) {
    using T = at::opmath_type<scalar_t>;
    at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        T dg, du;
        gated_act_grads<A, T>(static_cast<T>(grad[i]), static_cast<T>(gate[i]), static_cast<T>(up[i]), dg, du);
        grad_gate[i] = static_cast<scalar_t>(dg);
        grad_up[i] = static_cast<scalar_t>(du);
      }
    });
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def("gated_act(Tensor gate, Tensor up, str act) -> Tensor");
  m.def("gated_act_backward(Tensor grad, Tensor gate, Tensor up, str act) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("gated_act", &gated_act_impl<GatedActCpu>);
  m.impl("gated_act_backward", &gated_act_backward_impl<GatedActCpu>);
}

}  // namespace memsave
