"""BERT-Chinese / ERNIE WordPiece tokenizer: a ``tokenizers`` pipeline built from ``vocab.txt``.

The pipeline is the one BERT-Chinese and ERNIE were trained with: clean the text, put spaces
around every CJK character (so each becomes its own token), lower-case and strip accents when
the vocabulary is uncased, split on whitespace and punctuation, then greedy longest-match
WordPiece with ``##`` continuations. It runs in Rust (the ``tokenizers`` library), and every
normalisation step keeps an alignment, so offsets always point into the caller's string.

The wrapper class is transformers' fast-tokenizer base, so ``tokenizer(text, pair, truncation=,
max_length=, stride=, return_overflowing_tokens=, padding=, return_offsets_mapping=,
return_tensors=)`` behaves exactly as ``transformers.BertTokenizerFast``. ``save_pretrained``
writes ``vocab.txt``, ``tokenizer.json`` and a ``tokenizer_config.json`` that
``transformers.AutoTokenizer`` loads with identical ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import PreTrainedTokenizerFast

from zhnlp.errors import TokenizerError
from zhnlp.fileio import undecodable

SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}

# Full-width ASCII variants U+FF01..U+FF5E map one to one onto U+0021..U+007E. (U+3000, the
# ideographic space, needs no rule: BertNormalizer already treats it as whitespace.)
_FULLWIDTH = [(chr(0xFF01 + i), chr(0x21 + i)) for i in range(0x5E)]


def read_vocab(path: str | os.PathLike) -> dict[str, int]:
    """``vocab.txt`` (one token a line, the line number is the id) as ``{token: id}``.

    Refused with a :class:`~zhnlp.errors.TokenizerError` naming the file (and line): a file that
    is not UTF-8, an empty file, and a token on two lines (transformers would map the token to
    the later id and leave the earlier id without a token, so ids and tokens would disagree).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no vocabulary file at {path}; pass a directory holding vocab.txt "
                                "(BERT/ERNIE WordPiece, one token per line).")
    # Only the newline is stripped, as transformers' BertTokenizer does: stripping more would
    # rename whitespace-like tokens (bert-base-chinese has a U+2028 line), so a saved vocab.txt
    # would no longer equal the original. Lines are split as Python's text files split them
    # (\n, \r\n or \r), which is also what BertTokenizer reads.
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f]
    except UnicodeDecodeError:
        raise TokenizerError(f"{path} is not UTF-8 text ({undecodable(path.read_bytes())}); a WordPiece vocabulary "
                             "must be UTF-8: re-save it as UTF-8 or use the vocab.txt that came with the model.") from None
    if not lines:
        raise TokenizerError(f"{path} is empty; a WordPiece vocabulary holds one token per line ([PAD], [UNK], "
                             "[CLS], [SEP], [MASK] and the rest): use the vocab.txt that came with the model or "
                             "train one with `zhnlp tokenizer train-wordpiece`.")
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        first = vocab.setdefault(token, i)
        if first != i:
            what = "are both empty" if token == "" else f"both hold the token {token!r}"
            raise TokenizerError(
                f"{path}: lines {first + 1} and {i + 1} {what} (ids {first} and {i}), so the token -> id map and "
                f"the id -> token list would disagree; replace line {first + 1} with an unused placeholder such as "
                f"[unused{first}] (every id stays in place, and the token keeps id {i}, the one transformers "
                "gives it), or use the vocab.txt that came with the model.")
    return vocab


def check_vocab_ids(vocab: dict[str, int], source: str) -> None:
    """A ``{token: id}`` map (e.g. from a tokenizer.json) must give each token its own id >= 0."""
    by_id: dict[int, str] = {}
    for token, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise TokenizerError(f"{source}: token {token!r} has id {i!r}; vocabulary ids must be integers >= 0. "
                                 "Use the tokenizer files that came with the model.")
        other = by_id.setdefault(i, token)
        if other != token:
            raise TokenizerError(f"{source}: tokens {other!r} and {token!r} both have id {i}; each id must belong "
                                 "to one token. Use the tokenizer files that came with the model.")


def build_backend(vocab: dict[str, int], *, do_lower_case: bool = True, strip_accents: bool | None = None,
                  tokenize_chinese_chars: bool = True, normalize_fullwidth: bool = False,
                  cls_token: str = "[CLS]", sep_token: str = "[SEP]", unk_token: str = "[UNK]") -> Tokenizer:
    """The Rust ``tokenizers.Tokenizer`` for a WordPiece vocabulary.

    ``strip_accents=None`` follows ``do_lower_case`` (the original BERT rule). ``normalize_fullwidth``
    maps full-width ASCII (``Ａ１，！``) to half-width before everything else; it is off by default
    because BERT-Chinese was trained without it, so turning it on changes ids.
    """
    backend = Tokenizer(WordPiece(vocab, unk_token=unk_token))
    bert = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
                                      strip_accents=strip_accents, lowercase=do_lower_case)
    if normalize_fullwidth:
        bert = normalizers.Sequence([normalizers.Replace(a, b) for a, b in _FULLWIDTH] + [bert])
    backend.normalizer = bert
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0",
        pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, vocab[cls_token]), (sep_token, vocab[sep_token])])
    return backend


