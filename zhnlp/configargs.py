"""Command-line flags derived from the typed run configs (one source of truth), via transformers' HfArgumentParser.

A config dataclass describes each field once: its type and default in the annotation, and in
``metadata`` its one-line ``help`` and optionally ``choices``, ``check`` (a :mod:`zhnlp.argtypes` parser
that range-checks the value where it enters, naming the flag), ``aliases`` (extra flag names) and
``cli=False`` (not a flag, e.g. a nested section or the architecture dict). transformers'
``HfArgumentParser`` turns the annotations into argparse arguments (types, ``X | None``, booleans with
``--no-x``, lists); :class:`ConfigParser` adapts the result to zhnlp's conventions: dashed flag names only,
the ``check`` parsers, and, for commands whose defaults come from a recipe, flags that are absent from the
namespace unless given (``given_only``), so that a flag overrides the recipe and nothing else does.

``--config FILE`` (JSON or YAML, the shape ``--print-config`` prints) sets fields before the flags do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from transformers.hf_argparser import HfArgumentParser

from zhnlp.argtypes import Parser


class ConfigParser(HfArgumentParser, Parser):
    """An argparse parser (zhnlp's one-line errors) that can take its flags from config dataclasses.

    Args:
        dataclass_types: config dataclasses whose fields become flags.
        given_only: leave flags that were not given out of the parsed namespace (their defaults are a
            recipe's, not the dataclass's); the help then shows no dataclass default.
    """

    def __init__(self, dataclass_types=None, *, given_only: bool = False, show_defaults: bool = False, **kwargs):
        self.given_only, self.show_defaults = given_only, show_defaults
        self._from_fields = True  # the flags HfArgumentParser adds while constructing come from fields
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(dataclass_types, **kwargs)
        self._from_fields = False

    def add_argument(self, *names, **kwargs):
        if kwargs.pop("cli", True) is False:
            return None
        check = kwargs.pop("check", None)
        if check is not None:
            kwargs["type"] = check
        show_default = kwargs.pop("show_default", True)
        if kwargs.pop("comma_list", False):  # one value, "a,b,c" (HfArgumentParser would take "a b c")
            kwargs.pop("nargs", None)
            kwargs["type"], kwargs["metavar"] = comma_list, "A,B,..."
        if names and all(n.startswith("--") for n in names):
            # zhnlp's flags are dashed (--max-steps); HfArgumentParser also offers --max_steps
            dashed = [n for n in names if "_" not in n]
            names = tuple(dashed) or names
        if kwargs.get("nargs") == "?" and kwargs.get("const") is True:
            kwargs.setdefault("metavar", "true|false")  # a boolean: --flag, or --flag false
        if self.given_only and getattr(self, "_from_fields", False) and names and names[0].startswith("--"):
            default = kwargs.get("default")
            if self.show_defaults and show_default and kwargs.get("help") and default not in (None, False) \
                    and not kwargs.get("required") and kwargs.get("action") != "store_false":
                kwargs["help"] += f" (default: {default})"
            kwargs["default"] = argparse.SUPPRESS
        return super().add_argument(*names, **kwargs)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or action.help is None or "%(default)" in action.help:
            return action.help
        return super()._get_help_string(action)


def comma_list(text: str) -> list[str]:
    """``--labels neg,pos`` -> ``["neg", "pos"]``."""
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list such as a,b, got {text!r}")
    return values


def cli_fields(*dataclass_types) -> set[str]:
    """The field names of ``dataclass_types`` that are flags."""
    return {f.name for t in dataclass_types for f in dataclasses.fields(t) if f.metadata.get("cli", True)}


def given(args: argparse.Namespace, *dataclass_types) -> dict:
    """The config fields set on the command line (with ``given_only``: exactly those in the namespace)."""
    names = cli_fields(*dataclass_types)
    return {k: v for k, v in vars(args).items() if k in names}


def read_config_file(path: str | Path) -> dict:
    """A run configuration from ``--config FILE``: JSON, or YAML for ``.yaml``/``.yml`` files."""
    from zhnlp.errors import DataError

    path = Path(path)
    if not path.is_file():
        raise DataError(f"--config {path} {'is a directory' if path.is_dir() else 'does not exist'}; pass a JSON "
                        "or YAML file such as the one --print-config writes.")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # json and yaml both raise their own error types
        raise DataError(f"--config {path} is not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'} "
                        f"({str(e).splitlines()[0]}); fix the file or regenerate it with --print-config.") from None
    if not isinstance(data, dict):
        raise DataError(f"--config {path} must hold an object of settings ({{\"steps\": 100, ...}}), "
                        f"got {type(data).__name__}.")
    return data


def flatten(data: dict, sections: tuple[str, ...]) -> dict:
    """``{"parallel": {"tp": 2}, "steps": 5}`` -> ``{"tp": 2, "steps": 5}`` for the named nested sections."""
    out = {}
    for key, value in data.items():
        if key in sections and isinstance(value, dict):
            out.update(value)
        else:
            out[key] = value
    return out


def to_json(config) -> str:
    """A config dataclass as the JSON ``--print-config`` prints and ``--config`` reads."""
    return json.dumps(dataclasses.asdict(config), indent=2, ensure_ascii=False, default=str)
