"""zhnlp.metrics: classification accuracy / macro-F1, the CMRC2018 EM/F1 on hand-worked examples and on the real
trial set, NER span extraction and scores, and ``zhnlp evaluate``. Every expected number is worked out by hand in
the comment beside it."""

import doctest
import json
import re

import pytest

from zhnlp import cli
from zhnlp.errors import DataError
from zhnlp.metrics import accuracy, classification_scores, cmrc2018, entities, entity_scores, macro_f1, per_class_f1
from zhnlp.metrics.cmrc2018 import exact_match, f1_score, remove_punctuation, segment


# ================================================================ classification
LABELS = [0, 0, 1, 1, 2, 2]
PREDS = [0, 1, 1, 1, 2, 0]


def test_accuracy_and_macro_f1_by_hand():
    # correct at positions 0, 2, 3, 4 -> 4/6
    assert accuracy(PREDS, LABELS) == pytest.approx(2 / 3)
    # F1 = 2 tp / (predicted + gold): class 0: tp 1, predicted 2, gold 2 -> 1/2; class 1: tp 2, predicted 3, gold 2
    # -> 4/5; class 2: tp 1, predicted 1, gold 2 -> 2/3; mean (15 + 24 + 20) / 30 / 3 = 59/90
    assert per_class_f1(PREDS, LABELS) == pytest.approx({0: 1 / 2, 1: 4 / 5, 2: 2 / 3})
    assert macro_f1(PREDS, LABELS) == pytest.approx(59 / 90)
    assert classification_scores(PREDS, LABELS) == pytest.approx({"accuracy": 2 / 3, "macro_f1": 59 / 90,
                                                                  "total": 6})


def test_macro_f1_counts_an_absent_class_of_label_set_as_zero():
    # class 3 has no gold and no predicted item: F1 0 by convention, so the mean is (59/30 + 0) / 4 = 59/120
    assert macro_f1(PREDS, LABELS, label_set=[0, 1, 2, 3]) == pytest.approx(59 / 120)
    # a class only predicted, never gold: tp 0 -> F1 0; "neg": tp 1, predicted 1, gold 2 -> 2/3; mean 1/3
    assert macro_f1(["neg", "pos"], ["neg", "neg"]) == pytest.approx(1 / 3)
    assert macro_f1(["a", "b"], ["a", "b"]) == 1.0


def test_classification_errors():
    with pytest.raises(DataError, match=r"labels or predictions 2 are not in label_set \[0, 1\]"):
        macro_f1(PREDS, LABELS, label_set=[0, 1])
    with pytest.raises(DataError, match="5 predictions for 6 labels"):
        accuracy(PREDS[:5], LABELS)
    with pytest.raises(DataError, match="no examples"):
        macro_f1([], [])


# ================================================================ CMRC2018: segmentation
def test_segment_mixed_chinese_english_and_punctuation():
    assert segment("2008年北京奥运会") == ["2008", "年", "北", "京", "奥", "运", "会"]
    assert segment("《iPhone 7 Plus》发布") == ["《", "iphone", "7", "plus", "》", "发", "布"]
    # ASCII , . ( ) % are not in the metric's punctuation set: numbers keep their , and . and the rest are segments
    assert segment("GDP增长3.5%，约1,000亿(2019)") == ["gdp", "增", "长", "3.5", "%", "，", "约", "1,000", "亿",
                                                   "(", "2019", ")"]
    assert segment("  U.S. Open  ") == ["u.s", ".", "open"]
    assert segment("") == [] and segment(" \t") == []


def test_remove_punctuation_and_its_official_quirks():
    assert remove_punctuation(" 「甜葫芦」（Sweet-Calabash）， ") == "甜葫芦sweetcalabash"
    # inner whitespace stays (EM compares strings)
    assert remove_punctuation("iPhone 7") == "iphone 7"
    # the official list spells the ellipsis "……", which a per-character test never matches: "…" is kept
    assert remove_punctuation("好……") == "好……"
    assert segment("好…") == ["好", "…"]
    # punctuation is removed before segmenting, so the words on either side of it join (as in the official script)
    assert segment("zh-hant") == ["zh", "-", "hant"]
    assert segment(remove_punctuation("zh-hant")) == ["zhhant"]


def test_module_docstring_examples_hold():
    result = doctest.testmod(cmrc2018)
    assert result.attempted == 2 and result.failed == 0


# ================================================================ CMRC2018: EM and F1
def test_f1_uses_the_longest_common_contiguous_run_not_a_subsequence():
    # pred 北京的奥运会 (6 segments) vs ref 北京奥运会 (5): longest common run 奥运会 = 3 (北京 is 2)
    # P = 3/6, R = 3/5 -> F1 = 2 * .3 / 1.1 = 6/11. (A subsequence LCS would give 5 -> 10/11.)
    assert f1_score("北京的奥运会", ["北京奥运会"]) == pytest.approx(6 / 11)
    # an ASCII comma is not punctuation: 北京,上海 (5) vs 北京上海 (4), longest run 2 -> P 2/5, R 2/4 -> 4/9
    assert f1_score("北京,上海", ["北京上海"]) == pytest.approx(4 / 9)
    assert exact_match("北京,上海", ["北京上海"]) == 0.0


