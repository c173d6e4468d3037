// CUDA kernels shared by batch_norm_act and inplace_abn (layouts: bn_act_common.h; per-element math: bn_act_math.h,
// the functions the CPU kernels call):
//   pass 1  per-channel partial sums of g = grad_out * act'(y) and g * xhat over a fixed split of the rows,
//   pass 1b one thread per channel adds the partials in a fixed order (deterministic) and derives coefficients,
//   pass 2  elementwise input gradient.
// plus the "normalize + activate" transform (inplace_abn's forward, batch_norm_act_apply's recompute). Accumulation
// is in float (double for double inputs); every launch goes to the current stream.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "common/launch.cuh"
#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_math.h"

namespace memsave {
namespace cuda {
namespace bn {

constexpr int kRows = 8;  // rows per block in the channels-last reduction (block = kWarp channels x kRows rows)

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Contiguous layout: grid (C, S); block (kThreads). Block (c, s) sums every S-th stretch of channel c's M elements.
template <typename scalar_t, typename acc_t, bool FromOutput>
__global__ void reduce_nc_kernel(const scalar_t* __restrict__ src, const scalar_t* __restrict__ go,
                                 ChannelParams<acc_t> p, int64_t C, int64_t inner, int64_t M,
                                 acc_t* __restrict__ partial) {
  const int64_t c = blockIdx.x;
  const int64_t s = blockIdx.y;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.x;
  acc_t sg = 0, sgx = 0;
  for (int64_t j = s * blockDim.x + threadIdx.x; j < M; j += step) {
    const int64_t n = j / inner;
    const int64_t idx = (n * C + c) * inner + (j - n * inner);
    acc_t xhat, dact;
    bn_act_recover<FromOutput>(p, c, static_cast<acc_t>(src[idx]), xhat, dact);
    const acc_t g = static_cast<acc_t>(go[idx]) * dact;
    sg += g;
    sgx += g * xhat;
  }
  __shared__ acc_t shared[2][kThreads / kWarp];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  sg = warp_sum(sg);
  sgx = warp_sum(sgx);
  if (lane == 0) {
    shared[0][warp] = sg;
    shared[1][warp] = sgx;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarp;
    sg = lane < warps ? shared[0][lane] : acc_t(0);
    sgx = lane < warps ? shared[1][lane] : acc_t(0);
    sg = warp_sum(sg);
    sgx = warp_sum(sgx);
    if (lane == 0) {
      partial[(s * 2) * C + c] = sg;
      partial[(s * 2 + 1) * C + c] = sgx;
    }
  }
}

// Channels-last layout: grid (ceil(C / kWarp), S); block (kWarp, kRows). A warp reads kWarp adjacent channels of
// one row (coalesced); rows are split over blockIdx.y and threadIdx.y.
template <typename scalar_t, typename acc_t, bool FromOutput>
__global__ void reduce_cl_kernel(const scalar_t* __restrict__ src, const scalar_t* __restrict__ go,
                                 ChannelParams<acc_t> p, int64_t C, int64_t M, acc_t* __restrict__ partial) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kWarp + threadIdx.x;
  const int64_t s = blockIdx.y;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kRows;
  acc_t sg = 0, sgx = 0;
  if (c < C) {
    for (int64_t r = s * kRows + threadIdx.y; r < M; r += step) {
      const int64_t idx = r * C + c;
      acc_t xhat, dact;
      bn_act_recover<FromOutput>(p, c, static_cast<acc_t>(src[idx]), xhat, dact);
      const acc_t g = static_cast<acc_t>(go[idx]) * dact;
      sg += g;
      sgx += g * xhat;
    }
  }
  __shared__ acc_t shared[2][kRows][kWarp];
  shared[0][threadIdx.y][threadIdx.x] = sg;
  shared[1][threadIdx.y][threadIdx.x] = sgx;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < kRows; ++k) {
      sg += shared[0][k][threadIdx.x];
      sgx += shared[1][k][threadIdx.x];
    }
    partial[(s * 2) * C + c] = sg;
    partial[(s * 2 + 1) * C + c] = sgx;
  }
}

// One thread per channel: sums[0][c] = sum(g), sums[1][c] = sum(g * xhat); coef[0..2][c] = k, mean(g), mean(g xhat).
template <typename acc_t>
__global__ void finalize_kernel(const acc_t* __restrict__ partial, int64_t S, int64_t C, int64_t M, bool training,
                                ChannelParams<acc_t> p, acc_t* __restrict__ sums, acc_t* __restrict__ coef) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  acc_t sg = 0, sgx = 0;
  for (int64_t s = 0; s < S; ++s) {
    sg += partial[(s * 2) * C + c];
    sgx += partial[(s * 2 + 1) * C + c];
  }
  sums[c] = sg;
  sums[C + c] = sgx;
  coef[c] = p.weight[c] * p.invstd[c];
  coef[C + c] = (training && M > 0) ? sg / static_cast<acc_t>(M) : acc_t(0);
  coef[2 * C + c] = (training && M > 0) ? sgx / static_cast<acc_t>(M) : acc_t(0);
}

