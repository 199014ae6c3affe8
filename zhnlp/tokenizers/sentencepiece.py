"""Chinese SentencePiece models: train with ``sentencepiece``, run as a fast ``tokenizers`` pipeline.

:func:`train_sentencepiece` trains a unigram or BPE model whose special pieces are the BERT ones
(``[PAD]`` 0, ``[UNK]`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4), so the result drops into the
same ``[CLS] A [SEP] B [SEP]`` models as a WordPiece vocabulary. :func:`load_sentencepiece`
turns a ``.model`` file into a transformers fast tokenizer whose ids equal
``SentencePieceProcessor.encode``; ``save_pretrained`` then writes a ``tokenizer.json`` that
``transformers.AutoTokenizer`` runs verbatim.

The model file is read with ``sentencepiece``'s own protobuf classes (``sentencepiece_model_pb2``, which
needs the ``protobuf`` package), and the fast pipeline is built by transformers' SentencePiece converter
(``SpmConverter.build_tokenizer_from_spm_proto``), which follows the model's normaliser settings (the
precompiled character map, whitespace rules, dummy prefix), ranks BPE merges by piece score and keeps
user-defined pieces whole, as ``SentencePieceProcessor`` does.
"""

from __future__ import annotations

import os
from pathlib import Path

import sentencepiece as spm
from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast

from zhnlp.errors import TokenizerError

MODEL_FILE = "sentencepiece.model"
SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
           "mask_token": "[MASK]"}
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


# ---------------------------------------------------------------- .model -> tokenizers pipeline
def read_model_proto(model_file: str | os.PathLike):
    """The ``sentencepiece.ModelProto`` of a ``.model`` file (sentencepiece's own protobuf class).

    Raises :class:`~zhnlp.errors.TokenizerError` for a file that is not a SentencePiece model (corrupt or
    truncated protobuf, no pieces) and ImportError naming ``protobuf`` when that package is missing."""
    try:
        from google.protobuf.message import DecodeError
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as e:
        raise ImportError(f"reading a SentencePiece model needs the protobuf package ({e}); install it with "
                          f"`pip install protobuf`.") from None
    model_file = Path(model_file)
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(model_file.read_bytes())
    except DecodeError as e:
        raise TokenizerError(f"{model_file} is not a readable SentencePiece model ({e}); {_MODEL_FIX}.") from None
    if not proto.pieces:
        raise TokenizerError(f"{model_file} is a SentencePiece model without pieces; {_MODEL_FIX}.")
    return proto


def build_backend(model_file: str | os.PathLike, proto=None, *, template: bool = True) -> Tokenizer:
    """The Rust ``tokenizers.Tokenizer`` equivalent of a SentencePiece model (unigram or BPE), with the
    ``[CLS] A [SEP] B [SEP]`` template when ``template`` and the model has bos/eos pieces (``template=False``:
    the text's pieces only, as ERNIE 4.5's tokenizer encodes)."""
    from transformers.convert_slow_tokenizer import SpmConverter

    proto = proto if proto is not None else read_model_proto(model_file)
    model_type = _MODEL_TYPES.get(proto.trainer_spec.model_type, "unknown")
    pieces = [(piece.piece, piece.score) for piece in proto.pieces]
    if model_type == "unigram":
        vocab = pieces
    elif model_type == "bpe":
        vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    else:
        raise TokenizerError(f"{model_file}: SentencePiece model type {model_type!r} is not supported; train a "
                             "'unigram' or 'bpe' model.")
    backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    cls, sep = proto.trainer_spec.bos_id, proto.trainer_spec.eos_id
    if template and 0 <= cls < len(pieces) and 0 <= sep < len(pieces):
        cls_piece, sep_piece = pieces[cls][0], pieces[sep][0]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls_piece}:0 $A:0 {sep_piece}:0",
            pair=f"{cls_piece}:0 $A:0 {sep_piece}:0 $B:1 {sep_piece}:1",
            special_tokens=[(cls_piece, cls), (sep_piece, sep)])
    return backend


