// memsave::layer_norm_linear — LayerNorm followed by Linear, keeping the LayerNorm input and its per-row mean/rstd
// for backward instead of the normalized tensor (torch keeps both: LayerNorm its input, Linear the normalized one).
//
//   layer_norm_linear(input, normalized_shape, ln_weight?, ln_bias?, eps, weight, bias?) -> (out, mean, rstd)
//       out = linear(layer_norm(input), weight, bias). The norm runs in promote(input, ln_weight) (float32 under
//       autocast, as torch's autocast runs layer_norm), its result is cast to weight's dtype for the matmul.
//       mean/rstd: float (double for double) with the shape torch's layer norm gives them.
//   layer_norm_linear_backward(grad_out, input, normalized_shape, mean, rstd, ln_weight?, ln_bias?, weight,
//                              has_bias) -> (grad_input, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias)
//       Recomputes the normalized tensor with layer_norm_apply (one pass), then the two matmuls and torch's
//       layer-norm backward. Gradients of absent parameters are empty tensors.
//   layer_norm_apply(input, normalized_shape, mean, rstd, weight?, bias?, dtype?) -> Tensor
//       (input - mean) * rstd * weight + bias per row, written in `dtype` (default: input's): the recompute kernel
//       (CPU here, CUDA in layer_norm_linear.cu; each in the arithmetic order of torch's layer norm on that device,
//       see layer_norm_math.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "common/linear_grads.h"
#include "common/registration.h"
#include "linear/layer_norm_linear.h"
#include "linear/layer_norm_math.h"

