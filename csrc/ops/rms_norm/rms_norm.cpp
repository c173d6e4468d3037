// memsave::rms_norm — RMSNorm over the last dimension that keeps its input and one float per row (the reciprocal
// RMS) for backward. Hugging Face's LlamaRMSNorm, run eagerly, keeps a float32 copy of a 16-bit input, the float32
// normalized tensor and the rounded normalized tensor; torch's nn.RMSNorm keeps similar intermediates.
//
//   rms_norm(input, weight?, eps) -> (out, rstd)
//       out = weight * (input.float() * rstd).to(input dtype), in promote(input dtype, weight dtype) — LlamaRMSNorm's
//       formula (rms_norm_math.h); rstd = 1 / sqrt(mean(input.float()^2) + eps) per row, float (double for double),
//       shape input.shape[:-1].
//   rms_norm_backward(grad_out, input, rstd, weight?, output_mask) -> (grad_input, grad_weight)
//       One pass per row for the input gradient, per-chunk partial sums for the weight gradient. A gradient that
//       output_mask does not ask for (or of an absent weight) is an empty tensor.
//
// CPU kernels here, CUDA kernels in rms_norm.cu; both run rms_norm_math.h per element. CPU reductions (the sum of
// squares, sum(g * n), the weight gradient's chunks) accumulate in double: they are what decides how close to a
// float64 reference a float32 result lands. The weight gradient sums fixed chunks of rows, so it does not depend on
// the number of threads.
#include <algorithm>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "rms_norm/rms_norm.h"
#include "rms_norm/rms_norm_math.h"

namespace memsave {
namespace {

// The weight gradient is summed over at most this many fixed chunks of rows.
constexpr int64_t kMaxWeightGradChunks = 64;

std::tuple<at::Tensor, at::Tensor> rms_norm_cpu(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                                                double eps) {
  const RmsForward f = rms_norm_prepare(input, weight, eps);
  const RmsShape s = f.s;
  const at::Tensor &x = f.x, &w = f.w, &out = f.out, &rstd = f.rstd;
  const bool has_w = w.defined();
  if (s.rows == 0) return {out, rstd};
  const int64_t cols = s.cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_rms_norm_cpu", [&] {
    using in_t = scalar_t;
    using acc_t = at::opmath_type<in_t>;
    const in_t* xp = x.const_data_ptr<in_t>();
    const acc_t* wp = has_w ? w.const_data_ptr<acc_t>() : nullptr;
    acc_t* rp = rstd.mutable_data_ptr<acc_t>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "memsave_rms_norm_cpu_out", [&] {
      scalar_t* yp = out.mutable_data_ptr<scalar_t>();
      const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
      at::parallel_for(0, s.rows, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t row = r0; row < r1; ++row) {
          const in_t* xr = xp + row * cols;
          double sum_sq = 0;
          for (int64_t j = 0; j < cols; ++j) {
            const double v = static_cast<double>(static_cast<acc_t>(xr[j]));
            sum_sq += v * v;
          }
          const acc_t r = rms_norm_rstd<acc_t>(static_cast<acc_t>(sum_sq), cols, static_cast<acc_t>(eps));
          rp[row] = r;
          scalar_t* yr = yp + row * cols;
          for (int64_t j = 0; j < cols; ++j) {
            yr[j] = static_cast<scalar_t>(
                rms_norm_element<in_t, acc_t>(static_cast<acc_t>(xr[j]), r, wp ? wp[j] : acc_t(1)));
          }
        }
      });
    });
  });
  return {rms_in_input_layout(out, x, input), rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad_out, const at::Tensor& input,
                                                         const at::Tensor& rstd,
                                                         const c10::optional<at::Tensor>& weight,
                                                         std::array<bool, 2> output_mask) {
  const RmsBackward b = rms_norm_backward_prepare(grad_out, input, rstd, weight, output_mask[0]);
  const RmsShape s = b.s;
  const at::Tensor &x = b.x, &go = b.go, &r = b.rstd, &w = b.w, &grad_input = b.grad_input;
  const bool has_w = w.defined();
  const bool need_gi = output_mask[0], need_gw = output_mask[1] && has_w;
  const int64_t rows = s.rows, cols = s.cols;
  const int64_t chunk_rows = std::max<int64_t>(1, (rows + kMaxWeightGradChunks - 1) / kMaxWeightGradChunks);
  const int64_t chunks = rows == 0 ? 0 : (rows + chunk_rows - 1) / chunk_rows;
  at::Tensor partial = need_gw ? at::zeros({chunks, cols}, input.options().dtype(at::kDouble)) : at::Tensor();
  if (rows > 0 && (need_gi || need_gw)) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "memsave_rms_norm_backward_cpu", [&] {
      using in_t = scalar_t;
      using acc_t = at::opmath_type<in_t>;
      const in_t* xp = x.const_data_ptr<in_t>();
      const acc_t* rp = r.const_data_ptr<acc_t>();
      const acc_t* wp = has_w ? w.const_data_ptr<acc_t>() : nullptr;
      in_t* gip = need_gi ? grad_input.mutable_data_ptr<in_t>() : nullptr;
      double* pp = need_gw ? partial.mutable_data_ptr<double>() : nullptr;
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, go.scalar_type(), "memsave_rms_norm_backward_go", [&] {
        const scalar_t* gp = go.const_data_ptr<scalar_t>();
        at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
          for (int64_t chunk = c0; chunk < c1; ++chunk) {
            double* pr = pp ? pp + chunk * cols : nullptr;
            const int64_t end = std::min(rows, (chunk + 1) * chunk_rows);
            for (int64_t row = chunk * chunk_rows; row < end; ++row) {
              const in_t* xr = xp + row * cols;
              const scalar_t* gr = gp + row * cols;
              const acc_t rs = rp[row];
              if (gip != nullptr) {
                double dot = 0;
                for (int64_t j = 0; j < cols; ++j) {
                  const acc_t g = static_cast<acc_t>(gr[j]) * (wp ? wp[j] : acc_t(1));
                  dot += static_cast<double>(g) * static_cast<double>(static_cast<acc_t>(xr[j]) * rs);
                }
                const acc_t mean_gn = static_cast<acc_t>(dot / static_cast<double>(cols));
                in_t* gi = gip + row * cols;
                for (int64_t j = 0; j < cols; ++j) {
                  const acc_t g = static_cast<acc_t>(gr[j]) * (wp ? wp[j] : acc_t(1));
                  gi[j] = static_cast<in_t>(rms_norm_grad_input<acc_t>(g, static_cast<acc_t>(xr[j]) * rs, rs, mean_gn));
                }
              }
              if (pr != nullptr) {
                for (int64_t j = 0; j < cols; ++j) {
                  pr[j] += static_cast<double>(static_cast<acc_t>(gr[j])) *
                           static_cast<double>(rms_norm_hidden<in_t, acc_t>(static_cast<acc_t>(xr[j]), rs));
                }
              }
            }
          }
        });
      });
    });
  }
  at::Tensor grad_weight;
  if (need_gw) {
    grad_weight = rows == 0 ? at::zeros({cols}, weight->options()) : at::sum(partial, 0).to(weight->scalar_type());
  } else {
    grad_weight = at::empty({0}, input.options());
  }
  return {rms_in_input_layout(grad_input, x, input), grad_weight};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def("rms_norm(Tensor input, Tensor? weight, float eps) -> (Tensor, Tensor)");
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor input, Tensor rstd, Tensor? weight, bool[2] output_mask) "
      "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("rms_norm_backward", &rms_norm_backward_cpu);
}

}  // namespace memsave
