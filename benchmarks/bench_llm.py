"""zhnlp vs transformers: speed of the ERNIE 4.5 decoders on CPU (fp32), in one process.

Three comparisons, each on a random transformers model saved to a temporary directory and loaded with
``zhnlp.AutoModelForCausalLM`` (the same weights on both sides):

* ``dense-train``: ``Ernie4_5ForCausalLM`` with ERNIE-4.5-0.3B's widths (hidden 1024, 16 query / 2 key-value
  heads of 128, FFN 3072, vocabulary 103,424, tied) cut to 4 layers; one training step = forward with labels,
  ``loss.backward()``, ``torch.optim.AdamW`` step, ``zero_grad``;
* ``moe-train``: ``Ernie4_5_MoeForCausalLM`` of the same attention widths, 4 layers (layer 0 dense), 16 experts of
  width 512, top-4, one shared expert (the 21B-A3B expert count and widths do not fit a CPU's memory with Adam);
  the same training step;
* ``generate``: greedy generation of ``--new-tokens`` (32) tokens after a 32-token prompt with the dense model,
  KV cache on both sides (transformers' ``generate`` vs zhnlp's ``model.generate``).

The sides alternate iteration by iteration (ABBA) so that machine noise hits both alike; each figure is the median
ms per iteration, ``speed-up = transformers_ms / zhnlp_ms`` (> 1: zhnlp faster); tokens/s are zhnlp's.

Run (a few minutes on 2 cores):

    .venv/bin/python benchmarks/bench_llm.py [--threads 2] [--batch 2] [--seq 256] [--iters 6] [--only NAME] [--json]

``--recipes`` instead runs the decoder pretraining recipes under torchrun (``--nproc-per-node 2``, ``--steps``
steps each into a temporary directory, the demo corpus) and prints the median tokens/s and MFU of the steps after
the first two, read from each run's metrics.jsonl. The MFU's peak is measured here, not assumed: a CPU has no
published "device peak", so the peak given to ``zhnlp pretrain --peak-tflops`` is one thread's fp32 GEMM rate (a
2048^3 matmul, the best of a few), as each torchrun process computes with one thread. The MFU is then the share of
what the cores reach on a large matmul, which is an upper bound on their useful rate rather than their data-sheet peak.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings

import torch
from pretrain_runs import pretrain_metrics

GOALS = {"dense-train": 1.10, "moe-train": 1.10, "generate": 1.10}
WIDTHS = dict(vocab_size=103424, hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
              num_key_value_heads=2, head_dim=128, intermediate_size=3072, max_position_embeddings=4096,
              rms_norm_eps=1e-5, tie_word_embeddings=True, use_bias=False)
MOE = dict(moe_num_experts=16, moe_k=4, moe_intermediate_size=512, moe_num_shared_experts=1, moe_layer_start_index=1)


def build(kind: str, directory: str):
    """The transformers model (train mode) and zhnlp's copy of it, loaded from ``directory``."""
    import transformers

    import zhnlp

    torch.manual_seed(0)
    if kind == "moe":
        hf = transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(**WIDTHS, **MOE))
    else:
        hf = transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(**WIDTHS))
    hf.save_pretrained(directory)
    return hf.float(), zhnlp.AutoModelForCausalLM.from_pretrained(directory)


def training_step(model, optimizer, batch):
    def step():
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def alternate(a, b, iters: int, warmup: int = 1) -> tuple[float, float]:
    """Median ms of ``a()`` and ``b()``, run in ABBA order after ``warmup`` rounds."""
    for _ in range(warmup):
        a(), b()
    ta, tb = [], []
    for i in range(iters):
        order = (a, b) if i % 2 == 0 else (b, a)
        for fn in order:
            start = time.perf_counter()
            fn()
            (ta if fn is a else tb).append((time.perf_counter() - start) * 1000)
    return statistics.median(ta), statistics.median(tb)