namespace memsave {
namespace {

// The dtype the norm runs in: the input's, promoted with the norm weight's (a float32 weight lifts a half input,
// which is what autocast does to layer_norm on CUDA).
at::ScalarType ln_compute_dtype(const at::Tensor& input, const c10::optional<at::Tensor>& ln_weight) {
  return is_defined(ln_weight) ? c10::promoteTypes(input.scalar_type(), ln_weight->scalar_type()) : input.scalar_type();
}

at::ScalarType ln_stat_dtype(at::ScalarType compute) {
  return compute == at::kDouble ? at::kDouble : at::kFloat;
}

// torch's layer norm keeps statistics in the input dtype on CPU and in the accumulation type on CUDA.
at::ScalarType native_ln_stat_dtype(const at::Tensor& x) {
  if (x.is_cuda() && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16)) return at::kFloat;
  return x.scalar_type();
}

c10::optional<at::Tensor> cast_opt(const c10::optional<at::Tensor>& t, at::ScalarType dt) {
  if (!is_defined(t)) return c10::nullopt;
  return t->to(dt);
}

at::Tensor layer_norm_apply_cpu(const at::Tensor& input, c10::IntArrayRef normalized_shape, const at::Tensor& mean,
                                const at::Tensor& rstd, const c10::optional<at::Tensor>& weight,
                                const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> dtype) {
  const LnShape s = check_layer_norm_apply_args(input, normalized_shape, mean, rstd, weight, bias);
  const at::Tensor x = input.contiguous();
  // Element math in float (double for double inputs); absent affine parameters become 1 / 0.
  const at::ScalarType mt = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto opts = x.options().dtype(mt);
  const at::Tensor m = mean.to(mt).contiguous();
  const at::Tensor r = rstd.to(mt).contiguous();
  const at::Tensor w = is_defined(weight) ? weight->to(mt).contiguous().view({-1}) : at::ones({s.cols}, opts);
  const at::Tensor b = is_defined(bias) ? bias->to(mt).contiguous().view({-1}) : at::zeros({s.cols}, opts);
  at::Tensor out = at::empty(input.sizes(), input.options().dtype(dtype.value_or(input.scalar_type())));
  const int64_t cols = s.cols;
  AT_DISPATCH_FLOATING_TYPES(mt, "memsave_layer_norm_apply_cpu_math", [&] {
    using T = scalar_t;
    const T* mp = m.const_data_ptr<T>();
    const T* rp = r.const_data_ptr<T>();
    const T* wp = w.const_data_ptr<T>();
    const T* bp = b.const_data_ptr<T>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_layer_norm_apply_cpu", [&] {
      using in_t = scalar_t;
      const in_t* xp = x.const_data_ptr<in_t>();
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "memsave_layer_norm_apply_out", [&] {
        scalar_t* yp = out.mutable_data_ptr<scalar_t>();
        const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
        at::parallel_for(0, s.rows, grain, [&](int64_t r0, int64_t r1) {
          for (int64_t row = r0; row < r1; ++row) {
            const T scale = rp[row];
            const T shift = -mp[row] * scale;
            const in_t* xr = xp + row * cols;
            scalar_t* yr = yp + row * cols;
            for (int64_t j = 0; j < cols; ++j) {
              yr[j] = static_cast<scalar_t>(layer_norm_affine_cpu(static_cast<T>(xr[j]), scale, shift, wp[j], bp[j]));
            }
          }
        });
      });
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_linear_forward(const at::Tensor& input,
                                                                         c10::IntArrayRef normalized_shape,
                                                                         const c10::optional<at::Tensor>& ln_weight,
                                                                         const c10::optional<at::Tensor>& ln_bias,
                                                                         double eps, const at::Tensor& weight,
                                                                         const c10::optional<at::Tensor>& bias) {
  constexpr const char* op = "layer_norm_linear";
  ln_shape(input, normalized_shape, op);
  check_ln_param(ln_weight, normalized_shape, input, "ln_weight", op);
  check_ln_param(ln_bias, normalized_shape, input, "ln_bias", op);
  check_linear_params(weight, bias, input.size(-1), input, "input", "weight", "bias", op);
  // The caller already cast for autocast; the inner ops must not be cast again.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::ScalarType cdt = ln_compute_dtype(input, ln_weight);
  const at::Tensor x = input.to(cdt);
  auto r = at::native_layer_norm(x, normalized_shape, cast_opt(ln_weight, cdt), cast_opt(ln_bias, cdt), eps);
  at::Tensor out = at::linear(std::get<0>(r).to(weight.scalar_type()), weight, bias);
  const at::ScalarType sd = ln_stat_dtype(cdt);
  return {out, std::get<1>(r).to(sd, false, true), std::get<2>(r).to(sd, false, true)};
}

at::Tensor call_layer_norm_apply(const at::Tensor& input, c10::IntArrayRef normalized_shape, const at::Tensor& mean,
                                 const at::Tensor& rstd, const c10::optional<at::Tensor>& weight,
                                 const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> dtype) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("memsave::layer_norm_apply", "")
                                 .typed<at::Tensor(const at::Tensor&, c10::IntArrayRef, const at::Tensor&,
                                                   const at::Tensor&, const c10::optional<at::Tensor>&,
                                                   const c10::optional<at::Tensor>&, c10::optional<at::ScalarType>)>();
  return handle.call(input, normalized_shape, mean, rstd, weight, bias, dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> layer_norm_linear_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const c10::optional<at::Tensor>& ln_weight, const c10::optional<at::Tensor>& ln_bias,
    const at::Tensor& weight, bool has_bias) {
  constexpr const char* op = "layer_norm_linear_backward";
  const LnShape s = ln_shape(input, normalized_shape, op);
  check_ln_param(ln_weight, normalized_shape, input, "ln_weight", op);
  check_ln_param(ln_bias, normalized_shape, input, "ln_bias", op);
  check_ln_stats(mean, rstd, input, s.rows, op);
  check_linear_params(weight, c10::nullopt, input.size(-1), input, "input", "weight", "bias", op);
  check_linear_grad_out(grad_out, "grad_out", input, "input", weight, op);
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);

  const at::ScalarType cdt = ln_compute_dtype(input, ln_weight);
  const at::Tensor x = input.to(cdt);
  const c10::optional<at::Tensor> lw = cast_opt(ln_weight, cdt), lb = cast_opt(ln_bias, cdt);
  const at::Tensor go2 = linear_grad_2d(grad_out, weight);

  auto [grad_weight, grad_bias] = linear_param_grads(
      go2, call_layer_norm_apply(x, normalized_shape, mean, rstd, lw, lb, weight.scalar_type()), weight, has_bias);
  const at::Tensor grad_n = at::mm(go2, weight).reshape(input.sizes()).to(cdt);

  const at::ScalarType nsd = native_ln_stat_dtype(x);
  auto r = at::native_layer_norm_backward(grad_n, x, normalized_shape, mean.to(nsd), rstd.to(nsd), lw, lb,
                                          {true, is_defined(lw), is_defined(lb)});
  at::Tensor grad_input = std::get<0>(r).to(input.scalar_type());
  at::Tensor grad_lw =
      is_defined(ln_weight) ? std::get<1>(r).to(ln_weight->scalar_type()) : at::empty({0}, input.options());
  at::Tensor grad_lb =
      is_defined(ln_bias) ? std::get<2>(r).to(ln_bias->scalar_type()) : at::empty({0}, input.options());
  return {grad_input, grad_lw, grad_lb, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  // Torch ops plus layer_norm_apply (whose CUDA kernel is in layer_norm_linear.cu).
  def_cpu_and_cuda(m,
                   "layer_norm_linear(Tensor input, int[] normalized_shape, Tensor? ln_weight, Tensor? ln_bias, "
                   "float eps, Tensor weight, Tensor? bias) -> (Tensor, Tensor, Tensor)",
                   &layer_norm_linear_forward);
  def_cpu_and_cuda(m,
                   "layer_norm_linear_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, "
                   "Tensor rstd, Tensor? ln_weight, Tensor? ln_bias, Tensor weight, bool has_bias) "
                   "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
                   &layer_norm_linear_backward);
  m.def(
      "layer_norm_apply(Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, "
      "Tensor? bias, ScalarType? dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("layer_norm_apply", &layer_norm_apply_cpu);
}

}  // namespace memsave
