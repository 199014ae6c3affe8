"""Helpers shared by the fine-tuning tests (unit and distributed): a tiny starting model and a
``zhnlp finetune`` launcher that runs in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

VOCAB = ROOT / "tests" / "assets" / "bert-base-chinese-vocab.txt"


def make_tiny_model(directory: Path) -> Path:
    """Save a randomly initialised ernie-debug masked-LM (4 layers, hidden 64) with the bert-base-chinese
    WordPiece tokenizer: the starting point of every fine-tuning test."""
    import zhnlp
    from zhnlp.tokenizers.wordpiece import WordPieceTokenizer
    from zhnlp.training.config import recipe

    torch.manual_seed(0)
    zhnlp.AutoModelForMaskedLM.from_config(recipe("ernie-debug").model).save_pretrained(directory)
    WordPieceTokenizer.from_vocab(VOCAB).save_pretrained(directory)
    return directory


def finetune_cli(task: str, model: Path, output: Path, *args, nproc: int = 1, expect_rc: int = 0,
                 timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``zhnlp finetune TASK`` in a fresh process (under torchrun when ``nproc`` > 1); fail the test with
    its output when the exit status is not ``expect_rc``."""
    from tests.conftest import free_port

    command = ["-m", "zhnlp", "finetune", task, "--model", str(model), "--output", str(output), *map(str, args)]
    if nproc > 1:
        command = ["-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
                   f"--master-port={free_port()}", *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)
    if proc.returncode != expect_rc:
        pytest.fail(f"zhnlp finetune {task} {' '.join(map(str, args))}: exit {proc.returncode}, expected "
                    f"{expect_rc}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path
