"""memsave inside the training stacks people use. Each module imports its library when it is imported, not before:

=====================  ==========================================================================================
``transformers.py``    :func:`transformers.enable` (a Hugging Face model's own checkpointing switch uses memsave's
                       regions), :class:`transformers.MemoryCallback` (peak and activation bytes in Trainer's logs)
``lightning.py``       :class:`lightning.MemoryMonitor` (the same numbers logged by a Lightning ``Callback``)
``step_memory.py``     :class:`StepMemoryProbe`: the peak and activation bytes of one training step inside a loop
                       someone else runs (both callbacks use it)
=====================  ==========================================================================================

``memsave.wrap(model)`` and ``memsave.wrap(model, plan)`` on a Hugging Face model need nothing from here: they claim
the model's switch themselves (:mod:`memsave.recompute.switch`), so ``Trainer(args with
activation_checkpointing=True)`` and ``model.gradient_checkpointing_enable()`` keep memsave's regions. accelerate
needs nothing either: ``Accelerator.prepare`` on a wrapped or converted model trains as the plain one does.

Examples:
    >>> import memsave.integrations.transformers as ms_hf
    >>> ms_hf.enable(model)                         # model.gradient_checkpointing_enable() now means memsave
    >>> Trainer(model, args, callbacks=[ms_hf.MemoryCallback()])
"""

from .step_memory import StepMemoryProbe

__all__ = ["StepMemoryProbe"]
