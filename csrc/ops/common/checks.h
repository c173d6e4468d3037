// Host-side argument checks shared by every memsave operator's CPU and CUDA kernels: each tensor argument is dense
// (strided layout), on the device of the operator's reference tensor (its input), and of a dtype it can use. Every
// message names the operator and the argument; device mismatches are worded as torch words them. The shape checks
// specific to one family stay in that family's header.
//
// (A meta tensor among real ones never reaches these kernels: the dispatcher sends the call to the fake kernel,
// whose Python wrapper, library/autograd.py's check_devices, makes the same device check.)
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

namespace memsave {

inline bool is_defined(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined();
}

// `t` (argument `name`) is a strided tensor on the device of `ref` (argument `ref_name`).
inline void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                              const char* op) {
  TORCH_CHECK(t.layout() == at::kStrided, "memsave.", op, ": ", name, " must be a dense (strided) tensor, got layout ",
              t.layout());
  TORCH_CHECK(t.device() == ref.device(), "memsave.", op, ": expected all tensors to be on the same device, but ", name,
              " is on ", t.device(), " and ", ref_name, " is on ", ref.device(), "; move them to one device");
}

inline void check_floating(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), "memsave.", op, ": expected ", name,
              " to be floating-point (float32, float64, float16 or bfloat16), got ", t.scalar_type());
}

inline void check_dtype(const at::Tensor& t, at::ScalarType dtype, const char* name, const char* op) {
  TORCH_CHECK(t.scalar_type() == dtype, "memsave.", op, ": expected ", name, " to be ", dtype, ", got ",
              t.scalar_type());
}

// A floating-point tensor argument on `ref`'s device (an absent optional one passes).
inline void check_float_arg(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                            const char* op) {
  check_same_device(t, name, ref, ref_name, op);
  check_floating(t, name, op);
}

inline void check_float_arg(const c10::optional<at::Tensor>& t, const char* name, const at::Tensor& ref,
                            const char* ref_name, const char* op) {
  if (is_defined(t)) check_float_arg(*t, name, ref, ref_name, op);
}

// The Linear of a fused "... -> Linear" operator: weight [out_features, in_features] and bias [out_features] (or
// none), floating-point, on `ref`'s device, bias in weight's dtype (the matmul runs in weight's dtype).
inline void check_linear_params(const at::Tensor& weight, const c10::optional<at::Tensor>& bias, int64_t in_features,
                                const at::Tensor& ref, const char* ref_name, const char* weight_name,
                                const char* bias_name, const char* op) {
  check_float_arg(weight, weight_name, ref, ref_name, op);
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == in_features, "memsave.", op, ": ", weight_name,
                    " must have shape [out_features, ", in_features, "] (in_features = the last dimension of ",
                    ref_name, "), got ", weight.sizes());
  if (!is_defined(bias)) return;
  check_float_arg(*bias, bias_name, ref, ref_name, op);
  TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "memsave.", op, ": ", bias_name,
                    " must have shape [", weight.size(0), "], got ", bias->sizes());
  check_dtype(*bias, weight.scalar_type(), bias_name, op);
}

// grad_out of a fused "... -> Linear" backward: floating, on `ref`'s device, shaped like the output linear(ref-like
// [..., in_features], weight) -> [..., out_features].
inline void check_linear_grad_out(const at::Tensor& grad_out, const char* name, const at::Tensor& ref,
                                  const char* ref_name, const at::Tensor& weight, const char* op) {
  check_float_arg(grad_out, name, ref, ref_name, op);
  // The leading sizes are compared directly: with a zero-width output or input, counting rows as numel / width
  // would say 0 rows.
  const int64_t out_features = weight.size(0);
  TORCH_CHECK_VALUE(grad_out.dim() == ref.dim() && grad_out.size(-1) == out_features &&
                        grad_out.sizes().slice(0, grad_out.dim() - 1).equals(ref.sizes().slice(0, ref.dim() - 1)),
                    "memsave.", op, ": ", name, " has shape ", grad_out.sizes(),
                    ", which does not match the output of ", ref_name, " of shape ", ref.sizes(),
                    " and a weight of shape ", weight.sizes());
}

}  // namespace memsave
