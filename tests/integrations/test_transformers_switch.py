"""Hugging Face's checkpointing switch under memsave, in every call order with the model's own switch: the model
reports checkpointing through transformers' own attributes truthfully, memsave's regions are what recompute (torch's
checkpoint is made to raise), gradients stay bitwise eager's, and importing memsave patches nothing."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import warnings
from typing import Any, Callable, Dict, List

import pytest
import torch
from torch import nn

import memsave
from memsave.errors import MemsaveWarning

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import memsave.integrations.transformers as ms_hf  # noqa: E402
from helpers.hf_trainer import TokenIds, cpu_training_args, train  # noqa: E402
from memsave.integrations.transformers_switch import LayerCheckpoint, switch_of  # noqa: E402
from memsave.recompute import is_wrapped  # noqa: E402

VOCAB, SEQ, LAYERS = 64, 12, 3


def _llama(seed: int = 0, dropout: float = 0.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=dropout,
        use_cache=False,
    )
    return LlamaForCausalLM(config).train()


@pytest.fixture(autouse=True)
def _quiet_deprecations():
    # transformers 5 deprecates the gradient_* spelling and is_gradient_checkpointing; both are still the contract.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


class _Step:
    """One training step; counts the calls of each layer's MLP (a recompute calls it a second time; a pre-hook, since
    the recompute stops early, inside the MLP, once it has what backward needs)."""

    def __init__(self, model: nn.Module) -> None:
        self.calls = [0] * LAYERS
        for i, layer in enumerate(model.model.layers):
            layer.mlp.register_forward_pre_hook(self._counter(i))
        torch.manual_seed(7)
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
        model(ids, labels=ids).loss.backward()
        self.grads = [p.grad.clone() for p in model.parameters()]

    def _counter(self, i: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            self.calls[i] += 1

        return hook


def _eager_grads(dropout: float = 0.0) -> List[torch.Tensor]:
    return _Step(_llama(dropout=dropout)).grads


def _same(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _funcs(model: nn.Module) -> List[Any]:
    return [layer._gradient_checkpointing_func for layer in model.model.layers]


# ==== the orders ==================================================================================================


def _enable_then_switch(m: nn.Module) -> None:
    ms_hf.enable(m)
    m.activation_checkpointing_enable()


def _enable_then_old_spelling(m: nn.Module) -> None:
    ms_hf.enable(m)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _switch_then_enable(m: nn.Module) -> None:
    m.gradient_checkpointing_enable()  # transformers' own, with torch's checkpoint stored on the layers
    ms_hf.enable(m)


def _switch_enable_switch_again(m: nn.Module) -> None:
    m.activation_checkpointing_enable()
    ms_hf.enable(m)
    m.activation_checkpointing_enable()


def _config_flag(m: nn.Module) -> None:
    # from_pretrained of a config saved with gradient_checkpointing=True turns the switch on in post_init.
    m.config.gradient_checkpointing = True
    m._backward_compatibility_gradient_checkpointing()
    ms_hf.enable(m)


ORDERS: Dict[str, Callable[[nn.Module], None]] = {
    "enable-then-switch": _enable_then_switch,
    "enable-then-old-spelling": _enable_then_old_spelling,
    "switch-then-enable": _switch_then_enable,
    "switch-enable-switch": _switch_enable_switch_again,
    "config-flag-then-enable": _config_flag,
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_every_call_order_reports_on_and_recomputes_with_memsave(order, no_torch_checkpoint):
    eager = _eager_grads()
    model = _llama()
    ORDERS[order](model)
    assert model.is_activation_checkpointing and model.is_gradient_checkpointing
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    assert all(isinstance(f, LayerCheckpoint) for f in _funcs(model))
    step = _Step(model)
    assert step.calls == [2] * LAYERS  # forward, and the recompute of memsave's region
    assert _same(step.grads, eager)
    assert not any(is_wrapped(m) for m in model.modules())  # regions per call, nothing wrapped


@pytest.mark.parametrize("spelling", ["activation", "gradient"])
def test_disable_reports_off_and_nothing_recomputes(spelling, no_torch_checkpoint):
    model = ms_hf.enable(_llama())
    getattr(model, f"{spelling}_checkpointing_enable")()
    getattr(model, f"{spelling}_checkpointing_disable")()
    assert not model.is_activation_checkpointing and not model.is_gradient_checkpointing
    assert _Step(model).calls == [1] * LAYERS
    getattr(model, f"{spelling}_checkpointing_enable")()  # and on again
    assert model.is_activation_checkpointing and _Step(model).calls == [2] * LAYERS


def test_the_model_at_init_reports_off_and_enable_alone_turns_nothing_on():
    model = ms_hf.enable(_llama())
    assert not model.is_activation_checkpointing
    assert _Step(model).calls == [1] * LAYERS


def test_every_n_layers_is_transformers_own_choice(no_torch_checkpoint):
    model = ms_hf.enable(_llama())
    model.activation_checkpointing_enable(every_n_layers=2)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, False, True]
    assert _Step(model).calls == [2, 1, 2]


def test_trainer_flag_on_a_model_whose_checkpointing_was_already_on(tmp_path, no_torch_checkpoint):
    model = _llama()
    model.activation_checkpointing_enable()
    ms_hf.enable(model)
    args = cpu_training_args(tmp_path, 2, activation_checkpointing=True)
    trainer = train(model, args, TokenIds(8, SEQ, VOCAB))
    assert trainer.state.global_step == 2
    assert model.is_activation_checkpointing and all(isinstance(f, LayerCheckpoint) for f in _funcs(model))


# ==== options =====================================================================================================


def test_switch_options_reach_the_regions_and_dropout_replays(no_torch_checkpoint):
    eager = _eager_grads(dropout=0.5)
    model = ms_hf.enable(_llama(dropout=0.5))
    model.activation_checkpointing_enable({"use_reentrant": False, "determinism_check": "default"})
    assert _same(_Step(model).grads, eager)  # the RNG state is replayed: eager's dropout masks
    model = ms_hf.enable(_llama(dropout=0.5))
    model.activation_checkpointing_enable({"preserve_rng_state": False})
    assert not _same(_Step(model).grads, eager)  # the option reached the regions: new masks in the recompute


def test_enable_options_strict_and_inherited_ones(no_torch_checkpoint):
    eager = _eager_grads()
    model = ms_hf.enable(_llama(), strict=True)
    model.activation_checkpointing_enable()
    assert _same(_Step(model).grads, eager)
    model = _llama(dropout=0.5)
    model.activation_checkpointing_enable({"preserve_rng_state": False})
    ms_hf.enable(model)  # the model's own switch was on: its options stay
    assert switch_of(model).call_options == {"preserve_rng_state": False}


def test_use_reentrant_true_warns_and_still_uses_memsave(no_torch_checkpoint):
    model = ms_hf.enable(_llama())
    with pytest.warns(MemsaveWarning, match="use_reentrant=True"):
        model.activation_checkpointing_enable({"use_reentrant": True})
    assert _Step(model).calls == [2] * LAYERS


# ==== with memsave.wrap and plans =================================================================================


def test_wrap_before_or_after_the_switch_keeps_one_region_per_layer(no_torch_checkpoint):
    eager = _eager_grads()
    for order in ("wrap-first", "switch-first"):
        model = _llama()
        if order == "wrap-first":
            memsave.wrap(model)
            model.activation_checkpointing_enable()
        else:
            ms_hf.enable(model)
            model.activation_checkpointing_enable()
            memsave.wrap(model)
        assert model.is_activation_checkpointing, order
        step = _Step(model)
        assert step.calls == [2] * LAYERS, order  # not 3: no region inside another
        assert _same(step.grads, eager), order


def test_unwrap_of_an_enabled_model_goes_back_to_per_layer_regions(no_torch_checkpoint):
    model = memsave.wrap(_llama())
    ms_hf.enable(model)  # upgrades wrap's claim
    model.activation_checkpointing_enable()
    memsave.unwrap(model)
    assert switch_of(model).mode == "enable" and model.is_activation_checkpointing
    assert _Step(model).calls == [2] * LAYERS


def test_a_wrapped_layer_is_not_a_region_twice(no_torch_checkpoint):
    model = ms_hf.enable(_llama())
    model.activation_checkpointing_enable()
    memsave.wrap(model.model.layers[1])  # only this layer: the model's switch cannot see it, the layer's function can
    assert _Step(model).calls == [2] * LAYERS


def test_disable_on_a_wrapped_model_unwraps_and_gives_the_switch_back():
    model = memsave.wrap(_llama())
    model.activation_checkpointing_enable()
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing and not any(is_wrapped(m) for m in model.modules())
    assert switch_of(model) is None and "activation_checkpointing_enable" not in vars(model)
    assert not any(isinstance(f, LayerCheckpoint) for f in _funcs(model))


# ==== copies, PEFT, bad input =====================================================================================


def test_a_copy_has_its_own_switch(no_torch_checkpoint):
    model = ms_hf.enable(_llama())
    model.activation_checkpointing_enable()
    clone = copy.deepcopy(model)
    assert switch_of(clone) is not switch_of(model)
    assert all(f.state is switch_of(clone) and f.module is layer for f, layer in zip(_funcs(clone), clone.model.layers))
    clone.activation_checkpointing_disable()
    assert not clone.is_activation_checkpointing and model.is_activation_checkpointing
    assert _Step(clone).calls == [1] * LAYERS and _Step(model).calls == [2] * LAYERS


def test_an_enabled_model_pickles_with_its_switch(no_torch_checkpoint):
    # Pickled before the switch is on: transformers' own switch adds an input hook that is a local function.
    model = pickle.loads(pickle.dumps(ms_hf.enable(_llama())))
    assert switch_of(model).mode == "enable"
    model.activation_checkpointing_enable()
    assert _Step(model).calls == [2] * LAYERS


def test_peft_lora_trains_through_memsaves_regions(no_torch_checkpoint):
    peft = pytest.importorskip("peft")
    grads = {}
    for name in ("eager", "memsave"):
        base = _llama()
        if name == "memsave":
            ms_hf.enable(base)
            base.activation_checkpointing_enable()
        torch.manual_seed(1)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        assert model.base_model.model.is_activation_checkpointing == (name == "memsave")
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
        model(input_ids=ids, labels=ids).loss.backward()
        grads[name] = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    assert grads["eager"] and _same(grads["eager"], grads["memsave"])


class _NotHuggingFace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: Any = None) -> None:
        pass


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"use_reentrant": True}, TypeError, "unknown option"),
        ({"preserve_rng_state": "yes"}, TypeError, "preserve_rng_state must be True or False"),
        ({"strict": 1}, TypeError, "strict must be True or False"),
        ({"context_fn": 3}, TypeError, "context_fn"),
    ],
)
def test_bad_enable_options_change_nothing(options, error, match):
    model = _llama()
    with pytest.raises(error, match=match):
        ms_hf.enable(model, **options)
    assert switch_of(model) is None and "activation_checkpointing_enable" not in vars(model)


def test_bad_models_and_switch_calls():
    with pytest.raises(TypeError, match="no gradient_checkpointing_enable"):
        ms_hf.enable(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="gradient_checkpointing flag"):
        ms_hf.enable(_NotHuggingFace())
    model = ms_hf.enable(_llama())
    with pytest.raises(TypeError, match="must be a dict"):
        model.activation_checkpointing_enable("use_reentrant")
    with pytest.raises(TypeError, match="does not take 'offload_to'"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"offload_to": "cpu"})
    with pytest.raises(TypeError, match="preserve_rng_state must be True or False"):
        model.activation_checkpointing_enable({"preserve_rng_state": "no"})
    with pytest.raises(TypeError, match="context_fn"):
        model.activation_checkpointing_enable({"context_fn": 1})
    with pytest.raises(ValueError, match="determinism_check must be 'default' or 'none'"):
        model.activation_checkpointing_enable({"determinism_check": "strict"})
    with pytest.raises(ValueError, match="every_n_layers must be an int >= 1"):
        model.activation_checkpointing_enable(every_n_layers=0)
    with pytest.raises(ValueError, match="do not offload"):
        model.activation_checkpointing_enable(offload=True)
    assert not model.is_activation_checkpointing  # none of them turned anything on
    assert not any(
        isinstance(getattr(layer, "_gradient_checkpointing_func", None), LayerCheckpoint)
        for layer in model.model.layers
    )


# ==== nothing patched at import ===================================================================================

_IMPORT_CHECK = r"""
import sys
hooks = list(sys.meta_path)
import memsave
assert "transformers" not in sys.modules, "import memsave imported transformers"
assert sys.meta_path == hooks, "import memsave added an import hook"
import torch.utils.checkpoint as tc
import transformers
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
before = {c: dict(vars(c)) for c in (PreTrainedModel, GradientCheckpointingLayer)}
checkpoint = tc.checkpoint
import memsave.integrations.transformers
for c, attrs in before.items():
    changed = [n for n, v in vars(c).items() if attrs.get(n, object()) is not v]
    assert not changed and set(vars(c)) == set(attrs), (c.__name__, changed)
assert tc.checkpoint is checkpoint
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2))
memsave.wrap(model, "all")  # not a Hugging Face model's blocks: wrap claims the switch of this model only
other = transformers.LlamaForCausalLM(model.config)
names = ("activation_checkpointing_enable", "gradient_checkpointing_enable", "_memsave_switch")
assert all(n in vars(model) for n in names) and not any(n in vars(other) for n in names), sorted(vars(other))
assert not any("_gradient_checkpointing_func" in vars(m) for m in other.modules())
print("ok")
"""


@pytest.mark.slow  # a fresh interpreter importing torch, memsave and transformers (about 10 s)
def test_importing_memsave_patches_nothing_in_transformers():
    out = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
