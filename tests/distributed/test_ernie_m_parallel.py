"""ERNIE-M against transformers 4.x's golden outputs under tensor and pipeline parallelism (gloo, two processes).

The cases of ``tests/assets/ernie_m/`` (every head, made by ``scripts/make_ernie_m_fixture.py``) are already in
the layout ``parity_worker.py`` reads (``hf/``, ``inputs.safetensors``, ``reference.safetensors``,
``meta.json``); each layout is one torchrun job that loads, runs and saves every case on every rank.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
WORKER = Path(__file__).with_name("parity_worker.py")
FIXTURE = Path(__file__).resolve().parent.parent / "assets" / "ernie_m"


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("ernie_m")
    for case in FIXTURE.iterdir():
        if (case / "hf").is_dir():
            shutil.copytree(case, root / case.name)  # the worker writes its results beside each case
    return root


def _saved_tensors(directory: Path) -> dict:
    """The weights save_pretrained wrote: one file, or shards numbered over both ranks' parts with an index."""
    if not (directory / "model.safetensors.index.json").exists():
        assert sorted(p.name for p in directory.glob("*.safetensors")) == ["model.safetensors"]
        return load_file(str(directory / "model.safetensors"))
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    tensors = {}
    for shard in shards:
        tensors.update(load_file(str(directory / shard)))
    assert set(tensors) == set(index["weight_map"])
    return tensors


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_layout_matches_transformers_4(cases, tp, pp):
    import zhnlp

    torchrun(WORKER, 2, cases, "--tp", tp, "--pp", pp, "--save")
    tag = f"tp{tp}pp{pp}"
    sharded = 0
    for case in sorted(p for p in cases.iterdir() if (p / "hf").is_dir()):
        meta = json.loads((case / "meta.json").read_text())
        reference = load_file(str(case / "reference.safetensors"))
        for rank in range(2):
            result = json.loads((case / f"result-{tag}-rank{rank}.json").read_text())
            assert not result["missing"] and set(result["diffs"]) == set(reference), case.name
            assert result["num_parameters"] == meta["num_parameters"], case.name
            for k, d in result["diffs"].items():
                assert d <= 1e-5, f"{case.name} [{tag}] rank {rank}: {k} differs by {d:.2e}"
        # saved by both ranks' parts in shards of at most 20KB: transformers 4.x's keys and values, bit for bit
        saved = case / f"saved-{tag}"
        original = load_file(str(case / "hf" / "model.safetensors"))
        tensors = _saved_tensors(saved)
        sharded += (saved / "model.safetensors.index.json").exists()
        assert set(tensors) == set(original), case.name
        for k in original:
            assert torch.equal(tensors[k], original[k]), f"{case.name} [{tag}] round trip changed {k}"
        assert json.loads((saved / "config.json").read_text())["architectures"] == [meta["hf_class"]]
        # and the saved directory loads back into zhnlp (one process here) with identical outputs
        auto = {"base": zhnlp.AutoModel, "sequence_classification": zhnlp.AutoModelForSequenceClassification,
                "token_classification": zhnlp.AutoModelForTokenClassification,
                "question_answering": zhnlp.AutoModelForQuestionAnswering}[meta["head"]]
        batch = load_file(str(case / "inputs.safetensors"))
        with torch.no_grad():
            a, b = auto.from_pretrained(case / "hf")(**batch), auto.from_pretrained(saved)(**batch)
        for k in a:
            assert torch.equal(a[k], b[k]), f"{case.name} [{tag}]: {k}"
    assert sharded >= 4  # every model but the smallest is split into several files
