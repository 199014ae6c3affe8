"""``zhnlp predict TASK --model DIR [TEXT ...]``: run a pipeline, print one JSON result per line.

Inputs come from the TEXT arguments, else from ``--input FILE`` (one input per line, ``-`` for stdin), else from
stdin. For question answering every input is a JSON object ``{"question": ..., "context": ...}`` (jsonl in a
file), for sentence similarity ``{"source_sentence": ..., "sentences": [...]}`` or ``{"text": ..., "text_pair":
...}``; for the other tasks it is the text itself. Every input line gets one output line, in order: a blank (or
whitespace-only) line gets ``null``, so output line N always answers input line N. Results are printed as they
are computed, ``--batch-size`` inputs at a time, so a long file streams through.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from typing import Iterator

from zhnlp.argtypes import Parser, integer, positive
from zhnlp.errors import DataError, ZhnlpError
from zhnlp.pipelines import ALIASES, pipeline, pipeline_class, task_names


class _IntermixedParser(Parser):
    """Lets TEXT arguments follow options (``predict TASK --model DIR TEXT...``): plain argparse matches the empty
    TEXT list together with TASK and then rejects the texts after ``--model`` as unrecognised."""

    _parsing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._parsing:  # parse_known_intermixed_args calls back here for its two passes
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("predict", help="run an inference pipeline (sentiment, QA, NER, fill-mask, "
                                              "segmentation); one JSON result per line",
                              description=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.__class__ = _IntermixedParser  # the subparser is built by argparse; only its parsing changes
    p.add_argument("task", choices=task_names(), metavar="TASK", help="one of: " + ", ".join(task_names()))
    p.add_argument("texts", nargs="*", metavar="TEXT",
                   help="inputs (for question-answering, JSON objects with question and context)")
    p.add_argument("--model", help="model directory, model name or hub repo id (not used by word-segmentation)")
    p.add_argument("--input", metavar="FILE", help="read inputs from FILE, one per line ('-': stdin)")
    p.add_argument("--batch-size", type=positive, default=8, help="inputs per forward pass (default 8)")
    p.add_argument("--top-k", type=positive, help="return the k best labels / tokens / answers")
    p.add_argument("--aggregation-strategy", choices=["none", "simple", "first", "average", "max"],
                   help="ner: 'none' (default) one result per tagged token; the others group tokens into entities "
                        "(entity_group) as transformers does")
    p.add_argument("--function-to-apply", choices=["default", "sigmoid", "softmax", "none"],
                   help="sentiment-analysis: how logits become scores (default: softmax, sigmoid for one label)")
    p.add_argument("--targets", type=lambda text: [t for t in text.split(",") if t],
                   help="fill-mask: comma-separated tokens to rank instead of the whole vocabulary")
    p.add_argument("--pooling", choices=["auto", "mean", "cls", "pooler"],
                   help="feature-extraction / sentence-similarity: how token states become one sentence vector "
                        "(auto: the model card's or the model directory's; feature-extraction without it prints "
                        "every token's vector)")
    p.add_argument("--handle-impossible-answer", action="store_true", default=None,
                   help="question-answering: also score 'no answer' (an empty answer at 0)")
    p.add_argument("--device", help="where the model runs: cpu, cuda, cuda:N or N (-1: the CPU); default: the GPU "
                                     "when there is one")
    p.add_argument("--dtype", help="parameter dtype: auto (default, the checkpoint's), float32, bfloat16, float16")
    p.add_argument("--max-length", type=integer(8), default=512, help="most tokens per forward input (default 512)")
    p.add_argument("--allow-untrained", action="store_true",
                   help="run a model whose task head is freshly initialised (random outputs); refused by default")
    p.set_defaults(func=lambda args: predict(args, p))


# task options with a flag of their own (each refused for a task without the option)
_TASK_FLAGS = {"top_k": "--top-k", "aggregation_strategy": "--aggregation-strategy",
               "function_to_apply": "--function-to-apply", "targets": "--targets",
               "handle_impossible_answer": "--handle-impossible-answer", "pooling": "--pooling"}


def predict(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Build the pipeline from ``args``, then print one JSON line per input."""
    task = ALIASES.get(args.task, args.task)
    if args.texts and args.input:
        parser.error("give the inputs either as TEXT arguments or with --input FILE, not both")
    options = {}
    defaults = pipeline_class(task).default_options
    for name, flag in _TASK_FLAGS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if name not in defaults:
            parser.error(f"{flag} does not apply to {task}")
        options[name] = value
    device = int(args.device) if args.device is not None and args.device.lstrip("-").isdigit() else args.device
    try:
        pipe = pipeline(task, args.model, batch_size=args.batch_size, max_length=args.max_length,
                        allow_untrained=args.allow_untrained, device=device, dtype=args.dtype, **options)
    except ZhnlpError:  # e.g. CheckpointError (a ValueError too): the top-level handler reports it
        raise
    except (TypeError, ValueError) as e:  # usage problems (no model, bad sizes); ZhnlpErrors pass through
        parser.error(str(e))
    for result in _line_results(pipe, _inputs(args, task)):
        print(json.dumps(result, ensure_ascii=False), flush=True)
    return 0


