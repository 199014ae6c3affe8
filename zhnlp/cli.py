"""The ``zhnlp`` command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from zhnlp.argtypes import Parser


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


def build_parser() -> Parser:
    parser = Parser(prog="zhnlp", description="Chinese NLP model zoo and training toolkit.",
                    epilog="Mistakes in the input are reported as one line `zhnlp: error: ...` (exit 2); "
                           "--debug (anywhere on the line) or ZHNLP_DEBUG=1 shows the Python traceback instead.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
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


_PACKAGE = Path(__file__).resolve().parent


def user_error(error: BaseException) -> str | None:
    """The one-line message for an error the user can fix, or None for an internal error (which keeps
    its traceback): zhnlp's own errors, OSErrors on a path (missing, a directory, no permission, disk
    full) and ValueErrors raised by zhnlp's validation (not from deep inside a library)."""
    from zhnlp.errors import ZhnlpError

    if isinstance(error, ZhnlpError):
        return str(error)
    if isinstance(error, OSError) and (error.filename is not None or error.errno is not None):
        where = f": {error.filename}" if error.filename is not None else ""
        return f"{error.strerror or error}{where}"
    if isinstance(error, ValueError):
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE):
            return str(error)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0, 2 for a user error, 128 + signal for a stop)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("ZHNLP_DEBUG", "0") not in ("", "0")
    try:
        args = build_parser().parse_args([a for a in argv if a != "--debug"])
    except SystemExit as e:  # a usage mistake (reported, exit 2) or --help (exit 0)
        return e.code if isinstance(e.code, int) else 2
    from zhnlp.errors import Interrupted

    try:
        return args.func(args)
    except SystemExit as e:  # a command's own usage check (parser.error), already reported
        return e.code if isinstance(e.code, int) else 2
    except Interrupted as e:  # a stop signal, handled: the run saved what it had (every rank agrees: say it once)
        if os.environ.get("RANK", "0") == "0":
            print(f"zhnlp: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        if debug:
            raise
        print("zhnlp: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        message = user_error(e)
        if message is None or debug:
            raise
        print(f"zhnlp: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
