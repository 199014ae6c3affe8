"""An elastic job (scripts/pretrain.sh --nnodes 1:2, c10d rendezvous, --max-restarts) loses one of its two nodes:
the node left restarts its workers, resumes from the last complete checkpoint in the smaller layout (DP=2 -> DP=1,
the distributed optimizer's state included) and finishes; every step's loss is the uninterrupted one-process run's.
Two agents on loopback stand for the nodes; one is killed with its workers (SIGKILL)."""

import contextlib
import json
import os
import socket
import subprocess
import time

import psutil
import pytest

from tests.conftest import ROOT, free_port
from tests.distributed.conftest import losses, pretrain

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

STOP = 14
TRAIN = ["--recipe", "ernie-debug", "--steps", "400", "--stop-at", str(STOP), "--seq-length", "32",
         "--distributed-optimizer"]


def kill(agent: subprocess.Popen) -> None:
    """SIGKILL to a torchrun agent and its workers (torchrun starts each worker in a session of its own)."""
    try:
        procs = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    agent.wait(timeout=30)


def test_losing_a_node_continues_on_the_one_left(corpus, tmp_path):
    out, port = tmp_path / "run", free_port()

    def agent(n: int) -> subprocess.Popen:
        cmd = ["bash", str(ROOT / "scripts" / "pretrain.sh"), "--nproc-per-node", "1", "--nnodes", "1:2",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test", "--max-restarts", "2",
               "--rdzv-conf", "last_call_timeout=15", "--", *TRAIN, "--data", str(corpus / "data"),
               "--output", str(out), "--save-interval", "2", "--resume"]
        return subprocess.Popen(cmd, cwd=ROOT, stdout=open(tmp_path / f"agent{n}.log", "w"), stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})

    first = agent(0)  # it hosts the rendezvous store (the first to listen on the port), and stays
    deadline = time.time() + 60
    while time.time() < deadline and first.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    second = agent(1)  # it joins the first rendezvous round within last_call_timeout of the first agent
    try:
        metrics, deadline = out / "metrics.jsonl", time.time() + 240
        while time.time() < deadline and first.poll() is None:
            if (out / "checkpoints" / "step_0000004").is_dir():
                break
            time.sleep(0.05)
        assert (out / "checkpoints" / "step_0000004").is_dir(), (tmp_path / "agent0.log").read_text()[-4000:]
        kill(second)  # a node is lost
        first.wait(timeout=300)
    finally:
        for job in (first, second):
            kill(job)
    log = (tmp_path / "agent0.log").read_text()
    assert first.returncode == 0, log[-4000:]
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    two = [m["step"] for m in records if "slowest_rank" in m]  # world size 2: every rank's step time gathered
    one = [m["step"] for m in records if "slowest_rank" not in m]
    assert two and one and min(one) > 4 and min(two) == 1 and max(one) == STOP, (two, one)  # resumed on one node, to the end
    assert "resumed from" in log
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1, *TRAIN))
    got = losses(records)
    for step in range(1, STOP + 1):
        assert got[step] == pytest.approx(full[step], abs=1e-5), (step, got, full)
