"""Shared by the benchmarks that time the real engine: one ``zhnlp pretrain`` run under torchrun into a temporary
directory, its metrics.jsonl read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pretrain_metrics(recipe: str, nproc: int, steps: int, flags: list[str], data: str) -> list[dict]:
    """metrics.jsonl of ``zhnlp pretrain --recipe RECIPE --steps STEPS --data DATA FLAGS`` on ``nproc`` processes
    (one thread each), the steps after the first two (which also build megatron's state)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "-m", "zhnlp", "pretrain",
               "--recipe", recipe, "--steps", str(steps), "--output", str(out), "--log-interval", "1",
               "--data", str(data), *flags]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "tokens_per_s" in r][2:]
    if not rows:
        raise RuntimeError(f"{recipe}: metrics.jsonl holds no step after the first two; pass --steps 3 or more.")
    return rows
