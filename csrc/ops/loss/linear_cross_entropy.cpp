// memsave::linear_cross_entropy — cross_entropy(linear(hidden, weight, bias), target) without ever holding the
// [rows x classes] logits: they are made and consumed one tile at a time (at most tile_rows x tile_classes, see
// lce_tiles in linear_cross_entropy.h), in forward and again in backward, and what is kept for backward is one
// log-sum-exp per row.
//
//   linear_cross_entropy(hidden, weight, target, bias?, ignore_index, label_smoothing, reduction, tile_rows,
//                        tile_classes) -> (loss, lse)
//       hidden [..., H], weight [V, H], target [...] (int64), bias [V]. Per tile: logits = hidden_rows @ weight_tile^T
//       (+ bias_tile) by ATen's matmul, then cross_entropy_tile_lse_ folds the tile into each row's running
//       (max, sum of exp, linear part of the loss): an online log-sum-exp over the classes. loss: [] for 'mean'/'sum',
//       target's shape for 'none', in hidden's dtype. lse: [rows] float64 (8 bytes a row: the only tensor kept for
//       backward besides the inputs), -inf for ignored rows.
//   linear_cross_entropy_backward(grad_loss, hidden, weight, target, bias?, lse, ignore_index, label_smoothing,
//                                 reduction, output_mask, tile_rows, tile_classes) -> (grad_hidden, grad_weight,
//                                 grad_bias)
//       Per tile: the logits again, cross_entropy_tile_grad_ turns them in place into d(loss)/d(logits), then
//       grad_hidden_rows += g @ weight_tile and grad_weight_tile += g^T @ hidden_rows (one buffer each, float32 for
//       16-bit inputs while more than one tile contributes to it). Gradients not asked for by output_mask (and
//       grad_bias without bias) are empty tensors.
//   cross_entropy_tile_lse_(logits, target, state!, class_start, num_classes, ignore_index, label_smoothing)
//   cross_entropy_tile_grad_(logits!, target, lse, scale, class_start, num_classes, ignore_index, label_smoothing)
//       The tile kernels: CPU here, CUDA in linear_cross_entropy.cu, both on the math of cross_entropy_math.h.
//
// Loop order: classes outer, rows inner, so that the weight is read once per pass and, in backward, each
// grad_weight tile is finished before the next one starts.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif

#include "loss/cross_entropy_math.h"
#include "common/registration.h"
#include "loss/linear_cross_entropy.h"

