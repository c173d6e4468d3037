"""``memsave.convert(model, fuse=True)`` on a Hugging Face causal language model: the loss without the logits.

A causal LM called with ``labels`` computes ``logits = lm_head(hidden)`` (``[batch, seq, vocabulary]``), then
``loss_function(logits, labels, vocab_size, **kwargs)``: the logits, their log-softmax and their gradient are the
largest tensors of the step. After ``convert(fuse=True)``:

* ``lm_head`` is a :class:`CausalLMHead`, an ``nn.Linear`` sharing the head's parameters (a tied head stays tied;
  state_dict keys unchanged). Called without labels it is that Linear, bit for bit.
* A forward pre-hook on the model sees whether this is a *training forward with labels*: ``labels`` passed, the
  model in training mode and gradients enabled. Only then does ``lm_head`` hand its input to the loss and return an
  **empty tensor** ``[batch, seq, 0]`` (hidden's dtype and device) in place of the logits: that is what
  ``output.logits`` is then. Every other call returns the real logits: evaluation (``model.eval()``, ``no_grad``,
  ``Trainer.evaluate`` with ``compute_metrics``, ``Trainer.predict``) and ``generate``.
* ``model.loss_function`` is a :class:`FusedCausalLMLoss`: Hugging Face's ``ForCausalLMLoss`` -- labels padded with
  ``ignore_index`` and shifted by one (or ``shift_labels`` as given), mean over the non-ignored tokens, or the sum
  divided by ``num_items_in_batch`` when that is given -- computed by
  :func:`memsave.functional.linear_cross_entropy` from the head's input. Called with real logits (the head was not
  armed, e.g. ``model.forward`` called directly, or ``lm_head`` replaced since), it is Hugging Face's function.

The loss is returned in float32 as Hugging Face's; for a 16-bit model it is computed in float32 from the 16-bit
hidden states and weight (Hugging Face rounds the logits to 16 bits first), then rounded to the model's dtype by the
operator and cast back to float32, so it agrees with Hugging Face's to the model dtype's precision.

Known forwards (``lm_head`` called once on the last hidden state, its output passed straight to ``loss_function``):
LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GPT2LMHeadModel. Other models are left
alone; a model whose head is not a plain ``nn.Linear`` or whose ``loss_function`` is not Hugging Face's
``ForCausalLMLoss`` is skipped with the reason in the report.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Tuple, cast

import torch
from torch import nn

from .. import functional as F
from .model_zoo import LLAMA_FAMILY
from .registry import ModuleRule, Replacement, Rewrite, add_module_rule

__all__ = ["CAUSAL_LMS", "CausalLMHead", "FusedCausalLMLoss"]

Tensor = torch.Tensor

#: The causal LMs whose ``forward`` memsave knows (qualified class names).
CAUSAL_LMS: Tuple[str, ...] = tuple(
    f"transformers.models.{t}.modeling_{t}.{p}ForCausalLM" for t, p in LLAMA_FAMILY.items()
) + ("transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel",)


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
            linear: the model's ``lm_head``.
            labels_position: index of ``labels`` among the model's positional forward arguments, or None.

        Returns:
            The head (unarmed).

        Examples:
            >>> model.lm_head = CausalLMHead.from_linear(model.lm_head, labels_position=5)
        """
        head = cls.__new__(cls)
        nn.Module.__init__(head)
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
        model: the causal LM (its ``lm_head`` is looked up at each call).
        fallback: the loss function it replaced, used when the head holds no input (real logits were made).
    """

    def __init__(self, model: nn.Module, fallback: Callable[..., Tensor]) -> None:
        self.model = model
        self.fallback = fallback

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
        head = getattr(self.model, "lm_head", None)
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
                f"memsave's fused causal-LM loss: lm_head has {head.out_features} outputs but vocab_size is "
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


def _arm(model: nn.Module, args: Tuple[Any, ...], kwargs: dict) -> None:
    """Forward pre-hook: arm the head for a training forward with labels (evaluation keeps its logits)."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, CausalLMHead):
        labels = kwargs.get("labels")
        pos = head.labels_position
        if labels is None and pos is not None and len(args) > pos:
            labels = args[pos]
        training = model.training and torch.is_grad_enabled()
        head.armed, head.pending = labels is not None and training, None


def _disarm(model: nn.Module, args: Tuple[Any, ...], kwargs: dict, output: Any) -> None:
    """Forward hook (also after an exception): the head is unarmed and holds nothing between calls."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, CausalLMHead):
        head.armed, head.pending = False, None


def _labels_position(model: nn.Module) -> Optional[int]:
    params = [p for p in inspect.signature(type(model).forward).parameters.values() if p.name != "self"]
    for i, p in enumerate(params):
        if p.name == "labels":
            return i if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else None
    return None


def _install(model: nn.Module) -> None:
    fallback = cast(Callable[..., Tensor], model.loss_function)
    model.loss_function = FusedCausalLMLoss(model, fallback)  # type: ignore[assignment]
    model.register_forward_pre_hook(_arm, with_kwargs=True)
    model.register_forward_hook(_disarm, with_kwargs=True, always_call=True)


def _rewrite_causal_lm(model: nn.Module) -> Rewrite:
    head = getattr(model, "lm_head", None)
    if isinstance(head, CausalLMHead):
        return Rewrite(skipped=(("lm_head", "already converted"),))
    if type(head) is not nn.Linear:
        return Rewrite(skipped=(("", f"lm_head is a {type(head).__name__}, not an nn.Linear: the loss is not fused"),))
    if "_loss_function" in vars(model) or getattr(model.loss_function, "__name__", "") != "ForCausalLMLoss":
        return Rewrite(
            skipped=(
                (
                    "lm_head",
                    "the model's loss_function is not Hugging Face's ForCausalLMLoss (a custom "
                    "loss?): the loss is not fused",
                ),
            )
        )
    cfg = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(cfg, name, None):
            return Rewrite(skipped=(("lm_head", f"config.{name} changes the logits before the loss: not fused"),))
    labels = inspect.signature(type(model).forward).parameters.get("labels")
    if labels is None:
        return Rewrite(skipped=(("lm_head", f"{type(model).__name__}.forward takes no labels"),))
    new = CausalLMHead.from_linear(head, _labels_position(model))
    detail = (
        "called with labels, the loss is linear_cross_entropy of lm_head's input (HF's shift, ignore_index, "
        "num_items_in_batch): no [tokens x vocabulary] logits, log-softmax or logits gradient; .logits is then "
        "an empty [batch, seq, 0] tensor. Without labels, in eval mode or under no_grad: the same Linear"
    )
    return Rewrite(replacements=(Replacement("lm_head", new, detail),), install=_install)


add_module_rule(ModuleRule("causal_lm_loss", CAUSAL_LMS, _rewrite_causal_lm))
