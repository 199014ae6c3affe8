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
def read_squad(path_or_dict, check_answers: bool = True, *, fix_answer_start: bool = True,
               drop_unfound: bool = False, allow_empty_question: bool = True) -> list[MRCExample]:
    """Read a SQuAD v1 file (``data -> paragraphs -> qas``), or the same structure as a dict.

    Problems are reported together in one :class:`~zhnlp.errors.DataError`, each naming the question id, its
    place (``data[i].paragraphs[j].qas[k]``) and, for a file, the JSON line of its id.

    With ``check_answers`` (gold data) every question needs ``answers`` (an empty list only with
    ``"is_impossible": true``) and each answer's text must occur at its ``answer_start``. Real data has
    off-by-one starts (CMRC2018's trial set has five), so when the text occurs elsewhere in the context the start
    is moved to the occurrence nearest the given one and a warning lists the fixes (``fix_answer_start=False``
    makes this an error that says where the text occurs instead). An answer whose text occurs nowhere is an
    error; with ``drop_unfound=True`` it is dropped with a warning instead (and its question, if no answer
    remains), so that training runs on an imperfect file. Without ``check_answers``, ``answers`` may be missing
    (a file to predict on) and answers are taken as given.

    Empty questions are kept with a warning (the model then sees only the context): the CMRC2018 trial set has
    two and its metric scores them, so evaluation must predict them too. ``allow_empty_question=False`` makes
    them errors.
    """
    data, path, text = _load(path_or_dict)
    lines = _id_lines(text) if text is not None else {}
    problems, fixed, dropped, empty = Problems(), [], [], []
    examples: list[MRCExample] = []
    seen: dict[str, str] = {}
    articles = data.get("data") if isinstance(data, Mapping) else None
    if not isinstance(articles, list):
        raise DataError(f"{path or 'the dataset'} is not in SQuAD format: expected a JSON object with a 'data' list "
                        f"of articles, each with 'paragraphs' -> 'context', 'qas'; use a SQuAD v1 style file")
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
                example = _question(qa, context, title, check_answers, fix_answer_start, drop_unfound,
                                    allow_empty_question, path, qwhere, lines, problems, fixed, dropped)
                if example is not None:
                    examples.append(example)
                    if not example.question.strip():
                        empty.append(example.qid)
    problems.raise_if_any(f"cannot read {path or 'the dataset'} as SQuAD-format reading comprehension data")
    if fixed:
        warnings.warn(f"{path or 'the dataset'}: moved the answer_start of {len(fixed)} answer(s) to where their "
                      f"text occurs: " + "; ".join(fixed[:10]) + (" ..." if len(fixed) > 10 else ""), stacklevel=2)
    if empty:
        warnings.warn(f"{path or 'the dataset'}: {len(empty)} question(s) are empty, kept: " + ", ".join(empty[:10])
                      + (" ..." if len(empty) > 10 else ""), stacklevel=2)
    if dropped:
        warnings.warn(f"{path or 'the dataset'}: dropped {len(dropped)} answer(s) whose text is not in the context: "
                      + "; ".join(dropped[:10]) + (" ..." if len(dropped) > 10 else ""), stacklevel=2)
    return examples


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


def _question(qa, context, title, check_answers, fix_start, drop_unfound, allow_empty, path, where, lines, problems,
              fixed, dropped) -> MRCExample | None:
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
            fixed_answer = _check_answer(answer, context, fix_start, drop_unfound, qid, n, loc, problems, fixed,
                                         dropped)
            if fixed_answer is None:
                continue
            answer = fixed_answer
        kept.append(answer)
    if answers and not kept:
        return None  # every answer dropped (drop_unfound) or reported as a problem
    return MRCExample(qid=qid, question=question, context=context, answers=kept, title=title)


def _check_answer(answer, context, fix_start, drop_unfound, qid, n, loc, problems, fixed, dropped) -> dict | None:
    text, start = answer["text"], answer["answer_start"]
    label = f"question {qid!r} answer {n} {_short(text)}"
    if not text.strip():
        problems.add(loc, f"{label}: empty answer text; fill it in or remove the answer")
        return None
    if 0 <= start and context[start:start + len(text)] == text:
        return answer
    found = [m.start() for m in re.finditer(f"(?={re.escape(text)})", context)]
    if not found:
        if drop_unfound:
            dropped.append(f"{qid} answer {n}")
            return None
        problems.add(loc, f"{label} does not occur in the context (answer_start {start}); correct the answer text "
                          f"to a span of the context, or pass drop_unfound=True to skip such answers")
        return None
    nearest = sorted(found, key=lambda s: abs(s - start))
    ambiguous = len(nearest) > 1 and abs(nearest[0] - start) == abs(nearest[1] - start)
    if not fix_start or ambiguous:
        why = "equally near two occurrences, " if ambiguous else ""
        problems.add(loc, f"{label} is not at answer_start {start} ({why}it occurs at "
                          f"{', '.join(map(str, found[:10]))}); set answer_start to the right occurrence")
        return None
    fixed.append(f"{qid} answer {n}: {start} -> {nearest[0]}")
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
    come from the FIRST answer; they are 0 in windows that do not hold the whole answer. Unpadded."""
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
        gold = None
        if example.answers:
            answer = example.answers[0]
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
    """Why the gold positions of ``example`` (first answer) cannot reproduce its text exactly."""
    answer = example.answers[0]
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

    Returns ``{"em", "f1", "total", "skip", "unreachable": [{"qid", "answer", "predicted", "reason"}]}`` where
    ``unreachable`` lists every question whose oracle prediction is not exactly one of its gold answer texts
    (the metric may still count some of them: it ignores case, punctuation and surrounding whitespace)."""
    from zhnlp.metrics.cmrc2018 import evaluate

    if not isinstance(path_or_dict, Mapping):
        path_or_dict = Path(path_or_dict)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the answer_start fixes are expected here; the report lists what matters
        examples = read_squad(path_or_dict)
    features = build_mrc_features(tokenizer, examples, max_seq_len, doc_stride, max_query_len)
    predictions = oracle(examples, features, max_answer_len)
    scores = evaluate(path_or_dict, {qid: p["text"] for qid, p in predictions.items()})
    by_example = defaultdict(list)
    for feature in features:
        by_example[feature.example_index].append(feature)
    contexts = _encode_contexts(tokenizer, examples)
    unreachable = []
    for index, example in enumerate(examples):
        predicted = predictions[example.qid]["text"]
        if not example.answers or predicted in {a["text"] for a in example.answers}:
            continue
        reason = _why_unreachable(example, by_example[index], contexts[example.context][1], max_answer_len)
        unreachable.append({"qid": example.qid, "answer": example.answers[0]["text"], "predicted": predicted,
                            "reason": reason})
    return {**scores, "unreachable": unreachable}