namespace memsave {
namespace {

// ------------------------------------------------------------------------------------------ CPU tile kernels
// The row loops (cross_entropy_cpu.h), compiled once per instruction set.
namespace isa_default {
#include "loss/cross_entropy_cpu.h"
}  // namespace isa_default

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MEMSAVE_LCE_X86_CLONES 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace isa_avx2 {
#include "loss/cross_entropy_cpu.h"
}  // namespace isa_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")
namespace isa_avx512 {
#include "loss/cross_entropy_cpu.h"
}  // namespace isa_avx512
#pragma GCC pop_options
#endif

// The widest instruction set this CPU runs: 2 = AVX-512, 1 = AVX2 with FMA, 0 = the baseline; capped by
// ATEN_CPU_CAPABILITY=default|avx2|avx512 when set, as ATen's own kernels are (how the tests run every variant).
int cpu_isa() {
#ifdef MEMSAVE_LCE_X86_CLONES
  static const int isa = [] {
    __builtin_cpu_init();
    int best = 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
      best = 2;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      best = 1;
    }
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    if (cap != nullptr) {
      const std::string c(cap);
      if (c == "default")
        best = 0;
      else if (c == "avx2")
        best = std::min(best, 1);
    }
    return best;
  }();
  return isa;
#else
  return 0;
#endif
}

template <typename scalar_t, typename acc_t>
struct RowLoops {
  void (*lse_partials)(const scalar_t*, int64_t, bool, acc_t&, acc_t&, acc_t&);
  void (*grad)(scalar_t*, int64_t, LseParts<acc_t>, acc_t, acc_t);
};

template <typename scalar_t, typename acc_t>
RowLoops<scalar_t, acc_t> row_loops() {
#ifdef MEMSAVE_LCE_X86_CLONES
  switch (cpu_isa()) {
    case 2:
      return {&isa_avx512::row_lse_partials<scalar_t, acc_t>, &isa_avx512::row_grad<scalar_t, acc_t>};
    case 1:
      return {&isa_avx2::row_lse_partials<scalar_t, acc_t>, &isa_avx2::row_grad<scalar_t, acc_t>};
    default:
      break;
  }
#endif
  return {&isa_default::row_lse_partials<scalar_t, acc_t>, &isa_default::row_grad<scalar_t, acc_t>};
}

void cross_entropy_tile_lse_cpu(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& state,
                                int64_t class_start, int64_t num_classes, int64_t ignore_index,
                                double label_smoothing) {
  constexpr const char* op = "cross_entropy_tile_lse_";
  check_lce_tile_lse_args(logits, target, state, class_start, num_classes, op);
  const at::Tensor z = logits.contiguous();
  const at::Tensor t = target.contiguous();
  const int64_t rows = z.size(0), cols = z.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, z.scalar_type(), "memsave_cross_entropy_tile_lse_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* zp = z.const_data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    double* sp = state.mutable_data_ptr<double>();
    const double smooth = label_smoothing / static_cast<double>(num_classes);
    const double target_weight = 1.0 - label_smoothing;
    const RowLoops<scalar_t, acc_t> loops = row_loops<scalar_t, acc_t>();
    const bool with_sum_z = smooth != 0.0;
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t tr = tp[row];
        if (tr == ignore_index) continue;  // its loss is 0 whatever its logits: skip the exps
        const scalar_t* zr = zp + row * cols;
        acc_t m, s, sum_z;
        loops.lse_partials(zr, cols, with_sum_z, m, s, sum_z);
        double* st = sp + row * kLceStateCols;
        lse_merge(st[0], st[1], static_cast<double>(m), static_cast<double>(s));
        const bool here = tr >= class_start && tr < class_start + cols;
        const double z_target = here ? static_cast<double>(zr[tr - class_start]) : 0.0;
        st[2] += cross_entropy_linear_part(static_cast<double>(sum_z), z_target, here ? target_weight : 0.0, smooth);
      }
    });
  });
}

void cross_entropy_tile_grad_cpu(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                 const at::Tensor& scale, int64_t class_start, int64_t num_classes,
                                 int64_t ignore_index, double label_smoothing) {
  constexpr const char* op = "cross_entropy_tile_grad_";
  check_lce_tile_grad_args(logits, target, lse, scale, class_start, num_classes, op);
  const at::Tensor t = target.contiguous();
  const at::Tensor l = lse.contiguous();
  const at::Tensor sc = scale.contiguous();
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const int64_t scale_stride = sc.size(0) == 1 ? 0 : 1;
  const at::ScalarType dtype = logits.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "memsave_cross_entropy_tile_grad_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    scalar_t* zp = logits.mutable_data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    const double* lp = l.const_data_ptr<double>();
    const acc_t* sp = sc.const_data_ptr<acc_t>();
    const acc_t smooth = static_cast<acc_t>(label_smoothing / static_cast<double>(num_classes));
    const acc_t target_weight = static_cast<acc_t>(1.0 - label_smoothing);
    const RowLoops<scalar_t, acc_t> loops = row_loops<scalar_t, acc_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        scalar_t* zr = zp + row * cols;
        const int64_t tr = tp[row];
        if (tr == ignore_index) {
          std::fill(zr, zr + cols, scalar_t(0));
          continue;
        }
        const LseParts<acc_t> lr = split_lse<acc_t>(lp[row]);
        const acc_t s = sp[row * scale_stride];
        const bool here = tr >= class_start && tr < class_start + cols;
        const acc_t z_target = here ? static_cast<acc_t>(zr[tr - class_start]) : acc_t(0);
        loops.grad(zr, cols, lr, smooth, s);
        // The target's entry once more, with its (1 - eps): the same formula as the CUDA kernel's per element.
        if (here) {
          zr[tr - class_start] = static_cast<scalar_t>(cross_entropy_grad(z_target, lr, target_weight, smooth, s));
        }
      }
    });
  });
}

