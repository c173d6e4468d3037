// memsave::batch_norm_act_backward on CUDA: the host side shared with the CPU (bn_act_common.h) over the CUDA kernels
// of bn_act_kernels.cuh (schemas, forward and CPU registration: batch_norm_act.cpp).
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_kernels.cuh"

namespace memsave {

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("batch_norm_act_backward", &batch_norm_act_backward_impl<cuda::bn::BnActKernels>);
}

}  // namespace memsave
