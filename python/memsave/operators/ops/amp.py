"""memsave::unscale_and_check_ and memsave::amp_update_scale_: the device-side halves of dynamic loss scaling.

Both operators only mutate their arguments (declared ``Tensor(a!)`` in the schemas,
``csrc/ops/amp/unscale_and_check.cpp`` and ``amp_update_scale.cpp``),
so their fake kernels return nothing; they carry no autograd formula because they run on gradients outside the
graph.
"""

from __future__ import annotations

from ._registration import Registrations

#: What this family registers with torch.library, applied by memsave.operators.ops.register().
REGISTRATIONS = Registrations()


REGISTRATIONS.no_output_fakes("memsave::unscale_and_check_", "memsave::amp_update_scale_")
