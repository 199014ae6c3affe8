"""``--overlap-param-gather``: the distributed optimizer's all-gather of the updated parameters, left by the step to
the next forward's pre-hooks (bucket by bucket), gives the same training as the gather right after the step, at
DP=2 and at PP=2 x VPP=2 x DP=2 (megatron's interleaved schedule starting each chunk's gathers); a checkpoint saved
with it holds the gathered (updated) weights and resumes exactly."""

from pathlib import Path

import pytest
import torch

from tests.distributed.conftest import losses, pretrain, same_training, train_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

GATHER = ["--distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--bucket-size", "50000"]


def test_losses_and_gradient_norms_are_those_without_overlap(corpus):
    plain = train_run(corpus, "dp2-distopt-plain", 2, "--distributed-optimizer")
    same_training(plain, train_run(corpus, "dp2-param-gather", 2, *GATHER), "dp2 --overlap-param-gather")
    same_training(plain, train_run(corpus, "pp2-vpp2-dp2-param-gather", 4, "--pp", "2", "--vpp", "2", *GATHER),
                  "pp2 x vpp2 x dp2 --overlap-param-gather")


def _weights(checkpoint: Path) -> dict:
    """The model weights of a checkpoint (megatron's torch_dist format is torch.distributed.checkpoint's)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = checkpoint.parent / f"{checkpoint.name}.pt"
    dcp_to_torch_save(str(checkpoint / "model"), str(out))
    state = torch.load(out, weights_only=False)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and not k.startswith("optimizer")}


def test_checkpoint_holds_the_gathered_weights_and_resumes_exactly(corpus, tmp_path):
    full = pretrain(corpus / "data", tmp_path / "full", 2, "--distributed-optimizer", "--save-interval", "3")
    pretrain(corpus / "data", tmp_path / "cut", 2, *GATHER, "--save-interval", "3", "--stop-at", "3")
    expected = _weights(tmp_path / "full" / "checkpoints" / "step_0000003")
    saved = _weights(tmp_path / "cut" / "checkpoints" / "step_0000003")
    assert expected and saved.keys() == expected.keys()
    later = _weights(tmp_path / "full" / "checkpoints" / "step_0000006")
    # the weights move every step: stale halves (the step before's values) would be seen
    assert all(not torch.equal(expected[k], later[k]) for k in expected if k.endswith("weight"))
    for key in expected:
        assert torch.allclose(saved[key], expected[key], atol=1e-6, rtol=0), key
    resumed = losses(pretrain(corpus / "data", tmp_path / "cut", 2, *GATHER, "--resume"))
    for step in (4, 5, 6):
        assert abs(resumed[step] - losses(full)[step]) <= 1e-5, (step, resumed[step], losses(full)[step])

