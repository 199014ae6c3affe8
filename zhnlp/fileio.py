"""Writing files so that a crash never leaves a half-written one under the final name."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary name beside ``path``; when the block ends without error the file is
    moved onto ``path`` in one step (same directory, so the rename is atomic), else removed.
    An existing ``path`` stays intact until then."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path: str | os.PathLike, data, **dumps) -> None:
    """Write ``data`` as UTF-8 JSON (indented, non-ASCII kept) atomically."""
    options = {"indent": 2, "ensure_ascii": False, **dumps}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, **options) + "\n", encoding="utf-8")
