"""Feature extraction and sentence similarity give what transformers' base model gives, pooled as asked (or as the
model's sentence-transformers files say), and `zhnlp predict` prints the same as JSON lines."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
import transformers

import zhnlp
from zhnlp.cli import main
from zhnlp.pipelines.sentence_embeddings import pool, pooling_of
from zhnlp.tokenizers.wordpiece import WordPieceTokenizer

VOCAB = Path(__file__).resolve().parents[1] / "assets" / "bert-base-chinese-vocab.txt"
TEXTS = ["今天天气很好", "我想申请退款，请问怎么操作？", "明天会下雨吗", "好"]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """(directory, transformers BertModel, tokenizer): a tiny random BERT saved with the bert-base-chinese vocab."""
    directory = tmp_path_factory.mktemp("embed") / "bert"
    config = transformers.BertConfig(vocab_size=21128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64, initializer_range=0.5)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    model.save_pretrained(directory)
    tokenizer = WordPieceTokenizer.from_vocab(VOCAB)
    tokenizer.save_pretrained(directory)
    zhnlp.distributed.init()
    return directory, model, tokenizer


def _reference(model, tokenizer, text, pooling):
    enc = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc)
    states = out.last_hidden_state[0]
    return {"tokens": states, "mean": states.mean(0), "cls": states[0], "pooler": out.pooler_output[0]}[pooling]


@pytest.mark.parametrize("pooling", ["mean", "cls", "pooler"])
def test_sentence_vectors_match_transformers(encoder, pooling):
    directory, model, tokenizer = encoder
    embed = zhnlp.pipeline("feature-extraction", directory, pooling=pooling, batch_size=3)
    vectors = embed(TEXTS)  # batched: rows of different lengths are padded together
    for text, vector in zip(TEXTS, vectors):
        assert len(vector) == 32
        torch.testing.assert_close(torch.tensor(vector), _reference(model, tokenizer, text, pooling),
                                   atol=1e-5, rtol=1e-5)
    unit = embed(TEXTS[0], normalize=True)
    assert torch.tensor(unit).norm().item() == pytest.approx(1.0, abs=1e-6)


def test_token_features_as_transformers_shapes_them(encoder):
    directory, model, tokenizer = encoder
    embed = zhnlp.pipeline("feature-extraction", directory)
    [features] = embed(TEXTS[1])  # [1, tokens, hidden] for one string, as transformers gives it
    torch.testing.assert_close(torch.tensor(features), _reference(model, tokenizer, TEXTS[1], "tokens"),
                               atol=1e-5, rtol=1e-5)
    tensors = embed(TEXTS[:2], return_tensors=True)
    assert [tuple(t.shape) for t in tensors] == [(1, 8, 32), (1, 16, 32)]


def test_similarity_is_the_cosine_of_the_pooled_vectors(encoder):
    directory, model, tokenizer = encoder
    sim = zhnlp.pipeline("sentence-similarity", directory, pooling="mean")
    scores = sim({"source_sentence": TEXTS[0], "sentences": TEXTS[1:]})
    source = _reference(model, tokenizer, TEXTS[0], "mean")
    expected = [torch.cosine_similarity(source, _reference(model, tokenizer, t, "mean"), dim=0).item()
                for t in TEXTS[1:]]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 4) for s in scores)) == 3, "different sentences should get different scores"
    pair = sim({"text": TEXTS[0], "text_pair": TEXTS[2]})
    assert pair == {"score": pytest.approx(expected[1], abs=1e-5)}
    # a list of inputs: one result each, in order, whatever the batching
    both = zhnlp.pipeline("text_similarity", directory, pooling="mean", batch_size=1)(
        [{"text": TEXTS[0], "text_pair": TEXTS[2]}, {"source_sentence": TEXTS[0], "sentences": [TEXTS[0]]}])
    assert both[0]["score"] == pytest.approx(expected[1], abs=1e-5)
    assert both[1] == [pytest.approx(1.0, abs=1e-5)]


def test_pooling_comes_from_sentence_transformers_files(encoder, tmp_path):
    directory, model, tokenizer = encoder
    local = tmp_path / "st"
    model.save_pretrained(local)
    tokenizer.save_pretrained(local)
    (local / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (local / "1_Pooling").mkdir()
    (local / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    vector = zhnlp.pipeline("feature-extraction", local, pooling="auto")(TEXTS[1])
    torch.testing.assert_close(torch.tensor(vector), _reference(model, tokenizer, TEXTS[1], "cls"),
                               atol=1e-5, rtol=1e-5)
    # no files, no card: mean pooling
    plain = zhnlp.pipeline("sentence-similarity", directory)
    assert plain.resolve_pooling(plain.options) == "mean"


def test_bad_inputs_and_options_say_what_to_pass(encoder):
    directory, _, _ = encoder
    with pytest.raises(ValueError, match="pooling must be one of 'mean', 'cls', 'pooler'"):
        zhnlp.pipeline("feature-extraction", directory, pooling="max")
    with pytest.raises(ValueError, match="normalize=True applies to sentence vectors"):
        zhnlp.pipeline("feature-extraction", directory, normalize=True)
    sim = zhnlp.pipeline("sentence-similarity", directory)
    with pytest.raises(ValueError, match="'source_sentence' and 'sentences', or 'text' and 'text_pair'; got"):
        sim({"text": "a"})
    with pytest.raises(ValueError, match="'sentences' must be a non-empty list"):
        sim({"source_sentence": "今天", "sentences": []})
    with pytest.raises(ValueError, match=r"'sentences'\[1\] is empty"):
        sim({"source_sentence": "今天", "sentences": ["明天", "  "]})
    with pytest.raises(TypeError, match="takes a dict"):
        sim("今天天气很好")
    with pytest.raises(ValueError, match="pooling='pooler' needs a model with a pooler"):
        pool(torch.zeros(1, 2, 4), torch.ones(1, 2), "pooler", None)


def test_predict_prints_similarities_and_vectors(encoder, tmp_path, capsys):
    directory, model, tokenizer = encoder
    inputs = tmp_path / "pairs.jsonl"
    inputs.write_text(json.dumps({"text": TEXTS[0], "text_pair": TEXTS[2]}, ensure_ascii=False) + "\n\n"
                      + json.dumps({"source_sentence": TEXTS[0], "sentences": TEXTS[1:3]}, ensure_ascii=False) + "\n")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["predict", "sentence-similarity", "--model", str(directory), "--pooling", "mean",
                     "--input", str(inputs)]) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[1] is None and len(lines[2]) == 2
    assert lines[0]["score"] == pytest.approx(lines[2][1], abs=1e-6)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["predict", "feature-extraction", "--model", str(directory), "--pooling", "cls", TEXTS[3]]) == 0
    torch.testing.assert_close(torch.tensor(json.loads(out.getvalue())),
                               _reference(model, tokenizer, TEXTS[3], "cls"), atol=1e-5, rtol=1e-5)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("今天天气很好\n")
    capsys.readouterr()
    assert main(["predict", "sentence-similarity", "--model", str(directory), "--input", str(bad)]) != 0
    assert f"{bad}:1: not JSON" in capsys.readouterr().err


def test_evaluate_sts_correlates_cosines_with_gold_scores(encoder, tmp_path, capsys):
    from zhnlp.metrics.similarity import spearman

    directory, model, tokenizer = encoder
    rows = [(TEXTS[0], TEXTS[1], 1.0), (TEXTS[0], TEXTS[0], 5.0), (TEXTS[2], TEXTS[3], 2.5), (TEXTS[1], TEXTS[3], 0)]
    data = tmp_path / "sts.jsonl"
    data.write_text("".join(json.dumps({"text": a, "text_pair": b, "label": y}, ensure_ascii=False) + "\n"
                            for a, b, y in rows), encoding="utf-8")
    cosines = [torch.cosine_similarity(_reference(model, tokenizer, a, "cls"), _reference(model, tokenizer, b, "cls"),
                                       dim=0).item() for a, b, _ in rows]
    assert main(["evaluate", "sts", str(data), "--model", str(directory), "--pooling", "cls", "--batch-size", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["spearman"] == pytest.approx(100 * spearman(cosines, [y for *_, y in rows]), abs=1e-3)
    assert printed["total"] == 4 and printed["pooling"] == "cls"
    data.write_text('{"text": "今天", "text_pair": "明天"}\n', encoding="utf-8")
    assert main(["evaluate", "sts", str(data), "--model", str(directory)]) != 0
    assert f"{data}:1: expected a JSON object with text, text_pair and a numeric label" in capsys.readouterr().err


def test_pooling_of_cards():
    assert pooling_of("m3e-small") == "mean"
    assert pooling_of("roformer-chinese-sim-char-small") == "pooler"
    assert pooling_of("bert-base-chinese") is None  # not a sentence-embedding model: the card says nothing
    assert pooling_of("someone/not-a-card") is None


def test_a_masked_lm_checkpoint_embeds_without_its_missing_pooler(tmp_path):
    directory = tmp_path / "mlm"
    config = transformers.BertConfig(vocab_size=21128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64, initializer_range=0.5)
    torch.manual_seed(1)
    mlm = transformers.BertForMaskedLM(config).eval()  # no pooler in the checkpoint
    mlm.save_pretrained(directory)
    tokenizer = WordPieceTokenizer.from_vocab(VOCAB)
    tokenizer.save_pretrained(directory)
    embed = zhnlp.pipeline("feature-extraction", directory, pooling="mean")
    enc = tokenizer(TEXTS[1], return_tensors="pt")
    with torch.no_grad():
        expected = mlm.bert(**enc).last_hidden_state[0].mean(0)
    torch.testing.assert_close(torch.tensor(embed(TEXTS[1])), expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="pooling='pooler' needs the model's pooler, which this checkpoint does not"):
        embed(TEXTS[1], pooling="pooler")
