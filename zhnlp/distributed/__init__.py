"""Distributed runtime: ``zhnlp.distributed.init(tp=..., pp=...)`` and the current layout."""

from zhnlp.distributed.runtime import Layout, barrier, device, init, is_initialized, layout, set_seed, shutdown

__all__ = ["Layout", "barrier", "device", "init", "is_initialized", "layout", "set_seed", "shutdown"]
