"""Chinese SentencePiece models: train with ``sentencepiece``, run as a fast ``tokenizers`` pipeline.

:func:`train_sentencepiece` trains a unigram or BPE model whose special pieces are the BERT ones
(``[PAD]`` 0, ``[UNK]`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4), so the result drops into the
same ``[CLS] A [SEP] B [SEP]`` models as a WordPiece vocabulary. :func:`load_sentencepiece`
turns a ``.model`` file into a transformers fast tokenizer whose ids equal
``SentencePieceProcessor.encode``; ``save_pretrained`` then writes a ``tokenizer.json`` that
``transformers.AutoTokenizer`` runs verbatim.

The model file is a protobuf; the few fields needed beyond what ``SentencePieceProcessor``
exposes (the normalisation table and whitespace rules) are read by a tiny wire-format reader
here, so the ``protobuf`` package is not needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from zhnlp.errors import TokenizerError

MODEL_FILE = "sentencepiece.model"
SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
           "mask_token": "[MASK]"}
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


# ---------------------------------------------------------------- the .model protobuf, read by hand
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> dict[int, list]:
    """Top-level fields of one protobuf message: ``{field number: [raw values]}``."""
    out: dict[int, list] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}; the file is not a SentencePiece model.")
        out.setdefault(field, []).append(value)
    return out


def read_model_spec(model_file: str | os.PathLike) -> dict:
    """Model type, byte fallback and normaliser settings of a SentencePiece ``.model`` file."""
    model = _fields(Path(model_file).read_bytes())
    trainer = _fields(model.get(2, [b""])[0])  # ModelProto.trainer_spec
    norm = _fields(model.get(3, [b""])[0])  # ModelProto.normalizer_spec
    return {"model_type": _MODEL_TYPES.get(trainer.get(3, [1])[0], "unknown"),
            "byte_fallback": bool(trainer.get(35, [0])[0]),
            "precompiled_charsmap": norm.get(2, [b""])[0],
            "add_dummy_prefix": bool(norm.get(3, [1])[0]),
            "remove_extra_whitespaces": bool(norm.get(4, [1])[0])}


# ---------------------------------------------------------------- .model -> tokenizers pipeline
def _bpe_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    # SentencePiece BPE merges the adjacent pair whose concatenation is the highest-scoring piece;
    # a merge list ordered by the score of the merged piece makes the Rust BPE do the same.
    merges = []
    for piece in vocab:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[piece], vocab[left], vocab[right], left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def build_backend(model_file: str | os.PathLike) -> Tokenizer:
    """The Rust ``tokenizers.Tokenizer`` equivalent of a SentencePiece model."""
    spec = read_model_spec(model_file)
    proc = spm.SentencePieceProcessor(model_file=os.fspath(model_file))
    pieces = [(proc.id_to_piece(i), proc.get_score(i)) for i in range(proc.get_piece_size())]
    unk_id = proc.unk_id()
    if spec["model_type"] == "unigram":
        model = models.Unigram(pieces, unk_id=unk_id, byte_fallback=spec["byte_fallback"])
    elif spec["model_type"] == "bpe":
        vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
        scores = dict(pieces)
        model = models.BPE(vocab, _bpe_merges(vocab, scores), unk_token=pieces[unk_id][0], fuse_unk=True,
                           byte_fallback=spec["byte_fallback"])
    else:
        raise ValueError(f"{model_file}: SentencePiece model type {spec['model_type']!r} is not supported; train a "
                         "'unigram' or 'bpe' model.")
    backend = Tokenizer(model)
    steps = [normalizers.Precompiled(spec["precompiled_charsmap"])] if spec["precompiled_charsmap"] else []
    if spec["remove_extra_whitespaces"]:
        # SentencePiece drops leading/trailing spaces and squeezes runs of them.
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    backend.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spec["add_dummy_prefix"] else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    # Decoding: pieces' "\u2581" back to spaces, <0xNN> byte pieces back to UTF-8, then drop the
    # one space the dummy prefix added.
    decode = [decoders.Replace("\u2581", " ")] + ([decoders.ByteFallback()] if spec["byte_fallback"] else [])
    decode += [decoders.Fuse()] + ([decoders.Strip(" ", 1, 0)] if spec["add_dummy_prefix"] else [])
    backend.decoder = decoders.Sequence(decode)
    cls, sep = proc.bos_id(), proc.eos_id()
    if cls >= 0 and sep >= 0:
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
    proc = _processor(model_file)
    try:
        backend = build_backend(model_file)
    except (IndexError, ValueError) as e:  # the hand-read protobuf fields are truncated or malformed
        raise TokenizerError(f"{model_file} is not a readable SentencePiece model ({e}); {_MODEL_FIX}.") from None
    named = {"pad_token": proc.pad_id(), "unk_token": proc.unk_id(), "cls_token": proc.bos_id(),
             "sep_token": proc.eos_id(), "mask_token": proc.piece_to_id(SPECIAL["mask_token"])}
    special = {key: proc.id_to_piece(i) for key, i in named.items()
               if i >= 0 and not (key == "mask_token" and i == proc.unk_id())}
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
