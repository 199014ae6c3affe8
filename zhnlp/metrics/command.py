"""``zhnlp evaluate``: score a predictions file against a dataset from the command line.

    zhnlp evaluate cmrc2018 cmrc2018_dev.json predictions.json
    {"em": 66.251, "f1": 85.712, "total": 3219, "skip": 0}
    zhnlp evaluate sts test.jsonl --model m3e-small
    {"spearman": 72.1, "pearson": 70.3, "total": 1361, "pooling": "mean"}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zhnlp.metrics import cmrc2018


def add_cli(subparsers) -> None:
    """Register ``evaluate cmrc2018 DATASET PREDICTIONS`` on an argparse subparsers object (sets ``func``)."""
    evaluate = subparsers.add_parser("evaluate", help="score predictions against a dataset (CMRC2018 EM/F1, STS Spearman)")
    sub = evaluate.add_subparsers(dest="evaluate_command", required=True)
    p = sub.add_parser("cmrc2018", help="CMRC2018 exact match and F1 (the official metric)",
                       description="Score {question_id: answer_text} predictions against a SQuAD-format CMRC2018 "
                                   "file; print one JSON line {em, f1 (percent), total, skip}. A question without "
                                   "a prediction scores 0 and is counted in skip.")
    p.add_argument("dataset", type=Path, metavar="DATASET.json", help="SQuAD-format CMRC2018 file (e.g. the dev set)")
    p.add_argument("predictions", type=Path, metavar="PREDICTIONS.json",
                   help="a JSON object mapping question ids to predicted answer texts")
    p.set_defaults(func=_cli_cmrc2018)
    p = sub.add_parser("sts", help="semantic textual similarity: Spearman/Pearson of a model's cosine similarities",
                       description="Embed both sentences of every pair in DATA.jsonl ({text, text_pair, label} "
                                   "per line, label the gold similarity, e.g. `zhnlp data fetch stsb-zh`) with a "
                                   "sentence-embedding model, and print one JSON line {spearman, pearson (percent), "
                                   "total, pooling}: the correlations of the cosines with the gold scores.")
    p.add_argument("data", type=Path, metavar="DATA.jsonl", help="sentence pairs with gold scores")
    p.add_argument("--model", required=True, help="model directory, model name (e.g. m3e-small) or hub repo id")
    p.add_argument("--pooling", choices=["auto", "mean", "cls", "pooler"], default="auto",
                   help="how token states become a sentence vector (auto: the model card's or directory's)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default 32)")
    p.add_argument("--max-length", type=int, default=128, help="most tokens per sentence (default 128)")
    p.set_defaults(func=_cli_sts)


def _cli_cmrc2018(args) -> int:
    dataset = cmrc2018.load_dataset(args.dataset)
    predictions = cmrc2018.load_predictions(args.predictions)
    scores = cmrc2018.evaluate(dataset, predictions)
    known = {qid for qid, _ in cmrc2018.questions(dataset)}
    unknown = [qid for qid in predictions if qid not in known]
    if unknown:
        print(f"zhnlp: warning: {len(unknown)} of {len(predictions)} prediction ids are not questions of "
              f"{args.dataset} (e.g. {unknown[0]!r}); they were ignored", file=sys.stderr)
    print(json.dumps({"em": round(scores["em"], 3), "f1": round(scores["f1"], 3), "total": scores["total"],
                      "skip": scores["skip"]}))
    return 0


def _cli_sts(args) -> int:
    from zhnlp.pipelines.sentence_embeddings import evaluate_sts

    scores = evaluate_sts(args.model, args.data, pooling=None if args.pooling == "auto" else args.pooling,
                          batch_size=args.batch_size, max_length=args.max_length)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in scores.items()}))
    return 0
