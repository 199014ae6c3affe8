"""Fault handling: a rank killed with SIGKILL mid-training ends the job in bounded time, and
--resume continues from the last complete checkpoint, reproducing the uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import ROOT, free_port
from tests.distributed.conftest import losses, pretrain

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def start_training(corpus, out, log, save_interval: int) -> subprocess.Popen:
    """A 400-step TP=2 pretraining job on 2 processes, saving every ``save_interval`` steps, its
    output into ``log``; the tests kill one of its ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--recipe", "ernie-debug", "--data",
           str(corpus / "data"), "--output", str(out), "--steps", "400", "--seq-length", "32", "--tp", "2",
           "--save-interval", str(save_interval)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})


def test_sigkill_ends_the_job_and_resume_continues(corpus, tmp_path):
    out = tmp_path / "run"
    job = start_training(corpus, out, tmp_path / "job.log", save_interval=2)
    ckpts = out / "checkpoints"
    deadline = time.time() + 240
    while not (ckpts / "step_0000002").exists() and time.time() < deadline and job.poll() is None:
        time.sleep(0.2)
    assert (ckpts / "step_0000002").exists(), "no checkpoint was written:\n" + (tmp_path / "job.log").read_text()[-4000:]
    workers = psutil.Process(job.pid).children(recursive=True)
    assert job.poll() is None and len(workers) >= 2, "the job should still be running (400 steps)"
    os.kill(workers[-1].pid, signal.SIGKILL)  # one rank dies
    start = time.time()
    job.wait(timeout=120)  # the others must not hang
    assert job.returncode != 0 and time.time() - start < 120
    complete = sorted(p.name for p in ckpts.iterdir() if not p.name.endswith(".incomplete"))
    assert complete and complete[-1] >= "step_0000002"
    last = int(complete[-1].split("_")[1])
    resumed = losses(pretrain(corpus / "data", out, 1, "--resume", "--steps", "400", "--stop-at", str(last + 3)))
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1, "--steps", "400", "--stop-at", str(last + 3)))
    for step in range(last + 1, last + 4):
        assert resumed[step] == pytest.approx(full[step], abs=1e-5), step


def test_sigkill_during_a_save_leaves_the_last_complete_checkpoint(corpus, tmp_path):
    """A rank is killed the moment a save begins (its .incomplete directory appears): rank 0 can
    only mark a checkpoint complete after every rank has written its shards, so that save must
    never look complete, and --resume continues from the one before it."""
    out = tmp_path / "run"
    job = start_training(corpus, out, tmp_path / "job.log", save_interval=3)
    ckpts = out / "checkpoints"
    target = ckpts / "step_0000006.incomplete"  # the second save, so that one complete checkpoint exists
    deadline = time.time() + 240
    while not target.exists() and time.time() < deadline and job.poll() is None:
        time.sleep(0.002)
    assert target.exists(), "the second save never started:\n" + (tmp_path / "job.log").read_text()[-4000:]
    ranks = psutil.Process(job.pid).children(recursive=False)  # torchrun's workers, one per rank
    os.kill(ranks[-1].pid, signal.SIGKILL)
    job.wait(timeout=120)
    assert job.returncode != 0
    assert not (ckpts / "step_0000006").exists(), "a save interrupted by a dead rank was marked complete"
    from zhnlp.training.checkpoint import latest

    assert latest(ckpts).name == "step_0000003"
    resumed = losses(pretrain(corpus / "data", out, 1, "--resume", "--steps", "400", "--stop-at", "7",
                              "--save-interval", "3"))
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1, "--steps", "400", "--stop-at", "7"))
    for step in range(4, 8):
        assert resumed[step] == pytest.approx(full[step], abs=1e-5), step
    assert (ckpts / "step_0000006").is_dir() and not target.exists()  # redone, and the debris cleared
