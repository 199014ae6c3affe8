"""zhnlp's pipelines return what transformers' pipelines return for the same task: the same keys with the same
meanings, the same shapes for one input and for a list, scores within 1e-5. Both load the same tiny random BERT
directory (bert-base-chinese vocabulary). Where zhnlp differs on purpose the test says so: Chinese-friendly
``word``/``sequence`` without spaces between characters, Python floats instead of numpy.float32.

Also: device=, dtype= and model objects, Taskflow's task names, and `zhnlp predict`'s one line per input line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import transformers

import zhnlp
from tests.unit.test_pipelines import NER_LABELS, SENTIMENT, _build
from zhnlp.cli import main

NER_TEXTS = ["王小明在上海市浦东新区的一家公司上班。", "中国科学院计算技术研究所位于北京海淀区，张三😀在那里工作。", "好"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("convention-models")
    zhnlp.distributed.init()
    for name, head, extra in [("seq", "seq", {"id2label": SENTIMENT}), ("mlm", "mlm", {}),
                              ("ner", "ner", {"id2label": NER_LABELS}), ("qa", "qa", {})]:
        _build(root / name, head, **extra)
    return root


def _hf(task, directory, **kwargs):
    return transformers.pipeline(task, model=str(directory), tokenizer=str(directory), **kwargs)


def _same(ours, theirs, path="result", word=None, tol=1e-5):
    """Same structure, keys and types (numpy scalars count as the Python type zhnlp returns), equal values,
    floats within ``tol``; ``word(key, ours, theirs)`` may relax the comparison of one key."""
    if isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), f"{path}: {ours!r} vs {theirs!r}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{path}[{i}]", word, tol)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), f"{path}: keys {list(ours)} vs {list(theirs)}"
        for key in theirs:
            if word is not None and word(key, ours[key], theirs[key]):
                continue
            _same(ours[key], theirs[key], f"{path}.{key}", word, tol)
    elif isinstance(theirs, (float, np.floating)):
        assert type(ours) is float, f"{path}: {type(ours).__name__}, expected a float"
        assert math.isclose(ours, float(theirs), abs_tol=tol), f"{path}: {ours} vs {theirs}"
    else:
        assert type(ours) is type(theirs.item() if isinstance(theirs, np.generic) else theirs), path
        assert ours == theirs, f"{path}: {ours!r} vs {theirs!r}"


def _spaced_word(key, ours, theirs):
    """zhnlp's grouped ``word`` is ``text[start:end]`` ("小明"); transformers joins the tokens with spaces."""
    if key != "word":
        return False
    assert ours == theirs.replace(" ", ""), f"word {ours!r} vs {theirs!r}"
    return True


# ---------------------------------------------------------------------------------------------- NER
def test_ner_per_token_by_default_like_transformers(models):
    ours, theirs = zhnlp.pipeline("ner", models / "ner"), _hf("token-classification", models / "ner")
    results = ours(NER_TEXTS)
    assert sum(map(len, results)) > 5
    for text, result in zip(NER_TEXTS, results):
        _same(result, theirs(text))  # keys entity, score, index, word, start, end, in that order
        assert set(result[0]) == {"entity", "score", "index", "word", "start", "end"} if result else True
    assert any(e["word"] == "😀" for e in ours(NER_TEXTS[1], ignore_labels=[]))  # [UNK]: the text itself
    _same(ours(NER_TEXTS[1], ignore_labels=[]), theirs(NER_TEXTS[1], ignore_labels=[]))
    _same(ours(NER_TEXTS[0]), results[0])  # one input: its list; a list: a list of lists


@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
def test_ner_aggregation_strategies_like_transformers(models, strategy):
    ours = zhnlp.pipeline("ner", models / "ner", aggregation_strategy=strategy)
    theirs = _hf("ner", models / "ner", aggregation_strategy=strategy)
    grouped = 0
    for text in NER_TEXTS:
        result = ours(text)
        _same(result, theirs(text), word=_spaced_word)
        assert all(e["word"] == text[e["start"]:e["end"]] for e in result)
        grouped += sum(e["end"] - e["start"] > 1 for e in result)
        _same(ours(text, ignore_labels=[]), theirs(text, ignore_labels=[]), word=_spaced_word)
    assert grouped > 0, "some entity should span several characters, or grouping is not tested"
    # per call as well as per pipeline
    _same(zhnlp.pipeline("ner", models / "ner")(NER_TEXTS[0], aggregation_strategy=strategy), ours(NER_TEXTS[0]))


