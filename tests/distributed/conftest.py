"""Fixtures and helpers shared by the multi-process tests: a small preprocessed corpus and a
`zhnlp pretrain` launcher."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SENTENCES = ["百度提出了知识增强的语义表示模型。", "北京是中华人民共和国的首都。", "今天天气很好，我们去公园散步吧！",
             "自然语言处理是人工智能的一个重要方向。", "他们在上海交通大学讨论了机器翻译的发展。",
             "这家餐厅的菜味道不错，服务也很周到。", "长江是中国最长的河流。", "我喜欢在周末读书和听音乐。"]


def make_corpus(root: Path, objective: str = "mlm", stride: int = 3, longest: int = 4, count: int = 120) -> Path:
    """``count`` documents of 1..``longest`` of the SENTENCES (document ``i`` starts at ``i * stride``), preprocessed
    with bert-base-chinese's vocabulary for ``objective`` into ``root/data``; returns ``root``."""
    from zhnlp.data.preprocess import preprocess

    (root / "vocab").mkdir()
    shutil.copy(ASSETS / "bert-base-chinese-vocab.txt", root / "vocab" / "vocab.txt")
    docs = ["".join(SENTENCES[(i * stride + k) % len(SENTENCES)] for k in range(1 + i % longest))
            for i in range(count)]
    (root / "corpus.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    preprocess([root / "corpus.txt"], root / "data", str(root / "vocab"), progress=False, objective=objective)
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("train"))


TRAIN_WORKER = Path(__file__).with_name("train_worker.py")


def train_run(corpus: Path, tag: str, nproc: int, *args) -> dict:
    """train_worker.py under torchrun -> its per-step losses, gradient norms and MoE figures (``corpus/TAG.json``)."""
    from tests.conftest import torchrun

    torchrun(TRAIN_WORKER, nproc, corpus / "data", corpus, "--tag", tag, *args)
    return json.loads((corpus / f"{tag}.json").read_text())


def same_training(a: dict, b: dict, what: str, steps: int = 10) -> None:
    """Losses within 1e-5 and gradient norms within 1e-6 (relative) at every step."""
    assert len(a["loss"]) == len(b["loss"]) == steps
    for step, (x, y) in enumerate(zip(a["loss"], b["loss"]), start=1):
        assert abs(x - y) <= 1e-5, f"{what}: step {step} loss {y} vs {x}"
    for step, (x, y) in enumerate(zip(a["grad_norm"], b["grad_norm"]), start=1):
        assert abs(x - y) <= 1e-6 * max(1.0, x), f"{what}: step {step} grad norm {y} vs {x}"


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
