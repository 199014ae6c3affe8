"""The planner's activation and transient memory (zhnlp.planning.activations), part by part, against figures
worked out by hand. The whole model against measured peaks: tests/distributed/test_planner_peak.py."""

import pytest

from zhnlp.models.common.cross_entropy import BLOCK_ELEMENTS
from zhnlp.planning import Layout, activation_memory, peak_memory
from zhnlp.planning.activations import _in_flight
from zhnlp.training.config import recipe

DECODER = recipe("ernie4.5-debug").architecture()  # h 64, f 128, 4 heads of 16, 2 KV heads, 4 layers
ENCODER = recipe("ernie-debug").architecture()  # h 64, f 128, 4 heads, 4 layers
BATCH = {"micro_batch": 4, "seq_length": 128, "global_batch": 16}


def test_micro_batches_in_flight_follow_megatrons_schedules():
    # 1F1B: stage i runs pp - i forwards before its first backward, never more than there are micro-batches
    assert [_in_flight(Layout(world=4, pp=4), s, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [_in_flight(Layout(world=4, pp=4), s, 2) for s in range(4)] == [2, 2, 2, 1]
    # interleaved (chunks): (pp - i - 1) * 2 + (vpp - 1) * pp warm-up forwards, plus the steady-state one
    assert [_in_flight(Layout(world=2, pp=2, vpp=2), s, 8) for s in range(2)] == [5, 3]
    assert _in_flight(Layout(world=2, pp=2, vpp=2), 0, 2) == 4  # all the chunks of two micro-batches
    assert _in_flight(Layout(), 0, 8) == 1  # without a pipeline, one micro-batch at a time


def test_decoder_logits_and_their_gradient_are_the_head():
    tokens, v = 4 * 128, DECODER.padded_vocab_size
    fp32 = activation_memory(DECODER, Layout(), **BATCH)[0]
    assert fp32["head"] == 2 * tokens * v * 4  # zhnlp's blockwise cross-entropy writes into one gradient
    bf16 = activation_memory(DECODER, Layout(precision="bf16"), **BATCH)[0]
    block = max(1, BLOCK_ELEMENTS // v) * v
    assert bf16["head"] == 2 * tokens * v * 2 + 3 * block * 4
    # megatron's vocab-parallel kernel: the shard's logits, its fp32 softmax and gradient
    tp2 = activation_memory(DECODER, Layout(world=2, tp=2, sequence_parallel=True), **BATCH)[0]
    assert tp2["head"] == tokens * (v // 2) * (4 + 4 + 4)


def test_masked_lm_head_predicts_the_masked_positions_or_all_under_sequence_parallelism():
    v = ENCODER.padded_vocab_size
    given = activation_memory(ENCODER, Layout(), predicted_tokens=100, **BATCH)[0]["head"]
    assert given == 100 * v * 12 + 100 * (3 * 64 * 4 + 2 * 4)
    default = activation_memory(ENCODER, Layout(), **BATCH)[0]["head"]  # mask_prob 0.15 of full sequences
    assert default == 4 * round(0.15 * 128) * (v * 12 + 3 * 64 * 4 + 2 * 4)
    sp = activation_memory(ENCODER, Layout(world=2, tp=2, sequence_parallel=True), predicted_tokens=100, **BATCH)
    assert sp[0]["head"] == 4 * 128 * (v // 2 * 12 + (3 * 64 * 4 + 2 * 4))


def test_encoder_layer_activations_per_token():
    h, f, a, tokens, layers = 64, 128, 4, 4 * 128, 4
    per_token = 4 * h * 4 + 4 * 4 + (4 * h + 2 * f) * 4 + a * 4  # see the module's list
    acts = activation_memory(ENCODER, Layout(), **BATCH)[0]["activations"]
    assert acts == layers * per_token * tokens + tokens * (2 * h * 4 + 2 * 4)  # + the embeddings' LayerNorm


def test_sequence_parallelism_splits_what_tensor_parallelism_alone_replicates():
    one = activation_memory(DECODER, Layout(), **BATCH)[0]["activations"]
    tp = activation_memory(DECODER, Layout(world=2, tp=2), **BATCH)[0]["activations"]
    sp = activation_memory(DECODER, Layout(world=2, tp=2, sequence_parallel=True), **BATCH)[0]["activations"]
    assert sp < tp < one
    assert sp == pytest.approx(one / 2, rel=0.1)  # all but the small rotary tables are split


def test_full_recompute_keeps_layer_inputs_and_one_layer_after_the_head():
    full = activation_memory(DECODER, Layout(recompute="full"), **BATCH)[0]
    none = activation_memory(DECODER, Layout(), **BATCH)[0]
    tokens, h = 4 * 128, 64
    assert full["activations"] == 4 * tokens * h * 4 + tokens * (3 * h * 4 + 4)  # inputs + the final norm
    assert full["head"] == none["head"]  # the recomputed layer (smaller) lives after the head is gone
    assert full["activations"] < none["activations"] / 4


def test_the_peak_takes_the_largest_moment():
    # a short sequence on the encoder: the tied embedding's gradient (3 x V x h in fp32) outweighs activations
    small = peak_memory(ENCODER, Layout(), micro_batch=2, seq_length=64, global_batch=8)[0]
    assert small["phase"] == "embedding_grad"
    assert small["transient"] == 3 * ENCODER.padded_vocab_size * 64 * 4
    long = peak_memory(DECODER, Layout(), micro_batch=8, seq_length=256, global_batch=16)[0]
    assert long["phase"] == "backward" and long["total"] == (
        long["weights"] + long["gradients"] + long["optimizer_states"] + long["activations"] + long["head"])


def test_pipeline_first_stage_holds_more_micro_batches():
    stages = activation_memory(DECODER, Layout(world=2, pp=2), micro_batch=4, seq_length=128, global_batch=16)
    assert stages[0]["in_flight"] == 2 and stages[1]["in_flight"] == 1
    assert stages[0]["head"] == 0 < stages[1]["head"]


def test_a_batch_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="not a multiple"):
        activation_memory(DECODER, Layout(world=2), micro_batch=4, seq_length=128, global_batch=12)


def test_fsdp_units_split_the_stage_into_the_root_and_its_layers():
    from zhnlp.planning.activations import _fsdp_units
    from zhnlp.planning.params import stage_params

    for arch in (ENCODER, DECODER, recipe("ernie4.5-moe-debug").architecture()):
        layout = Layout(world=2, fsdp=True)
        root, layer = _fsdp_units(arch, layout, 0, list(range(arch.num_hidden_layers)))
        total = sum(stage_params(arch, Layout(world=2), 0).values())
        assert 0 < layer < root < total  # the debug recipes' vocabulary makes the root the largest unit
        assert root >= arch.padded_vocab_size * arch.hidden_size
    fsdp = peak_memory(DECODER, Layout(world=2, fsdp=True, precision="bf16"), **BATCH)[0]
    ddp = peak_memory(DECODER, Layout(world=2, precision="bf16"), **BATCH)[0]
    assert fsdp["head"] > ddp["head"]  # the gathered units ride on the head's backward
