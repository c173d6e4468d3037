"""Wrong calls of the memory-efficient operators: the memsave.nn constructors and memsave.functional. Each raises its
documented type naming the argument (a meta-device weight against a real input included) and changes nothing."""

from __future__ import annotations

import pytest
import torch

from bad_input.checking import Case, check, params
from bad_input.checking import rand as r
from memsave import functional as F
from memsave import nn as mnn

TARGET = torch.zeros(4, dtype=torch.long)
LONG = torch.ones(4, 8, dtype=torch.long)


def meta(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, device="meta")


X = r(4, 8)
IMG = r(2, 3, 8, 8)
NO_CHANNELS = r(2, 0, 4, 4)

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
