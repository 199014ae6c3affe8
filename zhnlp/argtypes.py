"""Argument types for the command line: numbers with their allowed range, and paths that must be files.

Each type is an argparse ``type=`` callable. A value outside its range is reported by argparse as one line
that names the flag, the value and the range, e.g.
``zhnlp finetune: error: argument --epochs: must be an integer >= 1, got 0``.
The same checks serve the Python API through :func:`check_range` (config dataclasses call it), so a value
is refused where it enters, whichever way it comes in.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def _describe(kind: str, low, high, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return f"{kind} " + " and ".join(parts) if parts else kind


def range_problem(value, kind: str, low=None, high=None, low_open: bool = False, high_open: bool = False) -> str | None:
    """None when ``value`` is a ``kind`` ("an integer" / "a number") inside the range, else what it
    must be ("must be an integer >= 1")."""
    if kind == "an integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    return None if ok else f"must be {_describe(kind, low, high, low_open, high_open)}"


def check_range(name: str, value, kind: str = "an integer", low=None, high=None, *, low_open: bool = False,
                high_open: bool = False) -> None:
    """Raise ValueError ``name must be ..., got value`` unless ``value`` is inside the range."""
    problem = range_problem(value, kind, low, high, low_open, high_open)
    if problem:
        raise ValueError(f"{name} {problem}, got {value!r}")


def integer(low: int | None = None, high: int | None = None):
    """``type=`` for an integer flag in ``[low, high]`` (either bound may be None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{range_problem(None, 'an integer', low, high)}, got {text!r}") from None
        problem = range_problem(value, "an integer", low, high)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False):
    """``type=`` for a real-valued flag; ``low_open`` / ``high_open`` exclude the bound itself."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        problem = range_problem(value, "a number", low, high, low_open, high_open)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


positive = integer(1)  # counts: steps, epochs, batch sizes, workers
non_negative = integer(0)  # 0 has a documented meaning (e.g. --keep 0: keep every checkpoint)


def file_problem(path: str | os.PathLike) -> str | None:
    """None for an existing regular file, else what is wrong with it ("does not exist", "is a directory ...")."""
    p = Path(path)
    if p.is_file():
        return None
    if p.is_dir():
        return "is a directory, not a file; pass a file inside it"
    return "does not exist"


def input_file(text: str) -> str:
    """``type=`` for a file the command reads: it must exist and not be a directory."""
    problem = file_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text} {problem}")
    return text


def check_file(flag: str, path: str | os.PathLike) -> None:
    """The Python-API form of :func:`input_file`: a DataError ``FLAG PATH does not exist`` (or is a directory)."""
    from zhnlp.errors import DataError

    problem = file_problem(path)
    if problem:
        raise DataError(f"{flag} {path} {problem}.")


class Parser(argparse.ArgumentParser):
    """zhnlp's argument parser: a usage mistake is one line (``zhnlp: error: argument --epochs: ...``,
    exit 2), the same shape as every other input error, naming the flag and pointing at ``--help``,
    instead of the whole usage block above the error."""

    def error(self, message: str):
        self.exit(2, f"zhnlp: error: {message} (see {self.prog} --help)\n")
