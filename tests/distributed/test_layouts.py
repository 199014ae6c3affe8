"""The runtime under torchrun: layout errors on every rank, and two torchrun agents
(``--nnodes 2`` on loopback) forming one tensor-parallel group."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, free_port, torchrun
from tests.tiny import hf_model

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
WORKER = Path(__file__).with_name("layout_worker.py")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    hf_model("ernie3", "base", num_attention_heads=2, hidden_size=30).save_pretrained(root / "heads2")
    hf = hf_model("ernie3", "base")
    hf.save_pretrained(root / "ok")
    with torch.no_grad():
        ref = hf(torch.arange(1, 25).reshape(2, 12)).last_hidden_state.sum().item()
    (root / "out").mkdir()
    return root, ref


def _check(root: Path, ref: float):
    for rank in range(2):
        r = json.loads((root / "out" / f"rank{rank}.json").read_text())
        assert "world size 2 is not divisible by tp*pp = 4*1 = 4" in r["world"]
        assert r["layout"] == {"tp": 2, "pp": 1, "dp": 1, "world": 2}
        assert abs(r["hidden"] - ref) < 1e-3


def test_layout_errors_on_every_rank_and_fresh_weights_independent_of_layout(checkpoints):
    root, ref = checkpoints
    # 2 heads split 2 ways is fine; 3 heads is not: make that checkpoint here
    hf_model("ernie3", "base", num_attention_heads=3, hidden_size=30).save_pretrained(root / "heads3")
    torchrun(WORKER, 2, root / "heads3", root / "ok", root / "out")
    _check(root, ref)
    for rank in range(2):
        r = json.loads((root / "out" / f"rank{rank}.json").read_text())
        assert "num_attention_heads=3 is not divisible by tp=2" in r["heads"]
    # a fresh model (from_config) written by the TP=2 workers equals one made here at TP=1
    import zhnlp
    from safetensors.torch import load_file

    zhnlp.distributed.init()
    config = json.loads((root / "ok" / "config.json").read_text())
    zhnlp.AutoModelForMaskedLM.from_config(config).save_pretrained(root / "fresh-tp1")
    a = load_file(str(root / "fresh-tp1" / "model.safetensors"))
    b = load_file(str(root / "out" / "fresh-tp2" / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_two_torchrun_agents_on_loopback(checkpoints):
    """What a two-node job does: one agent per node, c10d rendezvous, one process each."""
    root, ref = checkpoints
    for f in (root / "out").glob("*.json"):
        f.unlink()
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={n}", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=zhnlp-test",
         str(WORKER), str(root / "heads2"), str(root / "ok"), str(root / "out")],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in range(2)]
    outputs = [a.communicate(timeout=300)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(o[-3000:] for o in outputs)
    _check(root, ref)
