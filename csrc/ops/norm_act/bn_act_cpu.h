// CPU kernels shared by batch_norm_act and inplace_abn: the fused backward (recover xhat and act' per element,
// reduce per channel, write the input gradient) and the "normalize + activate" transform (inplace_abn's forward,
// batch_norm_act_apply's recompute). Per element they run bn_act_math.h's functions, as the CUDA kernels do.
//
// Speed: the activation is a template parameter (no switch in the inner loops), per-channel constants live in
// locals or separate arrays, and reductions use kLanes independent accumulators, so the compiler can vectorize the
// simple activations. Precision: element math in float (double for double inputs); products enter the
// reductions in double, since sum(g * xhat) can cancel heavily.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_math.h"

namespace memsave {
namespace cpu {

// Rows of a channels-last tensor are reduced in at most this many fixed chunks, so the summation order (and the
// result) does not depend on the number of threads.
constexpr int64_t kMaxReduceChunks = 64;
// Independent accumulators per reduction (a multiple of any SIMD width used for double).
constexpr int kLanes = 8;

template <typename scalar_t>
using opmath_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// Calls f(std::integral_constant<Act, a>{}): the activation becomes a compile-time constant inside f.
template <typename F>
inline void with_act(Act a, const F& f) {
  with_act_among<Act::Identity, Act::ReLU, Act::LeakyReLU, Act::ELU, Act::GELU, Act::GELUTanh, Act::SiLU>(a, f);
}

// Per-channel constants as separate arrays (structure of arrays: channels-last rows vectorize across channels).
template <typename T>
struct Channels {
  std::vector<T> mean, invstd, w, b, inv_w, k;  // k = w * invstd
  Channels(const ChannelParams<double>& p, int64_t C) : mean(C), invstd(C), w(C), b(C), inv_w(C), k(C) {
    for (int64_t c = 0; c < C; ++c) {
      mean[c] = p.mean ? static_cast<T>(p.mean[c]) : T(0);
      invstd[c] = static_cast<T>(p.invstd[c]);
      w[c] = static_cast<T>(p.weight[c]);
      b[c] = static_cast<T>(p.bias[c]);
      inv_w[c] = p.inv_weight ? static_cast<T>(p.inv_weight[c]) : T(0);
      k[c] = static_cast<T>(p.weight[c] * p.invstd[c]);
    }
  }
};

// grad_in <- input gradient; sum_g[c] <- sum(g), sum_gx[c] <- sum(g * xhat) with g = grad_out * act'(y).
// `src` is the saved input (FromOutput = false) or the saved output (FromOutput = true); src, go and grad_in share
// the layout `l` and are dense in it.
template <bool FromOutput>
void bn_act_backward_kernel(const at::Tensor& go, const at::Tensor& src, const ChannelParams<double>& p, bool training,
                            const BnLayout& l, at::Tensor& grad_in, double* sum_g, double* sum_gx) {
  const int64_t N = l.N, C = l.C, inner = l.inner;
  const int64_t M = N * inner;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_backward_cpu", [&] {
    using T = opmath_t<scalar_t>;
    const T ap = static_cast<T>(p.act_param);
    const Channels<T> ch(p, C);
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    const scalar_t* g = go.const_data_ptr<scalar_t>();
    scalar_t* out = grad_in.mutable_data_ptr<scalar_t>();
    with_act(p.act, [&](auto act_tag) {
      constexpr Act A = decltype(act_tag)::value;
      if (!l.channels_last) {
        // One channel per task: both passes over a channel's N slabs stay in one thread.
        at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c) {
            const T mean = ch.mean[c], invstd = ch.invstd[c], w = ch.w[c], b = ch.b[c], inv_w = ch.inv_w[c];
            double acc_g[kLanes] = {}, acc_gx[kLanes] = {};
            for (int64_t n = 0; n < N; ++n) {
              const scalar_t* sp = s + (n * C + c) * inner;
              const scalar_t* gp = g + (n * C + c) * inner;
              int64_t i = 0;
              for (; i + kLanes <= inner; i += kLanes) {
                for (int j = 0; j < kLanes; ++j) {
                  T xhat, dact;
                  bn_act_recover<FromOutput>(A, ap, mean, invstd, w, b, inv_w, static_cast<T>(sp[i + j]), xhat, dact);
                  const double gg = static_cast<double>(static_cast<T>(gp[i + j]) * dact);
                  acc_g[j] += gg;
                  acc_gx[j] += gg * static_cast<double>(xhat);
                }
              }
              for (; i < inner; ++i) {
                T xhat, dact;
                bn_act_recover<FromOutput>(A, ap, mean, invstd, w, b, inv_w, static_cast<T>(sp[i]), xhat, dact);
                const double gg = static_cast<double>(static_cast<T>(gp[i]) * dact);
                acc_g[0] += gg;
                acc_gx[0] += gg * static_cast<double>(xhat);
              }
            }
            double sg = 0.0, sgx = 0.0;
            for (int j = 0; j < kLanes; ++j) {
              sg += acc_g[j];
              sgx += acc_gx[j];
            }
            sum_g[c] = sg;
            sum_gx[c] = sgx;
            const T k = ch.k[c];
            const T mg = (training && M > 0) ? static_cast<T>(sg / static_cast<double>(M)) : T(0);
            const T mgx = (training && M > 0) ? static_cast<T>(sgx / static_cast<double>(M)) : T(0);
            for (int64_t n = 0; n < N; ++n) {
              const scalar_t* sp = s + (n * C + c) * inner;
              const scalar_t* gp = g + (n * C + c) * inner;
              scalar_t* op = out + (n * C + c) * inner;
              for (int64_t i = 0; i < inner; ++i) {
                T xhat, dact;
                bn_act_recover<FromOutput>(A, ap, mean, invstd, w, b, inv_w, static_cast<T>(sp[i]), xhat, dact);
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
      const T* mean = ch.mean.data();
      const T* invstd = ch.invstd.data();
      const T* w = ch.w.data();
      const T* b = ch.b.data();
      const T* inv_w = ch.inv_w.data();
      at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          double* pg = partial.data() + k * 2 * C;
          double* pgx = pg + C;
          const int64_t r1 = std::min(M, (k + 1) * rows_per_chunk);
          for (int64_t r = k * rows_per_chunk; r < r1; ++r) {
            const scalar_t* sr = s + r * C;
            const scalar_t* gr = g + r * C;
            for (int64_t c = 0; c < C; ++c) {
              T xhat, dact;
              bn_act_recover<FromOutput>(A, ap, mean[c], invstd[c], w[c], b[c], inv_w[c], static_cast<T>(sr[c]), xhat,
                                         dact);
              const double gg = static_cast<double>(static_cast<T>(gr[c]) * dact);
              pg[c] += gg;
              pgx[c] += gg * static_cast<double>(xhat);
            }
          }
        }
      });
      std::vector<T> mg(static_cast<size_t>(C)), mgx(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) {
        double sg = 0.0, sgx = 0.0;
        for (int64_t k = 0; k < chunks; ++k) {
          sg += partial[k * 2 * C + c];
          sgx += partial[k * 2 * C + C + c];
        }
        sum_g[c] = sg;
        sum_gx[c] = sgx;
        mg[c] = (training && M > 0) ? static_cast<T>(sg / static_cast<double>(M)) : T(0);
        mgx[c] = (training && M > 0) ? static_cast<T>(sgx / static_cast<double>(M)) : T(0);
      }
      const T* kc = ch.k.data();
      const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1));
      at::parallel_for(0, M, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* sr = s + r * C;
          const scalar_t* gr = g + r * C;
          scalar_t* orow = out + r * C;
          for (int64_t c = 0; c < C; ++c) {
            T xhat, dact;
            bn_act_recover<FromOutput>(A, ap, mean[c], invstd[c], w[c], b[c], inv_w[c], static_cast<T>(sr[c]), xhat,
                                       dact);
            orow[c] =
                static_cast<scalar_t>(bn_act_dx<FromOutput>(kc[c], static_cast<T>(gr[c]) * dact, mg[c], xhat, mgx[c]));
          }
        }
      });
    });
  });
}

