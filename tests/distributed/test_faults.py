"""Fault handling: a rank killed with SIGKILL mid-training ends the job in bounded time, and
--resume continues from the last complete checkpoint, reproducing the uninterrupted run.
SIGTERM and SIGINT (to the job or to a single rank) stop every rank after the same step with a
complete checkpoint, and --resume continues from it."""

import json
import os
import re
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


# ---------------------------------------------------------------- SIGTERM / SIGINT: stop after the step, save
STOPPED = re.compile(r"zhnlp: stopped by (SIG\w+) at step (\d+); checkpoint (\S+); continue with --resume")


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The uninterrupted single-process run's losses, steps 1..16 of the same 400-step schedule."""
    return losses(pretrain(corpus / "data", tmp_path_factory.mktemp("ref") / "run", 1, "--steps", "400",
                           "--stop-at", "16"))


def wait_for_step(out, step: int, job: subprocess.Popen, log) -> None:
    """Until the logging rank has written ``step`` lines of metrics (the job keeps training)."""
    metrics, deadline = out / "metrics.jsonl", time.time() + 240
    while time.time() < deadline and job.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= step:
            return
        time.sleep(0.1)
    pytest.fail(f"the job never reached step {step}:\n" + log.read_text()[-4000:])


def finish(job: subprocess.Popen) -> None:
    """Wait for a signalled job to end; one that does not end in time fails the test and is killed
    with its workers, so that it cannot outlive the test."""
    try:
        job.wait(timeout=120)
    except subprocess.TimeoutExpired:
        for proc in [*psutil.Process(job.pid).children(recursive=True), psutil.Process(job.pid)]:
            proc.kill()
        pytest.fail("the job did not stop within 120 s of the signal")


def stopped_cleanly(out, log_text: str, signame: str) -> int:
    """The stop line is printed once (by rank 0); its checkpoint is complete and whole (a collective
    save: every rank stopped after that step), nothing .incomplete is left, and the logging rank
    (the last one) logged exactly up to that step. Returns the step."""
    from zhnlp.training.checkpoint import problem

    lines = STOPPED.findall(log_text)
    assert len(lines) == 1, log_text[-4000:]
    name, step, path = lines[0]
    step = int(step)
    assert name == signame and path == str(out / "checkpoints" / f"step_{step:07d}")
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [f"step_{step:07d}"]  # complete, and no .incomplete
    assert problem(ckpts / f"step_{step:07d}") is None
    assert max(losses([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])) == step
    return step


def test_sigterm_to_one_rank_stops_every_rank_after_the_same_step(corpus, tmp_path, reference):
    """Only rank 0 is signalled; rank 1 (the logging rank) learns of it through the per-step
    all-reduce, so both finish the same step, save together and exit 143, which torchrun reports
    as a failed worker (its own exit status is 1)."""
    out, log = tmp_path / "run", tmp_path / "job.log"
    job = start_training(corpus, out, log, save_interval=0)
    wait_for_step(out, 2, job, log)
    workers = psutil.Process(job.pid).children(recursive=False)
    rank0 = next(w for w in workers if w.environ().get("RANK") == "0")
    os.kill(rank0.pid, signal.SIGTERM)
    finish(job)
    text = log.read_text()
    assert job.returncode == 1 and "exitcode: 143" in text, text[-4000:]
    step = stopped_cleanly(out, text, "SIGTERM")
    resumed = losses(pretrain(corpus / "data", out, 2, "--tp", "2", "--resume", "--steps", "400",
                              "--stop-at", str(step + 3)))
    for s in range(step + 1, step + 4):
        assert resumed[s] == pytest.approx(reference[s], abs=1e-5), s


def test_sigterm_to_the_torchrun_job_stops_and_saves(corpus, tmp_path, reference):
    """torchrun forwards SIGTERM to every worker, waits for them and then exits 1 itself."""
    out, log = tmp_path / "run", tmp_path / "job.log"
    job = start_training(corpus, out, log, save_interval=0)
    wait_for_step(out, 2, job, log)
    job.send_signal(signal.SIGTERM)
    finish(job)
    text = log.read_text()
    assert job.returncode == 1, text[-4000:]
    step = stopped_cleanly(out, text, "SIGTERM")
    resumed = losses(pretrain(corpus / "data", out, 1, "--resume", "--steps", "400", "--stop-at", str(step + 3)))
    for s in range(step + 1, step + 4):
        assert resumed[s] == pytest.approx(reference[s], abs=1e-5), s


def test_sigint_to_a_single_process_run_exits_130_with_a_checkpoint(corpus, tmp_path):
    out, log = tmp_path / "run", tmp_path / "job.log"
    cmd = [sys.executable, "-m", "zhnlp", "pretrain", "--recipe", "ernie-debug", "--data", str(corpus / "data"),
           "--output", str(out), "--steps", "400", "--seq-length", "32"]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    wait_for_step(out, 2, job, log)
    job.send_signal(signal.SIGINT)
    finish(job)
    text = log.read_text()
    assert job.returncode == 130, text[-4000:]
    assert "zhnlp: SIGINT received; stopping after the current step" in text and "Traceback" not in text
    stopped_cleanly(out, text, "SIGINT")
