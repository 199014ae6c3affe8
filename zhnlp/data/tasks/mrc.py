"""Extractive reading comprehension (SQuAD v1 format: CMRC2018, DRCD): reading, features, decoding, oracle.

Windows. A feature is ``[CLS] question [SEP] context-window [SEP]``. The question is cut to ``max_query_len``
tokens; the context is tokenised once (with character offsets) and cut into windows of
``max_seq_len - len(question) - 3`` tokens. ``doc_stride`` is the STEP between the starts of consecutive windows,
in context tokens (the meaning of the original BERT ``run_squad.py`` and of the CMRC2018 baselines; transformers'
``stride`` is the overlap instead). Consecutive windows overlap by ``window - doc_stride`` tokens; a
``doc_stride`` larger than the window is reduced to the window, so windows touch and never leave a gap.

Offsets. Every context token carries its ``(start, end)`` character span in the context, taken from the fast
tokenizer, so decoding cuts the answer from the original context string: ``[UNK]`` tokens, lower-casing, accents
and removed characters (spaces, zero-width and control characters produce no tokens) never corrupt the text.

Boundaries inside a token. An answer is mapped to the first token that ends after its first character and the
last token that starts before its end. When an answer boundary falls inside a token (the answer ``"200"`` in
``"2008"``, or ``"Nex"`` in the wordpieces ``ne ##xon``) the whole token is taken, so the best possible prediction
for that question carries the rest of the token too: it loses the exact match and a little F1. Characters that
produce no token at an answer's edge (a leading space) are simply not predicted; the CMRC2018 metric strips
surrounding whitespace, so that costs nothing. Combining marks right after a span's last character (which
accent stripping removes, e.g. the Hebrew dagesh) are added back to the span, since they belong to that character.
:func:`oracle_report` lists every question whose best possible prediction is not exactly a gold answer.

References that are not in the context. Evaluation files carry several reference answers per question, and some
alternative references are not verbatim in the context (CMRC2018 dev marks 185 such with ``answer_start`` -1):
the metric compares texts, so they are kept as scoring references (``answer_start`` -1 in :class:`MRCExample`).
An answer is *locatable* when its text is at its ``answer_start`` (after the near-miss fix described in
:func:`read_squad`). Gold token positions come from the first locatable answer; the oracle tries every locatable
reference; training leaves out questions without one (``read_squad(..., training=True)``).
"""

from __future__ import annotations

import json
import re
import unicodedata
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from zhnlp.data.tasks import Problems
from zhnlp.errors import DataError


@dataclass
class MRCExample:
    """One question on one context. ``answers`` holds ``{"text", "answer_start"}`` dicts (character offsets into
    ``context``); it is empty for prediction."""

    qid: str
    question: str
    context: str
    answers: list[dict] = field(default_factory=list)
    title: str = ""

    @property
    def gold(self) -> dict | None:
        """The first locatable answer (its text at its ``answer_start``), the one training and the gold token
        positions use; None when no answer occurs in the context (references for scoring only)."""
        return next((a for a in self.answers if located(a, self.context)), None)


def located(answer: Mapping, context: str) -> bool:
    """True when ``answer["text"]`` is non-empty and stands at ``answer["answer_start"]`` in ``context``."""
    text, start = answer.get("text"), answer.get("answer_start")
    return (isinstance(text, str) and bool(text) and isinstance(start, int) and 0 <= start
            and context[start:start + len(text)] == text)


class SquadExamples(list):
    """The examples :func:`read_squad` returns: a plain list of :class:`MRCExample`, plus what the reader found.

    ``unlocatable_questions``: ids of the questions none of whose answers occurs in its context; kept for
    evaluation (scored against their texts, unreachable for the oracle), left out with ``training=True``.
    ``unlocatable_answers``: how many answers are not in their context (kept as references with
    ``answer_start`` -1, or dropped with ``unfound="drop"``). ``fixed_answers``: how many answer_starts were
    moved to where their text occurs. Slicing gives a plain list."""

    def __init__(self, examples=(), unlocatable_questions=(), unlocatable_answers: int = 0, fixed_answers: int = 0):
        super().__init__(examples)
        self.unlocatable_questions: list[str] = list(unlocatable_questions)
        self.unlocatable_answers = unlocatable_answers
        self.fixed_answers = fixed_answers


