"""The Python fine-tuning API, run in this process: ``zhnlp.finetune(...)`` from a tiny random ERNIE on real
sentiment reviews. Datasets, DatasetDicts, saved datasets and lists of dicts train exactly as the jsonl file
does; compute_metrics sees the logits and labels (its accuracy equals the task's); evaluation every
eval_steps; callbacks' hooks in order; early stopping at the step its rule gives; checkpoints every
save_steps and resume with the losses of an uninterrupted run; the config's fields carry their help."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.finetuning import make_tiny_model, read_json, read_jsonl, write_jsonl
from zhnlp.errors import DataError

datasets = pytest.importorskip("datasets")

# 96 reviews in batches of 16: 6 steps an epoch; no dropout, so every run from the same data is the same run
COMMON = dict(task="classification", batch_size=16, max_length=32, lr=1e-3, dropout=0.0, warmup_ratio=0.0,
              log_interval=1, eval_batch_size=16)


@pytest.fixture(scope="module", autouse=True)
def _process_groups():
    yield
    from zhnlp import distributed

    distributed.shutdown()  # megatron's groups are process-global: leave none behind for other modules


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-ernie"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    from zhnlp.data.fetch import fetch

    root = tmp_path_factory.mktemp("data")
    reviews = fetch("sentiment-reviews")
    train, dev = read_jsonl(reviews / "train.jsonl")[:96], read_jsonl(reviews / "dev.jsonl")[:32]
    return {"train_rows": train, "dev_rows": dev, "train": write_jsonl(root / "train.jsonl", train),
            "dev": write_jsonl(root / "dev.jsonl", dev), "root": root}


def run(tiny, out: Path, **kwargs) -> dict:
    import zhnlp

    result = zhnlp.finetune(model=str(tiny), output=str(out), **{**COMMON, **kwargs})
    steps = {}
    for m in read_jsonl(out / "metrics.jsonl"):  # a resumed run appends: the latest record of a step counts
        steps[m["step"]] = m
    return {"result": result, "metrics": read_json(out / "metrics.json"), "steps": [steps[k] for k in sorted(steps)]}


def losses(r: dict) -> list[float]:
    return [m["loss"] for m in r["steps"]]


# ------------------------------------------------------------------------------------------ data sources
def test_datasets_dataset_dicts_saved_datasets_and_lists_train_as_the_jsonl_file_does(tiny, data, tmp_path):
    reference = run(tiny, tmp_path / "jsonl", train=data["train"], dev=data["dev"], max_steps=3)
    assert len(reference["steps"]) == 3 and reference["metrics"]["dev"]["total"] == 32
    train_ds = datasets.Dataset.from_list(data["train_rows"])
    dev_ds = datasets.Dataset.from_list(data["dev_rows"])
    whole = datasets.DatasetDict({"train": train_ds, "validation": dev_ds})
    whole.save_to_disk(tmp_path / "saved")
    others = {
        "Dataset": dict(train=train_ds, dev=dev_ds),
        "DatasetDict": dict(train=whole),  # its validation split is the dev set
        "save_to_disk": dict(train=str(tmp_path / "saved")),
        "list of dicts": dict(train=data["train_rows"], dev=data["dev_rows"]),
    }
    for name, sources in others.items():
        other = run(tiny, tmp_path / name.replace(" ", "-"), max_steps=3, **sources)
        assert losses(other) == losses(reference), name
        assert other["metrics"]["dev"] == reference["metrics"]["dev"], name
        assert other["metrics"]["train_examples"] == 96
    assert other["metrics"]["data"] == {"train": "list of 96 rows", "dev": "list of 32 rows", "test": None}


def test_a_dataset_with_the_wrong_columns_is_refused_naming_them(tiny, tmp_path):
    import zhnlp

    bad = datasets.Dataset.from_list([{"review": "好", "stars": 5}] * 4)
    with pytest.raises(DataError, match=r"--train data lacks the column\(s\) text or text_a .*found review, stars"):
        zhnlp.finetune(model=str(tiny), output=str(tmp_path / "o"), train=bad, dev=bad, **COMMON)
    assert not (tmp_path / "o" / "metrics.json").exists()


# ------------------------------------------------------------------------------------------ evaluation
class Recorder:
    """Every hook call, in order (a callback need not subclass Callback)."""

    def __init__(self):
        self.events = []

    def on_train_begin(self, config, state, control, **kw):
        self.events.append(("begin", state.global_step))

    def on_step_end(self, config, state, control, logs=None, **kw):
        assert logs["step"] == state.global_step
        self.events.append(("step", state.global_step))

    def on_evaluate(self, config, state, control, metrics=None, **kw):
        self.events.append(("evaluate", state.global_step, metrics["accuracy"]))

    def on_save(self, config, state, control, checkpoint=None, **kw):
        self.events.append(("save", state.global_step, Path(checkpoint).name))

    def on_train_end(self, config, state, control, **kw):
        self.events.append(("end", state.global_step))


def accuracy_from_logits(p) -> dict:
    assert p.predictions.shape == (len(p.label_ids), 2)
    return {"logit_accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean()), "seen": len(p.label_ids)}


def test_compute_metrics_eval_steps_and_callback_hooks(tiny, data, tmp_path, caplog, capsys):
    import logging

    caplog.set_level(logging.INFO, logger="zhnlp")
    recorder = Recorder()
    r = run(tiny, tmp_path / "run", train=data["train"], dev=data["dev"], test=data["dev"], epochs=2, eval_steps=4,
            compute_metrics=accuracy_from_logits, callbacks=[recorder])
    metrics = r["metrics"]
    assert [(e["epoch"], e["step"]) for e in metrics["epochs"]] == [(1, 4), (2, 8), (2, 12)]  # every 4, and the end
    for e in metrics["epochs"]:  # compute_metrics saw the dev logits and labels: its accuracy is the task's
        assert e["dev"]["seen"] == 32 and e["dev"]["logit_accuracy"] == pytest.approx(e["dev"]["accuracy"])
    assert metrics["test"]["logit_accuracy"] == pytest.approx(metrics["test"]["accuracy"])
    assert metrics["epochs"][0]["train_loss"] == pytest.approx(np.mean(losses(r)[:4]), rel=1e-9)
    assert metrics["status"] == "complete" and metrics["steps"] == 12
    events = recorder.events
    assert events[0] == ("begin", 0) and events[-1] == ("end", 12)
    assert [e[1] for e in events if e[0] == "step"] == list(range(1, 13))
    evaluations = [(e[1], e[2]) for e in events if e[0] == "evaluate"]
    assert evaluations == [(e["step"], e["dev"]["accuracy"]) for e in metrics["epochs"]]
    assert events.index(("evaluate", 4, evaluations[0][1])) == events.index(("step", 4)) + 1
    # progress: one bar over both epochs (its ETA covers the run), evaluation batches and result lines logged
    progress = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert progress == [f"{k}/12" for k in range(1, 13)]
    logged = [rec.getMessage() for rec in caplog.records if rec.name == "zhnlp"]
    assert sum(m.startswith("evaluating dev: batch 2/2 (32 features") for m in logged) == 3
    assert any(m.startswith("evaluating test: batch 2/2") for m in logged)
    assert any(m.startswith("epoch 1 step 4/12: train loss ") and "dev accuracy" in m for m in logged)


def test_early_stopping_stops_at_the_step_its_rule_gives(tiny, data, tmp_path):
    """A metric that never improves after the first evaluation: with patience 2 and evaluations every 2
    steps the run ends after the evaluation at step 6, keeping the model of step 2."""
    r = run(tiny, tmp_path / "run", train=data["train"], dev=data["dev"], epochs=3, eval_steps=2,
            compute_metrics=lambda p: {"constant": 1.0}, metric_for_best_model="eval_constant",
            early_stopping_patience=2)
    metrics = r["metrics"]
    assert [e["step"] for e in metrics["epochs"]] == [2, 4, 6]
    assert [m["step"] for m in r["steps"]] == [1, 2, 3, 4, 5, 6]
    assert (metrics["best_step"], metrics["stopped_early_at_step"], metrics["status"]) == (2, 6, "complete")
    assert metrics["metric_for_best_model"] == "constant"


def test_early_stopping_on_a_real_metric_follows_patience_and_threshold(tiny, data, tmp_path):
    """On the task's accuracy, lower is better here (greater_is_better=False) so that learning counts as
    getting worse: the stop step is where the rule, replayed on the logged evaluations, says."""
    r = run(tiny, tmp_path / "run", train=data["train"], dev=data["dev"], epochs=4, eval_steps=2,
            metric_for_best_model="accuracy", greater_is_better=False, early_stopping_patience=2,
            early_stopping_threshold=0.01)
    scores = [(e["step"], e["dev"]["accuracy"]) for e in r["metrics"]["epochs"]]
    best, counter, expected_stop = None, 0, None
    for step, value in scores:
        if best is None or best - value > 0.01:
            best, counter = value, 0
        else:
            counter += 1
            if counter >= 2:
                expected_stop = step
                break
    assert r["steps"][-1]["step"] == (expected_stop or 24)
    assert r["metrics"].get("stopped_early_at_step") == expected_stop
    chosen = min(v for _, v in scores)  # the best model: the lowest accuracy, its first occurrence
    assert r["metrics"]["dev"]["accuracy"] == chosen
    assert r["metrics"]["best_step"] == next(s for s, v in scores if v == chosen)


# ------------------------------------------------------------------------------------------ checkpoints
class StopAt:
    def __init__(self, step):
        self.step = step

    def on_step_end(self, config, state, control, **kw):
        if state.global_step == self.step:
            control.should_stop = True


def test_resume_continues_with_the_losses_of_an_uninterrupted_run(tiny, data, tmp_path):
    from safetensors.torch import load_file

    settings = dict(train=data["train"], dev=data["dev"], epochs=2, save_steps=4, save_total_limit=2)
    recorder = Recorder()
    whole = run(tiny, tmp_path / "whole", callbacks=[recorder], **settings)
    assert [e[1:] for e in recorder.events if e[0] == "save"] == [(4, "step_0000004"), (8, "step_0000008"),
                                                                  (12, "step_0000012")]
    kept = sorted(p.name for p in (tmp_path / "whole" / "checkpoints").iterdir())
    assert kept == ["step_0000008", "step_0000012"]  # save_total_limit
    # a run that ends at step 7: its newest checkpoint is step 4, in the middle of the first epoch
    cut = run(tiny, tmp_path / "cut", callbacks=[StopAt(7)], **settings)
    assert cut["steps"][-1]["step"] == 7
    resumed = run(tiny, tmp_path / "cut", resume=True, **settings)
    assert [m["step"] for m in resumed["steps"]] == list(range(1, 13))
    for a, b in zip(whole["steps"], resumed["steps"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-6, (a["step"], a["loss"], b["loss"])
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)
    ma, mb = whole["metrics"], resumed["metrics"]
    assert [(e["epoch"], e["step"]) for e in mb["epochs"]] == [(1, 6), (2, 12)]
    for ea, eb in zip(ma["epochs"], mb["epochs"]):  # the epoch mean includes the steps before the checkpoint
        assert eb["train_loss"] == pytest.approx(ea["train_loss"], abs=1e-6)
        assert eb["dev"] == ea["dev"]
    assert (mb["best_epoch"], mb["status"]) == (ma["best_epoch"], "complete")
    wa, wb = load_file(tmp_path / "whole" / "model" / "model.safetensors"), \
        load_file(tmp_path / "cut" / "model" / "model.safetensors")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6
    # resuming with another schedule is refused, naming what changed
    from zhnlp.errors import ZhnlpError

    with pytest.raises(ZhnlpError, match=r"cannot resume .*differs \(steps 12 -> 18\)"):
        run(tiny, tmp_path / "cut", resume=True, **{**settings, "epochs": 3})


# ------------------------------------------------------------------------------------------ the config
def test_every_config_field_has_a_default_and_one_line_help():
    from zhnlp.training.finetune_config import FinetuneConfig

    for f in dataclasses.fields(FinetuneConfig):
        assert f.default is not dataclasses.MISSING, f.name
        help_text = f.metadata.get("help")
        assert isinstance(help_text, str) and help_text and "\n" not in help_text, f.name
    choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(FinetuneConfig)}
    assert choices["precision"] == ("fp32", "bf16", "fp16") and "token-classification" in choices["task"]
    import zhnlp.training.finetune as ft

    assert ft.FinetuneConfig is FinetuneConfig


def test_the_config_module_imports_no_torch():
    code = ("import sys; import zhnlp.training.finetune_config, zhnlp.training.callbacks; "
            "heavy = [m for m in ('torch', 'transformers', 'datasets', 'megatron') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("fields,message", [
    ({"eval_steps": 0}, "eval_steps must be an integer >= 1, got 0"),
    ({"save_steps": -1}, "save_steps must be an integer >= 0, got -1"),
    ({"save_total_limit": 1.5}, "save_total_limit must be an integer >= 0, got 1.5"),
    ({"early_stopping_patience": 0}, "early_stopping_patience must be an integer >= 1, got 0"),
    ({"early_stopping_threshold": -0.1}, "early_stopping_threshold must be a number >= 0, got -0.1"),
    ({"metric_for_best_model": ""}, "metric_for_best_model must be a metric name"),
    ({"resume": True, "overwrite": True}, "overwrite and resume contradict each other"),
    ({"labels": "a,b"}, "labels must be a list of strings"),
])
def test_new_fields_are_checked_where_they_enter(fields, message):
    from zhnlp.training.finetune_config import FinetuneConfig

    with pytest.raises(ValueError, match=message):
        FinetuneConfig(task="classification", model="m", **fields)


def test_a_metric_that_is_not_among_the_dev_scores_is_named(tiny, data, tmp_path):
    from zhnlp.errors import ZhnlpError

    with pytest.raises(ZhnlpError, match=r"metric_for_best_model 'bleu' is not among the dev scores \(accuracy, "
                                         r"macro_f1, total\)"):
        run(tiny, tmp_path / "run", train=data["train"], dev=data["dev"], max_steps=1, metric_for_best_model="bleu")


def test_exported_at_top_level():
    import zhnlp
    from zhnlp.training import callbacks, finetune

    assert zhnlp.finetune is finetune.finetune
    for name in ("Callback", "EarlyStoppingCallback", "EvalPrediction", "TrainerState", "TrainerControl"):
        assert hasattr(callbacks, name)


def test_ner_and_mrc_train_from_hub_style_datasets(tiny, tmp_path):
    """NER from a Dataset with ``ner_tags`` as ClassLabel ids (as msra_ner on the hub) trains as its jsonl
    file does, with the ClassLabel's tag names; reading comprehension from hub-style squad rows (flat, with
    ``answers`` as lists) is scored with the official metric."""
    import zhnlp
    from zhnlp.data.fetch import fetch

    msra = read_jsonl(fetch("msra-ner") / "train.jsonl")[:64]
    names = ["O"] + sorted({t for r in msra for t in r["tags"]} - {"O"})
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    hub = datasets.Dataset.from_list([{"tokens": r["tokens"], "ner_tags": [names.index(t) for t in r["tags"]]}
                                      for r in msra], features=features)
    ner = dict(task="ner", batch_size=16, max_length=64, lr=1e-3, dropout=0.0, log_interval=1, max_steps=2)
    from_file = zhnlp.finetune(model=str(tiny), output=str(tmp_path / "ner-file"), train=write_jsonl(
        tmp_path / "ner.jsonl", msra), dev=tmp_path / "ner.jsonl", **ner)
    from_hub = zhnlp.finetune(model=str(tiny), output=str(tmp_path / "ner-hub"), train=hub, dev=hub, **ner)
    assert from_hub["labels"] == from_file["labels"] == names
    assert [m["loss"] for m in read_jsonl(tmp_path / "ner-hub" / "metrics.jsonl")] == \
        [m["loss"] for m in read_jsonl(tmp_path / "ner-file" / "metrics.jsonl")]
    assert from_hub["dev"] == from_file["dev"]

    context = "北京是中华人民共和国的首都，也是全国的政治和文化中心。"
    rows = [{"id": f"q{i}", "title": "北京", "context": context, "question": q,
             "answers": {"text": [a], "answer_start": [context.index(a)]}}
            for i, (q, a) in enumerate([("中国的首都是哪里？", "北京"), ("北京是什么中心？", "政治和文化中心")] * 4)]
    mrc = zhnlp.finetune(task="mrc", model=str(tiny), output=str(tmp_path / "mrc"), train=rows,
                         dev=datasets.Dataset.from_list(rows), batch_size=4, max_length=64, max_steps=2,
                         log_interval=1)
    assert mrc["dev"]["total"] == 8 and mrc["status"] == "complete"
    predictions = read_json(tmp_path / "mrc" / "dev_predictions.json")
    assert set(predictions) == {f"q{i}" for i in range(8)} and all(p in context for p in predictions.values())
