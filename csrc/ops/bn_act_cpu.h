// CPU kernels shared by batch_norm_act and inplace_abn: the fused backward (recover xhat and act' per element,
// reduce per channel, write the input gradient) and the "normalize + activate" transform (inplace_abn's forward,
// batch_norm_act_apply's recompute).
// Accumulation is in double, as torch's CPU batch norm does for float inputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "bn_act_common.h"

namespace memsave {
namespace cpu {

// Rows of a channels-last tensor are reduced in at most this many fixed chunks, so the summation order (and the
// result) does not depend on the number of threads.
constexpr int64_t kMaxReduceChunks = 64;

// grad_in <- input gradient; sum_g[c] <- sum(g), sum_gx[c] <- sum(g * xhat) with g = grad_out * act'(y).
// `src` is the saved input (FromOutput = false) or the saved output (FromOutput = true); src, go and grad_in share
// the layout `l` and are dense in it.
template <bool FromOutput>
void bn_act_backward_kernel(const at::Tensor& go, const at::Tensor& src, const ChannelParams<double>& p,
                            bool training, const BnLayout& l, at::Tensor& grad_in, double* sum_g, double* sum_gx) {
  const int64_t N = l.N, C = l.C, inner = l.inner;
  const int64_t M = N * inner;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_backward_cpu", [&] {
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    const scalar_t* g = go.const_data_ptr<scalar_t>();
    scalar_t* out = grad_in.mutable_data_ptr<scalar_t>();
    if (!l.channels_last) {
      // One channel per task: both passes over a channel's N slabs stay in one thread.
      at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          double sg = 0.0, sgx = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            const int64_t base = (n * C + c) * inner;
            for (int64_t i = 0; i < inner; ++i) {
              double xhat, dact;
              bn_act_recover<FromOutput>(p, c, static_cast<double>(s[base + i]), xhat, dact);
              const double gg = static_cast<double>(g[base + i]) * dact;
              sg += gg;
              sgx += gg * xhat;
            }
          }
          sum_g[c] = sg;
          sum_gx[c] = sgx;
          const double k = p.weight[c] * p.invstd[c];
          const double mg = (training && M > 0) ? sg / static_cast<double>(M) : 0.0;
          const double mgx = (training && M > 0) ? sgx / static_cast<double>(M) : 0.0;
          for (int64_t n = 0; n < N; ++n) {
            const int64_t base = (n * C + c) * inner;
            for (int64_t i = 0; i < inner; ++i) {
              double xhat, dact;
              bn_act_recover<FromOutput>(p, c, static_cast<double>(s[base + i]), xhat, dact);
              const double gg = static_cast<double>(g[base + i]) * dact;
              out[base + i] = static_cast<scalar_t>(bn_act_dx<FromOutput>(k, gg, mg, xhat, mgx));
            }
          }
        }
      });
      return;
    }
    // Channels-last: M rows of C. Pass 1 reduces fixed row chunks into partial sums, pass 2 is elementwise.
    const int64_t rows_per_chunk = std::max<int64_t>(1, (M + kMaxReduceChunks - 1) / kMaxReduceChunks);
    const int64_t chunks = M == 0 ? 0 : (M + rows_per_chunk - 1) / rows_per_chunk;
    std::vector<double> partial(static_cast<size_t>(chunks * 2 * C), 0.0);
    at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        double* pg = partial.data() + k * 2 * C;
        double* pgx = pg + C;
        const int64_t r1 = std::min(M, (k + 1) * rows_per_chunk);
        for (int64_t r = k * rows_per_chunk; r < r1; ++r) {
          const scalar_t* sr = s + r * C;
          const scalar_t* gr = g + r * C;
          for (int64_t c = 0; c < C; ++c) {
            double xhat, dact;
            bn_act_recover<FromOutput>(p, c, static_cast<double>(sr[c]), xhat, dact);
            const double gg = static_cast<double>(gr[c]) * dact;
            pg[c] += gg;
            pgx[c] += gg * xhat;
          }
        }
      }
    });
    std::vector<double> coef(static_cast<size_t>(3 * C));
    for (int64_t c = 0; c < C; ++c) {
      double sg = 0.0, sgx = 0.0;
      for (int64_t k = 0; k < chunks; ++k) {
        sg += partial[k * 2 * C + c];
        sgx += partial[k * 2 * C + C + c];
      }
      sum_g[c] = sg;
      sum_gx[c] = sgx;
      coef[c] = p.weight[c] * p.invstd[c];
      coef[C + c] = (training && M > 0) ? sg / static_cast<double>(M) : 0.0;
      coef[2 * C + c] = (training && M > 0) ? sgx / static_cast<double>(M) : 0.0;
    }
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1));
    at::parallel_for(0, M, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* sr = s + r * C;
        const scalar_t* gr = g + r * C;
        scalar_t* orow = out + r * C;
        for (int64_t c = 0; c < C; ++c) {
          double xhat, dact;
          bn_act_recover<FromOutput>(p, c, static_cast<double>(sr[c]), xhat, dact);
          const double gg = static_cast<double>(gr[c]) * dact;
          orow[c] = static_cast<scalar_t>(bn_act_dx<FromOutput>(coef[c], gg, coef[C + c], xhat, coef[2 * C + c]));
        }
      }
    });
  });
}

// dst <- act((src - mean) * invstd * w + b); src and dst dense in layout `l`, same dtype; dst may be src (in place).
inline void bn_act_transform(const at::Tensor& src, at::Tensor& dst, const ChannelParams<double>& p,
                             const BnLayout& l) {
  const int64_t C = l.C, inner = l.inner;
  const int64_t numel = src.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_transform_cpu", [&] {
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    scalar_t* d = dst.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, numel, 32768, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t c = l.channels_last ? i % C : (i / inner) % C;
        const double y = (static_cast<double>(s[i]) - p.mean[c]) * p.invstd[c] * p.weight[c] + p.bias[c];
        d[i] = static_cast<scalar_t>(act_forward(p.act, y, p.act_param));
      }
    });
  });
}

}  // namespace cpu
}  // namespace memsave
