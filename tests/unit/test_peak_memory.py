"""peak_tensor_bytes: the allocator-level peak measured by the trainer (zhnlp.training.peak_memory)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from zhnlp.training.peak_memory import PeakTensorMemory, peak_of_allocations, peak_of_events


class Event:
    def __init__(self, start, nbytes, name="[memory]", device=torch.autograd.DeviceType.CPU):
        self._start, self._nbytes, self._name, self._device = start, nbytes, name, device

    def start_ns(self):
        return self._start

    def nbytes(self):
        return self._nbytes

    def name(self):
        return self._name

    def device_type(self):
        return self._device


def test_peak_is_the_largest_running_sum_in_time_order():
    events = [Event(30, -100), Event(10, 100), Event(20, 50), Event(40, 70), Event(25, 0, name="aten::add"),
              Event(35, 10**9, device=torch.autograd.DeviceType.CUDA)]
    assert peak_of_events(events) == 150  # 100, 150, 50, 120: the op and the GPU event do not count
    assert peak_of_events([]) == 0


def test_blocks_are_tracked_by_address_so_unrecorded_frees_do_not_accumulate():
    """gloo's worker threads free tensors without the profiler seeing it: a block whose address is handed out
    again was freed. Frees of blocks older than the profiler change nothing."""
    events = [(1, 0xA, 100), (2, 0xB, 50), (3, 0xA, 100),  # A again without a free: the first A was freed
              (4, 0xC, -70),  # a block from before the profiler
              (5, 0xB, -50), (6, 0xD, 30), (7, 0xA, -100), (8, 0xE, 10)]
    # running: 100, 150, 150 (not 250), 150, 100, 130, 30, 40
    assert peak_of_allocations(events) == 150
    assert peak_of_allocations([]) == 0
    # the same events summed blindly: 100, 150, 250 -> the artifact this guards against
    assert peak_of_events([Event(t, n) for t, _, n in events]) == 250


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (profiler memory events)")
def test_cpu_peak_counts_live_tensors_only():
    meter = PeakTensorMemory(window=1)
    meter.start()
    a = torch.empty(2_000_000)  # 8 MB
    b = torch.empty(1_000_000)  # 4 MB: 12 MB live together
    del a, b
    c = torch.empty(500_000)  # 2 MB
    meter.close()
    del c
    assert 12_000_000 <= meter.peak < 12_000_000 + 65_536


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (profiler memory events)")
def test_a_profiler_already_running_is_left_alone():
    first, second = PeakTensorMemory(window=1), PeakTensorMemory(window=1)
    first.start()
    second.start()  # torch allows one profiler per process: the second measures nothing
    a = torch.empty(1_000_000)
    assert second.profiler is None and second.after_step(1) is None
    assert first.after_step(1) >= 4_000_000
    del a


def run_pretrain(tmp_path, *flags):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "zhnlp", "pretrain", "--recipe", "ernie-debug", "--output",
                           str(tmp_path / "run"), "--steps", "4", "--log-interval", "1", *flags],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # kineto's start/stop lines and torch's warning about blocks older than the profiler are silenced
    assert "profiler_st" not in proc.stdout + proc.stderr and "unknown size" not in proc.stderr
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (profiler memory events)")
def test_trainer_reports_the_peak_from_the_end_of_its_window(tmp_path):
    import zhnlp
    from zhnlp.training.config import recipe

    records = run_pretrain(tmp_path, "--memory-window", "2")
    assert "peak_tensor_bytes" not in records[0]
    peaks = {r["peak_tensor_bytes"] for r in records[1:]}
    assert len(peaks) == 1
    peak = peaks.pop()
    model = recipe("ernie-debug").model
    params = sum(p.numel() for p in zhnlp.AutoModelForMaskedLM.from_config(model).parameters())
    words = model["vocab_size"] * model["hidden_size"]
    # fp32 weights, the fp32 gradient buffer and Adam's two moments stay allocated; the backward also holds the
    # word embeddings' gradient beside the buffer it is added into
    assert peak >= 16 * params + 4 * words
    assert peak <= 2 * (16 * params + 4 * words)  # measured 42.7 MB of 32.1 MB here
    assert all("peak_tensor_bytes" not in r for r in run_pretrain(tmp_path / "off", "--memory-window", "0"))
