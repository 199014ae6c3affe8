"""Masked-LM fine-tuning (``zhnlp finetune mlm``: continued pretraining on the user's own text), on one process,
on the sentiment reviews, from a tiny random transformers BERT (4 layers, hidden 32, the bert-base-chinese
vocabulary, no dropout) saved with its masked-LM head.

* the training step's loss on a masked batch is transformers' BertForMaskedLM loss on that batch, and the dev
  scoring (loss over every masked token, accuracy) is transformers' too;
* a short run lowers the dev loss; its first logged loss is transformers' on the loop's own first batch; the saved
  model loads in transformers as AutoModelForMaskedLM with zhnlp's weights, and in zhnlp for classification and
  the fill-mask pipeline;
* masking: jieba words are masked whole, at the asked rate, afresh every epoch but the same for the same
  (seed, epoch); dev masking is fixed; long texts are cut into windows that keep every token;
* errors: bad lines named with FILE:LINE, a decoder refused by name, mlm-only flags refused elsewhere."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

import zhnlp
from tests import tiny
from tests.chat_data import reviews, write_jsonl
from tests.finetuning import VOCAB
from zhnlp.errors import DataError, ZhnlpError
from zhnlp.training.finetune import FinetuneConfig, get_task

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from zhnlp.tokenizers.wordpiece import WordPieceTokenizer

    directory = tmp_path_factory.mktemp("mlm") / "bert"
    tiny.hf_model("bert", "mlm", vocab_size=21128, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0).save_pretrained(directory)
    WordPieceTokenizer.from_vocab(VOCAB).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tok(bert_dir):
    from zhnlp.tokenizers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bert_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("texts")
    return {"train": write_jsonl(root / "train.jsonl", [{"text": r["text"]} for r in reviews(160)]),
            "dev": write_jsonl(root / "dev.jsonl", [{"text": r["text"]} for r in reviews(40, offset=3000)])}


@pytest.fixture(scope="module")
def world_of_one():
    zhnlp.distributed.init()
    yield
    zhnlp.distributed.shutdown()


def encoded(model_dir, tok, source, training: bool, **fields):
    """(task, features) of one split through the task's own reader and encoder."""
    task = get_task("mlm")
    cfg = task.configure(FinetuneConfig(task="mlm", model=str(model_dir), max_length=MAX_LENGTH, **fields))
    examples, _ = task.read(source, None, training=training, name="data")
    return task, cfg, task.encode(cfg, tok, examples, None)


def batch_of(features: list[dict], pad_id: int) -> dict:
    from zhnlp.training.batches import collate_features, pad_length

    return collate_features(features, pad_length(features, 8), pad_id)


def hf_loss_over(model, features, pad_id) -> tuple[float, float]:
    """transformers' loss averaged over every masked token of ``features`` and its masked-token accuracy."""
    total, right, count = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(features), 16):
            b = batch_of(features[i:i + 16], pad_id)
            out = model(**b)
            picked = b["labels"] != -100
            total += float(out.loss) * int(picked.sum())
            right += int((out.logits[picked].argmax(-1) == b["labels"][picked]).sum())
            count += int(picked.sum())
    return total / count, right / count


# ------------------------------------------------------------------------------------------ 1. the loss
def test_training_step_and_dev_scores_are_transformers(bert_dir, tok, data, world_of_one):
    from zhnlp.training.batches import masked_lm_over
    from zhnlp.training.trainer import forward_step

    task, cfg, features = encoded(bert_dir, tok, data["train"], training=True)
    batch = batch_of([task.epoch_transform(cfg)(f, 0) for f in features[:12]], tok.pad_token_id)
    assert 0 < int((batch["labels"] != -100).sum()) < int(batch["attention_mask"].sum())
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(bert_dir)
    chunk = model.chunks[0]
    chunk.train()
    with zhnlp.distributed.cpu.scope():
        out, loss_func = forward_step(iter([dict(batch)]), chunk)  # the trainer's step: the head's own loss
        ours = float(loss_func(out)[0].detach())
    hf = transformers.AutoModelForMaskedLM.from_pretrained(bert_dir).train()  # no dropout: train = eval
    with torch.no_grad():
        reference = float(hf(**batch).loss)
    assert ours == pytest.approx(reference, abs=1e-5)

    _, _, dev = encoded(bert_dir, tok, data["dev"], training=False)
    scores = masked_lm_over(model, dev, 16, pad_token_id=tok.pad_token_id)
    loss, accuracy = hf_loss_over(hf.eval(), dev, tok.pad_token_id)
    assert scores["loss"] == pytest.approx(loss, abs=1e-5) and scores["accuracy"] == pytest.approx(accuracy)
    assert scores["tokens"] == sum(int((np.asarray(f["labels"]) != -100).sum()) for f in dev)


