// Launch helpers shared by memsave's CUDA kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace memsave {
namespace cuda {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// Multiprocessor count of the current device (queried once per device: the attribute call is cheap but not free).
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {0};
  const int device = c10::cuda::current_device();
  if (device >= kMaxDevices) {
    int count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }
  if (cached[device] == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&cached[device], cudaDevAttrMultiProcessorCount, device));
  }
  return cached[device];
}

// Blocks for a grid-stride loop over `work` items of `threads`-thread blocks: enough to fill every SM several
// times, never more than the work needs, never zero.
inline int grid_for(int64_t work, int threads = kThreads) {
  const int64_t wanted = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sm_count()) * 16;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, cap)));
}

}  // namespace cuda
}  // namespace memsave
