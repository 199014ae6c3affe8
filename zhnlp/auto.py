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

class _Auto:
    head = "base"

    def __init__(self):
        raise TypeError(f"use {type(self).__name__}.from_pretrained(name_or_path) or .from_config(config)")

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, *, config=None, revision: str | None = None,
                        cache_dir: str | os.PathLike | None = None, local_files_only: bool = False,
                        token: str | bool | None = None, dtype: str | torch.dtype | None = None,
                        torch_dtype: str | torch.dtype | None = None, device=None, device_map=None,
                        ignore_mismatched_sizes: bool = False, trust_remote_code: bool = False,
                        sequence_parallel: bool = False, seed: int = 1234, compile: bool = False,
                        **config_overrides) -> PretrainedModel:
        """Load a model for the current parallel layout (a world of one if none was set up).

        The arguments are transformers' where transformers has them.

        Args:
            name_or_path: a directory written by transformers or zhnlp, a model name from
                ``zhnlp.list_models()`` (e.g. ``"ernie-3.0-base-zh"``), or a hub repo id.
            config: an architecture config to use instead of the checkpoint's config.json
                (``zhnlp.AutoConfig.from_pretrained(...)``, a config.json dict or a transformers config).
            revision: hub revision (branch, tag or commit) for names and repo ids.
            cache_dir: the Hugging Face cache directory to read (and download) names and repo ids into.
            local_files_only: never download; names and repo ids must be in the cache.
            token: the hub token for private repos (``True``: the one saved by ``hf auth login``).
            dtype: parameter dtype: ``"auto"`` (the default, as in transformers 5: config.json's ``dtype``,
                else the weights' own), ``"float32"``, ``"bfloat16"``, ``"float16"`` or a torch dtype.
                ``torch_dtype`` is its old name.
            device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``, an index); by default this
                rank's device. ``device_map``: the same for the single-device forms transformers accepts
                (``"auto"``, a device, ``{"": device}``); maps over several devices are refused: split a
                large model with ``zhnlp.distributed.init(tp=..., pp=...)``.
            ignore_mismatched_sizes: freshly initialise (and name) weights whose size differs from the
                architecture's, e.g. a classification head loaded with another ``num_labels``.
            trust_remote_code: refused when True: zhnlp never runs code from a checkpoint.
            sequence_parallel: split activations along the sequence under tensor parallelism.
            seed: seeds the initialisation of head weights the checkpoint lacks.
            compile: ``torch.compile`` the transformer layers (compiled mode, :mod:`zhnlp.models.common.compiled`):
                the first call of each shape and mode (inference, training) compiles; later calls are faster.
            config_overrides: config.json fields to change, e.g. ``num_labels=3`` for a new head.
        """
        from zhnlp.configuration import as_family_config
        from zhnlp.models.common import loading

        loading.refuse_remote_code(trust_remote_code)
        target = loading.pick_device(device, device_map)
        directory = hub.resolve(name_or_path, revision=revision, cache_dir=cache_dir,
                                local_files_only=local_files_only, token=token)
        source = str(directory / "config.json")
        raw = hub.read_config_json(source)
        if config is not None:
            family, arch = as_family_config(config)
            if config_overrides:
                arch = family.config_class.from_dict(arch.to_dict(), **config_overrides)
        else:
            family = family_for_model_type(raw.get("model_type"), source)
            _check_head(family, cls, raw.get("model_type"), source)
            arch = family.config_class.from_dict(raw, source=source, **config_overrides)
            _check_overrides(type(arch), raw, config_overrides)  # the class model_type picked (dense or MoE)
        params_dtype = loading.pick_dtype(dtype, torch_dtype, raw, lambda: _first_weight_dtype(directory))
        loading.place(target)
        distributed.layout()  # a world of one when the user did not call zhnlp.distributed.init
        model = PretrainedModel.from_checkpoint(family, arch, cls.head, directory, seed=seed,
                                                ignore_mismatched_sizes=ignore_mismatched_sizes,
                                                **_run_options(params_dtype, sequence_parallel))
        model.name_or_path = os.fspath(name_or_path)
        return _compiled(model) if compile else model

    @classmethod
    def from_config(cls, config, *, dtype=None, torch_dtype=None, sequence_parallel: bool = False,
                    seed: int = 1234, compile: bool = False) -> PretrainedModel:
        """A randomly initialised model (transformers' initialisation) from an architecture config:
        a family config object (``zhnlp.AutoConfig``), a config.json dict, a transformers config, or a model
        name (its card's config). ``dtype``: as for from_pretrained; ``"auto"`` or None means float32 here;
        ``compile``: as for from_pretrained."""
        from zhnlp import cards
        from zhnlp.configuration import as_family_config
        from zhnlp.models.common import loading

        if isinstance(config, str):
            config = dict(cards.require_card(config).config)
        family, config = as_family_config(config)
        _check_head(family, cls, config.model_type, "the config")
        params_dtype = loading.pick_dtype(dtype, torch_dtype, {})
        distributed.layout()
        model = PretrainedModel.from_config(family, config, cls.head, seed=seed,
                                            **_run_options(params_dtype, sequence_parallel))
        model.name_or_path = ""
        return _compiled(model) if compile else model


