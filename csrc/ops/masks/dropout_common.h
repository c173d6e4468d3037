// What memsave::dropout's CPU and CUDA kernels share: names, argument checks and the scale applied to kept elements.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace memsave {

inline void check_dropout_probability(double p, const char* op) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "memsave.", op, ": dropout probability has to be between 0 and 1, but got ", p);
}

// dropout's operators and their scalar check, as its CPU and CUDA kernels register them.
struct DropoutOp {
  static constexpr const char* kNames[3] = {"dropout", "dropout_", "dropout_backward"};
  static void check(double p, const char* op) { check_dropout_probability(p, op); }
};

// The factor kept elements are multiplied by, as torch's CPU dropout computes it: 1 / (1 - p) in the op-math type,
// rounded to the tensor's dtype (torch builds a noise tensor of that dtype), returned exactly as a double.
inline double dropout_scale(at::ScalarType dtype, double p) {
  double scale = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "memsave_dropout_scale", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t s = static_cast<scalar_t>(opmath_t(1) / static_cast<opmath_t>(1.0 - p));
    scale = static_cast<double>(static_cast<opmath_t>(s));
  });
  return scale;
}

}  // namespace memsave
