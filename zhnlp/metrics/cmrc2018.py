"""The CMRC2018 reading-comprehension metric: exact match (EM) and F1 over mixed Chinese/English segments.

This is our implementation of the metric the CMRC2018 organisers publish (``cmrc2018_evaluate.py``), written from its
definition so that scores are comparable with published results:

* text is lower-cased and stripped of surrounding whitespace;
* every CJK ideograph (U+4E00..U+9FA5, the range the official script tests) and every punctuation mark of
  :data:`PUNCTUATION` is a segment of its own; the runs of other characters between them (English words, digits,
  full-width letters, other symbols) are tokenised into words;
* **F1** drops the punctuation first, then takes the longest common *contiguous* run of segments (longest common
  substring, not subsequence) between prediction and reference: precision = its length / prediction segments,
  recall = its length / reference segments; the best F1 over the reference answers counts;
* **EM** is 1 when the punctuation-free, lower-cased, stripped prediction equals one of the references exactly, as
  strings (so inner whitespace matters for EM: ``"iphone 7"`` and ``"iphone7"`` differ).

Points of fidelity to the official script, so that our numbers equal its numbers:

* the official list spells the ellipsis as the two-character string ``"……"`` but tests one character at a time, so
  a single ``"…"`` (U+2026) is never treated as punctuation; we keep that (:data:`PUNCTUATION` holds only
  single characters and leaves ``"…"`` out);
* for F1 the punctuation is removed *before* segmenting, so the words on either side of a removed mark join:
  ``"zh-hant"`` is the one segment ``zhhant``, ``"Foundation、Andrew"`` the one segment ``foundationandrew``;
* an empty prediction (or one that is only punctuation) scores F1 0 even against an empty reference, while its EM
  is 1 exactly when a reference is empty too.

One difference: the official script tokenises the non-CJK runs with NLTK's ``word_tokenize`` (Penn Treebank
rules); we do not depend on NLTK. :func:`segment` splits a run on whitespace and, inside each piece, keeps letters
and digits together with a ``.``, ``,`` or ``'`` that joins two of them (``3.5``, ``1,000``, ``u.s``, ``don't``),
and makes every other symbol its own segment (``(``, ``)``, a trailing ``.``, ``%``, ``$``). The two differ only on
English punctuation inside runs: NLTK splits contractions (``do`` + ``n't``), turns straight double quotes into
two-character quote tokens, and keeps the period of an abbreviation in mid-sentence attached (``u.s.``). Such
cases are rare in CMRC answers and move a score only when prediction and reference differ exactly there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from zhnlp.errors import DataError

#: The official punctuation set: ASCII ``- : _ * ^ / \\ ~ ` + =`` and the full-width marks. One character each (see
#: the module docstring about the ellipsis).
PUNCTUATION = frozenset("-:_*^/\\~`+=" "，。：？！“”；’《》·、「」（）－～『』")

_CJK = re.compile("[\u4e00-\u9fa5]")
# Inside one whitespace-free piece of a non-CJK run: a word (letters/digits/underscore, with single . , ' joining
# two word parts), else any one other character.
_WORD = re.compile(r"\w+(?:[.,']\w+)*|\S")


def _tokenise_run(run: str) -> list[str]:
    """Split a run of non-CJK, non-punctuation characters into words (our stand-in for NLTK's word_tokenize)."""
    return _WORD.findall(run)


def segment(text: str) -> list[str]:
    """Split ``text`` into the metric's segments: lower-cased; each CJK character and each punctuation mark its own
    segment; the runs of other characters tokenised into words (whitespace separates, never forms a segment).

    >>> segment("2008年北京奥运会")
    ['2008', '年', '北', '京', '奥', '运', '会']
    >>> segment("《iPhone 7 Plus》发布")
    ['《', 'iphone', '7', 'plus', '》', '发', '布']
    """
    segments: list[str] = []
    run: list[str] = []
    for char in text.lower().strip():
        if char in PUNCTUATION or _CJK.match(char):
            if run:
                segments.extend(_tokenise_run("".join(run)))
                run = []
            segments.append(char)
        else:
            run.append(char)
    if run:
        segments.extend(_tokenise_run("".join(run)))
    return segments


def remove_punctuation(text: str) -> str:
    """``text`` lower-cased, stripped of surrounding whitespace, with every character of :data:`PUNCTUATION`
    removed (inner whitespace is kept)."""
    return "".join(char for char in text.lower().strip() if char not in PUNCTUATION)


def _longest_common_run(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest contiguous run of segments that ``a`` and ``b`` share (longest common substring)."""
    best = 0
    previous = [0] * (len(b) + 1)  # previous[j]: length of the common run ending at a[i-1], b[j-1]
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            if x == y:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def _check_answers(answers: Sequence[str]) -> None:
    if isinstance(answers, str):
        # A bare string would be scored character by character as if each were an answer: refuse it.
        raise TypeError("answers must be a sequence of reference strings, not one string; wrap it in a list")
    if not answers:
        raise DataError("a question has no reference answers, so it cannot be scored; every question needs at "
                        "least one answer")


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the punctuation-free ``prediction`` equals one of the punctuation-free ``answers``, else 0.0."""
    _check_answers(answers)
    predicted = remove_punctuation(prediction)
    return 1.0 if any(predicted == remove_punctuation(answer) for answer in answers) else 0.0


def f1_score(prediction: str, answers: Sequence[str]) -> float:
    """The best, over ``answers``, of the F1 between the punctuation-free segments of ``prediction`` and of the
    answer, where the overlap is their longest common contiguous run of segments. 0.0 when nothing is shared
    (including an empty prediction)."""
    _check_answers(answers)
    predicted = segment(remove_punctuation(prediction))
    best = 0.0
    for answer in answers:
        reference = segment(remove_punctuation(answer))
        common = _longest_common_run(reference, predicted)
        if common == 0:
            continue
        precision, recall = common / len(predicted), common / len(reference)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ---------------------------------------------------------------- datasets in SQuAD format
def load_dataset(dataset: Mapping | str | Path) -> Mapping:
    """The SQuAD-format dataset ``dataset`` (a dict, or the path of its JSON file), checked to have ``data``."""
    if isinstance(dataset, (str, Path)):
        dataset = _read_json(Path(dataset), "dataset")
    if not isinstance(dataset, Mapping) or not isinstance(dataset.get("data"), list):
        raise DataError("the CMRC2018 dataset is not in SQuAD format: expected a JSON object with a 'data' list of "
                        "articles ({'paragraphs': [{'qas': [{'id', 'answers': [{'text'}]}]}]}); use the official "
                        "file, e.g. cmrc2018_trial.json")
    return dataset


def questions(dataset: Mapping | str | Path) -> Iterator[tuple[str, list[str]]]:
    """Yield ``(question id, reference answer texts)`` for every question of a SQuAD-format dataset (the id
    stripped of surrounding whitespace, as the official script does; an integer id as its digits, as
    :func:`zhnlp.data.tasks.mrc.read_squad` reads it).

    Every reference counts, whether or not its text occurs in the context (``answer_start`` is not read):
    evaluation files carry alternative references that are not verbatim in the context (CMRC2018 dev marks
    them ``answer_start`` -1), and the metric compares texts."""
    for a, article in enumerate(load_dataset(dataset)["data"]):
        try:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    qid = qa["id"]
                    qid = str(qid) if isinstance(qid, int) and not isinstance(qid, bool) else qid.strip()
                    texts = [answer["text"] for answer in qa["answers"]]
                    bad = [t for t in texts if not isinstance(t, str)]
                    if bad:
                        raise DataError(f"question {qid!r} has a reference answer {bad[0]!r} that is not a string; "
                                        f"each answer is {{'text': str, 'answer_start': int}}")
                    yield qid, texts
        except (KeyError, TypeError, AttributeError) as e:
            title = article.get("title", "") if isinstance(article, Mapping) else ""
            raise DataError(f"article {a} {title!r} of the dataset is not in SQuAD format ({type(e).__name__}: "
                            f"{e}); each article needs 'paragraphs' -> 'qas' -> {{'id': str, 'answers': "
                            f"[{{'text': str}}]}}") from e


def load_predictions(path: str | Path) -> dict[str, str]:
    """The ``{question id: answer text}`` object of a predictions JSON file, checked."""
    path = Path(path)
    predictions = _read_json(path, "predictions")
    if not isinstance(predictions, dict):
        raise DataError(f"{path}: the predictions must be a JSON object mapping question ids to answer texts, not "
                        f"a JSON {_json_type(predictions)}; write {{\"QUESTION_ID\": \"answer\", ...}}")
    for qid, answer in predictions.items():
        if not isinstance(answer, str):
            raise DataError(f"{path}: the prediction for question {qid!r} is a JSON {_json_type(answer)}, not a "
                            f"string; predictions map question ids to answer texts")
    return predictions


def evaluate(dataset: Mapping | str | Path, predictions: Mapping[str, str]) -> dict:
    """Score ``predictions`` ({question id: answer text}) against a SQuAD-format CMRC2018 ``dataset`` (a dict or a
    path to its JSON file).

    Returns ``{"em": percent, "f1": percent, "total": questions, "skip": questions without a prediction}``; a
    question without a prediction counts as 0 for both, as in the official script. Predictions for ids that are not
    in the dataset are ignored (see ``zhnlp evaluate``, which reports them)."""
    em = f1 = 0.0
    total = skip = 0
    for qid, answers in questions(dataset):
        total += 1
        if qid not in predictions:
            skip += 1
            continue
        prediction = predictions[qid]
        if not isinstance(prediction, str):
            raise DataError(f"the prediction for question {qid!r} is {prediction!r}, not a string; predictions "
                            f"map question ids to answer texts")
        if not answers:
            raise DataError(f"question {qid!r} has no reference answers, so it cannot be scored; every question "
                            f"needs at least one answer")
        em += exact_match(prediction, answers)
        f1 += f1_score(prediction, answers)
    if total == 0:
        raise DataError("the dataset holds no questions; use a CMRC2018 file with at least one 'qas' entry")
    return {"em": 100.0 * em / total, "f1": 100.0 * f1 / total, "total": total, "skip": skip}


def _read_json(path: Path, what: str):
    """The JSON content of ``path``; DataError naming the file for a missing, unreadable or malformed one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"the {what} file {path} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read the {what} file {path} ({e}); it must be a readable UTF-8 JSON file") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: the {what} file is not valid JSON ({e.msg} at column {e.colno}); fix "
                        f"or regenerate it") from e


def _json_type(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
