"""Automatic checkpoint plans for a memory budget: :func:`plan` and :class:`Plan`.

================  ==============================================================================================
``trace.py``      1. profile one step module call by module call: allocations, frees, uses, timings
``chain.py``      2. the chain of candidate pieces and its cost model (:class:`Stage` mirrors ``planner::Stage``)
``operators.py``  2b. per piece and operator class, what a selective region keeps and skips: selective variants
``plan.py``       3. the :class:`Plan`: summary, JSON, and how it is applied in place
``search.py``     4. :func:`plan`: trace, chain, solve with the C++ planner (``csrc/planner``), verify by measuring
================  ==============================================================================================
"""

from .chain import Chain, Skip, Stage, StageModules
from .plan import Plan, apply_plan
from .search import plan

__all__ = ["Chain", "Plan", "Skip", "Stage", "StageModules", "apply_plan", "plan"]
