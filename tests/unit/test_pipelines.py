"""Pipelines give what a direct forward of the same model gives, with character offsets into the input, in batches
and one by one, and `zhnlp predict` prints the same results as JSON lines."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
import transformers

import zhnlp
from zhnlp.cli import main
from zhnlp.tokenizers.wordpiece import WordPieceTokenizer

VOCAB = Path(__file__).resolve().parents[1] / "assets" / "bert-base-chinese-vocab.txt"
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
HEADS = {"seq": "BertForSequenceClassification", "mlm": "BertForMaskedLM", "qa": "BertForQuestionAnswering",
         "ner": "BertForTokenClassification"}


def _build(directory: Path, head: str, **extra):
    """A tiny random BERT with the bert-base-chinese vocabulary, saved with its tokenizer; returns the HF model."""
    config = transformers.BertConfig(vocab_size=21128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=128,
                                     initializer_range=0.5, **extra)  # wide weights: inputs get different outputs
    torch.manual_seed(0)
    model = getattr(transformers, HEADS[head])(config).eval()
    model.save_pretrained(directory)
    WordPieceTokenizer.from_vocab(VOCAB).save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (directory, transformers model) for each head."""
    root = tmp_path_factory.mktemp("pipeline-models")
    zhnlp.distributed.init()
    return {"seq": (root / "seq", _build(root / "seq", "seq", id2label=SENTIMENT)),
            "mlm": (root / "mlm", _build(root / "mlm", "mlm")),
            "qa": (root / "qa", _build(root / "qa", "qa")),
            "ner": (root / "ner", _build(root / "ner", "ner", id2label=NER_LABELS))}


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer.from_vocab(VOCAB)


