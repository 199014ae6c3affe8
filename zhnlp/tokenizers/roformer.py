"""RoFormer's tokenizer: BERT's ``vocab.txt`` with jieba word segmentation in front of WordPiece.

junnyu's Chinese RoFormer checkpoints ship a BERT-style ``vocab.txt`` and, in most directories, no tokenizer class;
transformers then picks ``RoFormerTokenizer`` from config.json's ``model_type``. That tokenizer lower-cases and
cleans the text like BERT, but splits it with jieba (rjieba, no HMM) instead of putting a space around every CJK
character: a jieba word that is in the vocabulary stays one token, any other word is split into characters (and
WordPiece pieces) as BERT would, but punctuation inside a jieba word is not split off.

* Character vocabularies (the ``*_char_*`` and RoFormer-Sim models): the ids mostly equal BERT's, but not always:
  jieba keeps ``C++`` or ``e-mail`` together, where BERT splits off the punctuation.
* Word+char vocabularies (``roformer_chinese_base``: 50,000 entries, most of them jieba words, as the model was
  pretrained): in-vocabulary words such as ``非常`` stay single tokens, which BERT's pipeline cannot produce.

So a RoFormer directory gets transformers' own ``RoFormerTokenizer`` (a class of the transformers package, not code
from the repository), built with the vocabulary read by :func:`zhnlp.tokenizers.wordpiece.read_vocab` (one clear
error for a broken file). Giving the vocabulary as a mapping matters: from a directory holding only ``vocab.txt``,
transformers 5.x hands jieba the file's path instead of the vocabulary, so every CJK word is split into characters
(harmless for a character vocabulary, wrong for roformer_chinese_base); zhnlp keeps the words, as transformers 4,
junnyu's package and transformers 5 itself (from a ``tokenizer.json``, which ``save_pretrained`` writes) do.
``token_type_ids`` are returned (0 for the first segment, 1 for the second), as BERT's tokenizer returns them and as
RoFormer was trained; transformers' RoFormerTokenizer returns them only when asked.
"""

from __future__ import annotations

import json
from pathlib import Path

from zhnlp.errors import TokenizerError

TOKENIZER_CLASSES = ("RoFormerTokenizer", "RoFormerTokenizerFast")
MODEL_TYPE = "roformer"


def is_roformer_layout(directory: Path, tokenizer_config: dict) -> bool:
    """True for a directory whose tokenizer is RoFormer's: its tokenizer_config names the RoFormer tokenizer
    (``save_pretrained`` writes that, with tokenizer.json), or it names no tokenizer class, holds ``vocab.txt`` and
    its config.json is a ``roformer`` model (transformers' AutoTokenizer follows the same rule)."""
    tokenizer_class = tokenizer_config.get("tokenizer_class")
    if tokenizer_class in TOKENIZER_CLASSES:
        return True
    config = directory / "config.json"
    if tokenizer_class is not None or not (directory / "vocab.txt").is_file() or not config.is_file():
        return False
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False  # not this loader's file to judge; loading the model names the problem
    return model_type == MODEL_TYPE


def load_roformer_tokenizer(directory: Path, **kwargs):
    """transformers' ``RoFormerTokenizer`` for ``directory`` (``kwargs`` override tokenizer_config.json)."""
    from transformers import RoFormerTokenizer

    from zhnlp.tokenizers.wordpiece import read_vocab

    vocab = directory / "vocab.txt"
    if (directory / "tokenizer.json").is_file():  # what RoFormerTokenizer.save_pretrained writes
        pass  # transformers reads the vocabulary from it, as a mapping
    elif vocab.is_file():
        # Given as a mapping: from vocab.txt alone transformers 5 hands jieba the file's *path* as the vocabulary
        # (so no word is "in" it and every jieba word is split into characters), which turns roformer_chinese_base's
        # word tokens into characters. read_vocab also gives one clear error for a broken file.
        kwargs.setdefault("vocab", read_vocab(vocab))
    else:
        raise TokenizerError(f"{directory} is a RoFormer model but holds neither vocab.txt nor tokenizer.json; "
                             "RoFormer's tokenizer is built from them: copy the vocab.txt that came with the model "
                             "into the directory.")
    # token type ids as BERT's tokenizer returns them (transformers' RoFormerTokenizer leaves them out unless asked,
    # so a sentence pair would reach the model as one segment); the ids themselves are transformers'
    kwargs.setdefault("model_input_names", ["input_ids", "token_type_ids", "attention_mask"])
    try:
        return RoFormerTokenizer.from_pretrained(str(directory), **kwargs)
    except ImportError as e:  # rjieba, a zhnlp dependency, missing from this environment
        raise TokenizerError(f"RoFormer's tokenizer segments words with rjieba, which cannot be imported ({e}); "
                             "install it: pip install rjieba.") from None
