"""Set the planner's memory model beside measurements on this machine.

Each configuration below is a real ``zhnlp pretrain`` run (torchrun, gloo, 1-4 processes) of a debug recipe for
``STEPS`` steps; its ``peak_tensor_bytes`` (allocator level, the maximum over ranks: see
:mod:`zhnlp.training.peak_memory`) is set beside the planner's prediction for the same recipe and layout. Today
the planner predicts the persistent part (:func:`zhnlp.planning.memory.static_memory`: weights, gradient buffer,
optimizer states, exact); the rest of the peak (activations of the micro-batches in flight, the loss's logits,
gradient and optimizer temporaries) is printed as what remains to be modelled. Prints a Markdown table and writes
OUTPUT/memory.json.

    .venv/bin/python scripts/validate_planner.py [--output runs/planner-validation] [--only NAME,...]

Finished measurements are kept in OUTPUT/memory.json: a second call measures only what is missing (``--again``
measures everything again).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zhnlp.distributed import free_port  # noqa: E402  (after the checkout is on the path)

STEPS = 3

# name -> (processes, recipe, zhnlp pretrain flags). The shapes are chosen so that activations, parameters and
# optimizer states each dominate somewhere: long sequences and large micro-batches on the tiny widths.
CONFIGS = {
    "enc-1p": (1, "ernie-debug", []),
    "enc-1p-long": (1, "ernie-debug", ["--seq-length", "256", "--micro-batch-size", "8", "--global-batch-size", "16"]),
    "enc-1p-long-full": (1, "ernie-debug", ["--seq-length", "256", "--micro-batch-size", "8",
                                            "--global-batch-size", "16", "--recompute", "full"]),
    "enc-1p-bf16": (1, "ernie-debug", ["--precision", "bf16", "--seq-length", "128", "--micro-batch-size", "8",
                                       "--global-batch-size", "16"]),
    "enc-dp2-distopt": (2, "ernie-debug", ["--distributed-optimizer"]),
    "enc-dp2-distopt-bf16": (2, "ernie-debug", ["--distributed-optimizer", "--precision", "bf16"]),
    "enc-tp2": (2, "ernie-debug", ["--tp", "2", "--seq-length", "128", "--micro-batch-size", "8",
                                   "--global-batch-size", "16"]),
    "enc-tp2-sp": (2, "ernie-debug", ["--tp", "2", "--sequence-parallel", "--seq-length", "128",
                                      "--micro-batch-size", "8", "--global-batch-size", "16"]),
    "enc-pp2": (2, "ernie-debug", ["--pp", "2", "--seq-length", "128", "--micro-batch-size", "4",
                                   "--global-batch-size", "16"]),
    "enc-pp2-vpp2": (2, "ernie-debug", ["--pp", "2", "--vpp", "2", "--seq-length", "128", "--micro-batch-size", "4",
                                        "--global-batch-size", "16"]),
    "enc-tp2-pp2": (4, "ernie-debug", ["--tp", "2", "--pp", "2", "--seq-length", "128", "--micro-batch-size", "4",
                                       "--global-batch-size", "16"]),
    "dec-1p-long": (1, "ernie4.5-debug", ["--seq-length", "256", "--micro-batch-size", "8",
                                          "--global-batch-size", "16"]),
    "dec-1p-selective": (1, "ernie4.5-debug", ["--seq-length", "256", "--micro-batch-size", "8",
                                               "--global-batch-size", "16", "--recompute", "selective"]),
    "dec-tp2-sp-bf16": (2, "ernie4.5-debug", ["--tp", "2", "--sequence-parallel", "--precision", "bf16",
                                              "--seq-length", "128", "--micro-batch-size", "8",
                                              "--global-batch-size", "16"]),
    "dec-pp2-dp2-distopt": (4, "ernie4.5-debug", ["--pp", "2", "--distributed-optimizer", "--seq-length", "128",
                                                  "--micro-batch-size", "4", "--global-batch-size", "16"]),
    "dec-dp2-fp16": (2, "ernie4.5-debug", ["--precision", "fp16", "--seq-length", "128", "--micro-batch-size", "4",
                                           "--global-batch-size", "16"]),
    "moe-1p": (1, "ernie4.5-moe-debug", ["--seq-length", "128", "--micro-batch-size", "8",
                                         "--global-batch-size", "16"]),
    "moe-ep2": (2, "ernie4.5-moe-debug", ["--ep", "2", "--seq-length", "128", "--micro-batch-size", "8",
                                          "--global-batch-size", "16"]),
    "moe-ep2-tp2-sp": (4, "ernie4.5-moe-debug", ["--ep", "2", "--tp", "2", "--sequence-parallel",
                                                 "--seq-length", "128", "--micro-batch-size", "8",
                                                 "--global-batch-size", "16"]),
}


def measure(nproc: int, recipe: str, flags: list[str], steps: int = STEPS) -> dict:
    """Run the configuration for ``steps`` steps; its last metrics line (``peak_tensor_bytes`` among them)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--recipe", recipe, "--output",
               f"{tmp}/run", "--steps", str(steps), "--log-interval", "1", "--warmup-steps", "0", *flags]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        lines = Path(f"{tmp}/run/metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=ROOT / "runs" / "planner-validation")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--again", action="store_true", help="measure again what was measured before")
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / "memory.json"
    measured = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and not args.again else {}
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    for name in names:
        nproc, recipe, flags = CONFIGS[name]
        if name not in measured:
            m = measure(nproc, recipe, flags)
            measured[name] = {"peak_tensor_bytes": m["peak_tensor_bytes"]}
            path.write_text(json.dumps(measured, indent=1), encoding="utf-8")
    print("| configuration | processes | recipe and flags | measured peak MiB | persistent (predicted) MiB | "
          "rest MiB |\n|---|---|---|---|---|---|")
    for name in names:
        nproc, recipe_name, flags = CONFIGS[name]
        peak = measured[name]["peak_tensor_bytes"]
        static = predicted_static(nproc, recipe_name, flags)
        print(f"| {name} | {nproc} | {recipe_name} {' '.join(flags)} | {peak / 2**20:.2f} | {static / 2**20:.2f} | "
              f"{(peak - static) / 2**20:.2f} |", flush=True)
    return 0


def predicted_static(nproc: int, recipe_name: str, flags: list[str]) -> int:
    """The planner's persistent bytes of the run's largest stage."""
    from zhnlp.cli import build_parser
    from zhnlp.planning import Layout, static_memory
    from zhnlp.training.command import resolve

    cfg = resolve(build_parser("pretrain").parse_args(["pretrain", "--recipe", recipe_name, *flags]))
    return max(stage["total"] for stage in static_memory(cfg.architecture(), Layout.from_run(cfg, nproc)))


if __name__ == "__main__":
    sys.exit(main())
