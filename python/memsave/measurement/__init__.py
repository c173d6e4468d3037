"""Measurement: what each lever bought, taken the same way everywhere (docs/design.md, "Measuring and comparing").

=================  ==============================================================================================
``allocator.py``   the allocator-level peak of one call (CUDA statistics; CPU allocation events, one reading rule)
``tracker.py``     :class:`LiveTensorTracker`: live tensor bytes per module (real or fake tensors)
``measuring.py``   :func:`measure`: peak, activation bytes and time of one training step; the default loss
``units.py``       memory sizes and budgets as people write them (one parser), and as memsave prints them
``strategies.py``  the strategy registry (``"eager"``, ``"checkpoint:blocks"``, ``"plan:50%"``, ...)
``timing.py``      interleaved timing over rounds, median and IQR: every timed comparison uses it
``comparison.py``  :func:`compare`: eager vs. every strategy, in one table
``estimation.py``  :func:`estimate` / :func:`max_batch_size`: predictions on fake tensors, nothing allocated
``monitor.py``     :class:`MemoryMonitor`: memory of every step of a real training loop
=================  ==============================================================================================
"""

from .comparison import Comparison, compare
from .estimation import Estimate, estimate, max_batch_size
from .measuring import Measurement, default_loss, measure
from .monitor import MemoryMonitor
from .strategies import register_strategy
from .units import format_bytes, parse_budget, parse_bytes

__all__ = [
    "Comparison",
    "Estimate",
    "Measurement",
    "MemoryMonitor",
    "compare",
    "default_loss",
    "estimate",
    "format_bytes",
    "max_batch_size",
    "measure",
    "parse_budget",
    "parse_bytes",
    "register_strategy",
]
