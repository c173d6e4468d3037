// memsave::rms_norm_linear — RMSNorm followed by one or more Linears that read its output (a Llama block's
// input_layernorm -> q/k/v projections, post_attention_layernorm -> gate/up projections), keeping only the norm's
// input for backward. torch keeps the norm's input and intermediates plus the normalized tensor for the Linears.
//
//   rms_norm_linear(input, norm_weight?, eps, weights[], biases[]) -> outs[]
//       h = rms_norm(input, norm_weight, eps) (promote(input, norm_weight) dtype), then outs[i] = linear(h cast to
//       weights[i]'s dtype, weights[i], biases[i]). h lives only inside the forward.
//   rms_norm_linear_backward(grad_outs[]?, input, norm_weight?, eps, weights[], has_bias[])
//       -> (grad_input, grad_norm_weight, grad_weights[], grad_biases[])
//       Recomputes h and rstd with memsave::rms_norm (deterministic: the forward's values exactly), takes the weight
//       gradients, frees h, then memsave::rms_norm_backward on the sum of the Linears' input gradients (summed in h's
//       dtype). An output without a gradient contributes nothing (its weight and bias gradients are zeros);
//       gradients of absent parameters are empty tensors.
//
// Everything is torch matmuls plus the rms_norm operators (CPU kernels in rms_norm.cpp, CUDA ones in rms_norm.cu),
// called through the dispatcher, so one implementation serves both devices.
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/linear_grads.h"
#include "common/registration.h"
#include "rms_norm/rms_norm.h"

namespace memsave {
namespace {

std::tuple<at::Tensor, at::Tensor> call_rms_norm(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                                                 double eps) {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("memsave::rms_norm", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const c10::optional<at::Tensor>&, double)>();
  return handle.call(input, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> call_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                          const at::Tensor& rstd,
                                                          const c10::optional<at::Tensor>& weight,
                                                          std::array<bool, 2> mask) {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("memsave::rms_norm_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                    const c10::optional<at::Tensor>&, std::array<bool, 2>)>();
  return handle.call(grad_out, input, rstd, weight, mask);
}

// The Linears' weights and biases (or has_bias flags, n_biases of them): one per weight, each a Linear over the
// norm's output. Argument names carry the index: "weights[1]".
void check_linears(const at::Tensor& input, at::TensorList weights, const c10::List<c10::optional<at::Tensor>>* biases,
                   size_t n_biases, const char* op) {
  TORCH_CHECK_VALUE(!weights.empty(), "memsave.", op, ": weights must hold at least one Linear weight");
  TORCH_CHECK_VALUE(n_biases == weights.size(), "memsave.", op, ": biases must have one entry (a tensor or None) per ",
                    "weight, got ", n_biases, " for ", weights.size(), " weights");
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::string w = "weights[" + std::to_string(i) + "]", b = "biases[" + std::to_string(i) + "]";
    const c10::optional<at::Tensor> bias = biases != nullptr ? biases->get(i) : c10::nullopt;
    check_linear_params(weights[i], bias, input.size(-1), input, "input", w.c_str(), b.c_str(), op);
  }
}

// h cast to `dtype`, cast once per dtype (the Linears of one group normally share it).
const at::Tensor& cast_for(const at::Tensor& h, at::ScalarType dtype, at::Tensor& cache) {
  if (h.scalar_type() == dtype) return h;
  if (!cache.defined() || cache.scalar_type() != dtype) cache = h.to(dtype);
  return cache;
}

std::vector<at::Tensor> rms_norm_linear_forward(const at::Tensor& input, const c10::optional<at::Tensor>& norm_weight,
                                                double eps, at::TensorList weights,
                                                const c10::List<c10::optional<at::Tensor>>& biases) {
  constexpr const char* op = "rms_norm_linear";
  rms_shape(input, op);
  check_rms_weight(norm_weight, input, "norm_weight", op);
  check_linears(input, weights, &biases, biases.size(), op);
  // The caller already cast for autocast; the inner ops must not be cast again.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor h = std::get<0>(call_rms_norm(input, norm_weight, eps));
  at::Tensor cast;
  std::vector<at::Tensor> outs;
  outs.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    outs.push_back(at::linear(cast_for(h, weights[i].scalar_type(), cast), weights[i], biases.get(i)));
  }
  return outs;
}

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> rms_norm_linear_backward(
    const c10::List<c10::optional<at::Tensor>>& grad_outs, const at::Tensor& input,
    const c10::optional<at::Tensor>& norm_weight, double eps, at::TensorList weights, const c10::List<bool>& has_bias) {
  constexpr const char* op = "rms_norm_linear_backward";
  const RmsShape s = rms_shape(input, op);
  check_rms_weight(norm_weight, input, "norm_weight", op);
  check_linears(input, weights, nullptr, has_bias.size(), op);
  TORCH_CHECK_VALUE(grad_outs.size() == weights.size(), "memsave.", op, ": grad_outs must have one entry per weight (",
                    weights.size(), "), got ", grad_outs.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const c10::optional<at::Tensor> g = grad_outs.get(i);
    if (!is_defined(g)) continue;
    check_linear_grad_out(*g, ("grad_outs[" + std::to_string(i) + "]").c_str(), input, "input", weights[i], op);
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t in_features = s.cols;
  std::vector<at::Tensor> grad_weights, grad_biases;
  at::Tensor grad_h, rstd;
  {
    // The recomputed normalized tensor lives only for the weight gradients.
    at::Tensor h;
    std::tie(h, rstd) = call_rms_norm(input, norm_weight, eps);
    at::Tensor cast;
    for (size_t i = 0; i < weights.size(); ++i) {
      const at::Tensor& w = weights[i];
      const c10::optional<at::Tensor> g = grad_outs.get(i);
      if (!is_defined(g)) {
        grad_weights.push_back(at::zeros_like(w));
        grad_biases.push_back(has_bias.get(i) ? at::zeros({w.size(0)}, w.options()) : at::empty({0}, w.options()));
        continue;
      }
      const at::Tensor go2 = linear_grad_2d(*g, w);
      grad_weights.push_back(at::mm(go2.t(), cast_for(h, w.scalar_type(), cast).reshape({s.rows, in_features})));
      grad_biases.push_back(has_bias.get(i) ? at::sum(go2, 0) : at::empty({0}, w.options()));
      at::Tensor gh = at::mm(go2, w);
      if (!grad_h.defined()) {
        grad_h = gh.scalar_type() == h.scalar_type() ? gh : gh.to(h.scalar_type());
      } else {
        grad_h.add_(gh);
      }
    }
    if (!grad_h.defined()) grad_h = at::zeros({s.rows, in_features}, h.options());
  }
  auto r =
      call_rms_norm_backward(grad_h.view(input.sizes()), input, rstd, norm_weight, {true, is_defined(norm_weight)});
  return {std::get<0>(r), std::get<1>(r), grad_weights, grad_biases};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  def_cpu_and_cuda(m,
                   "rms_norm_linear(Tensor input, Tensor? norm_weight, float eps, Tensor[] weights, Tensor?[] biases) "
                   "-> Tensor[]",
                   &rms_norm_linear_forward);
  def_cpu_and_cuda(m,
                   "rms_norm_linear_backward(Tensor?[] grad_outs, Tensor input, Tensor? norm_weight, float eps, "
                   "Tensor[] weights, bool[] has_bias) -> (Tensor, Tensor, Tensor[], Tensor[])",
                   &rms_norm_linear_backward);
}

}  // namespace memsave
