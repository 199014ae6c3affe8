"""Pipelines refuse what a new user gets wrong with one clear line: a model whose task head was never trained, a
tokenizer the model has no embeddings for, empty or mistyped inputs and options; and they say when they cut a
question. Tiny random BERTs with the bert-base-chinese vocabulary, as in test_pipelines."""

from __future__ import annotations

import json
import logging

import pytest
import transformers

import zhnlp
from tests.unit.test_pipelines import NER_LABELS, SENTIMENT, VOCAB, _build
from zhnlp.cli import main
from zhnlp.errors import CheckpointError
from zhnlp.tokenizers.wordpiece import WordPieceTokenizer


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline-input-models")
    zhnlp.distributed.init()
    for name, head, extra in [("seq", "seq", {"id2label": SENTIMENT}), ("qa", "qa", {}), ("mlm", "mlm", {}),
                              ("ner", "ner", {"id2label": NER_LABELS})]:
        _build(root / name, name if name != "seq" else head, **extra)
    return root


# ---------------------------------------------------------------------------------------------- untrained heads
@pytest.mark.parametrize("task, checkpoint, weights, fix", [
    ("sentiment-analysis", "mlm", "classifier.weight", "zhnlp finetune classification --model {d} ..."),
    ("question-answering", "seq", "qa_outputs.weight", "zhnlp finetune mrc --model {d} ..."),
    ("ner", "qa", "classifier.weight", "zhnlp finetune ner --model {d} ..."),
    ("fill-mask", "qa", "cls.predictions.bias", "a checkpoint saved with its masked-LM head (such as "
                                                "bert-base-chinese)"),
])
def test_a_freshly_initialised_head_is_refused_unless_allowed(models, task, checkpoint, weights, fix):
    directory = models / checkpoint
    with pytest.raises(CheckpointError) as e:
        zhnlp.pipeline(task, directory)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{directory} has no weights for the ")
    assert weights in message and "outputs would be random" in message
    assert fix.format(d=directory) in message
    assert message.endswith("or pass allow_untrained=True (zhnlp predict --allow-untrained) to run it untrained.")


def test_allow_untrained_runs_it_and_trained_heads_need_nothing(models):
    untrained = zhnlp.pipeline("sentiment-analysis", models / "mlm", allow_untrained=True)
    assert untrained.model.fresh_weights and untrained("很好")[0]["label"].startswith("LABEL_")
    for task, directory in [("sentiment-analysis", "seq"), ("question-answering", "qa"), ("fill-mask", "mlm"),
                            ("ner", "ner")]:
        assert zhnlp.pipeline(task, models / directory).model.fresh_weights == []


