// memsave::amp_update_scale_ — the update half of dynamic loss scaling (the unscale half: unscale_and_check.cpp).
//
//   amp_update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor(c!) overflow_tracker, Tensor found_inf,
//                     float growth_factor, float backoff_factor, int growth_interval, int hysteresis) -> ()
//     torch._amp_update_scale_ with hysteresis: overflow_tracker (int32) counts consecutive overflowing steps and the
//     scale backs off only once it reaches `hysteresis` (then on every further consecutive overflow). A clean step
//     resets it. With hysteresis == 1 the scale and growth tracker evolve exactly as torch's.
//     The rule is update_scale_step (amp_math.h): run here on the host, by one GPU thread in amp_update_scale.cu.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>

#include "amp/amp_checks.h"
#include "amp/amp_math.h"

namespace memsave {
namespace {

void amp_update_scale_cpu(const at::Tensor& scale, const at::Tensor& growth_tracker, const at::Tensor& overflow_tracker,
                          const at::Tensor& found_inf, double growth_factor, double backoff_factor,
                          int64_t growth_interval, int64_t hysteresis) {
  check_update_args(scale, growth_tracker, overflow_tracker, found_inf, hysteresis, at::kCPU);
  update_scale_step(scale.mutable_data_ptr<float>(), growth_tracker.mutable_data_ptr<int32_t>(),
                    overflow_tracker.mutable_data_ptr<int32_t>(), found_inf.const_data_ptr<float>(), growth_factor,
                    backoff_factor, growth_interval, hysteresis);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def(
      "amp_update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor(c!) overflow_tracker, "
      "Tensor found_inf, float growth_factor, float backoff_factor, int growth_interval, int hysteresis) -> ()");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("amp_update_scale_", &amp_update_scale_cpu);
}

}  // namespace memsave