def test_prediction_inside_a_longer_answer():
    # 北京奥运会 (5) vs 2008年北京奥运会 (7 segments: 2008 年 北 京 奥 运 会): run 5 -> P 1, R 5/7 -> 5/6
    assert f1_score("北京奥运会", ["2008年北京奥运会"]) == pytest.approx(5 / 6)
    assert exact_match("北京奥运会", ["2008年北京奥运会"]) == 0.0


def test_english_words_are_segments():
    # iphone 7 plus -> 3 segments; iphone7plus -> 1 segment: nothing in common
    assert f1_score("iPhone 7 Plus", ["iphone7plus"]) == 0.0
    assert exact_match("iPhone 7 Plus", ["iphone7plus"]) == 0.0
    # lower-cased on both sides: identical
    assert f1_score("iPhone 7 Plus", ["IPHONE 7 plus"]) == 1.0
    assert exact_match("iPhone 7 Plus", ["IPHONE 7 plus"]) == 1.0
    # iphone 7 plus 手 机 (5) vs iphone 7 plus (3): run 3 -> P 3/5, R 1 -> F1 = 1.2 / 1.6 = 3/4
    assert f1_score("iPhone 7 Plus手机", ["iphone 7 plus"]) == pytest.approx(3 / 4)
    # a doubled inner space changes no segment but breaks EM, which compares strings
    assert f1_score("iPhone  7 Plus", ["iPhone 7 Plus"]) == 1.0
    assert exact_match("iPhone  7 Plus", ["iPhone 7 Plus"]) == 0.0
    assert exact_match("NBA总决赛", ["nba总决赛"]) == 1.0


@pytest.mark.parametrize("prediction, answer", [
    ("《红楼梦》", "红楼梦"),
    ("「甜葫芦」", "甜葫芦"),
    ("北京，上海。", "北京上海"),
    ("  北京、上海  ", "北京上海"),
    ("北京-上海", "北京上海"),
])
def test_punctuation_differences_do_not_count(prediction, answer):
    assert exact_match(prediction, [answer]) == 1.0
    assert f1_score(prediction, [answer]) == 1.0


def test_several_answers_the_best_one_wins():
    assert exact_match("北京奥运会", ["2008年北京奥运会", "北京奥运会", "奥运"]) == 1.0
    assert f1_score("北京奥运会", ["2008年北京奥运会", "北京奥运会", "奥运"]) == 1.0
    # pred 2008 年 的 奥 运 会 (6). vs 奥运会 (3): run 3 -> P 1/2, R 1 -> 2/3.
    # vs 2008年北京奥运会 (7): runs 2008年 (2) and 奥运会 (3) -> P 1/2, R 3/7 -> (3/7) / (13/14) = 6/13. Best: 2/3
    assert f1_score("2008年的奥运会", ["2008年北京奥运会", "奥运会"]) == pytest.approx(2 / 3)
    assert f1_score("2008年的奥运会", ["2008年北京奥运会"]) == pytest.approx(6 / 13)


def test_empty_prediction():
    assert f1_score("", ["北京"]) == 0.0 and exact_match("", ["北京"]) == 0.0
    assert f1_score("《》", ["北京"]) == 0.0 and exact_match(" 《》 ", ["北京"]) == 0.0
    # EM is 1 only when a reference is empty after stripping too; F1 stays 0 (no common segment)
    assert exact_match("", ["「」", "北京"]) == 1.0 and f1_score("", ["「」"]) == 0.0


def test_answers_must_be_a_nonempty_list():
    with pytest.raises(TypeError, match="not one string"):
        f1_score("北京", "北京")
    with pytest.raises(DataError, match="no reference answers"):
        exact_match("北京", [])


# ================================================================ CMRC2018: evaluate() and the command
def squad(*questions):
    """A SQuAD-format dict with one article holding (id, [answers]) questions."""
    qas = [{"question": "?", "id": qid, "answers": [{"text": a, "answer_start": 0} for a in answers]}
           for qid, answers in questions]
    return {"version": "v1.0", "data": [{"title": "t", "id": "A", "paragraphs": [{"context": "c", "qas": qas}]}]}


TINY = squad(("Q1 ", ["北京奥运会"]), ("Q2", ["2008年北京奥运会"]), ("Q3", ["红楼梦"]))
TINY_PREDICTIONS = {"Q1": "北京奥运会", "Q2": "北京奥运会"}  # Q3 has none; Q1's id is stripped in the dataset


