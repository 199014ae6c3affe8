"""``AutoTokenizer.from_pretrained``: a directory, model name or hub repo id -> a fast tokenizer.

What the directory holds decides the tokenizer:

* ``vocab.txt`` (BERT-Chinese, ERNIE, MacBERT, RoBERTa-wwm, ...): zhnlp's WordPiece pipeline,
  switches read from ``tokenizer_config.json`` (``do_lower_case`` defaults to True);
* ``tokenizer.json`` from any other tokenizer (e.g. a SentencePiece model zhnlp trained and
  saved): loaded verbatim by transformers' generic fast tokenizer;
* a SentencePiece ``*.model`` alone: converted with :func:`zhnlp.tokenizers.sentencepiece.load_sentencepiece`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from zhnlp import hub
from zhnlp.errors import ModelNotFoundError
from zhnlp.tokenizers.wordpiece import WordPieceTokenizer, wordpiece_config_flags

# tokenizer_class values of WordPiece checkpoints that zhnlp rebuilds from vocab.txt.
WORDPIECE_CLASSES = {"BertTokenizer", "BertTokenizerFast", "ErnieTokenizer", "ErnieTokenizerFast",
                     "ErnieMTokenizer", "ElectraTokenizer", "ElectraTokenizerFast"}


def _tokenizer_dir(name_or_path: str | os.PathLike, revision: str | None) -> Path:
    path = Path(os.fspath(name_or_path)).expanduser()
    # A local directory needs only tokenizer files (hub.resolve insists on config.json, which a
    # tokenizer-only directory, e.g. one written by train_wordpiece, does not have).
    if path.is_dir():
        return path
    return hub.resolve(name_or_path, revision=revision)


def _read_config(directory: Path) -> dict:
    file = directory / "tokenizer_config.json"
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON ({e}); fix or delete it (zhnlp then uses BERT-Chinese "
                         "defaults).") from None


def _wordpiece_json_vocab(tokenizer_json: Path) -> dict[str, int] | None:
    """The WordPiece vocabulary inside a ``tokenizer.json`` (for repos that ship no vocab.txt), else None."""
    if not tokenizer_json.is_file():
        return None
    model = json.loads(tokenizer_json.read_text(encoding="utf-8")).get("model", {})
    return model["vocab"] if model.get("type") == "WordPiece" else None


class AutoTokenizer:
    """Load the fast tokenizer of a checkpoint directory, model name or hub repo id."""

    @staticmethod
    def from_pretrained(name_or_path: str | os.PathLike, *, revision: str | None = None,
                        **kwargs) -> PreTrainedTokenizerFast:
        """A fast tokenizer with the transformers call API.

        ``kwargs`` override ``tokenizer_config.json`` (``do_lower_case``, ``strip_accents``,
        ``normalize_fullwidth``, ``model_max_length``, special tokens, ...). Unknown names and
        unreachable hub repos raise :class:`zhnlp.ModelNotFoundError` naming the fix.
        """
        directory = _tokenizer_dir(name_or_path, revision)
        config = _read_config(directory)
        tokenizer_class = config.get("tokenizer_class")
        vocab_txt = directory / "vocab.txt"
        tokenizer_json = directory / "tokenizer.json"
        wordpiece = tokenizer_class in WORDPIECE_CLASSES or tokenizer_class is None or "normalize_fullwidth" in config
        vocab = (vocab_txt if vocab_txt.is_file() else _wordpiece_json_vocab(tokenizer_json)) if wordpiece else None
        if vocab is not None:
            tokenizer = WordPieceTokenizer.from_vocab(vocab, **{**wordpiece_config_flags(config), **kwargs})
        elif tokenizer_json.is_file():
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory), **kwargs)
        elif spm := sorted(directory.glob("*.model")):
            from zhnlp.tokenizers.sentencepiece import load_sentencepiece

            tokenizer = load_sentencepiece(spm[0], **kwargs)
        else:
            raise ModelNotFoundError(f"{directory} holds no tokenizer: expected vocab.txt (WordPiece), "
                                     "tokenizer.json or a SentencePiece *.model. Pass the directory written by "
                                     "save_pretrained or by `zhnlp tokenizer train-wordpiece/train-sentencepiece`.")
        tokenizer.name_or_path = os.fspath(name_or_path)
        return tokenizer
