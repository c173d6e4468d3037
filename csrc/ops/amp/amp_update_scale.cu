// CUDA kernel of memsave::amp_update_scale_ (schema, semantics and CPU kernel: amp_update_scale.cpp): one thread runs
// update_scale_step (amp_math.h), the function the CPU kernel calls.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>

#include "amp/amp_checks.h"
#include "amp/amp_math.h"
#include "common/launch.cuh"

namespace memsave {
namespace {

__global__ void amp_update_scale_kernel(float* scale, int32_t* growth_tracker, int32_t* overflow_tracker,
                                        const float* found_inf, double growth_factor, double backoff_factor,
                                        int64_t growth_interval, int64_t hysteresis) {
  update_scale_step(scale, growth_tracker, overflow_tracker, found_inf, growth_factor, backoff_factor, growth_interval,
                    hysteresis);
}

void amp_update_scale_cuda(const at::Tensor& scale, const at::Tensor& growth_tracker,
                           const at::Tensor& overflow_tracker, const at::Tensor& found_inf, double growth_factor,
                           double backoff_factor, int64_t growth_interval, int64_t hysteresis) {
  check_update_args(scale, growth_tracker, overflow_tracker, found_inf, hysteresis, at::kCUDA);
  const c10::cuda::CUDAGuard guard(scale.device());
  amp_update_scale_kernel<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(
      scale.mutable_data_ptr<float>(), growth_tracker.mutable_data_ptr<int32_t>(),
      overflow_tracker.mutable_data_ptr<int32_t>(), found_inf.const_data_ptr<float>(), growth_factor, backoff_factor,
      growth_interval, hysteresis);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("amp_update_scale_", &amp_update_scale_cuda);
}

}  // namespace memsave
