"""memsave.wrap / unwrap: in place, state_dict keys unchanged, repr, idempotence, exact unwrap, policies, copies."""

from __future__ import annotations

import copy
import io
import pickle
import warnings
from typing import Any, List

import pytest
import torch
from torch import nn

from helpers import in_backward, models
from memsave.errors import MemsaveWarning
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


def test_wrapping_twice_is_a_noop() -> None:
    model = models.mlp()
    wrap(model, nn.Linear)
    forwards = [m.__dict__.get("forward") for m in model.modules()]
    wrap(model, nn.Linear)
    wrap(model, (nn.Linear, nn.GELU))
    assert [m.__dict__.get("forward") for m in model.modules() if isinstance(m, nn.Linear)] == [
        f for f in forwards if f is not None
    ]
    assert repr(model).count("[memsave.checkpoint]") == 5  # 4 Linear + 1 GELU, once each
    assert wrap_module(model[0], "again") is False
    unwrap(model)
    assert "[memsave.checkpoint]" not in repr(model)


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
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=64)
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