@dataclass
class MRCFeature:
    """One window of one example. ``offsets[i]`` is token i's ``(start, end)`` character span in the context for
    context tokens, None for question and special tokens. ``start_position``/``end_position`` are the gold token
    indices in this window, both 0 (``[CLS]``) when the answer is not wholly inside it or there is no answer."""

    example_index: int
    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    offsets: list[tuple[int, int] | None]
    start_position: int = 0
    end_position: int = 0

    def as_inputs(self) -> dict:
        """The model inputs and targets as a feature dict for :func:`~zhnlp.data.tasks.collate`."""
        return {"input_ids": self.input_ids, "token_type_ids": self.token_type_ids,
                "attention_mask": self.attention_mask, "start_positions": self.start_position,
                "end_positions": self.end_position}


# ============================================================== reading
_UNFOUND = ("keep", "drop", "error")


def read_squad(path_or_dict, check_answers: bool = True, *, fix_answer_start: bool = True,
               drop_unfound: bool = False, allow_empty_question: bool = True, unfound: str = "keep",
               training: bool = False) -> SquadExamples:
    """Read a SQuAD v1 file (``data -> paragraphs -> qas``), or the same structure as a dict.

    Returns a :class:`SquadExamples` (a list of :class:`MRCExample` that also counts the answers and questions
    not in their context). Problems are reported together in one :class:`~zhnlp.errors.DataError`, each naming
    the question id, its place (``data[i].paragraphs[j].qas[k]``) and, for a file, the JSON line of its id.

    With ``check_answers`` (gold data) every question needs ``answers`` (an empty list only with
    ``"is_impossible": true``) of non-empty texts. An answer whose text stands at its ``answer_start`` is
    locatable. Real data has off-by-one starts (CMRC2018's trial set has five), so when the text occurs elsewhere
    in the context the start is moved to the occurrence nearest the given one and a warning lists the fixes
    (``fix_answer_start=False`` makes this an error that says where the text occurs instead; two occurrences
    equally near are always an error).

    An answer whose text occurs nowhere in the context (``answer_start`` -1 in CMRC2018 dev, whose alternative
    references are often paraphrases) is handled by ``unfound``: ``"keep"`` (default) keeps it as a reference
    for scoring with ``answer_start`` -1; ``"drop"`` (or ``drop_unfound=True``) drops it with a warning, and its
    question if no answer remains; ``"error"`` reports it as a problem.

    ``training=True`` reads a training file: gold positions come from each question's first locatable answer
    (:attr:`MRCExample.gold`), and questions without one are left out with a warning (their ids are in
    ``unlocatable_questions``); a file where no question has one is an error. Without ``check_answers``,
    ``answers`` may be missing (a file to predict on) and answers are taken as given.

    Empty questions are kept with a warning (the model then sees only the context): the CMRC2018 trial set has
    two and its metric scores them, so evaluation must predict them too. ``allow_empty_question=False`` makes
    them errors.
    """
    if drop_unfound:
        unfound = "drop"
    if unfound not in _UNFOUND:
        raise ValueError(f"unfound={unfound!r}; choose one of {', '.join(map(repr, _UNFOUND))}")
    data, path, text = _load(path_or_dict)
    name = path or "the dataset"
    lines = _id_lines(text) if text is not None else {}
    problems, empty, unlocatable = Problems(), [], []
    state = _Answers(fix_answer_start, unfound, problems)
    examples: list[MRCExample] = []
    seen: dict[str, str] = {}
    articles = data.get("data") if isinstance(data, Mapping) else None
    if not isinstance(articles, list):
        raise DataError(f"{name} is not in SQuAD format: expected a JSON object with a 'data' list of articles, "
                        f"each with 'paragraphs' -> 'context', 'qas'; use a SQuAD v1 style file")
    for i, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, Mapping) else None
        if not isinstance(paragraphs, list):
            problems.add(_place(path, f"data[{i}]"), "missing 'paragraphs' list; every article needs one")
            continue
        title = str(article.get("title", ""))
        for j, paragraph in enumerate(paragraphs):
            where = f"data[{i}].paragraphs[{j}]"
            context = paragraph.get("context") if isinstance(paragraph, Mapping) else None
            qas = paragraph.get("qas") if isinstance(paragraph, Mapping) else None
            if not isinstance(context, str) or not context.strip() or not isinstance(qas, list):
                problems.add(_place(path, where), "needs a non-empty 'context' string and a 'qas' list")
                continue
            for k, qa in enumerate(qas):
                qwhere = f"{where}.qas[{k}]"
                qid = str(qa.get("id", "")).strip() if isinstance(qa, Mapping) else ""
                if qid and qid in seen:
                    problems.add(_place(path, qwhere), f"question id {qid!r} also used at {seen[qid]}; ids must be "
                                                       f"unique because predictions are keyed by id")
                    continue
                seen.setdefault(qid, qwhere)
                example = _question(qa, context, title, check_answers, allow_empty_question, path, qwhere, lines,
                                    problems, state)
                if example is None:
                    continue
                if check_answers and example.answers and example.gold is None:
                    unlocatable.append(example.qid)
                    if training:
                        continue
                examples.append(example)
                if not example.question.strip():
                    empty.append(example.qid)
    problems.raise_if_any(f"cannot read {name} as SQuAD-format reading comprehension data")
    fixed, dropped = state.fixed, state.dropped
    if fixed:
        warnings.warn(f"{name}: moved the answer_start of {len(fixed)} answer(s) to where their text occurs: "
                      + _listed(fixed), stacklevel=2)
    if empty:
        warnings.warn(f"{name}: {len(empty)} question(s) are empty, kept: " + _listed(empty, ", "), stacklevel=2)
    if dropped:
        warnings.warn(f"{name}: dropped {len(dropped)} answer(s) whose text is not in the context: "
                      + _listed(dropped), stacklevel=2)
    if training and unlocatable:
        if not examples:
            raise DataError(f"{name}: none of the {len(unlocatable)} questions has an answer whose text occurs in "
                            f"its context, so there is nothing to train on; correct the answers' text and "
                            f"answer_start, or use the file for evaluation only")
        warnings.warn(f"{name}: left {len(unlocatable)} of {len(examples) + len(unlocatable)} question(s) out of "
                      f"training because none of their answers occurs in the context (correct their text or "
                      f"answer_start to train on them): " + _listed(unlocatable, ", "), stacklevel=2)
    return SquadExamples(examples, unlocatable, state.unlocatable, len(fixed))


