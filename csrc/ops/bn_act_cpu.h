// CPU kernels shared by batch_norm_act and inplace_abn: the fused backward (recover xhat and act' per element,
// reduce per channel, write the input gradient) and the "normalize + activate" transform (inplace_abn's forward,
// batch_norm_act_apply's recompute).
// Element math in float (double for double inputs); per-channel sums accumulate in double.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
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

// The reductions (pass 1) run in double: sum(g * xhat) can cancel heavily, so float products would lose digits that
// torch keeps. The elementwise input gradient (pass 2) runs in float for float/half/bfloat16 (double for double).
template <typename scalar_t>
using opmath_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// One channel's constants, loaded into locals so the inner loops do not re-read them through pointers.
template <typename T>
struct Chan {
  T mean, invstd, w, b, inv_w;
};

template <typename T>
std::vector<Chan<T>> load_channels(const ChannelParams<double>& p, int64_t C) {
  std::vector<Chan<T>> ch(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    ch[c] = {p.mean ? static_cast<T>(p.mean[c]) : T(0), static_cast<T>(p.invstd[c]), static_cast<T>(p.weight[c]),
             static_cast<T>(p.bias[c]), p.inv_weight ? static_cast<T>(p.inv_weight[c]) : T(0)};
  }
  return ch;
}

// (xhat, act'(y)) of one element; see bn_act_recover in bn_act_common.h.
template <bool FromOutput, typename T>
inline void recover(Act act, T p, const Chan<T>& ch, T v, T& xhat, T& dact) {
  if constexpr (FromOutput) {
    const T y = act_invert(act, v, p);
    dact = act_grad_from_output(act, v, p);
    xhat = (y - ch.b) * ch.inv_w;
  } else {
    xhat = (v - ch.mean) * ch.invstd;
    dact = act_grad(act, xhat * ch.w + ch.b, p);
  }
}

// grad_in <- input gradient; sum_g[c] <- sum(g), sum_gx[c] <- sum(g * xhat) with g = grad_out * act'(y).
// `src` is the saved input (FromOutput = false) or the saved output (FromOutput = true); src, go and grad_in share
// the layout `l` and are dense in it.
template <bool FromOutput>
void bn_act_backward_kernel(const at::Tensor& go, const at::Tensor& src, const ChannelParams<double>& p,
                            bool training, const BnLayout& l, at::Tensor& grad_in, double* sum_g, double* sum_gx) {
  const int64_t N = l.N, C = l.C, inner = l.inner;
  const int64_t M = N * inner;
  const Act act = p.act;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_backward_cpu", [&] {
    using T = opmath_t<scalar_t>;
    const T ap = static_cast<T>(p.act_param);
    const double apd = p.act_param;
    const std::vector<Chan<T>> chans = load_channels<T>(p, C);
    const std::vector<Chan<double>> chans_d = load_channels<double>(p, C);
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    const scalar_t* g = go.const_data_ptr<scalar_t>();
    scalar_t* out = grad_in.mutable_data_ptr<scalar_t>();
    if (!l.channels_last) {
      // One channel per task: both passes over a channel's N slabs stay in one thread.
      at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const Chan<T> ch = chans[c];
          const Chan<double> chd = chans_d[c];
          double sg = 0.0, sgx = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            const scalar_t* sp = s + (n * C + c) * inner;
            const scalar_t* gp = g + (n * C + c) * inner;
            for (int64_t i = 0; i < inner; ++i) {
              double xhat, dact;
              recover<FromOutput>(act, apd, chd, static_cast<double>(sp[i]), xhat, dact);
              const double gg = static_cast<double>(gp[i]) * dact;
              sg += gg;
              sgx += gg * xhat;
            }
          }
          sum_g[c] = sg;
          sum_gx[c] = sgx;
          const T k = ch.w * ch.invstd;
          const T mg = (training && M > 0) ? static_cast<T>(sg / static_cast<double>(M)) : T(0);
          const T mgx = (training && M > 0) ? static_cast<T>(sgx / static_cast<double>(M)) : T(0);
          for (int64_t n = 0; n < N; ++n) {
            const scalar_t* sp = s + (n * C + c) * inner;
            const scalar_t* gp = g + (n * C + c) * inner;
            scalar_t* op = out + (n * C + c) * inner;
            for (int64_t i = 0; i < inner; ++i) {
              T xhat, dact;
              recover<FromOutput>(act, ap, ch, static_cast<T>(sp[i]), xhat, dact);
              op[i] = static_cast<scalar_t>(bn_act_dx<FromOutput>(k, static_cast<T>(gp[i]) * dact, mg, xhat, mgx));
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
            recover<FromOutput>(act, apd, chans_d[c], static_cast<double>(sr[c]), xhat, dact);
            const double gg = static_cast<double>(gr[c]) * dact;
            pg[c] += gg;
            pgx[c] += gg * xhat;
          }
        }
      }
    });
    std::vector<T> kc(static_cast<size_t>(C)), mg(static_cast<size_t>(C)), mgx(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      double sg = 0.0, sgx = 0.0;
      for (int64_t k = 0; k < chunks; ++k) {
        sg += partial[k * 2 * C + c];
        sgx += partial[k * 2 * C + C + c];
      }
      sum_g[c] = sg;
      sum_gx[c] = sgx;
      kc[c] = chans[c].w * chans[c].invstd;
      mg[c] = (training && M > 0) ? static_cast<T>(sg / static_cast<double>(M)) : T(0);
      mgx[c] = (training && M > 0) ? static_cast<T>(sgx / static_cast<double>(M)) : T(0);
    }
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1));
    at::parallel_for(0, M, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* sr = s + r * C;
        const scalar_t* gr = g + r * C;
        scalar_t* orow = out + r * C;
        for (int64_t c = 0; c < C; ++c) {
          T xhat, dact;
          recover<FromOutput>(act, ap, chans[c], static_cast<T>(sr[c]), xhat, dact);
          orow[c] = static_cast<scalar_t>(bn_act_dx<FromOutput>(kc[c], static_cast<T>(gr[c]) * dact, mg[c], xhat,
                                                                 mgx[c]));
        }
      }
    });
  });
}

