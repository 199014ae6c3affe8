"""`zhnlp pretrain` picks the dataset from the recipe's family: a corpus prepared for the other objective, or
one whose EOD is not the model's eos token, stops before training with one line naming the fix."""

import json
import shutil
from pathlib import Path

import pytest

from zhnlp.cli import main

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    from zhnlp.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("objectives")
    shutil.copy(ASSETS / "bert-base-chinese-vocab.txt", root / "vocab.txt")
    (root / "c.txt").write_text("北京是中华人民共和国的首都。\n长江是中国最长的河流。\n" * 20, encoding="utf-8")
    preprocess([root / "c.txt"], root / "mlm", str(root), masking=False, progress=False)
    preprocess([root / "c.txt"], root / "clm", str(root), objective="causal-lm", progress=False)
    return root


def error(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zhnlp: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("zhnlp: error: ").strip()


def test_the_wrong_corpus_kind_is_refused_by_name(capsys, corpora, tmp_path):
    err = error(capsys, "pretrain", "--recipe", "ernie4.5-debug", "--data", corpora / "mlm", "--output", tmp_path / "a")
    assert err == (f"--data {corpora / 'mlm'} was preprocessed for masked-LM pretraining (sentences with masking "
                   "units), but recipe 'ernie4.5-debug' needs a corpus for causal-LM pretraining (whole documents "
                   "with EOD); preprocess the text again with `zhnlp preprocess --objective causal-lm --input FILE "
                   "--output PREFIX --tokenizer DIR`.")
    err = error(capsys, "pretrain", "--recipe", "ernie-debug", "--data", corpora / "clm", "--output", tmp_path / "b")
    assert err.startswith(f"--data {corpora / 'clm'} was preprocessed for causal-LM pretraining") and \
        "`zhnlp preprocess --objective mlm " in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_eod_other_than_the_models_eos_is_refused(capsys, corpora, tmp_path):
    config = tmp_path / "run.json"
    assert main(["pretrain", "--recipe", "ernie4.5-debug", "--print-config"]) == 0
    settings = json.loads(capsys.readouterr().out)
    settings["model"]["eos_token_id"] = 2
    config.write_text(json.dumps(settings))
    err = error(capsys, "pretrain", "--config", config, "--data", corpora / "clm", "--output", tmp_path / "c")
    assert err == (f"--data {corpora / 'clm'} ends documents with token id 102 ([SEP]) but the model's eos_token_id "
                   "is 2; set the model's eos_token_id to the corpus's EOD (--config with model.eos_token_id) so "
                   "that generation stops where training saw documents end.")
