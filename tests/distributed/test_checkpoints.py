"""Distributed checkpoints: stop and --resume reproduces the uninterrupted run exactly (fp32),
a checkpoint saved at TP=2 resumes at TP=1, and an unfinished save is never taken for complete."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from tests.distributed.test_training_layouts import corpus  # noqa: F401  (shared fixture)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def pretrain(data: Path, out: Path, nproc: int, *args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--recipe", "ernie-debug", "--data", str(data),
           "--output", str(out), "--steps", "6", "--seq-length", "32", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def losses(metrics: list[dict]) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics}  # a resumed run appends: later lines win


def test_resume_reproduces_the_uninterrupted_run(corpus, tmp_path):  # noqa: F811
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1))
    pretrain(corpus / "data", tmp_path / "cut", 1, "--save-interval", "3", "--stop-at", "3")
    assert [p.name for p in sorted((tmp_path / "cut" / "checkpoints").iterdir())] == ["step_0000003"]
    resumed = losses(pretrain(corpus / "data", tmp_path / "cut", 1, "--resume"))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


@pytest.mark.xfail(strict=True, reason="known limit: megatron 0.16's dp-zero state has no Adam step count, "
                                        "so bias correction restarts after a resume with the distributed optimizer")
def test_distributed_optimizer_state_resumes_in_the_same_layout(corpus, tmp_path):  # noqa: F811
    full = losses(pretrain(corpus / "data", tmp_path / "full", 2, "--distributed-optimizer"))
    pretrain(corpus / "data", tmp_path / "cut", 2, "--distributed-optimizer", "--save-interval", "3", "--stop-at", "3")
    resumed = losses(pretrain(corpus / "data", tmp_path / "cut", 2, "--distributed-optimizer", "--resume"))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


def test_tp2_checkpoint_resumes_at_tp1(corpus, tmp_path):  # noqa: F811
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1))
    pretrain(corpus / "data", tmp_path / "re", 2, "--tp", "2", "--save-interval", "3", "--stop-at", "3")
    resumed = losses(pretrain(corpus / "data", tmp_path / "re", 1, "--resume"))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(full[step], abs=1e-5), step


def test_an_unfinished_save_is_not_resumed(corpus, tmp_path):  # noqa: F811
    from zhnlp.training.checkpoint import latest

    pretrain(corpus / "data", tmp_path / "run", 1, "--save-interval", "2", "--stop-at", "2")
    ckpts = tmp_path / "run" / "checkpoints"
    crashed = ckpts / "step_0000004.incomplete"
    (crashed / "model").mkdir(parents=True)  # what a crash during the next save leaves
    assert latest(ckpts).name == "step_0000002"
    resumed = losses(pretrain(corpus / "data", tmp_path / "run", 1, "--resume", "--save-interval", "2"))
    assert max(resumed) == 6 and not crashed.exists()
    assert [p.name for p in sorted(ckpts.iterdir())] == ["step_0000002", "step_0000004", "step_0000006"]


def test_export_gives_a_transformers_model_with_its_tokenizer(corpus, tmp_path):  # noqa: F811
    import torch
    import transformers

    import zhnlp
    from zhnlp.training.export import export

    pretrain(corpus / "data", tmp_path / "run", 2, "--tp", "2", "--save-interval", "6")
    out = export(tmp_path / "run", tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    enc = tok(["北京是中华人民共和国的首都。"], return_tensors="pt")
    with torch.no_grad():
        ref = hf(**enc).logits
    ours = zhnlp.AutoModelForMaskedLM.from_pretrained(out)(**enc).logits
    torch.testing.assert_close(ours.cpu(), ref, rtol=0, atol=1e-5)
    assert type(hf).__name__ == "ErnieForMaskedLM"
