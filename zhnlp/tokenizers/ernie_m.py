"""ERNIE-M's tokenizer: a SentencePiece model whose pieces are cut further and looked up in a ``vocab.txt``.

An ERNIE-M directory (``susnato/ernie-m-base_pytorch`` and the like) holds::

    sentencepiece.bpe.model    the SentencePiece model (XLM-R's file name, whatever the model's type)
    vocab.txt                  one token a line, the line number is the id: [CLS] [PAD] [SEP] [UNK] ..., [MASK]
    tokenizer_config.json      tokenizer_class "ErnieMTokenizer", do_lower_case, the special tokens

The ids are those of transformers 4.x's ``ErnieMTokenizer`` (removed in transformers 5), which follows
PaddleNLP's: the text is split around the special tokens, each part is encoded into pieces by the SentencePiece
model, and every piece is then cut before and after each CJK ideograph (U+4E00..U+9FFF) and each of
``,;:.?!~，；：。？！《》【】``, and between digits and non-digits; a word-start mark ``▁`` left alone by a cut is
dropped, and a lone ``▁`` piece is kept only inside the text and before a piece that does not start a word.
The resulting strings are looked up in ``vocab.txt`` (not in the SentencePiece model, whose ids differ), anything
missing becoming ``[UNK]``. Pairs are ``[CLS] A [SEP] [SEP] B [SEP]``. The ids are transformers'; the outputs are
``input_ids``, ``token_type_ids`` and ``attention_mask``, as for the other encoders, where transformers' class
returns ``input_ids`` alone unless asked (its model masks the pad id itself): zhnlp's task data and pipelines
read all three, and ERNIE-M's model accepts the token types and ignores them (it has no token type embeddings).

Because the cut runs after the SentencePiece segmentation, whose choices depend on the whole word, no fast
(Rust ``tokenizers``) pipeline gives these ids: this is a Python tokenizer on transformers' slow-tokenizer
base, so offsets (``return_offsets_mapping``) are not available, as with transformers' own. ``save_pretrained``
writes the three files above, which transformers 4.x's ``ErnieMTokenizer`` loads back with the same ids.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from transformers import AddedToken, PreTrainedTokenizer

from zhnlp.errors import TokenizerError
from zhnlp.tokenizers.wordpiece import read_vocab

MODEL_FILE = "sentencepiece.bpe.model"
VOCAB_FILE = "vocab.txt"
TOKENIZER_CLASS = "ErnieMTokenizer"
MODEL_TYPE = "ernie_m"
SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}
WORD_START = "\u2581"  # SentencePiece's "▁"
# Characters a piece is cut around (besides CJK ideographs), as in PaddleNLP's ERNIE-M tokenizer.
PUNCTUATION = frozenset(",;:.?!~，；：。？！《》【】")
# sp_model_kwargs that change the segmentation (subword regularisation), as transformers' class reads them.
_SAMPLING = {"enable_sampling", "alpha", "nbest_size"}

_FIX = ("use the tokenizer files that came with the model (sentencepiece.bpe.model, vocab.txt, "
        "tokenizer_config.json)")


def is_ernie_m_layout(directory: Path, tokenizer_config: dict) -> bool:
    """True for an ERNIE-M tokenizer directory: its tokenizer_config names ``ErnieMTokenizer``, or it holds
    ``sentencepiece.bpe.model`` beside a config.json of ``model_type`` ``ernie_m``."""
    if tokenizer_config.get("tokenizer_class") == TOKENIZER_CLASS:
        return True
    config = directory / "config.json"
    if not (directory / MODEL_FILE).is_file() or not config.is_file():
        return False
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False  # not this loader's file to judge; loading the model names the problem
    return model_type == MODEL_TYPE


def _is_cjk(char: str) -> bool:
    return "\u4e00" <= char <= "\u9fff"


def cut_piece(piece: str) -> list[str]:
    """One SentencePiece piece -> the strings ERNIE-M looks up: CJK ideographs and the punctuation above stand
    alone, digit runs are separated from what is around them, and a bare ``▁`` left before a cut is dropped."""
    out: list[str] = []
    start = 0  # where the pending, not yet emitted stretch of the piece begins

    def flush(end: int) -> None:
        if end > start and piece[start:end] != WORD_START:
            out.append(piece[start:end])

    for i, char in enumerate(piece):
        if char == WORD_START:
            continue
        if _is_cjk(char) or char in PUNCTUATION:
            flush(i)
            out.append(char)
            start = i + 1
        elif i > 0 and char.isdigit() != piece[i - 1].isdigit():
            flush(i)
            start = i
    if start < len(piece):
        out.append(piece[start:])
    return out


def cut_pieces(pieces: list[str]) -> list[str]:
    """A text's SentencePiece pieces -> ERNIE-M's tokens (see :func:`cut_piece`). A lone ``▁`` piece stays only
    when it is not the first and the piece after it does not start a word itself."""
    out: list[str] = []
    for k, piece in enumerate(pieces):
        if piece == WORD_START:
            # (transformers' class fails on a lone "▁" as the last piece; here it is dropped)
            if k > 0 and k + 1 < len(pieces) and not pieces[k + 1].startswith(WORD_START):
                out.append(piece)
            continue
        out.extend(cut_piece(piece))
    return out


class ErnieMTokenizer(PreTrainedTokenizer):
    """ERNIE-M's tokenizer with transformers' call API (a Python tokenizer; see the module docstring).

    Build one with :func:`load_ernie_m_tokenizer` (or ``zhnlp.AutoTokenizer.from_pretrained(directory)``).
    ``vocab_file`` None uses the SentencePiece model's own pieces and ids.
    """

    vocab_files_names = {"vocab_file": VOCAB_FILE, "sentencepiece_model_ckpt": MODEL_FILE}
    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]  # transformers 4.x: ["input_ids"]

    def __init__(self, sentencepiece_model_ckpt: str | os.PathLike, vocab_file: str | os.PathLike | None = None,
                 do_lower_case: bool = False, sp_model_kwargs: dict | None = None, **kwargs):
        from zhnlp.tokenizers.sentencepiece import _processor

        self.sp_model_kwargs = dict(sp_model_kwargs or {})
        unknown = sorted(set(self.sp_model_kwargs) - _SAMPLING)
        if unknown:
            raise TokenizerError(f"sp_model_kwargs {unknown} are not supported; ERNIE-M's tokenizer takes "
                                 f"{sorted(_SAMPLING)} (subword sampling). Drop the others.")
        self.do_lower_case = do_lower_case
        self.sentencepiece_model_ckpt = str(sentencepiece_model_ckpt)
        self.sp_model = _processor(Path(sentencepiece_model_ckpt))
        if vocab_file is not None:
            self.vocab = read_vocab(vocab_file)  # one token a line (UTF-8, not empty, no token twice)
        else:
            self.vocab = {self.sp_model.id_to_piece(i): i for i in range(self.sp_model.get_piece_size())}
        self.ids_to_tokens = {i: token for token, i in self.vocab.items()}
        for key, default in SPECIAL_TOKENS.items():
            kwargs.setdefault(key, default)
        decoder = kwargs.pop("added_tokens_decoder", None) or {}
        kwargs["added_tokens_decoder"] = {int(i): AddedToken(**t) if isinstance(t, dict) else t
                                          for i, t in decoder.items()}
        super().__init__(do_lower_case=do_lower_case, sp_model_kwargs=self.sp_model_kwargs, **kwargs)

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict[str, int]:
        return {**self.vocab, **self._added_tokens_encoder}

    def _convert_token_to_id(self, token: str) -> int:
        return self.vocab.get(token, self.vocab.get(self.unk_token))

    def _convert_id_to_token(self, index: int) -> str:
        return self.ids_to_tokens.get(index, self.unk_token)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens).replace(WORD_START, " ").strip()

    # ------------------------------------------------------------------ tokenizing
    def prepare_for_tokenization(self, text: str, is_split_into_words: bool = False, **kwargs):
        """``do_lower_case``: lower-case the text except the special tokens (and non-special added tokens that
        are normalised), before it is split around them."""
        if self.do_lower_case:
            keep = {*self.all_special_tokens, *(t.content for t in self._added_tokens_decoder.values()
                                                 if not t.special and t.normalized)}
            if keep:
                pattern = "(" + "|".join(re.escape(t) for t in sorted(keep, key=len, reverse=True)) + ")"
                parts = re.split(pattern, text)  # odd indices: the kept tokens
                text = "".join(part if i % 2 else part.lower() for i, part in enumerate(parts))
            else:
                text = text.lower()
        return text, kwargs

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        options = self.sp_model_kwargs
        if options.get("enable_sampling"):
            pieces = self.sp_model.encode(text, out_type=str, enable_sampling=True, alpha=options.get("alpha", 0.1),
                                          nbest_size=options.get("nbest_size", 64))
        else:
            pieces = self.sp_model.encode(text, out_type=str)
        return cut_pieces(pieces)

    # ------------------------------------------------------------------ special tokens
    def build_inputs_with_special_tokens(self, token_ids_0: list[int], token_ids_1: list[int] | None = None):
        """``[CLS] A [SEP]`` or ``[CLS] A [SEP] [SEP] B [SEP]``."""
        cls, sep = [self.cls_token_id], [self.sep_token_id]
        if token_ids_1 is None:
            return cls + token_ids_0 + sep
        return cls + token_ids_0 + sep + sep + token_ids_1 + sep

    def get_special_tokens_mask(self, token_ids_0: list[int], token_ids_1: list[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        if already_has_special_tokens:
            if token_ids_1 is not None:
                raise ValueError("a second sequence cannot be given with already_has_special_tokens=True: the ids "
                                 "already hold both sequences and their special tokens.")
            marks = {self.cls_token_id, self.sep_token_id}  # [CLS] and [SEP] only, as transformers' class
            return [int(i in marks) for i in token_ids_0]
        if token_ids_1 is None:
            return [1] + [0] * len(token_ids_0) + [1]
        return [1] + [0] * len(token_ids_0) + [1, 1] + [0] * len(token_ids_1) + [1]

    def create_token_type_ids_from_sequences(self, token_ids_0: list[int], token_ids_1: list[int] | None = None):
        """0 for ``[CLS] A``, 1 for ``[SEP] [SEP] B [SEP]``, as transformers' class (ERNIE-M's model reads none)."""
        if token_ids_1 is None:
            return [0] * (len(token_ids_0) + 2)
        return [0] * (len(token_ids_0) + 1) + [1] * (len(token_ids_1) + 3)

    # ------------------------------------------------------------------ saving
    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        """Write ``vocab.txt`` (tokens in id order) and ``sentencepiece.bpe.model``."""
        directory = Path(save_directory)
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        vocab_file, model_file = directory / (prefix + VOCAB_FILE), directory / (prefix + MODEL_FILE)
        by_id = sorted(self.vocab.items(), key=lambda item: item[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise TokenizerError(f"the vocabulary's ids are not 0..{len(by_id) - 1} without gaps, so vocab.txt "
                                 "(one token a line) cannot hold it; build the tokenizer from a vocab.txt.")
        vocab_file.write_text("".join(f"{token}\n" for token, _ in by_id), encoding="utf-8")
        model_file.write_bytes(self.sp_model.serialized_model_proto())
        return str(vocab_file), str(model_file)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> tuple[str, ...]:
        """Write ``vocab.txt``, ``sentencepiece.bpe.model``, ``tokenizer_config.json`` and
        ``special_tokens_map.json``: the layout transformers 4.x's ``ErnieMTokenizer`` loads."""
        files = super().save_pretrained(save_directory, **kwargs)
        config_file = Path(save_directory) / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config["tokenizer_class"] = TOKENIZER_CLASS
        for key in ("sentencepiece_model_ckpt", "vocab_file", "backend"):  # paths of this machine; 5.x-only key
            config.pop(key, None)
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                               encoding="utf-8")
        return files


