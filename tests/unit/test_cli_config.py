"""The pretrain command line is derived from the run-config dataclasses: flags, help, --print-config, --config."""

import dataclasses
import json

import pytest

from zhnlp.cli import main
from zhnlp.training.config import (CheckpointConfig, DataConfig, LoggingConfig, OptimizerConfig, ParallelConfig,
                                   RunConfig, recipe)

SECTIONS = (RunConfig, ParallelConfig, OptimizerConfig, DataConfig, CheckpointConfig, LoggingConfig)


def printed(capsys, *argv):
    assert main(["pretrain", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_config_field_is_a_flag_with_its_help(capsys):
    assert main(["pretrain", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
    for cls in SECTIONS:
        for f in dataclasses.fields(cls):
            if not f.metadata.get("cli", True):
                continue
            flag = "--" + f.name.replace("_", "-")
            assert flag in text, flag
            assert " ".join(f.metadata["help"].split())[:30] in text, f.name


def test_print_config_is_the_recipe_with_the_flags_applied(capsys):
    expected = dataclasses.asdict(recipe("ernie-tiny"))
    assert printed(capsys, "--recipe", "ernie-tiny") == {**expected, "output": "runs/ernie-tiny"}
    got = printed(capsys, "--recipe", "ernie-tiny", "--tp", "2", "--sequence-parallel", "--lr", "3e-4",
                  "--data", "/corpus/x", "--recompute", "full", "--keep", "0", "--adam-beta2", "0.98",
                  "--output", "/runs/a")
    assert got["parallel"] == {**expected["parallel"], "tp": 2, "sequence_parallel": True}
    assert got["optimizer"]["lr"] == 3e-4 and got["optimizer"]["adam_beta2"] == 0.98
    assert got["data"]["prefix"] == "/corpus/x" and got["recompute"] == "full"
    assert got["checkpoint"]["keep"] == 0 and got["output"] == "/runs/a"
    assert got["data"]["seq_length"] == expected["data"]["seq_length"]  # untouched fields keep the recipe's
    assert printed(capsys, "--recompute", "full", "--recompute", "none")["recompute"] is None
    assert printed(capsys, "--distributed-optimizer", "false")["optimizer"]["distributed_optimizer"] is False
    assert printed(capsys, "--distributed-optimizer")["optimizer"]["distributed_optimizer"] is True


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_config_file_round_trips_and_flags_win(capsys, tmp_path, suffix):
    first = printed(capsys, "--recipe", "ernie-tiny", "--pp", "2", "--steps", "77")
    path = tmp_path / f"run{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(first))
    else:
        import yaml

        path.write_text(yaml.safe_dump(first))
    assert printed(capsys, "--config", str(path)) == first  # its recipe, architecture and output included
    again = printed(capsys, "--config", str(path), "--steps", "5")
    assert again["steps"] == 5 and again["parallel"]["pp"] == 2
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"steps": 9, "parallel": {"tp": 2}, "model": {**first["model"], "hidden_size": 256}}))
    got = printed(capsys, "--config", str(partial))
    assert (got["recipe"], got["steps"], got["parallel"]["tp"], got["model"]["hidden_size"]) == ("ernie-debug", 9, 2, 256)


def test_config_file_mistakes_are_one_line(capsys, tmp_path):
    cases = {"unknown.json": ('{"stepz": 3}', "unknown settings ['stepz']"),
             "nested.json": ('{"parallel": {"tpp": 2}}', "no run setting named 'tpp'"),
             "broken.json": ('{"steps": ', "is not valid JSON"),
             "list.json": ("[1, 2]", "must hold an object of settings")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["pretrain", "--config", str(tmp_path / name), "--print-config"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (name, err)
    assert main(["pretrain", "--config", str(tmp_path / "absent.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["pretrain", "--recompute", "sometimes"]) == 2
    assert "argument --recompute: must be one of none, selective, full, got 'sometimes'" in capsys.readouterr().err


# ------------------------------------------------------------------------------ finetune
def test_every_finetune_field_is_a_flag_with_its_help(capsys):
    from zhnlp.training.finetune_config import FinetuneConfig

    assert main(["finetune", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
    for f in dataclasses.fields(FinetuneConfig):
        if f.metadata.get("cli", True):
            assert "--" + f.name.replace("_", "-") in text, f.name
            assert " ".join(f.metadata["help"].split())[:30] in text, f.name
    assert "--epochs EPOCHS passes over the training data (default: 3)" in text


def finetune_config(capsys, *argv):
    assert main(["finetune", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def test_finetune_print_config_and_config_file(capsys, tmp_path):
    from zhnlp.training.finetune_config import FinetuneConfig

    got = finetune_config(capsys, "ner", "--model", "m", "--labels", "O,B-PER,I-PER", "--eval-steps", "5",
                          "--early-stopping-patience", "2", "--greater-is-better", "false", "--resume")
    expected = dataclasses.asdict(FinetuneConfig(task="ner", model="m", labels=["O", "B-PER", "I-PER"], eval_steps=5,
                                                 early_stopping_patience=2, greater_is_better=False, resume=True,
                                                 output="runs/finetune-ner"))
    assert got == expected
    (tmp_path / "ft.yaml").write_text("model: m\nepochs: 7\nlr: 0.0001\noutput: /runs/x\n")
    got = finetune_config(capsys, "sentiment-analysis", "--config", str(tmp_path / "ft.yaml"), "--epochs", "2")
    assert (got["task"], got["model"], got["epochs"], got["lr"], got["output"]) == \
        ("sentiment-analysis", "m", 2, 1e-4, "/runs/x")
    assert main(["finetune", "ner"]) == 2
    assert "--model is required" in capsys.readouterr().err
    assert main(["finetune", "ner", "--model", "m", "--resume", "--overwrite"]) == 2
    assert "overwrite and resume contradict each other" in capsys.readouterr().err
    assert main(["finetune", "ner", "--model", "m", "--labels", ","]) == 2
    assert "argument --labels: expected a comma-separated list" in capsys.readouterr().err


def test_finetune_takes_a_saved_dataset_on_the_command_line(capsys, tmp_path):
    import datasets

    from tests.finetuning import make_tiny_model

    tiny = make_tiny_model(tmp_path / "tiny")
    rows = [{"text": t, "label": lab} for t, lab in [("很好", "pos"), ("太差", "neg")] * 4]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "validation": datasets.Dataset.from_list(rows[:4])}).save_to_disk(str(tmp_path / "saved"))
    out = tmp_path / "run"
    assert main(["finetune", "classification", "--model", str(tiny), "--train", str(tmp_path / "saved"),
                 "--epochs", "1", "--batch-size", "4", "--output", str(out), "-q"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "complete" and result["dev"] == metrics["dev"]
    assert metrics["dev"]["total"] == 4  # the validation split became the dev data
