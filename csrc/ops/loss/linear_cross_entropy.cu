// CUDA kernels of memsave::cross_entropy_tile_lse_ and cross_entropy_tile_grad_, the tile steps of
// linear_cross_entropy (schemas, CPU kernels and the forward/backward that loop over the tiles with cuBLAS matmuls:
// linear_cross_entropy.cpp; the per-element math, shared with the CPU kernels: cross_entropy_math.h).
#include <limits>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "common/launch.cuh"
#include "loss/cross_entropy_math.h"
#include "loss/linear_cross_entropy.h"

namespace memsave {
namespace {

// Running (max, sum of exp, sum of logits) of a set of logits, merged across the lanes of a warp.
template <typename acc_t>
__device__ inline void warp_merge(acc_t& m, acc_t& s, acc_t& sz) {
  for (int offset = cuda::kWarp / 2; offset > 0; offset /= 2) {
    const acc_t m2 = __shfl_down_sync(0xffffffffu, m, offset);
    const acc_t s2 = __shfl_down_sync(0xffffffffu, s, offset);
    const acc_t sz2 = __shfl_down_sync(0xffffffffu, sz, offset);
    lse_merge(m, s, m2, s2);
    sz += sz2;
  }
}

// One block per row of the tile: each thread folds its strided logits into an online (max, sum of exp), the block
// merges them, and thread 0 merges the row's result into state[row] = (max, sum of exp, linear part of the loss),
// in float64.
template <typename scalar_t, typename acc_t>
__global__ void tile_lse_kernel(const scalar_t* __restrict__ logits, int64_t cols, const int64_t* __restrict__ target,
                                double* __restrict__ state, int64_t class_start, int64_t ignore_index,
                                double target_weight, double smooth) {
  const int64_t row = blockIdx.x;
  const int64_t tr = target[row];
  if (tr == ignore_index) return;  // the whole block: its loss is 0 whatever its logits
  const scalar_t* zr = logits + row * cols;
  acc_t m = -std::numeric_limits<acc_t>::infinity(), s = 0, sz = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const acc_t x = static_cast<acc_t>(zr[j]);
    lse_update(m, s, x);
    sz += x;
  }
  __shared__ acc_t shared_m[cuda::kThreads / cuda::kWarp], shared_s[cuda::kThreads / cuda::kWarp],
      shared_sz[cuda::kThreads / cuda::kWarp];
  const int lane = threadIdx.x % cuda::kWarp, warp = threadIdx.x / cuda::kWarp;
  warp_merge(m, s, sz);
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = s;
    shared_sz[warp] = sz;
  }
  __syncthreads();
  if (warp != 0) return;
  const int warps = blockDim.x / cuda::kWarp;
  m = lane < warps ? shared_m[lane] : -std::numeric_limits<acc_t>::infinity();
  s = lane < warps ? shared_s[lane] : acc_t(0);
  sz = lane < warps ? shared_sz[lane] : acc_t(0);
  warp_merge(m, s, sz);
  if (lane != 0) return;
  double* st = state + row * kLceStateCols;
  lse_merge(st[0], st[1], static_cast<double>(m), static_cast<double>(s));
  const bool here = tr >= class_start && tr < class_start + cols;
  const double z_target = here ? static_cast<double>(zr[tr - class_start]) : 0.0;
  st[2] += cross_entropy_linear_part(static_cast<double>(sz), z_target, here ? target_weight : 0.0, smooth);
}

// One thread per logit: overwrite it with d(loss)/d(logit) times its row's scale (0 for ignored rows).
template <typename scalar_t, typename acc_t>
__global__ void tile_grad_kernel(scalar_t* __restrict__ logits, int64_t cols, int64_t numel,
                                 const int64_t* __restrict__ target, const double* __restrict__ lse,
                                 const acc_t* __restrict__ scale, int64_t scale_stride, int64_t class_start,
                                 int64_t ignore_index, acc_t target_weight, acc_t smooth) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const int64_t row = i / cols;
    const int64_t col = i - row * cols;
    const int64_t tr = target[row];
    if (tr == ignore_index) {
      logits[i] = scalar_t(0);
      continue;
    }
    const acc_t w = tr - class_start == col ? target_weight : acc_t(0);
    logits[i] = static_cast<scalar_t>(cross_entropy_grad(static_cast<acc_t>(logits[i]), split_lse<acc_t>(lse[row]), w,
                                                         smooth, scale[row * scale_stride]));
  }
}

void cross_entropy_tile_lse_cuda(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& state,
                                 int64_t class_start, int64_t num_classes, int64_t ignore_index,
                                 double label_smoothing) {
  constexpr const char* op = "cross_entropy_tile_lse_";
  check_lce_tile_lse_args(logits, target, state, class_start, num_classes, op);
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor z = logits.contiguous();
  const at::Tensor t = target.contiguous();
  const int64_t rows = z.size(0), cols = z.size(1);
  if (rows == 0 || cols == 0) return;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::ScalarType dtype = z.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "memsave_cross_entropy_tile_lse_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    tile_lse_kernel<scalar_t, acc_t><<<static_cast<unsigned>(rows), cuda::kThreads, 0, stream>>>(
        z.const_data_ptr<scalar_t>(), cols, t.const_data_ptr<int64_t>(), state.mutable_data_ptr<double>(), class_start,
        ignore_index, 1.0 - label_smoothing, label_smoothing / static_cast<double>(num_classes));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cross_entropy_tile_grad_cuda(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                  const at::Tensor& scale, int64_t class_start, int64_t num_classes,
                                  int64_t ignore_index, double label_smoothing) {
  constexpr const char* op = "cross_entropy_tile_grad_";
  check_lce_tile_grad_args(logits, target, lse, scale, class_start, num_classes, op);
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor t = target.contiguous();
  const at::Tensor l = lse.contiguous();
  const at::Tensor sc = scale.contiguous();
  const int64_t cols = logits.size(1), numel = logits.numel();
  if (numel == 0) return;
  const int64_t scale_stride = sc.size(0) == 1 ? 0 : 1;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::ScalarType dtype = logits.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "memsave_cross_entropy_tile_grad_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t smooth = static_cast<acc_t>(label_smoothing / static_cast<double>(num_classes));
    const acc_t target_weight = static_cast<acc_t>(1.0 - label_smoothing);
    tile_grad_kernel<scalar_t, acc_t><<<cuda::grid_for(numel), cuda::kThreads, 0, stream>>>(
        logits.mutable_data_ptr<scalar_t>(), cols, numel, t.const_data_ptr<int64_t>(), l.const_data_ptr<double>(),
        sc.const_data_ptr<acc_t>(), scale_stride, class_start, ignore_index, target_weight, smooth);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("cross_entropy_tile_lse_", &cross_entropy_tile_lse_cuda);
  m.impl("cross_entropy_tile_grad_", &cross_entropy_tile_grad_cuda);
}

}  // namespace memsave
