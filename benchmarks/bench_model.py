"""zhnlp vs transformers: speed of ERNIE-3.0-medium sequence classification on CPU (fp32).

Builds a random transformers ``ErnieForSequenceClassification`` with the ERNIE-3.0-medium
shape (6 layers, hidden 768, 12 heads, FFN 3072, vocab 40000, task ids, dropout 0.1), saves
it to a temporary directory and loads it with ``zhnlp.AutoModelForSequenceClassification``,
all in one process, then times both on two batches: ``mixed`` (half the rows full, the others
padded to between s/2 and s tokens, as a fine-tuning batch padded to its longest row: about
89% real tokens) and ``none`` (every row full). For this head zhnlp drops the padding tokens
before the encoder and computes only [CLS] in the last layer, so ``mixed`` shows the gain a
real batch gets and ``none`` the model without the padding saving:

* training: forward with labels, ``loss.backward()``, ``torch.optim.AdamW`` step, ``zero_grad``
  (``train()`` mode, dropout on);
* inference: forward only (``eval()`` mode, ``torch.inference_mode()``).

The two sides alternate iteration by iteration (ABBA order) so machine noise hits both alike;
each side's figure is the median ms/iter. speed-up = transformers_ms / zhnlp_ms (>1: zhnlp
faster).

Run (about two minutes on 2 cores):

    .venv/bin/python benchmarks/bench_model.py [--threads 2] [--batch 8] [--seq 128]
                                               [--padding both|mixed|none]
                                               [--iters 10] [--infer-iters 20] [--json]

Training numbers are noisy by default: glibc hands freed blocks back to the OS, and the
page faults (mostly AdamW temporaries and the 40000x768 embedding gradient, alike on both
sides) add 0.2-1 s of system time per step, unevenly. For steadier figures prefix the
command with ``MALLOC_MMAP_THRESHOLD_=536870912 MALLOC_TRIM_THRESHOLD_=4294967296``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings

import torch

GOALS = {"training": 1.10, "inference": 1.25}


def ernie_medium_config(num_labels: int = 2):
    from transformers import ErnieConfig

    return ErnieConfig(
        vocab_size=40000, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, max_position_embeddings=2048, type_vocab_size=4,
        use_task_id=True, task_type_vocab_size=16, layer_norm_eps=1e-5, initializer_range=0.02,
        pad_token_id=0, num_labels=num_labels)


def make_batch(batch: int, seq: int, num_labels: int, seed: int = 0, padded: bool = True) -> dict:
    """Random tokens; the first half of the rows are full, the rest padded to [seq/2, seq)
    (``padded=False``: every row full)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [seq if i < (batch + 1) // 2 or not padded else int(torch.randint(seq // 2, seq, (1,), generator=g))
               for i in range(batch)]
    mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids = torch.randint(1, 40000, (batch, seq), generator=g) * mask
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2:] = 1
    return dict(input_ids=input_ids, attention_mask=mask, token_type_ids=token_type_ids * mask,
                task_type_ids=torch.zeros_like(input_ids),
                labels=torch.randint(0, num_labels, (batch,), generator=g))


class Side:
    """One implementation: its model, optimizer and the two timed steps."""

    def __init__(self, name: str, model: torch.nn.Module):
        self.name, self.model = name, model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        self.times = {"training": [], "inference": []}

    def training(self, batch):
        self.model.train()
        out = self.model(**batch)
        out.loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def inference(self, batch):
        self.model.eval()
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.inference_mode():
            self.model(**inputs).logits.sum().item()

    def run(self, kind: str, batch, record: bool):
        start = time.perf_counter()
        getattr(self, kind)(batch)
        elapsed = time.perf_counter() - start
        if record:
            self.times[kind].append(elapsed * 1e3)


def build_sides(tmp: str) -> list[Side]:
    import zhnlp
    from transformers import ErnieForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    hf = ErnieForSequenceClassification(ernie_medium_config())
    hf.save_pretrained(tmp)
    zh = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp)
    return [Side("zhnlp", zh), Side("transformers", hf)]


def measure(sides: list[Side], kind: str, batch, iters: int, warmup: int) -> None:
    for i in range(warmup + iters):
        order = sides if i % 2 == 0 else sides[::-1]  # ABBA: each side goes first half the time
        for side in order:
            side.run(kind, batch, record=i >= warmup)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--iters", type=int, default=10, help="timed training iterations per side")
    p.add_argument("--infer-iters", type=int, default=20, help="timed inference iterations per side")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--padding", choices=["mixed", "none", "both"], default="both",
                   help="mixed: half the rows padded (a real fine-tuning batch); none: every row full")
    p.add_argument("--json", action="store_true", help="also print one JSON line with the numbers")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        sides = build_sides(tmp)
    print(f"ERNIE-3.0-medium seq-cls, fp32, batch {args.batch}x{args.seq}, {args.threads} threads, "
          f"torch {torch.__version__}")
    print(f"{'':<10} {'tokens':>7} {'zhnlp ms':>10} {'transformers ms':>16} {'speed-up':>9} {'goal':>6}")
    results = {"threads": args.threads, "batch": args.batch, "seq": args.seq}
    for padding in (["mixed", "none"] if args.padding == "both" else [args.padding]):
        batch = make_batch(args.batch, args.seq, num_labels=2, padded=padding == "mixed")
        for side in sides:
            side.times = {"training": [], "inference": []}
        measure(sides, "inference", batch, args.infer_iters, args.warmup)
        measure(sides, "training", batch, args.iters, args.warmup)
        fill = batch["attention_mask"].float().mean().item()
        results[padding] = {"token_fill": round(fill, 3)}
        for kind, goal in GOALS.items():
            zh, hf = (statistics.median(s.times[kind]) for s in sides)
            speedup = hf / zh
            verdict = "PASS" if speedup >= goal else "MISS"
            print(f"{kind:<10} {fill:>6.0%} {zh:>10.1f} {hf:>16.1f} {speedup:>8.3f}x {goal:>5.2f}x {verdict}",
                  flush=True)
            results[padding][kind] = {"zhnlp_ms": round(zh, 2), "transformers_ms": round(hf, 2),
                                      "speedup": round(speedup, 4), "goal": goal, "pass": speedup >= goal}
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
