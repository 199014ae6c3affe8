"""ALBERT's shared layers under training: the copies of a layer group's weights on different pipeline stages and
virtual chunks get their gradients summed, so that every layout trains exactly as one process does (where the
group's layers share one parameter) and every copy stays identical; save_pretrained then writes each shared
weight once, as transformers expects."""

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import torchrun
from tests.distributed.conftest import same_training

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
WORKER = Path(__file__).with_name("albert_train_worker.py")
STEPS = 6


def train(corpus: Path, tag: str, nproc: int, *args) -> dict:
    torchrun(WORKER, nproc, corpus / "data", corpus, "--tag", tag, "--steps", STEPS, *args)
    return json.loads((corpus / f"{tag}.json").read_text())


def saved_weights(corpus: Path, tag: str) -> dict[str, torch.Tensor]:
    import transformers

    directory = corpus / f"{tag}-saved"
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["AlbertForMaskedLM"]
    return transformers.AlbertForMaskedLM.from_pretrained(directory).state_dict()


@pytest.fixture(scope="module")
def one_process(corpus):
    """The reference run of each config: one process, the group's layers share one parameter."""
    runs = {}

    def run(config: str) -> dict:
        if config not in runs:
            runs[config] = train(corpus, f"{config}-1", 1, "--config", config)
        return runs[config]

    return run


@pytest.mark.parametrize("config,tag,nproc,args", [
    ("albert", "pp2-recompute", 2, ["--pp", 2, "--recompute", "full"]),
    ("albert", "dp2xpp2-distopt", 4, ["--pp", 2, "--distributed-optimizer"]),
    ("albert_groups", "pp2-vpp2", 2, ["--pp", 2, "--vpp", 2]),
])
def test_shared_layers_train_as_on_one_process(corpus, one_process, config, tag, nproc, args):
    reference = one_process(config)
    assert reference["copies"] == 0  # one chunk: each group's layers hold one parameter
    result = train(corpus, f"{config}-{tag}", nproc, "--config", config, *args)
    # the layout does split a group over chunks (albert: stages 0 and 1; albert_groups: group 0's two
    # applications are virtual chunks on different stages), and every copy ends bit-identical
    assert result["copies"] > 0
    assert result["identical"]
    same_training(reference, result, f"{config} {tag}", steps=STEPS)
    # each shared weight written once, loadable by transformers, equal to the one-process model's
    ref, ours = saved_weights(corpus, f"{config}-1"), saved_weights(corpus, f"{config}-{tag}")
    assert ref.keys() == ours.keys()
    for k in ref:
        assert (ref[k] - ours[k]).abs().max() <= 1e-5, k


def test_checkpoint_of_shared_layers_resumes_under_another_layout(corpus, one_process):
    """Saved at PP=2 with virtual chunks (group 0's two applications on different stages), resumed in one
    process: the steps after the checkpoint are those of the uninterrupted one-process run."""
    reference = one_process("albert_groups")
    train(corpus, "albert_groups-cut", 2, "--config", "albert_groups", "--pp", 2, "--vpp", 2, "--stop-at", 4)
    resumed = train(corpus, "albert_groups-resumed", 1, "--config", "albert_groups", "--run-dir", "albert_groups-cut",
                    "--resume")
    assert len(resumed["loss"]) == STEPS - 4
    for step, (x, y) in enumerate(zip(reference["loss"][4:], resumed["loss"]), start=5):
        assert abs(x - y) <= 1e-5, f"step {step}: resumed loss {y} vs {x}"
