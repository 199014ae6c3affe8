"""Chinese tokenizers: BERT/ERNIE WordPiece and SentencePiece, with the transformers call API.

    from zhnlp.tokenizers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained("ernie-3.0-base-zh")   # or a directory with vocab.txt
    enc = tok(question, context, truncation="only_second", max_length=384, stride=128,
              return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
"""

from zhnlp.tokenizers.auto import AutoTokenizer
from zhnlp.tokenizers.ernie4_5 import load_ernie4_5_tokenizer, train_ernie4_5_tokenizer
from zhnlp.tokenizers.ernie_m import ErnieMTokenizer, load_ernie_m_tokenizer
from zhnlp.tokenizers.sentencepiece import load_sentencepiece, train_sentencepiece
from zhnlp.tokenizers.train import add_cli, train_wordpiece
from zhnlp.tokenizers.wordpiece import WordPieceTokenizer, read_vocab

__all__ = ["AutoTokenizer", "ErnieMTokenizer", "WordPieceTokenizer", "add_cli", "load_ernie4_5_tokenizer",
           "load_ernie_m_tokenizer", "load_sentencepiece",
           "read_vocab", "train_ernie4_5_tokenizer", "train_sentencepiece", "train_wordpiece"]