def bench_training(kind: str, batch: int, seq: int, iters: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        hf, zh = build(kind, d)
        hf.train(), zh.train()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(3, WIDTHS["vocab_size"], (batch, seq), generator=g)
        data = {"input_ids": ids, "labels": ids}
        hf_opt = torch.optim.AdamW(hf.parameters(), lr=1e-5)
        zh_opt = torch.optim.AdamW([p for p in zh.parameters() if p.requires_grad], lr=1e-5)
        hf_ms, zh_ms = alternate(training_step(hf, hf_opt, data), training_step(zh, zh_opt, data), iters)
    return {"transformers_ms": hf_ms, "zhnlp_ms": zh_ms, "zhnlp_tokens_per_s": batch * seq / zh_ms * 1000}


def bench_generate(new_tokens: int, iters: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        hf, zh = build("dense", d)
        hf.eval(), zh.eval()
        prompt = torch.randint(3, WIDTHS["vocab_size"], (1, 32), generator=torch.Generator().manual_seed(2))
        mask = torch.ones_like(prompt)

        def run_hf():
            with torch.inference_mode():
                return hf.generate(prompt, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)

        def run_zh():
            with torch.inference_mode():
                return zh.generate(prompt, max_new_tokens=new_tokens, eos_token_id=[])

        same = torch.equal(run_hf(), run_zh())
        hf_ms, zh_ms = alternate(run_hf, run_zh, iters)
    return {"transformers_ms": hf_ms, "zhnlp_ms": zh_ms, "zhnlp_tokens_per_s": new_tokens / zh_ms * 1000,
            "identical_tokens": same}


RECIPES = ("ernie4.5-debug", "ernie4.5-moe-debug", "ernie4.5-tiny")


def gemm_peak_tflops(n: int = 2048, repeats: int = 5) -> float:
    """One thread's fp32 matmul rate in TFLOP/s (best of ``repeats``): the per-process peak for the MFU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * n ** 3 / best / 1e12


def bench_recipe(recipe: str, steps: int, nproc: int, peak: float) -> dict:
    """``zhnlp pretrain --recipe RECIPE`` under torchrun -> median tokens/s and MFU of the steps after the first two."""
    from zhnlp.data.demo import demo_corpus

    rows = pretrain_metrics(recipe, nproc, steps, ["--peak-tflops", f"{peak:.6g}"], demo_corpus(objective="causal-lm"))
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
            "mfu": statistics.median(r["mfu"] for r in rows), "steps_measured": len(rows)}


def run_recipes(args) -> int:
    peak = gemm_peak_tflops()
    results = {name: bench_recipe(name, args.steps, args.nproc, peak) for name in RECIPES}
    if args.json:
        print(json.dumps({"peak_tflops_per_process": peak, **results}, indent=2))
        return 0
    print(f"torchrun --nproc-per-node {args.nproc}, fp32, 1 thread per process, {args.steps} steps "
          f"(median of steps 3..); MFU against {peak * 1000:.1f} GFLOP/s per process (1-thread 2048^3 fp32 matmul)")
    print(f"{'recipe':<20} {'tokens/s':>10} {'MFU':>7}")
    for name, r in results.items():
        print(f"{name:<20} {r['tokens_per_s']:>10.1f} {r['mfu'] * 100:>6.1f}%")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--only", choices=sorted(GOALS))
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--recipes", action="store_true",
                    help=f"run the pretraining recipes {', '.join(RECIPES)} under torchrun: tokens/s and MFU")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per recipe (--recipes)")
    ap.add_argument("--nproc", type=int, default=2, help="processes per recipe (--recipes)")
    args = ap.parse_args()
    if args.recipes:
        return run_recipes(args)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import zhnlp

    zhnlp.distributed.init()
    runs = {"dense-train": lambda: bench_training("dense", args.batch, args.seq, args.iters),
            "moe-train": lambda: bench_training("moe", args.batch, args.seq, args.iters),
            "generate": lambda: bench_generate(args.new_tokens, args.iters)}
    results = {}
    for name, run in runs.items():
        if args.only and name != args.only:
            continue
        r = run()
        r["speed_up"] = r["transformers_ms"] / r["zhnlp_ms"]
        r["goal"] = GOALS[name]
        results[name] = r
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"fp32, {args.threads} threads, batch {args.batch} x seq {args.seq} (training), "
          f"{args.new_tokens} new tokens (generation)")
    print(f"{'case':<12} {'transformers ms':>16} {'zhnlp ms':>10} {'speed-up':>9} {'goal':>6} {'zhnlp tok/s':>12}")
    for name, r in results.items():
        print(f"{name:<12} {r['transformers_ms']:>16.1f} {r['zhnlp_ms']:>10.1f} {r['speed_up']:>8.2f}x "
              f"{r['goal']:>5.2f}x {r['zhnlp_tokens_per_s']:>12.1f}")
    if "generate" in results:
        print(f"greedy tokens identical: {results['generate']['identical_tokens']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
