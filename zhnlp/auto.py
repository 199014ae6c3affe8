"""``from_pretrained``: a name, repo id or directory -> config.json -> family -> model.

Each Auto class picks a head; the family comes from config.json's ``model_type``.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from zhnlp import distributed, hub
from zhnlp.errors import ModelNotFoundError
from zhnlp.models import family_for_model_type
from zhnlp.models.common.pretrained import PretrainedModel

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


class _Auto:
    head = "base"

    def __init__(self):
        raise TypeError(f"use {type(self).__name__}.from_pretrained(name_or_path) or .from_config(config)")

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, *, revision: str | None = None,
                        dtype: str | torch.dtype | None = None, sequence_parallel: bool = False, seed: int = 1234,
                        **config_overrides) -> PretrainedModel:
        """Load a model for the current parallel layout (a world of one if none was set up).

        Args:
            name_or_path: a directory written by transformers or zhnlp, a model name from
                ``zhnlp.list_models()`` (e.g. ``"ernie-3.0-base-zh"``), or a hub repo id.
            revision: hub revision (branch, tag or commit) for names and repo ids.
            dtype: parameter dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
            sequence_parallel: split activations along the sequence under tensor parallelism.
            seed: seeds the initialisation of head weights the checkpoint lacks.
            config_overrides: config.json fields to change, e.g. ``num_labels=3`` for a new head.
        """
        directory = hub.resolve(name_or_path, revision=revision)
        source = str(directory / "config.json")
        raw = hub.read_config_json(source)
        family = family_for_model_type(raw.get("model_type"), source)
        _check_overrides(family.config_class, raw, config_overrides)
        arch = family.config_class.from_dict(raw, source=source, **config_overrides)
        distributed.layout()  # a world of one when the user did not call zhnlp.distributed.init
        return PretrainedModel.from_checkpoint(family, arch, cls.head, directory, seed=seed,
                                               **_run_options(dtype, sequence_parallel))

    @classmethod
    def from_config(cls, config, *, dtype=None, sequence_parallel: bool = False, seed: int = 1234) -> PretrainedModel:
        """A randomly initialised model (transformers' initialisation) from an architecture config:
        a family config object, a config.json dict, or a model name (its card's config)."""
        from zhnlp import cards

        if isinstance(config, str):
            config = dict(cards.require_card(config).config)
        if isinstance(config, dict):
            family = family_for_model_type(config.get("model_type"))
            config = family.config_class.from_dict(config)
        else:
            family = family_for_model_type(getattr(config, "model_type", None))
        distributed.layout()
        return PretrainedModel.from_config(family, config, cls.head, seed=seed,
                                           **_run_options(dtype, sequence_parallel))


def _run_options(dtype, sequence_parallel: bool) -> dict:
    options = {}
    if dtype is not None:
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f"dtype {dtype!r} is not supported; choose one of {sorted(_DTYPES)}.")
            dtype = _DTYPES[dtype]
        options["params_dtype"] = dtype
        options["bf16"] = dtype == torch.bfloat16
        options["fp16"] = dtype == torch.float16
    if sequence_parallel:
        if distributed.layout().tp == 1:
            raise ValueError("sequence_parallel=True needs tensor parallelism (tp >= 2); "
                             "call zhnlp.distributed.init(tp=2, ...) first or drop it.")
        options["sequence_parallel"] = True
    return options


def _check_overrides(config_class, raw: dict, overrides: dict) -> None:
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(k for k in overrides if k not in fields and k not in raw and k != "label2id")
    if unknown:
        raise TypeError(f"unknown config overrides {unknown}; known fields: {sorted(fields - {'extra'})}.")


class AutoModel(_Auto):
    """Encoder outputs: ``last_hidden_state`` (b, s, h) and ``pooler_output`` (b, h)."""

    head = "base"


class AutoModelForMaskedLM(_Auto):
    """Masked-LM logits (b, s, vocab) from the head tied to the word embeddings."""

    head = "mlm"


class AutoModelForSequenceClassification(_Auto):
    """Logits (b, num_labels) from the pooled [CLS] state."""

    head = "sequence_classification"


class AutoModelForTokenClassification(_Auto):
    """Logits (b, s, num_labels) per token."""

    head = "token_classification"


class AutoModelForQuestionAnswering(_Auto):
    """Span ``start_logits`` and ``end_logits``, each (b, s)."""

    head = "question_answering"


__all__ = ["AutoModel", "AutoModelForMaskedLM", "AutoModelForQuestionAnswering",
           "AutoModelForSequenceClassification", "AutoModelForTokenClassification", "ModelNotFoundError"]