def test_ner_long_texts_use_windows_and_keep_offsets(models):
    text = NER_TEXTS[0] * 12  # 228 characters: windows of 64 tokens
    whole = zhnlp.pipeline("ner", models / "ner", max_length=128, aggregation_strategy="simple")
    windows = zhnlp.pipeline("ner", models / "ner", max_length=64, stride=16, aggregation_strategy="simple")
    result = windows(text)
    assert result and all(e["word"] == text[e["start"]:e["end"]] for e in result)
    assert max(e["end"] for e in result) > 128  # entities past the first window
    per_token = zhnlp.pipeline("ner", models / "ner", max_length=64, stride=16)(text)
    assert [e["index"] for e in per_token] == sorted({e["index"] for e in per_token})  # one result per token
    assert all(text[e["start"]:e["end"]] == e["word"] for e in per_token)
    assert whole(text[:100])  # a text in one window gives results too


def test_ner_options_are_checked(models):
    with pytest.raises(ValueError, match="aggregation_strategy must be one of 'none', 'simple', 'first', 'average', "
                                         "'max', got 'mean'"):
        zhnlp.pipeline("ner", models / "ner", aggregation_strategy="mean")
    with pytest.raises(TypeError, match="ignore_labels must be a list of tag names"):
        zhnlp.pipeline("ner", models / "ner")("好", ignore_labels="O")
    from transformers.pipelines.token_classification import AggregationStrategy

    assert zhnlp.pipeline("ner", models / "ner", aggregation_strategy=AggregationStrategy.SIMPLE).options[
        "aggregation_strategy"] == "simple"


# ---------------------------------------------------------------------------------------------- fill-mask
def _unspaced_sequence(key, ours, theirs):
    """zhnlp's ``sequence`` is the caller's string with the token in place of the mask, no spaces between
    characters; transformers decodes the ids ("北 京 是 中 国 的 首 都 。")."""
    if key != "sequence":
        return False
    assert ours == theirs.replace(" ", ""), f"sequence {ours!r} vs {theirs!r}"
    return True


def test_fill_mask_like_transformers(models):
    ours, theirs = zhnlp.pipeline("fill-mask", models / "mlm"), _hf("fill-mask", models / "mlm")
    text = "北京是中国的[MASK]都。"
    _same(ours(text), theirs(text), word=_unspaced_sequence)  # score, token (the id), token_str, sequence
    assert type(ours(text)[0]["token"]) is int and isinstance(ours(text)[0]["token_str"], str)
    _same(ours(text, top_k=2), theirs(text, top_k=2), word=_unspaced_sequence)
    for targets in (["首", "大", "北"], "首"):
        _same(ours(text, targets=targets), theirs(text, targets=targets), word=_unspaced_sequence)
    _same(ours(text, targets=["首", "大"], top_k=1), theirs(text, targets=["首", "大"], top_k=1),
          word=_unspaced_sequence)
    texts = [text, "我爱[MASK]京天安门。"]
    _same(ours(texts), theirs(texts), word=_unspaced_sequence)


def test_fill_mask_several_masks_like_transformers(models):
    ours, theirs = zhnlp.pipeline("fill-mask", models / "mlm"), _hf("fill-mask", models / "mlm")
    text = "北京是[MASK]国的[MASK]都。"
    mine = ours(text, top_k=2)

    def sequence(key, a, b):  # transformers keeps [CLS]/[SEP] (and the other mask) when there are several
        if key != "sequence":
            return False
        assert a == b.replace(" ", "").removeprefix("[CLS]").removesuffix("[SEP]")
        return True
    _same(mine, theirs(text, top_k=2), word=sequence)
    assert mine[0][0]["sequence"].count("[MASK]") == 1


def test_fill_mask_targets_outside_the_vocabulary(models, caplog):
    fill = zhnlp.pipeline("fill-mask", models / "mlm")
    with caplog.at_level("WARNING", logger="zhnlp"):
        result = fill("北京是中国的[MASK]都。", targets=["首", "zz"])
    assert "'zz' is not in the vocabulary; ranking its first token 'z' instead" in caplog.text
    assert {r["token_str"] for r in result} == {"首", "z"}
    with pytest.raises(ValueError, match="targets must be a token or a non-empty list of tokens"):
        fill("北京是中国的[MASK]都。", targets=[])


