"""PyTorch's own checkpoint tests, unchanged, once as they are and once with memsave in place of
``torch.utils.checkpoint.checkpoint`` / ``checkpoint_sequential`` for every ``use_reentrant=False`` call: every test
that passes on the baseline passes with memsave, and memsave's regions ran in each test that checkpoints
non-reentrantly.

The tests: test_autograd.py's checkpoint tests (``TestAutograd``'s ``test_checkpoint*`` and
``test_access_saved_tensor_twice_without_recomputation_works``, ``TestNestedCheckpoint``,
``TestSelectiveActivationCheckpoint``: ``create_selective_checkpoint_contexts`` policies as ``context_fn``) and
test_utils.py's ``TestCheckpoint``. Reentrant calls (and calls without ``use_reentrant``, which torch reads as
reentrant) stay torch's in both runs, so the tests that only checkpoint reentrantly pass in both; memsave itself is
always non-reentrant (docs/design.md).

They are read from ``$MEMSAVE_TORCH_TESTS`` (a checkout of pytorch's ``test/`` folder; skipped when unset, see
tests/helpers/torch_suite.py); nothing is copied here.
"""

from __future__ import annotations

import pytest

from helpers.torch_suite import lost, ran, run_suite, stale, summary, torch_tests_dir, with_outcome

FILES = ("test_autograd.py", "test_utils.py")
KEYWORD = "checkpoint or test_access_saved_tensor_twice_without_recomputation_works"
#: At least this many of torch's checkpoint tests pass on the baseline (the selection found them).
MIN_PASSED = 30
#: At least this many of them checkpoint with use_reentrant=False, which memsave runs.
MIN_NON_REENTRANT = 25
NON_REENTRANT = ("checkpoint:non_reentrant", "checkpoint_sequential:non_reentrant")

#: Where memsave differs from torch on purpose (test id: why), each documented in docs/compatibility.md: none now.
BY_DESIGN: dict = {}


def _non_reentrant(run: dict) -> set:
    return ran(run, NON_REENTRANT[0]) | ran(run, NON_REENTRANT[1])


@pytest.mark.slow  # runs about 70 of torch's tests twice in subprocesses
def test_torch_checkpoint_tests_pass_with_memsave(tmp_path):
    folder = torch_tests_dir(FILES)
    baseline = run_suite(folder, FILES, KEYWORD, "checkpoint-baseline", tmp_path)
    with_memsave = run_suite(folder, FILES, KEYWORD, "checkpoint-memsave", tmp_path)
    table = summary("torch's checkpoint tests", baseline, with_memsave)
    print(f"\n{table}")
    passed = with_outcome(baseline, "passed")
    assert len(passed) >= MIN_PASSED, f"fewer than {MIN_PASSED} of torch's checkpoint tests pass:\n{table}"
    differences = lost(baseline, with_memsave, BY_DESIGN)
    assert not differences, "passed on the baseline, not with memsave:\n" + "\n".join(differences)
    assert not stale(baseline, with_memsave, BY_DESIGN), "listed in BY_DESIGN but passing with memsave"
    exercised = _non_reentrant(baseline) & passed
    assert len(exercised) >= MIN_NON_REENTRANT, f"only {len(exercised)} tests checkpoint non-reentrantly"
    missed = exercised - _non_reentrant(with_memsave)
    assert not missed, f"memsave did not run in {sorted(missed)}"
