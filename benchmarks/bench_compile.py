"""Compiled mode: eager zhnlp vs compiled zhnlp (``from_pretrained(..., compile=True)``) vs transformers on CPU.

The model and batches of ``bench_model.py`` (ERNIE-3.0-medium sequence classification: 6 layers, hidden 768, 12 heads,
FFN 3072, vocab 40000, dropout 0.1; fp32; batch 8 x 128), all three in one process, timed in rotating order
iteration by iteration so that machine noise hits them alike; each figure is the median ms/iter:

* training: forward with labels, ``loss.backward()``, ``torch.optim.AdamW`` step, ``zero_grad`` (dropout on);
* inference: forward only (``eval()``, ``torch.inference_mode()``).

ratio = transformers_ms / zhnlp_ms (> 1: zhnlp faster). The compile time is reported apart: the first call of
each kind (training compiles its forward and backward graphs, inference its own) minus a steady call, with a
fresh inductor cache unless ``--keep-cache`` (then a warm cache hides most of it). Afterwards inference runs on
batches of other lengths (every row full, then padded rows) to show how many graphs new lengths compile: the first
new length compiles one dynamic graph per layer kind, later ones none.

Run (about four minutes on 2 cores):

    .venv/bin/python benchmarks/bench_compile.py [--threads 2] [--batch 8] [--seq 128]
        [--padding none|mixed|both] [--iters 8] [--infer-iters 16] [--keep-cache] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

GOALS = {"training": 1.25, "inference": 1.5}  # compiled zhnlp over transformers (issue 14)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--iters", type=int, default=8, help="timed training iterations per side")
    p.add_argument("--infer-iters", type=int, default=16, help="timed inference iterations per side")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--padding", choices=["mixed", "none", "both"], default="none",
                   help="none: every row full (the goals' case); mixed: half the rows padded (a fine-tuning batch)")
    p.add_argument("--keep-cache", action="store_true", help="use inductor's usual cache (compile time then "
                                                              "shows a warm cache) instead of a fresh one")
    p.add_argument("--json", action="store_true", help="also print one JSON line with the numbers")
    args = p.parse_args()
    cache = None
    if not args.keep_cache:  # before torch reads its inductor configuration
        cache = tempfile.TemporaryDirectory(prefix="zhnlp-bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_model import make_batch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    sides = build_sides()
    compiled = sides[1]
    print(f"ERNIE-3.0-medium seq-cls, fp32, batch {args.batch}x{args.seq}, {args.threads} threads, "
          f"torch {torch.__version__}, inductor cache {'kept' if args.keep_cache else 'fresh'}")
    results = {"threads": args.threads, "batch": args.batch, "seq": args.seq, "compile_s": {}}
    paddings = ["mixed", "none"] if args.padding == "both" else [args.padding]
    for padding in paddings:
        batch = make_batch(args.batch, args.seq, num_labels=2, padded=padding == "mixed")
        fill = batch["attention_mask"].float().mean().item()
        results[padding] = {"token_fill": round(fill, 3)}
        for kind, iters in (("inference", args.infer_iters), ("training", args.iters)):
            first = timed(compiled, kind, batch)  # compiles (padded rows are packed: graphs of their own)
            for side in sides:
                side.times = {"training": [], "inference": []}
            measure(sides, kind, batch, iters, args.warmup)
            eager, comp, hf = (statistics.median(s.times[kind]) for s in sides)
            results["compile_s"][f"{padding}/{kind}"] = round(first - comp / 1e3, 2)
            results[padding][kind] = {"eager_ms": round(eager, 1), "compiled_ms": round(comp, 1),
                                      "transformers_ms": round(hf, 1), "eager_ratio": round(hf / eager, 3),
                                      "compiled_ratio": round(hf / comp, 3), "goal": GOALS[kind],
                                      "pass": hf / comp >= GOALS[kind]}
    print("compile time (first call minus a steady one; training: forward + backward graphs): " + ", ".join(
        f"{key} {value:.1f} s" for key, value in results["compile_s"].items()))
    print(f"{'':<10} {'tokens':>6} {'eager ms':>9} {'compiled ms':>12} {'transformers ms':>16} {'eager':>7} "
          f"{'compiled':>9} {'goal':>6}")
    for padding in paddings:
        r = results[padding]
        for kind in ("training", "inference"):
            x = r[kind]
            print(f"{kind:<10} {r['token_fill']:>6.0%} {x['eager_ms']:>9.1f} {x['compiled_ms']:>12.1f} "
                  f"{x['transformers_ms']:>16.1f} {x['eager_ratio']:>6.2f}x {x['compiled_ratio']:>8.2f}x "
                  f"{x['goal']:>5.2f}x {'PASS' if x['pass'] else 'MISS'}")
    results["lengths"] = new_lengths(compiled, args.batch, args.seq)
    print("new lengths (compiled inference): " + ", ".join(
        f"{x['seq']}{' padded' if x['padded'] else ''}: {x['graphs']} new graph(s), first call {x['first_ms']:.0f} ms"
        for x in results["lengths"]))
    if args.json:
        print(json.dumps(results))
    if cache is not None:
        cache.cleanup()


def build_sides() -> list:
    """eager zhnlp, compiled zhnlp and transformers, from the same random weights."""
    import torch
    from bench_model import Side, ernie_medium_config
    from transformers import ErnieForSequenceClassification
    from transformers.utils import logging as hf_logging

    import zhnlp

    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    hf = ErnieForSequenceClassification(ernie_medium_config())
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        eager = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp)
        compiled = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp, compile=True)
    return [Side("zhnlp", eager), Side("compiled", compiled), Side("transformers", hf)]


def timed(side, kind: str, batch) -> float:
    start = time.perf_counter()
    getattr(side, kind)(batch)
    return time.perf_counter() - start


def measure(sides: list, kind: str, batch, iters: int, warmup: int) -> None:
    """Rotating order: each side is first, middle and last equally often."""
    for i in range(warmup + iters):
        shift = i % len(sides)
        for side in sides[shift:] + sides[:shift]:
            side.run(kind, batch, record=i >= warmup)


def new_lengths(side, batch: int, seq: int) -> list[dict]:
    """Compiled inference on other sequence lengths: graphs compiled and the first call's time for each."""
    from bench_model import make_batch
    from torch._dynamo.utils import counters

    out = []
    for length, padded in ((seq - 32, False), (seq - 16, False), (seq - 48, False), (seq - 8, True)):
        before = counters["stats"]["unique_graphs"]
        first = timed(side, "inference", make_batch(batch, length, num_labels=2, seed=length, padded=padded))
        out.append({"seq": length, "padded": padded, "graphs": counters["stats"]["unique_graphs"] - before,
                    "first_ms": round(first * 1e3, 1)})
    return out


if __name__ == "__main__":
    main()
