"""ALBERT's shared layers: their gradients must be summed over the pipeline stages before the data-parallel
reduction, which megatron's overlapped reduction would start too early: refused with one message."""

import types

import pytest
from megatron.core import parallel_state

from zhnlp.models.albert.model import sync_shared_layer_grads


@pytest.mark.parametrize("pp, chunks", [(2, 1), (1, 2)])
def test_overlapped_gradient_reduction_is_refused_when_copies_span_chunks(monkeypatch, pp, chunks):
    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_world_size", lambda: pp)
    chunk = types.SimpleNamespace(ddp_config=types.SimpleNamespace(overlap_grad_reduce=True))
    with pytest.raises(RuntimeError, match="summed over the pipeline stages before the data-parallel reduction; "
                                           "turn off overlap_grad_reduce"):
        sync_shared_layer_grads([chunk] * chunks)


def test_one_chunk_without_a_pipeline_has_nothing_to_sum(monkeypatch):
    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_world_size", lambda: 1)
    chunk = types.SimpleNamespace(ddp_config=types.SimpleNamespace(overlap_grad_reduce=True))
    assert sync_shared_layer_grads([chunk]) is None  # the copies are one parameter: no check, no work