def _compiled(model: PretrainedModel) -> PretrainedModel:
    from zhnlp.models.common.compiled import compile_layers

    compile_layers(model)
    return model


def _first_weight_dtype(directory) -> torch.dtype | None:
    """The dtype of the checkpoint's first floating-point weight (for ``dtype="auto"`` without a config entry)."""
    from zhnlp.conversion.engine import CheckpointReader

    reader = CheckpointReader(directory)
    for key in sorted(reader.keys()):
        found = reader.dtype(key)
        if found.is_floating_point:
            return found
    return None


def _run_options(dtype: torch.dtype, sequence_parallel: bool) -> dict:
    options = {"params_dtype": dtype, "bf16": dtype == torch.bfloat16, "fp16": dtype == torch.float16}
    if sequence_parallel:
        if distributed.layout().tp == 1:
            raise ValueError("sequence_parallel=True needs tensor parallelism (tp >= 2); "
                             "call zhnlp.distributed.init(tp=2, ...) first or drop it.")
        options["sequence_parallel"] = True
    return options


def _check_head(family, cls, model_type, source: str) -> None:
    """Refuse a head the family does not have (a decoder head on an encoder, an encoder head on a decoder)."""
    if cls.head not in family.bridge.HEAD_PARTS:
        from zhnlp.errors import CheckpointError

        fits = [c.__name__ for c in _Auto.__subclasses__() if c.head in family.bridge.HEAD_PARTS]
        what = {"causal_lm": "a decoder (causal LM) such as ERNIE 4.5 (model_type ernie4_5 or ernie4_5_moe)",
                "pretraining": "a family with a pretraining head, such as an ELECTRA discriminator (model_type "
                               "electra)"}.get(cls.head, f"a model family with the {cls.head} head")
        raise CheckpointError(f"{source}: model_type {model_type!r} has no {cls.head} head in zhnlp, so "
                              f"{cls.__name__} cannot load it; it needs {what}. This model loads with "
                              f"{', '.join(fits) or 'no zhnlp Auto class'}.")


def _check_overrides(config_class, raw: dict, overrides: dict) -> None:
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(k for k in overrides if k not in fields and k not in raw and k != "label2id")
    if unknown:
        raise TypeError(f"unknown config overrides {unknown}; known fields: {sorted(fields - {'extra'})}.")


class AutoModel(_Auto):
    """Encoder outputs: ``last_hidden_state`` (b, s, h) and, where the family has a pooler (ERNIE/BERT, not
    ELECTRA), ``pooler_output`` (b, h)."""

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


class AutoModelForPreTraining(_Auto):
    """A family's pretraining head. ELECTRA: the discriminator, ``logits`` (b, s) with one replaced-token score
    per token and, given ``labels`` (b, s) of 1 (replaced) / 0 (original), ``loss``: the binary cross entropy
    over the tokens ``attention_mask`` marks as real."""

    head = "pretraining"


class AutoModelForCausalLM(_Auto):
    """Decoder LLMs (ERNIE 4.5): ``model(input_ids, attention_mask=None, position_ids=None, labels=None)`` gives
    ``logits`` (b, s, vocab) and, with labels, ``loss``: the mean over tokens whose label (shifted one position
    left inside the model, as transformers does) is not -100."""

    head = "causal_lm"


__all__ = ["AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForPreTraining",
           "AutoModelForQuestionAnswering", "AutoModelForSequenceClassification", "AutoModelForTokenClassification",
           "ModelNotFoundError"]