_BLANK = object()  # an input line with nothing on it: its output line is null


def _line_results(pipe, items: Iterator[tuple[str, object]]) -> Iterator:
    """One result per input line, in order; ``None`` for a blank line. The non-blank inputs go through
    ``pipe.iter_results`` as one stream (batched as usual); a queue of what each line read was puts the blank
    lines' ``None`` back between the results."""
    kinds: deque = deque()  # per line read and not yet answered: _BLANK, or None for an input

    def inputs():
        for where, item in items:
            kinds.append(_BLANK if item is _BLANK else None)
            if item is not _BLANK:
                yield from _checked(pipe, [(where, item)])

    for result in pipe.iter_results(inputs()):
        while kinds[0] is _BLANK:
            kinds.popleft()
            yield None
        kinds.popleft()
        yield result
    yield from (None for _ in kinds)  # blank lines after the last input


def _inputs(args: argparse.Namespace, task: str) -> Iterator[tuple[str, object]]:
    """``(where, input)`` pairs; ``where`` names the argument or FILE:LINE for error messages."""
    if args.texts:
        lines = ((f"TEXT argument {i}", text) for i, text in enumerate(args.texts, 1))
    elif args.input and args.input != "-":
        lines = _file_lines(args.input)
    else:
        if sys.stdin.isatty():
            print("zhnlp predict: reading inputs from stdin, one per line (end with Ctrl-D)", file=sys.stderr)
        lines = ((f"<stdin>:{n}", line) for n, line in enumerate(sys.stdin, 1))
    for where, line in lines:
        line = line.rstrip("\r\n")
        if not line.strip():
            yield where, _BLANK
            continue
        yield where, (_json_input(where, line, task) if task in _JSON_TASKS else line)


def _file_lines(path: str) -> Iterator[tuple[str, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            yield from ((f"{path}:{n}", line) for n, line in enumerate(f, 1))
    except FileNotFoundError:
        raise DataError(f"--input {path}: no such file; pass a UTF-8 text file with one input per line") from None
    except UnicodeDecodeError as e:
        raise DataError(f"--input {path} is not UTF-8 ({e}); convert it, e.g. with iconv -t UTF-8") from None


# tasks whose inputs are JSON objects, one per line -> the object to show in the error for a line that is not JSON
_JSON_TASKS = {"question-answering": '{"question": ..., "context": ...}',
               "sentence-similarity": '{"source_sentence": ..., "sentences": [...]} or {"text": ..., "text_pair": ...}'}


def _json_input(where: str, line: str, task: str) -> dict:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not JSON ({e}); write one object {_JSON_TASKS[task]} per line") from None
    return item


def _checked(pipe, items: Iterator[tuple[str, object]]) -> Iterator:
    # Each input is checked as it is read, so a bad one is reported by its line before its batch runs.
    for where, item in items:
        try:
            pipe.check_input(item)
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}: {e}") from None
        yield item
