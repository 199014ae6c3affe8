"""The planner's time model: the FLOP count it shares with the trainer's MFU figure, communication volumes worked
out by hand, the pipeline bubble, which link a group uses, the hardware presets, and the calibration."""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, free_port
from zhnlp.errors import ZhnlpError
from zhnlp.planning import Layout, params_per_rank
from zhnlp.planning.timing import (Hardware, Measurement, calibrate, crosses_nodes, flop_counts, hardware, predict,
                                   spearman, step_amounts, step_time, train_flops)
from zhnlp.training.config import recipe
from zhnlp.training.trainer import Trainer

# micro-batch 4 x 128 positions x hidden 64 in fp32: one micro-batch's activations
B, S, H = 4, 128, 64
ACT = B * S * H * 4
FIXED = hardware("h100", compute_slots=None)


def amounts(name, layout, *, hw=FIXED, global_batch=16, micro_batch=B, seq_length=S, head="causal_lm"):
    return step_amounts(recipe(name).architecture(), layout, global_batch=global_batch, micro_batch=micro_batch,
                        seq_length=seq_length, hardware=hw, head=head)


# ------------------------------------------------------------------------------------------------ FLOPs


def _trainer(cfg, head):
    """What Trainer._flops reads, without building a model."""
    model = SimpleNamespace(head=head, config=cfg.architecture())
    return SimpleNamespace(model=model, cfg=cfg)


@pytest.mark.parametrize("sequence_parallel, head", [(False, "mlm"), (True, "mlm"), (False, "sequence_classification")])
def test_trainer_counts_encoder_flops_with_the_shared_formula(sequence_parallel, head):
    cfg = recipe("ernie-debug")
    cfg.parallel.sequence_parallel = sequence_parallel
    m, tokens, s = cfg.model, 1000, 64
    h, layers, f, v = m["hidden_size"], m["num_hidden_layers"], m["intermediate_size"], m["vocab_size"]
    out = h * v * (1.0 if sequence_parallel else cfg.data.mask_prob) if head == "mlm" else 0.0
    by_hand = 6 * (layers * (4 * h * h + 2 * h * f) + out) * tokens + 12 * layers * h * s * tokens  # the old formula
    assert Trainer._flops(_trainer(cfg, head), tokens, s) == by_hand
    assert train_flops(m, tokens, s, head=head, mask_prob=cfg.data.mask_prob,
                       sequence_parallel=sequence_parallel) == by_hand


def test_moe_flops_count_the_chosen_experts_the_shared_ones_and_gqa():
    cfg = recipe("ernie4.5-moe-debug")
    a = cfg.architecture()  # 4 layers, layer 0 dense; 4 experts of 32, top-2, 1 shared; 4 query / 2 kv heads of 16
    attention = 2 * 64 * 4 * 16 + 2 * 64 * 2 * 16
    dense, moe = attention + 3 * 64 * 128, attention + 3 * 64 * (2 * 32 + 32) + 64 * 4
    c = flop_counts(a, 10)
    assert c["weights"] == [dense, moe, moe, moe] and c["head"] == 64 * 21128
    assert c["attention"] == [6 * 4 * 16 * 10] * 4
    expected = 6 * (dense + 3 * moe + 64 * 21128) * 3 + 4 * 6 * 4 * 16 * 10 * 3
    assert train_flops(a, 3, 10) == expected == Trainer._flops(_trainer(cfg, "causal_lm"), 3, 10)
    assert step_time(a, Layout(1), global_batch=4, micro_batch=2, seq_length=10, hardware="h100")["flops"] == \
        train_flops(a, 40, 10)


def test_recompute_adds_forward_flops():
    a, lay = recipe("ernie4.5-debug").architecture(), Layout(1)
    c = flop_counts(a, S)
    base = amounts("ernie4.5-debug", lay)["compute"]["peak_seconds"]
    full = amounts("ernie4.5-debug", dataclasses.replace(lay, recompute="full"))["compute"]["peak_seconds"]
    sel = amounts("ernie4.5-debug", dataclasses.replace(lay, recompute="selective"))["compute"]["peak_seconds"]
    per_token = lambda extra: extra * 16 * S / FIXED.peak_flops_fp32  # noqa: E731
    assert full - base == pytest.approx(per_token(sum(2 * w for w in c["weights"]) + sum(c["attention"]) / 3))
    assert sel - base == pytest.approx(per_token(sum(c["attention"]) / 3))


# ------------------------------------------------------------------------------------------------ communication


def test_tp2_all_reduces_four_activations_per_layer_and_micro_batch():
    t = amounts("ernie4.5-debug", Layout(2, tp=2))["tp"]
    # 4 micro-batches x (4 layers x 4 all-reduces + the embedding's output + the output layer's input gradient,
    # and the loss's 3 all-reduces of one fp32 per token); a ring all-reduce over 2 ranks moves 2 x (1/2) x the
    # tensor through each rank, in 2 steps
    assert t == {"intra_bytes": 4 * (18 * ACT + 3 * 4 * B * S), "intra_messages": 4 * (18 + 3) * 2}
    sp = amounts("ernie4.5-debug", Layout(2, tp=2, sequence_parallel=True))["tp"]
    # per layer 6 all-gathers (2 forward, 2 backward, 2 again for the weight gradients) + 4 reduce-scatters, each
    # moving half the tensor in one step; the embedding: 1 + 1, the output layer: 2 all-gathers + 1 reduce-scatter
    assert sp == {"intra_bytes": 4 * ((4 * 10 + 5) * ACT / 2 + 3 * 4 * B * S), "intra_messages": 4 * (45 + 3 * 2)}


