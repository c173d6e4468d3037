"""PyTorch's own GradScaler tests, unchanged, once against ``torch.amp.GradScaler`` and once with
:class:`memsave.amp.GradScaler` in its place (``torch.GradScaler`` and ``torch.amp.GradScaler`` both): every test
that passes on the baseline passes with memsave, and each test that built torch's scaler built memsave's instead.

The tests: test_torch.py's device-generic scaler tests (``test_grad_scaling_*``, ``test_grad_scale_*``,
``test_grad_scaler_*``, ``test_pickle_gradscaler``, ``test_params_invalidated_*``), which torch instantiates for each
available device type: on a CPU-only machine they run on ``cpu``, where torch's scaler works as on CUDA (float16
autocast, skipped steps, fused and foreach optimizers that unscale by themselves). They are read from
``$MEMSAVE_TORCH_TESTS`` (a checkout of pytorch's ``test/`` folder; skipped when unset, see
tests/helpers/torch_suite.py); nothing is copied here.
"""

from __future__ import annotations

import pytest

from helpers.torch_suite import lost, ran, run_suite, summary, torch_tests_dir, with_outcome

FILES = ("test_torch.py",)
KEYWORD = "grad_scal or gradscaler or params_invalidated"
#: At least this many of the selected tests build a torch.amp.GradScaler and pass on the baseline.
MIN_SCALER_TESTS = 20


@pytest.mark.slow  # runs about 30 of torch's tests twice in subprocesses
def test_torch_grad_scaler_tests_pass_with_memsave_scaler(tmp_path):
    folder = torch_tests_dir(FILES)
    baseline = run_suite(folder, FILES, KEYWORD, "grad_scaler-baseline", tmp_path)
    with_memsave = run_suite(folder, FILES, KEYWORD, "grad_scaler-memsave", tmp_path)
    scaler_tests = ran(baseline, "torch_scaler") & with_outcome(baseline, "passed")
    passing = scaler_tests & with_outcome(with_memsave, "passed")
    table = summary("torch's GradScaler tests", baseline, with_memsave)
    print(f"\n{table}\n  tests that build a scaler: {len(passing)} of {len(scaler_tests)} pass with memsave's")
    assert len(scaler_tests) >= MIN_SCALER_TESTS, f"fewer than {MIN_SCALER_TESTS} scaler tests pass:\n{table}"
    differences = lost(baseline, with_memsave, {})
    assert not differences, "passed on the baseline, not with memsave:\n" + "\n".join(differences)
    assert scaler_tests <= ran(with_memsave, "memsave_scaler"), "a test built no memsave scaler"
    assert not scaler_tests & ran(with_memsave, "torch_scaler"), "a test still built torch's scaler"
