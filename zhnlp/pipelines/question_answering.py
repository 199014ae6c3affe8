"""Extractive question answering: the span of the context that answers the question."""

from __future__ import annotations

import numpy as np

from zhnlp.data.tasks.mrc import MRCExample, build_mrc_features, decode_spans
from zhnlp.pipelines.base import Pipeline, is_positive_int, logger

_PAD_LOGIT = -1e9  # logits of padding positions when features of different lengths are stacked for decoding


class QuestionAnsweringPipeline(Pipeline):
    """Answer questions with a span of their context, using a fine-tuned question-answering model.

    Input: a dict ``{"question": ..., "context": ...}``, a list of them, or ``question=..., context=...`` keyword
    arguments (two strings, or two lists of the same length). Contexts longer than ``max_length`` tokens are read
    in windows ``[CLS] question [SEP] window [SEP]`` whose starts are ``doc_stride`` context tokens apart (see
    :mod:`zhnlp.data.tasks.mrc`); the answer may come from any window. Questions are cut to ``max_query_len``
    tokens (default 64, at most half of ``max_length``), with a warning on the ``zhnlp`` logger. An empty (or
    whitespace-only) question or context is refused.

    Output per input, with transformers' keys: ``{"score": float, "start": int, "end": int, "answer": str}``:

    * ``answer``: the span of the context, ``context[start:end] == answer`` (``start``, ``end``: character
      offsets into the caller's context string); the span (at most ``max_answer_len`` tokens) of highest
      start + end logit over all windows (:func:`zhnlp.data.tasks.mrc.decode_spans`);
    * ``score``: the span's probability ``P(start) * P(end)``, each a softmax over the context tokens of the
      window it was found in (and over ``[CLS]`` too with ``handle_impossible_answer``).

    With no valid span the answer is ``""`` at 0 with score 0. Option ``top_k`` (default 1): with more than 1, a
    list of the ``top_k`` best distinct spans, best first (the first is the single answer above). Option
    ``handle_impossible_answer`` (default False): also score "no answer", ``P([CLS] start) * P([CLS] end)``
    (the smallest over the windows), as ``{"score", "start": 0, "end": 0, "answer": ""}``, ranked among the
    spans by score, as transformers does. A single input gives one result; a list of inputs, a list.
    (transformers 5 dropped its question-answering pipeline; these are the conventions of transformers 4's.)
    """

    task = "question-answering"
    auto_class = "AutoModelForQuestionAnswering"
    head, finetune_task = "question-answering head", "mrc"
    default_options = {"doc_stride": 128, "max_answer_len": 64, "max_query_len": 64, "top_k": 1,
                       "handle_impossible_answer": False}
    output_names = {"start_logits": True, "end_logits": True}

    def __call__(self, inputs=None, *, question=None, context=None, **options):
        """``qa({"question", "context"})``, ``qa([...])`` or ``qa(question=..., context=...)``."""
        if question is not None or context is not None:
            if inputs is not None:
                raise ValueError("pass either one input (a dict or a list of dicts) or question= and context=, "
                                 "not both.")
            if question is None or context is None:
                missing = "question=" if question is None else "context="
                raise ValueError(f"{missing} is missing; pass both question= and context=.")
            if isinstance(question, list) != isinstance(context, list) or (
                    isinstance(question, list) and len(question) != len(context)):
                raise ValueError("question= and context= must both be strings or both lists of the same length")
            inputs = ([{"question": q, "context": c} for q, c in zip(question, context)]
                      if isinstance(question, list) else {"question": question, "context": context})
        if inputs is None:
            raise ValueError("question answering needs an input: {'question': ..., 'context': ...}")
        return super().__call__(inputs, **options)

    def check_options(self, options):
        for name in ("doc_stride", "max_answer_len", "max_query_len"):
            if not is_positive_int(options[name]):
                raise ValueError(f"{name} must be a positive integer, got {options[name]!r}.")
        if not is_positive_int(options["top_k"]):
            raise ValueError(f"top_k must be a positive integer (1: one answer), got {options['top_k']!r}.")
        if not isinstance(options["handle_impossible_answer"], bool):
            raise ValueError(f"handle_impossible_answer must be True or False, got "
                             f"{options['handle_impossible_answer']!r}.")

    def check_input(self, item):
        if not isinstance(item, dict) or not {"question", "context"} <= set(item):
            raise ValueError(f"a question-answering input is a dict with 'question' and 'context', got "
                             f"{sorted(item) if isinstance(item, dict) else type(item).__name__}.")
        for name in ("question", "context"):
            if not isinstance(item[name], str):
                raise TypeError(f"'{name}' must be a string, got {type(item[name]).__name__}.")
        if not item["question"].strip():
            raise ValueError("the question is empty (or only whitespace); write the question to answer from the "
                             "context.")
        if not item["context"].strip():
            raise ValueError("the context is empty (or only whitespace); there is nothing to take an answer from.")
        return item["question"], item["context"]

    def preprocess(self, items, options):
        examples = [MRCExample(qid=str(i), question=q, context=c) for i, (q, c) in enumerate(items)]
        max_query_len = min(options["max_query_len"], self.max_length // 2)
        self._warn_long_questions([q for q, _ in items], max_query_len)
        features = build_mrc_features(self.tokenizer, examples, max_seq_len=self.max_length,
                                      doc_stride=options["doc_stride"], max_query_len=max_query_len)
        return [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids, "attention_mask": f.attention_mask,
                 "example_index": f.example_index, "feature": f}
                for f in features]

    def _warn_long_questions(self, questions: list[str], max_query_len: int) -> None:
        """Say which questions are cut to ``max_query_len`` tokens (the model then answers the cut question)."""
        lengths = [len(ids) for ids in self.tokenizer(questions, add_special_tokens=False)["input_ids"]]
        for question, n in zip(questions, lengths):
            if n > max_query_len:
                shown = question if len(question) <= 30 else question[:30] + "..."
                logger.warning("%s: the question %r has %d tokens; it was truncated to its first %d (max_query_len, "
                               "at most max_length // 2 = %d); shorten the question, or raise max_query_len (and "
                               "max_length).", self.task, shown, n, max_query_len, self.max_length // 2)

    def postprocess(self, items, features, outputs, options):
        examples = [MRCExample(qid=str(i), question=q, context=c) for i, (q, c) in enumerate(items)]
        mrc_features = [f["feature"] for f in features]
        width = max(len(f.input_ids) for f in mrc_features)
        starts = np.full((len(features), width), _PAD_LOGIT)
        ends = np.full((len(features), width), _PAD_LOGIT)
        for row, out in enumerate(outputs):
            starts[row, :len(out["start_logits"])] = out["start_logits"].numpy()
            ends[row, :len(out["end_logits"])] = out["end_logits"].numpy()
        best = decode_spans(examples, mrc_features, starts, ends, max_answer_len=options["max_answer_len"])
        windows: dict[int, list[int]] = {}
        for row, feature in enumerate(mrc_features):
            windows.setdefault(feature.example_index, []).append(row)
        with_cls = options["handle_impossible_answer"]
        results = []
        for index, example in enumerate(examples):
            span = best[example.qid]
            rows = windows.get(index, [])
            score = (_probability(mrc_features, starts, ends, rows, span["start"], span["end"], with_cls)
                     if span["text"] else 0.0)
            ranked = [{"score": score, "start": span["start"], "end": span["end"], "answer": span["text"]}]
            if options["top_k"] > 1:
                others = _ranked_spans(example.context, mrc_features, starts, ends, rows, options["max_answer_len"],
                                       options["top_k"] + 1, with_cls)
                ranked += [o for o in others if (o["start"], o["end"]) != (span["start"], span["end"])]
            ranked = [r for r in ranked if r["answer"]] or ranked[:1]  # "" at 0, score 0: no valid span at all
            if with_cls:
                ranked = [r for r in ranked if r["answer"]]
                null = min((_null_probability(mrc_features[row], starts, ends, row) for row in rows), default=1.0)
                ranked.append({"score": null, "start": 0, "end": 0, "answer": ""})
                ranked.sort(key=lambda r: -r["score"])  # stable: a span before "no answer" of equal score
            ranked = ranked[:options["top_k"]]
            results.append(ranked[0] if options["top_k"] == 1 else ranked)
        return results


def _context_probs(feature, starts, ends, row, with_cls: bool = False):
    """Context token indices of a window and their start/end softmax probabilities over that window's context
    tokens (and its [CLS] token, position 0, when ``with_cls``: transformers' handle_impossible_answer)."""
    ctx = np.array([i for i, o in enumerate(feature.offsets) if o is not None], dtype=np.int64)
    over = np.concatenate([np.zeros(1, dtype=np.int64), ctx]) if with_cls else ctx
    return ctx, _softmax_at(starts[row], over, ctx), _softmax_at(ends[row], over, ctx)


def _softmax_at(logits, over, at):
    """The softmax of ``logits`` over the positions ``over``, read at the positions ``at``."""
    top = logits[over].max()
    return np.exp(logits[at] - top) / np.exp(logits[over] - top).sum()


def _null_probability(feature, starts, ends, row) -> float:
    """P(start at [CLS]) * P(end at [CLS]) in one window, each softmax over [CLS] and the context tokens."""
    ctx = np.array([i for i, o in enumerate(feature.offsets) if o is not None], dtype=np.int64)
    over, cls = np.concatenate([np.zeros(1, dtype=np.int64), ctx]), np.zeros(1, dtype=np.int64)
    return float(_softmax_at(starts[row], over, cls)[0] * _softmax_at(ends[row], over, cls)[0])


def _probability(features, starts, ends, rows, start: int, end: int, with_cls: bool = False) -> float:
    """P(start) * P(end) of the character span [start, end), in the best window whose tokens begin at ``start``
    and end at ``end`` (an end moved past trailing combining marks is matched by the last token before it)."""
    best = 0.0
    for row in rows:
        feature = features[row]
        ctx, p_start, p_end = _context_probs(feature, starts, ends, row, with_cls)
        first = [k for k, i in enumerate(ctx) if feature.offsets[i][0] == start]
        last = [k for k, i in enumerate(ctx) if start < feature.offsets[i][1] <= end]
        if first and last and first[0] <= last[-1]:
            best = max(best, float(p_start[first[0]] * p_end[last[-1]]))
    return best


def _ranked_spans(context: str, features, starts, ends, rows, max_answer_len: int, n: int,
                  with_cls: bool = False) -> list[dict]:
    """Up to ``n`` distinct character spans by start + end logit over all windows (decode_spans' criterion for
    its single best span), each with its probability in its window."""
    candidates = []
    for order, row in enumerate(rows):
        feature = features[row]
        ctx, p_start, p_end = _context_probs(feature, starts, ends, row, with_cls)
        top_s = np.argsort(-starts[row, ctx], kind="stable")[:max(20, n)]
        top_e = np.argsort(-ends[row, ctx], kind="stable")[:max(20, n)]
        for a in top_s:
            for b in top_e:
                if 0 <= ctx[b] - ctx[a] < max_answer_len:
                    s, e = feature.offsets[ctx[a]][0], feature.offsets[ctx[b]][1]
                    candidates.append((-(starts[row, ctx[a]] + ends[row, ctx[b]]), order, int(ctx[a]), s, e,
                                       float(p_start[a] * p_end[b])))
    seen, out = set(), []
    for *_, s, e, prob in sorted(candidates):
        if (s, e) not in seen:
            seen.add((s, e))
            out.append({"score": prob, "start": s, "end": e, "answer": context[s:e]})
        if len(out) == n:
            break
    return out