def test_cli_refuses_an_untrained_head_in_one_line_and_allow_untrained_runs_it(models, capsys):
    directory = str(models / "mlm")
    assert main(["predict", "sentiment-analysis", "--model", directory, "很好"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zhnlp: error: {directory} has no weights for the sequence-classification head")
    assert err.count("\n") == 1 and "--allow-untrained" in err
    assert main(["predict", "sentiment-analysis", "--model", directory, "--allow-untrained", "很好"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert set(json.loads(line)) == {"label", "score"}
    assert main(["predict", "word-segmentation", "--allow-untrained", "我来到北京"]) == 0  # accepted, nothing to allow
    capsys.readouterr()


def test_a_tokenizer_with_ids_beyond_the_model_vocabulary_is_refused(tmp_path):
    config = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64, id2label=SENTIMENT)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "small")
    WordPieceTokenizer.from_vocab(VOCAB).save_pretrained(tmp_path / "small")  # 21,128 tokens
    with pytest.raises(CheckpointError, match=rf"the tokenizer in {tmp_path / 'small'} has 21128 tokens .* but the "
                                              r"model's vocab_size is 300"):
        zhnlp.pipeline("sentiment-analysis", tmp_path / "small")


# ---------------------------------------------------------------------------------------------- question answering
def test_a_question_longer_than_its_budget_is_cut_with_a_warning(models, caplog):
    qa = zhnlp.pipeline("question-answering", models / "qa", max_length=32)  # questions: at most 32 // 2 tokens
    question = "长城东起山海关西至嘉峪关全长多少公里呢"  # 19 characters, 19 tokens
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        answer = qa(question=question, context="长城全长两万多公里。")
    assert answer["answer"]
    [record] = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"question-answering: the question {question[:30]!r} has 19 tokens; it was truncated to its first 16 "
        f"(max_query_len, at most max_length // 2 = 16); shorten the question, or raise max_query_len (and "
        f"max_length).")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        qa(question="长城多长？", context="长城全长两万多公里。", max_query_len=4)
        qa(question="长城多长", context="长城全长两万多公里。", max_query_len=4)  # exactly 4: nothing cut
    assert [r.getMessage().split(" has ")[1][:9] for r in caplog.records if "truncated" in r.getMessage()] == [
        "5 tokens;"]


@pytest.mark.parametrize("item, error, message", [
    ({"question": "", "context": "长城很长。"}, ValueError, "the question is empty"),
    ({"question": " \t", "context": "长城很长。"}, ValueError, "the question is empty"),
    ({"question": "多长？", "context": "  "}, ValueError, "the context is empty"),
    ({"question": None, "context": "长城很长。"}, TypeError, "'question' must be a string, got NoneType"),
    ({"question": "多长？", "context": 3}, TypeError, "'context' must be a string, got int"),
    ({"question": "多长？"}, ValueError, "a question-answering input is a dict with 'question' and 'context'"),
    ("多长？", ValueError, "a question-answering input is a dict with 'question' and 'context', got str"),
])
def test_qa_inputs(models, item, error, message):
    qa = zhnlp.pipeline("question-answering", models / "qa")
    with pytest.raises(error, match=message):
        qa(item)


def test_qa_keyword_inputs_and_options(models):
    qa = zhnlp.pipeline("question-answering", models / "qa")
    with pytest.raises(ValueError, match="question= is missing; pass both question= and context="):
        qa(context="长城很长。")
    with pytest.raises(ValueError, match="context= is missing"):
        qa(question="多长？")
    with pytest.raises(ValueError, match="got an empty list of inputs"):
        qa(question=[], context=[])
    with pytest.raises(ValueError, match=r"top_k must be a positive integer \(1: one answer\), got True"):
        qa(question="多长？", context="长城很长。", top_k=True)
    with pytest.raises(ValueError, match="top_k must be a positive integer .* got None"):
        qa(question="多长？", context="长城很长。", top_k=None)
    with pytest.raises(ValueError, match="handle_impossible_answer must be True or False, got 'yes'"):
        qa(question="多长？", context="长城很长。", handle_impossible_answer="yes")
    with pytest.raises(ValueError, match="doc_stride must be a positive integer, got 0"):
        qa(question="多长？", context="长城很长。", doc_stride=0)


def test_cli_names_the_line_of_an_empty_question(models, capsys, tmp_path):
    file = tmp_path / "qa.jsonl"
    file.write_text(json.dumps({"question": "多长？", "context": "长城很长。"}, ensure_ascii=False) + "\n"
                    + json.dumps({"question": " ", "context": "长城很长。"}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    assert main(["predict", "question-answering", "--model", str(models / "qa"), "--input", str(file)]) == 2
    captured = capsys.readouterr()
    assert f"{file}:2: the question is empty" in captured.err and captured.err.count("\n") == 1


# ---------------------------------------------------------------------------------------------- other inputs
def test_text_inputs_a_new_user_gets_wrong(models):
    classify = zhnlp.pipeline("sentiment-analysis", models / "seq")
    cases = [
        ([], ValueError, "the 'sentiment-analysis' pipeline got an empty list of inputs"),
        ("", ValueError, r"the text is empty \(or only whitespace\); there is nothing to classify"),
        ("  \n", ValueError, "the text is empty"),
        ({"text": "好", "text_pair": " "}, ValueError, "'text_pair' is empty"),
        ({"text": None}, TypeError, "'text' and 'text_pair' must be strings, got NoneType and NoneType"),
        (None, TypeError, "text classification takes a string .* got NoneType"),
        (["好", 3], TypeError, "got int"),
        ('{"text": "很好", "label": 1}', ValueError, r"the input is a JSON object with keys \['label', 'text'\], but "
                                                    "text classification takes plain text; pass the text itself"),
        ({"question": "谁", "context": "我"}, ValueError, "has the keys 'text' and optionally 'text_pair'"),
    ]
    for item, error, message in cases:
        with pytest.raises(error, match=message):
            classify(item)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['context'\] for the 'sentiment-analysis' pipeline "
                                        r"\(question= and context= are for the 'question-answering' pipeline\)"):
        classify("好", context="我")
    with pytest.raises(ValueError, match="top_k must be None .* got True"):
        classify("好", top_k=True)
    with pytest.raises(ValueError, match=r"question-answering pipeline\)"):
        zhnlp.pipeline("ner", models / "ner")('{"question": "谁", "context": "张三"}')
    assert classify(["好", "差"]) and zhnlp.pipeline("ner", models / "ner")("") == []  # an empty text: no entities


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ({"batch_size": True}, "batch_size must be a positive integer, got True"),
    ({"max_length": 4}, "max_length must be an integer of at least 8 tokens, got 4"),
    ({"max_length": 8}, r"stride=32 \(the overlap of consecutive windows\) must be smaller than the 6 sub-tokens a "
                        r"window of max_length=8 holds; pass stride=1 or raise max_length"),
])
def test_sizes_are_checked_when_the_pipeline_is_built(models, kwargs, message):
    with pytest.raises(ValueError, match=message):
        zhnlp.pipeline("ner", models / "ner", **kwargs)


def test_fill_mask_and_word_segmentation_options(models):
    with pytest.raises(ValueError, match="top_k must be a positive integer, got True"):
        zhnlp.pipeline("fill-mask", models / "mlm", top_k=True)
    with pytest.raises(ValueError, match="got an empty list of inputs"):
        zhnlp.pipeline("word-segmentation")([])
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got False"):
        zhnlp.pipeline("word-segmentation", batch_size=False)
