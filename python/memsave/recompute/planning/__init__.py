"""Automatic checkpoint plans for a memory budget: :func:`plan` and :class:`Plan`.

================  ==============================================================================================
``trace.py``      1. profile one step module call by module call: allocations, frees, uses, timings
``chain.py``      2. the chain of candidate stages and its cost model (:class:`Stage` mirrors ``planner::Stage``)
``operators.py``  2b. per stage and operator class, what a selective region keeps and skips: selective variants
``search.py``     3. the search: solve with the C++ planner (``csrc/planner``), verify candidates by measuring
``plan.py``       4. the :class:`Plan`: summary, JSON, and how it is applied in place
``capture.py``    4b. under compile: one dynamo capture, compiled per candidate with its regions as recompute tags
``cache.py``      the plan cache: a plan's key (model structure, inputs, loss, arguments, versions), entries on disk
``planner.py``    the driver, :func:`plan`: profile, chain, search, verify (also :func:`profile` and :func:`search`)
================  ==============================================================================================
"""

from .chain import Chain, Skip, Stage, StageModules
from .plan import Plan, apply_plan
from .planner import Profile, plan, profile, search

__all__ = ["Chain", "Plan", "Profile", "Skip", "Stage", "StageModules", "apply_plan", "plan", "profile", "search"]
