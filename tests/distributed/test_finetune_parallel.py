"""``zhnlp finetune`` under torchrun: from the same tiny starting model and the same real data, 10 steps of
fine-tuning (fp32, no dropout) give the same per-step losses (OUTPUT/metrics.jsonl, within 1e-5; measured
within 6e-8) on one process, under tensor parallelism (TP=2), data parallelism (DP=2) and pipeline
parallelism (PP=2), and export the same weights (transformers format, gathered from the shards) with the same
dev predictions.
Classification on sentiment-reviews and NER on msra-ner, small subsets; masked-LM fine-tuning (mlm) on the same
reviews at TP=2 (the vocabulary-parallel loss over the masked tokens, each epoch's masking the same on every rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.finetuning import finetune_cli, make_tiny_model, read_json, read_jsonl, write_jsonl

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
STEPS = 10
COMMON = ["--epochs", 1, "--max-steps", STEPS, "--max-length", 64, "--lr", 1e-3, "--dropout", 0,
          "--log-interval", 1, "--eval-batch-size", 32]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-ernie"))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, list]:
    """Arguments per task: 320 sentiment reviews (batch 32) and 160 msra-ner sentences (batch 16), each with a
    small dev file, so that 10 steps are one epoch."""
    from zhnlp.data.fetch import fetch

    root = tmp_path_factory.mktemp("data")
    sentiment, msra = fetch("sentiment-reviews"), fetch("msra-ner")
    cls_dev = write_jsonl(root / "cls-dev.jsonl", read_jsonl(sentiment / "dev.jsonl")[:96])
    ner_train = write_jsonl(root / "ner-train.jsonl", read_jsonl(msra / "train.jsonl")[:160])
    ner_dev = write_jsonl(root / "ner-dev.jsonl", read_jsonl(msra / "dev.jsonl")[:64])
    return {"classification": ["--train", sentiment / "train.jsonl", "--max-train-examples", 320, "--dev", cls_dev,
                               "--batch-size", 32],
            "ner": ["--train", ner_train, "--dev", ner_dev, "--batch-size", 16],
            "mlm": ["--train", sentiment / "train.jsonl", "--max-train-examples", 320, "--dev", cls_dev,
                    "--batch-size", 32]}


def run(tiny: Path, tasks: dict, out: Path, task: str, nproc: int, *layout) -> dict:
    finetune_cli(task, tiny, out, *tasks[task], *COMMON, *layout, nproc=nproc)
    from safetensors.torch import load_file

    weights = {}
    for shard in sorted((out / "model").glob("*.safetensors")):  # one file, or one per pipeline stage
        weights.update(load_file(shard))
    predictions = out / "dev_predictions.json"  # mlm writes none: its dev score is the masked-token loss
    return {"steps": read_jsonl(out / "metrics.jsonl"), "metrics": read_json(out / "metrics.json"),
            "dev_predictions": read_json(predictions) if predictions.exists() else None, "weights": weights}


@pytest.fixture(scope="module")
def single(tiny, tasks, tmp_path_factory) -> dict:
    """The one-process reference runs, per task."""
    return {task: run(tiny, tasks, tmp_path_factory.mktemp(f"{task}-single"), task, 1) for task in tasks}


def same_training(reference: dict, other: dict, what: str) -> None:
    """Losses within 1e-5 and gradient norms within 1e-6 (relative) at every step; the same epoch loss in
    metrics.json (written by rank 0, which under PP is not the stage that computes the loss)."""
    a, b = reference["steps"], other["steps"]
    assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, STEPS + 1))
    assert a[-1]["loss"] < a[0]["loss"], "the reference run did not learn"
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) <= 1e-5, f"{what}: step {x['step']} loss {y['loss']} vs {x['loss']}"
        assert x["lr"] == pytest.approx(y["lr"], rel=1e-12)
    for x, y in zip(a, b):
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-6 * max(1.0, x["grad_norm"]), \
            f"{what}: step {x['step']} grad norm {y['grad_norm']} vs {x['grad_norm']}"
    ma, mb = reference["metrics"], other["metrics"]
    for ea, eb in zip(ma["epochs"], mb["epochs"]):
        assert eb["train_loss"] == pytest.approx(ea["train_loss"], abs=1e-5), f"{what}: epoch {ea['epoch']} loss"
    assert (mb["steps"], mb["train_features"], mb["labels"]) == (ma["steps"], ma["train_features"], ma["labels"])
    # the exported best model (gathered from the tensor-parallel shards): same tensors, same values (measured
    # within 3e-6 after 10 steps)
    wa, wb = reference["weights"], other["weights"]
    assert {k: tuple(v.shape) for k, v in wb.items()} == {k: tuple(v.shape) for k, v in wa.items()}
    for name in wa:
        difference = (wa[name] - wb[name]).abs().max().item()
        assert difference <= 1e-4, f"{what}: exported {name} differs by {difference}"
    assert other["dev_predictions"] == reference["dev_predictions"], f"{what}: the exported model predicts otherwise"
    metric = ma["metric"]
    # a loss (mlm) is summed in another order under TP: equal to rounding, not bit for bit
    assert mb["dev"][metric] == pytest.approx(ma["dev"][metric], abs=1e-6 if metric == "loss" else 1e-9)


@pytest.mark.parametrize("task,name,nproc,layout", [
    ("classification", "tp2", 2, ["--tp", 2]),
    ("classification", "dp2", 2, ["--tp", 1]),
    ("classification", "pp2", 2, ["--pp", 2]),
    ("ner", "tp2", 2, ["--tp", 2]),
    ("mlm", "tp2", 2, ["--tp", 2]),
])
def test_parallel_fine_tuning_matches_one_process(tiny, tasks, single, tmp_path, task, name, nproc, layout):
    other = run(tiny, tasks, tmp_path / name, task, nproc, *layout)
    same_training(single[task], other, f"{task} {name}")
    config = json.loads((tmp_path / name / "model" / "config.json").read_text(encoding="utf-8"))
    assert config["vocab_size"] == 21128  # exported unpadded, whatever the tensor-parallel padding


def test_resume_at_dp2_continues_with_the_losses_of_an_uninterrupted_run(tiny, tmp_path):
    """Through the Python API under torchrun (2 processes, data parallel): a run cut after step 7 resumes
    from its step-4 checkpoint (mid-epoch) and logs the losses of the uninterrupted run, within 1e-6."""
    from zhnlp.data.fetch import fetch

    from tests.conftest import torchrun

    reviews = fetch("sentiment-reviews")
    train = write_jsonl(tmp_path / "train.jsonl", read_jsonl(reviews / "train.jsonl")[:96])
    dev = write_jsonl(tmp_path / "dev.jsonl", read_jsonl(reviews / "dev.jsonl")[:32])
    worker = Path(__file__).with_name("finetune_resume_worker.py")
    for out, mode in ((tmp_path / "whole", "whole"), (tmp_path / "cut", "cut"), (tmp_path / "cut", "resume")):
        torchrun(worker, 2, tiny, train, dev, out, mode)

    def steps(out):
        latest = {m["step"]: m for m in read_jsonl(out / "metrics.jsonl")}  # a resumed run appends
        return [latest[k] for k in sorted(latest)]

    whole, resumed = steps(tmp_path / "whole"), steps(tmp_path / "cut")
    assert [m["step"] for m in resumed] == [m["step"] for m in whole] == list(range(1, 13))
    for a, b in zip(whole, resumed):
        assert abs(a["loss"] - b["loss"]) <= 1e-6, (a["step"], a["loss"], b["loss"])
    ma, mb = read_json(tmp_path / "whole" / "metrics.json"), read_json(tmp_path / "cut" / "metrics.json")
    assert [e["step"] for e in mb["epochs"]] == [6, 12] and mb["status"] == "complete"
    for ea, eb in zip(ma["epochs"], mb["epochs"]):
        assert eb["train_loss"] == pytest.approx(ea["train_loss"], abs=1e-6) and eb["dev"] == ea["dev"]
