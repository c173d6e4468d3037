"""memsave.convert is all or nothing: when a rule, a pattern, a swap or a rule's install fails midway, the model is left
exactly as it was (module tree, forwards, parameters, buffers, hooks), and converting it afterwards still works."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from torch import nn

import memsave
from memsave.operators.convert import registry
from memsave.operators.convert.registry import ModuleRule, Replacement, Rewrite


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.fc(x)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[_Block() for _ in range(4)], nn.Sequential(nn.Linear(6, 6), nn.ReLU()), nn.Linear(6, 2))
    model[0].register_forward_hook(lambda m, a, out: None)
    model[1].register_forward_pre_hook(lambda m, a: None)
    return model


def _state(model: nn.Module) -> Dict[str, Any]:
    """Everything convert may change, by identity: modules, parameters, buffers, hooks, instance forwards."""
    return {
        "modules": [(n, id(m), type(m)) for n, m in model.named_modules(remove_duplicate=False)],
        "params": [(n, id(p)) for n, p in model.named_parameters()],
        "buffers": [(n, id(b), b.clone()) for n, b in model.named_buffers()],
        "hooks": [(n, dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in model.named_modules()],
        "forwards": [(n, vars(m).get("forward")) for n, m in model.named_modules()],
        "dicts": [(n, sorted(vars(m))) for n, m in model.named_modules()],
    }


def _assert_unchanged(model: nn.Module, before: Dict[str, Any], x: torch.Tensor, out: torch.Tensor) -> None:
    after = _state(model)
    for key in ("modules", "params", "hooks", "forwards", "dicts"):
        assert after[key] == before[key], key
    for (n0, i0, b0), (n1, i1, b1) in zip(before["buffers"], after["buffers"]):
        assert (n0, i0) == (n1, i1) and torch.equal(b0, b1)
    assert torch.equal(model(x), out)


def _failing_rule(calls: List[int], fail_at: int, where: str) -> ModuleRule:
    def install(module: nn.Module) -> None:
        calls.append(1)
        if where == "install" and len(calls) == fail_at:
            raise RuntimeError("injected install failure")
        module.forward = lambda x, _m=module: _m.act(_m.bn(_m.fc(x)))  # an instance forward, as rules install them

    def rewrite(module: nn.Module) -> Rewrite:
        if where == "rewrite":
            calls.append(1)
            if len(calls) == fail_at:
                raise RuntimeError("injected rule failure")
        return Rewrite(replacements=(Replacement("act", memsave.nn.ReLU(), "a mask"),), install=install)

    return ModuleRule("failing_test_rule", (registry.qualified_class_name(_Block()),), rewrite)


@pytest.mark.parametrize("where", ["rewrite", "install"])
def test_a_rule_failing_on_the_third_block_leaves_the_model_unchanged(where: str, monkeypatch: Any) -> None:
    model = _model()
    model.eval()
    x = torch.randn(3, 6)
    out = model(x)
    before = _state(model)
    calls: List[int] = []
    rule = _failing_rule(calls, 3, where)
    monkeypatch.setitem(registry._RULES, rule.class_names[0], rule)
    with pytest.raises(RuntimeError, match=f"injected {'install' if where == 'install' else 'rule'} failure"):
        memsave.convert(model, fuse=True)
    assert len(calls) == 3  # it did fail midway, after two blocks
    _assert_unchanged(model, before, x, out)
    calls.clear()
    monkeypatch.setitem(registry._RULES, rule.class_names[0], _failing_rule(calls, 99, where))
    memsave.convert(model, fuse=True)  # the same model converts once nothing fails
    assert isinstance(model[2].act, memsave.nn.ReLU) and "forward" in vars(model[3])
    assert torch.equal(model(x), out)


def test_a_swap_failing_midway_leaves_the_model_unchanged(monkeypatch: Any) -> None:
    model = _model()
    x = torch.randn(3, 6)
    model.eval()
    out = model(x)
    before = _state(model)
    built: List[nn.Module] = []

    def build(old: nn.Module) -> nn.Module:
        built.append(old)
        if len(built) == 3:
            raise RuntimeError("injected swap failure")
        return memsave.nn.ReLU()

    swap = registry.ModuleSwap(nn.ReLU, build, lambda m: None, lambda m, p, n: (registry.PAYS, "a mask"))
    monkeypatch.setitem(registry._SWAPS, nn.ReLU, swap)
    with pytest.raises(RuntimeError, match="injected swap failure"):
        memsave.convert(model)
    _assert_unchanged(model, before, x, out)


def test_a_pattern_breaking_the_keys_leaves_the_model_unchanged() -> None:
    model = _model()
    x = torch.randn(3, 6)
    model.eval()
    out = model(x)
    before = _state(model)
    name = "test_key_breaking_pattern"
    registry.register_sequential_pattern(name, (nn.Linear, nn.ReLU), lambda ms: [nn.Identity(), nn.Identity()], "x")
    try:
        with pytest.raises(ValueError, match="state_dict keys"):
            memsave.convert(model, fuse=True)
    finally:
        registry.unregister_sequential_pattern(name)
    _assert_unchanged(model, before, x, out)


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: memsave.nn.RMSNorm(-4), "normalized_shape"),
        (lambda: memsave.nn.RMSNorm(8, eps=-1.0), "eps"),
        (lambda: memsave.nn.RMSNormLinear(0, 4), "in_features"),
        (lambda: memsave.nn.RMSNormLinear(4, -1), "out_features"),
        (lambda: memsave.nn.LayerNormLinear(-8, 4), "normalized_shape"),
        (lambda: memsave.nn.LayerNormLinear(8, 0), "out_features"),
        (lambda: memsave.nn.LayerNormLinear(8, 4, eps=float("nan")), "eps"),
        (lambda: memsave.nn.ActLinear(-1, 4), "in_features"),
        (lambda: memsave.nn.GatedMLP(8, -2), "intermediate_size"),
        (lambda: memsave.nn.GatedMLP(0, 8), "hidden_size"),
        (lambda: memsave.nn.LinearCrossEntropy(8, 0), "num_classes"),
        (lambda: memsave.nn.BatchNormAct2d(-3), "num_features"),
        (lambda: memsave.nn.BatchNormAct2d(3, eps=-1e-5), "eps"),
        (lambda: memsave.nn.BatchNormAct2d(3, momentum=1.5), "momentum"),
        (lambda: memsave.nn.InPlaceABN2d(0), "num_features"),
    ],
)
def test_bad_constructor_arguments_raise_value_error_naming_them(make: Any, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        make()
