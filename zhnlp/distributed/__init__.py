"""Distributed runtime: ``zhnlp.distributed.init(tp=..., pp=...)`` and the current layout.

The names are imported from :mod:`zhnlp.distributed.runtime` (and with it torch) on first use.
"""

from __future__ import annotations

import importlib

__all__ = ["Layout", "barrier", "device", "ensure_world", "free_port", "init", "is_initialized", "layout",
           "on_rank_zero", "set_seed", "shutdown"]


def __getattr__(name: str):
    if name in __all__:
        value = getattr(importlib.import_module("zhnlp.distributed.runtime"), name)
        globals()[name] = value
        return value
    if name == "cpu":  # the submodule, as an attribute (zhnlp.distributed.cpu)
        return importlib.import_module("zhnlp.distributed.cpu")
    raise AttributeError(f"module 'zhnlp.distributed' has no attribute {name!r}")
