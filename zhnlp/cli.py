"""The ``zhnlp`` command line."""

from __future__ import annotations

import argparse
import json
import sys


def _models(args) -> int:
    from zhnlp.cards import list_models

    cards = list_models()
    if args.json:
        print(json.dumps([{"name": c.name, "family": c.family, "model_type": c.config["model_type"],
                           "hub_repo": c.hub_repo, "parameters": c.parameters, "license": c.license,
                           "tasks": list(c.tasks)} for c in cards], ensure_ascii=False, indent=2))
        return 0
    rows = [("name", "type", "layers", "hidden", "params", "hub repo", "license")]
    for c in cards:
        cfg = c.config
        rows.append((c.name, cfg["model_type"], str(cfg["num_hidden_layers"]), str(cfg["hidden_size"]),
                     f"{c.parameters / 1e6:.0f}M", c.hub_repo, c.license))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zhnlp", description="Chinese NLP model zoo and training toolkit.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("models", help="list the model zoo (model_cards/)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_models)

    from zhnlp.data import fetch, preprocess
    from zhnlp.metrics import command as evaluate_command
    from zhnlp.pipelines import command as predict_command
    from zhnlp.tokenizers import train
    from zhnlp.training import command, export, monitor

    fetch.add_cli(sub)        # zhnlp data fetch NAME / zhnlp data list
    train.add_cli(sub)        # zhnlp tokenizer train-wordpiece / train-sentencepiece
    preprocess.add_cli(sub)   # zhnlp preprocess --input ... --output PREFIX --tokenizer ...
    command.add_cli(sub)      # zhnlp pretrain --recipe ernie-debug --tp 2 ...
    command.add_finetune_cli(sub)  # zhnlp finetune TASK --model DIR --train F --dev F [--test F]
    monitor.add_cli(sub)      # zhnlp plot RUN_DIR
    export.add_cli(sub)       # zhnlp export CHECKPOINT DIR (transformers format + tokenizer)
    evaluate_command.add_cli(sub)  # zhnlp evaluate cmrc2018 DATASET.json PREDICTIONS.json
    predict_command.add_cli(sub)   # zhnlp predict TASK --model DIR [TEXT ...]
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from zhnlp.errors import ZhnlpError

    try:
        return args.func(args)
    except ZhnlpError as e:
        print(f"zhnlp: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
