"""The trainer on megatron-core: from the same initial weights and data, 10 steps of ernie-debug
give the same losses (fp32, within 1e-5) and gradient norms (within 1e-6) on one process and under DP, TP,
TP+SP, PP, PP+VPP, TP x PP, with recompute, with the distributed optimizer and with the gradient reduction
overlapped with the backward."""

from pathlib import Path

import pytest

from tests.distributed.conftest import same_training, train_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
def run(corpus: Path, tag: str, nproc: int, *args) -> dict:
    return train_run(corpus, tag, nproc, *args)


@pytest.fixture(scope="module")
def reference(corpus):
    return run(corpus, "single", 1)


close = same_training


def test_single_process_learns(reference):
    assert reference["loss"][-1] < reference["loss"][0]


@pytest.mark.parametrize("name,nproc,args", [
    ("dp2", 2, []),
    ("tp2", 2, ["--tp", "2"]),
    ("tp2-sp", 2, ["--tp", "2", "--sp"]),
    ("pp2", 2, ["--pp", "2"]),
    ("pp2-vpp2", 2, ["--pp", "2", "--vpp", "2"]),
    ("dp2-distopt", 2, ["--distributed-optimizer"]),
    # the gradient reduction started bucket by bucket during the backward (several buckets of 50k parameters)
    ("dp2-overlap", 2, ["--overlap-grad-reduce", "--bucket-size", "50000"]),
    ("dp2-distopt-overlap", 2, ["--distributed-optimizer", "--overlap-grad-reduce", "--bucket-size", "50000"]),
    ("tp2-recompute-full", 2, ["--tp", "2", "--recompute", "full"]),
    ("dp2-recompute-selective", 2, ["--recompute", "selective"]),
    ("tp2xpp2", 4, ["--tp", "2", "--pp", "2"]),
])
def test_layout_gives_the_same_losses(corpus, reference, name, nproc, args):
    close(reference, run(corpus, name, nproc, *args), name)