def _json_object(file: Path) -> dict:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file} is not valid JSON ({e}); {_FIX}.") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{file} holds a JSON {type(value).__name__}, not an object; {_FIX}.")
    return value


# tokenizer_config.json entries the loader passes on (the rest are transformers' bookkeeping or this machine's).
_OPTIONS = ("do_lower_case", "sp_model_kwargs", "model_max_length", "padding_side", "truncation_side",
            "clean_up_tokenization_spaces", "added_tokens_decoder", "additional_special_tokens",
            *SPECIAL_TOKENS)


def load_ernie_m_tokenizer(directory: str | os.PathLike, **kwargs) -> ErnieMTokenizer:
    """The tokenizer of an ERNIE-M directory (the layout in the module docstring), with transformers 4.x's ids.

    ``kwargs`` override tokenizer_config.json (``do_lower_case``, special tokens, ``model_max_length``, ...).
    Raises :class:`~zhnlp.errors.TokenizerError` naming the file for a missing or unreadable model or
    vocabulary and a malformed JSON file.
    """
    directory = Path(directory)
    model_file, vocab_file = directory / MODEL_FILE, directory / VOCAB_FILE
    if not model_file.is_file():
        raise TokenizerError(f"{directory} has no {MODEL_FILE}: an ERNIE-M tokenizer is a SentencePiece model "
                             f"({MODEL_FILE}) with {VOCAB_FILE}; {_FIX}.")
    config_file = directory / "tokenizer_config.json"
    config = _json_object(config_file) if config_file.is_file() else {}
    options = {key: config[key] for key in _OPTIONS if key in config}
    for key in SPECIAL_TOKENS:
        if isinstance(options.get(key), dict):  # an AddedToken written as {"content": ...}
            options[key] = options[key].get("content")
    return ErnieMTokenizer(model_file, vocab_file if vocab_file.is_file() else None, **{**options, **kwargs})
