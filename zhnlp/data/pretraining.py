"""Masked-LM pretraining samples over a preprocessed corpus, with Chinese masking units.

Reads what :mod:`zhnlp.data.preprocess` writes: ``PREFIX`` (token ids, one sequence per
sentence, grouped into documents) and ``PREFIX_units`` (the masking unit of every token,
-1 = none). A sample packs consecutive sentences of one document into ``[CLS] A [SEP]``, or
with the sentence-pair objective ``[CLS] A [SEP] B [SEP]`` where B follows A in the document,
or (sentence-order prediction) the two are swapped, labelled 1.

Masking picks whole *units* until ``mask_prob`` of the tokens are chosen: a unit is a jieba
word (Chinese whole-word masking) or a phrase/entity when the side data holds those (ERNIE's
knowledge masking); with ``max_ngram > 1`` several consecutive units are masked together,
shorter spans more often. Chosen tokens become [MASK] 80% of the time, a random token 10%,
and stay unchanged 10%; labels hold the original ids there and -100 elsewhere.

Every sample is a pure function of ``(seed, index)``: a run resumed at sample ``n`` sees
exactly what the uninterrupted run would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zhnlp.errors import DataError, ZhnlpError

CORPUS_FILES = (".bin", ".idx", "_units.bin", "_units.idx")  # what ``zhnlp preprocess --output PREFIX`` writes


def check_corpus_prefix(prefix, objective: str = "mlm") -> None:
    """DataError naming ``prefix`` unless a corpus preprocessed for ``objective`` (``mlm``, or
    ``causal-lm``: no unit side data) lies there (a directory given instead of a prefix gets the
    prefixes inside it as suggestions)."""
    prefix = Path(prefix)
    files = CORPUS_FILES if objective == "mlm" else (".bin", ".idx", ".json")
    missing = [f"{prefix}{suffix}" for suffix in files if not Path(f"{prefix}{suffix}").is_file()]
    if not missing:
        return
    if prefix.is_dir():
        found = sorted(str(p.with_suffix("")) for p in prefix.glob("*.idx") if not p.stem.endswith("_units"))
        hint = f" (it holds {', '.join(found[:3])})" if found else ""
        raise DataError(f"--data {prefix} is a directory; pass the prefix of a preprocessed corpus, e.g. DIR/NAME for "
                        f"DIR/NAME.bin and DIR/NAME.idx{hint}.")
    flag = "" if objective == "mlm" else f" --objective {objective}"
    raise DataError(f"--data {prefix}: no preprocessed corpus there (missing {', '.join(missing)}); write one with "
                    f"`zhnlp preprocess{flag} --input FILE --output {prefix} --tokenizer DIR`.")


@dataclass(frozen=True)
class SpecialTokens:
    """Ids the samples need from the tokenizer."""

    cls: int
    sep: int
    mask: int
    pad: int
    vocab_size: int
    first_regular: int = 104  # random replacements are drawn from [first_regular, vocab_size)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "SpecialTokens":
        """From a zhnlp/transformers tokenizer. Random replacements come from the ids after the
        last special token (BERT-Chinese: 104 on, leaving out [unused*] and the specials)."""
        return cls(cls=tokenizer.cls_token_id, sep=tokenizer.sep_token_id, mask=tokenizer.mask_token_id,
                   pad=tokenizer.pad_token_id, vocab_size=len(tokenizer.get_vocab()),
                   first_regular=max(tokenizer.all_special_ids) + 1)


class MaskedLMDataset:
    """Indexable masked-LM samples (``dataset[i]`` -> dict of numpy arrays).

    Args:
        prefix: output prefix of :func:`zhnlp.data.preprocess.preprocess`.
        special: the tokenizer's special ids.
        seq_length: tokens per sample including [CLS]/[SEP].
        mask_prob: fraction of tokens to predict.
        max_ngram: longest span of consecutive units masked together (1 = single units).
        sentence_pairs: build ``A [SEP] B`` samples with a sentence-order label.
        use_units: mask whole units (False: every token alone, as BERT's original masking).
        seed: samples are a function of ``(seed, index)``.
    """

    def __init__(self, prefix, special: SpecialTokens, seq_length: int = 128, mask_prob: float = 0.15,
                 max_ngram: int = 1, sentence_pairs: bool = False, use_units: bool = True, seed: int = 1234):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        if seq_length < 8:
            raise ZhnlpError(f"seq_length={seq_length} is too short for a masked-LM sample; use >= 8.")
        check_corpus_prefix(prefix)
        empty = Path(f"{prefix}.bin").stat().st_size == 0  # megatron cannot even map an empty file
        if not empty:
            self.tokens = IndexedDataset(str(prefix))
            self.units = IndexedDataset(f"{prefix}_units")
        if empty or len(self.tokens) == 0:
            raise DataError(f"--data {prefix} holds no sentences (its corpus was empty); preprocess a corpus with "
                            "text in it.")
        if len(self.tokens) != len(self.units):
            raise ZhnlpError(f"{prefix}: token and unit side data disagree ({len(self.tokens)} vs "
                             f"{len(self.units)} sequences); preprocess the corpus again.")
        self.special, self.seq_length, self.mask_prob = special, seq_length, mask_prob
        self.max_ngram, self.sentence_pairs, self.use_units, self.seed = max_ngram, sentence_pairs, use_units, seed
        self.samples = self._build_index()

    def _build_index(self) -> np.ndarray:
        """(first sentence, end sentence, split) per sample: greedy packing within documents.
        ``split`` is where B starts (== end when there is no B)."""
        lengths = self.tokens.sequence_lengths
        docs = self.tokens.document_indices
        budget = self.seq_length - (3 if self.sentence_pairs else 2)
        rows = []
        for d in range(len(docs) - 1):
            start, total = docs[d], 0
            for s in range(docs[d], docs[d + 1]):
                if total and total + lengths[s] > budget:
                    rows.append((start, s))
                    start, total = s, 0
                total += lengths[s]
            if total:
                rows.append((start, docs[d + 1]))
        if self.sentence_pairs:
            # keep only samples with at least two sentences; split them in the middle
            rows = [(a, b, (a + b + 1) // 2) for a, b in rows if b - a >= 2]
        else:
            rows = [(a, b, b) for a, b in rows]
        if not rows:
            raise ZhnlpError("the corpus yields no samples"
                             + (" with two sentences (sentence_pairs=True)" if self.sentence_pairs else "")
                             + "; use more text or a shorter seq_length.")
        return np.asarray(rows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.samples)

    def _segment(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and globally numbered units of sentences [first, end)."""
        ids, units, offset = [], [], 0
        for s in range(first, end):
            t = np.asarray(self.tokens[s], dtype=np.int64)
            u = np.asarray(self.units[s], dtype=np.int64)
            if not self.use_units:
                u = np.full_like(u, -1)
            # number units uniquely across sentences; tokens without a unit get their own
            own = np.arange(offset, offset + len(u)) + 1_000_000
            u = np.where(u >= 0, u + offset, own)
            offset += len(u) + 1
            ids.append(t)
            units.append(u)
        return np.concatenate(ids), np.concatenate(units)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range [0, {len(self)})")
        rng = np.random.default_rng([self.seed, index])
        first, end, split = (int(x) for x in self.samples[index])
        sp = self.special
        a_ids, a_units = self._segment(first, split)
        order_label = 0
        if self.sentence_pairs:
            b_ids, b_units = self._segment(split, end)
            if rng.random() < 0.5:  # sentence-order prediction: swapped pairs are labelled 1
                a_ids, a_units, b_ids, b_units, order_label = b_ids, b_units, a_ids, a_units, 1
            a_ids, a_units, b_ids, b_units = _truncate_pair(a_ids, a_units, b_ids, b_units, self.seq_length - 3)
            ids = np.concatenate([[sp.cls], a_ids, [sp.sep], b_ids, [sp.sep]])
            units = np.concatenate([[-1], a_units, [-1], b_units + 10_000_000, [-1]])
            types = np.concatenate([np.zeros(len(a_ids) + 2), np.ones(len(b_ids) + 1)])
        else:
            a_ids, a_units = a_ids[: self.seq_length - 2], a_units[: self.seq_length - 2]
            ids = np.concatenate([[sp.cls], a_ids, [sp.sep]])
            units = np.concatenate([[-1], a_units, [-1]])
            types = np.zeros(len(ids))
        masked_ids, labels = self._mask(ids, units, rng)
        n = len(ids)
        pad = self.seq_length - n
        out = {
            "input_ids": np.pad(masked_ids, (0, pad), constant_values=sp.pad),
            "labels": np.pad(labels, (0, pad), constant_values=-100),
            "token_type_ids": np.pad(types, (0, pad)).astype(np.int64),
            "attention_mask": np.pad(np.ones(n, dtype=np.int64), (0, pad)),
        }
        if self.sentence_pairs:
            out["sentence_order_label"] = np.int64(order_label)
        return out

    def _mask(self, ids: np.ndarray, units: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
        return mask_units(ids, units, rng, self.special, self.mask_prob, self.max_ngram)


def mask_units(ids: np.ndarray, units: np.ndarray, rng, special: SpecialTokens, mask_prob: float,
               max_ngram: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """-> (masked ids, labels): whole units (``units[i]``: token i's unit, -1 = never masked) chosen in a random
    order until ``mask_prob`` of the unit tokens (at least one) are picked, never overshooting with a second span;
    with ``max_ngram > 1`` runs of consecutive units go together. Picked tokens become [MASK] 80% of the time, a
    random regular token 10%, stay 10%; ``labels`` holds their original ids and -100 elsewhere. A pure function
    of ``rng``'s state (pretraining samples and fine-tuning's masked LM share it)."""
    sp = special
    candidates = []  # unit -> token positions, in text order
    positions: dict[int, list[int]] = {}
    for pos, u in enumerate(units):
        if u < 0:
            continue
        if u not in positions:
            positions[u] = []
            candidates.append(u)
        positions[u].append(pos)
    n_tokens = sum(len(p) for p in positions.values())
    target = max(1, int(round(n_tokens * mask_prob)))
    chosen: list[int] = []
    covered: set[int] = set()
    for start in rng.permutation(len(candidates)):
        if len(chosen) >= target:
            break
        span = _ngram(rng, max_ngram)
        span_units = candidates[start:start + span]
        span_pos = [p for u in span_units for p in positions[u]]
        if any(p in covered for p in span_pos):
            continue
        if len(chosen) + len(span_pos) > target and chosen:
            continue  # would overshoot: try a shorter span elsewhere
        chosen.extend(span_pos)
        covered.update(span_pos)
    labels = np.full(len(ids), -100, dtype=np.int64)
    masked = ids.copy()
    for pos in chosen:
        labels[pos] = ids[pos]
        r = rng.random()
        if r < 0.8:
            masked[pos] = sp.mask
        elif r < 0.9:
            masked[pos] = rng.integers(sp.first_regular, sp.vocab_size)
    return masked, labels


def _ngram(rng, max_ngram: int) -> int:
    """Span length in units: 1..max_ngram with probability proportional to 1/n."""
    if max_ngram <= 1:
        return 1
    weights = 1.0 / np.arange(1, max_ngram + 1)
    return int(rng.choice(np.arange(1, max_ngram + 1), p=weights / weights.sum()))


def _truncate_pair(a, au, b, bu, budget: int):
    """Trim the longer side (from its end) until both fit in ``budget`` tokens."""
    while len(a) + len(b) > budget:
        if len(a) >= len(b):
            a, au = a[:-1], au[:-1]
        else:
            b, bu = b[:-1], bu[:-1]
    return a, au, b, bu