// ------------------------------------------------------------------------------------ forward and backward
void call_tile_lse(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& state, int64_t class_start,
                   int64_t num_classes, int64_t ignore_index, double label_smoothing) {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("memsave::cross_entropy_tile_lse_", "")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, double)>();
  handle.call(logits, target, state, class_start, num_classes, ignore_index, label_smoothing);
}

void call_tile_grad(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse, const at::Tensor& scale,
                    int64_t class_start, int64_t num_classes, int64_t ignore_index, double label_smoothing) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("memsave::cross_entropy_tile_grad_", "")
                                 .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                             int64_t, int64_t, int64_t, double)>();
  handle.call(logits, target, lse, scale, class_start, num_classes, ignore_index, label_smoothing);
}

// The logits of rows [r0, r0 + nr) and classes [c0, c0 + nc), as F.linear computes them (addmm with the bias).
at::Tensor tile_logits(const at::Tensor& h2, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  const at::Tensor hr = h2.narrow(0, r0, nr);
  const at::Tensor wt = weight.narrow(0, c0, nc).t();
  if (is_defined(bias)) return at::addmm(bias->narrow(0, c0, nc), hr, wt);
  return at::mm(hr, wt);
}

// a @ b for a tile's share of a gradient that more than one tile adds to (grad_hidden over class tiles, grad_weight
// over row tiles), added to a float32 accumulator for 16-bit inputs. The share is float32 itself, so it is not
// rounded to 16 bits before the accumulation (torch rounds its one matmul once; rounding every tile's share would
// err up to sqrt(tiles) times more): on CUDA cuBLAS with a float32 result (torch >= 2.8's mm with out_dtype); else,
// or if that refuses the inputs, widened tiles (on CPU about 1.4x the time of a bfloat16 matmul, and far faster than
// torch's CPU float16 matmul).
at::Tensor tile_product(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble) return at::mm(a, b);
#if defined(MEMSAVE_WITH_CUDA) && defined(TORCH_VERSION_MAJOR) && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 8)
  if (a.is_cuda()) {
    try {
      return at::mm(a, b, at::kFloat);
    } catch (const c10::Error&) {
      // fall through to the widened tiles
    }
  }
#endif
  return at::mm(a.to(at::kFloat), b.to(at::kFloat));
}

// Raises IndexError naming the first target that is neither a class index nor ignore_index (one device sync).
void check_targets(const at::Tensor& t, int64_t num_classes, int64_t ignore_index, const char* op) {
  if (t.numel() == 0) return;
  const at::Tensor bad = t.ne(ignore_index).logical_and_(t.lt(0).logical_or_(t.ge(num_classes)));
  if (!bad.any().item<bool>()) return;
  const int64_t index = at::nonzero(bad).select(1, 0)[0].item<int64_t>();
  TORCH_CHECK_INDEX(false, "memsave.", op, ": target holds ", t[index].item<int64_t>(), " at (flattened) index ", index,
                    ", which is neither a class index in [0, ", num_classes, ") nor ignore_index (", ignore_index, ")");
}

