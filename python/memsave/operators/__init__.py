"""Memory-efficient operators: ``torch.ops.memsave.*`` and their Python faces.

=================  ==============================================================================================
``ops/``           one module per operator family (as ``csrc/ops/<family>/``): its fake kernels and autograd
                   formulas, registered by :func:`memsave.operators.ops.register`, and its functional forms
``functional.py``  :mod:`memsave.functional`: relu, leaky_relu, dropout, max_pool2d and the fused operators
``nn/``            :mod:`memsave.nn`: drop-in modules built on them
``convert/``       :func:`memsave.convert`: swaps those modules into an existing model
``strategies.py``  the ``convert`` and ``convert_all`` strategies of :func:`memsave.compare`
=================  ==============================================================================================

Importing this package registers nothing: ``memsave/__init__.py`` loads the compiled extension, then calls
:func:`memsave.operators.ops.register` and :func:`memsave.operators.strategies.register_strategies` once.
"""

from . import functional, nn, ops
from .convert import convert

__all__ = ["convert", "functional", "nn", "ops"]
