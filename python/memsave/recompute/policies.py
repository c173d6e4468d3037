"""The policy strings of :func:`memsave.wrap` and of the ``checkpoint:<policy>`` strategies: one reading for both.

``memsave.wrap(model, "blocks")``, ``compare(..., strategies=["checkpoint:blocks"])`` and ``python -m memsave bench
--strategies checkpoint:blocks`` select the same modules, through :func:`resolve_checkpoint_policy`.
"""

from __future__ import annotations

from typing import List

from torch import nn

from .blocks import find_blocks

__all__ = ["resolve_checkpoint_policy"]


def _plain_container(m: nn.Module) -> bool:
    return isinstance(m, nn.ModuleList) or (isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward)


def resolve_checkpoint_policy(model: nn.Module, policy: str) -> List[str]:
    """The qualified names of the modules ``checkpoint:<policy>`` wraps in ``model``.

    * ``blocks``: the model's repeated blocks, :func:`memsave.find_blocks` (what ``memsave.wrap(model)`` with no
      policy checkpoints): ``model.checkpoint_blocks()`` when the model defines it (the benchmark models do), the
      units of the model's own checkpointing switch (Hugging Face's ``GradientCheckpointingLayer`` layers, timm's
      ``set_grad_checkpointing`` blocks, diffusers' blocks), else the largest family of same-class blocks held in a
      ``ModuleList``/``Sequential``/``ModuleDict`` (transformer layers, ResNet bottlenecks, ViT encoder blocks).
    * ``all``: every top-level stage: each direct child of ``model``, with plain ``nn.Sequential``/``nn.ModuleList``
      children replaced by their own children.
    * otherwise a comma-separated list whose items are qualified module names (``h.0``) or class names
      (``TransformerBlock``, or with the module path, ``mypkg.models.TransformerBlock``); a class name selects
      every module of that class not nested in another selected one.

    Args:
        model: the model.
        policy: as above.

    Returns:
        qualified names, outermost first; none nested in another.

    Raises:
        ValueError: the policy selects nothing, or ``blocks`` finds no repeated blocks (the message lists the
            model's module classes).

    Examples:
        >>> resolve_checkpoint_policy(gpt, "blocks")[:2]
        ['h.0', 'h.1']
    """
    modules = dict(model.named_modules())
    names: List[str]
    if policy == "blocks":
        names = find_blocks(model)
        if not names:
            classes = sorted({type(m).__name__ for m in modules.values()})
            raise ValueError(
                f"checkpoint:blocks: found no repeated blocks in {type(model).__name__} (memsave.find_blocks looks for "
                "the units of the model's own checkpointing switch -- Hugging Face, timm, diffusers -- else a family "
                "of same-class modules with children held in a ModuleList/Sequential/ModuleDict); name the modules "
                "to checkpoint instead: a module class name (this "
                f"model has {', '.join(classes[:25])}{', ...' if len(classes) > 25 else ''}), comma-separated "
                "qualified module names, or 'all'"
            )
    elif policy == "all":
        names = []
        for n, c in model.named_children():
            if _plain_container(c):
                names += [f"{n}.{cn}" for cn, _ in c.named_children()]
            else:
                names.append(n)
    else:
        names, unmatched = [], []
        for item in (part.strip() for part in policy.split(",")):
            if not item:
                continue
            if item in modules and item != "":
                names.append(item)
                continue
            matched = [
                n
                for n, m in modules.items()
                if item in (type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}")
            ]
            if not matched:
                unmatched.append(item)
            names += matched
        if unmatched:
            classes = sorted({type(m).__name__ for m in modules.values()})
            raise ValueError(
                f"checkpoint:{policy}: {', '.join(map(repr, unmatched))} is neither a submodule name nor a module "
                f"class of {type(model).__name__}; use 'blocks', 'all', a module class name (this model has "
                f"{', '.join(classes[:25])}{', ...' if len(classes) > 25 else ''}) or comma-separated qualified "
                "module names"
            )
    # Keep the outermost of nested selections (a nested region keeps the inner arguments alive).
    names = list(dict.fromkeys(names))
    outer = [n for n in names if not any(n != o and (o == "" or n.startswith(o + ".")) for o in names)]
    if not outer:
        raise ValueError(f"checkpoint:{policy} selects no module of {type(model).__name__} (it has no children)")
    return outer
