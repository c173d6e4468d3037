"""``memsave.convert(model, fuse=True)`` on a causal language model: the loss without the logits.

A causal LM called with ``labels`` computes ``logits = head(hidden)`` (``[batch, seq, vocabulary]``), then
``loss_function(logits, labels, vocab_size, **kwargs)``: the logits, their log-softmax and their gradient are the
largest tensors of the step. After ``convert(fuse=True)``:

* the head is a :class:`CausalLMHead`, an ``nn.Linear`` sharing its parameters (a tied head stays tied;
  state_dict keys unchanged). Called without labels it is that Linear, bit for bit.
* A forward pre-hook on the model sees whether this is a *training forward with labels*: ``labels`` passed, the
  model in training mode and gradients enabled. Only then does the head hand its input to the loss and return an
  **empty tensor** ``[batch, seq, 0]`` (hidden's dtype and device) in place of the logits: that is what
  ``output.logits`` is then. Every other call returns the real logits: evaluation (``model.eval()``, ``no_grad``,
  ``Trainer.evaluate`` with ``compute_metrics``, ``Trainer.predict``) and ``generate``.
* ``model.loss_function`` is a :class:`FusedCausalLMLoss`: Hugging Face's ``ForCausalLMLoss`` -- labels padded with
  ``ignore_index`` and shifted by one (or ``shift_labels`` as given), mean over the non-ignored tokens, or the sum
  divided by ``num_items_in_batch`` when that is given -- computed by
  :func:`memsave.functional.linear_cross_entropy` from the head's input. Called with real logits (the head was not
  armed, e.g. ``model.forward`` called directly, or the head replaced since), it is Hugging Face's function.

The loss is returned in float32 as Hugging Face's; for a 16-bit model it is computed in float32 from the 16-bit
hidden states and weight (Hugging Face rounds the logits to 16 bits first), then rounded to the model's dtype by the
operator and cast back to float32, so it agrees with Hugging Face's to the model dtype's precision.

Which models: recognised by structure, not by a list of classes. A module is a causal LM here when its forward takes
``input_ids`` and ``labels``, its ``loss_function`` is Hugging Face's ``ForCausalLMLoss`` and its output head
(``get_output_embeddings()``: ``lm_head``, ``embed_out`` ...) is a plain ``nn.Linear`` child -- any transformers
``*ForCausalLM`` whose forward computes ``logits = head(hidden)`` then ``loss_function(logits, ...)``. Before the
head is swapped, the model runs once on 8 probe tokens with labels as it is and once with the converted head (same
RNG, no gradients): the two losses must agree within float tolerance. A forward that changes the logits between the
head and the loss (Gemma 2's soft-capping, Cohere's ``logit_scale``, Granite's ``logits_scaling`` other than 1)
fails that probe and is left alone, with the statements that change them in the report.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union, cast

import torch
from torch import nn

from .. import functional as F
from ..nn._base import bare_module
from .probe import FLOAT32_RTOL, PROBE_SEED, seeded, training
from .registry import Note, Target, Unit

__all__ = ["CausalLMHead", "FusedCausalLMLoss", "find_causal_lms", "head_units"]

Tensor = torch.Tensor

_PROBE_TOKENS = 8
_LOGIT_STD = 16.0


class CausalLMHead(nn.Linear):
    """A causal LM's ``lm_head`` that, while its model runs with labels, gives its input to the loss.

    Made by ``memsave.convert(model, fuse=True)`` (see the module docstring); not meant to be built by hand. Unarmed
    it is ``nn.Linear``; armed (by the model's forward pre-hook, in a training forward with labels) it keeps a
    reference to its input for :class:`FusedCausalLMLoss` and returns an empty ``[..., 0]`` tensor instead of the
    logits.
    """

    labels_position: Optional[int]
    armed: bool
    pending: Optional[Tensor]

    @classmethod
    def from_linear(cls, linear: nn.Linear, labels_position: Optional[int]) -> "CausalLMHead":
        """A head sharing ``linear``'s parameters.

        Args:
            linear: the model's output head (``lm_head``).
            labels_position: index of ``labels`` among the model's positional forward arguments, or None.

        Returns:
            The head (unarmed).

        Examples:
            >>> model.lm_head = CausalLMHead.from_linear(model.lm_head, labels_position=5)
        """
        head = bare_module(cls)
        head.in_features, head.out_features = linear.in_features, linear.out_features
        head.weight = linear.weight
        head.bias = linear.bias
        head.labels_position = labels_position
        head.armed = False
        head.pending = None
        return head

    def forward(self, input: Tensor) -> Tensor:
        if not self.armed:
            return super().forward(input)
        self.pending = input
        return input.new_empty((*input.shape[:-1], 0))

    def take_pending(self) -> Optional[Tensor]:
        """The input kept by an armed forward (once), or None."""
        hidden, self.pending = self.pending, None
        return hidden

    def extra_repr(self) -> str:
        return super().extra_repr() + ", with labels: loss by memsave.functional.linear_cross_entropy, no logits"


class FusedCausalLMLoss:
    """Hugging Face's ``ForCausalLMLoss`` computed by ``linear_cross_entropy`` from the head's input.

    Installed as ``model.loss_function`` by ``memsave.convert(model, fuse=True)``; see the module docstring.

    Args:
        model: the causal LM (its head is looked up at each call).
        fallback: the loss function it replaced, used when the head holds no input (real logits were made).
        head: the attribute of ``model`` that holds its output head (``lm_head``; ``embed_out`` ...).
    """

    def __init__(self, model: nn.Module, fallback: Callable[..., Tensor], head: str = "lm_head") -> None:
        self.model = model
        self.fallback = fallback
        self.head = head

    def __call__(
        self,
        logits: Tensor,
        labels: Tensor,
        vocab_size: int,
        num_items_in_batch: Optional[Any] = None,
        ignore_index: int = -100,
        shift_labels: Optional[Tensor] = None,
        **kwargs: Any,
    ) -> Tensor:
        head = getattr(self.model, self.head, None)
        hidden = head.take_pending() if isinstance(head, CausalLMHead) else None
        if hidden is None or not isinstance(head, CausalLMHead):
            return self.fallback(
                logits,
                labels,
                vocab_size,
                num_items_in_batch=num_items_in_batch,
                ignore_index=ignore_index,
                shift_labels=shift_labels,
                **kwargs,
            )
        if head.out_features != vocab_size:
            raise ValueError(
                f"memsave's fused causal-LM loss: {self.head} has {head.out_features} outputs but vocab_size is "
                f"{vocab_size}"
            )
        if shift_labels is None:
            labels = nn.functional.pad(labels, (0, 1), value=ignore_index)  # tokens < n predict n, as HF
            shift_labels = labels[..., 1:]
        shift_labels = shift_labels.reshape(-1).to(hidden.device)
        reduction = "sum" if num_items_in_batch is not None else "mean"
        loss = F.linear_cross_entropy(
            hidden.reshape(-1, hidden.shape[-1]),
            head.weight,
            shift_labels,
            head.bias,
            ignore_index=ignore_index,
            reduction=reduction,
        ).float()
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        return loss


def _arm(model: nn.Module, args: Tuple[Any, ...], kwargs: dict, head: str = "lm_head") -> None:
    """Forward pre-hook: arm the head for a training forward with labels (evaluation keeps its logits)."""
    module = getattr(model, head, None)
    if isinstance(module, CausalLMHead):
        labels = kwargs.get("labels")
        pos = module.labels_position
        if labels is None and pos is not None and len(args) > pos:
            labels = args[pos]
        training_step = model.training and torch.is_grad_enabled()
        module.armed, module.pending = labels is not None and training_step, None


def _disarm(model: nn.Module, args: Tuple[Any, ...], kwargs: dict, output: Any, head: str = "lm_head") -> None:
    """Forward hook (also after an exception): the head is unarmed and holds nothing between calls."""
    module = getattr(model, head, None)
    if isinstance(module, CausalLMHead):
        module.armed, module.pending = False, None


def _labels_position(model: nn.Module) -> Optional[int]:
    params = [p for p in inspect.signature(type(model).forward).parameters.values() if p.name != "self"]
    for i, p in enumerate(params):
        if p.name == "labels":
            return i if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else None
    return None


def _installer(head: str) -> Callable[[nn.Module], None]:
    def install(model: nn.Module) -> None:
        fallback = cast(Callable[..., Tensor], model.loss_function)
        model.loss_function = FusedCausalLMLoss(model, fallback, head)  # type: ignore[assignment]
        model.register_forward_pre_hook(functools.partial(_arm, head=head), with_kwargs=True)
        model.register_forward_hook(functools.partial(_disarm, head=head), with_kwargs=True, always_call=True)

    return install


# ---- recognising a causal LM --------------------------------------------------------------------------------------


def _forward_params(m: nn.Module) -> Dict[str, Any]:
    try:
        return dict(inspect.signature(type(m).forward).parameters)
    except (TypeError, ValueError):
        return {}


def _head_name(m: nn.Module) -> Optional[str]:
    """The child that holds ``m``'s output head (``get_output_embeddings()``, else ``lm_head``), or None."""
    head: Any = None
    get = getattr(m, "get_output_embeddings", None)
    if callable(get):
        try:
            head = get()
        except (NotImplementedError, AttributeError):
            head = None
    head = head if head is not None else getattr(m, "lm_head", None)
    return next((n for n, c in m.named_children() if c is head), None) if isinstance(head, nn.Module) else None


def find_causal_lms(model: nn.Module) -> List[Tuple[str, nn.Module, str]]:
    """The causal LMs in ``model`` by structure (see the module docstring): ``(path, module, head attribute)``.

    Args:
        model: any model.

    Returns:
        One entry per module whose forward takes ``input_ids`` and ``labels``, that has a ``loss_function`` and an
        output head among its children (the outermost first; a PEFT wrapper's inner model rather than the wrapper).

    Examples:
        >>> find_causal_lms(qwen3)
        [('', Qwen3ForCausalLM(...), 'lm_head')]
    """
    found = []
    for path, m in model.named_modules():
        params = _forward_params(m)
        if "labels" not in params or "input_ids" not in params:
            continue
        head = _head_name(m)
        if head is not None and getattr(m, "loss_function", None) is not None:
            found.append((path, m, head))
    return found


def _logit_edits(lm: nn.Module, head: str) -> List[str]:
    """The statements of ``lm``'s forward that reassign the head's output before the loss (for the report)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(lm).forward)))
    except (OSError, TypeError, SyntaxError):
        return []
    var, edits = None, []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            src = ast.unparse(node.value)
            if var is None and f"self.{head}(" in src and names:
                var = names[0]
            elif var is not None and var in names:
                edits.append(ast.unparse(node).splitlines()[0])
    return edits


def _refusal(lm: nn.Module, head: str) -> Optional[str]:
    module = getattr(lm, head)
    if isinstance(module, CausalLMHead):
        return "already converted"
    if type(module) is not nn.Linear:
        return f"{head} is a {type(module).__name__}, not an nn.Linear: the loss is not fused"
    loss = getattr(lm, "loss_function", None)
    if "_loss_function" in vars(lm) or getattr(loss, "__name__", "") != "ForCausalLMLoss":
        return "the model's loss_function is not Hugging Face's ForCausalLMLoss (a custom loss?): the loss is not fused"
    return None


# ---- the probe: the model's loss as it is against the loss from the converted head --------------------------------


def _probe_kwargs(lm: nn.Module, head: nn.Linear) -> Dict[str, Any]:
    vocab = head.out_features
    declared = getattr(getattr(lm, "config", None), "vocab_size", None)
    if isinstance(declared, int) and 0 < declared < vocab:
        vocab = declared
    ids = torch.randint(0, vocab, (1, _PROBE_TOKENS), generator=torch.Generator().manual_seed(PROBE_SEED))
    kwargs: Dict[str, Any] = {"input_ids": ids.to(head.weight.device), "labels": ids.to(head.weight.device)}
    if "use_cache" in _forward_params(lm):
        kwargs["use_cache"] = False
    return kwargs


def _loss_of(out: Any) -> Optional[Tensor]:
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor) and out[0].dim() == 0:
        loss = out[0]
    return loss if isinstance(loss, Tensor) else None


def _run_converted(lm: nn.Module, head: str, new: "CausalLMHead", kwargs: Dict[str, Any]) -> Any:
    """``lm(**kwargs)`` with ``new`` armed in place of its head and the fused loss installed; all put back after."""
    old, saved = getattr(lm, head), {k: vars(lm)[k] for k in ("loss_function", "_loss_function") if k in vars(lm)}
    fallback = cast(Callable[..., Tensor], lm.loss_function)
    setattr(lm, head, new)
    lm.loss_function = FusedCausalLMLoss(lm, fallback, head)  # type: ignore[assignment]
    new.armed, new.pending = True, None
    try:
        return lm(**kwargs)
    finally:
        new.armed, new.pending = False, None
        setattr(lm, head, old)
        for k in ("loss_function", "_loss_function"):
            if k in saved:
                vars(lm)[k] = saved[k]
            else:
                vars(lm).pop(k, None)


def _loss64(hidden: Tensor, head: nn.Linear, labels: Tensor) -> float:
    """Hugging Face's causal-LM loss (shift by one, mean) from the head's input, in float64, the vocabulary in
    slices (no float64 copy of the whole head)."""
    h = hidden[..., :-1, :].reshape(-1, hidden.shape[-1]).double()
    target = labels[..., 1:].reshape(-1)
    parts = []
    for start in range(0, head.out_features, 8192):
        w = head.weight[start : start + 8192].double()
        b = head.bias[start : start + 8192].double() if head.bias is not None else None
        parts.append(nn.functional.linear(h, w, b))
    logits = torch.cat(parts, dim=-1)
    return (torch.logsumexp(logits, -1) - logits.gather(1, target[:, None]).squeeze(1)).mean().item()


def _compare_losses(
    ours: Optional[Tensor], eager: Optional[Tensor], hidden: Tensor, head: nn.Linear, labels: Tensor
) -> Optional[str]:
    if ours is None or eager is None:
        return "the forward returned no loss on the probe"
    o, e = ours.item(), eager.item()
    if head.weight.dtype in (torch.float32, torch.float64):
        rtol = FLOAT32_RTOL if head.weight.dtype == torch.float32 else 1e-12
        if abs(o - e) <= rtol * max(abs(e), 1e-30):
            return None
        return f"the loss on a probe is {o:.6g} where the model's own is {e:.6g}"
    r = _loss64(hidden, head, labels)
    floor = 0.5 * torch.finfo(head.weight.dtype).eps * abs(r)
    if abs(o - r) <= 2 * abs(e - r) + floor:
        return None
    return (
        f"the loss on a probe errs by {abs(o - r):.3g} against float64 where the model's own errs by {abs(e - r):.3g}"
    )


@contextlib.contextmanager
def _large_logits(head: nn.Linear, hidden: Tensor) -> Iterator[None]:
    """The head's weight and bias set, in place, to seeded random values that give logits of standard deviation
    about 16 on ``hidden`` (so that a soft-cap or a scale between the head and the loss shows in the loss; the
    model's own small random logits would hide it); put back on exit."""
    saved = [(p, p.detach().clone()) for p in (head.weight, head.bias) if p is not None]
    rms = max(hidden.detach().double().pow(2).mean().sqrt().item(), 1e-6)
    gen = torch.Generator(device=head.weight.device).manual_seed(PROBE_SEED)  # drawn in place: no copy of the head
    try:
        with torch.no_grad():
            for p, _ in saved:
                p.normal_(generator=gen).mul_(_LOGIT_STD / (rms * p.shape[-1] ** 0.5))
        yield
    finally:
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)


def _probe(lm: nn.Module, head: str, new: "CausalLMHead") -> Optional[str]:
    """Why the converted head does not give the model's own loss on a probe, or None. The model runs once as it is
    (for the scale of the head's input), then, with large random logits, once as it is and once converted."""
    module = cast(nn.Linear, getattr(lm, head))
    kwargs = _probe_kwargs(lm, module)
    captured: List[Tensor] = []
    handle = module.register_forward_pre_hook(lambda m, a: captured.append(a[0]))
    try:
        with torch.no_grad(), seeded([module.weight]) as reseed, training([lm]):
            reseed()
            lm(**kwargs)
            with _large_logits(module, captured[-1]):
                reseed()
                eager = _loss_of(lm(**kwargs))
                reseed()
                out = _run_converted(lm, head, new, kwargs)
                logits = getattr(out, "logits", None)
                if not isinstance(logits, Tensor) or logits.shape[-1] != 0:
                    return f"the forward does not return what {head} returns as its logits"
                return _compare_losses(_loss_of(out), eager, captured[-1], module, kwargs["labels"])
    except Exception as exc:  # a forward that cannot run this way is not this structure
        return f"a forward on the probe raised {type(exc).__name__}: {exc}"[:300]
    finally:
        handle.remove()


def _head_unit(path: str, lm: nn.Module, head: str) -> Union[Unit, Note]:
    qhead = f"{path}.{head}" if path else head
    new = CausalLMHead.from_linear(cast(nn.Linear, getattr(lm, head)), _labels_position(lm))
    why = _probe(lm, head, new)
    if why is not None:
        edits = _logit_edits(lm, head)
        changes = f" (its forward changes the logits before the loss: {'; '.join(edits)})" if edits else ""
        return Note(qhead, getattr(lm, head), f"causal_lm_loss: not fused: {why}{changes}")
    detail = (
        "called with labels, the loss is linear_cross_entropy of the head's input (HF's shift, ignore_index, "
        "num_items_in_batch): no [tokens x vocabulary] logits, log-softmax or logits gradient; .logits is then an "
        "empty [batch, seq, 0] tensor. Without labels, in eval mode or under no_grad: the same Linear. The loss "
        "equals the model's own on a probe"
    )
    return Unit("causal_lm_loss", (Target(qhead, new, detail),), anchor=path, install=_installer(head))


def head_units(model: nn.Module) -> List[Union[Unit, Note]]:
    """The causal-LM head of every causal LM in ``model`` (see the module docstring), probed: a :class:`Unit` to
    plan, or a :class:`Note` saying why it is left.

    Args:
        model: any model (it runs on a probe for each causal LM found; nothing in it changes).

    Returns:
        One unit or note per causal LM.

    Examples:
        >>> [u.rule for u in head_units(llama)]
        ['causal_lm_loss']
    """
    out: List[Union[Unit, Note]] = []
    for path, lm, head in find_causal_lms(model):
        why = _refusal(lm, head)
        qhead = f"{path}.{head}" if path else head
        out.append(Note(qhead, getattr(lm, head), f"causal_lm_loss: {why}") if why else _head_unit(path, lm, head))
    return out