def test_dp_reduces_fp32_gradients_and_the_distributed_optimizer_gathers_parameters():
    dense = params_per_rank(recipe("ernie4.5-debug").architecture(), Layout(2))[0]["dense"]
    assert amounts("ernie4.5-debug", Layout(2))["dp"] == {"intra_bytes": 4 * dense, "intra_messages": 2}
    assert amounts("ernie4.5-debug", Layout(2, distributed_optimizer=True))["dp"] == \
        {"intra_bytes": 2 * dense + 2 * dense, "intra_messages": 2}
    bf16 = amounts("ernie4.5-debug", Layout(2, distributed_optimizer=True, precision="bf16"))["dp"]
    assert bf16["intra_bytes"] == 2 * dense + dense  # fp32 gradients, bf16 parameters


def test_pp_sends_activations_and_gradients_per_micro_batch_and_chunk():
    assert amounts("ernie4.5-debug", Layout(2, pp=2))["pp"] == {"intra_bytes": 2 * 4 * ACT, "intra_messages": 8}
    assert amounts("ernie4.5-debug", Layout(2, pp=2, vpp=2))["pp"] == {"intra_bytes": 16 * ACT, "intra_messages": 16}


def test_ep_all_to_alls_the_routed_tokens():
    e = amounts("ernie4.5-moe-debug", Layout(2, ep=2))["ep"]
    # 3 MoE layers x 4 all-to-alls x 2 micro-batches (dp 2) of 4 x 128 tokens x top-2 x 64 x 4 bytes, half leaving
    assert e == {"intra_bytes": 3 * 4 * 2 * B * S * 2 * H * 4 / 2, "intra_messages": 3 * 4 * 2}


def test_bubble_is_the_pipeline_fraction_of_compute():
    from zhnlp.models.ernie4_5 import Ernie4_5Config
    from zhnlp.training.config import decoder_arch

    m = 16 // B
    balanced = Ernie4_5Config.from_dict(decoder_arch(8, 64, 4, 2, 128, head_dim=16, vocab=1))  # no head to speak of
    for vpp in (None, 2):
        t = step_time(balanced, Layout(4, pp=4, vpp=vpp), global_batch=16, micro_batch=B, seq_length=S,
                      hardware=FIXED)
        busy = t["compute"] + t["overhead"]
        assert t["bubble"] == pytest.approx((4 - 1) / ((vpp or 1) * m) * busy, rel=1e-3)
    # unbalanced stages (the debug recipe's last stage has the vocabulary projection): the others' share
    a = recipe("ernie4.5-debug").architecture()
    t = step_time(a, Layout(2, pp=2), global_batch=16, micro_batch=B, seq_length=S, hardware=FIXED)
    first = step_time(a, Layout(1), global_batch=16, micro_batch=B, seq_length=S, hardware=FIXED)
    head = 6 * flop_counts(a, S)["head"] * 16 * S / (FIXED.peak_flops_fp32 * FIXED.efficiency)
    assert t["bubble"] == pytest.approx((first["compute"] - head) / 2 / m + t["overhead"] / m)
    assert step_time(a, Layout(1), global_batch=16, micro_batch=B, seq_length=S, hardware=FIXED)["bubble"] == 0


def test_groups_use_the_inter_node_link_once_their_stride_leaves_the_node():
    assert not crosses_nodes(8, 1, 8) and crosses_nodes(2, 8, 8) and not crosses_nodes(2, 4, 8)
    a = recipe("ernie4.5-debug").architecture()
    kw = dict(global_batch=64, micro_batch=B, seq_length=S, hardware=FIXED)
    parts = step_amounts(a, Layout(16, tp=2, pp=2), **kw)  # tp 2 (stride 1), dp 4 (stride 2), pp 2 (stride 8)
    assert set(parts["tp"]) == {"intra_bytes", "intra_messages"}
    assert "intra_bytes" in parts["dp"] and "inter_bytes" in parts["pp"]
    parts = step_amounts(a, Layout(32, tp=2, pp=2), **kw)  # dp 8 at stride 2 spans two nodes
    assert set(parts["dp"]) == {"inter_bytes", "inter_messages"}
    assert step_time(a, Layout(32, tp=2, pp=2), **kw)["dp"] > step_time(a, Layout(16, tp=2, pp=2), **kw)["dp"]


# ------------------------------------------------------------------------------------------------ hardware


def test_presets_and_overrides():
    assert hardware("H800").intra_bandwidth < hardware("h100").intra_bandwidth
    assert hardware("a100-40").memory_bytes == 40 * 10 ** 9
    assert hardware("h100", inter_bandwidth=25e9).inter_bandwidth == 25e9
    assert hardware("h100").peak("bf16") > hardware("h100").peak("fp32")
    assert hardware("cpu").compute_slots == os.cpu_count()


