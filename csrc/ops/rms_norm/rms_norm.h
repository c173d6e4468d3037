// Shared by rms_norm.cpp, rms_norm.cu and rms_norm_linear.cpp: the row layout of an RMSNorm input, the argument
// checks (every message names the argument and the operator), and the dtypes of the results.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

namespace memsave {

// Rows (product of the leading dims) and columns (the last dim, the one normalized) of an RMSNorm input.
struct RmsShape {
  int64_t rows;
  int64_t cols;
};

inline bool rms_defined(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined();
}

inline RmsShape rms_shape(const at::Tensor& input, const char* op) {
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), "memsave.", op,
              ": expected a floating-point input (float32, float64, float16 or bfloat16), got ", input.scalar_type());
  TORCH_CHECK_VALUE(input.dim() >= 1, "memsave.", op, ": input must have at least one dimension (the one normalized)");
  const int64_t cols = input.size(-1);
  return {cols == 0 ? 0 : input.numel() / cols, cols};
}

// The norm's weight: [cols], floating, on the input's device.
inline void check_rms_weight(const c10::optional<at::Tensor>& weight, const at::Tensor& input, const char* name,
                             const char* op) {
  if (!rms_defined(weight)) return;
  TORCH_CHECK_VALUE(weight->dim() == 1 && weight->size(0) == input.size(-1), "memsave.", op, ": ", name,
                    " must have shape [", input.size(-1), "] (the input's last dimension), got ", weight->sizes());
  TORCH_CHECK(at::isFloatingType(weight->scalar_type()), "memsave.", op, ": ", name, " must be floating-point, got ",
              weight->scalar_type());
  TORCH_CHECK(weight->device() == input.device(), "memsave.", op, ": ", name, " is on ", weight->device(),
              " but the input is on ", input.device());
}

// The dtype the per-row statistic and the element math use: float (double for double inputs).
inline at::ScalarType rms_acc_dtype(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// HF's `weight * hidden.to(input_dtype)`: the output has promote(input dtype, weight dtype).
inline at::ScalarType rms_out_dtype(const at::Tensor& input, const c10::optional<at::Tensor>& weight) {
  return rms_defined(weight) ? c10::promoteTypes(input.scalar_type(), weight->scalar_type()) : input.scalar_type();
}

inline void check_rms_rstd(const at::Tensor& rstd, const at::Tensor& input, int64_t rows, const char* op) {
  TORCH_CHECK_VALUE(rstd.numel() == rows, "memsave.", op, ": rstd must hold one value per normalized row (", rows,
                    "), got ", rstd.numel());
  TORCH_CHECK(rstd.scalar_type() == rms_acc_dtype(input), "memsave.", op, ": rstd must be ", rms_acc_dtype(input),
              " for a ", input.scalar_type(), " input, got ", rstd.scalar_type());
  TORCH_CHECK(rstd.device() == input.device(), "memsave.", op, ": rstd is on ", rstd.device(), " but the input is on ",
              input.device());
}

// rms_norm's arguments (CPU and CUDA).
inline RmsShape check_rms_norm_args(const at::Tensor& input, const c10::optional<at::Tensor>& weight, double eps,
                                    const char* op) {
  const RmsShape s = rms_shape(input, op);
  check_rms_weight(weight, input, "weight", op);
  TORCH_CHECK_VALUE(eps >= 0, "memsave.", op, ": eps must be >= 0, got ", eps);
  return s;
}

// rms_norm_backward's arguments (CPU and CUDA).
inline RmsShape check_rms_norm_backward_args(const at::Tensor& grad_out, const at::Tensor& input,
                                             const at::Tensor& rstd, const c10::optional<at::Tensor>& weight,
                                             const char* op) {
  const RmsShape s = rms_shape(input, op);
  check_rms_weight(weight, input, "weight", op);
  check_rms_rstd(rstd, input, s.rows, op);
  TORCH_CHECK_VALUE(grad_out.sizes().equals(input.sizes()), "memsave.", op, ": grad_out must have the input's shape ",
                    input.sizes(), ", got ", grad_out.sizes());
  TORCH_CHECK(grad_out.device() == input.device(), "memsave.", op, ": grad_out is on ", grad_out.device(),
              " but the input is on ", input.device());
  return s;
}

}  // namespace memsave
