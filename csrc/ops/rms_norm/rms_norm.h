// Shared by rms_norm.cpp, rms_norm.cu and rms_norm_linear.cpp: the row layout of an RMSNorm input, the argument
// checks (every message names the argument and the operator), and the dtypes and layouts of the results.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include "common/checks.h"
#include "common/layout.h"

namespace memsave {

// Rows (product of the leading dims) and columns (the last dim, the one normalized) of an RMSNorm input.
struct RmsShape {
  int64_t rows;
  int64_t cols;
};

inline RmsShape rms_shape(const at::Tensor& input, const char* op) {
  check_floating(input, "input", op);
  TORCH_CHECK_VALUE(input.dim() >= 1, "memsave.", op, ": input must have at least one dimension (the one normalized)");
  // The product of the leading sizes, not numel / cols: with cols == 0 there are still rows (each gets a NaN
  // statistic, as torch's rms_norm gives an empty row).
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < input.dim(); ++d) rows *= input.size(d);
  return {rows, input.size(-1)};
}

// The norm's weight: [cols], floating, on the input's device.
inline void check_rms_weight(const c10::optional<at::Tensor>& weight, const at::Tensor& input, const char* name,
                             const char* op) {
  if (!is_defined(weight)) return;
  check_float_arg(*weight, name, input, "input", op);
  TORCH_CHECK_VALUE(weight->dim() == 1 && weight->size(0) == input.size(-1), "memsave.", op, ": ", name,
                    " must have shape [", input.size(-1), "] (the input's last dimension), got ", weight->sizes());
}

// The layout the kernels read an RMSNorm input in: rows of `cols` contiguous elements, one after another in memory.
// A dense tensor whose last dimension is contiguous (contiguous, or its leading dimensions permuted) is read in place
// and the results take its strides; any other is read from a contiguous copy.
inline at::Tensor rms_rows(const at::Tensor& input) {
  const bool in_place = input.is_non_overlapping_and_dense() && input.stride(-1) == 1 && input.size(-1) > 0;
  return in_place ? input : input.contiguous();
}

// Strides of the per-row statistic of rows read from `x` (rms_rows): one value per row, in x's row order.
inline std::vector<int64_t> rms_rstd_strides(const at::Tensor& x) {
  const int64_t cols = std::max<int64_t>(x.size(-1), 1);
  std::vector<int64_t> strides(x.strides().begin(), x.strides().end() - 1);
  for (int64_t& s : strides) s /= cols;
  return strides;
}

// The dtype the per-row statistic and the element math use: float (double for double inputs).
inline at::ScalarType rms_acc_dtype(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// HF's `weight * hidden.to(input_dtype)`: the output has promote(input dtype, weight dtype).
inline at::ScalarType rms_out_dtype(const at::Tensor& input, const c10::optional<at::Tensor>& weight) {
  return is_defined(weight) ? c10::promoteTypes(input.scalar_type(), weight->scalar_type()) : input.scalar_type();
}

inline void check_rms_rstd(const at::Tensor& rstd, const at::Tensor& input, int64_t rows, const char* op) {
  TORCH_CHECK_VALUE(rstd.numel() == rows, "memsave.", op, ": rstd must hold one value per normalized row (", rows,
                    "), got ", rstd.numel());
  check_same_device(rstd, "rstd", input, "input", op);
  TORCH_CHECK(rstd.scalar_type() == rms_acc_dtype(input), "memsave.", op, ": rstd must be ", rms_acc_dtype(input),
              " for a ", input.scalar_type(), " input, got ", rstd.scalar_type());
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
  check_float_arg(grad_out, "grad_out", input, "input", op);
  TORCH_CHECK_VALUE(grad_out.sizes().equals(input.sizes()), "memsave.", op, ": grad_out must have the input's shape ",
                    input.sizes(), ", got ", grad_out.sizes());
  return s;
}

// The tensors of one rms_norm forward (CPU and CUDA): the rows read (rms_rows), the weight in the accumulation dtype,
// and out and rstd in the rows' layout.
struct RmsForward {
  RmsShape s;
  at::Tensor x, w, out, rstd;
};

inline RmsForward rms_norm_prepare(const at::Tensor& input, const c10::optional<at::Tensor>& weight, double eps) {
  RmsForward f;
  f.s = check_rms_norm_args(input, weight, eps, "rms_norm");
  f.x = rms_rows(input);
  const at::ScalarType acc = rms_acc_dtype(input);
  if (is_defined(weight)) f.w = weight->to(acc).contiguous();
  f.out = at::empty_like(f.x, f.x.options().dtype(rms_out_dtype(input, weight)));
  f.rstd = at::empty_strided(input.sizes().slice(0, input.dim() - 1), rms_rstd_strides(f.x), f.x.options().dtype(acc));
  return f;
}

// A full-size result computed on the rows read from `x`, in `input`'s layout (a copy only when x is a copy).
inline at::Tensor rms_in_input_layout(const at::Tensor& t, const at::Tensor& x, const at::Tensor& input) {
  return x.is_same(input) || t.numel() != input.numel() ? t : at::empty_like(input, t.options()).copy_(t);
}

// The tensors of one rms_norm_backward (CPU and CUDA): the rows read from the input, grad_out and rstd in their
// layout, the weight in the accumulation dtype and the input gradient (empty when not asked for).
struct RmsBackward {
  RmsShape s;
  at::Tensor x, go, rstd, w, grad_input;
};

inline RmsBackward rms_norm_backward_prepare(const at::Tensor& grad_out, const at::Tensor& input,
                                             const at::Tensor& rstd, const c10::optional<at::Tensor>& weight,
                                             bool need_grad_input) {
  RmsBackward b;
  b.s = check_rms_norm_backward_args(grad_out, input, rstd, weight, "rms_norm_backward");
  b.x = rms_rows(input);
  b.go = with_strides(grad_out, b.x.strides());
  b.rstd = with_strides(rstd, rms_rstd_strides(b.x));
  if (is_defined(weight)) b.w = weight->to(rms_acc_dtype(input)).contiguous();
  b.grad_input = need_grad_input ? at::empty_like(b.x) : at::empty({0}, input.options());
  return b;
}

}  // namespace memsave
