// memsave::inplace_abn / inplace_abn_backward on CUDA: the host side shared with the CPU (inplace_abn_common.h) over
// the CUDA kernels of bn_act_kernels.cuh (schemas, CPU registration and the description: inplace_abn.cpp).
#include <torch/library.h>

#include "norm_act/bn_act_common.h"
#include "norm_act/inplace_abn_common.h"
#include "norm_act/bn_act_kernels.cuh"

namespace memsave {

TORCH_LIBRARY_IMPL(memsave, CUDA, m) {
  m.impl("inplace_abn", &inplace_abn_impl<cuda::bn::BnActKernels>);
  m.impl("inplace_abn_backward", &inplace_abn_backward_impl<cuda::bn::BnActKernels>);
}

}  // namespace memsave
