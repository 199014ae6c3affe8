"""``--async-save``: checkpoints written in the background while training goes on. The run's losses are those of a
synchronous run, the checkpoint of step N holds step N's state although training went past N during the write
(the writer's snapshot is a copy), --resume from it reproduces the uninterrupted run, with the plain optimizer at
one process and with the distributed optimizer at DP=2; a run killed during a background write leaves only
``step_N.incomplete``, and --resume takes the checkpoint before it.

The background writes are slowed down with the test-only ZHNLP_TEST_ASYNC_WRITE_DELAY, so that training certainly
runs (or the kill happens) while a write is in flight."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import ROOT, free_port
from tests.distributed.conftest import losses, pretrain

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DELAY = "ZHNLP_TEST_ASYNC_WRITE_DELAY"


def tensors(checkpoint) -> dict:
    """Every tensor of a checkpoint's model/ (model and optimizer state), read without processes."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = checkpoint.parent / f"{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint / "model", out)
    return {k: v for k, v in torch.load(out, weights_only=False).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("nproc,flags", [(1, []), (2, ["--distributed-optimizer"])], ids=["dp1", "dp2-distopt"])
def test_async_save_matches_sync_and_resumes_exactly(corpus, tmp_path, monkeypatch, nproc, flags):
    import torch

    every3 = ["--save-interval", "3", *flags]
    sync = pretrain(corpus / "data", tmp_path / "sync", nproc, *every3)
    monkeypatch.setenv(DELAY, "2")  # each write starts 2 s late: steps 4, 5 (and 6) train during step 3's write
    background = pretrain(corpus / "data", tmp_path / "async", nproc, *every3, "--async-save")
    monkeypatch.delenv(DELAY)
    assert losses(background) == losses(sync)
    stall = {m["step"]: m["checkpoint_s"] for m in background}
    assert stall[3] < 1.5, f"the step-3 save blocked training for {stall[3]:.2f} s: it did not run in the background"
    assert stall[6] >= 1.0, "the step-6 save must have waited for step 3's delayed write to complete"
    ckpts = tmp_path / "async" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_0000003", "step_0000006"]
    from zhnlp.training.checkpoint import problem

    for step in ("step_0000003", "step_0000006"):
        assert problem(ckpts / step) is None
        want, got = tensors(tmp_path / "sync" / "checkpoints" / step), tensors(ckpts / step)
        assert sorted(got) == sorted(want) and any(k.startswith("optimizer.") for k in got)
        for key in want:  # step 3's write ran after steps 4-5 changed the weights: a copy keeps step 3's
            assert torch.equal(got[key], want[key]), f"{step} {key} differs from the synchronous checkpoint"
    (tmp_path / "cut" / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpts / "step_0000003", tmp_path / "cut" / "checkpoints" / "step_0000003")
    resumed = losses(pretrain(corpus / "data", tmp_path / "cut", nproc, *flags, "--resume"))
    assert sorted(resumed) == [4, 5, 6]
    for step in resumed:
        assert resumed[step] == losses(sync)[step], step


def test_sigkill_during_a_background_write_leaves_it_incomplete(corpus, tmp_path):
    """The rank is killed while step 6's write is in flight and training has gone on past it: only
    ``step_0000006.incomplete`` is there, and --resume continues from step 3 exactly."""
    out, log = tmp_path / "run", tmp_path / "job.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--recipe", "ernie-debug", "--data",
           str(corpus / "data"), "--output", str(out), "--steps", "400", "--seq-length", "32",
           "--save-interval", "3", "--async-save"]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", DELAY: "4"})
    ckpts, metrics = out / "checkpoints", out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and job.poll() is None:  # step 3 completed (by the step-6 save), step 8 trained
        if (ckpts / "step_0000003").exists() and metrics.is_file() and len(metrics.read_text().splitlines()) >= 8:
            break
        time.sleep(0.02)
    try:
        assert job.poll() is None and (ckpts / "step_0000003").exists(), log.read_text()[-4000:]
        assert (ckpts / "step_0000006.incomplete").is_dir() and not (ckpts / "step_0000006").exists()
        rank = psutil.Process(job.pid).children()[0]
        leftovers = rank.children(recursive=True)  # its background writer (and megatron's results queue)
        os.kill(rank.pid, signal.SIGKILL)
        job.wait(timeout=60)
        assert job.returncode != 0
    finally:
        for proc in psutil.Process(job.pid).children(recursive=True) if job.poll() is None else []:
            proc.kill()
        job.kill()
    for proc in leftovers:  # an orphaned writer may still finish its files; it can never rename them
        if proc.is_running():
            proc.kill()
    from zhnlp.training.checkpoint import latest

    assert sorted(p.name for p in ckpts.iterdir()) == ["step_0000003", "step_0000006.incomplete"]
    assert latest(ckpts).name == "step_0000003"
    steps = ["--steps", "400", "--stop-at", "7"]
    resumed = losses(pretrain(corpus / "data", out, 1, *steps, "--resume", "--save-interval", "3", "--async-save"))
    # (metrics.jsonl has the killed run's steps too: the resumed run's lines, appended, win)
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1, *steps))
    for step in range(4, 8):
        assert resumed[step] == full[step], step
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_0000003", "step_0000006"]  # redone, debris cleared
    assert json.loads((ckpts / "step_0000006" / "trainer.json").read_text())["step"] == 6