std::tuple<at::Tensor, at::Tensor> linear_cross_entropy_forward(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const c10::optional<at::Tensor>& bias,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction, int64_t tile_rows, int64_t tile_classes) {
  constexpr const char* op = "linear_cross_entropy";
  const LceShape s = check_linear_cross_entropy_args(hidden, weight, target, bias, label_smoothing, op);
  const LceReduction red = parse_lce_reduction(reduction, op);
  const LceTiles tiles = lce_tiles(s, tile_rows, tile_classes, op);
  // The caller (memsave.functional) already cast for autocast; the matmuls below must not be cast again.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor h2 = hidden.reshape({s.rows, s.hidden});
  const at::Tensor t = target.reshape({s.rows}).contiguous();
  check_targets(t, s.classes, ignore_index, op);

  at::Tensor state = at::zeros({s.rows, kLceStateCols}, hidden.options().dtype(at::kDouble));
  state.select(1, 0).fill_(-std::numeric_limits<double>::infinity());
  for (int64_t c0 = 0; c0 < s.classes; c0 += tiles.classes) {
    const int64_t nc = std::min(tiles.classes, s.classes - c0);
    for (int64_t r0 = 0; r0 < s.rows; r0 += tiles.rows) {
      const int64_t nr = std::min(tiles.rows, s.rows - r0);
      const at::Tensor logits = tile_logits(h2, weight, bias, r0, nr, c0, nc);
      call_tile_lse(logits, t.narrow(0, r0, nr), state.narrow(0, r0, nr), c0, s.classes, ignore_index, label_smoothing);
    }
  }
  // Rows and the reduction in float64 (see kLceStateCols); the loss is rounded to hidden's dtype once.
  const at::Tensor ignored = t.eq(ignore_index);
  const at::Tensor lse = state.select(1, 0).add(state.select(1, 1).log());
  at::Tensor row_loss = lse.sub(state.select(1, 2)).masked_fill_(ignored, 0);
  at::Tensor loss;
  switch (red) {
    case LceReduction::kNone:
      loss = row_loss.reshape(target.sizes());
      break;
    case LceReduction::kSum:
      loss = row_loss.sum();
      break;
    case LceReduction::kMean:
      loss = row_loss.sum().div(ignored.logical_not().sum());
      break;  // 0 / 0 = nan, as torch
  }
  return {loss.to(hidden.scalar_type()), lse.contiguous()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
    const c10::optional<at::Tensor>& bias, const at::Tensor& lse, int64_t ignore_index, double label_smoothing,
    c10::string_view reduction, std::array<bool, 3> output_mask, int64_t tile_rows, int64_t tile_classes) {
  constexpr const char* op = "linear_cross_entropy_backward";
  const LceShape s = check_linear_cross_entropy_args(hidden, weight, target, bias, label_smoothing, op);
  const LceReduction red = parse_lce_reduction(reduction, op);
  const LceTiles tiles = lce_tiles(s, tile_rows, tile_classes, op);
  const at::ScalarType acc = lce_acc_type(hidden.scalar_type());
  check_same_device(lse, "lse", hidden, "hidden", op);
  check_float_arg(grad_loss, "grad_loss", hidden, "hidden", op);
  TORCH_CHECK_VALUE(lse.dim() == 1 && lse.size(0) == s.rows && lse.scalar_type() == at::kDouble, "memsave.", op,
                    ": lse must be the forward's [", s.rows, "] float64 tensor, got ", lse.sizes(), " ",
                    lse.scalar_type());
  if (red == LceReduction::kNone) {
    TORCH_CHECK_VALUE(grad_loss.sizes().equals(target.sizes()), "memsave.", op,
                      ": with reduction='none' grad_loss must have target's shape ", target.sizes(), ", got ",
                      grad_loss.sizes());
  } else {
    TORCH_CHECK_VALUE(grad_loss.numel() == 1, "memsave.", op, ": with reduction='", reduction,
                      "' grad_loss must be a single value, got ", grad_loss.sizes());
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const bool need_h = output_mask[0], need_w = output_mask[1], need_b = output_mask[2] && is_defined(bias);
  const at::Tensor h2 = hidden.reshape({s.rows, s.hidden});
  const at::Tensor t = target.reshape({s.rows}).contiguous();
  const auto acc_opts = hidden.options().dtype(acc);

  // Each row's incoming gradient: grad_loss per row ('none'), or one value for all ('sum'; 'mean' divides it by
  // the number of rows that count, on the device, without a sync).
  at::Tensor scale;
  switch (red) {
    case LceReduction::kNone:
      scale = grad_loss.reshape({s.rows}).to(acc).contiguous();
      break;
    case LceReduction::kSum:
      scale = grad_loss.reshape({1}).to(acc);
      break;
    case LceReduction::kMean:
      scale = grad_loss.reshape({1}).to(acc).div(t.ne(ignore_index).sum()).to(acc);
      break;
  }

  const bool wide = acc != hidden.scalar_type() && acc == at::kFloat;  // 16-bit inputs: accumulate in float32
  const bool many_rows = tiles.rows < s.rows, many_classes = tiles.classes < s.classes;
  at::Tensor grad_h, grad_h_acc, grad_w, grad_b_acc;
  // With at least one row, every row tile meets the first class tile (classes >= 1), which writes its gradient
  // tiles with beta = 0: only the accumulators, and grad_weight without rows, start from zeros.
  if (need_h) {
    grad_h = at::empty({s.rows, s.hidden}, hidden.options());
    if (wide && many_classes) grad_h_acc = at::zeros({s.rows, s.hidden}, acc_opts);
  }
  if (need_w) {
    grad_w = at::empty({s.classes, s.hidden}, weight.options());
    if (s.rows == 0) grad_w.zero_();
  }
  if (need_b) grad_b_acc = at::zeros({s.classes}, hidden.options().dtype(at::kDouble));  // V doubles: exact sums

  if (s.rows > 0 && (need_h || need_w || need_b)) {
    for (int64_t c0 = 0; c0 < s.classes; c0 += tiles.classes) {
      const int64_t nc = std::min(tiles.classes, s.classes - c0);
      const at::Tensor w_tile = weight.narrow(0, c0, nc);
      at::Tensor grad_w_tile, grad_w_tile_acc;
      if (need_w) {
        grad_w_tile = grad_w.narrow(0, c0, nc);
        if (wide && many_rows) grad_w_tile_acc = at::zeros({nc, s.hidden}, acc_opts);
      }
      for (int64_t r0 = 0; r0 < s.rows; r0 += tiles.rows) {
        const int64_t nr = std::min(tiles.rows, s.rows - r0);
        at::Tensor g = tile_logits(h2, weight, bias, r0, nr, c0, nc);
        call_tile_grad(g, t.narrow(0, r0, nr), lse.narrow(0, r0, nr),
                       scale.size(0) == 1 ? scale : scale.narrow(0, r0, nr), c0, s.classes, ignore_index,
                       label_smoothing);
        const at::Tensor hr = h2.narrow(0, r0, nr);
        if (need_h) {
          if (grad_h_acc.defined()) {
            grad_h_acc.narrow(0, r0, nr).add_(tile_product(g, w_tile));
          } else {
            at::Tensor out = grad_h.narrow(0, r0, nr);
            if (c0 == 0)
              at::mm_out(out, g, w_tile);
            else
              out.addmm_(g, w_tile);
          }
        }
        if (need_w) {
          if (grad_w_tile_acc.defined()) {
            grad_w_tile_acc.add_(tile_product(g.t(), hr));
          } else if (r0 == 0) {
            at::mm_out(grad_w_tile, g.t(), hr);
          } else {
            grad_w_tile.addmm_(g.t(), hr);
          }
        }
        if (need_b) grad_b_acc.narrow(0, c0, nc).add_(g.sum(0, false, at::kDouble));
      }
      if (grad_w_tile_acc.defined()) grad_w_tile.copy_(grad_w_tile_acc);
    }
  }
  if (grad_h_acc.defined()) grad_h.copy_(grad_h_acc);
  const auto empty = [&](const at::Tensor& like) { return at::empty({0}, like.options()); };
  return {need_h ? grad_h.view(hidden.sizes()) : empty(hidden), need_w ? grad_w : empty(weight),
          need_b ? grad_b_acc.to(bias->scalar_type()) : empty(weight)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  // ATen matmuls plus the tile kernels (whose CUDA versions are in linear_cross_entropy.cu).
  def_cpu_and_cuda(m,
                   "linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias=None, "
                   "int ignore_index=-100, float label_smoothing=0.0, str reduction=\"mean\", int tile_rows=0, "
                   "int tile_classes=0) -> (Tensor, Tensor)",
                   &linear_cross_entropy_forward);
  def_cpu_and_cuda(m,
                   "linear_cross_entropy_backward(Tensor grad_loss, Tensor hidden, Tensor weight, Tensor target, "
                   "Tensor? bias, Tensor lse, int ignore_index, float label_smoothing, str reduction, "
                   "bool[3] output_mask, int tile_rows=0, int tile_classes=0) -> (Tensor, Tensor, Tensor)",
                   &linear_cross_entropy_backward);
  m.def(
      "cross_entropy_tile_lse_(Tensor logits, Tensor target, Tensor(a!) state, int class_start, int num_classes, "
      "int ignore_index, float label_smoothing) -> ()");
  m.def(
      "cross_entropy_tile_grad_(Tensor(a!) logits, Tensor target, Tensor lse, Tensor scale, int class_start, "
      "int num_classes, int ignore_index, float label_smoothing) -> ()");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("cross_entropy_tile_lse_", &cross_entropy_tile_lse_cpu);
  m.impl("cross_entropy_tile_grad_", &cross_entropy_tile_grad_cpu);
}

}  // namespace memsave
