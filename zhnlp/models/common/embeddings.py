"""Input embeddings of BERT-style encoders: word + token type + position (+ ERNIE task type)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from zhnlp.models.common.layers import LayerNorm


class EncoderEmbeddings(MegatronModule):
    """Sum of the embeddings, LayerNorm and dropout; output ``(s, b, h)``.

    The word embedding is vocabulary-parallel (rows split across TP ranks, output all-reduced);
    position, token-type and task-type tables are small and replicated. The LayerNorm runs on
    the full sequence before it is scattered for sequence parallelism, so its gradients are
    already identical on every TP rank.
    """

    def __init__(self, config, vocab_size: int, max_position_embeddings: int, type_vocab_size: int,
                 task_type_vocab_size: int, layer_norm_eps: float):
        super().__init__(config=config)
        h, dtype = config.hidden_size, config.params_dtype
        self.word_embeddings = tensor_parallel.VocabParallelEmbedding(
            vocab_size, h, init_method=config.init_method, config=config)
        self.position_embeddings = torch.nn.Embedding(max_position_embeddings, h, dtype=dtype)
        self.token_type_embeddings = torch.nn.Embedding(type_vocab_size, h, dtype=dtype) if type_vocab_size else None
        self.task_type_embeddings = (torch.nn.Embedding(task_type_vocab_size, h, dtype=dtype)
                                     if task_type_vocab_size else None)
        self.layernorm = LayerNorm(config, h, eps=layer_norm_eps, sequence_parallel=False)

    def forward(self, input_ids, position_ids, token_type_ids=None, task_type_ids=None):
        # all inputs: (b, s) int64
        x = self.word_embeddings(input_ids)  # (b, s, h)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        if self.task_type_embeddings is not None:
            x = x + self.task_type_embeddings(task_type_ids)
        x = self.layernorm(x)
        x = x.transpose(0, 1).contiguous()  # (s, b, h)
        if self.config.sequence_parallel:
            x = tensor_parallel.scatter_to_sequence_parallel_region(x)  # (s/tp, b, h)
            # Each rank now holds different tokens: draw their dropout from the per-rank stream.
            rng = tensor_parallel.get_cuda_rng_tracker().fork()
        else:
            rng = nullcontext()
        with rng:
            x = F.dropout(x, p=self.config.hidden_dropout, training=self.training)
        return x
