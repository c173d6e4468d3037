// Shared by linear_cross_entropy.cpp and linear_cross_entropy.cu: argument checks, the reduction names and the tile
// sizes of memsave::linear_cross_entropy and of its two tile kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include "common/checks.h"

namespace memsave {

// Rows (the product of hidden's leading dimensions), hidden size and number of classes.
struct LceShape {
  int64_t rows;
  int64_t hidden;
  int64_t classes;
};

enum class LceReduction { kNone, kMean, kSum };

inline LceReduction parse_lce_reduction(c10::string_view reduction, const char* op) {
  if (reduction == "mean") return LceReduction::kMean;
  if (reduction == "sum") return LceReduction::kSum;
  if (reduction == "none") return LceReduction::kNone;
  TORCH_CHECK_VALUE(false, "memsave.", op, ": reduction must be 'mean', 'sum' or 'none', got '", reduction, "'");
}

// Checks what the forward and the backward take alike; names the offending argument.
inline LceShape check_linear_cross_entropy_args(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& target, const c10::optional<at::Tensor>& bias,
                                                double label_smoothing, const char* op) {
  TORCH_CHECK_TYPE(at::isFloatingType(hidden.scalar_type()), "memsave.", op,
                   ": hidden must be a floating-point tensor (float32, float64, float16 or bfloat16), got ",
                   hidden.scalar_type());
  TORCH_CHECK_VALUE(hidden.dim() >= 1, "memsave.", op, ": hidden must have at least one dimension (..., in_features)");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == hidden.size(-1), "memsave.", op,
                    ": weight must have shape [num_classes, ", hidden.size(-1), "] (hidden's last dimension), got ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight.size(0) >= 1, "memsave.", op, ": weight must have at least one class (row), got ",
                    weight.sizes());
  TORCH_CHECK_TYPE(weight.scalar_type() == hidden.scalar_type(), "memsave.", op, ": weight has dtype ",
                   weight.scalar_type(), " but hidden has ", hidden.scalar_type(), "; give both the same dtype");
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong, "memsave.", op,
                   ": target must hold int64 (torch.long) class indices, got ", target.scalar_type());
  TORCH_CHECK_VALUE(target.sizes().equals(hidden.sizes().slice(0, hidden.dim() - 1)), "memsave.", op,
                    ": target must have hidden's leading shape ", hidden.sizes().slice(0, hidden.dim() - 1),
                    " (one class index per row of hidden), got ", target.sizes());
  check_same_device(weight, "weight", hidden, "hidden", op);
  check_same_device(target, "target", hidden, "hidden", op);
  if (is_defined(bias)) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "memsave.", op, ": bias must have shape [",
                      weight.size(0), "] (one entry per class), got ", bias->sizes());
    TORCH_CHECK_TYPE(bias->scalar_type() == hidden.scalar_type(), "memsave.", op, ": bias has dtype ",
                     bias->scalar_type(), " but hidden has ", hidden.scalar_type());
    check_same_device(*bias, "bias", hidden, "hidden", op);
  }
  TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, "memsave.", op,
                    ": label_smoothing must be in [0, 1], got ", label_smoothing);
  return LceShape{target.numel(), hidden.size(-1), weight.size(0)};
}

// Tiles of the logits: the forward and the backward visit [rows x classes] in tiles of at most tile_rows x
// tile_classes, which is the only place logits ever live. Default: no more logits per tile than hidden has
// elements (a tile never outweighs the input it is made from, so a small head peaks no higher than a chunked loss
// whose chunks match the input), within [kLceMinTileElements, kLceTileElements] (4 Mi: 16 MiB in float32); all
// rows at once up to budget / kLceMinTileClasses, and at least kLceMinTileClasses classes so that each tile's
// matmul stays large enough to run at full speed. Explicit tile_rows / tile_classes (tests use small ones) override.
constexpr int64_t kLceTileElements = int64_t{1} << 22;
constexpr int64_t kLceMinTileElements = int64_t{1} << 16;
constexpr int64_t kLceMinTileClasses = 256;

// The default number of logits per tile for `rows` x `hidden` inputs (see above).
inline int64_t lce_tile_elements(int64_t rows, int64_t hidden) {
  const int64_t input = rows > 0 && hidden > kLceTileElements / rows ? kLceTileElements : rows * hidden;
  return std::min(kLceTileElements, std::max(kLceMinTileElements, input));
}

struct LceTiles {
  int64_t rows;
  int64_t classes;
};

