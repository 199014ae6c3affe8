"""Shared fixtures: tiny random transformers checkpoints and a torchrun launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(2)

from zhnlp.distributed import free_port  # noqa: E402  (after the environment above; tests import it from here)

ROOT = Path(__file__).resolve().parent.parent


def torchrun(script: Path, nproc: int, *args: str, timeout: int = 600, nnodes: int = 1) -> subprocess.CompletedProcess:
    """Run ``script`` under torchrun with ``nproc`` CPU processes; fail the test with its output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if proc.returncode != 0:
        pytest.fail(f"torchrun {script.name} {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


@pytest.fixture(autouse=True)
def no_profiler_left_running():
    """A trainer measures peak memory with torch's profiler, one per process: a test that leaves it running
    (a run that failed between the trainer's construction and its end) takes it from every later test."""
    yield
    if torch._C._autograd._profiler_enabled():
        from torch.autograd.profiler import _disable_profiler

        _disable_profiler()
        pytest.fail("this test left torch's profiler running (a Trainer's peak-memory measurement not stopped)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
