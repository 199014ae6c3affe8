"""RoFormer-Sim's pooler under tensor and pipeline parallelism (TP2 x PP2, gloo): the pooler sits on the last
stage and its output reaches every rank. The heads transformers has are the table-driven parity tests'."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import torchrun
from tests.distributed.test_parity_parallel import WORKER
from tests.tiny import hf_model, inputs

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_pooler_matches_at_tp2_pp2(tmp_path):
    case = tmp_path / "roformer-pooler"
    hf = hf_model("roformer", "base")
    hf.save_pretrained(case / "hf")
    weights = load_file(str(case / "hf" / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    weights["pooler.dense.weight"] = torch.randn(32, 32, generator=g) * 0.1
    weights["pooler.dense.bias"] = torch.randn(32, generator=g) * 0.1
    save_file(weights, str(case / "hf" / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((case / "hf" / "config.json").read_text())
    (case / "hf" / "config.json").write_text(json.dumps({**config, "pooler_activation": "tanh"}))
    batch = inputs("roformer", "base")
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    pooled = torch.tanh(ref.last_hidden_state[:, 0] @ weights["pooler.dense.weight"].T + weights["pooler.dense.bias"])
    expected = {"last_hidden_state": ref.last_hidden_state, "pooler_output": pooled,
                **{f"hidden_states.{i}": h.clone() for i, h in enumerate(ref.hidden_states)}}
    save_file({k: v.contiguous() for k, v in expected.items()}, str(case / "reference.safetensors"))
    save_file({k: v.contiguous() for k, v in batch.items()}, str(case / "inputs.safetensors"))
    pooler_size = 32 * 32 + 32
    (case / "meta.json").write_text(json.dumps({"name": "roformer", "head": "base"}))

    torchrun(WORKER, 4, tmp_path, "--tp", 2, "--pp", 2, "--save")
    for rank in range(4):
        result = json.loads((case / f"result-tp2pp2-rank{rank}.json").read_text())
        assert not result["missing"], result["missing"]
        assert set(result["diffs"]) == set(expected)
        for k, d in result["diffs"].items():
            assert d <= 1e-5, f"rank {rank}: {k} differs by {d:.2e}"
        assert result["num_parameters"] == hf.num_parameters() + pooler_size
    written = {}  # each stage writes its own weights: the table goes with the first, the pooler with the last
    for f in sorted((case / "saved-tp2pp2").glob("model*.safetensors")):
        written.update(load_file(str(f)))
    assert torch.equal(written["pooler.dense.weight"], weights["pooler.dense.weight"])
    assert torch.equal(written["encoder.embed_positions.weight"], hf.encoder.embed_positions.weight)
    assert json.loads((case / "saved-tp2pp2" / "config.json").read_text())["pooler_activation"] == "tanh"
