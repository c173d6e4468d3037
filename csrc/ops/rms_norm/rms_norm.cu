// CUDA kernels of memsave::rms_norm and rms_norm_backward (schemas and CPU kernels: rms_norm.cpp; per-element math:
// rms_norm_math.h, the functions the CPU kernels call):
//   forward           one block per row: the sum of squares by a block reduction, then the row's outputs;
//   backward, input   one block per row: sum(g * n) by a block reduction, then the row's input gradient;
//   backward, weight  one thread per column sums a fixed chunk of rows into a partial row; torch sums the partials.
// Accumulation in float (double for double inputs); every launch goes to the current stream.
#include <algorithm>

#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/launch.cuh"
#include "rms_norm/rms_norm.h"
#include "rms_norm/rms_norm_math.h"

namespace memsave {
namespace {

constexpr int64_t kMaxRowBlocks = 65535;       // row blocks per launch; a grid-stride loop covers the rest
constexpr int64_t kMaxWeightGradChunks = 256;  // fixed chunks of rows for the weight gradient (deterministic)

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = cuda::kWarp / 2; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the block (blockDim.x a multiple of the warp size, at most kThreads); every thread gets the total.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % cuda::kWarp;
  const int warp = threadIdx.x / cuda::kWarp;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / cuda::kWarp;
    v = lane < warps ? shared[lane] : T(0);
    v = warp_sum(v);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const T total = shared[0];
  __syncthreads();  // shared is reused by the next row
  return total;
}

template <typename in_t, typename out_t, typename acc_t>
__global__ void rms_norm_kernel(const in_t* __restrict__ x, const acc_t* __restrict__ w, int64_t rows, int64_t cols,
                                acc_t eps, out_t* __restrict__ y, acc_t* __restrict__ rstd) {
  __shared__ acc_t shared[cuda::kThreads / cuda::kWarp];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const in_t* xr = x + row * cols;
    acc_t sum_sq = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const acc_t v = static_cast<acc_t>(xr[j]);
      sum_sq += v * v;
    }
    sum_sq = block_sum(sum_sq, shared);
    const acc_t r = rms_norm_rstd<acc_t>(sum_sq, cols, eps);
    if (threadIdx.x == 0) rstd[row] = r;
    out_t* yr = y + row * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      yr[j] = static_cast<out_t>(rms_norm_element<in_t, acc_t>(static_cast<acc_t>(xr[j]), r, w ? w[j] : acc_t(1)));
    }
  }
}

template <typename in_t, typename go_t, typename acc_t>
__global__ void rms_norm_grad_input_kernel(const go_t* __restrict__ go, const in_t* __restrict__ x,
                                           const acc_t* __restrict__ rstd, const acc_t* __restrict__ w, int64_t rows,
                                           int64_t cols, in_t* __restrict__ grad_input) {
  __shared__ acc_t shared[cuda::kThreads / cuda::kWarp];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const in_t* xr = x + row * cols;
    const go_t* gr = go + row * cols;
    const acc_t rs = rstd[row];
    acc_t dot = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      dot += static_cast<acc_t>(gr[j]) * (w ? w[j] : acc_t(1)) * (static_cast<acc_t>(xr[j]) * rs);
    }
    const acc_t mean_gn = block_sum(dot, shared) / static_cast<acc_t>(cols);
    in_t* gi = grad_input + row * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const acc_t g = static_cast<acc_t>(gr[j]) * (w ? w[j] : acc_t(1));
      gi[j] = static_cast<in_t>(rms_norm_grad_input<acc_t>(g, static_cast<acc_t>(xr[j]) * rs, rs, mean_gn));
    }
  }
}

// grid (ceil(cols / blockDim.x), chunks): partial[chunk, j] = sum over the chunk's rows of grad_out * h.
template <typename in_t, typename go_t, typename acc_t>
__global__ void rms_norm_grad_weight_kernel(const go_t* __restrict__ go, const in_t* __restrict__ x,
                                            const acc_t* __restrict__ rstd, int64_t rows, int64_t cols,
                                            int64_t chunk_rows, acc_t* __restrict__ partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  acc_t sum = 0;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t i = row * cols + j;
    sum += static_cast<acc_t>(go[i]) * rms_norm_hidden<in_t, acc_t>(static_cast<acc_t>(x[i]), rstd[row]);
  }
  partial[static_cast<int64_t>(blockIdx.y) * cols + j] = sum;
}

