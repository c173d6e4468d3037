"""Memory-efficient operators: ``torch.ops.memsave.*`` and their Python faces.

==============  =================================================================================================
``library/``    the Python halves of the dispatcher operators, one module per family (fake kernels, autograd);
                schemas and CPU/CUDA kernels are in ``csrc/ops/<family>/``
``functional``  ``memsave.functional``: relu, leaky_relu, dropout, max_pool2d and the fused operators
``nn/``         ``memsave.nn``: drop-in modules built on them
``convert/``    ``memsave.convert``: swaps those modules into an existing model
==============  =================================================================================================

Importing this package registers the fake kernels and autograd formulas of every ``torch.ops.memsave`` operator;
the compiled extension must be loaded first (``memsave/__init__.py`` does).
"""

from . import (
    functional,
    library,
    nn,
    strategies,  # noqa: F401  (registers the convert and convert_all strategies)
)
from .convert import convert

__all__ = ["convert", "functional", "library", "nn"]
