// Argument checks of memsave::unscale_and_check_ and memsave::amp_update_scale_, shared by their CPU and CUDA kernels.
// The per-element math is in amp_math.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>

namespace memsave {

inline void check_scalar_arg(const at::Tensor& t, const char* name, at::ScalarType dtype, at::Device device,
                             const char* op) {
  TORCH_CHECK(t.layout() == at::kStrided, op, ": ", name, " must be a dense tensor");
  TORCH_CHECK(t.device() == device, op, ": expected all tensors to be on the same device, but ", name, " is on ",
              t.device(), " and the other arguments are on ", device, "; keep one call per device");
  TORCH_CHECK(t.numel() == 1, op, ": ", name, " must hold exactly one element, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
}

inline void check_unscale_args(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                               const std::optional<at::Tensor>& per_tensor, at::DeviceType device_type) {
  constexpr const char* op = "memsave::unscale_and_check_";
  TORCH_CHECK(found_inf.device().type() == device_type, op, ": found_inf is on ", found_inf.device(), ", expected a ",
              device_type, " tensor");
  const at::Device device = found_inf.device();
  check_scalar_arg(found_inf, "found_inf", at::kFloat, device, op);
  check_scalar_arg(inv_scale, "inv_scale", at::kFloat, device, op);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    TORCH_CHECK(g.layout() == at::kStrided, op, ": grads[", i, "] has layout ", g.layout(),
                "; pass a sparse gradient's values (grad._values() of a coalesced tensor) instead");
    TORCH_CHECK(g.device() == device, op, ": expected all tensors to be on the same device, but grads[", i, "] is on ",
                g.device(), " and found_inf is on ", device, "; group gradients by device and call once per device");
    const auto dt = g.scalar_type();
    TORCH_CHECK(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16, op, ": grads[", i,
                "] has dtype ", dt, "; only float, double, half and bfloat16 gradients can be unscaled");
  }
  if (per_tensor.has_value()) {
    const at::Tensor& f = *per_tensor;
    TORCH_CHECK(f.scalar_type() == at::kFloat && f.dim() == 1 && f.numel() == static_cast<int64_t>(grads.size()) &&
                    f.is_contiguous(),
                op, ": per_tensor must be a contiguous float32 vector with one element per gradient (", grads.size(),
                "), got ", f.scalar_type(), " of shape ", f.sizes());
    TORCH_CHECK(f.device() == device, op, ": per_tensor is on ", f.device(), " but found_inf is on ", device);
  }
}

inline void check_update_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                              const at::Tensor& overflow_tracker, const at::Tensor& found_inf, int64_t hysteresis,
                              at::DeviceType device_type) {
  constexpr const char* op = "memsave::amp_update_scale_";
  TORCH_CHECK(scale.device().type() == device_type, op, ": scale is on ", scale.device(), ", expected a ", device_type,
              " tensor");
  const at::Device device = scale.device();
  check_scalar_arg(scale, "scale", at::kFloat, device, op);
  check_scalar_arg(growth_tracker, "growth_tracker", at::kInt, device, op);
  check_scalar_arg(overflow_tracker, "overflow_tracker", at::kInt, device, op);
  check_scalar_arg(found_inf, "found_inf", at::kFloat, device, op);
  TORCH_CHECK(hysteresis >= 1, op, ": hysteresis must be >= 1, got ", hysteresis);
}

}  // namespace memsave
