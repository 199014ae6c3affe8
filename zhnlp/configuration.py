"""``zhnlp.AutoConfig``: a model's architecture config, read from a name, repo id or directory.

    config = zhnlp.AutoConfig.from_pretrained("ernie-3.0-base-zh", num_labels=3)
    model = zhnlp.AutoModelForSequenceClassification.from_config(config)
    config.save_pretrained("out/")            # config.json that transformers' AutoConfig reads

The object returned is the family's own config class (e.g. ``ErnieConfig``): a dataclass of the
architecture only (sizes, label names), never run settings such as the parallel layout.
"""

from __future__ import annotations

import os


class AutoConfig:
    """Factory of family configs (use the class methods)."""

    def __init__(self):
        raise TypeError("use AutoConfig.from_pretrained(name_or_path) or AutoConfig.for_model(model_type, ...)")

    @staticmethod
    def from_pretrained(name_or_path: str | os.PathLike, *, revision: str | None = None,
                        cache_dir: str | os.PathLike | None = None, local_files_only: bool = False,
                        token: str | bool | None = None, trust_remote_code: bool = False, **overrides):
        """The config of a directory written by ``save_pretrained`` (zhnlp or transformers), a model
        name (``zhnlp.list_models()``) or a hub repo id; ``overrides`` change fields (``num_labels=3``)."""
        from zhnlp import hub
        from zhnlp.models import family_for_model_type
        from zhnlp.models.common.loading import refuse_remote_code

        refuse_remote_code(trust_remote_code)
        directory = hub.resolve(name_or_path, revision=revision, cache_dir=cache_dir,
                                local_files_only=local_files_only, token=token)
        source = str(directory / "config.json")
        raw = hub.read_config_json(source)
        family = family_for_model_type(raw.get("model_type"), source)
        return family.config_class.from_dict(raw, source=source, **overrides)

    @staticmethod
    def for_model(model_type: str, **fields):
        """A config of ``model_type`` (``"ernie"``, ``"bert"``) with the family's defaults and ``fields``."""
        from zhnlp.models import family_for_model_type

        family = family_for_model_type(model_type, "AutoConfig.for_model")
        return family.config_class.from_dict({"model_type": model_type, **fields}, source="AutoConfig.for_model")

    @staticmethod
    def from_dict(data: dict, **overrides):
        """A config from a config.json dict (its ``model_type`` picks the family)."""
        from zhnlp.models import family_for_model_type

        family = family_for_model_type(data.get("model_type") if isinstance(data, dict) else None)
        return family.config_class.from_dict(data, **overrides)


def as_family_config(config):
    """``config`` as a zhnlp family config: accepts one, a config.json dict, or a transformers
    ``PretrainedConfig`` (through its ``to_dict()``). Returns ``(family, config)``."""
    from zhnlp.models import family_for_model_type

    if type(config).__module__.startswith("transformers."):  # a transformers PretrainedConfig
        config = config.to_dict()
    if isinstance(config, dict):
        family = family_for_model_type(config.get("model_type"))
        return family, family.config_class.from_dict(config)
    family = family_for_model_type(getattr(config, "model_type", None))
    if not isinstance(config, family.config_class):
        raise TypeError(f"config must be a {family.config_class.__name__}, a config.json dict or a transformers "
                        f"config, got {type(config).__name__}.")
    return family, config
