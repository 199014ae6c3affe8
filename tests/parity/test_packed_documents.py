"""Packed causal-LM rows with reset attention (``document_ids`` + per-document ``position_ids``, as
CausalLMDataset gives them) against transformers' Ernie4_5ForCausalLM run on each document alone: the same
logits; the loss still predicts every next token of the row (document ends included)."""

import pytest
import torch

import zhnlp
from tests.tiny_decoder import BASE, hf_model
from zhnlp.auto import AutoModelForCausalLM


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


def test_packed_documents_equal_each_document_alone(tmp_path):
    hf = hf_model("tied", seed=2)
    hf.save_pretrained(tmp_path / "hf")
    chunk = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").chunks[0]
    g = torch.Generator().manual_seed(0)
    lengths = [[5, 9, 2], [16]]  # two rows of 16 tokens: three documents, and one
    rows, docs, positions = [], [], []
    for row in lengths:
        rows.append([torch.randint(3, BASE["vocab_size"], (n,), generator=g) for n in row])
        docs.append(torch.cat([torch.full((n,), d) for d, n in enumerate(row)]))
        positions.append(torch.cat([torch.arange(n) for n in row]))
    ids = torch.stack([torch.cat(r) for r in rows])
    with torch.no_grad(), zhnlp.distributed.cpu.scope():
        out = chunk(ids, position_ids=torch.stack(positions), document_ids=torch.stack(docs), labels=ids)
        crossing = chunk(ids, labels=ids)  # no reset: later documents see the earlier ones
    ref_logits = []
    with torch.no_grad():
        for row in rows:
            pieces = [hf(doc[None], labels=doc[None]) for doc in row]
            ref_logits.append(torch.cat([p.logits[0] for p in pieces]))
    torch.testing.assert_close(out["logits"], torch.stack(ref_logits), rtol=0, atol=2e-5)
    assert (crossing["logits"][0, 5:] - out["logits"][0, 5:]).abs().max() > 1e-2
    # the loss: every position predicts the next token of the row, across document ends as well
    flat = torch.stack(ref_logits)[:, :-1].reshape(-1, BASE["vocab_size"])
    expected = torch.nn.functional.cross_entropy(flat, ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out["loss"], expected, rtol=0, atol=1e-5)
