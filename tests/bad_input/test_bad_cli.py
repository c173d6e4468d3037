"""Wrong command lines of ``python -m memsave`` (run in-process through ``memsave.cli.main``): each ends with exit
code 2 and one line on stderr naming the option, and changes nothing of the test's model, optimizer, RNG or scaler."""

from __future__ import annotations

import pytest

from bad_input.checking import Case, CliExit, check, cli, params

MODEL = ("--model", "bad_input.checking:tiny_model", "--input", "4,8")


def case(argv: str, names: str) -> Case:
    """``python -m memsave <argv>`` exits with code 2, its message matching ``names``; ``@`` is the tiny model."""
    args = [a for part in argv.split() for a in (MODEL if part == "@" else (part,))]
    return Case(f"cli {argv}", cli(*args), CliExit, r"^exit 2: memsave: error: .*" + names)


CASES = [
    case("", r"a subcommand is required"),
    case("bogus", r"invalid choice: 'bogus'"),
    case("bench", r"--model is required"),
    case("bench --model nosuchmodel", r"unknown model 'nosuchmodel'"),
    case("bench --model nosuchpkg.mod:f --input 4,8", r"--model 'nosuchpkg\.mod:f': no module named 'nosuchpkg'"),
    case("bench --model bad_input.checking:nothing --input 4,8", r"--model .*has no attribute 'nothing'"),
    case("bench --model bad_input.checking:tiny_model --input 4,x", r"--input '4,x': not a shape"),
    case("bench @ --strategies bogus", r"--strategies: unknown strategy 'bogus'"),
    case("bench @ --strategies ,", r"--strategies is empty"),
    case("bench @ --steps 0", r"--steps must be >= 1, got 0"),
    case("bench @ --batch 0", r"--batch must be >= 1, got 0"),
    case("bench @ --device tpu", r"--device must be cpu or cuda .*'tpu'"),
    case("bench @ --size huge", r"argument --size: invalid choice: 'huge'"),
    case("bench @ --seed x", r"argument --seed: invalid int value: 'x'"),
    case("bench @ --breakdown -1", r"--breakdown must be >= 0, got -1"),
    # A value with a minus sign reaches memsave's own check (argparse alone: "expected one argument").
    case(
        "bench --model bad_input.checking:tiny_model --input -32,256",
        r"--input '-32,256': every dimension must be >= 1",
    ),
    case(
        "bench --model bad_input.checking:tiny_model --inp -32,256", r"--input '-32,256': every dimension must be >= 1"
    ),
    case("bench --model bad_input.checking:tiny_model --input=-4,8", r"--input '-4,8': every dimension must be >= 1"),
    case("bench --model bad_input.checking:tiny_model --input 4,-8", r"--input '4,-8': every dimension must be >= 1"),
    case(
        "bench --model bad_input.checking:tiny_model --input tokens:-2,8:50",
        r"every dimension must be >= 1 \(sizes are positive\), got -2",
    ),
    case("bench @ --batch -1", r"--batch must be >= 1, got -1"),
    case("bench @ --steps -3", r"--steps must be >= 1, got -3"),
    case("estimate @ --memory -5GiB", r"--memory '-5GiB': a memory size must be positive"),
    case("estimate @ --memory -5", r"--memory '-5': a memory size must be positive"),
    case("bench @ --model-kwargs {bad", r"--model-kwargs is not valid JSON"),
    case("bench @ --dtype float7", r"unrecognized arguments: --dtype float7"),
    case("estimate @ --memory lots", r"--memory: cannot parse 'lots'"),
    # The command line's spelling of a size (a unit), not the Python API's (an int of bytes).
    case("estimate @ --memory 12XB", r"--memory: cannot parse '12XB' .*; write a size with a unit: .*--memory 24GiB$"),
    case("estimate @ --device tpu", r"--device must be cpu or cuda"),
    case("estimate @ --batch 0", r"--batch must be >= 1"),
    case("estimate @ --strategies bogus", r"--strategies: unknown strategy 'bogus'"),
    case("estimate @ --dtype float7", r"argument --dtype: invalid choice: 'float7'"),
    case("estimate @ --optimizer lion9", r"argument --optimizer: invalid choice: 'lion9'"),
    case("estimate --bogus", r"unrecognized arguments: --bogus"),
    case("demo --steps 0", r"--steps must be >= 1, got 0"),
    case("demo --bogus", r"unrecognized arguments: --bogus"),
    case("info --bogus", r"unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_command_line(case: Case) -> None:
    check(case)
