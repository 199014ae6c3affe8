"""Compiled mode (``--compile``) in the trainer: the same losses and gradient norms as eager training from the same
weights and data, with no graph break inside the layers: the encoder and the decoder on one process, the encoder
under tensor parallelism with sequence parallelism (megatron's collectives traced into the graph)."""

import json
from pathlib import Path

import pytest

from tests.conftest import torchrun
from tests.distributed.conftest import make_corpus, same_training

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = Path(__file__).with_name("compile_worker.py")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    return {"mlm": make_corpus(tmp_path_factory.mktemp("mlm")),
            "causal-lm": make_corpus(tmp_path_factory.mktemp("clm"), objective="causal-lm")}


@pytest.mark.parametrize("recipe,nproc,extra", [
    ("ernie-debug", 1, []),
    ("ernie4.5-debug", 1, []),
    ("ernie-debug", 2, ["--tp", "2", "--sp"]),
], ids=["encoder", "decoder", "encoder-tp2-sp"])
def test_compiled_training_equals_eager(corpora, recipe, nproc, extra):
    root = corpora["causal-lm" if recipe.startswith("ernie4.5") else "mlm"]
    tag = f"{recipe}-{nproc}"
    torchrun(WORKER, nproc, root / "data", root, "--tag", tag, "--recipe", recipe, *extra)
    result = json.loads((root / f"{tag}.json").read_text())
    assert result["compiled_model"]
    same_training(result["eager"], result["compiled"], f"{recipe} compiled", steps=3)
    assert result["graph_breaks"] == 0, "a graph break inside a compiled layer"
    assert result["graphs"] >= 1
