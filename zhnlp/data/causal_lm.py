"""Causal-LM pretraining samples: a preprocessed corpus packed into full windows, no padding.

Reads what ``zhnlp preprocess --objective causal-lm`` writes: ``PREFIX.bin/.idx`` with one sequence per
document (its token ids, then the end-of-document id, EOD) and ``PREFIX.json`` naming that id.

Packing, as megatron's ``GPTDataset`` does it: the documents are shuffled with the seed and concatenated
into one token stream (EODs between them); sample ``k`` is the window ``stream[k*(L-1) : k*(L-1) + L]`` of
``L = seq_length`` tokens. ``input_ids`` and ``labels`` are that same window: the model shifts the labels
itself (position t predicts token t+1), so a window holds ``L - 1`` targets and consecutive windows overlap
by one token, the last input of one window being the first of the next. Every token of the stream after
the first is thus a target exactly once; only the stream's tail shorter than a window (under ``L - 1``
tokens, ``dropped_tokens``) is left out. (megatron reads ``L + 1`` tokens per sample of length ``L`` and
shifts them itself; the accounting is the same with its ``L`` = ours minus one.) The window order is
shuffled with the seed too. Every sample is a pure function of ``(seed, index)``, the same for every
parallel layout, and a resumed run sees what the uninterrupted one would have seen.

Documents in a window: by default a position attends to every earlier position of the window, across
EODs (the usual packed pretraining). With ``reset_attention`` attention stops at document ends and the
position ids restart: the sample adds ``document_ids`` (b, s: the window's document number of every token;
an EOD belongs to the document it ends) and ``position_ids`` (from 0 at each document start, and at the
window start for the document cut there), as megatron's ``reset_attention_mask`` / ``reset_position_ids``.
The loss is unchanged: the EOD itself is a target (the model learns where documents end), and so is the
first token of the next document, predicted from the EOD position; ``eod_mask_loss`` drops the latter
(megatron's option of that name): ``labels`` is -100 right after each EOD.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from zhnlp.errors import DataError

def corpus_info(prefix) -> dict:
    """``PREFIX.json`` of a preprocessed corpus (``{}`` when there is none); ``objective`` filled in as
    ``mlm`` for corpora written before the causal-LM mode existed."""
    meta = Path(f"{prefix}.json")
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError:
        raise DataError(f"{meta} is damaged (not the JSON object zhnlp preprocess writes); preprocess the "
                        "corpus again.") from None
    if not isinstance(info, dict):
        raise DataError(f"{meta} is damaged (not the JSON object zhnlp preprocess writes); preprocess the "
                        "corpus again.")
    return {"objective": "mlm", **info}


def check_objective(prefix, objective: str, recipe: str) -> None:
    """DataError unless the corpus at ``prefix`` was preprocessed for ``objective`` (``mlm`` or
    ``causal-lm``), naming the command that prepares it for ``recipe``."""
    found = corpus_info(prefix).get("objective", "mlm")
    if found == objective:
        return
    kinds = {"mlm": "masked-LM pretraining (sentences with masking units)",
             "causal-lm": "causal-LM pretraining (whole documents with EOD)"}
    raise DataError(f"--data {prefix} was preprocessed for {kinds.get(found, repr(found))}, but recipe {recipe!r} "
                    f"needs a corpus for {kinds[objective]}; preprocess the text again with `zhnlp preprocess "
                    f"--objective {objective} --input FILE --output PREFIX --tokenizer DIR`.")


class CausalLMDataset:
    """Indexable causal-LM windows (``dataset[i]`` -> dict of int64 numpy arrays of ``seq_length``).

    Args:
        prefix: output prefix of ``zhnlp preprocess --objective causal-lm``.
        seq_length: tokens per window (``seq_length - 1`` targets).
        seed: document and window order.
        reset_attention: add ``document_ids`` and per-document ``position_ids`` (see the module doc).
        eod_mask_loss: no target right after an EOD.
    """

    def __init__(self, prefix, seq_length: int, seed: int = 1234, reset_attention: bool = False,
                 eod_mask_loss: bool = False):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        if seq_length < 2:
            raise DataError(f"seq_length={seq_length} is too short for a causal-LM window; use >= 2.")
        from zhnlp.data.pretraining import check_corpus_prefix

        check_corpus_prefix(prefix, "causal-lm")
        check_objective(prefix, "causal-lm", "a causal-LM recipe")
        info = corpus_info(prefix)
        if not isinstance(info.get("eod_token_id"), int):
            raise DataError(f"{prefix}.json names no eod_token_id; preprocess the corpus again with zhnlp "
                            "preprocess --objective causal-lm.")
        self.eod = info["eod_token_id"]
        self.tokens = IndexedDataset(str(prefix)) if Path(f"{prefix}.bin").stat().st_size else None
        self.seq_length, self.seed = seq_length, seed
        self.reset_attention, self.eod_mask_loss = reset_attention, eod_mask_loss
        lengths = self.tokens.sequence_lengths.astype(np.int64) if self.tokens is not None else np.zeros(0, np.int64)
        self.order = np.random.default_rng([seed, 0]).permutation(len(lengths))  # documents in stream order
        self.starts = np.concatenate([[0], np.cumsum(lengths[self.order])])  # stream offset of each document
        total, stride = int(self.starts[-1]), seq_length - 1
        windows = (total - seq_length) // stride + 1 if total >= seq_length else 0
        if windows == 0:
            raise DataError(f"--data {prefix} holds {total} tokens, fewer than one window of seq_length="
                            f"{seq_length}; use more text or a shorter --seq-length.")
        self.total_tokens = total
        self.dropped_tokens = total - ((windows - 1) * stride + seq_length)
        self.windows = np.random.default_rng([seed, 1]).permutation(windows)  # sample i -> window windows[i]

    def __len__(self) -> int:
        return len(self.windows)

    def window(self, k: int) -> np.ndarray:
        """Tokens ``stream[k*(L-1) : k*(L-1) + L]`` of window ``k`` (in stream order, not sample order)."""
        start = k * (self.seq_length - 1)
        end = start + self.seq_length
        doc = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        while start < end:
            offset = start - int(self.starts[doc])
            take = min(end, int(self.starts[doc + 1])) - start
            pieces.append(self.tokens.get(int(self.order[doc]), offset=offset, length=take))
            start += take
            doc += 1
        return np.concatenate(pieces).astype(np.int64)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range [0, {len(self)})")
        ids = self.window(int(self.windows[index]))
        labels = ids.copy()
        after_eod = np.concatenate([[False], ids[:-1] == self.eod])  # the first token of a document
        if self.eod_mask_loss:
            labels[after_eod] = -100
        out = {"input_ids": ids, "labels": labels}
        if self.reset_attention:
            documents = np.cumsum(after_eod)  # (s,): 0 for the window's first document
            first = np.flatnonzero(np.concatenate([[True], after_eod[1:]]))  # where each document starts
            out["document_ids"] = documents.astype(np.int64)
            out["position_ids"] = (np.arange(len(ids)) - first[documents]).astype(np.int64)
        return out