def test_unknown_hardware_names_the_presets():
    with pytest.raises(ZhnlpError, match=r"unknown hardware 'b300'.*h100.*cpu"):
        hardware("b300")
    with pytest.raises(ZhnlpError, match="unknown Hardware field"):
        hardware("h100", nvlink=1)


# ------------------------------------------------------------------------------------------------ calibration


def test_calibration_recovers_the_constants_behind_synthetic_step_times():
    truth = Hardware("truth", peak_flops=1e12, peak_flops_fp32=5e11, memory_bytes=10 ** 10, memory_bandwidth=2e10,
                     intra_bandwidth=3e9, inter_bandwidth=4e8, intra_latency=2e-5, inter_latency=3e-4,
                     gpus_per_node=2, efficiency=0.6, layer_overhead=1e-3)
    start = dataclasses.replace(truth, efficiency=0.2, memory_bandwidth=1e9, intra_bandwidth=1e8,
                                inter_bandwidth=1e10, intra_latency=1e-6, inter_latency=1e-6, layer_overhead=1e-5)
    cases = [("ernie4.5-debug", Layout(1), 16, 4, 64), ("ernie4.5-debug", Layout(1), 64, 8, 128),
             ("ernie4.5-debug", Layout(2, tp=2), 16, 2, 128), ("ernie4.5-debug", Layout(2, tp=2), 16, 16, 32),
             ("ernie4.5-debug", Layout(4), 16, 4, 64), ("ernie4.5-debug", Layout(4, pp=4), 32, 1, 64),
             ("ernie4.5-debug", Layout(4, tp=2, pp=2, precision="bf16"), 16, 4, 128),
             ("ernie4.5-moe-debug", Layout(4, ep=4), 16, 2, 64), ("ernie4.5-moe-debug", Layout(1), 8, 8, 16),
             ("ernie4.5-debug", Layout(4, distributed_optimizer=True), 4, 1, 8)]
    ms = []
    for name, lay, gb, mb, s in cases:
        m = Measurement(recipe(name).architecture(), lay, 1.0, gb, mb, s)
        ms.append(dataclasses.replace(m, seconds=predict(m, truth)))
    fitted = calibrate(ms, start)
    for field in ("efficiency", "memory_bandwidth", "intra_bandwidth", "inter_bandwidth", "intra_latency",
                  "inter_latency", "layer_overhead"):
        assert getattr(fitted, field) == pytest.approx(getattr(truth, field), rel=1e-4), field


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / 95 ** 0.5)  # ties: mean ranks


# ------------------------------------------------------------------------------------------------ real step times

# Three layouts whose step times the cpu preset (calibrated on this machine with scripts/validate_timing.py)
# predicts at least 1.5x apart: their measured order must be the predicted one. (name, processes, flags)
RANKED = [("dec-1p-small", 1, ["--recipe", "ernie4.5-debug", "--seq-length", "64", "--micro-batch-size", "2",
                               "--global-batch-size", "4"]),
          ("dec-dp2", 2, ["--recipe", "ernie4.5-debug", "--seq-length", "128", "--micro-batch-size", "4",
                          "--global-batch-size", "16"]),
          ("moe-tp2-pp2-long", 4, ["--recipe", "ernie4.5-moe-debug", "--tp", "2", "--pp", "2", "--sequence-parallel",
                                   "--seq-length", "256", "--micro-batch-size", "4", "--global-batch-size", "32"])]


def _median_step(tmp_path, name, nproc, flags, tokens, steps=6):
    """Seconds per step of a real run: the median after two warm-up steps."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--output", str(tmp_path / name), "--steps",
           str(steps), "--warmup-steps", "0", "--memory-window", "0", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / name / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return statistics.median(tokens / json.loads(line)["tokens_per_s"] for line in lines[2:])


def _predicted(nproc, flags):
    from zhnlp.cli import build_parser
    from zhnlp.training.command import resolve

    cfg = resolve(build_parser("pretrain").parse_args(["pretrain", *flags]))
    d = cfg.data
    return step_time(cfg.architecture(), Layout.from_run(cfg, nproc), global_batch=d.global_batch_size,
                     micro_batch=d.micro_batch_size, seq_length=d.seq_length, hardware="cpu", head=cfg.head)["total"]


@pytest.mark.distributed
@pytest.mark.slow
def test_measured_step_times_rank_as_predicted(tmp_path):
    predicted = [_predicted(nproc, flags) for _, nproc, flags in RANKED]
    assert all(b > 1.5 * a for a, b in zip(predicted, predicted[1:])), predicted  # the test's premise
    tokens = [4 * 64, 16 * 128, 32 * 256]  # global batch x sequence length
    measured = [_median_step(tmp_path, name, nproc, flags, n) for (name, nproc, flags), n in zip(RANKED, tokens)]
    assert sorted(range(3), key=measured.__getitem__) == [0, 1, 2], (measured, predicted)