inline LceTiles lce_tiles(const LceShape& s, int64_t tile_rows, int64_t tile_classes, const char* op) {
  TORCH_CHECK_VALUE(tile_rows >= 0 && tile_classes >= 0, "memsave.", op,
                    ": tile_rows and tile_classes must be >= 0 (0: automatic), got ", tile_rows, " and ", tile_classes);
  const int64_t budget = lce_tile_elements(s.rows, s.hidden);
  const int64_t rows =
      std::max<int64_t>(1, tile_rows > 0 ? std::min(tile_rows, s.rows) : std::min(s.rows, budget / kLceMinTileClasses));
  const int64_t classes = tile_classes > 0 ? std::min(tile_classes, s.classes)
                                           : std::min(s.classes, std::max(kLceMinTileClasses, budget / rows));
  return LceTiles{rows, classes};
}

// Checks of the tile kernels' arguments (CPU and CUDA): a [rows, width] tile of logits whose first column is class
// class_start, the rows' targets, and a per-row tensor (state or lse).
inline void check_lce_tile_args(const at::Tensor& logits, const at::Tensor& target, int64_t class_start,
                                int64_t num_classes, const char* op) {
  TORCH_CHECK_VALUE(logits.dim() == 2, "memsave.", op, ": logits must be a [rows, classes] tile, got ", logits.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(logits.scalar_type()), "memsave.", op, ": logits must be floating-point, got ",
                   logits.scalar_type());
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong, "memsave.", op, ": target must be int64, got ",
                   target.scalar_type());
  TORCH_CHECK_VALUE(target.dim() == 1 && target.size(0) == logits.size(0), "memsave.", op,
                    ": target must hold one class index per logits row (", logits.size(0), "), got ", target.sizes());
  // Written so that nothing overflows: class_start + width could wrap around for a class_start near INT64_MAX.
  const int64_t width = logits.size(1);
  TORCH_CHECK_VALUE(num_classes >= 1, "memsave.", op, ": num_classes must be >= 1, got ", num_classes);
  TORCH_CHECK_VALUE(class_start >= 0 && width <= num_classes && class_start <= num_classes - width, "memsave.", op,
                    ": the tile's ", width, " classes starting at class_start=", class_start,
                    " must lie in [0, num_classes=", num_classes, ")");
  check_same_device(target, "target", logits, "logits", op);
}

// float for 16-bit and float32 logits, double for double: the type the tile kernels compute in (and scale's).
inline at::ScalarType lce_acc_type(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

// A per-row tensor of a tile kernel: [rows] or [1] (cols == 0: lse, scale) or a contiguous [rows, cols] (state).
inline void check_lce_row_tensor(const at::Tensor& t, const at::Tensor& logits, int64_t cols, at::ScalarType want,
                                 const char* name, const char* op) {
  TORCH_CHECK_TYPE(t.scalar_type() == want, "memsave.", op, ": ", name, " must be ", want, " for ",
                   logits.scalar_type(), " logits, got ", t.scalar_type());
  check_same_device(t, name, logits, "logits", op);
  if (cols == 0) {
    TORCH_CHECK_VALUE(t.dim() == 1 && (t.size(0) == logits.size(0) || t.size(0) == 1), "memsave.", op, ": ", name,
                      " must hold one value per logits row (", logits.size(0), ") or one for all, got ", t.sizes());
  } else {
    TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == logits.size(0) && t.size(1) == cols && t.is_contiguous(), "memsave.",
                      op, ": ", name, " must be a contiguous [", logits.size(0), ", ", cols, "] tensor, got ",
                      t.sizes());
  }
}

// Columns of the forward's running per-row state: max, sum of exp(z - max), linear part of the loss. float64 for
// every input dtype: a tile's partial results are float32 sums (for 16-bit and float32 logits), merged across tiles
// and turned into the loss in float64, so that the loss is rounded to float32 once.
constexpr int64_t kLceStateCols = 3;

// The arguments of cross_entropy_tile_lse_ (CPU and CUDA).
inline void check_lce_tile_lse_args(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& state,
                                    int64_t class_start, int64_t num_classes, const char* op) {
  check_lce_tile_args(logits, target, class_start, num_classes, op);
  check_lce_row_tensor(state, logits, kLceStateCols, at::kDouble, "state", op);
}

// The arguments of cross_entropy_tile_grad_ (CPU and CUDA).
inline void check_lce_tile_grad_args(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                     const at::Tensor& scale, int64_t class_start, int64_t num_classes,
                                     const char* op) {
  check_lce_tile_args(logits, target, class_start, num_classes, op);
  TORCH_CHECK_VALUE(logits.is_contiguous(), "memsave.", op, ": logits must be contiguous (it is overwritten)");
  check_lce_row_tensor(lse, logits, 0, at::kDouble, "lse", op);
  check_lce_row_tensor(scale, logits, 0, lce_acc_type(logits.scalar_type()), "scale", op);
  TORCH_CHECK_VALUE(lse.size(0) == logits.size(0), "memsave.", op, ": lse must hold one value per logits row");
}

}  // namespace memsave
