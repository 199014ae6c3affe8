"""The engine's speed-ups in one run, as ratios (issue "engine at scale"): each benchmark below runs as its own
process with ``--json`` and this script prints one table of what it measured against its reference in the same
run.

* compiled mode (``bench_compile.py``): transformers' time over zhnlp's, eager and compiled, for an ERNIE-3.0-medium
  fine-tuning step and inference (batch 8 x 128, every row full, fp32), and the compile time;
* communication overlap (``bench_overlap.py``, 2 processes over gloo): tokens/s with ``--overlap-grad-reduce`` over
  without, and with ``--overlap-param-gather`` over without (both with the distributed optimizer);
* asynchronous checkpoints (``bench_checkpoint.py``): the training loop's stall per save with ``--async-save``
  over a synchronous save;
* data prefetch (``bench_data.py``): the step's median wait for data with prefetching over without.

Run (about 12 minutes on 2 cores; ``--only NAME`` for one part)::

    .venv/bin/python benchmarks/bench_engine.py [--only compile|overlap|checkpoint|data] [--json]

On a shared or busy machine the ratios move by 10-20%: run it on an idle one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(script: str, *args: str) -> dict:
    """``script --json ARGS`` -> the last JSON object it printed."""
    proc = subprocess.run([sys.executable, str(HERE / script), "--json", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    text = proc.stdout
    start = max(text.rfind("\n{"), -1) + 1  # a JSON object starts a line: one line or indented over several
    return json.loads(text[start:])


def compile_rows() -> list[tuple]:
    r = _run("bench_compile.py", "--padding", "none")
    rows = []
    for kind in ("training", "inference"):
        x = r["none"][kind]
        rows.append((f"{kind} vs transformers, eager", x["eager_ratio"], "x"))
        rows.append((f"{kind} vs transformers, --compile", x["compiled_ratio"],
                     f"x (goal {1.25 if kind == 'training' else 1.5}x; compiled once in "
                     f"{r['compile_s'][f'none/{kind}']:.1f} s)"))
    return rows


def overlap_rows() -> list[tuple]:
    grad = _run("bench_overlap.py", "--distributed-optimizer")
    param = _run("bench_overlap.py", "--param-gather", "--bucket-size", "1000000")
    return [("--overlap-grad-reduce, tokens/s over without", grad["speed_up"], f"x ({grad['recipe']}, DP=2, gloo)"),
            ("--overlap-param-gather, tokens/s over without", param["speed_up"], f"x ({param['recipe']}, DP=2, gloo)")]


def checkpoint_rows() -> list[tuple]:
    r = _run("bench_checkpoint.py", "--interval", "8", "--saves", "3")
    return [("--async-save, stall per save over synchronous", r["ratio"],
             f"x ({r['async_stall_s']:.2f} s vs {r['sync_stall_s']:.2f} s, {r['recipe']}; lower is better)")]


def data_rows() -> list[tuple]:
    r = _run("bench_data.py", "--recipes", "ernie-debug,ernie4.5-debug")
    rows = []
    for name in ("ernie-debug", "ernie4.5-debug"):
        on, off = r[f"{name} prefetch=True"], r[f"{name} prefetch=False"]
        ratio = on["data_wait_median_ms"] / max(off["data_wait_median_ms"], 1e-9)
        rows.append((f"prefetch, data wait over without ({name})", ratio,
                     f"x ({on['data_wait_median_ms']:.2f} ms vs {off['data_wait_median_ms']:.2f} ms; lower is better)"))
    return rows


PARTS = {"compile": compile_rows, "overlap": overlap_rows, "checkpoint": checkpoint_rows, "data": data_rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(PARTS))
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON object")
    args = ap.parse_args()
    rows = []
    for name, part in PARTS.items():
        if args.only in (None, name):
            print(f"[bench_engine] {name} ...", flush=True)
            rows += part()
    width = max(len(r[0]) for r in rows)
    for what, ratio, note in rows:
        print(f"{what:<{width}}  {ratio:6.2f}{note}")
    if args.json:
        print(json.dumps({what: ratio for what, ratio, _ in rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
