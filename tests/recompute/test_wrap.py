"""memsave.wrap / unwrap: in place, state_dict keys unchanged, repr, idempotence, exact unwrap, policies, copies."""

from __future__ import annotations

import copy
import io
import pickle
import warnings
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

import memsave
from helpers import in_backward, models
from memsave.errors import MemsaveWarning, WrapConflictError
from memsave.recompute.wrapping import is_wrapped, unwrap, wrap, wrap_module


def _step(model: nn.Module, x: torch.Tensor) -> List[torch.Tensor]:
    torch.manual_seed(11)
    model(x).float().pow(2).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def test_state_dict_repr_and_exact_unwrap() -> None:
    model = models.transformer()
    keys = list(model.state_dict().keys())
    plain_repr = repr(model)
    assert wrap(model, models.TransformerBlock) is model
    assert list(model.state_dict().keys()) == keys
    assert [n for n, m in model.named_modules() if is_wrapped(m)] == [f"blocks.{i}" for i in range(4)]
    text = repr(model)
    assert text.count("[memsave.checkpoint]") == 4
    assert "TransformerBlock(\n      [memsave.checkpoint]" in text
    # Loading a plain checkpoint into the wrapped model and back works with the same keys.
    model.load_state_dict(models.transformer().state_dict())
    assert unwrap(model) is model
    assert repr(model) == plain_repr
    assert not any(is_wrapped(m) for m in model.modules())
    assert all("forward" not in m.__dict__ and "extra_repr" not in m.__dict__ for m in model.modules())


def test_leaf_module_repr_keeps_its_extra_repr() -> None:
    lin = nn.Linear(3, 4)
    wrap(lin, nn.Linear)
    assert repr(lin) == "Linear(in_features=3, out_features=4, bias=True, [memsave.checkpoint])"


def test_wrapped_model_recomputes_and_matches_eager() -> None:
    eager = models.unet()
    ours = copy.deepcopy(eager)
    x = models.example_input("unet")
    expected = _step(eager, x)
    runs = {"fwd": 0, "bwd": 0}

    def hook(module: nn.Module, args: Any) -> None:
        runs["bwd" if in_backward() else "fwd"] += 1

    for block in (ours.enc1, ours.dec1):
        block[0].register_forward_pre_hook(hook)
    wrap(ours, models.DoubleConv)
    got = _step(ours, x)
    assert all(torch.equal(e, g) for e, g in zip(expected, got))
    assert runs == {"fwd": 2, "bwd": 2}
    assert all(torch.equal(a, b) for a, b in zip(eager.buffers(), ours.buffers()))
    unwrap(ours)
    runs.update(fwd=0, bwd=0)
    _step(ours, x)
    assert runs == {"fwd": 2, "bwd": 0}


def test_wrapping_again_with_the_same_regions_is_a_noop() -> None:
    model = models.mlp()
    wrap(model, nn.Linear)
    forwards = [m.__dict__.get("forward") for m in model.modules()]
    wrap(model, nn.Linear)
    wrap(model, lambda name, m: isinstance(m, nn.Linear))  # another policy, the same regions
    assert [m.__dict__.get("forward") for m in model.modules()] == forwards
    assert repr(model).count("[memsave.checkpoint]") == 4
    assert wrap_module(model[0], "again") is False
    unwrap(model)
    assert "[memsave.checkpoint]" not in repr(model)
    # memsave.selective makes a new function at each call: the same classes are the same regions.
    wrap(model, nn.Linear, context_fn=memsave.selective("matmul"))
    forwards = [m.__dict__.get("forward") for m in model.modules()]
    wrap(model, nn.Linear, context_fn=memsave.selective("matmul"))
    assert [m.__dict__.get("forward") for m in model.modules()] == forwards


def test_root_module_and_predicate_policy() -> None:
    eager = models.mlp()
    ours = copy.deepcopy(eager)
    seen: List[str] = []

    def policy(name: str, module: nn.Module) -> bool:
        seen.append(name)
        return name == ""

    wrap(ours, policy)
    assert seen[0] == "" and "0" in seen and is_wrapped(ours) and not is_wrapped(ours[0])
    assert repr(ours).startswith("Sequential(\n  [memsave.checkpoint]\n")
    x = models.example_input("mlp").requires_grad_()
    assert all(torch.equal(e, g) for e, g in zip(_step(eager, x), _step(ours, x)))


