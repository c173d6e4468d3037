// Memory-layout helpers shared by memsave's kernels: results keep the memory format of the input, as torch's do.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/ArrayRef.h>

namespace memsave {

// `t` with exactly `strides`: `t` itself when it has them, else a copy (same values).
inline at::Tensor with_strides(const at::Tensor& t, c10::IntArrayRef strides) {
  if (t.strides() == strides) return t;
  return at::empty_strided(t.sizes(), strides, t.options()).copy_(t);
}

}  // namespace memsave
