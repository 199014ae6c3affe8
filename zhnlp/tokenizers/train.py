"""Train tokenizers from a Chinese corpus: BERT-Chinese-style WordPiece, and the ``zhnlp tokenizer`` commands.

The WordPiece vocabulary follows the BERT-Chinese layout: special tokens first (``[PAD]`` 0,
``[UNK]`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4), then every character seen (each CJK
character is a word of its own after pre-tokenisation, so it always gets its own token and never
a ``##`` form), then the learned sub-words of non-CJK runs (Latin words, numbers) with ``##``
continuations.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
from tokenizers.models import WordPiece

from zhnlp.argtypes import integer, number, positive
from zhnlp.tokenizers.wordpiece import SPECIAL_TOKENS, WordPieceTokenizer


def check_corpus(corpus_files) -> list[str]:
    """The corpus files as strings, after checking that each is a readable file and that the corpus
    holds text (a tokenizer trained on nothing is only special tokens). Raises DataError."""
    from zhnlp.argtypes import file_problem
    from zhnlp.errors import DataError

    files = [os.fspath(f) for f in corpus_files]
    if not files:
        raise DataError("no corpus files given; pass one or more plain-text files.")
    problems = [f"{f} {file_problem(f)}" for f in files if file_problem(f)]
    if problems:
        raise DataError(f"corpus: {'; '.join(problems)}.")
    for f in files:
        with open(f, "rb") as stream:
            if any(line.strip() for line in stream):
                return files
    raise DataError(f"the corpus ({', '.join(files)}) holds no text: every line is empty; a tokenizer needs text to "
                    "learn from.")


def refuse_tokenizer_output(output_dir, overwrite: bool) -> None:
    """OutputExistsError when ``output_dir`` holds a tokenizer already and ``overwrite`` is False."""
    from zhnlp.fileio import refuse_existing

    out = Path(output_dir)
    refuse_existing([out / n for n in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "sentencepiece.model")],
                    overwrite=overwrite, flag="--output-dir", what="a tokenizer")


def train_wordpiece(corpus_files: list[str | os.PathLike], output_dir: str | os.PathLike, *,
                    vocab_size: int = 21128, min_frequency: int = 2, do_lower_case: bool = True,
                    limit_alphabet: int | None = None) -> WordPieceTokenizer:
    """Train a BERT-Chinese-style WordPiece vocabulary on ``corpus_files`` (plain text).

    Writes ``output_dir/vocab.txt`` with ``tokenizer.json`` and ``tokenizer_config.json`` (which
    ``transformers.AutoTokenizer`` loads as a BertTokenizer) and returns the tokenizer.
    ``limit_alphabet=None`` keeps every character seen, so no CJK character of the corpus
    becomes ``[UNK]``; the vocabulary then exceeds ``vocab_size`` if the corpus has more
    distinct characters than that.
    """
    files = check_corpus(corpus_files)
    specials = list(SPECIAL_TOKENS.values())  # [PAD] first: id 0 is what models pad with
    backend = Tokenizer(WordPiece(unk_token=SPECIAL_TOKENS["unk_token"]))
    # The same normalisation and pre-tokenisation as at encoding time, so the vocabulary is
    # learned on exactly the units the tokenizer will look up.
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=None, lowercase=do_lower_case)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The trainer takes no "unlimited" value for limit_alphabet; leaving it out keeps every character.
    alphabet = {} if limit_alphabet is None else {"limit_alphabet": limit_alphabet}
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                        continuing_subword_prefix="##", show_progress=False, **alphabet)
    backend.train(files, trainer)
    vocab = backend.get_vocab()
    tokenizer = WordPieceTokenizer.from_vocab(vocab, do_lower_case=do_lower_case)
    tokenizer.save_pretrained(output_dir)
    return tokenizer


# ---------------------------------------------------------------- command line
def _train_wordpiece_cmd(args: argparse.Namespace) -> int:
    check_corpus(args.corpus)
    refuse_tokenizer_output(args.output_dir, args.overwrite)
    tok = train_wordpiece(args.corpus, args.output_dir, vocab_size=args.vocab_size, min_frequency=args.min_frequency,
                          do_lower_case=not args.cased)
    print(f"wrote {Path(args.output_dir) / 'vocab.txt'} ({len(tok)} tokens)")
    return 0


def _train_sentencepiece_cmd(args: argparse.Namespace) -> int:
    from zhnlp.tokenizers.sentencepiece import MODEL_FILE, train_sentencepiece

    check_corpus(args.corpus)
    refuse_tokenizer_output(args.output_dir, args.overwrite)
    try:
        tok = train_sentencepiece(args.corpus, args.output_dir, vocab_size=args.vocab_size,
                                  model_type=args.model_type, character_coverage=args.character_coverage,
                                  byte_fallback=args.byte_fallback, input_sentence_size=args.input_sentence_size)
    except RuntimeError as e:  # sentencepiece's trainer reports bad settings (e.g. vocab too small) this way
        print(f"zhnlp: error: SentencePiece training failed: {e}", file=sys.stderr)
        return 2
    print(f"wrote {Path(args.output_dir) / MODEL_FILE} and tokenizer.json ({len(tok)} pieces)")
    return 0


def _train_ernie4_5_cmd(args: argparse.Namespace) -> int:
    from zhnlp.fileio import refuse_existing
    from zhnlp.tokenizers.ernie4_5 import MODEL_FILE, train_ernie4_5_tokenizer

    check_corpus(args.corpus)
    refuse_tokenizer_output(args.output_dir, args.overwrite)
    refuse_existing([Path(args.output_dir) / MODEL_FILE], overwrite=args.overwrite, flag="--output-dir",
                    what="a tokenizer")
    tok = train_ernie4_5_tokenizer(args.corpus, args.output_dir, vocab_size=args.vocab_size,
                                   model_type=args.model_type, character_coverage=args.character_coverage,
                                   input_sentence_size=args.input_sentence_size)
    print(f"wrote {Path(args.output_dir) / MODEL_FILE} and the ERNIE 4.5 tokenizer files ({tok.vocab_size} pieces, "
          f"{len(tok)} tokens with the added ones)")
    return 0


def add_cli(subparsers) -> None:
    """Register ``tokenizer train-wordpiece``, ``train-sentencepiece`` and ``train-ernie4_5`` on ``subparsers``."""
    tok = subparsers.add_parser("tokenizer", help="train tokenizers on a Chinese corpus")
    sub = tok.add_subparsers(dest="tokenizer_command", required=True)

    p = sub.add_parser("train-wordpiece", help="BERT-Chinese-style WordPiece vocab.txt")
    p.add_argument("corpus", nargs="+", help="plain-text corpus files")
    p.add_argument("-o", "--output-dir", required=True)
    p.add_argument("--vocab-size", type=integer(6), default=21128, help="at least the 5 special tokens + 1")
    p.add_argument("--min-frequency", type=positive, default=2)
    p.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in --output-dir")
    p.add_argument("--cased", action="store_true", help="keep upper case and accents (default: lower-case)")
    p.set_defaults(func=_train_wordpiece_cmd)

    p = sub.add_parser("train-sentencepiece", help="SentencePiece unigram/BPE model with BERT special pieces")
    p.add_argument("corpus", nargs="+", help="plain-text corpus files, one sentence or paragraph a line")
    p.add_argument("-o", "--output-dir", required=True)
    p.add_argument("--vocab-size", type=integer(6), default=32000)
    p.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    p.add_argument("--character-coverage", type=number(0, 1, low_open=True), default=0.9995)
    p.add_argument("--byte-fallback", action="store_true", help="rare characters as UTF-8 bytes instead of [UNK]")
    p.add_argument("--input-sentence-size", type=positive, default=2_000_000, help="lines sampled for training")
    p.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in --output-dir")
    p.set_defaults(func=_train_sentencepiece_cmd)

    p = sub.add_parser("train-ernie4_5", help="SentencePiece model in the ERNIE 4.5 layout (special tokens, chat "
                                              "template, added tokens)")
    p.add_argument("corpus", nargs="+", help="plain-text corpus files, one sentence or paragraph a line")
    p.add_argument("-o", "--output-dir", required=True)
    p.add_argument("--vocab-size", type=integer(16), default=32000, help="SentencePiece pieces (specials included)")
    p.add_argument("--model-type", choices=["bpe", "unigram"], default="bpe")
    p.add_argument("--character-coverage", type=number(0, 1, low_open=True), default=0.9995,
                   help="the rest of the characters become UTF-8 byte pieces")
    p.add_argument("--input-sentence-size", type=positive, default=2_000_000, help="lines sampled for training")
    p.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in --output-dir")
    p.set_defaults(func=_train_ernie4_5_cmd)
