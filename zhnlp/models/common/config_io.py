"""What every family's architecture config offers besides its fields: transformers' file methods."""

from __future__ import annotations

import json
import os
from pathlib import Path


class ConfigFiles:
    """Mixin of a family config dataclass that has ``to_dict()`` (the config.json transformers reads)."""

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` into ``directory`` (created when missing), atomically."""
        from zhnlp import fileio

        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise NotADirectoryError(f"{directory} is a file; save_pretrained writes config.json into a directory.")
        directory.mkdir(parents=True, exist_ok=True)
        fileio.write_json(directory / "config.json", self.to_dict())
