"""The command line's rules for mistakes: every foreseeable one is a single line ``zhnlp: error: ...``
with exit status 2 that names the flag or file, the value and the fix; --debug shows the traceback;
outputs that hold something are refused unless --overwrite; a locked run directory is refused at once,
naming the holder's pid."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.finetuning import make_tiny_model
from zhnlp.cli import main
from zhnlp.fileio import DirectoryLock


def run(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    assert err.startswith("zhnlp: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def reviews(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{"text": t, "label": lab} for t, lab in [("很好", "pos"), ("太差", "neg")] * 4]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ numeric flags
FT = ["finetune", "classification", "--model", "M", "--train", "T", "--dev", "T"]
NUMERIC = [
    (["pretrain", "--steps", "0"], "--steps", "an integer >= 1", "0"),
    (["pretrain", "--save-interval", "-1"], "--save-interval", "an integer >= 0", "-1"),
    (["pretrain", "--keep", "-1"], "--keep", "an integer >= 0", "-1"),
    (["pretrain", "--lr", "-1"], "--lr", "a number > 0", "'-1'"),
    (["pretrain", "--micro-batch-size", "0"], "--micro-batch-size", "an integer >= 1", "0"),
    (["pretrain", "--seq-length", "4"], "--seq-length", "an integer >= 8", "4"),
    (["pretrain", "--tp", "0"], "--tp", "an integer >= 1", "0"),
    (["pretrain", "--stop-at", "0"], "--stop-at", "an integer >= 1", "0"),
    (["pretrain", "--steps", "ten"], "--steps", "an integer >= 1", "'ten'"),
    ([*FT, "--epochs", "0"], "--epochs", "an integer >= 1", "0"),
    ([*FT, "--max-steps", "0"], "--max-steps", "an integer >= 1", "0"),
    ([*FT, "--max-train-examples", "0"], "--max-train-examples", "an integer >= 1", "0"),
    ([*FT, "--max-train-examples", "-2"], "--max-train-examples", "an integer >= 1", "-2"),
    ([*FT, "--batch-size", "0"], "--batch-size", "an integer >= 1", "0"),
    ([*FT, "--lr", "-1"], "--lr", "a number > 0", "'-1'"),
    ([*FT, "--lr", "nan"], "--lr", "a number > 0", "'nan'"),
    ([*FT, "--doc-stride", "0"], "--doc-stride", "an integer >= 1", "0"),
    ([*FT, "--warmup-ratio", "1.5"], "--warmup-ratio", "a number >= 0 and <= 1", "'1.5'"),
    ([*FT, "--dropout", "1"], "--dropout", "a number >= 0 and < 1", "'1'"),
    ([*FT, "--max-length", "2"], "--max-length", "an integer >= 8", "2"),
    (["preprocess", "--input", "T", "--output", "y", "--tokenizer", "z", "--workers", "0"], "--workers",
     "an integer >= 1", "0"),
    (["preprocess", "--input", "T", "--output", "y", "--tokenizer", "z", "--workers", "-3"], "--workers",
     "an integer >= 1", "-3"),
    (["predict", "fill-mask", "--batch-size", "0", "x"], "--batch-size", "an integer >= 1", "0"),
    (["predict", "sentiment-analysis", "--top-k", "0", "x"], "--top-k", "an integer >= 1", "0"),
    (["tokenizer", "train-wordpiece", "c.txt", "-o", "d", "--vocab-size", "0"], "--vocab-size", "an integer >= 6", "0"),
    (["tokenizer", "train-sentencepiece", "c.txt", "-o", "d", "--character-coverage", "0"], "--character-coverage",
     "a number > 0 and <= 1", "'0'"),
]


@pytest.mark.parametrize("argv,flag,allowed,value", NUMERIC, ids=[f"{a[0]} {a[-2]} {a[-1]}" for a, *_ in NUMERIC])
def test_numeric_flag_out_of_range_is_one_line_naming_flag_value_and_range(capsys, tmp_path, argv, flag, allowed,
                                                                          value):
    (tmp_path / "T").write_text("x\n", encoding="utf-8")  # the input files exist: only the number is wrong
    rc, err = run(capsys, *[tmp_path / "T" if a == "T" else a for a in argv])
    assert rc == 2
    assert one_line(err).startswith(f"zhnlp: error: argument {flag}: must be {allowed}, got {value} (see zhnlp ")


def test_directory_given_for_a_file(capsys, tmp_path, tiny):
    rc, err = run(capsys, "finetune", "classification", "--model", tiny, "--train", tmp_path, "--dev", tmp_path)
    # fine-tuning also takes a save_to_disk directory: a plain directory is neither
    assert rc == 2 and f"argument --train: {tmp_path} is a directory, but not" in one_line(err)
    assert "pass a data file or a save_to_disk directory" in err
    rc, err = run(capsys, "preprocess", "--input", tmp_path, "--output", tmp_path / "c", "--tokenizer", tiny)
    assert rc == 2 and f"argument --input: {tmp_path} is a directory, not a file" in one_line(err)
    rc, err = run(capsys, "predict", "fill-mask", "--model", tiny, "--input", tmp_path)
    assert rc == 2 and str(tmp_path) in one_line(err) and "directory" in err.lower()


def test_mrc_max_length_too_small_names_the_flags_the_cli_has(capsys, tmp_path, tiny):
    squad = tmp_path / "s.json"
    squad.write_text('{"data": []}', encoding="utf-8")
    rc, err = run(capsys, "finetune", "mrc", "--model", tiny, "--train", squad, "--dev", squad,
                  "--max-length", "40", "--max-query-length", "64", "--output", tmp_path / "o")
    assert rc == 2 and "--max-length 40 leaves no room for the context after a question of up to " \
                       "--max-query-length 64 tokens" in one_line(err)
    rc, err = run(capsys, "finetune", "mrc", "--model", tiny, "--train", squad, "--dev", squad,
                  "--max-length", "64", "--doc-stride", "100", "--output", tmp_path / "o")
    assert rc == 2 and "--doc-stride 100 is larger than the context window" in one_line(err)
    rc, err = run(capsys, "finetune", "ner", "--model", tiny, "--train", squad, "--dev", squad,
                  "--max-length", "16", "--ner-stride", "14", "--output", tmp_path / "o")
    assert rc == 2 and "--ner-stride 14 must be smaller than the 14 sub-tokens a window of --max-length 16 holds" \
        in one_line(err)
    assert not (tmp_path / "o").exists()


def test_small_max_length_computes_the_question_budget_and_stride():
    from zhnlp.training.finetune import FinetuneConfig, get_task

    cfg = get_task("mrc").configure(FinetuneConfig(task="mrc", model="m", max_length=64))
    assert (cfg.max_query_length, cfg.doc_stride) == (32, 14)  # window 64 - 32 - 3 = 29 context tokens
    cfg = get_task("mrc").configure(FinetuneConfig(task="mrc", model="m", max_length=128, doc_stride=64))
    assert (cfg.max_query_length, cfg.doc_stride) == (61, 64)  # the question budget leaves room for the stride
    assert get_task("ner").configure(FinetuneConfig(task="ner", model="m", max_length=32)).ner_stride == 7


@pytest.mark.parametrize("field,value,message", [
    ("epochs", 0, "epochs must be an integer >= 1, got 0"),
    ("max_train_examples", -2, "max_train_examples must be an integer >= 1, got -2"),
    ("lr", -1.0, "lr must be a number > 0, got -1.0"),
    ("batch_size", 2.5, "batch_size must be an integer >= 1, got 2.5"),
])
def test_finetune_config_refuses_values_where_they_enter(field, value, message):
    from zhnlp.training.finetune import FinetuneConfig

    with pytest.raises(ValueError, match=message):
        FinetuneConfig(task="classification", model="m", **{field: value})


def test_run_config_check_names_every_bad_field():
    from zhnlp.errors import LayoutError
    from zhnlp.training.config import override, recipe

    cfg = override(recipe("ernie-debug"), steps=0, lr=-1.0, seq_length=4096, save_interval=-1)
    with pytest.raises(LayoutError, match=r"steps must be an integer >= 1, got 0; save_interval must be an integer "
                                          r">= 0, got -1; lr must be a number > 0, got -1\.0; seq_length 4096 is "
                                          r"longer than the model's max_position_embeddings 2048"):
        cfg.check(1)


# ------------------------------------------------------------------------------------------ the handler
def test_debug_shows_the_traceback(capsys, tmp_path, tiny, monkeypatch):
    argv = ["finetune", "mrc", "--model", tiny, "--oracle", "--output", tmp_path / "o"]
    rc, err = run(capsys, *argv)
    assert rc == 2 and "--oracle needs at least one of --train/--dev/--test" in one_line(err)
    from zhnlp.errors import ZhnlpError

    with pytest.raises(ZhnlpError, match="--oracle needs"):
        main([str(a) for a in argv] + ["--debug"])
    monkeypatch.setenv("ZHNLP_DEBUG", "1")
    with pytest.raises(ZhnlpError, match="--oracle needs"):
        main([str(a) for a in argv])


def test_internal_errors_keep_their_traceback_and_interrupts_exit_130(capsys, monkeypatch):
    import zhnlp.cli as cli

    def boom(args):
        raise RuntimeError("a bug")

    def library_value_error(args):
        np.zeros(3).reshape(2)  # a ValueError raised inside a library, not zhnlp's validation

    def ctrl_c(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_models", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["models"])
    monkeypatch.setattr(cli, "_models", library_value_error)
    with pytest.raises(ValueError):
        cli.main(["models"])
    monkeypatch.setattr(cli, "_models", ctrl_c)
    assert cli.main(["models"]) == 130 and capsys.readouterr().err == "zhnlp: interrupted\n"


def test_os_errors_on_user_paths_are_one_line(capsys, tmp_path):
    rc, err = run(capsys, "evaluate", "cmrc2018", tmp_path / "missing.json", tmp_path / "p.json")
    assert rc == 2 and "missing.json" in one_line(err)


# ------------------------------------------------------------------------------------------ outputs
def test_locked_run_directory_is_refused_at_once_naming_the_holder(capsys, tmp_path, tiny, reviews):
    out = tmp_path / "run"
    with DirectoryLock(out):
        rc, err = run(capsys, "finetune", "classification", "--model", tiny, "--train", reviews, "--dev", reviews,
                      "--output", out, "--overwrite")
        assert rc == 2 and f"{out} is in use by another run (pid {os.getpid()} on " in one_line(err)
    assert not (out / ".zhnlp.lock").exists()  # released: the lock file goes with the lock


def test_a_second_lock_fails_and_a_released_one_can_be_taken(tmp_path):
    from zhnlp.errors import OutputExistsError

    first = DirectoryLock(tmp_path / "d").acquire()
    with pytest.raises(OutputExistsError, match=f"pid {os.getpid()}"):
        DirectoryLock(tmp_path / "d").acquire()
    first.release()
    DirectoryLock(tmp_path / "d").acquire().release()


def test_pretrain_refuses_a_run_directory_and_contradictory_flags(capsys, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    rc, err = run(capsys, "pretrain", "--data", tmp_path / "nope", "--output", out)
    assert rc == 2 and f"--output {out}: this run directory already holds metrics.jsonl; pass --overwrite" \
        in one_line(err)
    rc, err = run(capsys, "pretrain", "--output", out, "--resume", "--overwrite")
    assert rc == 2 and "--overwrite and --resume contradict each other" in one_line(err)
    rc, err = run(capsys, "pretrain", "--steps", "5", "--stop-at", "6", "--output", tmp_path / "new")
    assert rc == 2 and "--stop-at 6 is past the end of the schedule (--steps 5)" in one_line(err)
    assert (out / "metrics.jsonl").read_text(encoding="utf-8") == '{"step": 1}\n'


def test_pretrain_on_a_missing_directory_or_empty_corpus_names_the_prefix(capsys, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rc, err = run(capsys, "pretrain", "--data", tmp_path / "nope", "--output", tmp_path / "r1")
    assert rc == 2 and f"--data {tmp_path / 'nope'}: no preprocessed corpus there (missing " in one_line(err)
    assert not (tmp_path / "r1").exists()  # a run that could not start leaves nothing behind
    rc, err = run(capsys, "pretrain", "--data", tmp_path, "--output", tmp_path / "r2")
    assert rc == 2 and f"--data {tmp_path} is a directory; pass the prefix of a preprocessed corpus" in one_line(err)
    from tests.finetuning import VOCAB

    for name in ("empty", "empty_units"):  # an indexed dataset without a sentence, as an empty corpus would give
        IndexedDatasetBuilder(str(tmp_path / f"{name}.bin"), dtype=np.int32).finalize(str(tmp_path / f"{name}.idx"))
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text(VOCAB.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "empty.json").write_text(json.dumps({"tokenizer": str(tmp_path / "tok")}), encoding="utf-8")
    rc, err = run(capsys, "pretrain", "--data", tmp_path / "empty", "--output", tmp_path / "r3")
    assert rc == 2 and f"--data {tmp_path / 'empty'} holds no sentences" in one_line(err)
    (tmp_path / "empty.json").write_text("[1]", encoding="utf-8")
    rc, err = run(capsys, "pretrain", "--data", tmp_path / "empty", "--output", tmp_path / "r3")
    assert rc == 2 and f"{tmp_path / 'empty.json'} is damaged" in one_line(err)
    assert not (tmp_path / "r3").exists()


def test_tokenizer_training_refuses_an_empty_corpus_and_an_existing_tokenizer(capsys, tmp_path):
    (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("北京欢迎你。\n上海很大。\n", encoding="utf-8")
    for command in ("train-wordpiece", "train-sentencepiece"):
        rc, err = run(capsys, "tokenizer", command, tmp_path / "empty.txt", "-o", tmp_path / command)
        assert rc == 2 and "holds no text: every line is empty" in one_line(err)
        assert not (tmp_path / command).exists()
    assert run(capsys, "tokenizer", "train-wordpiece", tmp_path / "c.txt", "-o", tmp_path / "tok")[0] == 0
    before = (tmp_path / "tok" / "vocab.txt").read_bytes()
    rc, err = run(capsys, "tokenizer", "train-wordpiece", tmp_path / "c.txt", "-o", tmp_path / "tok",
                  "--vocab-size", "100")
    assert rc == 2 and "a tokenizer exists already" in one_line(err) and "--overwrite" in err
    assert (tmp_path / "tok" / "vocab.txt").read_bytes() == before
    assert run(capsys, "tokenizer", "train-wordpiece", tmp_path / "c.txt", "-o", tmp_path / "tok", "--overwrite")[0] == 0


def test_preprocess_refuses_an_existing_prefix_and_an_empty_corpus(capsys, tmp_path, tiny):
    (tmp_path / "c.txt").write_text("北京欢迎你。\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    base = ["preprocess", "--tokenizer", tiny, "--workers", "1", "--quiet", "--output", tmp_path / "out" / "c"]
    rc, err = run(capsys, *base, "--input", tmp_path / "empty.txt")
    assert rc == 2 and "no usable text" in one_line(err) and "nothing was written" in err
    assert not list((tmp_path / "out").glob("c*"))
    assert run(capsys, *base, "--input", tmp_path / "c.txt")[0] == 0
    before = (tmp_path / "out" / "c.bin").read_bytes()
    (tmp_path / "c.txt").write_text("上海很大。\n", encoding="utf-8")
    rc, err = run(capsys, *base, "--input", tmp_path / "c.txt")
    assert rc == 2 and "a preprocessed corpus exists already" in one_line(err) and "--overwrite" in err
    assert (tmp_path / "out" / "c.bin").read_bytes() == before
    assert run(capsys, *base, "--input", tmp_path / "c.txt", "--overwrite")[0] == 0
    assert (tmp_path / "out" / "c.bin").read_bytes() != before


def test_finetune_refuses_a_tokenizer_larger_than_the_model_before_training(capsys, tmp_path, reviews):
    import zhnlp
    from tests.finetuning import VOCAB
    from zhnlp.tokenizers.wordpiece import WordPieceTokenizer
    from zhnlp.training.config import recipe

    arch = {**recipe("ernie-debug").model, "vocab_size": 1000}
    zhnlp.AutoModelForMaskedLM.from_config(arch).save_pretrained(tmp_path / "small")
    WordPieceTokenizer.from_vocab(VOCAB).save_pretrained(tmp_path / "small")  # 21,128 tokens
    rc, err = run(capsys, "finetune", "classification", "--model", tmp_path / "small", "--train", reviews,
                  "--dev", reviews, "--output", tmp_path / "out")
    assert rc == 2 and "has 21128 tokens" in one_line(err) and "vocab_size is 1000" in err
    assert not (tmp_path / "out").exists()
