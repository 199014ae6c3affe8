"""bf16 and fp16 training: the loss falls, and fp16 skips overflowing steps while its dynamic
loss scale comes down."""


import pytest

from tests.distributed.conftest import pretrain

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_bf16_trains(corpus, tmp_path):
    m = pretrain(corpus / "data", tmp_path / "bf16", 1, "--precision", "bf16", "--steps", "8")
    assert len(m) == 8 and m[-1]["loss"] < m[0]["loss"] - 0.1
    assert all(x["skipped"] == 0 for x in m)


def test_fp16_skips_overflowing_steps_and_trains(corpus, tmp_path):
    # a loss scale of 2**24 overflows fp16 gradients: those steps are skipped and the scale halves
    m = pretrain(corpus / "data", tmp_path / "fp16", 2, "--precision", "fp16", "--tp", "2", "--steps", "30",
                 "--initial-loss-scale", str(2.0**24))
    skipped = [x["step"] for x in m if x["skipped"]]
    assert skipped and skipped[0] == 1, skipped
    scales = [x["loss_scale"] for x in m]
    assert scales[-1] < scales[0]
    trained = [x["loss"] for x in m if not x["skipped"]]
    assert len(trained) >= 5 and trained[-1] < trained[0]