# ---------------------------------------------------------------------------------------------- classification
def test_text_classification_like_transformers(models):
    ours = zhnlp.pipeline("text-classification", models / "seq")
    theirs = _hf("text-classification", models / "seq")
    pair = {"text": "今天天气怎么样", "text_pair": "今天天气如何"}
    for inputs in ["很好吃", ["很好吃", "太难吃了"], pair, [pair, {"text": "好"}]]:
        _same(ours(inputs), theirs(inputs))
        for top_k in (None, 1, 2):
            _same(ours(inputs, top_k=top_k), theirs(inputs, top_k=top_k))
        for function in ("softmax", "sigmoid", "none"):
            _same(ours(inputs, function_to_apply=function), theirs(inputs, function_to_apply=function))
            _same(ours(inputs, function_to_apply=function, top_k=None),
                  theirs(inputs, function_to_apply=function, top_k=None))
    assert isinstance(ours("很好吃"), list) and isinstance(ours(pair), dict)
    with pytest.raises(ValueError, match="function_to_apply must be one of 'default', 'sigmoid', 'softmax', 'none'"):
        ours("很好吃", function_to_apply="relu")


def test_single_label_and_regression_heads_pick_transformers_default_function(models, tmp_path):
    for extra, expected in [({"num_labels": 1}, "sigmoid"), ({"num_labels": 1, "problem_type": "regression"}, "none")]:
        directory = tmp_path / expected
        _build(directory, "seq", **extra)
        ours, theirs = zhnlp.pipeline("text-classification", directory), _hf("text-classification", directory)
        _same(ours(["很好吃", "太难吃了"]), theirs(["很好吃", "太难吃了"]))
        _same(ours("很好吃"), ours("很好吃", function_to_apply=expected))


# ---------------------------------------------------------------------------------------------- question answering
QUESTION, CONTEXT = "长城有多长？", "长城东起山海关，西至嘉峪关，全长两万多公里。"


def test_qa_keys_top_k_and_handle_impossible_answer(models):
    """transformers 5 has no question-answering pipeline; these are transformers 4's conventions, checked
    against the model's own logits: the null score is P([CLS] start) * P([CLS] end) over [CLS] and the context."""
    qa = zhnlp.pipeline("question-answering", models / "qa")
    one = qa(question=QUESTION, context=CONTEXT)
    assert list(one) == ["score", "start", "end", "answer"] and one["answer"] == CONTEXT[one["start"]:one["end"]]
    ranked = qa(question=QUESTION, context=CONTEXT, top_k=3)
    assert isinstance(ranked, list) and len(ranked) == 3 and ranked[0] == one
    _same(qa([{"question": QUESTION, "context": CONTEXT}] * 2), [one, one])  # batched: the last bits differ

    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(models / "qa").eval()
    tokenizer = zhnlp.AutoTokenizer.from_pretrained(models / "qa")
    enc = tokenizer(QUESTION, CONTEXT, return_tensors="pt")
    with torch.no_grad():
        out = hf(**enc)
    keep = [0] + [i for i, t in enumerate(enc["token_type_ids"][0].tolist()) if t == 1][:-1]  # [CLS] + context
    p_start, p_end = out.start_logits[0, keep].softmax(-1), out.end_logits[0, keep].softmax(-1)
    null = float(p_start[0] * p_end[0])
    answers = qa(question=QUESTION, context=CONTEXT, handle_impossible_answer=True, top_k=300)  # every span
    blank = [a for a in answers if a["answer"] == ""]
    assert blank == [{"score": pytest.approx(null, abs=1e-6), "start": 0, "end": 0, "answer": ""}]
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    best = answers[0] if answers[0]["answer"] else answers[1]
    assert (best["start"], best["end"]) == (one["start"], one["end"])
    assert best["score"] < one["score"]  # the softmax now also covers [CLS]


def test_qa_without_an_answer_prefers_the_null_answer(models, monkeypatch):
    from zhnlp.models.common.pretrained import ModelOutput

    qa = zhnlp.pipeline("question-answering", models / "qa")

    def forward(input_ids, attention_mask=None, token_type_ids=None, **_):  # all the mass on [CLS]
        logits = torch.zeros(input_ids.shape)
        logits[:, 0] = 10.0
        return ModelOutput(start_logits=logits, end_logits=logits.clone())
    monkeypatch.setattr(qa.model, "forward", forward)
    result = qa(question=QUESTION, context=CONTEXT, handle_impossible_answer=True)
    assert result["answer"] == "" and (result["start"], result["end"]) == (0, 0) and result["score"] > 0.9
    assert qa(question=QUESTION, context=CONTEXT)["answer"]  # without the option a span is always given


