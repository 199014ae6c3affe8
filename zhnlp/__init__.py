"""zhnlp: Chinese NLP model zoo and training toolkit on megatron-core.

    import zhnlp
    model = zhnlp.AutoModelForMaskedLM.from_pretrained("ernie-3.0-base-zh")
    out = model(input_ids, attention_mask=mask)
    out.logits

Under ``torchrun``, call ``zhnlp.distributed.init(tp=..., pp=...)`` first; every rank then
receives complete outputs. Chinese text: ``zhnlp.AutoTokenizer``, ``zhnlp.segment``.

``import zhnlp`` is light: torch, megatron-core and transformers are imported only when an
attribute that needs them is first used (``zhnlp.AutoModel``, ``zhnlp.pipeline``, ...), and
nothing about torch changes on import (see :mod:`zhnlp.distributed.cpu` for what changes, and
when, on a machine without CUDA).
"""

from __future__ import annotations

import importlib
import warnings as _warnings

from zhnlp.errors import CheckpointError, LayoutError, ModelNotFoundError, ZhnlpError
from zhnlp.version import __version__

# megatron-core announces optional accelerators it did not find (TransformerEngine, Apex) and
# deprecations of its own internal arguments at import and construction; none of them is
# actionable for a zhnlp user.
for _message in ("Transformer Engine and Apex are not installed", "tp_group is None",
                 "full scope is deprecated", "Apex is not installed"):
    _warnings.filterwarnings("ignore", message=f".*{_message}.*")

# public name -> module that defines it; imported on first access (PEP 562)
_LAZY = {
    "AutoConfig": "zhnlp.configuration",
    "AutoModel": "zhnlp.auto",
    "AutoModelForCausalLM": "zhnlp.auto",
    "AutoModelForMaskedLM": "zhnlp.auto",
    "AutoModelForPreTraining": "zhnlp.auto",
    "AutoModelForQuestionAnswering": "zhnlp.auto",
    "AutoModelForSequenceClassification": "zhnlp.auto",
    "AutoModelForTokenClassification": "zhnlp.auto",
    "AutoTokenizer": "zhnlp.tokenizers",
    "Callback": "zhnlp.training.callbacks",
    "EarlyStoppingCallback": "zhnlp.training.callbacks",
    "EvalPrediction": "zhnlp.training.callbacks",
    "FinetuneConfig": "zhnlp.training.finetune_config",
    "TrainerControl": "zhnlp.training.callbacks",
    "TrainerState": "zhnlp.training.callbacks",
    "ModelCard": "zhnlp.cards",
    "Segmenter": "zhnlp.tokenizers.segment",
    "TextStreamer": "zhnlp.pipelines.streaming",
    "finetune": "zhnlp.training.finetune",
    "list_models": "zhnlp.cards",
    "pipeline": "zhnlp.pipelines",
    "segment": "zhnlp.tokenizers.segment",
}
_SUBMODULES = ("distributed",)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"zhnlp.{name}")
    else:
        raise AttributeError(f"module 'zhnlp' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_SUBMODULES])


__all__ = sorted(["CheckpointError", "LayoutError", "ModelNotFoundError", "ZhnlpError", "__version__",
                  *_LAZY, *_SUBMODULES])