// dst <- act((src - mean) * invstd * w + b); src and dst dense in layout `l`, same dtype; dst may be src (in place).
inline void bn_act_transform(const at::Tensor& src, at::Tensor& dst, const ChannelParams<double>& p,
                             const BnLayout& l) {
  const int64_t N = l.N, C = l.C, inner = l.inner;
  const Act act = p.act;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_transform_cpu", [&] {
    using T = opmath_t<scalar_t>;
    const T ap = static_cast<T>(p.act_param);
    const std::vector<Chan<T>> chans = load_channels<T>(p, C);
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    scalar_t* d = dst.mutable_data_ptr<scalar_t>();
    if (!l.channels_last) {
      // (n, c) planes of `inner` contiguous elements with one set of constants each.
      const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1));
      at::parallel_for(0, N * C, grain, [&](int64_t q0, int64_t q1) {
        for (int64_t q = q0; q < q1; ++q) {
          const Chan<T> ch = chans[q % C];
          const T scale = ch.invstd * ch.w;
          const T shift = ch.b - ch.mean * scale;
          const scalar_t* sp = s + q * inner;
          scalar_t* dp = d + q * inner;
          for (int64_t i = 0; i < inner; ++i) {
            dp[i] = static_cast<scalar_t>(act_forward(act, static_cast<T>(sp[i]) * scale + shift, ap));
          }
        }
      });
      return;
    }
    std::vector<T> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      scale[c] = chans[c].invstd * chans[c].w;
      shift[c] = chans[c].b - chans[c].mean * scale[c];
    }
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1));
    at::parallel_for(0, N * inner, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* sr = s + r * C;
        scalar_t* dr = d + r * C;
        for (int64_t c = 0; c < C; ++c) {
          dr[c] = static_cast<scalar_t>(act_forward(act, static_cast<T>(sr[c]) * scale[c] + shift[c], ap));
        }
      }
    });
  });
}

}  // namespace cpu
}  // namespace memsave