# ---------------------------------------------------------------------------------------------- device, dtype, objects
@pytest.mark.skipif(torch.cuda.is_available(), reason="zhnlp models run on the GPU where there is one")
def test_device_argument_forms(models):
    directory = models / "seq"
    expected = zhnlp.pipeline("sentiment-analysis", directory)("很好吃")
    for device in ("cpu", -1, torch.device("cpu")):
        pipe = zhnlp.pipeline("sentiment-analysis", directory, device=device)
        assert pipe.device == torch.device("cpu")
        _same(pipe("很好吃"), expected)
    with pytest.raises(ValueError, match=r"device='gpu' is not a device torch knows; pass 'cpu', 'cuda'"):
        zhnlp.pipeline("sentiment-analysis", directory, device="gpu")
    with pytest.raises(ValueError, match="device=-2: use -1 for the CPU or a CUDA device index >= 0"):
        zhnlp.pipeline("sentiment-analysis", directory, device=-2)
    assert zhnlp.pipeline("word-segmentation", device="cpu", dtype="float32")("我来到北京")["words"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", 0, torch.device("cuda", 0)])
def test_a_cuda_device_without_cuda_is_one_clear_error(models, device):
    with pytest.raises(ValueError) as e:
        zhnlp.pipeline("sentiment-analysis", models / "seq", device=device)
    message = str(e.value)
    assert "was asked but torch sees no CUDA device here (torch.cuda.is_available() is False" in message
    assert message.endswith("pass device='cpu' (or -1), or run on a machine with a GPU and a CUDA build of torch.")
    assert "\n" not in message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, torch.device("cuda", 0)])
def test_cuda_device_gives_transformers_cpu_results(models, device):
    pipe = zhnlp.pipeline("ner", models / "ner", device=device)
    assert pipe.device.type == "cuda"
    _same(pipe(NER_TEXTS[0]), _hf("ner", models / "ner", device=-1)(NER_TEXTS[0]), tol=1e-4)
    model = zhnlp.AutoModelForTokenClassification.from_pretrained(models / "ner", device=device)
    _same(zhnlp.pipeline("ner", model, device=device)(NER_TEXTS[0]), pipe(NER_TEXTS[0]))