// dst <- act((src - mean) * invstd * w + b); src and dst dense in layout `l`, same dtype; dst may be src (in place).
inline void bn_act_transform(const at::Tensor& src, at::Tensor& dst, const ChannelParams<double>& p,
                             const BnLayout& l) {
  const int64_t N = l.N, C = l.C, inner = l.inner;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "memsave_bn_act_transform_cpu", [&] {
    using T = opmath_t<scalar_t>;
    const T ap = static_cast<T>(p.act_param);
    // y = x * scale + shift with scale = invstd * w, shift = b - mean * scale, as torch's batch norm computes it.
    std::vector<T> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const double sc = p.invstd[c] * p.weight[c];
      scale[c] = static_cast<T>(sc);
      shift[c] = static_cast<T>(p.bias[c] - p.mean[c] * sc);
    }
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    scalar_t* d = dst.mutable_data_ptr<scalar_t>();
    with_act(p.act, [&](auto act_tag) {
      constexpr Act A = decltype(act_tag)::value;
      if (!l.channels_last) {
        // (n, c) planes of `inner` contiguous elements with one set of constants each.
        const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1));
        at::parallel_for(0, N * C, grain, [&](int64_t q0, int64_t q1) {
          for (int64_t q = q0; q < q1; ++q) {
            const T sc = scale[q % C], sh = shift[q % C];
            const scalar_t* sp = s + q * inner;
            scalar_t* dp = d + q * inner;
            for (int64_t i = 0; i < inner; ++i) {
              dp[i] = static_cast<scalar_t>(act_forward(A, bn_act_affine_cpu(static_cast<T>(sp[i]), sc, sh), ap));
            }
          }
        });
        return;
      }
      const T* sc = scale.data();
      const T* sh = shift.data();
      const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1));
      at::parallel_for(0, N * inner, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* sr = s + r * C;
          scalar_t* dr = d + r * C;
          for (int64_t c = 0; c < C; ++c) {
            dr[c] = static_cast<scalar_t>(act_forward(A, bn_act_affine_cpu(static_cast<T>(sr[c]), sc[c], sh[c]), ap));
          }
        }
      });
    });
  });
}

// The CPU kernels behind bn_act_common.h's host functions; per-channel constants in double.
struct BnActKernels {
  static at::ScalarType acc_dtype(const at::Tensor&) { return at::kDouble; }

  static void transform(const at::Tensor& src, at::Tensor& dst, const ChannelTensors& ct, Act act, double act_param,
                        const BnLayout& l) {
    bn_act_transform(src, dst, ct.params<double>(act, act_param), l);
  }

  // sums: [2, C] double, receives (sum(g), sum(g * xhat)).
  template <bool FromOutput>
  static void backward(const at::Tensor& go, const at::Tensor& src, const ChannelTensors& ct, Act act, double act_param,
                       bool training, const BnLayout& l, at::Tensor& grad_in, at::Tensor& sums) {
    double* sum_g = sums.mutable_data_ptr<double>();
    bn_act_backward_kernel<FromOutput>(go, src, ct.params<double>(act, act_param), training, l, grad_in, sum_g,
                                       sum_g + l.C);
  }
};

}  // namespace cpu
}  // namespace memsave