def test_evaluate_on_a_tiny_dataset_with_a_missing_prediction():
    # Q1: EM 1, F1 1. Q2: EM 0, F1 5/6. Q3: skipped, 0. EM = 100/3; F1 = 100 (1 + 5/6) / 3 = 1100/18
    scores = cmrc2018.evaluate(TINY, TINY_PREDICTIONS)
    assert scores == pytest.approx({"em": 100 / 3, "f1": 1100 / 18, "total": 3, "skip": 1})


def test_evaluate_reads_a_path_and_checks_the_format(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(TINY, ensure_ascii=False), encoding="utf-8")
    assert cmrc2018.evaluate(str(path), TINY_PREDICTIONS) == cmrc2018.evaluate(TINY, TINY_PREDICTIONS)
    with pytest.raises(DataError, match="not in SQuAD format"):
        cmrc2018.evaluate({"paragraphs": []}, {})
    with pytest.raises(DataError, match=r"article 0 'x' .*not in SQuAD format.*KeyError"):
        cmrc2018.evaluate({"data": [{"title": "x", "paragraphs": [{"qas": [{"id": "Q"}]}]}]}, {})
    with pytest.raises(DataError, match="holds no questions"):
        cmrc2018.evaluate({"data": []}, {})
    with pytest.raises(DataError, match="prediction for question 'Q1' is 3, not a string"):
        cmrc2018.evaluate(TINY, {"Q1": 3})


def write(path, content):
    path.write_text(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False),
                    encoding="utf-8")
    return str(path)


