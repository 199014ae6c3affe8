"""What every family's architecture config offers besides its fields: transformers' file methods."""

from __future__ import annotations

import json
import os
from pathlib import Path


class ConfigFiles:
    """Mixin of a family config dataclass that has ``to_dict()`` (the config.json transformers reads),
    ``vocab_size``/``padded_vocab_size``, ``num_hidden_layers`` and the sizes named by ``TP_SPLIT``."""

    TP_SPLIT: tuple[str, ...] = ("num_attention_heads", "intermediate_size")
    _SHOWN = {"intermediate_size": "intermediate_size (FFN width)"}

    def check_layout(self, tp: int, pp: int, vpp: int | None = None) -> None:
        """Raise one clear LayoutError if this architecture cannot be split ``tp`` x ``pp`` ways."""
        from zhnlp.errors import LayoutError

        problems = [f"{self._SHOWN.get(name, name)}={getattr(self, name)} is not divisible by tp={tp}"
                    for name in self.TP_SPLIT if getattr(self, name) % tp]
        if self.padded_vocab_size % tp:
            problems.append(f"the padded vocabulary ({self.vocab_size} -> {self.padded_vocab_size}) "
                            f"is not divisible by tp={tp}")
        stages = pp * (vpp or 1)
        layers, shown = self.pipeline_layers()
        if layers % stages:
            problems.append(f"{shown} is not divisible by pp*vpp={stages}")
        if problems:
            raise LayoutError("this model does not fit the parallel layout: " + "; ".join(problems)
                              + ". Choose tp/pp/vpp that divide these sizes.")

    def pipeline_layers(self) -> tuple[int, str]:
        """The number of transformer layers a pipeline splits (megatron's ``num_layers``) and how a message
        names it; a family that applies more layers than ``num_hidden_layers`` (ALBERT) overrides it."""
        return self.num_hidden_layers, f"num_hidden_layers={self.num_hidden_layers}"

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
