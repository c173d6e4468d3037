// CUDA kernel of memsave::unscale_and_check_ (schema, semantics and CPU kernel: unscale_and_check.cpp; per element
// nonfinite and unscaled from amp_math.h, the functions the CPU kernel calls).
//
// Multi-tensor design: the gradients of one dtype are cut into fixed-size chunks; one launch covers up to
// kTableSize tensors, whose pointers, lengths and first-block numbers travel in a table passed by value as the
// kernel argument (no host-to-device copy, no host sync). Each block finds its tensor by binary search over the
// first-block numbers and processes one chunk with 16-byte vector loads when the tensor is aligned. A block-wide
// OR decides whether this chunk saw an inf/NaN, and one thread then writes the flag(s).
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amp/amp_checks.h"
#include "amp/amp_math.h"
#include "common/launch.cuh"

namespace memsave {
namespace {

constexpr int kUnscaleThreads = 512;
constexpr int kVecBytes = 16;
constexpr int kItersPerThread = 4;
// 160 entries keep the table (24 bytes per entry) plus the other arguments under the classic 4 KiB limit on kernel
// arguments, so no toolkit- or architecture-specific large-parameter support is needed.
constexpr int kTableSize = 160;

struct TensorTable {
  void* data[kTableSize];
  int64_t numel[kTableSize];
  int32_t first_block[kTableSize + 1];  // prefix sums of blocks per tensor; first_block[count] = blocks in launch
  int32_t tensor_index[kTableSize];     // position of each entry in the operator's gradient list (per_tensor)
  int32_t count;
};
static_assert(sizeof(TensorTable) + 3 * sizeof(void*) <= 4096, "kernel arguments must fit in 4 KiB");

template <typename scalar_t>
__global__ void __launch_bounds__(kUnscaleThreads)
    unscale_and_check_kernel(const TensorTable table, float* __restrict__ found_inf,
                             const float* __restrict__ inv_scale, float* __restrict__ per_tensor) {
  constexpr int kVec = kVecBytes / sizeof(scalar_t);
  constexpr int64_t kChunk = static_cast<int64_t>(kUnscaleThreads) * kVec * kItersPerThread;

  // Largest t with first_block[t] <= blockIdx.x; every thread computes the same t (uniform branches).
  const int32_t block = static_cast<int32_t>(blockIdx.x);
  int lo = 0;
  int hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int t = lo;
  scalar_t* __restrict__ p = static_cast<scalar_t*>(table.data[t]);
  const int64_t start = static_cast<int64_t>(block - table.first_block[t]) * kChunk;
  const int64_t end = start + kChunk < table.numel[t] ? start + kChunk : table.numel[t];
  const float inv = *inv_scale;
  const bool unscale = inv != 1.f;

  bool bad = false;
  if (reinterpret_cast<uintptr_t>(p) % kVecBytes == 0) {
    struct alignas(kVecBytes) Pack {
      scalar_t v[kVec];
    };
    // Full vectors of the chunk (chunk starts are multiples of kVec, so aligned), then the scalar tail.
    const int64_t vec_end = start + (end - start) / kVec * kVec;
    for (int64_t i = start + static_cast<int64_t>(threadIdx.x) * kVec; i < vec_end;
         i += static_cast<int64_t>(kUnscaleThreads) * kVec) {
      Pack pack = *reinterpret_cast<const Pack*>(p + i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        bad |= nonfinite(pack.v[j]);
        pack.v[j] = unscaled(pack.v[j], inv);
      }
      if (unscale) {
        *reinterpret_cast<Pack*>(p + i) = pack;
      }
    }
    for (int64_t i = vec_end + threadIdx.x; i < end; i += kUnscaleThreads) {
      const scalar_t v = p[i];
      bad |= nonfinite(v);
      if (unscale) {
        p[i] = unscaled(v, inv);
      }
    }
  } else {
    for (int64_t i = start + threadIdx.x; i < end; i += kUnscaleThreads) {
      const scalar_t v = p[i];
      bad |= nonfinite(v);
      if (unscale) {
        p[i] = unscaled(v, inv);
      }
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) {
    *found_inf = 1.f;  // racing writers all store the same value
    if (per_tensor != nullptr) {
      per_tensor[table.tensor_index[t]] = 1.f;
    }
  }
}

template <typename scalar_t>
void launch_unscale(const std::vector<std::pair<int32_t, at::Tensor>>& grads, float* found_inf, const float* inv_scale,
                    float* per_tensor, cudaStream_t stream) {
  constexpr int64_t kChunk = static_cast<int64_t>(kUnscaleThreads) * (kVecBytes / sizeof(scalar_t)) * kItersPerThread;
  // Keeps block numbers in int32 and grid.x in range; a launch is flushed before it would pass this.
  constexpr int64_t kMaxBlocks = int64_t{1} << 30;
  TensorTable table;
  table.count = 0;
  int64_t blocks = 0;
  auto flush = [&] {
    if (table.count == 0) {
      return;
    }
    table.first_block[table.count] = static_cast<int32_t>(blocks);
    unscale_and_check_kernel<scalar_t>
        <<<static_cast<unsigned>(blocks), kUnscaleThreads, 0, stream>>>(table, found_inf, inv_scale, per_tensor);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    table.count = 0;
    blocks = 0;
  };
  for (const auto& entry : grads) {
    const at::Tensor& g = entry.second;
    int64_t done = 0;
    const int64_t n = g.numel();
    // A tensor too large for one launch is split across launches at chunk boundaries.
    while (done < n) {
      if (table.count == kTableSize || blocks == kMaxBlocks) {
        flush();
      }
      const int64_t chunks = std::min((n - done + kChunk - 1) / kChunk, kMaxBlocks - blocks);
      const int64_t take = std::min(n - done, chunks * kChunk);
      table.data[table.count] = static_cast<scalar_t*>(g.data_ptr()) + done;
      table.numel[table.count] = take;
      table.first_block[table.count] = static_cast<int32_t>(blocks);
      table.tensor_index[table.count] = entry.first;
      ++table.count;
      blocks += chunks;
      done += take;
    }
  }
  flush();
}

void unscale_and_check_cuda(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                            const std::optional<at::Tensor>& per_tensor) {
  check_unscale_args(grads, found_inf, inv_scale, per_tensor, at::kCUDA);
  if (grads.empty()) {
    return;
  }
  const c10::cuda::CUDAGuard guard(found_inf.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();

  // Group by dtype; dense gradients are walked as flat memory, any other goes through a contiguous copy.
  std::vector<std::pair<int32_t, at::Tensor>> by_dtype[4];
  std::vector<std::pair<size_t, at::Tensor>> copies;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    if (g.numel() == 0) {
      continue;
    }
    at::Tensor w = g;
    if (!g.is_non_overlapping_and_dense()) {
      w = g.contiguous();
      copies.emplace_back(i, w);
    }
    const auto dt = g.scalar_type();
    const int slot = dt == at::kFloat ? 0 : dt == at::kHalf ? 1 : dt == at::kBFloat16 ? 2 : 3;
    by_dtype[slot].emplace_back(static_cast<int32_t>(i), w);
  }
  float* found = found_inf.mutable_data_ptr<float>();
  const float* inv = inv_scale.const_data_ptr<float>();
  float* flags = per_tensor.has_value() ? per_tensor->mutable_data_ptr<float>() : nullptr;
  if (!by_dtype[0].empty()) launch_unscale<float>(by_dtype[0], found, inv, flags, stream);
  if (!by_dtype[1].empty()) launch_unscale<c10::Half>(by_dtype[1], found, inv, flags, stream);
  if (!by_dtype[2].empty()) launch_unscale<c10::BFloat16>(by_dtype[2], found, inv, flags, stream);
  if (!by_dtype[3].empty()) launch_unscale<double>(by_dtype[3], found, inv, flags, stream);
  for (const auto& c : copies) {
    grads[c.first].copy_(c.second);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("unscale_and_check_", &unscale_and_check_cuda);
}

// A sparse gradient in the list sends the call to the Sparse key: the same kernel rejects it with a clear message.
TORCH_LIBRARY_IMPL(memsave, SparseCUDA, m) {
  m.impl("unscale_and_check_", &unscale_and_check_cuda);
}

}  // namespace memsave
