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

    @classmethod
    def _build(cls, data: dict, source: str | None, dropped: tuple[str, ...] = ()):
        """The config of ``data``'s fields; keys without a field (but ``dropped``) kept in ``extra``; a field's
        refusal prefixed with ``source`` (the file) when there is one."""
        import dataclasses

        from zhnlp.errors import CheckpointError

        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k not in dropped}
        try:
            return cls(**known, extra=extra)
        except CheckpointError as e:
            if source is None:
                raise
            raise CheckpointError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides):
        """Read ``config.json`` (see :func:`zhnlp.hub.read_config_json` for the checks on the file)."""
        from zhnlp.hub import read_config_json

        return cls.from_dict(read_config_json(path), source=str(path), **overrides)

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


class LabelledConfig(ConfigFiles):
    """The encoder families' config.json, read and written as transformers does: the classification labels
    (``num_labels``, ``id2label``, ``problem_type``) reconciled between the file and the caller's arguments, and
    the keys the dataclass has no field for kept in ``extra`` and written back. A family adjusts the file only
    through two hooks: :meth:`_normalise` (old spellings of its keys) and :meth:`_finish_dict` (keys its
    transformers class does not write)."""

    @property
    def label2id(self) -> dict:
        return {v: k for k, v in (self.id2label or {}).items()}

    @classmethod
    def _normalise(cls, data: dict, where: str) -> dict:
        """``data`` (a copy of the file's dict) with the family's older key spellings replaced."""
        return data

    @classmethod
    def from_dict(cls, data: dict, *, source: str | None = None, **overrides):
        """Build from a config.json dict; ``overrides`` win (e.g. ``num_labels=3``). ``source`` names where
        ``data`` came from (the config.json path) in error messages."""
        from zhnlp.errors import CheckpointError
        from zhnlp.models.common import labels as L

        where = source or "config.json"
        if not isinstance(data, dict):
            raise CheckpointError(f"{where} must be a JSON object of model settings, got {type(data).__name__}; "
                                  "re-save the checkpoint or restore its config.json.")
        data = cls._normalise(dict(data), where)
        file_labels = L.reconcile(data.get("num_labels"), data.get("id2label"), where, CheckpointError)
        args = L.reconcile(overrides.get("num_labels"), overrides.get("id2label"), "the arguments", ValueError)
        if "num_labels" in overrides and "id2label" not in overrides:
            # a new head size: keep the file's label names when they still fit, as transformers does
            args = L.override_num_labels(args[0], file_labels[1], where)
        elif "id2label" not in overrides:
            args = file_labels
        data = {**data, **overrides, "num_labels": args[0], "id2label": args[1]}
        L.check_problem_type(data.get("problem_type"), args[0],
                             "the arguments" if "problem_type" in overrides else where,
                             ValueError if "problem_type" in overrides else CheckpointError)
        return cls._build(data, source, dropped=("label2id",))

    def _finish_dict(self, out: dict) -> None:
        """Drop from ``out`` what the family's transformers class does not write (in place)."""

    def to_dict(self, architecture: str | None = None) -> dict:
        """The config.json transformers reads back (its own class for ``model_type``)."""
        import dataclasses

        out = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name] = getattr(self, f.name)
        if self.id2label is None:
            out["id2label"] = {i: f"LABEL_{i}" for i in range(self.num_labels)}
        out["label2id"] = {v: k for k, v in out["id2label"].items()}
        out.pop("num_labels")
        self._finish_dict(out)
        if architecture:
            out["architectures"] = [architecture]
        return out
