// memsave::batch_norm_act_apply on CUDA, the recompute step of batch_norm_act_conv2d's backward: the host side shared
// with the CPU (bn_act_common.h) over the CUDA kernels of bn_act_kernels.cuh (schemas, CPU registration and the
// composite forward/backward: batch_norm_act_conv2d.cpp).
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/bn_act_kernels.cuh"

namespace memsave {

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("batch_norm_act_apply", &batch_norm_act_apply_impl<cuda::bn::BnActKernels>);
}

}  // namespace memsave