def load_sentencepiece(model_file: str | os.PathLike, **kwargs) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer for a SentencePiece ``.model`` file (ids as ``SentencePieceProcessor``).

    The model's pad/unk/bos/eos pieces become ``pad_token``/``unk_token``/``cls_token``/``sep_token``
    and a ``[MASK]`` piece, if present, ``mask_token``; ``kwargs`` override them.
    """
    model_file = Path(model_file)
    if not model_file.is_file():
        raise FileNotFoundError(f"no SentencePiece model at {model_file}; train one with train_sentencepiece "
                                "(`zhnlp tokenizer train-sentencepiece`).")
    _processor(model_file)  # sentencepiece's own checks of the model (and its error for an unreadable file)
    proto = read_model_proto(model_file)
    backend = build_backend(model_file, proto)
    pieces = [piece.piece for piece in proto.pieces]
    spec = proto.trainer_spec
    named = {"pad_token": spec.pad_id, "unk_token": spec.unk_id, "cls_token": spec.bos_id,
             "sep_token": spec.eos_id,
             "mask_token": pieces.index(SPECIAL["mask_token"]) if SPECIAL["mask_token"] in pieces else -1}
    special = {key: pieces[i] for key, i in named.items() if 0 <= i < len(pieces)}
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_input_names=["input_ids", "token_type_ids",
                                                                                "attention_mask"],
                                   **{**special, **kwargs})


_MODEL_FIX = "use the .model file that came with the model, or train one with `zhnlp tokenizer train-sentencepiece`"


def _processor(model_file: Path) -> spm.SentencePieceProcessor:
    """The SentencePiece processor of ``model_file``; a file it cannot parse is one clear error."""
    try:
        proc = spm.SentencePieceProcessor(model_file=os.fspath(model_file))
    except (RuntimeError, OSError) as e:  # sentencepiece raises RuntimeError("INTERNAL: could not parse ...")
        raise TokenizerError(f"{model_file} is not a readable SentencePiece model ({e}); {_MODEL_FIX}.") from None
    if proc.get_piece_size() == 0:
        raise TokenizerError(f"{model_file} is a SentencePiece model without pieces; {_MODEL_FIX}.")
    return proc


# ---------------------------------------------------------------- training
def train_sentencepiece(corpus_files: list[str | os.PathLike], output_dir: str | os.PathLike, *,
                        vocab_size: int = 32000, model_type: str = "unigram", character_coverage: float = 0.9995,
                        byte_fallback: bool = False, input_sentence_size: int = 2_000_000,
                        max_sentence_length: int = 8192, num_threads: int | None = None,
                        user_defined_symbols: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Train a Chinese SentencePiece model on ``corpus_files`` (plain text, one sentence or paragraph a line).

    Writes ``output_dir/sentencepiece.model`` (+ ``.vocab``) and the transformers files
    (``tokenizer.json``, ``tokenizer_config.json``), and returns the loaded fast tokenizer.
    ``character_coverage`` 0.9995 keeps all but the rarest characters (the rest become
    ``[UNK]``, or UTF-8 bytes with ``byte_fallback``). ``input_sentence_size`` caps the lines
    sampled for training, bounding memory on large corpora.
    """
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type={model_type!r}: choose 'unigram' (the SentencePiece default) or 'bpe'.")
    from zhnlp.tokenizers.train import check_corpus

    files = check_corpus(corpus_files)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / Path(MODEL_FILE).stem
    spm.SentencePieceTrainer.train(
        input=files, model_prefix=os.fspath(prefix), vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, byte_fallback=byte_fallback,
        input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
        max_sentence_length=max_sentence_length, num_threads=num_threads or os.cpu_count() or 1,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece=SPECIAL["pad_token"], unk_piece=SPECIAL["unk_token"],
        bos_piece=SPECIAL["cls_token"], eos_piece=SPECIAL["sep_token"], control_symbols=[SPECIAL["mask_token"]],
        user_defined_symbols=user_defined_symbols or [], minloglevel=2)
    tokenizer = load_sentencepiece(out / MODEL_FILE)
    tokenizer.save_pretrained(out)
    return tokenizer
