"""Distributed runtime: ``zhnlp.distributed.init(tp=..., pp=...)`` and the current layout."""

from zhnlp.distributed.runtime import (Layout, barrier, device, ensure_world, init, is_initialized, layout,
                                       on_rank_zero, set_seed, shutdown)

__all__ = ["Layout", "barrier", "device", "ensure_world", "init", "is_initialized", "layout", "on_rank_zero",
           "set_seed", "shutdown"]