# ------------------------------------------------------------------------------------------ 2. a run
@pytest.fixture(scope="module")
def run(bert_dir, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tapt"
    result = zhnlp.finetune(task="masked-lm", model=str(bert_dir), train=data["train"], dev=data["dev"],
                            output=str(out), epochs=2, batch_size=16, max_length=MAX_LENGTH, lr=2e-3,
                            warmup_ratio=0.0, log_interval=1)
    return out, result


def test_a_short_run_lowers_the_dev_loss_and_reports_transformers_numbers(bert_dir, tok, data, run, world_of_one):
    from zhnlp.training.batches import EpochBatches

    out, result = run
    assert result["status"] == "complete" and result["task"] == "mlm"
    assert result["metric_for_best_model"] == "loss" and result["greater_is_better"] is False
    assert result["config"]["mask_prob"] == 0.15 and result["config"]["whole_word_masking"] is True
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # the first step's loss is transformers' on the loop's first batch (epoch 0's masking, epoch 0's order)
    task, cfg, features = encoded(bert_dir, tok, data["train"], training=True)
    assert result["train_features"] == len(features) > 160  # long reviews became several windows
    first = EpochBatches(features, 16, 16, cfg.seed, pad_token_id=tok.pad_token_id,
                         transform=task.epoch_transform(cfg))(0)
    start = transformers.AutoModelForMaskedLM.from_pretrained(bert_dir).eval()
    with torch.no_grad():
        assert steps[0]["loss"] == pytest.approx(float(start(**first[0]).loss), abs=1e-5)
    # the dev loss falls, from the starting model's to the best model's, and is transformers' number for it
    _, _, dev = encoded(bert_dir, tok, data["dev"], training=False)
    before, _ = hf_loss_over(start, dev, tok.pad_token_id)
    history = [e["dev"]["loss"] for e in result["epochs"]]
    assert history[-1] < history[0] < before - 0.5, (before, history)
    saved = transformers.AutoModelForMaskedLM.from_pretrained(out / "model").eval()
    loss, accuracy = hf_loss_over(saved, dev, tok.pad_token_id)
    assert result["dev"]["loss"] == pytest.approx(loss, abs=1e-5) == min(history)
    assert result["dev"]["accuracy"] == pytest.approx(accuracy)
    assert result["dev"]["perplexity"] == pytest.approx(np.exp(loss), rel=1e-5)
    assert not (out / "dev_predictions.json").exists()


def test_the_saved_model_is_a_masked_lm_for_transformers_and_zhnlp(run, tok, world_of_one):
    from safetensors.torch import load_file

    out, _ = run
    model_dir = out / "model"
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    assert type(hf).__name__ == "BertForMaskedLM"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    written = load_file(model_dir / "model.safetensors")
    state = hf.state_dict()
    for name, value in written.items():
        assert torch.equal(state[name], value), name
    # zhnlp's model from the same directory gives transformers' logits
    texts = ["这家酒店的服务很好，房间也干净。", "书的内容不错，但是印刷太差了"]
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = zhnlp.AutoModelForMaskedLM.from_pretrained(model_dir)(**batch).logits
        theirs = hf.eval()(**batch).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # the next step of the usual recipe: a classifier starts from it (the masked-LM head dropped), and fill-mask
    classifier = zhnlp.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    assert classifier(**batch).logits.shape == (2, 2)
    filled = zhnlp.pipeline("fill-mask", model=str(model_dir))("这家酒店的服务很[MASK]。", top_k=3)
    assert len(filled) == 3 and all(r["token_str"] for r in filled)


# ------------------------------------------------------------------------------------------ 3. masking
def test_whole_words_are_masked_together_at_the_asked_rate(bert_dir, tok, data):
    from zhnlp.tokenizers.segment import Segmenter

    task, cfg, features = encoded(bert_dir, tok, data["train"], training=True)
    segmenter = Segmenter()
    checked = 0
    for f in features:  # units are jieba's words: a pure-CJK text in one window, one character per token
        text = "".join(tok.convert_ids_to_tokens(f["input_ids"][1:-1]))
        if len(text) == len(f["input_ids"]) - 2 and all("\u4e00" <= c <= "\u9fff" for c in text):
            units = f["units"][1:-1]
            words = ["".join(text[i] for i in np.flatnonzero(units == u)) for u in np.unique(units)]
            assert words == segmenter.cut(text)
            checked += 1
    assert checked >= 5
    for mask_prob in (0.15, 0.3):
        task, cfg, features = encoded(bert_dir, tok, data["train"], training=True, mask_prob=mask_prob)
        masked = real = multi = 0
        for f in features:
            labels = np.asarray(task.epoch_transform(cfg)(f, 0)["labels"])
            units = f["units"]
            for u in np.unique(units[units >= 0]):
                chosen = labels[units == u] != -100
                assert chosen.all() or not chosen.any(), "a word was masked in part"
                multi += int(chosen.all() and chosen.size > 1)
            assert labels[0] == labels[-1] == -100  # [CLS] and [SEP] never
            masked += int((labels != -100).sum())
            real += len(labels) - 2
        assert masked / real == pytest.approx(mask_prob, abs=0.01)
        assert multi > 100  # whole multi-character words were chosen
    # without whole-word masking every token is its own unit
    _, _, single = encoded(bert_dir, tok, data["train"], training=True, whole_word_masking=False)
    assert all(len(np.unique(f["units"][1:-1])) == len(f["units"]) - 2 for f in single)


def test_masking_is_fresh_per_epoch_reproducible_and_fixed_for_dev(bert_dir, tok, data):
    task, cfg, features = encoded(bert_dir, tok, data["train"], training=True)
    again, cfg_again, _ = encoded(bert_dir, tok, data["train"], training=True)
    other_seed, cfg_seed, _ = encoded(bert_dir, tok, data["train"], training=True, seed=7)

    def labels(t, c, epoch):
        return [t.epoch_transform(c)(f, epoch)["labels"] for f in features]

    epoch0, epoch1 = labels(task, cfg, 0), labels(task, cfg, 1)
    assert labels(again, cfg_again, 1) == epoch1  # a pure function of (seed, epoch, index): resume sees the same
    assert sum(a != b for a, b in zip(epoch0, epoch1)) > 0.8 * len(features)
    assert sum(a != b for a, b in zip(epoch1, labels(other_seed, cfg_seed, 1))) > 0.8 * len(features)
    assert all(f["input_ids"][0] == tok.cls_token_id and "labels" not in f for f in features)  # not masked in place
    _, _, dev_a = encoded(bert_dir, tok, data["dev"], training=False)
    _, _, dev_b = encoded(bert_dir, tok, data["dev"], training=False)
    assert [f["labels"] for f in dev_a] == [f["labels"] for f in dev_b]
    assert [f["input_ids"] for f in dev_a] == [f["input_ids"] for f in dev_b]
    masked = [i for f in dev_a for i, x in zip(f["input_ids"], f["labels"]) if x != -100]
    assert masked.count(tok.mask_token_id) == pytest.approx(0.8 * len(masked), abs=0.06 * len(masked))


def test_long_texts_become_windows_that_keep_every_token(bert_dir, tok, tmp_path):
    text = "".join(r["text"] for r in reviews(40))
    path = tmp_path / "long.txt"  # plain text: one text per line
    path.write_text(f"{text}\n\n短文本。\n", encoding="utf-8")
    _, _, features = encoded(bert_dir, tok, path, training=True)
    whole = tok(text, add_special_tokens=False)["input_ids"]
    short = tok("短文本。", add_special_tokens=False)["input_ids"]
    windows = [f for f in features if f["input_ids"][1:-1] != short]
    assert len(windows) > len(whole) // (MAX_LENGTH - 2)
    assert [i for f in windows for i in f["input_ids"][1:-1]] == whole
    assert all(len(f["input_ids"]) <= MAX_LENGTH and f["input_ids"][0] == tok.cls_token_id
               and f["input_ids"][-1] == tok.sep_token_id for f in features)
    assert [f["index"] for f in features] == list(range(len(features)))


# ------------------------------------------------------------------------------------------ 4. errors and inputs
def test_bad_lines_are_named_with_file_and_line(bert_dir, data, tmp_path, capsys):
    from zhnlp.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "好评"}\n{"text": "少了引号}\n{"content": "字段不对"}\n\n{"text": ""}\n{"text": 3}\n',
                   encoding="utf-8")
    rc = main(["finetune", "mlm", "--model", str(bert_dir), "--train", str(bad), "--dev", str(data["dev"]),
               "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("zhnlp: error:") == 1
    assert "4 problems" in err
    for line, problem in ((2, "invalid JSON"), (3, "no 'text' field"), (5, "'text' is empty"),
                          (6, "'text' must be a string")):
        assert f"{bad}:{line}: {problem}" in err
    assert f"{bad}:1:" not in err and not (tmp_path / "out").exists()
    rows = [{"text": "好"}, {"title": "无正文"}]
    with pytest.raises(DataError, match=r"--train data row 1: no 'text' column"):
        zhnlp.finetune(task="mlm", model=str(bert_dir), train=rows, dev=rows[:1], output=str(tmp_path / "o2"))


def test_datasets_rows_and_text_files_are_read(bert_dir, tok, tmp_path):
    import datasets

    texts = ["第一条评论。", "第二条评论，很好。"]
    from_dataset = encoded(bert_dir, tok, datasets.Dataset.from_dict({"text": texts, "id": [1, 2]}), True)[2]
    path = tmp_path / "texts.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}, ensure_ascii=False) for t in texts), encoding="utf-8")
    from_file = encoded(bert_dir, tok, path, True)[2]
    plain = tmp_path / "texts.data"  # no suffix to go by: the first line does not start with "{"
    plain.write_text("\n".join(texts) + "\n", encoding="utf-8")
    from_text = encoded(bert_dir, tok, plain, True)[2]
    assert [f["input_ids"] for f in from_dataset] == [f["input_ids"] for f in from_file] \
        == [f["input_ids"] for f in from_text] == [tok(t)["input_ids"] for t in texts]


def test_models_and_settings_that_cannot_work(bert_dir, data, tmp_path, capsys):
    from tests.tiny_decoder import hf_model
    from zhnlp.cli import main

    decoder = tmp_path / "decoder"
    hf_model("tied").save_pretrained(decoder)
    with pytest.raises(ZhnlpError, match="is a ernie4_5 model, which has no mlm head; zhnlp finetune mlm "
                                         "needs an encoder with a masked-LM head"):
        zhnlp.finetune(task="fill-mask", model=str(decoder), train=data["train"], dev=data["dev"],
                       output=str(tmp_path / "d"))
    with pytest.raises(ZhnlpError, match="--mask-prob and --no-whole-word-masking are for masked-LM"):
        zhnlp.finetune(task="classification", model=str(bert_dir), train=data["train"], dev=data["dev"],
                       output=str(tmp_path / "c"), mask_prob=0.2)
    with pytest.raises(ZhnlpError, match="compute_metrics is not available for mlm"):
        zhnlp.finetune(task="mlm", model=str(bert_dir), train=data["train"], dev=data["dev"],
                       output=str(tmp_path / "m"), compute_metrics=lambda p: {})
    with pytest.raises(ValueError, match="mask_prob must be"):
        FinetuneConfig(task="mlm", model="m", mask_prob=1.0)
    rc = main(["finetune", "mlm", "--model", str(bert_dir), "--train", str(data["train"]), "--dev",
               str(data["dev"]), "--mask-prob", "0", "--output", str(tmp_path / "z")])
    assert rc == 2 and "--mask-prob" in capsys.readouterr().err
