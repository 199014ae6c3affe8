"""``zhnlp plan --calibrate FILE``: measure a few short layouts of a recipe on this node and fit the time model.

Each layout is a real ``zhnlp pretrain`` run under torchrun (``--steps 8 --memory-window 0``) with the node's
processes: one process, then data, tensor (with sequence parallelism), pipeline and, for mixture-of-experts
recipes, expert parallelism over all of them. A run's step time is its fastest step after the first two (other
work on the machine only ever slows a step down). :func:`zhnlp.planning.timing.calibrate` fits the hardware's
constants to them and the result is written as JSON, which ``zhnlp plan --hardware-file FILE`` plans with. The
links a node cannot exercise (between nodes) keep the preset's values: calibrate those from a multi-node run's
``metrics.jsonl`` with :func:`zhnlp.planning.timing.calibrate` directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from zhnlp.errors import ZhnlpError

STEPS = 8


def calibration_layouts(cfg, nproc: int) -> list[tuple[int, list[str]]]:
    """(processes, zhnlp pretrain flags) of the layouts to measure for ``cfg``'s model on ``nproc`` processes."""
    arch = cfg.architecture()
    heads = arch.num_attention_heads
    kv = getattr(arch, "num_key_value_heads", heads)
    d = cfg.data
    # one process at two batch sizes: the same calls per micro-batch, four times the FLOPs (compute vs overhead)
    out = [(1, []), (1, ["--micro-batch-size", str(4 * d.micro_batch_size),
                         "--global-batch-size", str(4 * d.global_batch_size)])]
    if nproc >= 2:
        n = nproc
        out.append((n, []))  # data parallelism over the node
        tp = max(t for t in (1, 2, 4, 8) if t <= n and heads % t == 0 and kv % t == 0 and n % t == 0)
        if tp > 1:
            out.append((tp, ["--tp", str(tp), "--sequence-parallel"]))
        if arch.num_hidden_layers % 2 == 0:
            out.append((2, ["--pp", "2"]))
        if getattr(arch, "is_moe", False) and arch.moe_num_experts % 2 == 0:
            out.append((2, ["--ep", "2"]))
    return out


def _step_seconds(nproc: int, cfg_args: list[str], tokens: int) -> float:
    from zhnlp.distributed import free_port

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", *cfg_args, "--output", f"{tmp}/run",
               "--steps", str(STEPS), "--log-interval", "1", "--memory-window", "0", "--save-interval", "0"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise ZhnlpError(f"calibration run `{' '.join(cmd[4:])}` failed: {tail[0]}")
        lines = Path(f"{tmp}/run/metrics.jsonl").read_text(encoding="utf-8").splitlines()
    seconds = [tokens / json.loads(line)["tokens_per_s"] for line in lines]
    return min(seconds[2:] or seconds)


def calibrate_here(cfg, hw, path: str, nproc: int | None = None) -> int:
    """Measure :func:`calibration_layouts` on this node, fit ``hw``'s constants and write them to ``path``."""
    from zhnlp.planning import Layout
    from zhnlp.planning.timing import Measurement, calibrate, predict, spearman

    import torch

    if not torch.cuda.is_available() and hw.name != "cpu":  # the runs measure this machine's CPU processes
        from zhnlp.planning.timing import hardware

        print(f"no GPU here: calibrating the cpu preset (not {hw.name})", flush=True)
        hw = hardware("cpu")
    if nproc is None:
        nproc = torch.cuda.device_count() or min(4, os.cpu_count() or 1)
    d = cfg.data
    base = ["--recipe", cfg.recipe, "--precision", cfg.precision, "--seq-length", str(d.seq_length),
            "--global-batch-size", str(d.global_batch_size), "--micro-batch-size", str(d.micro_batch_size)]
    if d.prefix:
        base += ["--data", d.prefix]
    measurements = []
    for procs, flags in calibration_layouts(cfg, nproc):
        from zhnlp.cli import build_parser
        from zhnlp.training.command import resolve

        run = resolve(build_parser("pretrain").parse_args(["pretrain", *base, *flags]))
        r = run.data
        seconds = _step_seconds(procs, base + flags, r.global_batch_size * r.seq_length)
        print(f"measured {procs} process{'es' if procs > 1 else ''} {' '.join(flags) or '(one layout)'}: "
              f"{seconds:.4g} s/step", flush=True)
        measurements.append(Measurement(run.architecture(), Layout.from_run(run, procs), seconds,
                                        global_batch=r.global_batch_size, micro_batch=r.micro_batch_size,
                                        seq_length=r.seq_length, head=run.head, mask_prob=r.mask_prob))
    fitted = calibrate(measurements, hw)
    save_hardware(fitted, path)
    predicted = [predict(m, fitted) for m in measurements]
    rho = spearman([m.seconds for m in measurements], predicted) if len(measurements) > 1 else float("nan")
    if fitted.efficiency == float("inf"):
        print("note: these runs did not separate compute from fixed costs (their times hardly grew with the FLOPs); "
              "calibrate with a larger --micro-batch-size or --seq-length", flush=True)
    print(f"fitted {fitted.name}: efficiency {fitted.efficiency:.3g}, intra-node {fitted.intra_bandwidth:.3g} B/s, "
          f"latency {fitted.intra_latency:.3g} s; rank correlation on these runs {rho:.2f}; written to {path} "
          "(plan with --hardware-file)")
    return 0


def save_hardware(hw, path: str) -> None:
    Path(path).write_text(json.dumps(dataclasses.asdict(hw), indent=1), encoding="utf-8")


def load_hardware(path: str):
    """A :class:`zhnlp.planning.timing.Hardware` written by :func:`save_hardware`."""
    from zhnlp.planning.timing import Hardware

    p = Path(path)
    if not p.is_file():
        raise ZhnlpError(f"--hardware-file {path} does not exist; write one with `zhnlp plan --calibrate {path}`.")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        return Hardware(**data)
    except (ValueError, TypeError) as e:
        raise ZhnlpError(f"--hardware-file {path} is not a hardware description written by `zhnlp plan "
                         f"--calibrate` ({e}); write it again.") from None
