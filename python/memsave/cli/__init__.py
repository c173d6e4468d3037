"""The command line, ``python -m memsave`` (or ``memsave``): ``info``, ``demo``, ``bench``, ``estimate``.

=================  ==============================================================================================
``main.py``        dispatch to the subcommands, and ``info``
``demo.py``        ``demo``: eager vs checkpointing on a built-in model, the memory comparison table
``bench.py``       ``bench`` (:func:`memsave.compare` on a model) and ``estimate`` (:func:`memsave.estimate`)
``user_model.py``  the user's own model: ``--model MODULE:CALLABLE``, ``--input`` shapes, the loss of its output
``usage.py``       how a command fails: one line ``memsave: error: ...``, exit code 2 (usage) or 1 (run)
=================  ==============================================================================================
"""

from .main import main

__all__ = ["main"]
