"""Python halves of the ``torch.ops.memsave`` operators: one module per operator.

Each module registers, for its operator, the fake (meta) kernel used by ``torch.compile`` and FakeTensorMode, and
the autograd formula, which saves only what the memory win needs and calls the operator's own ``*_backward``
operator. The schemas and the CPU/CUDA kernels live in ``csrc/ops``.
"""
from . import relu  # noqa: F401
from . import leaky_relu  # noqa: F401
from . import dropout  # noqa: F401
from . import max_pool2d  # noqa: F401
from . import amp_unscale  # noqa: F401
from . import batch_norm_act  # noqa: F401
from . import batch_norm_act_conv  # noqa: F401
from . import inplace_abn  # noqa: F401
from . import layer_norm_linear  # noqa: F401
from . import act_linear  # noqa: F401