template <typename scalar_t, typename acc_t, bool FromOutput>
__global__ void grad_input_kernel(const scalar_t* __restrict__ src, const scalar_t* __restrict__ go,
                                  ChannelParams<acc_t> p, const acc_t* __restrict__ coef, int64_t C, int64_t inner,
                                  bool channels_last, int64_t numel, scalar_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const int64_t c = channels_last ? i % C : (i / inner) % C;
    acc_t xhat, dact;
    bn_act_recover<FromOutput>(p, c, static_cast<acc_t>(src[i]), xhat, dact);
    const acc_t g = static_cast<acc_t>(go[i]) * dact;
    out[i] = static_cast<scalar_t>(bn_act_dx<FromOutput>(coef[c], g, coef[C + c], xhat, coef[2 * C + c]));
  }
}

// out may equal in (in place), hence no __restrict__.
template <typename scalar_t, typename acc_t>
__global__ void transform_kernel(const scalar_t* in, scalar_t* out, ChannelParams<acc_t> p, int64_t C, int64_t inner,
                                 bool channels_last, int64_t numel) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const int64_t c = channels_last ? i % C : (i / inner) % C;
    const acc_t y = bn_act_affine_cuda(static_cast<acc_t>(in[i]), p.mean[c], p.invstd[c], p.weight[c], p.bias[c]);
    out[i] = static_cast<scalar_t>(act_forward(p.act, y, p.act_param));
  }
}

// Host side of the backward. `ct` holds the per-channel tensors in bn_stat_dtype(src); `sums` is [2, C] in that
// dtype and receives (sum(g), sum(g * xhat)). src, go and grad_in are dense in layout `l`, on the current device.
template <bool FromOutput>
void backward(const at::Tensor& go, const at::Tensor& src, const ChannelTensors& ct, Act act, double act_param,
              bool training, const BnLayout& l, at::Tensor& grad_in, at::Tensor& sums) {
  const int64_t C = l.C;
  const int64_t M = l.N * l.inner;
  const int64_t numel = src.numel();
  if (C == 0) return;
  if (M == 0) {
    sums.zero_();
    return;
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t target_blocks = static_cast<int64_t>(sm_count()) * 4;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_backward_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    const ChannelParams<acc_t> p = ct.params<acc_t>(act, act_param);
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    const scalar_t* g = go.const_data_ptr<scalar_t>();
    int64_t S;
    at::Tensor partial;
    if (!l.channels_last) {
      S = std::min<int64_t>({std::max<int64_t>(1, target_blocks / C), (M + kThreads - 1) / kThreads, 65535});
      partial = at::empty({S, 2, C}, ct.invstd.options());
      reduce_nc_kernel<scalar_t, acc_t, FromOutput>
          <<<dim3(C, S), kThreads, 0, stream>>>(s, g, p, C, l.inner, M, partial.mutable_data_ptr<acc_t>());
    } else {
      const int64_t col_blocks = (C + kWarp - 1) / kWarp;
      S = std::min<int64_t>({std::max<int64_t>(1, target_blocks / col_blocks), (M + kRows - 1) / kRows, 65535});
      partial = at::empty({S, 2, C}, ct.invstd.options());
      reduce_cl_kernel<scalar_t, acc_t, FromOutput>
          <<<dim3(col_blocks, S), dim3(kWarp, kRows), 0, stream>>>(s, g, p, C, M, partial.mutable_data_ptr<acc_t>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    at::Tensor coef = at::empty({3, C}, ct.invstd.options());
    finalize_kernel<acc_t><<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        partial.const_data_ptr<acc_t>(), S, C, M, training, p, sums.mutable_data_ptr<acc_t>(),
        coef.mutable_data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    grad_input_kernel<scalar_t, acc_t, FromOutput>
        <<<grid_for(numel), kThreads, 0, stream>>>(s, g, p, coef.const_data_ptr<acc_t>(), C, l.inner, l.channels_last,
                                                   numel, grad_in.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// dst <- act((src - mean) * invstd * w + b); `ct` in bn_stat_dtype(src); src, dst dense in layout `l`, same dtype;
// dst may be src (in place).
inline void transform(const at::Tensor& src, at::Tensor& dst, const ChannelTensors& ct, Act act, double act_param,
                      const BnLayout& l) {
  const int64_t numel = src.numel();
  if (numel == 0) return;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_transform_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    transform_kernel<scalar_t, acc_t><<<grid_for(numel), kThreads, 0, stream>>>(
        src.const_data_ptr<scalar_t>(), dst.mutable_data_ptr<scalar_t>(), ct.params<acc_t>(act, act_param), l.C,
        l.inner, l.channels_last, numel);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// The CUDA kernels behind bn_act_common.h's host functions; per-channel constants in bn_stat_dtype.
struct BnActKernels {
  static at::ScalarType acc_dtype(const at::Tensor& x) { return bn_stat_dtype(x); }

  static void transform(const at::Tensor& src, at::Tensor& dst, const ChannelTensors& ct, Act act, double act_param,
                        const BnLayout& l) {
    bn::transform(src, dst, ct, act, act_param, l);
  }

  template <bool FromOutput>
  static void backward(const at::Tensor& go, const at::Tensor& src, const ChannelTensors& ct, Act act, double act_param,
                       bool training, const BnLayout& l, at::Tensor& grad_in, at::Tensor& sums) {
    bn::backward<FromOutput>(go, src, ct, act, act_param, training, l, grad_in, sums);
  }
};

}  // namespace bn
}  // namespace cuda
}  // namespace memsave
