"""zhnlp: Chinese NLP model zoo and training toolkit on megatron-core.

    import zhnlp
    model = zhnlp.AutoModelForMaskedLM.from_pretrained("ernie-3.0-base-zh")
    out = model(input_ids, attention_mask=mask)
    out.logits

Under ``torchrun``, call ``zhnlp.distributed.init(tp=..., pp=...)`` first; every rank then
receives complete outputs. Chinese text: ``zhnlp.AutoTokenizer``, ``zhnlp.segment``.
"""

import warnings as _warnings

# megatron-core announces optional accelerators it did not find (TransformerEngine, Apex) and
# deprecations of its own internal arguments at import and construction; none of them is
# actionable for a zhnlp user.
for _message in ("Transformer Engine and Apex are not installed", "tp_group is None",
                 "full scope is deprecated", "Apex is not installed"):
    _warnings.filterwarnings("ignore", message=f".*{_message}.*")

from zhnlp.distributed import cpu as _cpu  # noqa: E402

# Before megatron-core is imported anywhere: make its torch.compile'd helpers eager on CPU.
_cpu.install()

from zhnlp import distributed  # noqa: E402
from zhnlp.auto import (  # noqa: E402
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from zhnlp.cards import ModelCard, list_models  # noqa: E402
from zhnlp.pipelines import pipeline  # noqa: E402
from zhnlp.tokenizers import AutoTokenizer  # noqa: E402
from zhnlp.tokenizers.segment import Segmenter, segment  # noqa: E402
from zhnlp.errors import CheckpointError, LayoutError, ModelNotFoundError, ZhnlpError  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoTokenizer",
    "CheckpointError",
    "LayoutError",
    "ModelCard",
    "ModelNotFoundError",
    "Segmenter",
    "ZhnlpError",
    "distributed",
    "list_models",
    "pipeline",
    "segment",
]
