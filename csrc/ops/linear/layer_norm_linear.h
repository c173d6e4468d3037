// Shared by layer_norm_linear.cpp and layer_norm_linear.cu: the argument checks of layer_norm_apply.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include "common/checks.h"

namespace memsave {

// Rows (product of the leading dims) and columns (product of normalized_shape) of a layer-norm input.
struct LnShape {
  int64_t rows;
  int64_t cols;
};

inline LnShape ln_shape(const at::Tensor& x, c10::IntArrayRef normalized_shape, const char* op) {
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK_VALUE(nd >= 1, "memsave.", op, ": normalized_shape must have at least one dimension");
  TORCH_CHECK_VALUE(x.dim() >= nd && x.sizes().slice(x.dim() - nd).equals(normalized_shape), "memsave.", op,
                    ": normalized_shape ", normalized_shape,
                    " must equal the trailing dimensions of the input, got "
                    "input of shape ",
                    x.sizes());
  check_floating(x, "input", op);
  LnShape s{1, 1};
  for (int64_t d = 0; d < x.dim(); ++d) (d < x.dim() - nd ? s.rows : s.cols) *= x.size(d);
  return s;
}

inline void check_ln_param(const c10::optional<at::Tensor>& t, c10::IntArrayRef normalized_shape, const at::Tensor& x,
                           const char* what, const char* op) {
  if (!is_defined(t)) return;
  check_float_arg(*t, what, x, "input", op);
  TORCH_CHECK_VALUE(t->sizes().equals(normalized_shape), "memsave.", op, ": ", what, " must have shape ",
                    normalized_shape, ", got ", t->sizes());
}

inline void check_ln_stats(const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& x, int64_t rows,
                           const char* op) {
  check_float_arg(mean, "mean", x, "input", op);
  check_float_arg(rstd, "rstd", x, "input", op);
  TORCH_CHECK_VALUE(mean.numel() == rows && rstd.numel() == rows, "memsave.", op, ": mean and rstd must hold one ",
                    "value per normalized row (", rows, "), got ", mean.numel(), " and ", rstd.numel());
}

// Checks the arguments of layer_norm_apply (CPU and CUDA) and returns the input's row layout.
inline LnShape check_layer_norm_apply_args(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                                           const at::Tensor& mean, const at::Tensor& rstd,
                                           const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias) {
  constexpr const char* op = "layer_norm_apply";
  const LnShape s = ln_shape(input, normalized_shape, op);
  check_ln_param(weight, normalized_shape, input, "weight", op);
  check_ln_param(bias, normalized_shape, input, "bias", op);
  check_ln_stats(mean, rstd, input, s.rows, op);
  return s;
}

}  // namespace memsave
