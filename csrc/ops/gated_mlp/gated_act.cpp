// memsave::gated_act — the gated linear unit act(gate) * up of a gated MLP (SwiGLU: silu, GeGLU: gelu), keeping
// gate and up for backward. torch's composition keeps gate, act(gate) and up (three tensors of the MLP width).
//
//   gated_act(gate, up, act) -> act(gate) * up, in gate's dtype
//   gated_act_backward(grad, gate, up, act) -> (grad_gate, grad_up)
//
// CPU kernels here, CUDA kernels in gated_act.cu; both run gated_act_math.h per element.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "gated_mlp/gated_act.h"
#include "gated_mlp/gated_act_math.h"

namespace memsave {
namespace {

constexpr int64_t kGrain = 32768;

at::Tensor gated_act_cpu(const at::Tensor& gate, const at::Tensor& up, c10::string_view act) {
  const Act a = parse_gated_act(act, "gated_act");
  check_gate_up(gate, up, "gated_act");
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_gated_act_cpu", [&] {
    using T = at::opmath_type<scalar_t>;
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* upp = u.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    with_gated_act(a, [&](auto act_c) {
      constexpr Act A = decltype(act_c)::value;
      at::parallel_for(0, g.numel(), kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          op[i] = static_cast<scalar_t>(gated_act_forward<A, T>(static_cast<T>(gp[i]), static_cast<T>(upp[i])));
        }
      });
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gated_act_backward_cpu(const at::Tensor& grad, const at::Tensor& gate,
                                                          const at::Tensor& up, c10::string_view act) {
  const Act a = parse_gated_act(act, "gated_act_backward");
  check_gate_up(gate, up, "gated_act_backward");
  check_gated_grad(grad, gate, "gated_act_backward");
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  const at::Tensor gr = grad.to(gate.scalar_type()).contiguous();
  at::Tensor grad_gate = at::empty(gate.sizes(), gate.options());
  at::Tensor grad_up = at::empty(gate.sizes(), gate.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "memsave_gated_act_backward_cpu", [&] {
    using T = at::opmath_type<scalar_t>;
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* upp = u.const_data_ptr<scalar_t>();
    const scalar_t* grp = gr.const_data_ptr<scalar_t>();
    scalar_t* ggp = grad_gate.mutable_data_ptr<scalar_t>();
    scalar_t* gup = grad_up.mutable_data_ptr<scalar_t>();
    with_gated_act(a, [&](auto act_c) {
      constexpr Act A = decltype(act_c)::value;
      at::parallel_for(0, g.numel(), kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          T dg, du;
          gated_act_grads<A, T>(static_cast<T>(grp[i]), static_cast<T>(gp[i]), static_cast<T>(upp[i]), dg, du);
          ggp[i] = static_cast<scalar_t>(dg);
          gup[i] = static_cast<scalar_t>(du);
        }
      });
    });
  });
  return {grad_gate, grad_up};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def("gated_act(Tensor gate, Tensor up, str act) -> Tensor");
  m.def("gated_act_backward(Tensor grad, Tensor gate, Tensor up, str act) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("gated_act", &gated_act_cpu);
  m.impl("gated_act_backward", &gated_act_backward_cpu);
}

}  // namespace memsave
