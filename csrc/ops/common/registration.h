// Operator registration shared by the operator families.
#pragma once

#include <cstring>
#include <string>

#include <torch/library.h>

namespace memsave {

// Defines the operator `schema` (from the family's TORCH_LIBRARY_FRAGMENT) with `fn` as its kernel for CPU and, in a
// CUDA build, CUDA: for kernels composed of ATen and memsave operators, which dispatch on the device themselves.
// Not CompositeExplicitAutograd: that key would also claim other devices (which should get the dispatcher's
// "no kernel" error), and memsave.dispatch_table lists kernels by device key.
template <typename Func>
void def_cpu_and_cuda(torch::Library& m, const char* schema, Func* fn) {
  m.def(schema);
  const std::string name(schema, std::strchr(schema, '('));
  m.impl(name.c_str(), c10::DispatchKey::CPU, fn);
#ifdef MEMSAVE_WITH_CUDA
  m.impl(name.c_str(), c10::DispatchKey::CUDA, fn);
#endif
}

}  // namespace memsave
