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