def _hf_forward(model, tokenizer, *texts, max_length=512):
    enc = tokenizer(*texts, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        return model(**enc), enc


# ---------------------------------------------------------------------------------------------- sentiment
TEXTS = ["这家餐厅的菜很好吃，服务也周到。", "太难吃了", "一般般吧，价格还可以，就是等位的时间有点长。", "好"]


def test_sentiment_matches_a_direct_forward(models, tokenizer):
    directory, hf = models["seq"]
    classify = zhnlp.pipeline("sentiment-analysis", directory)
    for text in TEXTS:
        out, _ = _hf_forward(hf, tokenizer, text)
        probs = torch.softmax(out.logits[0], -1)
        [result] = classify(text)  # one string: a list of its best label, as transformers gives it
        assert result["label"] == SENTIMENT[int(probs.argmax())]
        assert result["score"] == pytest.approx(float(probs.max()), abs=1e-5)
    labels = {r["label"] for r in classify(TEXTS)}
    assert len(labels) > 1, "the tiny model should not give every text the same label"


def test_sentiment_pairs_top_k_and_alias(models, tokenizer):
    directory, hf = models["seq"]
    classify = zhnlp.pipeline("text-classification", directory)
    out, _ = _hf_forward(hf, tokenizer, "今天天气怎么样", "今天天气如何")
    probs = torch.softmax(out.logits[0], -1)
    ranked = classify({"text": "今天天气怎么样", "text_pair": "今天天气如何"}, top_k=None)
    assert [r["label"] for r in ranked] == [SENTIMENT[int(i)] for i in probs.argsort(descending=True)]
    assert [r["score"] for r in ranked] == pytest.approx(probs.sort(descending=True).values.tolist(), abs=1e-5)
    assert sum(r["score"] for r in ranked) == pytest.approx(1.0, abs=1e-6)
    assert classify(TEXTS[0], top_k=2) == classify(TEXTS[0], top_k=None)[:2]
    # transformers' shapes: a string -> [best]; a dict (pair) -> best; a list -> [best per input]; top_k -> a ranking
    assert classify(TEXTS[0]) == classify(TEXTS[0], top_k=1) == [classify([TEXTS[0]])[0]]
    assert isinstance(classify({"text": TEXTS[0]}), dict) and isinstance(classify([TEXTS[0]], top_k=2)[0], list)
    with pytest.raises(ValueError, match="top_k"):
        classify(TEXTS[0], top_k=0)
    with pytest.raises(ValueError, match="'text'"):
        classify({"sentence": "好"})


def test_sentiment_truncates_long_texts_to_max_length(models, tokenizer):
    directory, hf = models["seq"]
    text = "这部电影的剧情" * 40  # 280 characters, one token each
    classify = zhnlp.pipeline("sentiment-analysis", directory, max_length=16)
    ids = [tokenizer.cls_token_id, *tokenizer.convert_tokens_to_ids(list(text[:14])), tokenizer.sep_token_id]
    with torch.no_grad():
        probs = torch.softmax(hf(torch.tensor([ids])).logits[0], -1)
    [result] = classify(text)
    assert result == {"label": SENTIMENT[int(probs.argmax())], "score": pytest.approx(float(probs.max()), abs=1e-5)}
    # the model has 128 positions: a larger max_length is capped, so a 280-character text still runs
    assert zhnlp.pipeline("sentiment-analysis", directory, max_length=512).max_length == 128
    assert zhnlp.pipeline("sentiment-analysis", directory)(text)[0]["label"] in SENTIMENT.values()


def test_batches_equal_one_by_one(models):
    directory, _ = models["seq"]
    one = zhnlp.pipeline("sentiment-analysis", directory, batch_size=1)
    many = zhnlp.pipeline("sentiment-analysis", directory, batch_size=3)  # 4 texts: batches of 3 and 1
    batched = many(TEXTS)
    assert len(batched) == len(TEXTS)
    for text, result in zip(TEXTS, batched):
        [single] = one(text)
        assert result["label"] == single["label"]
        assert result["score"] == pytest.approx(single["score"], abs=1e-5)


# ---------------------------------------------------------------------------------------------- fill-mask
def test_fill_mask_top1_is_the_argmax_of_a_direct_forward(models, tokenizer):
    directory, hf = models["mlm"]
    fill = zhnlp.pipeline("fill-mask", directory)
    text = "北京是中国的[MASK]都。"
    out, enc = _hf_forward(hf, tokenizer, text)
    position = enc["input_ids"][0].tolist().index(tokenizer.mask_token_id)
    probs = torch.softmax(out.logits[0, position], -1)
    candidates = fill(text)
    assert len(candidates) == 5
    best = candidates[0]
    assert best["token"] == int(probs.argmax())  # the id, as in transformers; token_str is its text
    assert best["token_str"] == tokenizer.decode([best["token"]])
    assert best["score"] == pytest.approx(float(probs.max()), abs=1e-5)
    assert [c["token"] for c in candidates] == probs.topk(5).indices.tolist()
    filled = best["token_str"].removeprefix("##")
    assert best["sequence"] == "北京是中国的" + filled + "都。"
    assert len(fill(text, top_k=2)) == 2


def test_fill_mask_several_masks_and_batches(models, tokenizer):
    directory, hf = models["mlm"]
    text = "[MASK]天天气很[MASK]。"
    out, enc = _hf_forward(hf, tokenizer, text)
    positions = [i for i, t in enumerate(enc["input_ids"][0].tolist()) if t == tokenizer.mask_token_id]
    per_mask = zhnlp.pipeline("fill-mask", directory, top_k=3)(text)
    assert len(per_mask) == 2 and all(len(c) == 3 for c in per_mask)
    for m, (position, candidates) in enumerate(zip(positions, per_mask)):
        assert candidates[0]["token"] == int(out.logits[0, position].argmax())
        token = candidates[0]["token_str"].removeprefix("##")
        expected = token + "天天气很[MASK]。" if m == 0 else "[MASK]天天气很" + token + "。"
        assert candidates[0]["sequence"] == expected
    texts = ["我爱[MASK]京", text, "[MASK]"]
    batched = zhnlp.pipeline("fill-mask", directory, batch_size=3)(texts)
    singles = [zhnlp.pipeline("fill-mask", directory, batch_size=1)(t) for t in texts]
    assert len(batched) == 3
    json.dumps(batched)  # plain Python types only
    for b, s in zip(batched, singles):
        assert _ids(b) == _ids(s)


def _ids(result):
    return [_ids(r) for r in result] if isinstance(result[0], list) else [c["token"] for c in result]


def test_fill_mask_without_a_mask_is_a_clear_error(models):
    fill = zhnlp.pipeline("fill-mask", models["mlm"][0])
    with pytest.raises(ValueError, match=r"no mask token .*\[MASK\]"):
        fill("北京是中国的首都。")
    with pytest.raises(ValueError, match="beyond max_length"):
        zhnlp.pipeline("fill-mask", models["mlm"][0], max_length=10)("一二三四五六七八九十[MASK]")


# ---------------------------------------------------------------------------------------------- segmentation
def test_word_segmentation_equals_zhnlp_segment(tmp_path):
    cut = zhnlp.pipeline("word-segmentation")
    texts = ["我来到北京清华大学", "他来到了网易杭研大厦", "小明硕士毕业于中国科学院计算所，后在日本京都大学深造"]
    for text, result in zip(texts, cut(texts)):
        assert result["words"] == zhnlp.segment(text)
        assert [text[s:e] for s, e in result["offsets"]] == result["words"]
        assert result["offsets"][-1][1] == len(text)
    assert zhnlp.pipeline("word-segmentation", hmm=False)(texts[1])["words"] == zhnlp.segment(texts[1], hmm=False)
    userdict = tmp_path / "user.txt"
    userdict.write_text("杭研大厦 10\n", encoding="utf-8")
    words = zhnlp.pipeline("word-segmentation", userdict=userdict)(texts[1])["words"]
    assert "杭研大厦" in words and "杭研大厦" not in zhnlp.segment(texts[1])
    with pytest.raises(ValueError, match="not a model"):
        zhnlp.pipeline("word-segmentation", "bert-base-chinese")


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_task_and_missing_model_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'summarization'.*fill-mask.*question-answering"):
        zhnlp.pipeline("summarization")
    with pytest.raises(zhnlp.ModelNotFoundError):
        zhnlp.pipeline("sentiment-analysis", tmp_path / "no-such-model")
    with pytest.raises(ValueError, match="needs a fine-tuned model"):
        zhnlp.pipeline("ner")
    with pytest.raises(TypeError, match="unknown option.*doc_stride"):
        zhnlp.pipeline("word-segmentation", doc_stride=3)


# ---------------------------------------------------------------------------------------------- command line
def _lines(capsys) -> list:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_cli_prints_one_json_line_per_text(models, capsys):
    directory = str(models["seq"][0])
    expected = zhnlp.pipeline("sentiment-analysis", directory)(TEXTS[:2])
    assert main(["predict", "sentiment-analysis", "--model", directory, *TEXTS[:2]]) == 0
    out = _lines(capsys)
    assert [r["label"] for r in out] == [r["label"] for r in expected]
    assert [r["score"] for r in out] == pytest.approx([r["score"] for r in expected], abs=1e-6)
    assert main(["predict", "text-classification", "--model", directory, "--top-k", "3", TEXTS[0]]) == 0
    assert [r["label"] for r in _lines(capsys)[0]] == [r["label"] for r in
                                                       zhnlp.pipeline("sentiment-analysis", directory)(
                                                           TEXTS[0], top_k=None)]


def test_cli_reads_stdin_and_files(models, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("sys.stdin", io.StringIO("我来到北京清华大学\n\n他来到了网易杭研大厦\n"))
    assert main(["predict", "word-segmentation"]) == 0
    out = capsys.readouterr().out
    assert "清华大学" in out  # ensure_ascii=False: the characters themselves, not \u escapes
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[1] is None  # the blank line: a null line, so output line N answers input line N
    assert [lines[0]["words"], lines[2]["words"]] == [zhnlp.segment("我来到北京清华大学"), zhnlp.segment("他来到了网易杭研大厦")]
    file = tmp_path / "in.txt"
    file.write_text("巴黎是法国的[MASK]都。\n", encoding="utf-8")
    directory = str(models["mlm"][0])
    assert main(["predict", "fill-mask", "--model", directory, "--input", str(file), "--top-k", "2"]) == 0
    (result,) = _lines(capsys)
    assert _ids(result) == _ids(zhnlp.pipeline("fill-mask", directory, top_k=2)("巴黎是法国的[MASK]都。"))
    monkeypatch.setattr("sys.stdin", io.StringIO("我爱[MASK]京\n"))
    assert main(["predict", "fill-mask", "--model", directory, "--input", "-", "--top-k", "1"]) == 0
    assert len(_lines(capsys)[0]) == 1


def test_cli_reports_bad_inputs_by_line(models, capsys, tmp_path):
    file = tmp_path / "in.txt"
    file.write_text("我爱[MASK]京\n没有掩码的句子\n", encoding="utf-8")
    assert main(["predict", "fill-mask", "--model", str(models["mlm"][0]), "--input", str(file)]) == 2
    captured = capsys.readouterr()
    assert f"{file}:2: no mask token" in captured.err
    assert captured.out == ""  # inputs are checked as they are read: the bad line stops its batch before it runs
    # usage mistakes: one line, exit 2 (main returns the status instead of raising SystemExit)
    assert main(["predict", "word-segmentation", "--top-k", "3", "文本"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zhnlp: error:") and "--top-k does not apply" in err and err.count("\n") == 1
    assert main(["predict", "summarization", "文本"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zhnlp: error: argument TASK: invalid choice: 'summarization'") and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------- question answering
QUESTION, CONTEXT = "长城有多长？", "长城东起山海关，西至嘉峪关，全长两万多公里。"  # 21 context tokens: decode sees all


def _fake_forward(start_token: int, end_token: int, num_labels: int | None = None):
    """A forward that puts the span mass on the context tokens ``start_token`` .. ``end_token`` (token ids)."""
    from zhnlp.models.common.pretrained import ModelOutput

    def forward(input_ids, attention_mask=None, token_type_ids=None, **_):
        in_context = token_type_ids == 1
        start = torch.where((input_ids == start_token) & in_context, 10.0, 0.0)
        end = torch.where((input_ids == end_token) & in_context, 10.0, 0.0)
        return ModelOutput(start_logits=start, end_logits=end)
    return forward


def test_qa_answer_is_the_argmax_span_of_a_direct_forward(models, tokenizer):
    directory, hf = models["qa"]
    qa = zhnlp.pipeline("question-answering", directory)
    enc = tokenizer(QUESTION, CONTEXT, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        out = hf(**enc)
    start_logits, end_logits = out.start_logits[0], out.end_logits[0]
    context_tokens = [i for i, t in enumerate(enc["token_type_ids"][0].tolist()) if t == 1][:-1]  # drop [SEP]
    s, e = max(((s, e) for s in context_tokens for e in context_tokens if s <= e),
               key=lambda p: float(start_logits[p[0]] + end_logits[p[1]]))
    p_start = torch.softmax(start_logits[context_tokens], -1)[context_tokens.index(s)]
    p_end = torch.softmax(end_logits[context_tokens], -1)[context_tokens.index(e)]
    result = qa({"question": QUESTION, "context": CONTEXT})
    assert (result["start"], result["end"]) == (offsets[s][0], offsets[e][1])
    assert result["answer"] == CONTEXT[result["start"]:result["end"]]
    assert result["score"] == pytest.approx(float(p_start * p_end), abs=1e-5)
    assert qa(question=QUESTION, context=CONTEXT) == result
    ranked = qa(question=QUESTION, context=CONTEXT, top_k=3)
    assert len(ranked) == 3 and ranked[0] == result
    assert len({(r["start"], r["end"]) for r in ranked}) == 3
    assert all(r["answer"] == CONTEXT[r["start"]:r["end"]] for r in ranked)


def test_qa_long_context_answers_from_a_later_window(models, tokenizer, monkeypatch):
    qa = zhnlp.pipeline("question-answering", models["qa"][0], max_length=64, doc_stride=32)
    filler = "春天来了，山上的花都开了，小河里的水也变得清澈起来。"
    context = filler * 8 + "八达岭长城是明代修建的。" + filler * 2
    answer_start = context.index("长城")
    assert answer_start > 3 * 64  # far beyond the first window
    long_id, wall_id = tokenizer.convert_tokens_to_ids(["长", "城"])
    monkeypatch.setattr(qa.model, "forward", _fake_forward(long_id, wall_id))
    result = qa(question="哪里有长城？", context=context)  # the question's 长城 is not context: no mass there
    assert result["answer"] == "长城"
    assert (result["start"], result["end"]) == (answer_start, answer_start + 2)
    assert result["score"] > 0.99
    # several inputs in one batch and one by one give the same answers
    inputs = [{"question": "哪里有长城？", "context": c} for c in (context, "长城很长。", "没有答案的上下文长")]
    one_by_one = [qa(x) for x in inputs]
    qa.batch_size = 3
    assert qa(inputs) == one_by_one
    assert one_by_one[1]["answer"] == "长城" and one_by_one[1]["start"] == 0
    assert one_by_one[2]["answer"] == "长"  # start and end on the same token


def test_qa_batches_and_cli(models, capsys, tmp_path):
    directory = str(models["qa"][0])
    inputs = [{"question": QUESTION, "context": CONTEXT}, {"question": "谁发明了造纸术？", "context": "东汉的蔡伦改进了造纸术。"},
              {"question": "为什么？", "context": "因为" + CONTEXT * 12}]
    one = zhnlp.pipeline("question-answering", directory, max_length=48, batch_size=1)
    many = zhnlp.pipeline("question-answering", directory, max_length=48, batch_size=4)
    singles, batched = [one(x) for x in inputs], many(inputs)
    for a, b in zip(singles, batched):
        assert (a["answer"], a["start"], a["end"]) == (b["answer"], b["start"], b["end"])
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
    file = tmp_path / "qa.jsonl"
    file.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in inputs), encoding="utf-8")
    assert main(["predict", "question-answering", "--model", directory, "--max-length", "48",
                 "--input", str(file)]) == 0
    assert [r["answer"] for r in _lines(capsys)] == [r["answer"] for r in singles]
    file.write_text('{"question": "q", "context": "c"}\n{"question": "q"}\n', encoding="utf-8")
    assert main(["predict", "question-answering", "--model", directory, "--input", str(file)]) == 2
    assert f"{file}:2: a question-answering input is a dict with 'question' and 'context'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- NER
def _tagging_forward(tags_by_token: dict[int, int]):
    """A forward whose argmax tag is ``tags_by_token[token id]`` (label 0, O, for other tokens), logit 10."""
    from zhnlp.models.common.pretrained import ModelOutput

    def forward(input_ids, attention_mask=None, token_type_ids=None, **_):
        logits = torch.zeros(*input_ids.shape, len(NER_LABELS))
        labels = torch.tensor([tags_by_token.get(int(t), 0) for t in input_ids.flatten()]).view(input_ids.shape)
        return ModelOutput(logits=logits.scatter(-1, labels.unsqueeze(-1), 10.0))
    return forward


def test_ner_offsets_point_at_the_entities(models, tokenizer, monkeypatch):
    ner = zhnlp.pipeline("ner", models["ner"][0], max_length=24, stride=4, aggregation_strategy="simple")
    ids = dict(zip("张三北京", tokenizer.convert_tokens_to_ids(list("张三北京"))))
    monkeypatch.setattr(ner.model, "forward", _tagging_forward(
        {ids["张"]: 1, ids["三"]: 2, ids["北"]: 3, ids["京"]: 4}))
    text = "Hi 2024年, 张三 在北京工作。" + "今天的天气很好，我们一起去公园散步吧。" * 3 + "张三回北京了"
    result = ner(text)
    confident = float(torch.softmax(torch.tensor([10.0, 0, 0, 0, 0]), 0)[0])
    expected = []
    for word, kind in (("张三", "PER"), ("北京", "LOC")):
        for start in (text.index(word), text.rindex(word)):
            expected.append({"entity_group": kind, "word": word, "start": start, "end": start + 2,
                             "score": pytest.approx(confident, abs=1e-6)})
    assert result == sorted(expected, key=lambda e: e["start"])
    assert text.rindex("张三") > 3 * 24  # the last entities come from a later window
    assert all(text[e["start"]:e["end"]] == e["word"] for e in result)
    assert ner(["", "没有实体", text]) == [[], [], result]


def test_ner_matches_a_direct_forward(models, tokenizer):
    from zhnlp.metrics.ner import entities

    directory, hf = models["ner"]
    ner = zhnlp.pipeline("ner", directory, aggregation_strategy="simple")
    texts = ["王小明在上海市浦东新区的一家公司上班。", "中国科学院计算技术研究所位于北京海淀区。", "好"]
    results = ner(texts)
    assert sum(map(len, results)) > 0, "the random model should find some entities"
    for text, result in zip(texts, results):
        out, _ = _hf_forward(hf, tokenizer, text)  # one token per character, between [CLS] and [SEP]
        probs = torch.softmax(out.logits[0, 1:-1], -1)
        tags = [NER_LABELS[int(i)] for i in probs.argmax(-1)]
        expected = [{"entity_group": kind, "word": text[s:e], "start": s, "end": e,
                     "score": pytest.approx(float(probs[s:e].max(-1).values.mean()), abs=1e-5)}
                    for kind, s, e in entities(tags)]
        assert result == expected
    # batching changes nothing but the last bits of the scores (BLAS sums a batch of 2 in another order)
    single, batched = [ner(t) for t in texts], zhnlp.pipeline("ner", directory, batch_size=2,
                                                              aggregation_strategy="simple")(texts)
    assert [[{**e, "score": pytest.approx(e["score"], abs=1e-6)} for e in r] for r in single] == batched


def test_ner_cli_and_bad_label_names(models, capsys, tmp_path):
    directory = str(models["ner"][0])
    text = "王小明在上海市浦东新区的一家公司上班。"
    assert main(["predict", "token-classification", "--model", directory, text]) == 0
    (printed,) = _lines(capsys)  # per token by default, as transformers
    assert [(e["entity"], e["index"], e["start"], e["end"]) for e in printed] == [
        (e["entity"], e["index"], e["start"], e["end"]) for e in zhnlp.pipeline("ner", directory)(text)]
    assert main(["predict", "ner", "--model", directory, "--aggregation-strategy", "simple", text]) == 0
    (printed,) = _lines(capsys)
    assert [(e["entity_group"], e["start"], e["end"]) for e in printed] == [
        (e["entity_group"], e["start"], e["end"])
        for e in zhnlp.pipeline("ner", directory, aggregation_strategy="simple")(text)]
    _build(tmp_path / "plain", "ner", num_labels=3)  # LABEL_0.. names: not tags
    with pytest.raises(ValueError, match="does not name BIO/BMES tags"):
        zhnlp.pipeline("ner", tmp_path / "plain")
