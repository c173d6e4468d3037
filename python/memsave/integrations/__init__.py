"""memsave inside the training stacks people use. Each module imports its library when it is imported, not before:

=====================  ==========================================================================================
``transformers.py``    :class:`transformers.Memsave` (convert, plan or wrap the model Trainer trains, in one line),
                       :func:`transformers.enable` (a Hugging Face model's own checkpointing switch uses memsave's
                       regions), :class:`transformers.MemoryCallback` (peak and activation bytes in Trainer's logs,
                       where its reporting integrations see them)
``lightning.py``       :class:`lightning.Memsave` and :class:`lightning.MemoryCallback`: the same for Lightning (the
                       numbers in every Lightning logger, on the measured steps)
``recipe.py``          what both ``Memsave`` callbacks apply when training starts, and the checks of their arguments
``step_memory.py``     :class:`StepMemoryProbe`: the peak and activation bytes of one training step inside a loop
                       someone else runs (both callbacks use it)
=====================  ==========================================================================================

``memsave.wrap(model)`` and ``memsave.wrap(model, plan)`` on a Hugging Face model need no import from here: wrap's
listener claims the model's switch (:mod:`memsave.integrations.transformers_switch`, which imports no transformers;
``memsave/__init__.py`` registers it), so ``Trainer(args with activation_checkpointing=True)`` and
``model.activation_checkpointing_enable()`` keep memsave's regions and report checkpointing on. accelerate
needs nothing either: ``Accelerator.prepare`` on a wrapped or converted model trains as the plain one does.

Examples:
    >>> import memsave.integrations.transformers as ms_hf
    >>> ms_hf.enable(model)                         # model.activation_checkpointing_enable() now means memsave
    >>> Trainer(model, args, callbacks=[ms_hf.MemoryCallback()])
    >>> Trainer(model, args, callbacks=[ms_hf.Memsave(budget="20GiB")])   # or all of it in one line
"""

from .step_memory import StepMemoryProbe

__all__ = ["StepMemoryProbe"]