def _listed(items: list[str], sep: str = "; ", limit: int = 10) -> str:
    return sep.join(items[:limit]) + (" ..." if len(items) > limit else "")


@dataclass
class _Answers:
    """How :func:`read_squad` checks answers, and what it found: fixed starts, dropped answers (as ``"QID answer
    N"`` lines for the warnings) and the count of answers not in their context."""

    fix_start: bool
    unfound: str
    problems: Problems
    fixed: list = field(default_factory=list)
    dropped: list = field(default_factory=list)
    unlocatable: int = 0


def _load(path_or_dict) -> tuple[Any, str, str | None]:
    if isinstance(path_or_dict, Mapping):
        return path_or_dict, "", None
    path = Path(path_or_dict)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as e:
        raise DataError(f"no SQuAD-format file at {path}; check the path") from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}); convert it to UTF-8") from e
    try:
        return json.loads(text), str(path), text
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno}); fix the file") from e


_ID = re.compile(r'"id"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _id_lines(text: str) -> dict[str, int]:
    """{id: 1-based line of its first ``"id": "..."``} -- a cheap way to point at a question in the JSON file."""
    lines: dict[str, int] = {}
    line, pos = 1, 0
    for m in _ID.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        lines.setdefault(json.loads(f'"{m.group(1)}"').strip(), line)
    return lines


def _place(path: str, where: str, line: int | None = None) -> str:
    if not path:
        return where
    return f"{path}:{line} ({where})" if line else f"{path} ({where})"


def _question(qa, context, title, check_answers, allow_empty, path, where, lines, problems,
              state: _Answers) -> MRCExample | None:
    if not isinstance(qa, Mapping) or not isinstance(qa.get("id"), (str, int)) or isinstance(qa.get("id"), bool):
        problems.add(_place(path, where), "missing question 'id'; give every question a unique id")
        return None
    qid = str(qa["id"]).strip()
    loc = _place(path, where, lines.get(qid))
    problem = None
    question = qa.get("question")
    if not isinstance(question, str):
        problem = "missing 'question'; add the question text"
    elif not question.strip() and not allow_empty:
        problem = "empty 'question'; fill in the question text (allow_empty_question=True keeps it)"
    answers = qa.get("answers")
    if answers is None and not check_answers:
        answers = []
    if problem is None and not (isinstance(answers, list) and all(
            isinstance(a, Mapping) and isinstance(a.get("text"), str) and isinstance(a.get("answer_start"), int)
            and not isinstance(a.get("answer_start"), bool) for a in answers)):
        problem = "'answers' must be a list of {\"text\": str, \"answer_start\": int}; fix the answers"
    if problem is None and check_answers and not answers and not qa.get("is_impossible"):
        problem = "no answers; gold data needs at least one (or pass check_answers=False for a prediction file)"
    if problem is not None:
        problems.add(loc, f"question {qid!r}: {problem}")
        return None
    kept = []
    for n, answer in enumerate(answers):
        answer = {"text": answer["text"], "answer_start": answer["answer_start"]}
        if check_answers:
            answer = _check_answer(answer, context, qid, n, loc, state)
            if answer is None:
                continue
        kept.append(answer)
    if answers and not kept:
        return None  # every answer dropped (unfound="drop") or reported as a problem
    return MRCExample(qid=qid, question=question, context=context, answers=kept, title=title)


def _check_answer(answer, context, qid, n, loc, state: _Answers) -> dict | None:
    """The answer as kept: as given when located, its start moved to a near occurrence, or (text not in the
    context) with ``answer_start`` -1 as a scoring reference; None when dropped or reported as a problem."""
    text, start = answer["text"], answer["answer_start"]
    label = f"question {qid!r} answer {n} {_short(text)}"
    if not text.strip():
        state.problems.add(loc, f"{label}: empty answer text; fill it in or remove the answer")
        return None
    if located(answer, context):
        return answer
    found = [m.start() for m in re.finditer(f"(?={re.escape(text)})", context)]
    if not found:
        state.unlocatable += 1
        if state.unfound == "keep":
            return {"text": text, "answer_start": -1}
        if state.unfound == "drop":
            state.dropped.append(f"{qid} answer {n}")
            return None
        state.problems.add(loc, f"{label} does not occur in the context (answer_start {start}); correct the answer "
                                f"text to a span of the context, or pass unfound='keep' to keep it as a reference "
                                f"for scoring only")
        return None
    nearest = sorted(found, key=lambda s: abs(s - start))
    ambiguous = len(nearest) > 1 and abs(nearest[0] - start) == abs(nearest[1] - start)
    if not state.fix_start or ambiguous:
        why = "equally near two occurrences, " if ambiguous else ""
        state.problems.add(loc, f"{label} is not at answer_start {start} ({why}it occurs at "
                                f"{', '.join(map(str, found[:10]))}); set answer_start to the right occurrence")
        return None
    state.fixed.append(f"{qid} answer {n}: {start} -> {nearest[0]}")
    return {"text": text, "answer_start": nearest[0]}


def _short(text: str, limit: int = 30) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


# ============================================================== features
def _token_span(offsets: list, start: int, end: int) -> tuple[int, int] | None:
    """Token indices (first, last) covering characters ``[start, end)``: the first token ending after ``start``
    and the last token starting before ``end``; None when no token lies in between."""
    first = next((i for i, (s, e) in enumerate(offsets) if e > start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end), None)
    if first is None or last is None or first > last:
        return None
    return first, last


def _encode_contexts(tokenizer, examples) -> dict[str, tuple[list[int], list[tuple[int, int]]]]:
    """{context: (token ids, offsets)} with every distinct context tokenised once (questions share paragraphs)."""
    unique = list(dict.fromkeys(e.context for e in examples))
    if not unique:
        return {}
    from zhnlp.tokenizers.auto import require_alignment

    require_alignment(tokenizer, "reading comprehension")
    enc = tokenizer(unique, add_special_tokens=False, return_offsets_mapping=True)
    return {c: (ids, [tuple(o) for o in offs]) for c, ids, offs in zip(unique, enc["input_ids"], enc["offset_mapping"])}


def window_starts(n_tokens: int, window: int, doc_stride: int) -> list[int]:
    """Start indices of the context windows: every ``min(doc_stride, window)`` tokens until one reaches the end."""
    step = max(1, min(doc_stride, window))
    starts = [0]
    while starts[-1] + window < n_tokens:
        starts.append(starts[-1] + step)
    return starts


def build_mrc_features(tokenizer, examples: list[MRCExample], max_seq_len: int = 512, doc_stride: int = 128,
                       max_query_len: int = 64) -> list[MRCFeature]:
    """Features ``[CLS] question [SEP] context-window [SEP]`` for every example, in example order (see the module
    docstring for windows, ``doc_stride`` and answers whose boundary falls inside a token). The gold positions
    come from the first locatable answer (:attr:`MRCExample.gold`: references not in the context are skipped);
    they are 0 in windows that do not hold the whole answer, and everywhere for an example without one. Unpadded."""
    if max_seq_len - max_query_len - 3 < 1:
        raise ValueError(f"max_seq_len={max_seq_len} leaves no room for context after a question of up to "
                         f"max_query_len={max_query_len} tokens and 3 special tokens; raise max_seq_len or lower "
                         f"max_query_len")
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be at least 1 token, got {doc_stride}")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    contexts = _encode_contexts(tokenizer, examples)
    questions = tokenizer([e.question for e in examples], add_special_tokens=False, truncation=True,
                          max_length=max_query_len)["input_ids"] if examples else []
    features = []
    for index, (example, q_ids) in enumerate(zip(examples, questions)):
        c_ids, c_offsets = contexts[example.context]
        gold, answer = None, example.gold
        if answer is not None:
            gold = _token_span(c_offsets, answer["answer_start"], answer["answer_start"] + len(answer["text"]))
        window = max_seq_len - len(q_ids) - 3
        head = [cls, *q_ids, sep]
        for start in window_starts(len(c_ids), window, doc_stride):
            end = min(start + window, len(c_ids))
            ids = head + c_ids[start:end] + [sep]
            first_type = [0] * len(head)
            positions = (0, 0)
            if gold is not None and start <= gold[0] and gold[1] < end:
                positions = (gold[0] - start + len(head), gold[1] - start + len(head))
            features.append(MRCFeature(
                example_index=index, input_ids=ids, token_type_ids=first_type + [1] * (end - start + 1),
                attention_mask=[1] * len(ids), offsets=[None] * len(head) + c_offsets[start:end] + [None],
                start_position=positions[0], end_position=positions[1]))
    return features


# ============================================================== decoding
def _extend_end(context: str, end: int) -> int:
    """``end`` moved past combining marks that follow it: they modify the span's last character but, stripped
    by the normaliser, belong to no token."""
    while end < len(context) and unicodedata.combining(context[end]):
        end += 1
    return end


def _as_array(logits, n_features: int, name: str) -> np.ndarray:
    if hasattr(logits, "detach"):
        logits = logits.detach().float().cpu().numpy()
    array = np.asarray(logits, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] != n_features:
        raise ValueError(f"{name} has shape {array.shape}; expected (num_features={n_features}, seq_len)")
    return array


def decode_spans(examples: list[MRCExample], features: list[MRCFeature], start_logits, end_logits,
                 n_best: int = 20, max_answer_len: int = 64) -> dict[str, dict]:
    """The best answer span of every example: ``{qid: {"text", "start", "end", "score"}}``.

    Over all windows of an example, the span (start token <= end token, both context tokens, at most
    ``max_answer_len`` tokens) with the highest ``start_logit + end_logit`` among the ``n_best`` best starts and
    ``n_best`` best ends of each window; ties go to the earlier window, then the earlier start. ``start``/``end``
    are character offsets with ``text == context[start:end]``. An example without a valid span gets
    ``{"text": "", "start": 0, "end": 0, "score": -inf}``. ``start_logits``/``end_logits`` are arrays or tensors
    of shape ``(num_features, seq_len)`` aligned with ``features`` (seq_len may include padding)."""
    starts = _as_array(start_logits, len(features), "start_logits")
    ends = _as_array(end_logits, len(features), "end_logits")
    best: dict[int, tuple[float, int, int]] = {}
    for f, feature in enumerate(features):
        context = np.array([i for i, o in enumerate(feature.offsets) if o is not None], dtype=np.int64)
        if context.size == 0:
            continue
        if context[-1] >= starts.shape[1]:
            raise ValueError(f"the logits have {starts.shape[1]} positions but feature {f} has "
                             f"{len(feature.input_ids)} tokens; pass logits for the whole (padded) sequence")
        # stable sorts: among equal logits the earlier position wins, so ties are deterministic
        s_idx = context[np.argsort(-starts[f, context], kind="stable")[:n_best]]
        e_idx = context[np.argsort(-ends[f, context], kind="stable")[:n_best]]
        scores = starts[f, s_idx][:, None] + ends[f, e_idx][None, :]  # (n_best, n_best)
        length = e_idx[None, :] - s_idx[:, None] + 1
        scores = np.where((length >= 1) & (length <= max_answer_len), scores, -np.inf)
        score = float(scores.max())
        if score == -np.inf:
            continue
        current = best.get(feature.example_index)
        if current is None or score > current[0]:
            # among equal scores the earliest start, then the earliest end
            i, j = min(((s_idx[r], e_idx[c]) for r, c in np.argwhere(scores == score)))
            best[feature.example_index] = (score, feature.offsets[i][0], feature.offsets[j][1])
    for index, (score, start, end) in best.items():
        best[index] = (score, start, _extend_end(examples[index].context, end))
    predictions = {}
    for index, example in enumerate(examples):
        if index in best:
            score, start, end = best[index]
            predictions[example.qid] = {"text": example.context[start:end], "start": start, "end": end,
                                        "score": score}
        else:
            predictions[example.qid] = {"text": "", "start": 0, "end": 0, "score": float("-inf")}
    return predictions


# ============================================================== the oracle
def oracle(examples: list[MRCExample], features: list[MRCFeature], max_answer_len: int = 64) -> dict[str, dict]:
    """Predictions from the gold token positions fed as one-hot logits through :func:`decode_spans` (windows
    without the answer put their mass on ``[CLS]``), so any windowing or offset bug shows up as lost points."""
    width = max((len(f.input_ids) for f in features), default=1)
    starts = np.zeros((len(features), width))
    ends = np.zeros((len(features), width))
    for f, feature in enumerate(features):
        starts[f, feature.start_position] = 1.0
        ends[f, feature.end_position] = 1.0
    return decode_spans(examples, features, starts, ends, max_answer_len=max_answer_len)


def _why_unreachable(example: MRCExample, features: list[MRCFeature], offsets: list, max_answer_len: int) -> str:
    """Why the gold positions of ``example`` (its first locatable answer) cannot reproduce its text exactly."""
    answer = example.gold
    start, end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
    span = _token_span(offsets, start, end)
    if span is None:
        return "the answer produces no tokens"
    reasons = []
    ctx = example.context
    first, last = offsets[span[0]], (offsets[span[1]][0], _extend_end(ctx, offsets[span[1]][1]))
    if first[0] < start:
        reasons.append(f"answer boundary inside token {ctx[first[0]:first[1]]!r} (start)")
    elif first[0] > start:
        reasons.append(f"answer begins with characters that produce no tokens {ctx[start:first[0]]!r}")
    if last[1] > end:
        reasons.append(f"answer boundary inside token {ctx[last[0]:last[1]]!r} (end)")
    elif last[1] < end:
        reasons.append(f"answer ends with characters that produce no tokens {ctx[last[1]:end]!r}")
    n_tokens = span[1] - span[0] + 1
    if not any(f.start_position for f in features):
        window = max(sum(o is not None for o in f.offsets) for f in features)
        reasons.append(f"answer ({n_tokens} tokens) not wholly inside any window (windows of {window} context tokens)")
    elif n_tokens > max_answer_len:
        reasons.append(f"answer longer than max_answer_len ({n_tokens} tokens > {max_answer_len})")
    return "; ".join(reasons) or "unexplained (a bug in windowing or decoding)"


def oracle_report(path_or_dict, tokenizer, max_seq_len: int = 512, doc_stride: int = 128, max_answer_len: int = 64,
                  max_query_len: int = 64) -> dict:
    """Score the oracle of a SQuAD-format file with the CMRC2018 metric, and explain every miss.

    Each question is tried with each of its locatable references as the gold span (references not in the context
    cannot be produced by gold positions); its oracle prediction is the one that scores best against all its
    references (EM, then F1; the earlier reference on a tie). A question without a locatable reference is
    predicted ``""`` and so scores 0.

    Returns ``{"em", "f1", "total", "skip", "unlocatable_questions", "unlocatable_answers", "unreachable":
    [{"qid", "answer", "predicted", "reason"}]}`` where ``unlocatable_questions`` counts the questions without a
    locatable reference, ``unlocatable_answers`` the references not in their context, and ``unreachable`` lists
    every question whose oracle prediction is not exactly one of its reference texts (the metric may still count
    some of them: it ignores case, punctuation and surrounding whitespace)."""
    from zhnlp.metrics.cmrc2018 import evaluate, exact_match, f1_score

    if not isinstance(path_or_dict, Mapping):
        path_or_dict = Path(path_or_dict)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the answer_start fixes are expected here; the report lists what matters
        examples = read_squad(path_or_dict)
    # one variant per distinct locatable reference, each with that reference as its only (gold) answer
    variants, owners = [], []
    for index, example in enumerate(examples):
        references = {(a["answer_start"], a["text"]): a for a in example.answers if located(a, example.context)}
        for answer in references.values():
            variants.append(MRCExample(qid=str(len(variants)), question=example.question, context=example.context,
                                       answers=[answer], title=example.title))
            owners.append(index)
    features = build_mrc_features(tokenizer, variants, max_seq_len, doc_stride, max_query_len)
    tried = oracle(variants, features, max_answer_len)
    by_variant = defaultdict(list)
    for feature in features:
        by_variant[feature.example_index].append(feature)
    best: dict[int, tuple[tuple[float, float], int]] = {}  # example -> ((em, f1), variant)
    for v, (variant, index) in enumerate(zip(variants, owners)):
        texts = [a["text"] for a in examples[index].answers]
        predicted = tried[variant.qid]["text"]
        score = (exact_match(predicted, texts), f1_score(predicted, texts))
        if index not in best or score > best[index][0]:
            best[index] = (score, v)
    predictions = {e.qid: tried[variants[best[i][1]].qid]["text"] if i in best else "" for i, e in enumerate(examples)}
    scores = evaluate(path_or_dict, predictions)
    contexts = _encode_contexts(tokenizer, examples)
    unreachable = []
    for index, example in enumerate(examples):
        predicted = predictions[example.qid]
        if not example.answers or predicted in {a["text"] for a in example.answers}:
            continue
        if index not in best:
            unreachable.append({"qid": example.qid, "answer": example.answers[0]["text"], "predicted": "",
                                "reason": "no reference answer occurs in the context (answer_start -1 or the text "
                                          "is not in the context), so no gold span can produce one"})
            continue
        v = best[index][1]
        reason = _why_unreachable(variants[v], by_variant[v], contexts[example.context][1], max_answer_len)
        unreachable.append({"qid": example.qid, "answer": variants[v].answers[0]["text"], "predicted": predicted,
                            "reason": reason})
    return {**scores, "unlocatable_questions": len(examples.unlocatable_questions),
            "unlocatable_answers": examples.unlocatable_answers, "unreachable": unreachable}
