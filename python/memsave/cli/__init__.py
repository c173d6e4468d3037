"""The command line, ``python -m memsave`` (or ``memsave``): ``info``, ``demo``, ``bench``, ``estimate``.

=============  ==================================================================================================
``main.py``    argument parsing and the ``info`` subcommand
``demo.py``    ``demo``: eager vs checkpointing on a built-in model, the memory comparison table
``bench.py``   ``bench`` (:func:`memsave.compare` on a model) and ``estimate`` (:func:`memsave.estimate`)
=============  ==================================================================================================
"""
from .main import main

__all__ = ["main"]
