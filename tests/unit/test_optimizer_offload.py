"""--optimizer-offload (megatron-core's hybrid device optimizer): refused without a GPU, accounted for by the
planner, and on a GPU the same losses as keeping the optimizer on the device."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from zhnlp.errors import LayoutError
from zhnlp.planning import Layout, static_memory
from zhnlp.training.config import override, recipe


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_refused_on_a_cpu_only_machine_with_one_line():
    cfg = override(recipe("ernie-debug"), distributed_optimizer=True)
    cfg.optimizer.optimizer_offload = 1.0
    with pytest.raises(LayoutError) as e:
        cfg.check(world_size=1)
    message = str(e.value)
    assert "without a GPU they are in host memory already, so drop it" in message and "\n" not in message


def test_the_planner_keeps_only_the_rest_of_the_optimizer_states_on_the_device():
    arch = recipe("ernie4.5-0.3b").architecture()
    full = static_memory(arch, Layout(world=8, precision="bf16", distributed_optimizer=True))[0]
    half = static_memory(arch, Layout(world=8, precision="bf16", distributed_optimizer=True,
                                      optimizer_offload=0.5))[0]
    everything = static_memory(arch, Layout(world=8, precision="bf16", distributed_optimizer=True,
                                            optimizer_offload=1.0))[0]
    assert half["optimizer"] == full["optimizer"] - int(full["optimizer"] * 0.5)
    assert everything["optimizer"] == 0 and everything["weights"] == full["weights"]
    cfg = override(recipe("ernie-debug"), distributed_optimizer=True)
    cfg.optimizer.optimizer_offload = 0.25
    assert Layout.from_run(cfg, 2).optimizer_offload == 0.25


def _losses(tmp_path, name, *flags):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "zhnlp", "pretrain", "--recipe", "ernie4.5-debug", "--output",
                           str(tmp_path / name), "--steps", "6", "--log-interval", "1", "--distributed-optimizer",
                           *flags], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / name / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["loss"] for line in lines]


@pytest.mark.gpu
@pytest.mark.parametrize("fraction", ["1.0", "0.5"])
def test_offloaded_optimizer_gives_the_same_losses_on_a_gpu(tmp_path, fraction):
    kept = _losses(tmp_path, "kept")
    offloaded = _losses(tmp_path, "offloaded", "--optimizer-offload", fraction)
    # the host's Adam and the device's Adam round differently in the last bits
    assert offloaded == pytest.approx(kept, abs=1e-4)
