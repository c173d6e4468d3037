"""What memsave's drop-in replacements for torch.nn modules (ReLU, LeakyReLU, Dropout, MaxPool2d) share."""

from __future__ import annotations


class MemsaveModuleMixin:
    """Mixed in before the torch.nn class a memsave module subclasses (``class ReLU(MemsaveModuleMixin, nn.ReLU)``).

    It declares, for memsave.convert's summary, that the module keeps neither its input nor its output for backward
    (only a mask or a 1-byte argmax), and names the module ``memsave.<Class>`` so ``print(model)`` shows what was
    converted.

    Example:
        >>> class ReLU(MemsaveModuleMixin, torch.nn.ReLU): ...  # doctest: +SKIP
        >>> ReLU()
        memsave.ReLU()
    """

    memsave_keeps_input = False
    memsave_keeps_output = False

    def _get_name(self) -> str:
        return "memsave." + type(self).__name__
