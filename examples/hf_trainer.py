"""Train a Hugging Face causal LM with Trainer under a memory budget: memsave.convert + a memsave plan.

    python examples/hf_trainer.py                       # a small Llama, random weights, on CPU or GPU
    python examples/hf_trainer.py --size tiny --steps 4 # what the tests run

1. ``memsave.convert(model, fuse=True)``: memory-efficient modules, and the loss computed from the last hidden state
   without the ``[tokens x vocabulary]`` logits (evaluation and ``generate`` still get logits).
2. ``memsave.plan(model, ..., budget=...)``: which layers to recompute so that a training step fits the budget
   (here: half of the way from the smallest plan's peak to eager's), applied with ``memsave.wrap(model, plan)``.
   ``TrainingArguments(activation_checkpointing=True)`` would keep the plan: memsave holds the model's switch.
3. ``MemoryCallback``: each logged step's peak and activation bytes in Trainer's logs.

The model has random weights and the data is random token ids: the point is the memory, not the text.
"""

from __future__ import annotations

import tempfile
from typing import Dict

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import memsave
from memsave.cli.options import script_arguments
from memsave.integrations.transformers import MemoryCallback

SIZES = {
    "tiny": dict(layers=2, d=32, heads=4, vocab=128, seq=32, batch=2),
    "small": dict(layers=4, d=128, heads=4, vocab=2048, seq=128, batch=4),
}


class RandomTokens(torch.utils.data.Dataset):
    """Random token ids as inputs and labels (a causal LM shifts the labels itself)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    args, device, size = script_arguments(__doc__.split("\n\n")[0], tuple(SIZES), steps=10, default="small")
    cfg = SIZES[size]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=cfg["vocab"],
        hidden_size=cfg["d"],
        intermediate_size=4 * cfg["d"],
        num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["heads"],
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    model.to(device)

    memsave.convert(model, fuse=True)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    smallest = memsave.plan(model, ids, labels=ids, solver="min_memory", selective=False)
    budget = (smallest.measured_peak_bytes + smallest.eager_peak_bytes) // 2
    plan = memsave.plan(model, ids, labels=ids, budget=budget, selective=False)
    print(plan.summary())
    memsave.wrap(model, plan)

    callback = MemoryCallback()
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(
                output_dir=out,
                max_steps=args.steps,
                per_device_train_batch_size=cfg["batch"],
                logging_steps=max(1, args.steps // 2),
                save_strategy="no",
                report_to="none",
                use_cpu=device.type == "cpu",
                disable_tqdm=True,
                activation_checkpointing=True,  # memsave's plan stays in force
            ),
            train_dataset=RandomTokens(8 * cfg["batch"], cfg["seq"], cfg["vocab"]),
            callbacks=[callback],
        )
        trainer.train()
    fmt = memsave.measurement.format_bytes
    for log in trainer.state.log_history:
        if "peak_bytes" in log:
            print(
                f"step {log['step']}: loss {log['loss']:.3f}, peak {fmt(log['peak_bytes'])}, "
                f"activations {fmt(log['activation_bytes'])} (budget {fmt(budget)})"
            )
    model.eval()
    out = model.generate(ids[:1, :8], max_new_tokens=4, do_sample=False)
    print(f"generate after training: {tuple(out.shape)}")


if __name__ == "__main__":
    main()
