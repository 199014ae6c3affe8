"""Tokenise a Chinese corpus into a megatron-core indexed dataset (same as `zhnlp preprocess`).

    python scripts/preprocess_corpus.py --input corpus.jsonl --output data/corpus \
        --tokenizer ernie-3.0-base-zh --workers 8
"""

import sys

from zhnlp.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess", *sys.argv[1:]]))