int row_threads(int64_t cols) {
  // One warp per 32 columns of a short row, up to kThreads.
  const int64_t warps = std::min<int64_t>(cuda::kThreads / cuda::kWarp, (cols + cuda::kWarp - 1) / cuda::kWarp);
  return static_cast<int>(std::max<int64_t>(1, warps) * cuda::kWarp);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_cuda(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                                                 double eps) {
  const c10::cuda::CUDAGuard guard(input.device());
  const RmsForward f = rms_norm_prepare(input, weight, eps);
  const RmsShape s = f.s;
  const at::Tensor &x = f.x, &w = f.w, &out = f.out, &rstd = f.rstd;
  const bool has_w = w.defined();
  if (s.rows == 0) return {out, rstd};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int blocks = static_cast<int>(std::min(s.rows, kMaxRowBlocks));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_rms_norm_cuda", [&] {
    using in_t = scalar_t;
    using acc_t = at::acc_type<in_t, true>;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "memsave_rms_norm_cuda_out", [&] {
      rms_norm_kernel<in_t, scalar_t, acc_t><<<blocks, row_threads(s.cols), 0, stream>>>(
          x.const_data_ptr<in_t>(), has_w ? w.const_data_ptr<acc_t>() : nullptr, s.rows, s.cols,
          static_cast<acc_t>(eps), out.mutable_data_ptr<scalar_t>(), rstd.mutable_data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {rms_in_input_layout(out, x, input), rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad_out, const at::Tensor& input,
                                                          const at::Tensor& rstd,
                                                          const c10::optional<at::Tensor>& weight,
                                                          std::array<bool, 2> output_mask) {
  const c10::cuda::CUDAGuard guard(input.device());
  const RmsBackward b = rms_norm_backward_prepare(grad_out, input, rstd, weight, output_mask[0]);
  const RmsShape s = b.s;
  const at::Tensor &x = b.x, &go = b.go, &r = b.rstd, &w = b.w, &grad_input = b.grad_input;
  const bool has_w = w.defined();
  const bool need_gi = output_mask[0], need_gw = output_mask[1] && has_w;
  const at::ScalarType acc = rms_acc_dtype(input);
  at::Tensor grad_weight = need_gw ? at::zeros({s.cols}, weight->options()) : at::empty({0}, input.options());
  if (s.rows == 0 || s.cols == 0) return {rms_in_input_layout(grad_input, x, input), grad_weight};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t chunk_rows = std::max<int64_t>(1, (s.rows + kMaxWeightGradChunks - 1) / kMaxWeightGradChunks);
  const int64_t chunks = (s.rows + chunk_rows - 1) / chunk_rows;
  at::Tensor partial = need_gw ? at::empty({chunks, s.cols}, input.options().dtype(acc)) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_rms_norm_backward_cuda", [&] {
    using in_t = scalar_t;
    using acc_t = at::acc_type<in_t, true>;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, go.scalar_type(), "memsave_rms_norm_backward_go", [&] {
      if (need_gi) {
        const int blocks = static_cast<int>(std::min(s.rows, kMaxRowBlocks));
        rms_norm_grad_input_kernel<in_t, scalar_t, acc_t><<<blocks, row_threads(s.cols), 0, stream>>>(
            go.const_data_ptr<scalar_t>(), x.const_data_ptr<in_t>(), r.const_data_ptr<acc_t>(),
            has_w ? w.const_data_ptr<acc_t>() : nullptr, s.rows, s.cols, grad_input.mutable_data_ptr<in_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      if (need_gw) {
        const dim3 grid(static_cast<unsigned>((s.cols + cuda::kThreads - 1) / cuda::kThreads),
                        static_cast<unsigned>(chunks));
        rms_norm_grad_weight_kernel<in_t, scalar_t, acc_t><<<grid, cuda::kThreads, 0, stream>>>(
            go.const_data_ptr<scalar_t>(), x.const_data_ptr<in_t>(), r.const_data_ptr<acc_t>(), s.rows, s.cols,
            chunk_rows, partial.mutable_data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  });
  if (need_gw) grad_weight = at::sum(partial, 0).to(weight->scalar_type());
  return {rms_in_input_layout(grad_input, x, input), grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("rms_norm_backward", &rms_norm_backward_cuda);
}

}  // namespace memsave
