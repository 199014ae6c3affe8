"""Checkpoint stall: how long a save blocks the training loop, synchronous against ``--async-save``, on the real
engine: ``zhnlp pretrain`` under torchrun (gloo on CPU, NCCL on GPUs), the same recipe, data, steps and layout, the
two settings alternating run by run.

A run saves every ``--interval`` steps, ``--saves`` times, and trains ``interval - 1`` steps after its last save so
that the background write of that one completes inside the measured steps. Its figure is the stall per save: the
sum of ``checkpoint_s`` (metrics.jsonl: the saves, and with --async-save also the checks for finished writes at
every step, their finalisation, and the wait for a write still running when the next save starts) over the steps
after the first save, divided by the saves after the first. The first save is printed apart: in both settings it
starts the process that megatron's writers report through (a spawned multiprocessing manager, seconds on a CPU).
Also printed: the median step time of the steps without a save (the background write competes with training for
the cores; copy-on-write faults after the fork are paid there). The ratio is ``async / sync`` (< 1: the training
loop waits less).

    .venv/bin/python benchmarks/bench_checkpoint.py [--recipe ernie-3.0-nano] [--nproc 1] [--interval 4]
        [--saves 4] [--rounds 1] [--distributed-optimizer] [--json] [-- EXTRA PRETRAIN FLAGS]
"""

from __future__ import annotations

import argparse
import json
import statistics

from pretrain_runs import pretrain_metrics

# small batches: the figure is the save, not the step (a bigger model makes the write noticeable)
SMALL = ["--global-batch-size", "2", "--micro-batch-size", "2", "--seq-length", "64"]


def run(recipe: str, nproc: int, interval: int, saves: int, flags: list[str], data: str) -> tuple[float, ...]:
    """(stall per save after the first in seconds, median step time of the steps without a save, the first
    save's stall) of one run."""
    steps = interval * (saves + 1) - 1  # the first two steps (not measured) hold no save: interval >= 3
    rows = pretrain_metrics(recipe, nproc, steps, ["--save-interval", str(interval), "--keep", "2", *flags], data)
    saved = [r for r in rows if r["step"] % interval == 0]
    if len(saved) != saves:
        raise RuntimeError(f"expected {saves} saves in the measured steps, found {len(saved)}")
    plain = [r["step_time_s"] for r in rows if r["step"] % interval]
    later = sum(r["checkpoint_s"] for r in rows if r["step"] > interval) / (saves - 1)
    return later, statistics.median(plain), saved[0]["checkpoint_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="ernie-3.0-nano")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--interval", type=int, default=4, help="steps between saves")
    ap.add_argument("--saves", type=int, default=4, help="saves per run (2 or more)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each setting")
    ap.add_argument("--distributed-optimizer", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("extra", nargs="*", help="more zhnlp pretrain flags (after --), e.g. -- --seq-length 128")
    args = ap.parse_args()
    if args.interval < 3 or args.saves < 2:
        ap.error("--interval must be 3 or more (the first two steps are not measured), --saves 2 or more")
    from zhnlp.data.demo import demo_corpus
    from zhnlp.training.config import recipe

    objective = "causal-lm" if recipe(args.recipe).head == "causal_lm" else "mlm"
    data = str(demo_corpus(objective=objective))
    base = SMALL + (["--distributed-optimizer"] if args.distributed_optimizer else []) + args.extra
    results = {"sync": [], "async": []}
    for i in range(args.rounds):
        for name in (("sync", "async") if i % 2 == 0 else ("async", "sync")):
            flags = base + (["--async-save"] if name == "async" else [])
            results[name].append(run(args.recipe, args.nproc, args.interval, args.saves, flags, data))
    sync_stall, sync_step, sync_first = (statistics.median(r[i] for r in results["sync"]) for i in range(3))
    async_stall, async_step, async_first = (statistics.median(r[i] for r in results["async"]) for i in range(3))
    result = {"recipe": args.recipe, "nproc": args.nproc, "interval": args.interval, "saves": args.saves,
              "rounds": args.rounds, "distributed_optimizer": args.distributed_optimizer,
              "sync_stall_s": sync_stall, "async_stall_s": async_stall, "ratio": async_stall / sync_stall,
              "sync_step_s": sync_step, "async_step_s": async_step, "sync_first_save_s": sync_first,
              "async_first_save_s": async_first}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.recipe}, {args.nproc} process(es), a save every {args.interval} steps x {args.saves}, "
          f"{args.rounds} run(s) each{', distributed optimizer' if args.distributed_optimizer else ''}")
    print(f"synchronous  : {sync_stall:7.3f} s stall per save   (first save {sync_first:.3f} s; steps without a "
          f"save: {sync_step:.3f} s)")
    print(f"--async-save : {async_stall:7.3f} s stall per save   (first save {async_first:.3f} s; steps without a "
          f"save: {async_step:.3f} s)   ratio {async_stall / sync_stall:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