def test_policy_errors_and_warning() -> None:
    model = models.mlp()
    with pytest.warns(MemsaveWarning, match="selected no module of Sequential.*class of the blocks"):
        wrap(model, nn.Conv2d)
    with pytest.warns(MemsaveWarning):
        wrap(model, lambda name, m: False)
    with pytest.raises(TypeError, match="module instance.*pass its class"):
        wrap(model, model[0])
    with pytest.raises(TypeError, match="policy must be"):
        wrap(model, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'Bogus' is neither a submodule name nor a module class"):
        wrap(model, "Bogus")
    with pytest.raises(TypeError, match="not an nn.Module subclass"):
        wrap(model, (nn.Linear, int))
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        wrap([nn.Linear(2, 2)], nn.Linear)  # type: ignore[arg-type]
    assert not any(is_wrapped(m) for m in model.modules())


def test_inplace_modules_and_sequential_with_leading_inplace_child() -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 1)),
        nn.ReLU(inplace=True),
    )
    ours = copy.deepcopy(eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrap(ours, lambda name, m: name in ("1", "2"))  # a Sequential starting with ReLU(inplace), and a ReLU
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    expected = _step(eager, x)
    assert all(torch.equal(e, g) for e, g in zip(expected, _step(ours, x)))


def test_existing_instance_forward_is_kept_and_restored() -> None:
    lin = nn.Linear(2, 2)
    calls: List[int] = []
    original = lin.forward

    def patched(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return original(x)

    lin.forward = patched
    wrap(lin, nn.Linear)
    lin(torch.randn(3, 2, requires_grad=True)).sum().backward()
    assert len(calls) == 2  # forward + recompute through the user's own instance forward
    unwrap(lin)
    assert lin.__dict__["forward"] is patched


def test_deepcopy_and_pickle_keep_wrapping() -> None:
    model = models.cnn()
    wrap(model, models.ConvBlock)
    clone = copy.deepcopy(model)
    assert [is_wrapped(m) for m in clone.modules()] == [is_wrapped(m) for m in model.modules()]
    assert clone[0].__dict__["forward"].module is clone[0]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    restored = pickle.loads(pickle.dumps(model))
    x = models.example_input("cnn").requires_grad_()
    expected = _step(model, x)
    for other in (clone, loaded, restored):
        assert other[0].__dict__["forward"].module is other[0]
        assert all(torch.equal(e, g) for e, g in zip(expected, _step(other, x)))
        unwrap(other)
        assert not any(is_wrapped(m) for m in other.modules())


def test_eval_and_no_grad_run_plain_forward() -> None:
    model = models.mlp()
    wrap(model, nn.Linear)
    x = models.example_input("mlp")
    model.eval()
    with torch.no_grad():
        y = model(x)
    unwrap(model)
    with torch.no_grad():
        assert torch.equal(y, model(x))


def test_is_wrapped_is_public_in_recompute() -> None:
    import memsave.recompute

    lin = nn.Linear(2, 2)
    assert not memsave.recompute.is_wrapped(lin)
    wrap(lin, nn.Linear)
    assert memsave.recompute.is_wrapped(lin)


# ------------------------------------------------------------------ Hugging Face KV cache: dropped only in training
def _tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def _cached_step(model: nn.Module, cache: Any, ids: torch.Tensor) -> Any:
    out = model(input_ids=ids, past_key_values=cache, labels=ids, use_cache=True)
    out.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.loss.detach(), grads, out.past_key_values.get_seq_length()


@pytest.mark.slow  # imports transformers (about 10 s here)
def test_eval_mode_keeps_the_kv_cache_and_gives_eager_loss_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    from memsave.recompute import wrapping

    monkeypatch.setattr(wrapping, "_warned_once", set())
    eager = _tiny_gpt2().eval()
    ours = wrap(copy.deepcopy(eager))
    assert [n for n, m in ours.named_modules() if is_wrapped(m)] == ["transformer.h.0", "transformer.h.1"]
    g = torch.Generator().manual_seed(1)
    prompt, ids = torch.randint(0, 64, (2, 6), generator=g), torch.randint(0, 64, (2, 4), generator=g)
    with torch.no_grad():
        cache = eager(input_ids=prompt, use_cache=True).past_key_values
    expected = _cached_step(eager, copy.deepcopy(cache), ids)
    with pytest.warns(MemsaveWarning, match="GPT2Block was given a KV cache in eval mode"):
        got = _cached_step(ours, copy.deepcopy(cache), ids)
    assert torch.equal(expected[0], got[0])
    assert all(torch.equal(e, o) for e, o in zip(expected[1], got[1]))
    assert expected[2] == got[2] == 10  # the cache was written once: prompt + new tokens
    # Without gradients too (evaluation, generation): eager's loss, the cache written once, no warning.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", MemsaveWarning)
        e = eager(input_ids=ids, past_key_values=copy.deepcopy(cache), labels=ids, use_cache=True)
        o = ours(input_ids=ids, past_key_values=copy.deepcopy(cache), labels=ids, use_cache=True)
    assert torch.equal(e.loss, o.loss) and o.past_key_values.get_seq_length() == 10
    # Without the cache the loss differs: the cache did reach the layers.
    out = ours(input_ids=ids, labels=ids, use_cache=False)
    assert not torch.equal(out.loss, expected[0])


@pytest.mark.slow  # imports transformers
def test_training_mode_drops_the_kv_cache_warning_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from memsave.recompute import wrapping

    monkeypatch.setattr(wrapping, "_warned_once", set())
    model = wrap(_tiny_gpt2().train())
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = model(input_ids=ids, labels=ids, use_cache=True)
            out.loss.backward()
    ours = [w for w in caught if issubclass(w.category, MemsaveWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "GPT2Block is a checkpointed region in training mode" in str(ours[0].message)
    assert out.past_key_values is None or out.past_key_values.get_seq_length() == 0


# ------------------------------------------------------------------- one wrap per model: no silent nesting or mixing
def _regions(model: nn.Module) -> Dict[str, Any]:
    return {name: m.__dict__["forward"] for name, m in model.named_modules() if is_wrapped(m)}


def _lm_step(model: nn.Module, ids: torch.Tensor) -> List[torch.Tensor]:
    torch.manual_seed(5)  # the same dropout masks in every model compared
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.slow  # imports transformers
def test_a_second_wrap_with_other_regions_is_refused_and_changes_nothing() -> None:
    eager = _tiny_gpt2().train()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    model = wrap(copy.deepcopy(eager))
    regions = _regions(model)
    assert list(regions) == ["transformer.h.0", "transformer.h.1"]
    mlp = type(model.transformer.h[0].mlp)
    nested = r"already has memsave regions \('transformer.h.0', 'transformer.h.1'; .*would nest 'transformer.h.0.mlp' "
    with pytest.raises(WrapConflictError, match=nested + r"inside 'transformer.h.0'.*memsave.unwrap\(model\) first"):
        wrap(model, mlp)
    with pytest.raises(WrapConflictError, match=r"would nest 'transformer.h.0' inside 'transformer'"):
        wrap(model, "all")  # the model's top-level stages: transformer (holding the blocks) and lm_head
    with pytest.raises(WrapConflictError, match="other regions \\('lm_head'\\).*would mix the two choices"):
        wrap(model, lambda name, m: name == "lm_head")
    with pytest.raises(WrapConflictError, match="on the same modules .*context_fn"):
        wrap(model, context_fn=memsave.selective("matmul"))
    assert _regions(model) == regions  # the very same region objects: nothing was changed
    assert all(torch.equal(e, g) for e, g in zip(_lm_step(eager, ids), _lm_step(model, ids)))
    wrap(model)  # the same policy again: a no-op
    assert _regions(model) == regions
    wrap(unwrap(model), mlp)  # unwrap first: the MLPs alone are regions now
    assert list(_regions(model)) == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    assert all(torch.equal(e, g) for e, g in zip(_lm_step(eager, ids), _lm_step(model, ids)))


@pytest.mark.slow  # imports transformers
def test_wrapping_a_module_inside_another_models_region_is_refused() -> None:
    model = wrap(_tiny_gpt2())
    clone = copy.deepcopy(model)  # a copy's regions count too
    conv1d = type(model.transformer.h[0].mlp.c_fc)
    for inner, region in ((model.transformer.h[0].mlp, "transformer.h.0"), (clone.transformer.h[1].attn, "h.1")):
        with pytest.raises(WrapConflictError, match=rf"runs inside the memsave region '[a-z.]*{region}' .*unwrap"):
            wrap(inner, conv1d)
        assert not any(is_wrapped(m) for m in inner.modules())
    wrap(model.lm_head, nn.Linear)  # outside every region: allowed
    assert is_wrapped(model.lm_head)
    unwrap(model)
    wrap(model.transformer.h[0].mlp, conv1d)  # the model's regions are gone: nothing to nest in
    assert list(_regions(model)) == ["transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj"]


@pytest.mark.slow  # imports transformers, plans
def test_a_plan_on_a_wrapped_model_follows_the_same_rule() -> None:
    model = _tiny_gpt2().train()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(4))
    p = memsave.plan(
        model,
        ids,
        example_kwargs={"labels": ids, "use_cache": False},
        solver="sqrt",
        timing_steps=1,
        verify=False,
        progress=False,
    )
    wrap(model)
    blocks = _regions(model)
    for apply in (lambda: wrap(model, p), lambda: p.apply_to(model)):
        with pytest.raises(WrapConflictError, match=r"memsave.wrap\(model, plan\): GPT2LMHeadModel already has"):
            apply()
        assert _regions(model) == blocks
    wrap(unwrap(model), p)
    planned = _regions(model)
    assert list(planned) == [name for region in p.regions() for name in region]
    wrap(model, p)  # applying the same plan again: a no-op
    p.apply_to(model)
    assert _regions(model) == planned
    with pytest.raises(WrapConflictError, match="memsave.wrap: GPT2LMHeadModel already has memsave regions"):
        wrap(model)


def _squeezenet() -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.squeezenet1_1(num_classes=10)


def test_a_second_wrap_nesting_regions_in_a_cnn_is_refused() -> None:
    model = wrap(_squeezenet())  # its Fire modules
    regions = _regions(model)
    with pytest.raises(WrapConflictError, match=r"would nest 'features.3.squeeze' inside 'features.3'.*unwrap"):
        wrap(model, nn.Conv2d)
    with pytest.raises(WrapConflictError, match=r"runs inside the memsave region 'features.4'"):
        wrap(model.features[4].squeeze, nn.Conv2d)
    assert _regions(model) == regions


def test_convert_after_wrap_keeps_regions_around_swaps_and_refuses_to_replace_one() -> None:
    eager = _squeezenet()
    x = torch.randn(2, 3, 24, 24)
    pools = wrap(copy.deepcopy(eager), nn.MaxPool2d)
    before = repr(pools)
    with pytest.raises(WrapConflictError, match=r"would replace features.2, features.5, features.8, .*Convert first"):
        memsave.convert(pools)
    assert repr(pools) == before and type(pools.features[2]) is nn.MaxPool2d
    # Swaps inside a region keep it: the Fire blocks stay regions around memsave's ReLUs, and stay exact.
    fires = memsave.convert(wrap(copy.deepcopy(eager)))
    assert list(_regions(fires)) == [f"features.{i}" for i in (3, 4, 6, 7, 9, 10, 11, 12)]
    assert isinstance(fires.features[3].squeeze_activation, memsave.nn.ReLU)
    assert all(torch.equal(e, g) for e, g in zip(_step(eager, x), _step(fires, x)))


def test_region_options_are_one_checked_value() -> None:
    from memsave.recompute.region import RegionOptions

    options = RegionOptions.checked("wrap", strict=True, context_fn=torch.utils.checkpoint.noop_context_fn)
    assert options == RegionOptions(strict=True) and options.context_fn is None  # torch's no-op read as none
    with pytest.raises(TypeError, match=r"memsave.wrap: unknown region option\(s\) name_of_region"):
        RegionOptions.checked("wrap", name_of_region="x")
    with pytest.raises(TypeError, match="memsave.Plan.apply_to: strict must be True or False, got 'yes'"):
        RegionOptions.checked("Plan.apply_to", strict="yes")
    with pytest.raises(TypeError, match="context_fn must be a function"):
        RegionOptions.checked("wrap", context_fn=3)


def test_a_region_pickled_with_the_old_option_attributes_loads_with_its_options() -> None:
    # memsave 0.3 kept preserve_rng_state, strict and context_fn as three attributes of the wrapped forward.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    wrap(model, nn.Linear, preserve_rng_state=False, strict=True)
    forward = model[0].__dict__["forward"]
    state = dict(forward.__dict__)
    options = state.pop("options")
    state.update(preserve_rng_state=options.preserve_rng_state, strict=options.strict, context_fn=None)
    old = type(forward).__new__(type(forward))
    old.__setstate__(state)
    assert old.options == options and not hasattr(old, "strict")
    x = torch.randn(3, 4)
    model[0].__dict__["forward"] = old
    got = _step(model, x)
    unwrap(model)
    assert all(torch.equal(a, b) for a, b in zip(got, _step(model, x)))
