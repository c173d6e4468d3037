"""End to end on Hugging Face language models: eager against ``memsave.convert(model, fuse=True)``, ``memsave.wrap``
and both, one training step (forward with ``labels``, backward).

Models (``MODELS``; transformers definitions from configs, random weights, seed 0, float32, dropout off so that
gradients compare without RNG):

=============  ==========================================================================================
model          config
=============  ==========================================================================================
llama          LlamaForCausalLM: 2 layers, hidden 256, MLP 688, 4 heads, vocabulary 32,000, batch 2 x 256
               tokens -- the anchor size (eager peaks at ~209 MiB on CPU)
gpt2           GPT2LMHeadModel: 2 layers, hidden 256, 4 heads, vocabulary 50,257 (GPT-2's), batch 2 x 256
               tokens
``DECODERS``   the families convert knows by structure only (no class list names them): Qwen3-MoE, Gemma 3
               (text), Gemma 2, OLMo 2, DeepSeek-V3, Phi-3, GPT-NeoX, OPT, Falcon, Granite, StableLM, Cohere,
               Mixtral, Phi, StarCoder 2, GLM-4 (``tests.helpers.hub.decoder``): the same sizes as llama,
               2 key/value heads, vocabulary 32,000
=============  ==========================================================================================

Variants: ``eager``; ``convert`` = ``memsave.convert(model, fuse=True)`` (fused norms and MLPs, the loss by
``linear_cross_entropy``: no logits); ``wrap`` = ``memsave.wrap(model)`` (one checkpoint region per decoder layer,
memsave.find_blocks); ``convert+wrap``.

Per model and variant: ``peak`` = allocator-level peak of one step above its start (CPU: the profiler's allocation
events, memsave.measurement.allocator; CUDA: max_memory_allocated); ``activations`` = memsave.measure's live-tensor
tracker, bytes created in forward and alive at its end; ``time`` = median of ``--repeats`` steps, the variants
stepped interleaved (A B C D D C B A ...) so that load changing during the run hits all alike, as a ratio to eager;
``loss err`` = |loss - eager's| / |eager's|; ``grad err`` = max over parameters of max |grad - eager's|, over the
largest |eager's gradient| of the model (some entries, a key projection's bias, are 0 in exact arithmetic: each
parameter's own scale would compare rounding noise with noise).

    python3 benchmarks/convert_zoo.py --models llama gpt2      # CPU, the two anchors (~1.5 minutes on 2 cores)
    python3 benchmarks/convert_zoo.py --models llama --no-save # the acceptance model only
    python3 benchmarks/convert_zoo.py --tiny --no-save         # every model, tiny: a smoke test
    python3 benchmarks/convert_zoo.py --tiny --vocab 32000 --repeats 3 \\
        --out benchmarks/results/convert_zoo_tiny_cpu.json     # every model tiny, the loss at a 32k vocabulary
    python3 benchmarks/convert_zoo.py --markdown-from benchmarks/results/convert_zoo_cpu.json

Writes ``benchmarks/results/convert_zoo_<device>.json`` and ``.md`` with the machine, torch, transformers, memsave's
version and build, thread count, load average at the start and the end, and what convert swapped and left (with the
rule that left it).
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(HERE.parent))

from tests.helpers import hub

import memsave
from benchmarks import harness
from benchmarks.harness import RunClock, early_exit, finish_run, load_text, output_arguments, rel_diff
from memsave.measurement.allocator import step_peak_bytes
from memsave.operators.convert import plan_convert

VARIANTS = ("eager", "convert", "wrap", "convert+wrap")


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the test extras install it
        raise SystemExit("convert_zoo: needs transformers (pip install transformers)") from e
    return transformers


def build_llama(vocab: int, hidden: int, layers: int) -> nn.Module:
    _transformers()
    return hub.llama(layers, hidden, int(hidden * 2.6875), heads=4, kv_heads=4, vocab=vocab, positions=1024)


def build_gpt2(vocab: int, hidden: int, layers: int) -> nn.Module:
    _transformers()
    return hub.gpt2(layers, hidden, heads=4, vocab=vocab, positions=1024, dropout=0.0)


def build_decoder(model_type: str, vocab: int, hidden: int, layers: int) -> nn.Module:
    _transformers()
    width = 8 * round(hidden * 2.6875 / 8)  # Llama's ratio; a multiple of 8 for transformers' grouped expert kernel
    return hub.decoder(model_type, layers, hidden, width, heads=4, kv_heads=2, vocab=vocab, positions=1024)


#: transformers model types that convert(fuse=True) recognises by structure alone.
DECODERS = (
    "qwen3_moe", "gemma3_text", "gemma2", "olmo2", "deepseek_v3", "phi3", "gpt_neox", "opt", "falcon", "granite",
    "stablelm", "cohere", "mixtral", "phi", "starcoder2", "glm4",
)  # fmt: skip

#: name -> (builder(vocab, hidden, layers), vocabulary at the CPU size)
MODELS: Dict[str, Tuple[Callable[[int, int, int], nn.Module], int]] = {
    "llama": (build_llama, 32000),
    "gpt2": (build_gpt2, 50257),
    **{t: (functools.partial(build_decoder, t), 32000) for t in DECODERS},
}


def variants(model: nn.Module) -> Dict[str, nn.Module]:
    """The four variants, each its own copy of ``model``'s weights."""
    out = {"eager": model}
    out["convert"] = memsave.convert(copy.deepcopy(model), fuse=True)
    out["wrap"] = memsave.wrap(copy.deepcopy(model))
    out["convert+wrap"] = memsave.wrap(memsave.convert(copy.deepcopy(model), fuse=True))
    return out


