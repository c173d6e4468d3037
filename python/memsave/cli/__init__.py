"""The command line, ``python -m memsave`` (or ``memsave``): ``info``, ``demo``, ``bench``, ``estimate``.

=================  ==============================================================================================
``main.py``        dispatch to the subcommands
``info.py``        ``info``: build facts and the dispatch keys of every operator
``demo.py``        ``demo``: eager vs checkpointing on a built-in model, the memory comparison table
``bench.py``       ``bench``: :func:`memsave.compare` on a model, one row per strategy (errors in their own rows)
``estimate.py``    ``estimate``: :func:`memsave.estimate` and :func:`memsave.max_batch_size` per strategy
``options.py``     the options every subcommand shares (``--device``, ``--size``, ``--no-progress``, units), the
                   model a command runs, printing; the examples' ``--size``/``--device``/``--steps``
``user_model.py``  the user's own model: ``--model MODULE:CALLABLE``, ``--input`` shapes
``hf_model.py``    ``--model hf:<model type>`` / ``hf:<directory>``: a transformers model built locally
``usage.py``       how a command fails: one line ``memsave: error: ...``, exit code 2 (usage) or 1 (run)
=================  ==============================================================================================
"""

from .main import main

__all__ = ["main"]
