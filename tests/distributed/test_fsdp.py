"""--fsdp (torch FSDP2 through megatron-core's TorchFullyShardedDataParallel): from the same initial weights
and data, 10 steps of ernie-debug (encoder) and ernie4.5-debug (decoder) give the losses (within 1e-5) and
gradient norms (1e-6) of one process (encoder) and of DP=2 with megatron's DDP (decoder), at DP=2 and at
TP=2 x FSDP=2 (encoder); a checkpoint saved under FSDP resumes exactly under FSDP and, being in the other
layouts' format, continues on one process without FSDP (model and optimizer state)."""

import shutil
from pathlib import Path

import pytest

from tests.distributed.conftest import losses, make_corpus, pretrain, same_training, train_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
DECODER = ["--recipe", "ernie4.5-debug"]


@pytest.fixture(scope="module")
def causal_corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("causal"), objective="causal-lm")


def test_encoder_losses_equal_one_process(corpus):
    single = train_run(corpus, "single", 1)  # DP=2 with DDP equals it too (test_training_layouts.py)
    same_training(single, train_run(corpus, "fsdp2", 2, "--fsdp"), "fsdp2")
    same_training(single, train_run(corpus, "tp2-fsdp2", 4, "--tp", "2", "--fsdp"), "tp2 x fsdp2")


def test_decoder_losses_equal_ddp(causal_corpus):
    ddp = train_run(causal_corpus, "dp2", 2, *DECODER)
    same_training(ddp, train_run(causal_corpus, "fsdp2", 2, *DECODER, "--fsdp"), "decoder fsdp2")


def test_fsdp_checkpoint_resumes_exactly_and_in_other_layouts(causal_corpus, tmp_path):
    """The decoder's SwiGLU weight is saved by a megatron factory (two halves): the FSDP rows are cut per half."""
    data = causal_corpus / "data"
    full = losses(pretrain(data, tmp_path / "full", 1, *DECODER))
    pretrain(data, tmp_path / "cut", 2, *DECODER, "--fsdp", "--save-interval", "3", "--stop-at", "3")
    shutil.copytree(tmp_path / "cut", tmp_path / "ddp")
    resumed = losses(pretrain(data, tmp_path / "cut", 2, *DECODER, "--fsdp", "--resume"))
    elsewhere = losses(pretrain(data, tmp_path / "ddp", 1, *DECODER, "--resume"))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step  # same layout: exact
        assert elsewhere[step] == pytest.approx(full[step], abs=1e-5), step  # one process, plain optimizer
