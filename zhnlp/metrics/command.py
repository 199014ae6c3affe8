"""``zhnlp evaluate``: score a predictions file against a dataset from the command line.

    zhnlp evaluate cmrc2018 cmrc2018_dev.json predictions.json
    {"em": 66.251, "f1": 85.712, "total": 3219, "skip": 0}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zhnlp.metrics import cmrc2018


def add_cli(subparsers) -> None:
    """Register ``evaluate cmrc2018 DATASET PREDICTIONS`` on an argparse subparsers object (sets ``func``)."""
    evaluate = subparsers.add_parser("evaluate", help="score predictions against a dataset (CMRC2018 EM/F1)")
    sub = evaluate.add_subparsers(dest="evaluate_command", required=True)
    p = sub.add_parser("cmrc2018", help="CMRC2018 exact match and F1 (the official metric)",
                       description="Score {question_id: answer_text} predictions against a SQuAD-format CMRC2018 "
                                   "file; print one JSON line {em, f1 (percent), total, skip}. A question without "
                                   "a prediction scores 0 and is counted in skip.")
    p.add_argument("dataset", type=Path, metavar="DATASET.json", help="SQuAD-format CMRC2018 file (e.g. the dev set)")
    p.add_argument("predictions", type=Path, metavar="PREDICTIONS.json",
                   help="a JSON object mapping question ids to predicted answer texts")
    p.set_defaults(func=_cli_cmrc2018)


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
