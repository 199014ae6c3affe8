"""Supervised fine-tuning (chat) data: conversations, their tokens through the model's chat template, and the
targets on the assistant's tokens only.

A conversation is ``{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}``: one JSON
object per line of a ``.jsonl`` file, a row of a ``datasets.Dataset`` with a ``messages`` column, or a dict in a
list. Every conversation needs at least one assistant message (it is what the model learns to write).

Encoding (:func:`encode_conversation`): the whole conversation is rendered with the tokenizer's chat template
(transformers' ``apply_chat_template``, the checkpoint's own template) and tokenized once, without special tokens
added (the template writes them), so the ids are exactly ``apply_chat_template(messages, tokenize=True)``. The
characters each assistant message contributes are found by rendering the conversation up to the message with the
generation prompt (what the model sees when it starts its reply) and up to the message itself: the difference is
the reply with whatever the template closes it with (ERNIE 4.5: ``<|end_of_sentence|>``), so the model also learns
to end its turn. A token is a target when it starts inside such a span; every other token (system, user, the
role prompts) has label -100. Labels are not shifted (the model shifts them, as transformers' models do).

A conversation longer than ``max_length`` tokens is cut at its end; one whose targets all lie past the cut is left
out (counted, and named in a warning). Templates that rewrite earlier turns when a later one is added (some
reasoning templates drop old "thinking") cannot be split this way and are refused with the reason.

Packing (:func:`pack_conversations`): conversations are concatenated, in a seeded order, into sequences of
``max_length`` tokens without splitting one; each sequence carries ``document_ids`` (attention stays within a
conversation) and ``position_ids`` restarting at 0 for every conversation, so a packed conversation gives the
same per-token losses as the conversation alone. The rest of a sequence is padding (its own document, no targets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from zhnlp.data.tasks import IGNORE_INDEX, Problems, jsonl_objects, read_lines
from zhnlp.errors import DataError

logger = logging.getLogger("zhnlp")

ROLES = ("system", "user", "assistant")
_SHAPE = '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}'


@dataclass
class Conversation:
    messages: list[dict]
    line: int | None = None  # the file's line (1-based), None for in-memory rows
    index: int = 0  # position in its source


# ------------------------------------------------------------------------------------------ reading
def _check(messages, where: str, problems: Problems) -> list[dict] | None:
    """The messages as plain ``{"role", "content"}`` dicts, or None after reporting what is wrong."""
    if not isinstance(messages, list) or not messages:
        problems.add(where, f"'messages' must be a non-empty list of {{'role', 'content'}} objects, got "
                            f"{type(messages).__name__ if not isinstance(messages, list) else 'an empty list'}; "
                            f"write the line as {_SHAPE}")
        return None
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            problems.add(where, f"message {i} is not an object with 'role' and 'content'; write it as "
                                '{"role": "user", "content": "..."}')
            return None
        role, content = m["role"], m["content"]
        if role not in ROLES:
            problems.add(where, f"message {i} has role {role!r}; use one of {', '.join(ROLES)}")
            return None
        if not isinstance(content, str):
            problems.add(where, f"message {i} ({role}) has content of type {type(content).__name__}; the content "
                                "must be a string")
            return None
        plain.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in plain):
        problems.add(where, "no assistant message: there is nothing to learn from; add the reply the model should "
                            "give (role 'assistant') or leave the conversation out")
        return None
    if any(not m["content"].strip() for m in plain if m["role"] == "assistant"):
        problems.add(where, "an assistant message is empty; give it the reply or leave the conversation out")
        return None
    return plain


def read_sft(path) -> list[Conversation]:
    """The conversations of a JSON-lines file (blank lines skipped); every problem is collected and raised as one
    :class:`DataError` naming ``FILE:LINE``."""
    path = Path(path)
    lines = read_lines(path, "chat (sft)")
    problems = Problems()
    out = []
    for number, where, row in jsonl_objects(path, lines, problems, _SHAPE):
        if "messages" not in row:
            problems.add(where, f"no 'messages' key (found {', '.join(map(repr, row)) or 'none'}); write the line "
                                f"as {_SHAPE}")
            continue
        messages = _check(row["messages"], where, problems)
        if messages is not None:
            out.append(Conversation(messages, line=number, index=len(out)))
    problems.raise_if_any(f"cannot read {path}")
    if not out:
        raise DataError(f"{path} holds no conversations; check that it is the right file")
    return out


def sft_from_rows(rows, name: str) -> list[Conversation]:
    """The conversations of in-memory rows (a ``datasets.Dataset`` with a ``messages`` column or dicts)."""
    rows = rows.to_list() if hasattr(rows, "to_list") else list(rows)
    problems = Problems()
    out = []
    for i, row in enumerate(rows):
        where = f"{name} row {i}"
        if not isinstance(row, dict) or "messages" not in row:
            problems.add(where, f"no 'messages' column; each row needs one like {_SHAPE}")
            continue
        messages = _check(row["messages"], where, problems)
        if messages is not None:
            out.append(Conversation(messages, index=len(out)))
    problems.raise_if_any(f"cannot read {name}")
    if not out:
        raise DataError(f"{name} holds no conversations")
    return out


# ------------------------------------------------------------------------------------------ encoding
def check_chat_template(tokenizer, source: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"the tokenizer of {source} has no chat template, so conversations cannot be formatted the "
                        "way the model expects; use a checkpoint that ships one (tokenizer_config.json "
                        "'chat_template' or chat_template.jinja), or set tokenizer.chat_template and save it there.")


def _render(tokenizer, messages: list[dict], prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """-> (the rendered conversation, the character spans ``[start, end)`` of the assistant replies)."""
    text = _render(tokenizer, messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], prompt=True)
        upto = _render(tokenizer, messages[:i + 1])
        if not (upto.startswith(before) and text.startswith(upto)):
            raise DataError("the chat template renders earlier turns differently once later ones follow (the text "
                            f"up to message {i} is not a prefix of the whole conversation), so the assistant's "
                            "tokens cannot be told apart; use a template that keeps earlier turns as they are.")
        spans.append((len(before), len(upto)))
    return text, spans


def encode_conversation(tokenizer, messages: list[dict], max_length: int | None = None) -> dict:
    """-> ``{"input_ids", "attention_mask", "labels", "truncated"}`` (lists; labels -100 off the assistant's
    tokens); see the module doc."""
    from zhnlp.tokenizers.auto import require_alignment

    require_alignment(tokenizer, "chat fine-tuning (SFT)")
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    starts = np.array([a for a, _ in spans])
    ends = np.array([b for _, b in spans])
    labels = []
    for token, (a, b) in zip(ids, offsets):
        target = b > a and bool(((starts <= a) & (a < ends)).any())
        labels.append(token if target else IGNORE_INDEX)
    truncated = max_length is not None and len(ids) > max_length
    if truncated:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels, "truncated": truncated}


def encode_sft(tokenizer, conversations: list[Conversation], max_length: int, name: str) -> list[dict]:
    """The features of ``conversations`` (:func:`encode_conversation`); conversations cut so short that no target
    is left are left out with one warning (the caller counts them as ``len(conversations) - len(features)``)."""
    features, empty, cut = [], [], 0
    for c in conversations:
        f = encode_conversation(tokenizer, c.messages, max_length)
        cut += f.pop("truncated")
        if all(t == IGNORE_INDEX for t in f["labels"][1:]):  # the first label is never a target (shifted away)
            empty.append(f"line {c.line}" if c.line is not None else f"row {c.index}")
            continue
        features.append(f)
    import torch.distributed as dist

    quiet = dist.is_initialized() and dist.get_rank() != 0  # every rank reads the data: one report is enough
    if cut and not quiet:
        logger.warning("%s: %d of %d conversations are longer than --max-length %d tokens and were cut at the end",
                       name, cut, len(conversations), max_length)
    if empty and not quiet:
        logger.warning("%s: %d conversations have no assistant token within --max-length %d and are left out "
                       "(%s%s); raise --max-length to keep them", name, len(empty), max_length,
                       ", ".join(empty[:5]), ", ..." if len(empty) > 5 else "")
    if not features:
        raise DataError(f"{name}: no conversation keeps an assistant token within --max-length {max_length}; "
                        "raise --max-length.")
    return features


# ------------------------------------------------------------------------------------------ packing
def pack_conversations(features: list[dict], length: int, seed: int) -> list[dict]:
    """Concatenate ``features`` (each at most ``length`` tokens), in the order of a permutation seeded with
    ``seed``, into sequences of up to ``length`` tokens without splitting one; -> features with ``input_ids``,
    ``labels``, ``document_ids`` and ``position_ids`` (unpadded: :func:`collate_packed` pads)."""
    order = np.random.default_rng([seed, 1]).permutation(len(features))
    packs, current, filled = [], [], 0
    for i in order:
        f = features[i]
        if current and filled + len(f["input_ids"]) > length:
            packs.append(current)
            current, filled = [], 0
        current.append(f)
        filled += len(f["input_ids"])
    if current:
        packs.append(current)
    out = []
    for group in packs:
        ids, labels, docs, positions = [], [], [], []
        for d, f in enumerate(group):
            n = len(f["input_ids"])
            ids += f["input_ids"]
            labels += [IGNORE_INDEX] + list(f["labels"][1:])  # nothing is predicted across conversations
            docs += [d] * n
            positions += list(range(n))
        out.append({"input_ids": ids, "labels": labels, "document_ids": docs, "position_ids": positions})
    return out


def collate_packed(features: list[dict], pad_to: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Packed features padded on the right to ``pad_to``: padding is a document of its own without targets."""
    rows = {k: [] for k in ("input_ids", "labels", "document_ids", "position_ids")}
    for f in features:
        n = len(f["input_ids"])
        if n > pad_to:
            raise ValueError(f"a packed sequence of {n} tokens is longer than pad_to={pad_to}")
        pad = pad_to - n
        last = f["document_ids"][-1] + 1 if n else 0
        rows["input_ids"].append(list(f["input_ids"]) + [pad_token_id] * pad)
        rows["labels"].append(list(f["labels"]) + [IGNORE_INDEX] * pad)
        rows["document_ids"].append(list(f["document_ids"]) + [last] * pad)
        rows["position_ids"].append(list(f["position_ids"]) + list(range(pad)))
    return {k: torch.tensor(v, dtype=torch.long) for k, v in rows.items()}
