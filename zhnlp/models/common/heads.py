"""Task heads on top of a BERT-style encoder and their losses (transformers' semantics).

Heads receive the complete final hidden states ``(s, b, h)``; their small weights are
replicated across tensor-parallel ranks. Only the masked-LM decoder is vocabulary-parallel
(tied to the word embeddings) and lives in the model as ``output_layer``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel

from zhnlp.models.common.activations import ACTIVATIONS
from zhnlp.models.common.layers import LayerNorm

HEADS = ("base", "mlm", "sequence_classification", "token_classification", "question_answering")


class Pooler(torch.nn.Module):
    """``act(W h_[CLS] + b)``: (s, b, h) -> (b, h). ``activation``: tanh (BERT/ERNIE) unless given (RoFormer-Sim's
    pooler is linear: ``activation=None``)."""

    def __init__(self, hidden_size: int, dtype, activation=torch.tanh):
        super().__init__()
        self.dense = torch.nn.Linear(hidden_size, hidden_size, dtype=dtype)
        self.activation = activation

    def forward(self, hidden):
        pooled = self.dense(hidden[0])
        return pooled if self.activation is None else self.activation(pooled)


class MaskedLMTransform(torch.nn.Module):
    """dense -> activation -> LayerNorm, applied before the tied vocabulary projection. ``out_size`` (default: the
    hidden size) is the width of the result: ELECTRA's generator maps to its narrower embedding width."""

    def __init__(self, config, hidden_act: str, layer_norm_eps: float, out_size: int | None = None):
        super().__init__()
        out = out_size or config.hidden_size
        self.dense = torch.nn.Linear(config.hidden_size, out, dtype=config.params_dtype)
        self.act = ACTIVATIONS[hidden_act]
        self.layernorm = LayerNorm(config, out, eps=layer_norm_eps, sequence_parallel=False)

    def forward(self, hidden):
        return self.layernorm(self.act(self.dense(hidden)))


class LinearHead(torch.nn.Module):
    """Dropout then a linear layer (classification, token classification, QA span logits)."""

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float, dtype):
        super().__init__()
        self.dropout = torch.nn.Dropout(dropout)
        self.out = torch.nn.Linear(hidden_size, num_outputs, dtype=dtype)

    def forward(self, hidden):
        return self.out(self.dropout(hidden))


class ClassificationHead(torch.nn.Module):
    """A sentence classifier on the first token: dropout, ``dense`` (h -> h), ``activation``, dropout, ``out_proj``
    (h -> labels); RoFormer's (the encoder's activation) and ELECTRA's (GELU). (s, b, h) -> (b, labels)."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float, activation, dtype):
        super().__init__()
        self.dropout = torch.nn.Dropout(dropout)
        self.dense = torch.nn.Linear(hidden_size, hidden_size, dtype=dtype)
        self.activation = activation
        self.out_proj = torch.nn.Linear(hidden_size, num_labels, dtype=dtype)

    def forward(self, hidden):
        x = self.dropout(hidden[0])  # (b, h): the first token ([CLS])
        x = self.dropout(self.activation(self.dense(x)))
        return self.out_proj(x)


# ---------------------------------------------------------------------------------------------
# Losses. Logits are batch-first and complete (vocab-parallel MLM logits have their own).


def masked_lm_loss(logits, labels):
    """Mean cross entropy over positions whose label is not -100. logits (b, s, V), labels (b, s)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=-100)


def vocab_parallel_masked_lm_loss(logits_shard, labels, vocab_size: int, vocab_start: int):
    """The same loss from this rank's vocabulary shard, without gathering the logits.

    logits_shard (s, b, Vp/tp), labels (b, s). Columns of the padded vocabulary beyond
    ``vocab_size`` are excluded from the softmax.
    """
    # megatron's kernel works in place on its input: give it a private fp32 copy
    logits_shard = logits_shard.float() if logits_shard.dtype != torch.float32 else logits_shard.clone()
    shard = logits_shard.size(-1)
    cols = torch.arange(vocab_start, vocab_start + shard, device=logits_shard.device)
    if int(cols[-1]) >= vocab_size:
        logits_shard = logits_shard.masked_fill(cols >= vocab_size, float("-inf"))
    target = labels.transpose(0, 1)  # (s, b)
    valid = target != -100
    per_token = tensor_parallel.vocab_parallel_cross_entropy(logits_shard, target.masked_fill(~valid, 0))
    return (per_token * valid).sum() / valid.sum()


def sequence_classification_loss(logits, labels, num_labels: int, problem_type: str | None):
    """transformers' rule: regression for one label, CE for integer labels, else multi-label BCE."""
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze().to(logits.dtype))
        return F.mse_loss(logits, labels.to(logits.dtype))
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
    raise ValueError(f"unknown problem_type {problem_type!r}; use regression, single_label_classification "
                     "or multi_label_classification.")


def token_classification_loss(logits, labels):
    """Cross entropy over tokens whose label is not -100. logits (b, s, n), labels (b, s)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


def question_answering_loss(start_logits, end_logits, start_positions, end_positions):
    """Mean of start and end CE; positions outside the sequence are ignored (transformers' rule)."""
    ignored = start_logits.size(1)
    start = start_positions.reshape(-1).clamp(0, ignored)
    end = end_positions.reshape(-1).clamp(0, ignored)
    return (F.cross_entropy(start_logits, start, ignore_index=ignored)
            + F.cross_entropy(end_logits, end, ignore_index=ignored)) / 2


def replaced_token_detection_loss(logits, labels, attention_mask=None):
    """ELECTRA's discriminator loss: binary cross entropy of one logit per token against labels 1 (replaced) / 0
    (original), averaged over the real tokens (``attention_mask`` 1; every token without a mask).
    logits (b, s), labels (b, s), attention_mask (b, s)."""
    if attention_mask is not None:
        real = attention_mask == 1
        logits, labels = logits[real], labels[real]
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def head_loss(head: str, outputs: dict, num_labels: int, problem_type: str | None,
              labels=None, start_positions=None, end_positions=None, attention_mask=None):
    """The loss of a head from its complete, batch-first outputs, or None without labels
    (``attention_mask``: the batch's, read by the heads whose loss skips padding)."""
    if head == "question_answering":
        if start_positions is None or end_positions is None:
            return None
        return question_answering_loss(outputs["start_logits"], outputs["end_logits"], start_positions, end_positions)
    if labels is None or head == "base":
        return None
    if head == "mlm":
        return masked_lm_loss(outputs["logits"], labels)
    if head == "sequence_classification":
        return sequence_classification_loss(outputs["logits"], labels, num_labels, problem_type)
    if head == "pretraining":
        return replaced_token_detection_loss(outputs["logits"], labels, attention_mask)
    return token_classification_loss(outputs["logits"], labels)
