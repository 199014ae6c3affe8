"""Set the planner's time model beside step times measured on this machine.

Each layout below is a real ``zhnlp pretrain`` run (torchrun, gloo, 1-4 processes, one thread each) of a debug
recipe for ``STEPS`` steps; its step time is the median of the steps after the first ``WARMUP`` (the trainer's
``global_batch x seq_length / tokens_per_s``: forward, backward and optimizer, without data loading). The machine
is shared with other work, whose bursts only ever slow steps down: every layout is measured in ``PASSES`` passes
over the whole list (so that a burst does not hit one layout's every step), and its step time is the fastest of
its steps after warm-up (``--estimate fastest``, the default: the least disturbed figure) or the lower of the
passes' medians (``--estimate median``); the Spearman coefficient of the other estimate is printed too. The
``cpu`` hardware preset is then calibrated on these same measurements (:func:`zhnlp.planning.timing.calibrate`)
and the calibrated model's predictions are ranked against the measurements (Spearman). Because the fit sees the
layouts it is judged on, the leave-one-out figure is printed too: each layout predicted by a model calibrated
on the others. Prints a Markdown table and writes OUTPUT/timing.json.

    .venv/bin/python scripts/validate_timing.py [--output runs/planner-validation] [--only NAME,...] [--again]

Finished measurements are kept in OUTPUT/timing.json: a second call measures only what is missing. The machine
may be shared: medians, and a measured layout can be measured again with ``--again --only NAME``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zhnlp.distributed import free_port  # noqa: E402  (after the checkout is on the path)

STEPS, WARMUP, PASSES = 12, 2, 2
# one workload per recipe, so that within a recipe only the layout differs
DEC = ["--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "16"]
ENC = ["--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "16"]

# name -> (processes, recipe, zhnlp pretrain flags)
CONFIGS = {
    "dec-1p": (1, "ernie4.5-debug", DEC),
    "dec-1p-full": (1, "ernie4.5-debug", [*DEC, "--recompute", "full"]),
    "dec-dp2": (2, "ernie4.5-debug", DEC),
    "dec-dp2-distopt": (2, "ernie4.5-debug", [*DEC, "--distributed-optimizer"]),
    "dec-tp2": (2, "ernie4.5-debug", [*DEC, "--tp", "2"]),
    "dec-tp2-sp": (2, "ernie4.5-debug", [*DEC, "--tp", "2", "--sequence-parallel"]),
    "dec-pp2": (2, "ernie4.5-debug", [*DEC, "--pp", "2"]),
    "dec-pp2-vpp2": (2, "ernie4.5-debug", [*DEC, "--pp", "2", "--vpp", "2"]),
    "dec-tp2-pp2": (4, "ernie4.5-debug", [*DEC, "--tp", "2", "--pp", "2"]),
    "dec-dp4": (4, "ernie4.5-debug", DEC),
    "enc-1p": (1, "ernie-debug", ENC),
    "enc-dp2": (2, "ernie-debug", ENC),
    "enc-tp2": (2, "ernie-debug", [*ENC, "--tp", "2"]),
    "enc-pp2": (2, "ernie-debug", [*ENC, "--pp", "2"]),
    "moe-1p": (1, "ernie4.5-moe-debug", DEC),
    "moe-ep2": (2, "ernie4.5-moe-debug", [*DEC, "--ep", "2"]),
    "moe-dp2": (2, "ernie4.5-moe-debug", DEC),
    "moe-tp2-ep2-sp": (4, "ernie4.5-moe-debug", [*DEC, "--tp", "2", "--ep", "2", "--sequence-parallel"]),
}


def step_seconds(nproc: int, recipe: str, flags: list[str], tokens: int, steps: int = STEPS) -> list[float]:
    """Run the layout for ``steps`` steps (no peak-memory profiling: it slows every operation); the seconds of
    each step, from ``metrics.jsonl`` (``tokens`` per step over its ``tokens_per_s``)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--recipe", recipe, "--output",
               f"{tmp}/run", "--steps", str(steps), "--log-interval", "1", "--warmup-steps", "0",
               "--memory-window", "0", *flags]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        lines = Path(f"{tmp}/run/metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [tokens / json.loads(line)["tokens_per_s"] for line in lines]


def measurement(name: str, seconds: float):
    """The :class:`zhnlp.planning.timing.Measurement` of layout ``name`` (its recipe and flags resolved as
    ``zhnlp pretrain`` resolves them)."""
    from zhnlp.cli import build_parser
    from zhnlp.planning import Layout
    from zhnlp.planning.timing import Measurement
    from zhnlp.training.command import resolve

    nproc, recipe_name, flags = CONFIGS[name]
    cfg = resolve(build_parser("pretrain").parse_args(["pretrain", "--recipe", recipe_name, *flags]))
    d = cfg.data
    return Measurement(cfg.architecture(), Layout.from_run(cfg, nproc), seconds, global_batch=d.global_batch_size,
                       micro_batch=d.micro_batch_size, seq_length=d.seq_length, head=cfg.head, mask_prob=d.mask_prob)


def tokens_of(name: str) -> int:
    m = measurement(name, 1.0)
    return m.global_batch * m.seq_length


def main() -> int:
    from zhnlp.planning.timing import calibrate, hardware, predict, spearman, step_time

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=ROOT / "runs" / "planner-validation")
    ap.add_argument("--only", default="", help="comma-separated layout names (measured again with --again)")
    ap.add_argument("--again", action="store_true", help="measure again what was measured before")
    ap.add_argument("--passes", type=int, default=PASSES, help="measurements of each layout")
    ap.add_argument("--estimate", choices=("fastest", "median"), default="fastest",
                    help="a layout's step time: its fastest step after warm-up, or the lowest median of its passes")
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / "timing.json"
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    measured = saved.get("measured", {})
    todo = [n for n in args.only.split(",") if n] or list(CONFIGS)
    if args.again:
        for name in todo:
            measured.pop(name, None)
    for _ in range(args.passes):  # whole passes: a burst of other work slows one pass of a layout, not all
        for name in todo:
            runs = measured.setdefault(name, {"steps_s": []})["steps_s"]
            if len(runs) >= args.passes:
                continue
            nproc, recipe, flags = CONFIGS[name]
            runs.append(step_seconds(nproc, recipe, flags, tokens_of(name)))
            print(f"{name}: {_estimates(runs)}", file=sys.stderr, flush=True)
            path.write_text(json.dumps({**saved, "measured": measured}, indent=1), encoding="utf-8")
    names = [n for n in CONFIGS if n in measured]
    for name in names:
        measured[name].update(_estimates(measured[name]["steps_s"]))
    other = {"fastest": "median", "median": "fastest"}[args.estimate]
    rho_other = _fitted_spearman([measurement(n, measured[n][f"{other}_s"]) for n in names])
    ms = [measurement(n, measured[n][f"{args.estimate}_s"]) for n in names]
    hw = calibrate(ms, hardware("cpu"))
    predicted = [predict(m, hw) for m in ms]
    secs = [m.seconds for m in ms]
    rho = spearman(secs, predicted)
    loo = [predict(m, calibrate(ms[:i] + ms[i + 1:], hardware("cpu"))) for i, m in enumerate(ms)]
    rho_loo = spearman(secs, loo)
    rank_m = _ranks(secs)
    rank_p = _ranks(predicted)
    print("| layout | processes | recipe and flags | measured s/step | predicted s/step | leave-one-out s/step | "
          "measured rank | predicted rank |\n|---|---|---|---|---|---|---|---|")
    for i, name in enumerate(names):
        nproc, recipe, flags = CONFIGS[name]
        shown = " ".join(flags[len(DEC):])  # the workload flags (DEC, ENC) are the same for every layout
        print(f"| {name} | {nproc} | {recipe} {shown} | {secs[i]:.3f} | {predicted[i]:.3f} | {loo[i]:.3f} | "
              f"{rank_m[i]:g} | {rank_p[i]:g} |")
    print(f"\nstep time: the {args.estimate} estimate. Spearman (calibrated on these {len(names)} layouts): "
          f"{rho:.3f}; leave-one-out: {rho_loo:.3f}; with the {other} estimate (calibrated on it): {rho_other:.3f}")
    per_recipe = {}
    for recipe in sorted({CONFIGS[n][1] for n in names}):
        idx = [i for i, n in enumerate(names) if CONFIGS[n][1] == recipe]
        if len(idx) >= 3:
            per_recipe[recipe] = spearman([secs[i] for i in idx], [predicted[i] for i in idx])
            print(f"Spearman within {recipe} ({len(idx)} layouts): {per_recipe[recipe]:.3f}")
    constants = {f.name: getattr(hw, f.name) for f in dataclasses.fields(hw)}
    print(f"calibrated cpu hardware: {constants}")
    parts = {n: step_time(m.arch, m.layout, global_batch=m.global_batch, micro_batch=m.micro_batch,
                          seq_length=m.seq_length, hardware=hw, head=m.head, mask_prob=m.mask_prob)
             for n, m in zip(names, ms)}
    path.write_text(json.dumps({"measured": measured, "predicted_s": dict(zip(names, predicted)),
                                "leave_one_out_s": dict(zip(names, loo)), "spearman": rho,
                                "spearman_leave_one_out": rho_loo, "spearman_per_recipe": per_recipe,
                                "estimate": args.estimate, f"spearman_{other}": rho_other,
                                "calibrated_on": "the same layouts", "hardware": constants, "parts": parts},
                               indent=1), encoding="utf-8")
    return 0


def _estimates(runs: list[list[float]]) -> dict:
    """A layout's step time from its passes' step times: ``fastest_s`` and ``median_s``, warm-up left out."""
    return {"fastest_s": min(min(r[WARMUP:]) for r in runs),
            "median_s": min(statistics.median(r[WARMUP:]) for r in runs)}


def _fitted_spearman(ms: list) -> float:
    from zhnlp.planning.timing import calibrate, hardware, predict, spearman

    hw = calibrate(ms, hardware("cpu"))
    return spearman([m.seconds for m in ms], [predict(m, hw) for m in ms])


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    for r, i in enumerate(order, 1):
        out[i] = r
    return out


if __name__ == "__main__":
    sys.exit(main())
