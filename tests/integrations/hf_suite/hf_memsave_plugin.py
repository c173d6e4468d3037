"""pytest plugin for transformers' own tests run from its sdist (tests/integrations/test_hf_checkpointing_suite.py).

Loaded with ``-p hf_memsave_plugin`` in the harness's subprocess, never by this repository's own pytest. It

* stands in for the two test helpers ``test_modeling_common.py`` imports that the sdist does not ship
  (``tests/exporters`` and ``tests/generation``: mixins the gradient-checkpointing tests do not use);
* with ``MEMSAVE_HF_SUITE=memsave``: calls :func:`memsave.integrations.transformers.enable` on every model the tests
  build (at the end of ``PreTrainedModel.post_init``), makes ``torch.utils.checkpoint.checkpoint`` raise, and counts
  the layers run as memsave regions;
* writes each test's outcome (a failed subtest fails its test; ``tests/torch_suite/suite_outcomes.py``, which the
  harness puts on the path) to the JSON file ``MEMSAVE_HF_SUITE_RESULTS`` names.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
from suite_outcomes import Outcomes

_results = Outcomes()
_counts = {"enabled": 0, "memsave_regions": 0, "torch_checkpoint_calls": 0}


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []  # a package, so that its stub submodule imports
    sys.modules[name] = module


def _stub_missing_helpers() -> None:
    _stub("hf_tests.exporters")
    _stub("hf_tests.exporters.test_export", ExportTesterMixin=type("ExportTesterMixin", (), {}))
    _stub("hf_tests.generation")
    _stub("hf_tests.generation.test_utils", GenerationTesterMixin=type("GenerationTesterMixin", (), {}))


def _use_memsave() -> None:
    import torch.utils.checkpoint as tc
    import transformers.modeling_utils as mu
    from transformers import PreTrainedModel

    import memsave.integrations.transformers as ms_hf
    from memsave.integrations.transformers_switch import LayerCheckpoint

    def refuse(*args: Any, **kwargs: Any) -> Any:
        _counts["torch_checkpoint_calls"] += 1
        raise AssertionError("torch.utils.checkpoint.checkpoint was called with memsave enabled")

    tc.checkpoint = refuse
    mu.checkpoint = refuse

    post_init = PreTrainedModel.post_init

    def post_init_then_enable(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = post_init(self, *args, **kwargs)
        if any(hasattr(m, "gradient_checkpointing") for m in self.modules()):
            ms_hf.enable(self)
            _counts["enabled"] += 1
        return out

    PreTrainedModel.post_init = post_init_then_enable

    call = LayerCheckpoint.__call__

    def counted(self: Any, function: Any, *args: Any, **kwargs: Any) -> Any:
        _counts["memsave_regions"] += 1
        return call(self, function, *args, **kwargs)

    LayerCheckpoint.__call__ = counted  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _stub_missing_helpers()
    if os.environ.get("MEMSAVE_HF_SUITE") == "memsave":
        _use_memsave()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _results.record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _results.write("MEMSAVE_HF_SUITE_RESULTS", **_counts)
