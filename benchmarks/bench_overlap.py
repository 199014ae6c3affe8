"""Data-parallel gradient reduction overlapped with the backward (``--overlap-grad-reduce``) against the reduction
after the backward or, with ``--param-gather``, the distributed optimizer's parameter all-gather overlapped with
the next forward (``--overlap-param-gather``, on top of ``--distributed-optimizer --overlap-grad-reduce``) against
the gather right after the optimizer step, on the real engine: ``zhnlp pretrain`` under torchrun (gloo on CPU, NCCL
on GPUs), the same recipe, data, steps and layout, the two settings alternating run by run.

Each run's figure is the median tokens/s of its steps after the first two (from metrics.jsonl); the settings
alternate (off, on, on, off, ...) so that machine noise hits both alike, and the ratio is
``on / off`` (> 1: overlapping is faster).

    .venv/bin/python benchmarks/bench_overlap.py [--recipe ernie4.5-tiny] [--nproc 2] [--steps 8] [--rounds 2]
        [--bucket-size N] [--distributed-optimizer] [--param-gather] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

from pretrain_runs import pretrain_metrics


def run(recipe: str, nproc: int, steps: int, flags: list[str], data: str) -> float:
    """Median tokens/s of steps 3.. of one ``zhnlp pretrain`` run."""
    return statistics.median(r["tokens_per_s"] for r in pretrain_metrics(recipe, nproc, steps, flags, data))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="ernie4.5-tiny")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each setting")
    ap.add_argument("--bucket-size", type=int, default=None, help="parameters per bucket when overlapping")
    ap.add_argument("--distributed-optimizer", action="store_true")
    ap.add_argument("--param-gather", action="store_true",
                    help="compare --overlap-param-gather with the gather after the step (both with the distributed "
                         "optimizer and --overlap-grad-reduce)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from zhnlp.data.demo import demo_corpus
    from zhnlp.training.config import recipe

    objective = "causal-lm" if recipe(args.recipe).head == "causal_lm" else "mlm"
    data = str(demo_corpus(objective=objective))
    buckets = ["--bucket-size", str(args.bucket_size)] if args.bucket_size else []
    if args.param_gather:
        args.distributed_optimizer = True
        base = ["--distributed-optimizer", "--overlap-grad-reduce", *buckets]
        on = base + ["--overlap-param-gather"]
    else:
        base = ["--distributed-optimizer"] if args.distributed_optimizer else []
        on = base + ["--overlap-grad-reduce", *buckets]
    times = {"off": [], "on": []}
    for i in range(args.rounds):
        for name in (("off", "on") if i % 2 == 0 else ("on", "off")):
            times[name].append(run(args.recipe, args.nproc, args.steps, on if name == "on" else base, data))
    off, on_ = statistics.median(times["off"]), statistics.median(times["on"])
    result = {"recipe": args.recipe, "nproc": args.nproc, "distributed_optimizer": args.distributed_optimizer,
              "bucket_size": args.bucket_size, "param_gather": args.param_gather, "off_tokens_per_s": off,
              "on_tokens_per_s": on_, "speed_up": on_ / off}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.recipe}, {args.nproc} processes (data parallel), {args.steps} steps x {args.rounds} runs each"
          f"{', distributed optimizer' if args.distributed_optimizer else ''}")
    if args.param_gather:
        print(f"parameters gathered after the step : {off:9.1f} tokens/s")
        print(f"gathered during the next forward   : {on_:9.1f} tokens/s   speed-up {on_ / off:.2f}x")
        return 0
    print(f"reduction after the backward : {off:9.1f} tokens/s")
    print(f"overlapped with the backward : {on_:9.1f} tokens/s   speed-up {on_ / off:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
