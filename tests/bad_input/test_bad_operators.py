"""Wrong calls of the memory-efficient operators: the memsave.nn constructors and memsave.functional. Each raises its
documented type naming the argument (a meta-device weight against a real input included) and changes nothing."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch import nn

from bad_input.checking import Case, World, check, params
from bad_input.checking import rand as r
from memsave import functional as F
from memsave import nn as mnn
from memsave.errors import UnsupportedTransformError

TARGET = torch.zeros(4, dtype=torch.long)
LONG = torch.ones(4, 8, dtype=torch.long)


def meta(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, device="meta")


X = r(4, 8)
IMG = r(2, 3, 8, 8)
NO_CHANNELS = r(2, 0, 4, 4)
BN = (torch.zeros(3), torch.ones(3))  # running statistics, copied by the calls that update them


def fresh(make: Callable[[], Any]) -> Any:
    """A module built without drawing from the global RNG a case's check watches."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return make()


def memsave_model() -> nn.Module:
    """A model holding memsave.nn modules between torch Linears (what memsave.convert makes of a ReLU MLP)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), mnn.ReLU(), mnn.Dropout(0.1), nn.Linear(8, 2))


def dual(fn: Callable[..., Any], *primals: torch.Tensor) -> Callable[[World], Any]:
    """``fn`` run on dual tensors (torch.autograd.forward_ad), each with a tangent of ones."""

    def call(w: World) -> Any:
        with fwAD.dual_level():
            return fn(*(fwAD.make_dual(p, torch.ones_like(p)) for p in primals))

    return call


def jvp(fn: Callable[..., Any], *primals: torch.Tensor) -> Callable[[World], Any]:
    """``torch.func.jvp`` of ``fn`` at ``primals`` (module arguments are built inside, from ``fn()``)."""
    return lambda w: torch.func.jvp(fn, primals, tuple(torch.ones_like(p) for p in primals))


def module_jvp(make: Callable[[], Any], *primals: torch.Tensor) -> Callable[[World], Any]:
    return lambda w: jvp(fresh(make), *primals)(w)


def func_grad(fn: Callable[..., torch.Tensor], *primals: torch.Tensor) -> Callable[[World], Any]:
    """``torch.func.grad`` of ``fn(...).sum()``."""
    return lambda w: torch.func.grad(lambda *a: fn(*a).float().sum())(*primals)


def script(make: Callable[[], Any]) -> Callable[[World], Any]:
    return lambda w: torch.jit.script(fresh(make))


def tile_lse(class_start: int, num_classes: int) -> Callable[[World], Any]:
    logits, target = r(4, 3), torch.zeros(4, dtype=torch.long)
    state = torch.zeros(4, 3, dtype=torch.float64)
    return lambda w: torch.ops.memsave.cross_entropy_tile_lse_(logits, target, state, class_start, num_classes, -100, 0)


def tile_grad(class_start: int, num_classes: int) -> Callable[[World], Any]:
    logits, target = r(4, 3), torch.zeros(4, dtype=torch.long)
    lse, scale = torch.zeros(4, dtype=torch.float64), torch.ones(1)
    return lambda w: torch.ops.memsave.cross_entropy_tile_grad_(
        logits.clone(), target, lse, scale, class_start, num_classes, -100, 0.0
    )


def _bn_act(op: Callable[..., Any], act: str = "relu") -> Callable[[torch.Tensor], Any]:
    return lambda x: op(x * 1.0, BN[0].clone(), BN[1].clone(), training=True, act=act)


_NO_JVP = r"memsave\.{} has no forward-mode AD rule.*use the torch modules it replaces"
_NO_FUNC = r"memsave\.{} cannot be differentiated under torch\.func transforms.*torch\.autograd\.grad"
_NO_SCRIPT = r"torch\.jit\.script cannot compile memsave\.nn\.{}.*torch\.compile"


def no_jvp(case_id: str, call: Callable[[World], Any], op: str) -> Case:
    """``call`` runs memsave.``op`` under forward-mode AD: it must raise UnsupportedTransformError naming ``op``."""
    return Case(case_id, call, UnsupportedTransformError, _NO_JVP.format(op))


def no_func(case_id: str, call: Callable[[World], Any], op: str) -> Case:
    """``call`` differentiates memsave.``op`` under a torch.func transform: UnsupportedTransformError naming ``op``."""
    return Case(case_id, call, UnsupportedTransformError, _NO_FUNC.format(op))


def no_script(module: type, *args: Any, names: str = "") -> Case:
    """torch.jit.script of ``module(*args)`` must raise UnsupportedTransformError naming the class (or ``names``)."""
    name = module.__name__
    return Case(
        f"script-{name}", script(lambda: module(*args)), UnsupportedTransformError, _NO_SCRIPT.format(names or name)
    )


G = r(4, 16)
W16 = r(8, 16)
TARGET4 = torch.zeros(4, dtype=torch.long)

CASES = [
    # ---- memsave.nn constructors
    Case("RMSNorm-negative", lambda w: mnn.RMSNorm(-4), ValueError, r"normalized_shape must be a positive int.*-4"),
    Case("RMSNorm-zero", lambda w: mnn.RMSNorm(0), ValueError, r"normalized_shape must be a positive int"),
    Case("RMSNorm-str", lambda w: mnn.RMSNorm("8"), TypeError, r"normalized_shape .*string '8'"),
    Case("RMSNorm-eps-negative", lambda w: mnn.RMSNorm(8, eps=-1.0), ValueError, r"eps must be a finite number >= 0"),
    Case("RMSNorm-eps-str", lambda w: mnn.RMSNorm(8, eps="x"), ValueError, r"\beps\b"),
    Case("Dropout-p-above-1", lambda w: mnn.Dropout(1.5), ValueError, r"dropout probability .*between 0 and 1.*1\.5"),
    Case("Dropout-p-negative", lambda w: mnn.Dropout(-0.1), ValueError, r"dropout probability .*between 0 and 1"),
    Case("LeakyReLU-slope-str", lambda w: mnn.LeakyReLU("a"), TypeError, r"negative_slope"),
    Case("MaxPool2d-kernel-0", lambda w: mnn.MaxPool2d(0), ValueError, r"kernel_size.* must be positive"),
    Case("MaxPool2d-kernel-negative", lambda w: mnn.MaxPool2d(-2), ValueError, r"kernel_size.*must be positive"),
    Case("MaxPool2d-stride-0", lambda w: mnn.MaxPool2d(2, stride=0), ValueError, r"stride.*stride=\[0, 0\]"),
    Case("MaxPool2d-padding", lambda w: mnn.MaxPool2d(2, padding=3), ValueError, r"pad.*padding=\[3, 3\]"),
    Case("MaxPool2d-dilation-0", lambda w: mnn.MaxPool2d(2, dilation=0), ValueError, r"dilation=\[0, 0\]"),
    Case("ActLinear-act", lambda w: mnn.ActLinear(8, 8, act="bogus"), ValueError, r"unknown activation 'bogus'"),
    Case("ActLinear-in_features-0", lambda w: mnn.ActLinear(0, 8), ValueError, r"in_features must be a positive"),
    Case("ActLinear-out_features-negative", lambda w: mnn.ActLinear(8, -1), ValueError, r"out_features must be"),
    Case("ActLinear-in_features-str", lambda w: mnn.ActLinear("8", 8), ValueError, r"in_features must be .*'8'"),
    Case("GatedMLP-act", lambda w: mnn.GatedMLP(8, 16, act="bogus"), ValueError, r"unknown gated activation 'bogus'"),
    Case("GatedMLP-hidden_size-0", lambda w: mnn.GatedMLP(0, 16), ValueError, r"hidden_size must be a positive int"),
    Case("GatedMLP-intermediate-negative", lambda w: mnn.GatedMLP(8, -16), ValueError, r"intermediate_size must be"),
    Case("LayerNormLinear-shape", lambda w: mnn.LayerNormLinear(-8, 4), ValueError, r"normalized_shape must be"),
    Case("LayerNormLinear-out-0", lambda w: mnn.LayerNormLinear(8, 0), ValueError, r"out_features must be"),
    Case("LayerNormLinear-eps", lambda w: mnn.LayerNormLinear(8, 4, eps=-1.0), ValueError, r"eps must be a finite"),
    Case("LCE-reduction", lambda w: mnn.LinearCrossEntropy(8, 4, reduction="avg"), ValueError, r"reduction must be"),
    Case(
        "LCE-label_smoothing",
        lambda w: mnn.LinearCrossEntropy(8, 4, label_smoothing=1.5),
        ValueError,
        r"label_smoothing must be in \[0, 1\]",
    ),
    Case("LCE-num_classes-0", lambda w: mnn.LinearCrossEntropy(8, 0), ValueError, r"num_classes must be a positive"),
    Case("RMSNormLinear-in-0", lambda w: mnn.RMSNormLinear(0, 4), ValueError, r"in_features must be a positive int"),
    Case("RMSNormLinear-eps", lambda w: mnn.RMSNormLinear(8, 4, eps=-1.0), ValueError, r"eps must be a finite"),
    Case("BatchNormAct2d-act", lambda w: mnn.BatchNormAct2d(8, act="bogus"), ValueError, r"activation 'bogus'"),
    Case("BatchNormAct2d-features-0", lambda w: mnn.BatchNormAct2d(0), ValueError, r"num_features must be"),
    Case("BatchNormAct2d-momentum", lambda w: mnn.BatchNormAct2d(8, momentum=2.0), ValueError, r"momentum must be"),
    Case("BatchNormAct2d-eps", lambda w: mnn.BatchNormAct2d(8, eps=-1.0), ValueError, r"eps must be a finite"),
    Case("InPlaceABN2d-not-invertible", lambda w: mnn.InPlaceABN2d(8, act="gelu"), ValueError, r"'gelu' is not inv"),
    Case("BatchNormActConv2d-groups", lambda w: mnn.BatchNormActConv2d(8, 6, 3, groups=4), ValueError, r"groups"),
    Case("BatchNormActConv2d-kernel-0", lambda w: mnn.BatchNormActConv2d(8, 8, 0), ValueError, r"kernel_size"),
    # ---- memsave.functional
    Case("relu-list", lambda w: F.relu([1.0]), TypeError, r"relu expects a torch\.Tensor, got list"),
    Case("leaky_relu-slope-str", lambda w: F.leaky_relu(X, "a"), TypeError, r"negative_slope"),
    Case("dropout-p", lambda w: F.dropout(X, 1.5), ValueError, r"dropout: dropout probability"),
    Case("dropout-int-input", lambda w: F.dropout(LONG, 0.5), TypeError, r"dropout expects a floating-point tensor"),
    Case("rms_norm-meta-weight", lambda w: F.rms_norm(X, meta(8)), RuntimeError, r"weight is on meta"),
    Case("rms_norm-weight-shape", lambda w: F.rms_norm(X, torch.ones(5)), ValueError, r"weight must have shape \[8\]"),
    Case(
        "rms_norm-weight-dtype",
        # An integer weight; a float64 one is promoted, as Hugging Face's LlamaRMSNorm promotes it.
        lambda w: F.rms_norm(X, torch.ones(8, dtype=torch.long)),
        RuntimeError,
        r"weight",
    ),
    Case("rms_norm-eps", lambda w: F.rms_norm(X, torch.ones(8), eps=-1.0), ValueError, r"eps must be >= 0"),
    Case("rms_norm-int-input", lambda w: F.rms_norm(LONG, torch.ones(8)), TypeError, r"floating-point tensor"),
    Case("rms_norm-list", lambda w: F.rms_norm([1.0], torch.ones(8)), TypeError, r"rms_norm expects a torch\.Tensor"),
    Case("max_pool2d-1d", lambda w: F.max_pool2d(r(8), 2), ValueError, r"expected a 3D .* or 4D"),
    Case("max_pool2d-kernel-0", lambda w: F.max_pool2d(IMG, 0), ValueError, r"kernel_size.*must be positive"),
    Case("max_pool2d-kernel-large", lambda w: F.max_pool2d(IMG, 20), ValueError, r"kernel_size=\[20, 20\] has 400"),
    Case("act_linear-act", lambda w: F.act_linear(X, r(4, 8), act="bogus"), ValueError, r"activation 'bog"),
    Case("act_linear-weight-shape", lambda w: F.act_linear(X, r(4, 5)), ValueError, r"weight must have sh"),
    Case("act_linear-meta-weight", lambda w: F.act_linear(X, meta(4, 8)), RuntimeError, r"weight is on meta"),
    Case(
        "act_linear-weight-dtype",
        # An integer weight; a float64 one sets the compute dtype, as the weight does under autocast.
        lambda w: F.act_linear(X, torch.ones(4, 8, dtype=torch.long)),
        RuntimeError,
        r"weight",
    ),
    Case("act_linear-bias-shape", lambda w: F.act_linear(X, r(4, 8), r(3)), ValueError, r"bias m"),
    Case("gated_act-up-shape", lambda w: F.gated_act(X, r(4, 7)), ValueError, r"up must have gate's shape"),
    Case("gated_act-act", lambda w: F.gated_act(X, X, act="bogus"), ValueError, r"gated activation 'bogus'"),
    Case("gated_act_linear-shape", lambda w: F.gated_act_linear(X, X, r(4, 5)), ValueError, r"weight must"),
    Case("gated_act_linear-meta", lambda w: F.gated_act_linear(X, X, meta(4, 8)), RuntimeError, r"weight is on meta"),
    Case(
        "layer_norm_linear-normalized_shape",
        lambda w: F.layer_norm_linear(X, 5, None, None, r(4, 8)),
        ValueError,
        r"normalized_shape \[5\] must equal",
    ),
    Case(
        "layer_norm_linear-weight-shape",
        lambda w: F.layer_norm_linear(X, 8, None, None, r(4, 5)),
        ValueError,
        r"weight must have shape",
    ),
    Case(
        "linear_cross_entropy-target-float",
        lambda w: F.linear_cross_entropy(X, r(3, 8), r(4)),
        TypeError,
        r"target must hold int64",
    ),
    Case(
        "linear_cross_entropy-target-length",
        lambda w: F.linear_cross_entropy(X, r(3, 8), torch.zeros(5, dtype=torch.long)),
        ValueError,
        r"target must have hidden's leading shape",
    ),
    Case(
        "linear_cross_entropy-reduction",
        lambda w: F.linear_cross_entropy(X, r(3, 8), TARGET, reduction="avg"),
        ValueError,
        r"reduction must be 'mean', 'sum' or 'none'",
    ),
    Case(
        "linear_cross_entropy-label_smoothing",
        lambda w: F.linear_cross_entropy(X, r(3, 8), TARGET, label_smoothing=-0.1),
        ValueError,
        r"label_smoothing must be in \[0, 1\]",
    ),
    Case(
        "linear_cross_entropy-weight-shape",
        lambda w: F.linear_cross_entropy(X, r(3, 5), TARGET),
        ValueError,
        r"weight must have shape \[num_classes, 8\]",
    ),
    Case(
        "linear_cross_entropy-meta-weight",
        lambda w: F.linear_cross_entropy(X, meta(3, 8), TARGET),
        RuntimeError,
        r"meta",
    ),
    Case(
        "rms_norm_linear-meta-weight",
        lambda w: F.rms_norm_linear(X, torch.ones(8), meta(4, 8)),
        RuntimeError,
        r"weights\[0\] is on meta",
    ),
    Case(
        "rms_norm_linear-meta-norm_weight",
        lambda w: F.rms_norm_linear(X, meta(8), r(4, 8)),
        RuntimeError,
        r"norm_weight is on meta",
    ),
    Case(
        "rms_norm_linear-weight-shape",
        lambda w: F.rms_norm_linear(X, torch.ones(8), r(4, 5)),
        ValueError,
        r"weights\[0\] must have shape",
    ),
    Case(
        "rms_norm_linear-no-weights",
        lambda w: F.rms_norm_linear(X, torch.ones(8), []),
        ValueError,
        r"weights must hold at least one",
    ),
    Case(
        "batch_norm_act-act",
        lambda w: F.batch_norm_act(IMG, None, None, training=True, act="bogus"),
        ValueError,
        r"activation 'bogus'",
    ),
    Case(
        "batch_norm_act-meta-weight",
        lambda w: F.batch_norm_act(IMG, torch.zeros(3), torch.ones(3), meta(3), torch.zeros(3)),
        RuntimeError,
        r"weight is on meta",
    ),
    Case(
        "batch_norm_act-running_mean-shape",
        lambda w: F.batch_norm_act(IMG, torch.zeros(5), torch.ones(5)),
        ValueError,
        r"running_mean must have shape \[3\]",
    ),
    # ---- forward-mode AD through an operator without a jvp rule: a clear error, not a silent zero tangent
    no_jvp("forward_ad-rms_norm", dual(lambda x: F.rms_norm(x, None), X), "rms_norm"),
    no_jvp("forward_ad-rms_norm-weight-only", dual(lambda w: F.rms_norm(X, w), torch.ones(8)), "rms_norm"),
    no_jvp("forward_ad-act_linear", dual(lambda x: F.act_linear(x, r(4, 8), act="gelu"), X), "act_linear"),
    no_jvp("forward_ad-act_linear-weight-only", dual(lambda w: F.act_linear(X, w), r(4, 8)), "act_linear"),
    no_jvp("forward_ad-gated_act_linear", dual(lambda g: F.gated_act_linear(g, G, W16), G), "gated_act_linear"),
    no_jvp(
        "forward_ad-layer_norm_linear",
        dual(lambda x: F.layer_norm_linear(x, 8, None, None, r(4, 8)), X),
        "layer_norm_linear",
    ),
    no_jvp(
        "forward_ad-rms_norm_linear",
        dual(lambda x: F.rms_norm_linear(x, torch.ones(8), [r(4, 8), r(2, 8)]), X),
        "rms_norm_linear",
    ),
    no_jvp(
        "forward_ad-linear_cross_entropy",
        dual(lambda h: F.linear_cross_entropy(h, r(3, 8), TARGET4), X),
        "linear_cross_entropy",
    ),
    no_jvp("forward_ad-batch_norm_act", dual(_bn_act(F.batch_norm_act), IMG), "batch_norm_act"),
    no_jvp("forward_ad-inplace_abn", dual(_bn_act(F.inplace_abn, "leaky_relu"), IMG), "inplace_abn"),
    no_jvp(
        "forward_ad-batch_norm_act_conv2d",
        dual(lambda x: F.batch_norm_act_conv2d(x, None, None, None, None, r(4, 3, 1, 1), training=True), IMG),
        "batch_norm_act_conv2d",
    ),
    no_jvp(
        "forward_ad-gated_act_backward",
        dual(lambda g: torch.ops.memsave.gated_act_backward(g, X, X, "silu"), X),
        "gated_act_backward",
    ),
    no_jvp("jvp-RMSNorm", module_jvp(lambda: mnn.RMSNorm(8), X), "rms_norm"),
    no_jvp("jvp-ActLinear", module_jvp(lambda: mnn.ActLinear(8, 4), X), "act_linear"),
    no_jvp("jvp-GatedMLP", module_jvp(lambda: mnn.GatedMLP(8, 16), X), "gated_act_linear"),
    no_jvp("jvp-LayerNormLinear", module_jvp(lambda: mnn.LayerNormLinear(8, 4), X), "layer_norm_linear"),
    no_jvp("jvp-RMSNormLinear", module_jvp(lambda: mnn.RMSNormLinear(8, 4), X), "rms_norm_linear"),
    # (the batch norms in eval mode: in training, torch's own num_batches_tracked update is refused under jvp)
    no_jvp("jvp-BatchNormAct2d", module_jvp(lambda: mnn.BatchNormAct2d(3).eval(), IMG), "batch_norm_act"),
    no_jvp("jvp-InPlaceABN2d", module_jvp(lambda: mnn.InPlaceABN2d(3).eval(), IMG), "inplace_abn"),
    no_jvp(
        "jvp-BatchNormActConv2d",
        module_jvp(lambda: mnn.BatchNormActConv2d(3, 4, 3, padding=1).eval(), IMG),
        "batch_norm_act_conv2d",
    ),
    no_jvp(
        "jvp-LinearCrossEntropy",
        lambda w: torch.func.jvp(lambda h: fresh(lambda: mnn.LinearCrossEntropy(8, 3))(h, TARGET4), (X,), (X,)),
        "linear_cross_entropy",
    ),
    # ---- torch.func transforms that differentiate: a clear error naming the operator, not torch's internal one
    no_func("func_grad-relu", func_grad(F.relu, X), "relu"),
    no_func("func_grad-leaky_relu", func_grad(lambda x: F.leaky_relu(x, 0.2), X), "leaky_relu"),
    no_func("func_grad-dropout", func_grad(lambda x: F.dropout(x, 0.5), X), "dropout"),
    no_func("func_grad-relu-inplace", func_grad(lambda x: F.relu(x * 1.0, inplace=True), X), "relu"),
    no_func("func_grad-max_pool2d", func_grad(lambda x: F.max_pool2d(x, 2), IMG), "max_pool2d"),
    no_func("func_grad-gated_act", func_grad(lambda g: F.gated_act(g, G), G), "gated_act"),
    no_func("func_grad-rms_norm", func_grad(lambda x: F.rms_norm(x, None), X), "rms_norm"),
    no_func("func_grad-batch_norm_act", func_grad(_bn_act(F.batch_norm_act), IMG), "batch_norm_act"),
    no_func("func_vjp-act_linear", lambda w: torch.func.vjp(lambda x: F.act_linear(x, r(4, 8)), X), "act_linear"),
    no_func(
        "func_jacrev-linear_cross_entropy",
        lambda w: torch.func.jacrev(lambda h: F.linear_cross_entropy(h, r(3, 8), TARGET4))(X),
        "linear_cross_entropy",
    ),
    Case(
        "func_grad-model-with-memsave-modules",
        lambda w: torch.func.grad(lambda x: w.model(x).sum())(w.x),
        UnsupportedTransformError,
        _NO_FUNC.format("relu"),
        model=memsave_model,
    ),
    # ---- torch.jit.script of memsave modules: refused at once, naming memsave and what to use
    no_script(mnn.ReLU),
    no_script(mnn.LeakyReLU, 0.2),
    no_script(mnn.Dropout, 0.1),
    no_script(mnn.MaxPool2d, 2),
    no_script(mnn.RMSNorm, 8),
    no_script(mnn.ActLinear, 8, 4),
    no_script(mnn.GatedMLP, 8, 16),
    no_script(mnn.LayerNormLinear, 8, 4),
    no_script(mnn.RMSNormLinear, 8, 4),
    no_script(mnn.BatchNormAct2d, 3),
    no_script(mnn.InPlaceABN2d, 3),
    no_script(mnn.BatchNormActConv2d, 3, 4, 3, names="(BatchNormActConv2d|DeferredBatchNormAct2d)"),
    no_script(mnn.LinearCrossEntropy, 8, 3),
    Case(
        "script-model-with-memsave-modules",
        lambda w: torch.jit.script(w.model),
        UnsupportedTransformError,
        _NO_SCRIPT.format(r"\w+"),
        model=memsave_model,
    ),
    # ---- the linear_cross_entropy tile operators' class range, checked without overflowing class_start + width
    Case(
        "tile_lse-class_start-overflow", tile_lse(2**63 - 2, 10), ValueError, r"3 classes starting at class_start=9223"
    ),
    Case(
        "tile_lse-class_start-negative",
        tile_lse(-1, 10),
        ValueError,
        r"class_start=-1 must lie in \[0, num_classes=10\)",
    ),
    Case("tile_lse-past-the-end", tile_lse(8, 10), ValueError, r"class_start=8 must lie in \[0, num_classes=10\)"),
    Case("tile_lse-num_classes-0", tile_lse(0, 0), ValueError, r"num_classes must be >= 1, got 0"),
    Case("tile_grad-class_start-overflow", tile_grad(2**63 - 1, 10), ValueError, r"class_start=9223372036854775807"),
    Case("tile_grad-num_classes-negative", tile_grad(0, -5), ValueError, r"num_classes must be >= 1, got -5"),
    # ---- memsave.nn constructors and forwards: wrong types refused at construction, not read as truthy
    Case(
        "ReLU-inplace-str",
        lambda w: mnn.ReLU(inplace="yes"),
        TypeError,
        r"ReLU: inplace must be True or False, got 'yes'",
    ),
    Case("LeakyReLU-slope-nan", lambda w: mnn.LeakyReLU(float("nan")), ValueError, r"negative_slope must be a finite"),
    Case("LeakyReLU-inplace-int", lambda w: mnn.LeakyReLU(0.1, inplace=1), TypeError, r"inplace must be True or False"),
    Case("Dropout-p-str", lambda w: mnn.Dropout("0.5"), TypeError, r"Dropout: p must be a number, got '0.5'"),
    Case("Dropout-p-nan", lambda w: mnn.Dropout(float("nan")), ValueError, r"between 0 and 1, but got nan"),
    Case(
        "Dropout-inplace-str",
        lambda w: mnn.Dropout(0.5, inplace="no"),
        TypeError,
        r"inplace must be True or False, got 'no'",
    ),
    Case(
        "RMSNorm-float",
        lambda w: mnn.RMSNorm(8.0),
        TypeError,
        r"normalized_shape must be an int or a 1-tuple.*float 8\.0",
    ),
    Case(
        "RMSNorm-forward-int",
        lambda w: fresh(lambda: mnn.RMSNorm(8))(LONG),
        TypeError,
        r"floating-point",
    ),
    Case(
        "ActLinear-bias-str", lambda w: mnn.ActLinear(8, 4, bias="yes"), TypeError, r"ActLinear: bias must be True or"
    ),
    Case("ActLinear-act-None", lambda w: mnn.ActLinear(8, 4, act=None), ValueError, r"unknown activation None"),
    Case(
        "ActLinear-act_param-str",
        lambda w: mnn.ActLinear(8, 4, act="leaky_relu", act_param="x"),
        TypeError,
        r"act_param must be a number, got 'x'",
    ),
    Case(
        "GatedMLP-bias-str", lambda w: mnn.GatedMLP(8, 16, bias="x"), TypeError, r"GatedMLP: bias must be True or False"
    ),
    Case(
        "GatedMLP-forward-width",
        lambda w: fresh(lambda: mnn.GatedMLP(8, 16))(r(4, 5)),
        ValueError,
        r"GatedMLP: expected an input whose last dimension is gate_proj's in_features=8, got shape \(4, 5\)",
    ),
    Case(
        "GatedMLP-forward-list",
        lambda w: fresh(lambda: mnn.GatedMLP(8, 16))([1.0]),
        TypeError,
        r"GatedMLP expects a torch",
    ),
    Case(
        "LayerNormLinear-bias-str",
        lambda w: mnn.LayerNormLinear(8, 4, bias="no"),
        TypeError,
        r"bias must be True or Fa",
    ),
    Case("RMSNormLinear-bias-int", lambda w: mnn.RMSNormLinear(8, 4, bias=1), TypeError, r"bias must be True or False"),
    Case("LCE-bias-str", lambda w: mnn.LinearCrossEntropy(8, 3, bias="x"), TypeError, r"bias must be True or False"),
    Case(
        "LCE-ignore_index-str",
        lambda w: mnn.LinearCrossEntropy(8, 3, ignore_index="x"),
        TypeError,
        r"ignore_index must",
    ),
    Case(
        "LCE-ignore_index-float", lambda w: mnn.LinearCrossEntropy(8, 3, ignore_index=1.5), TypeError, r"ignore_index"
    ),
    Case(
        "BatchNormAct2d-momentum-str",
        lambda w: mnn.BatchNormAct2d(3, momentum="x"),
        TypeError,
        r"momentum must be None",
    ),
    Case(
        "BatchNormActConv2d-stride-0",
        lambda w: mnn.BatchNormActConv2d(3, 4, 3, stride=0),
        ValueError,
        r"stride must be an",
    ),
    Case(
        "BatchNormActConv2d-padding-negative",
        lambda w: mnn.BatchNormActConv2d(3, 4, 3, padding=-1),
        ValueError,
        r"padding must be an int >= 0",
    ),
    Case(
        "BatchNormActConv2d-dilation-0",
        lambda w: mnn.BatchNormActConv2d(3, 4, 3, dilation=(1, 0)),
        ValueError,
        r"dilation must be an int >= 1 or a pair",
    ),
    Case(
        "BatchNormActConv2d-out-0", lambda w: mnn.BatchNormActConv2d(3, 0, 3), ValueError, r"out_channels must be a pos"
    ),
    # ---- memsave.functional: wrong types named, not converted or passed to the dispatcher
    Case("dropout-p-str", lambda w: F.dropout(X, "0.5"), TypeError, r"dropout: p must be a number, got '0.5'"),
    Case("dropout-p-nan", lambda w: F.dropout(X, float("nan")), ValueError, r"between 0 and 1, but got nan"),
    Case(
        "rms_norm-eps-str", lambda w: F.rms_norm(X, torch.ones(8), eps="x"), TypeError, r"rms_norm: eps must be a num"
    ),
    Case("rms_norm-eps-nan", lambda w: F.rms_norm(X, torch.ones(8), eps=float("nan")), ValueError, r"eps must be >= 0"),
    Case(
        "rms_norm-weight-list", lambda w: F.rms_norm(X, [1.0] * 8), TypeError, r"weight must be a tensor or None, got l"
    ),
    Case(
        "act_linear-act_param-str",
        lambda w: F.act_linear(X, r(4, 8), act="elu", act_param="x"),
        TypeError,
        r"act_param",
    ),
    Case(
        "layer_norm_linear-eps-negative",
        lambda w: F.layer_norm_linear(X, 8, None, None, r(4, 8), eps=-1.0),
        ValueError,
        r"layer_norm_linear: eps must be a finite number >= 0, got -1\.0",
    ),
    Case(
        "layer_norm_linear-eps-str",
        lambda w: F.layer_norm_linear(X, 8, None, None, r(4, 8), eps="1e-5"),
        TypeError,
        r"eps must be a number",
    ),
    Case(
        "linear_cross_entropy-ignore_index-str",
        lambda w: F.linear_cross_entropy(X, r(3, 8), TARGET4, ignore_index="x"),
        TypeError,
        r"ignore_index must be an int",
    ),
    Case(
        "linear_cross_entropy-label_smoothing-str",
        lambda w: F.linear_cross_entropy(X, r(3, 8), TARGET4, label_smoothing="0.1"),
        TypeError,
        r"label_smoothing must be a number",
    ),
    Case(
        "linear_cross_entropy-target-out-of-range",
        lambda w: F.linear_cross_entropy(X, r(3, 8), torch.full((4,), 3, dtype=torch.long)),
        IndexError,
        r"target holds 3 .*neither a class index in \[0, 3\) nor ignore_index",
    ),
    Case(
        "batch_norm_act-act_param-str",
        lambda w: F.batch_norm_act(IMG, None, None, training=True, act="elu", act_param="x"),
        TypeError,
        r"act_param must be a number",
    ),
    Case(
        "batch_norm_act-one-value-per-channel",
        lambda w: F.batch_norm_act(r(1, 3), None, None, training=True),
        ValueError,
        r"more than 1 value per channel when training",
    ),
    Case(
        "inplace_abn-eval-without-stats",
        lambda w: F.inplace_abn(IMG.clone(), None, None, training=False),
        ValueError,
        r"eval mode \(training=False\) normalizes with running_mean/running_var",
    ),
    Case(
        "max_pool2d-output-too-small",
        lambda w: F.max_pool2d(r(1, 1, 2, 2), 3, padding=1, dilation=2),
        RuntimeError,
        r"calculated output size .* is too small",
    ),
    # ---- zero channels in training: the per-channel check divided by size(1) and killed the interpreter (SIGFPE)
    Case(
        "batch_norm_act-zero-channels",
        lambda w: F.batch_norm_act(NO_CHANNELS, None, None, training=True),
        ValueError,
        r"batch_norm_act: input has no channels",
    ),
    Case(
        "inplace_abn-zero-channels",
        lambda w: F.inplace_abn(NO_CHANNELS.clone(), None, None, training=True),
        ValueError,
        r"inplace_abn: input has no channels",
    ),
    Case(
        "batch_norm_act_conv2d-zero-channels",
        lambda w: F.batch_norm_act_conv2d(NO_CHANNELS, None, None, None, None, r(4, 0, 1, 1), training=True),
        ValueError,
        r"input has no channels",
    ),
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_operator_call(case: Case) -> None:
    check(case)
