// memsave._C: the pybind11 module. It binds what does not take tensors (build facts, the planner); tensor
// operators are registered with the PyTorch dispatcher (TORCH_LIBRARY in csrc/ops/<family>/<op>.cpp) when this library
// loads.
#include <pybind11/pybind11.h>

#include "planner_bindings.h"

#ifdef MEMSAVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;

namespace {

py::dict build_info() {
  py::dict info;
  info["version"] = MEMSAVE_VERSION;
  info["torch_version"] = MEMSAVE_TORCH_VERSION;
#ifdef MEMSAVE_WITH_CUDA
  info["cuda"] = true;
  info["cuda_archs"] = MEMSAVE_CUDA_ARCHS;
  info["cuda_runtime_version"] = CUDART_VERSION;
#else
  info["cuda"] = false;
  info["cuda_archs"] = "";
  info["cuda_runtime_version"] = py::none();
#endif
#ifdef _OPENMP
  info["openmp"] = true;  // at::parallel_for splits CPU kernels over torch's intra-op threads
#else
  info["openmp"] = false;
#endif
#if defined(__clang__)
  info["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
  info["compiler"] = "gcc " __VERSION__;
#else
  info["compiler"] = "unknown";
#endif
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "memsave's compiled core: build facts and the checkpoint planner (operators live in torch.ops.memsave)";
  m.def("build_info", &build_info,
        "The facts memsave was built with: version, torch_version, cuda (bool), cuda_archs, cuda_runtime_version, "
        "openmp (CPU kernels parallel over torch's threads), compiler.");
  memsave::bind_planner(m);
}