def bench_model(
    name: str, size: Dict[str, int], device: torch.device, repeats: int, log: Callable[[str], None]
) -> dict:
    """One model's rows: ``size`` gives its ``vocab``, ``hidden`` and ``layers``, and the ``batch`` x ``seq`` token ids
    it steps on; the result repeats them."""
    build = MODELS[name][0]
    torch.manual_seed(0)
    base = build(size["vocab"], size["hidden"], size["layers"]).to(device)
    report = plan_convert(base, fuse=True)
    models = {k: hub.LossOf(m) for k, m in variants(base).items()}
    ids = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)

    def make_step(m: nn.Module) -> Callable[[], None]:
        def step() -> None:
            m.zero_grad(set_to_none=True)
            m(ids).backward()

        return step

    steps = {k: make_step(m) for k, m in models.items()}
    losses, grads, rows = {}, {}, {}
    for k, m in models.items():
        m.zero_grad(set_to_none=True)
        loss = m(ids)
        loss.backward()  # warm-up, and the values compared below
        losses[k] = loss.detach()
        grads[k] = [p.grad.detach().clone() for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        peak = step_peak_bytes(steps[k], device)
        m.zero_grad(set_to_none=True)
        acts = memsave.measure(m, ids, loss_fn=lambda loss: loss, steps=1, warmup=0).activation_bytes
        rows[k] = dict(peak_bytes=peak, activation_bytes=acts)
        log(f"  {k}: peak {peak / 2**20:.1f} MiB, activations {acts / 2**20:.1f} MiB")
    for k in models:
        rows[k]["loss"] = losses[k].item()
        rows[k]["loss_rel_err"] = abs(losses[k].item() - losses["eager"].item()) / abs(losses["eager"].item())
        # over the model's largest gradient entry: some (a key projection's bias) are 0 in exact arithmetic
        scale = max(e.abs().max().item() for e in grads["eager"])
        rows[k]["grad_rel_err"] = max(
            rel_diff(g, e) * e.abs().max().item() / scale for g, e in zip(grads[k], grads["eager"])
        )
    del grads
    times = harness.interleaved_times({k: steps[k] for k in VARIANTS}, repeats, device)  # A B C D D C B A ...
    for k in models:
        models[k].zero_grad(set_to_none=True)
        r = rows[k]
        r["step_s"] = statistics.median(times[k])
        r["times_s"] = times[k]
    for k in models:
        r = rows[k]
        r["peak_ratio"] = r["peak_bytes"] / rows["eager"]["peak_bytes"]
        r["activation_ratio"] = r["activation_bytes"] / rows["eager"]["activation_bytes"]
        r["time_ratio"] = r["step_s"] / rows["eager"]["step_s"]
    swapped = [
        dict(module=e.name, old=e.old, new=e.new, verdict=e.verdict, rule=e.detail.split(":")[0])
        for e in report.entries
    ]
    return dict(
        model=name,
        **size,
        parameters=sum(p.numel() for p in base.parameters()),
        variants=rows,
        converted=swapped,
    )


#: The tables' columns after model and variant: (title, printed width, the row's key, format); bytes shown in MiB.
COLUMNS = (
    ("peak", 10, "peak_bytes", ".1f"),
    ("peak / eager", 12, "peak_ratio", ".2f"),
    ("activations", 11, "activation_bytes", ".1f"),
    ("act. / eager", 12, "activation_ratio", ".2f"),
    ("step s", 7, "step_s", ".3f"),
    ("time / eager", 12, "time_ratio", ".2f"),
    ("loss err", 9, "loss_rel_err", ".1e"),
    ("grad err", 9, "grad_rel_err", ".1e"),
)
TITLES = ("model", "variant", *(title for title, _, _, _ in COLUMNS))
WIDTHS = (11, 13, *(width for _, width, _, _ in COLUMNS))
HEADER = harness.text_row(TITLES, WIDTHS)


def format_rows(res: dict) -> List[str]:
    """The printed table's lines for one model."""
    return harness.text_rows(res, _row_cells, WIDTHS)


def _description(res: dict) -> str:
    return (
        f"{res['model']} ({res['layers']} layers, hidden {res['hidden']}, vocab {res['vocab']:,}, "
        f"{res['batch']} x {res['seq']} tokens)"
    )


def _row_cells(k: str, r: dict) -> List[str]:
    """A variant's cells of the printed and the markdown table (:data:`COLUMNS`)."""
    cells = []
    for *_, key, spec in COLUMNS:
        cells.append(f"{r[key] / 2**20:{spec}} MiB" if key.endswith("_bytes") else format(r[key], spec))
    return cells


def markdown(meta: dict, results: List[dict]) -> str:
    lines = [
        "# convert(fuse=True) and wrap end to end on Hugging Face language models, one training step",
        "",
        f"`{meta['command'].strip()}` on {meta['device']} ({meta['cpu']}, {meta['threads']} threads), torch "
        f"{meta['torch']}, transformers {meta['transformers']}, memsave {meta['memsave_version']}, {meta['date']}; "
        f"load average (1 / 5 / 15 min) at the start {load_text(meta['load_average_start'])}, at the end "
        f"{load_text(meta['load_average_end'])}. float32, random weights, dropout off. Peak: allocator-level, "
        f"above the step's start. Activations: live-tensor tracker, bytes alive "
        f"after forward. Step time: median of {meta['repeats']} interleaved steps, as a ratio to eager. Errors: "
        "relative to eager's loss and to the model's largest gradient entry (max over parameters).",
        "",
        "| " + " | ".join(TITLES) + " |",
        "|---" * len(TITLES) + "|",
    ]
    lines += harness.variant_rows(results, _description, _row_cells)
    lines += ["", "What `convert(fuse=True)` swapped, and left (with the rule whose probe or byte count left it):", ""]
    for res in results:
        kinds: Dict[str, int] = {}
        for e in res["converted"]:
            key = f"{e['old']} -> {e['new']}" if e["new"] else f"{e['old']} left ({e.get('rule', '?')})"
            kinds[key] = kinds.get(key, 0) + 1
        lines.append(f"- {res['model']}: " + ", ".join(f"{n} x {k}" for k, n in kinds.items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=None, help="default: each model's (50,257 GPT-2, 32,000 the others)")
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--tiny", action="store_true", help="hidden 32, vocabulary 512, 2 x 16 tokens: a smoke test")
    output_arguments(p, "convert_zoo")
    args = p.parse_args(argv)
    status = early_exit("convert_zoo", args, markdown)
    if status is not None:
        return status
    if args.tiny:
        args.hidden, args.seq, args.vocab = 32, 16, args.vocab or 512
    device = torch.device(args.device)
    clock = RunClock()
    print(
        f"one training step on {args.device} ({torch.get_num_threads()} threads), median of {args.repeats} "
        f"interleaved steps; ratios to eager",
        flush=True,
    )
    results = []
    for name in args.models:
        size = dict(
            vocab=args.vocab or MODELS[name][1], hidden=args.hidden, layers=args.layers, batch=args.batch, seq=args.seq
        )
        print(f"{name} ...", flush=True)
        results.append(bench_model(name, size, device, args.repeats, lambda s: print(s, flush=True)))
    print(HEADER)
    for res in results:
        print("\n".join(format_rows(res)))
    finish_run(
        "convert_zoo", args, argv, clock, dict(results=results), lambda m: markdown(m, results), repeats=args.repeats
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
