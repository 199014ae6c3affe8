"""Does a pretraining step wait for its data? ``zhnlp pretrain`` under torchrun on the debug and tiny recipes, with
the next step's micro-batches prepared on a background thread (``data.prefetch``, the default) and without; per run
the median and largest ``data_wait_s`` (the time a step waited for its batches, metrics.jsonl) of the steps after
the first two, beside the median step time.

    .venv/bin/python benchmarks/bench_data.py [--recipes ernie-debug,ernie-tiny,ernie4.5-debug,ernie4.5-tiny]
        [--nproc 2] [--steps 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

from pretrain_runs import pretrain_metrics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default="ernie-debug,ernie-tiny,ernie4.5-debug,ernie4.5-tiny")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from zhnlp.data.demo import demo_corpus
    from zhnlp.training.config import recipe

    results = {}
    for name in args.recipes.split(","):
        data = str(demo_corpus(objective="causal-lm" if recipe(name).head == "causal_lm" else "mlm"))
        for prefetch in (True, False):
            rows = pretrain_metrics(name, args.nproc, args.steps, [] if prefetch else ["--no-prefetch"], data)
            waits = [r["data_wait_s"] for r in rows]
            results[f"{name} prefetch={prefetch}"] = {
                "data_wait_median_ms": 1000 * statistics.median(waits), "data_wait_max_ms": 1000 * max(waits),
                "step_median_ms": 1000 * statistics.median(r["step_time_s"] for r in rows)}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.nproc} processes, {args.steps} steps each (steps 3..); data wait = time a step waited for its batch")
    print(f"{'run':<36} {'wait median ms':>15} {'wait max ms':>12} {'step ms':>9}")
    for name, r in results.items():
        print(f"{name:<36} {r['data_wait_median_ms']:>15.2f} {r['data_wait_max_ms']:>12.2f} "
              f"{r['step_median_ms']:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