def test_dtype_argument_forms(models):
    directory = models / "seq"
    expected = zhnlp.pipeline("sentiment-analysis", directory)("很好吃")[0]
    for dtype, wanted in [("float32", torch.float32), (torch.float32, torch.float32), ("auto", torch.float32),
                          ("bfloat16", torch.bfloat16), (torch.bfloat16, torch.bfloat16)]:
        pipe = zhnlp.pipeline("sentiment-analysis", directory, dtype=dtype)
        assert pipe.dtype == wanted, dtype
        [result] = pipe("很好吃")
        assert type(result["score"]) is float  # bf16 logits come back as Python floats too
        assert result["score"] == pytest.approx(expected["score"], abs=1e-5 if wanted == torch.float32 else 3e-2)
    assert zhnlp.pipeline("sentiment-analysis", directory, torch_dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='float32' and torch_dtype='bfloat16' disagree"):
        zhnlp.pipeline("sentiment-analysis", directory, dtype="float32", torch_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"dtype 'int8' is not supported; choose one of .* or 'auto'"):
        zhnlp.pipeline("sentiment-analysis", directory, dtype="int8")


def test_dtype_auto_reads_the_checkpoint(models, tmp_path):
    directory = tmp_path / "bf16"
    hf = transformers.BertForSequenceClassification.from_pretrained(models / "seq").to(torch.bfloat16)
    hf.save_pretrained(directory)
    zhnlp.AutoTokenizer.from_pretrained(models / "seq").save_pretrained(directory)
    assert json.loads((directory / "config.json").read_text()).get("dtype") == "bfloat16"
    assert zhnlp.pipeline("sentiment-analysis", directory, dtype="auto").dtype == torch.bfloat16
    assert zhnlp.pipeline("sentiment-analysis", directory, dtype="float32").dtype == torch.float32


def test_a_model_object_instead_of_a_name(models):
    directory = models / "ner"
    model = zhnlp.AutoModelForTokenClassification.from_pretrained(directory)
    expected = zhnlp.pipeline("ner", directory)(NER_TEXTS)
    _same(zhnlp.pipeline("ner", model, tokenizer=directory)(NER_TEXTS), expected)
    _same(zhnlp.pipeline("ner", model, tokenizer=zhnlp.AutoTokenizer.from_pretrained(directory))(NER_TEXTS),
          expected)
    # without tokenizer=: the directory the model was loaded from, its name_or_path
    model.name_or_path = str(directory)
    _same(zhnlp.pipeline("token_classification", model)(NER_TEXTS), expected)
    for missing in (None, ""):  # from_config's models have name_or_path ""
        model.name_or_path = missing
        with pytest.raises(ValueError, match="given a model object without name_or_path, so it cannot find the "
                                             "model's tokenizer; pass tokenizer="):
            zhnlp.pipeline("ner", model)
    with pytest.raises(ValueError, match=r"the 'sentiment-analysis' pipeline needs a model with the "
                                         r"sequence-classification head \(zhnlp.AutoModelForSequenceClassification\), "
                                         r"got one with the 'token_classification' head"):
        zhnlp.pipeline("sentiment-analysis", model, tokenizer=directory)
    hf = transformers.BertForTokenClassification.from_pretrained(directory)
    with pytest.raises(TypeError, match="zhnlp pipelines run zhnlp models"):
        zhnlp.pipeline("ner", hf, tokenizer=directory)
    with pytest.raises(ValueError, match="dtype=torch.bfloat16 was asked but the model object's parameters are "
                                         "torch.float32"):
        zhnlp.pipeline("ner", model, tokenizer=directory, dtype="bfloat16")
    assert zhnlp.pipeline("ner", model, tokenizer=directory, dtype="auto", device=model.device).device == model.device
    other = "cpu" if model.device.type == "cuda" else "cuda"
    if other == "cpu" or torch.cuda.is_available():
        with pytest.raises(ValueError, match=f"device='{other}' was asked but the model object is on "):
            zhnlp.pipeline("ner", model, tokenizer=directory, device=other)


# ---------------------------------------------------------------------------------------------- names
@pytest.mark.parametrize("alias, task", [
    ("sentiment_analysis", "sentiment-analysis"), ("text_classification", "sentiment-analysis"),
    ("text-classification", "sentiment-analysis"), ("token_classification", "ner"), ("token-classification", "ner"),
    ("question_answering", "question-answering"), ("fill_mask", "fill-mask"),
    ("word_segmentation", "word-segmentation")])
def test_taskflow_and_transformers_names(alias, task):
    from zhnlp.pipelines import pipeline_class

    assert pipeline_class(alias) is pipeline_class(task)


def test_unknown_tasks_list_the_names():
    with pytest.raises(ValueError) as e:
        zhnlp.pipeline("information_extraction")
    message = str(e.value)
    assert message.startswith("unknown task 'information_extraction' (a PaddleNLP Taskflow task that zhnlp does not "
                              "provide); choose one of: feature-extraction, feature_extraction, fill-mask, "
                              "fill_mask, ner, question-answering")
    assert "word_segmentation" in message and "sentiment_analysis" in message
    assert zhnlp.pipeline("word_segmentation")("我来到北京清华大学")["words"] == zhnlp.segment("我来到北京清华大学")


# ---------------------------------------------------------------------------------------------- zhnlp predict
def test_predict_prints_one_line_per_input_line(models, capsys, tmp_path):
    file = tmp_path / "in.txt"
    file.write_text("\n很好吃\n  \n\n太难吃了\n\n", encoding="utf-8")  # 6 lines, 2 of them texts
    assert main(["predict", "sentiment_analysis", "--model", str(models / "seq"), "--input", str(file),
                 "--batch-size", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6
    parsed = [json.loads(line) for line in lines]
    assert [i for i, r in enumerate(parsed) if r is None] == [0, 2, 3, 5]
    expected = zhnlp.pipeline("sentiment-analysis", models / "seq")(["很好吃", "太难吃了"])
    _same([parsed[1], parsed[4]], expected)
    assert main(["predict", "ner", "--model", str(models / "ner"), "--aggregation-strategy", "first",
                 NER_TEXTS[0], " ", NER_TEXTS[1]]) == 0
    first, blank, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert blank is None
    _same([first, second], zhnlp.pipeline("ner", models / "ner", aggregation_strategy="first")(NER_TEXTS[:2]))
    assert main(["predict", "fill-mask", "--model", str(models / "mlm"), "--aggregation-strategy", "simple",
                 "我爱[MASK]京"]) == 2
    assert "--aggregation-strategy does not apply to fill-mask" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- BMES grouping
BMES = {0: "O", 1: "B-LOC", 2: "M-LOC", 3: "E-LOC", 4: "S-PER"}


def test_bmes_tags_group_into_entities(tmp_path, monkeypatch):
    """transformers reads only B-/I- prefixes; zhnlp also groups BMES: S- is a one-character entity, E- closes."""
    from zhnlp.models.common.pretrained import ModelOutput

    _build(tmp_path / "bmes", "ner", id2label=BMES)
    ner = zhnlp.pipeline("ner", tmp_path / "bmes", aggregation_strategy="simple")
    text = "李去上海市北京好"
    tags = [4, 0, 1, 2, 3, 1, 3, 0]  # 李 S-PER, 上海市 B M E, 北京 B E, 好 O
    ids = ner.tokenizer(text)["input_ids"]
    by_position = dict(zip(range(1, len(ids) - 1), tags))

    def forward(input_ids, attention_mask=None, token_type_ids=None, **_):
        logits = torch.zeros(*input_ids.shape, len(BMES))
        for position, tag in by_position.items():
            logits[0, position, tag] = 10.0
        logits[0, [0, len(ids) - 1], 0] = 10.0
        return ModelOutput(logits=logits)
    monkeypatch.setattr(ner.model, "forward", forward)
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in ner(text)] == [
        ("PER", "李", 0, 1), ("LOC", "上海市", 2, 5), ("LOC", "北京", 5, 7)]
    per_token = ner(text, aggregation_strategy="none")
    assert [e["entity"] for e in per_token] == ["S-PER", "B-LOC", "M-LOC", "E-LOC", "B-LOC", "E-LOC"]
    assert [e["index"] for e in per_token] == [1, 3, 4, 5, 6, 7]


def test_predict_task_flags(models, capsys):
    seq, mlm, qa = str(models / "seq"), str(models / "mlm"), str(models / "qa")
    assert main(["predict", "text-classification", "--model", seq, "--function-to-apply", "none", "--device", "-1",
                 "--dtype", "float32", "很好吃"]) == 0
    _same(json.loads(capsys.readouterr().out), zhnlp.pipeline("sentiment-analysis", seq)(
        "很好吃", function_to_apply="none")[0])
    assert main(["predict", "fill-mask", "--model", mlm, "--targets", "首,大", "北京是中国的[MASK]都。"]) == 0
    assert {r["token_str"] for r in json.loads(capsys.readouterr().out)} == {"首", "大"}
    line = json.dumps({"question": QUESTION, "context": CONTEXT}, ensure_ascii=False)
    assert main(["predict", "question-answering", "--model", qa, "--handle-impossible-answer", "--top-k", "2",
                 line]) == 0
    answers = json.loads(capsys.readouterr().out)
    _same(answers, zhnlp.pipeline("question-answering", qa)(question=QUESTION, context=CONTEXT, top_k=2,
                                                            handle_impossible_answer=True))
    assert main(["predict", "ner", "--model", str(models / "ner"), "--targets", "首", "文本"]) == 2
    assert "--targets does not apply to ner" in capsys.readouterr().err
    assert main(["predict", "ner", "--model", str(models / "ner"), "--device", "gpu", "文本"]) == 2
    assert "device='gpu' is not a device torch knows" in capsys.readouterr().err


def test_fill_mask_with_a_sentencepiece_tokenizer(tmp_path):
    """A SentencePiece vocabulary: token_str is the decoded piece (no "▁"), as in transformers."""
    from tests.unit.test_sentencepiece_reader import SUBJECTS, VERBS

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(s + v + "新的模型。" for s in SUBJECTS for v in VERBS) * 3, encoding="utf-8")
    tokenizer = zhnlp.tokenizers.train_sentencepiece([corpus], tmp_path / "model", vocab_size=60, num_threads=1)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=64,
                                     initializer_range=0.5)
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "model")
    ours, theirs = zhnlp.pipeline("fill-mask", tmp_path / "model"), _hf("fill-mask", tmp_path / "model")
    text = "我们研究[MASK]模型。"

    def sequence(key, a, b):
        if key != "sequence":
            return False
        assert "▁" not in a and a.startswith("我们研究") and a.endswith("模型。")
        return True
    every = len(tokenizer)  # every piece, "▁" (decoded "") among them
    assert "▁" in tokenizer.get_vocab()
    result = ours(text, top_k=every)
    _same(result, theirs(text, top_k=every), word=sequence)
    assert not any("▁" in r["token_str"] for r in result)
