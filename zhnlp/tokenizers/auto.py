"""``AutoTokenizer.from_pretrained``: a directory, model name or hub repo id -> a fast tokenizer.

What the directory holds decides the tokenizer:

* ``vocab.txt`` (BERT-Chinese, ERNIE, MacBERT, RoBERTa-wwm, ...): zhnlp's WordPiece pipeline,
  switches read from ``tokenizer_config.json`` (``do_lower_case`` defaults to True);
* ``tokenizer.json`` from any other tokenizer (e.g. a SentencePiece model zhnlp trained and
  saved): loaded verbatim by transformers' generic fast tokenizer;
* the ERNIE 4.5 layout (``tokenizer.model`` with ERNIE 4.5's ``tokenizer_config.json``, ``added_tokens.json``
  and chat template, see :mod:`zhnlp.tokenizers.ernie4_5`): the ids, special tokens and template of
  transformers' own ERNIE 4.5 tokenizer, without running the repository's ``tokenization_ernie4_5.py``;
* a SentencePiece ``*.model`` alone: converted with :func:`zhnlp.tokenizers.sentencepiece.load_sentencepiece`;
* a RoFormer directory (``vocab.txt`` with tokenizer class ``RoFormerTokenizer``, or none and config.json's
  ``model_type`` ``roformer``): transformers' ``RoFormerTokenizer`` (jieba words before WordPiece, see
  :mod:`zhnlp.tokenizers.roformer`);
* the ERNIE-M layout (``sentencepiece.bpe.model`` and ``vocab.txt``, tokenizer class ``ErnieMTokenizer`` or
  config.json's ``model_type`` ``ernie_m``): transformers 4.x's ``ErnieMTokenizer`` ids, from a Python tokenizer
  (see :mod:`zhnlp.tokenizers.ernie_m`).

No repository code is ever executed: ``trust_remote_code=True`` is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from zhnlp import fileio, hub
from zhnlp.errors import CheckpointError, ModelNotFoundError, TokenizerError
from zhnlp.tokenizers.wordpiece import WordPieceTokenizer, wordpiece_config_flags

# tokenizer_class values of WordPiece checkpoints that zhnlp rebuilds from vocab.txt.
WORDPIECE_CLASSES = {"BertTokenizer", "BertTokenizerFast", "ErnieTokenizer", "ErnieTokenizerFast",
                     "ElectraTokenizer", "ElectraTokenizerFast"}


def _tokenizer_dir(name_or_path: str | os.PathLike, revision: str | None) -> Path:
    path = Path(os.fspath(name_or_path)).expanduser()
    # A local directory needs only tokenizer files (hub.resolve insists on config.json, which a
    # tokenizer-only directory, e.g. one written by train_wordpiece, does not have).
    if path.is_dir():
        return path
    return hub.resolve(name_or_path, revision=revision)


def _read_json_object(file: Path, fix: str) -> dict:
    """A tokenizer JSON file that must hold an object; every failure names the file and ``fix``."""
    text = fileio.read_utf8(file, TokenizerError, f"{fix}.")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{file} is not valid JSON ({e}); {fix}.") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{file} holds a JSON {hub.json_kind(value)}, not an object of tokenizer settings; "
                             f"{fix}.")
    return value


def _read_config(directory: Path) -> dict:
    file = directory / "tokenizer_config.json"
    if not file.is_file():
        return {}
    return _read_json_object(file, "fix or delete it (zhnlp then uses BERT-Chinese defaults)")


def _wordpiece_json_vocab(tokenizer_json: Path) -> dict[str, int] | None:
    """The WordPiece vocabulary inside a ``tokenizer.json`` (for repos that ship no vocab.txt), else None."""
    if not tokenizer_json.is_file():
        return None
    model = _read_json_object(tokenizer_json, _TOKENIZER_JSON_FIX).get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        return None
    if not isinstance(model.get("vocab"), dict):
        raise TokenizerError(f"{tokenizer_json}: the WordPiece model has no vocab object; {_TOKENIZER_JSON_FIX}.")
    return model["vocab"]


_TOKENIZER_JSON_FIX = "use the tokenizer files that came with the model, or re-save the tokenizer"


def _load_tokenizer_json(directory: Path, **kwargs) -> PreTrainedTokenizerFast:
    file = directory / "tokenizer.json"
    _read_json_object(file, _TOKENIZER_JSON_FIX)
    try:
        return PreTrainedTokenizerFast.from_pretrained(str(directory), **kwargs)
    except (KeyError, ValueError) as e:
        raise TokenizerError(f"{file} is not a tokenizer file transformers can load ({type(e).__name__}: {e}); "
                             f"{_TOKENIZER_JSON_FIX}.") from None
    except Exception as e:  # the Rust tokenizers library raises plain Exception for a malformed file
        if type(e) is not Exception:
            raise
        raise TokenizerError(f"{file} is not a tokenizer file transformers can load ({e}); "
                             f"{_TOKENIZER_JSON_FIX}.") from None


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
        if kwargs.pop("trust_remote_code", False):
            raise TokenizerError("zhnlp never runs code from a model repository (trust_remote_code=True was asked): "
                                 "every tokenizer it supports, ERNIE 4.5's included, is built from the repository's "
                                 "data files (tokenizer.model, tokenizer_config.json, ...) and no tokenization_*.py "
                                 "is executed; drop trust_remote_code.")
        directory = _tokenizer_dir(name_or_path, revision)
        config = _read_config(directory)
        from zhnlp.tokenizers.ernie4_5 import is_ernie4_5_layout

        if is_ernie4_5_layout(directory, config) and not (directory / "tokenizer.json").is_file():
            from zhnlp.tokenizers.ernie4_5 import load_ernie4_5_tokenizer

            tokenizer = load_ernie4_5_tokenizer(directory, **kwargs)
            tokenizer.name_or_path = os.fspath(name_or_path)
            return tokenizer
        from zhnlp.tokenizers.ernie_m import is_ernie_m_layout

        if is_ernie_m_layout(directory, config):  # before WordPiece: the layout has a vocab.txt too
            from zhnlp.tokenizers.ernie_m import load_ernie_m_tokenizer

            tokenizer = load_ernie_m_tokenizer(directory, **kwargs)
            tokenizer.name_or_path = os.fspath(name_or_path)
            return tokenizer
        from zhnlp.tokenizers.roformer import is_roformer_layout

        if is_roformer_layout(directory, config):
            from zhnlp.tokenizers.roformer import load_roformer_tokenizer

            tokenizer = load_roformer_tokenizer(directory, **kwargs)
            tokenizer.name_or_path = os.fspath(name_or_path)
            return tokenizer
        tokenizer_class = config.get("tokenizer_class")
        vocab_txt = directory / "vocab.txt"
        tokenizer_json = directory / "tokenizer.json"
        wordpiece = tokenizer_class in WORDPIECE_CLASSES or tokenizer_class is None or "normalize_fullwidth" in config
        vocab = (vocab_txt if vocab_txt.is_file() else _wordpiece_json_vocab(tokenizer_json)) if wordpiece else None
        if vocab is not None:
            source = str(vocab_txt if vocab_txt.is_file() else tokenizer_json)
            tokenizer = WordPieceTokenizer.from_vocab(vocab, source=source,
                                                      **{**wordpiece_config_flags(config), **kwargs})
        elif tokenizer_json.is_file():
            tokenizer = _load_tokenizer_json(directory, **kwargs)
        elif spm := sorted(directory.glob("*.model")):
            from zhnlp.tokenizers.sentencepiece import load_sentencepiece

            tokenizer = load_sentencepiece(spm[0], **kwargs)
        else:
            raise ModelNotFoundError(f"{directory} holds no tokenizer: expected vocab.txt (WordPiece), "
                                     "tokenizer.json or a SentencePiece *.model. Pass the directory written by "
                                     "save_pretrained or by `zhnlp tokenizer train-wordpiece/train-sentencepiece`.")
        tokenizer.name_or_path = os.fspath(name_or_path)
        return tokenizer


def require_alignment(tokenizer, what: str) -> None:
    """Refuse, in one message, a tokenizer that cannot say which characters or words each token came from
    (transformers' Python "slow" tokenizers, such as ERNIE-M's, return no offsets and no word ids) before
    ``what`` (a task that needs them: reading comprehension spans, NER tags, SFT's assistant turns) fails later
    with a missing key."""
    if getattr(tokenizer, "is_fast", False):
        return
    name = type(tokenizer).__name__
    raise TokenizerError(f"{what} needs the tokenizer's character offsets and word ids, which {name} (a Python "
                         "tokenizer, like transformers' own for this model) does not give; fine-tune this model on "
                         "classification or sentence pairs, or use a model whose tokenizer is a fast one "
                         "(vocab.txt WordPiece or tokenizer.json).")


def check_tokenizer_fits(tokenizer, config, where: str) -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding rows for.

    Call it when a pipeline or a fine-tune is built, so the mismatch is one message instead of an
    IndexError in the middle of a batch. ``tokenizer``: any transformers tokenizer (WordPiece,
    SentencePiece, tokenizer.json; added tokens count); ``config``: the model's architecture
    (an object or a config.json dict with ``vocab_size``, or a model holding one as ``.config``);
    ``where``: the tokenizer's directory or name as the user gave it, named in the message.
    Raises :class:`~zhnlp.errors.CheckpointError`.
    """
    config = getattr(config, "config", config)
    vocab_size = config.get("vocab_size") if isinstance(config, dict) else getattr(config, "vocab_size", None)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"check_tokenizer_fits needs the model's config (with an integer vocab_size), "
                        f"got {type(config).__name__} with vocab_size={vocab_size!r}.")
    ids = tokenizer.get_vocab().values()  # base vocabulary and added tokens
    largest = max(ids, default=-1)
    if largest >= vocab_size:
        where = where or getattr(tokenizer, "name_or_path", "") or "(unnamed)"
        raise CheckpointError(
            f"the tokenizer in {where} has {len(ids)} tokens (largest id {largest}) but the model's vocab_size is "
            f"{vocab_size}; use the tokenizer that belongs to this model, or a model built for this tokenizer "
            f"(vocab_size >= {largest + 1}, e.g. resized with transformers' resize_token_embeddings and saved).")