class WordPieceTokenizer(PreTrainedTokenizerFast):
    """Fast BERT-Chinese / ERNIE tokenizer with the transformers call API.

    Build one with :meth:`from_vocab` (or ``zhnlp.tokenizers.AutoTokenizer.from_pretrained``).
    """

    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]

    def __init__(self, *, tokenizer_object: Tokenizer, do_lower_case: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, normalize_fullwidth: bool = False, **kwargs):
        # Kept as attributes so save_pretrained writes them into tokenizer_config.json, where
        # transformers' BertTokenizer reads them back to rebuild the same normaliser.
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.normalize_fullwidth = normalize_fullwidth
        for key, value in SPECIAL_TOKENS.items():
            kwargs.setdefault(key, value)
        super().__init__(tokenizer_object=tokenizer_object, do_lower_case=do_lower_case, strip_accents=strip_accents,
                         tokenize_chinese_chars=tokenize_chinese_chars, normalize_fullwidth=normalize_fullwidth,
                         **kwargs)

    @classmethod
    def from_vocab(cls, vocab: str | os.PathLike | dict[str, int], *, do_lower_case: bool = True,
                   strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                   normalize_fullwidth: bool = False, source: str | None = None,
                   **kwargs) -> WordPieceTokenizer:
        """A tokenizer for ``vocab`` (a ``vocab.txt`` path or a ``{token: id}`` dict).

        ``source`` names a dict's origin (e.g. a tokenizer.json path) in error messages. Extra
        keyword arguments (``model_max_length``, ``padding_side``, ...) go to transformers'
        tokenizer base class.
        """
        if isinstance(vocab, dict):
            source = source or "the vocabulary"
            check_vocab_ids(vocab, source)
        else:
            source = source or str(vocab)
            vocab = read_vocab(vocab)
        if not vocab:
            raise TokenizerError(f"{source} is empty; a WordPiece vocabulary needs its tokens ([PAD], [UNK], [CLS], "
                                 "[SEP], [MASK] and the rest).")
        special = {key: kwargs.get(key, default) for key, default in SPECIAL_TOKENS.items()}
        missing = [token for token in special.values() if token not in vocab]
        if missing:
            raise TokenizerError(f"{source} lacks the special tokens {missing}; a BERT/ERNIE WordPiece vocabulary "
                                 f"needs {list(special.values())} (name others with pad_token=..., cls_token=..., or "
                                 "train one with `zhnlp tokenizer train-wordpiece`).")
        backend = build_backend(vocab, do_lower_case=do_lower_case, strip_accents=strip_accents,
                                tokenize_chinese_chars=tokenize_chinese_chars,
                                normalize_fullwidth=normalize_fullwidth,
                                cls_token=special["cls_token"], sep_token=special["sep_token"],
                                unk_token=special["unk_token"])
        return cls(tokenizer_object=backend, do_lower_case=do_lower_case, strip_accents=strip_accents,
                   tokenize_chinese_chars=tokenize_chinese_chars, normalize_fullwidth=normalize_fullwidth, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> tuple[str, ...]:
        """Write ``vocab.txt``, ``tokenizer.json`` and ``tokenizer_config.json`` to ``save_directory``.

        The config names ``BertTokenizer``, so ``transformers.AutoTokenizer`` rebuilds the same
        pipeline. With ``normalize_fullwidth`` it names the generic fast tokenizer instead: that
        one runs ``tokenizer.json`` verbatim (full-width rule included), which BertTokenizer would
        rebuild without the rule.
        """
        files = super().save_pretrained(save_directory, **kwargs)
        directory = Path(save_directory)
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config["tokenizer_class"] = "TokenizersBackend" if self.normalize_fullwidth else "BertTokenizer"
        # The generic class would otherwise drop token_type_ids, which BERT/ERNIE models take.
        config["model_input_names"] = list(self.model_input_names)
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                               encoding="utf-8")
        vocab_file = directory / "vocab.txt"
        by_id = {i: token for token, i in self.backend_tokenizer.get_vocab(with_added_tokens=False).items()}
        # A vocabulary dict with gaps in its ids (read_vocab refuses repeated vocab.txt lines, so
        # only a dict can have them) gets placeholder lines: every token stays on its id's line.
        lines = [by_id.get(i, f"[zhnlp-unused-{i}]") for i in range(max(by_id) + 1)]
        vocab_file.write_text("".join(f"{token}\n" for token in lines), encoding="utf-8")
        return (*files, str(vocab_file))


def wordpiece_config_flags(config: dict) -> dict:
    """The normaliser switches a ``tokenizer_config.json`` sets, with BERT-Chinese defaults.

    ``do_lower_case`` defaults to True: every released Chinese BERT/ERNIE vocabulary is uncased
    (its Latin letters are lower-case only), so an uncased pipeline is the safe reading of a
    config that does not say.
    """
    flags = {"do_lower_case": config.get("do_lower_case", True), "strip_accents": config.get("strip_accents"),
             "tokenize_chinese_chars": config.get("tokenize_chinese_chars", True),
             "normalize_fullwidth": config.get("normalize_fullwidth", False)}
    for key in SPECIAL_TOKENS:
        value = config.get(key)
        if isinstance(value, dict):  # AddedToken serialised as {"content": ..., ...}
            value = value.get("content")
        if value is not None:
            flags[key] = value
    if isinstance(config.get("model_max_length"), int) and config["model_max_length"] < 10**9:
        flags["model_max_length"] = config["model_max_length"]
    return flags
