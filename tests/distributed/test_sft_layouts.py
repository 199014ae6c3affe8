"""``zhnlp finetune sft`` under torchrun: the same conversations and starting model give the same per-step losses
(OUTPUT/metrics.jsonl, within 1e-5), the same dev loss and the same saved model on one process as under pipeline
parallelism (PP=2, padded batches), tensor parallelism (TP=2, packed sequences) and, for a mixture-of-experts
model, expert parallelism (EP=2)."""

from __future__ import annotations

import pytest

from tests.chat_data import chat_model, conversations, write_jsonl
from tests.finetuning import finetune_cli, read_json, read_jsonl

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
COMMON = ["--epochs", 1, "--batch-size", 8, "--max-length", 128, "--lr", 2e-3, "--log-interval", 1,
          "--eval-batch-size", 8, "--max-steps", 6]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-layouts")
    return {"dense": chat_model(root / "dense"), "moe": chat_model(root / "moe", kind="moe"),
            "data": ["--train", write_jsonl(root / "train.jsonl", conversations(64)),
                     "--dev", write_jsonl(root / "dev.jsonl", conversations(16, offset=3000))]}


def _run(setup, out, kind: str, nproc: int, *args):
    finetune_cli("sft", setup[kind], out, *setup["data"], *COMMON, *args, nproc=nproc)
    from safetensors.torch import load_file

    weights = {}
    for shard in sorted((out / "model").glob("*.safetensors")):
        weights.update(load_file(shard))
    return read_jsonl(out / "metrics.jsonl"), read_json(out / "metrics.json"), weights


@pytest.mark.parametrize("kind,layout", [
    ("dense", ["--pp", "2"]),
    ("dense", ["--tp", "2", "--packing"]),
    ("moe", ["--ep", "2"]),
])
def test_layout_gives_the_single_process_run(setup, tmp_path, kind, layout):
    extra = [a for a in layout if a == "--packing"]
    steps_1, metrics_1, weights_1 = _run(setup, tmp_path / "one", kind, 1, *extra)
    steps_n, metrics_n, weights_n = _run(setup, tmp_path / "two", kind, 2, *layout)
    assert [m["step"] for m in steps_n] == [m["step"] for m in steps_1] == list(range(1, 7))
    assert steps_1[-1]["loss"] < steps_1[0]["loss"], "the reference run did not learn"
    for a, b in zip(steps_1, steps_n):
        assert abs(a["loss"] - b["loss"]) <= 1e-5, f"{layout}: step {a['step']} loss {b['loss']} vs {a['loss']}"
    assert metrics_n["dev"]["loss"] == pytest.approx(metrics_1["dev"]["loss"], abs=1e-5)
    assert metrics_n["dev"]["tokens"] == metrics_1["dev"]["tokens"] > 0
    assert metrics_n["train_sequences"] == metrics_1["train_sequences"]
    assert sorted(weights_n) == sorted(weights_1)
    for name, value in weights_1.items():
        assert (weights_n[name] - value).abs().max() <= 1e-4, name