def test_cli_prints_one_json_line_and_warns_about_unknown_ids(tmp_path, capsys):
    dataset = write(tmp_path / "dev.json", TINY)
    predictions = write(tmp_path / "pred.json", {**TINY_PREDICTIONS, "Q9": "x"})
    assert cli.main(["evaluate", "cmrc2018", dataset, predictions]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ['{"em": 33.333, "f1": 61.111, "total": 3, "skip": 1}']
    assert "1 of 3 prediction ids are not questions of" in err and "'Q9'" in err


@pytest.mark.parametrize("content, message", [
    (None, r"the predictions file .*missing.json does not exist"),
    ('{"Q1": "北京",', r"pred.json:1: the predictions file is not valid JSON"),
    ('["北京"]', r"must be a JSON object mapping question ids to answer texts, not a JSON array"),
    ('{"Q1": ["北京"]}', r"the prediction for question 'Q1' is a JSON array, not a string"),
])
def test_cli_refuses_bad_prediction_files(tmp_path, capsys, content, message):
    dataset = write(tmp_path / "dev.json", TINY)
    predictions = str(tmp_path / "missing.json") if content is None else write(tmp_path / "pred.json", content)
    assert cli.main(["evaluate", "cmrc2018", dataset, predictions]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("zhnlp: error: ")
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_cli_refuses_a_bad_dataset(tmp_path, capsys):
    predictions = write(tmp_path / "pred.json", TINY_PREDICTIONS)
    assert cli.main(["evaluate", "cmrc2018", str(tmp_path / "nope.json"), predictions]) == 2
    assert "the dataset file" in capsys.readouterr().err
    assert cli.main(["evaluate", "cmrc2018", write(tmp_path / "d.json", "{oops"), predictions]) == 2
    assert "d.json:1: the dataset file is not valid JSON" in capsys.readouterr().err


def trial_set():
    from zhnlp.data.sources import locate_cmrc2018

    try:
        return locate_cmrc2018() / "cmrc2018_trial.json"
    except DataError as e:
        pytest.skip(str(e))


def test_real_trial_set_gold_answers_score_100_and_empty_answers_0(tmp_path, capsys):
    path = trial_set()
    gold = {qid: answers[0] for qid, answers in cmrc2018.questions(path)}
    assert len(gold) == 1002
    assert cmrc2018.evaluate(path, gold) == {"em": 100.0, "f1": 100.0, "total": 1002, "skip": 0}
    assert cmrc2018.evaluate(path, dict.fromkeys(gold, "")) == {"em": 0.0, "f1": 0.0, "total": 1002, "skip": 0}
    # and through the command, with half the questions left out: 501 scored 100, 501 skipped -> 50
    half = dict(list(gold.items())[::2])
    assert cli.main(["evaluate", "cmrc2018", str(path), write(tmp_path / "p.json", half)]) == 0
    assert json.loads(capsys.readouterr().out) == {"em": 50.0, "f1": 50.0, "total": 1002, "skip": 501}


# ================================================================ NER
def test_bio_entities():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC", "O", "B-ORG"]
    assert entities(tags) == [("PER", 0, 2), ("LOC", 3, 6), ("ORG", 7, 8)]
    assert entities(tags, "BIO") == entities(tags, "BMES")  # the chunk rules are shared
    # two adjacent entities of one type
    assert entities(["B-PER", "B-PER", "I-PER"], "BIO") == [("PER", 0, 1), ("PER", 1, 3)]
    # a type containing a hyphen
    assert entities(["B-GPE-CITY", "I-GPE-CITY"]) == [("GPE-CITY", 0, 2)]
    assert entities([]) == [] and entities(["O", "O"]) == []


def test_bmes_entities():
    tags = ["S-PER", "B-LOC", "M-LOC", "E-LOC", "O", "B-ORG", "E-ORG"]
    assert entities(tags) == entities(tags, "BMES") == [("PER", 0, 1), ("LOC", 1, 4), ("ORG", 5, 7)]
    assert entities(["B-LOC", "I-LOC", "E-LOC", "S-LOC"]) == [("LOC", 0, 3), ("LOC", 3, 4)]  # BIOES
    with pytest.raises(DataError, match=r"tag 'S-PER' at position 0 is not a BIO tag"):
        entities(tags, "BIO")


@pytest.mark.parametrize("tags, expected", [
    (["O", "I-PER", "I-PER", "O"], [("PER", 1, 3)]),  # I- after O starts an entity (conlleval)
    (["I-LOC"], [("LOC", 0, 1)]),  # ... and so does I- at the start
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),  # a change of type starts a new one
    (["B-LOC", "M-LOC", "O"], [("LOC", 0, 2)]),  # BMES never closed by E: ends before O
    (["B-LOC", "M-LOC"], [("LOC", 0, 2)]),  # ... or at the end of the sentence
    (["E-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 2)]),  # E closes, so the next E starts afresh
    (["S-PER", "M-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 3)]),
    (["B-PER", "E-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),
])
def test_ill_formed_sequences_follow_conlleval(tags, expected):
    assert entities(tags) == expected


def test_bad_tags_are_refused():
    with pytest.raises(DataError, match=r"tag 'PER' at position 1 is not 'O' or 'PREFIX-TYPE'"):
        entities(["O", "PER"])
    with pytest.raises(DataError, match="tag 'X-PER' at position 0 is not a BIO tag"):
        entities(["X-PER"])
    with pytest.raises(ValueError, match="unknown tagging scheme 'IOB3'"):
        entities(["O"], "IOB3")


def test_entity_scores_partial_overlap_and_wrong_type_are_wrong():
    gold = [["B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC"],  # PER(0,3) LOC(4,6)
            ["B-ORG", "I-ORG", "O", "B-PER"],  # ORG(0,2) PER(3,4)
            ["O", "O", "O"]]
    pred = [["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"],  # PER(0,2): partial overlap, wrong; LOC(4,6) right
            ["B-LOC", "I-LOC", "O", "B-PER"],  # LOC(0,2): right span, wrong type; PER(3,4) right
            ["B-ORG", "O", "O"]]  # ORG(0,1): a false positive
    scores = entity_scores(pred, gold)
    # predicted 5, gold 4, correct 2: P 2/5, R 1/2, F1 = 2 * .2 / .9 = 4/9
    assert scores["predicted"] == 5 and scores["gold"] == 4 and scores["correct"] == 2
    assert scores["precision"] == pytest.approx(0.4) and scores["recall"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx(4 / 9)
    per_type = scores["per_type"]
    assert list(per_type) == ["LOC", "ORG", "PER"]
    # PER: predicted 2, gold 2, correct 1 -> .5 / .5 / .5
    assert per_type["PER"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "predicted": 2, "gold": 2,
                                             "correct": 1})
    # LOC: predicted 2, gold 1, correct 1 -> P .5, R 1, F1 2/3
    assert per_type["LOC"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "predicted": 2,
                                             "gold": 1, "correct": 1})
    # ORG: predicted 1 (sentence 3), gold 1 (sentence 2), correct 0 -> all 0
    assert per_type["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "predicted": 1, "gold": 1, "correct": 0}


def test_entity_scores_perfect_empty_and_bmes():
    gold = [["S-PER", "B-LOC", "E-LOC", "O"]]
    assert entity_scores(gold, gold)["f1"] == 1.0
    # a BMES span left open (B M without E) ends before the O: LOC(1,3), the gold span
    assert entity_scores([["S-PER", "B-LOC", "M-LOC", "O"]], gold)["f1"] == 1.0
    none = entity_scores([["O", "O"]], [["O", "O"]])
    assert none["f1"] == 0.0 and none["predicted"] == none["gold"] == 0 and none["per_type"] == {}
    with pytest.raises(DataError, match="sentence 0: 1 predicted tags for 2 gold tags"):
        entity_scores([["O"]], [["O", "O"]])
    with pytest.raises(DataError, match="1 predicted tag sequences for 2 gold ones"):
        entity_scores([["O"]], [["O"], ["O"]])
