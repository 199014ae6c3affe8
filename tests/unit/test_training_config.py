"""Run configuration: recipes, overrides, and layouts that fail before any work."""

import pytest
import torch

from zhnlp.errors import LayoutError
from zhnlp.training import RECIPES, override, recipe


def test_recipes_build_and_fit_one_process():
    for name in RECIPES:
        cfg = recipe(name)
        assert cfg.recipe == name
        cfg.check(world_size=1)


def test_overrides_reach_nested_fields():
    cfg = override(recipe("ernie-debug"), tp=2, lr=3e-4, steps=7, micro_batch_size=4, prefix="x", vpp=None)
    assert (cfg.parallel.tp, cfg.optimizer.lr, cfg.steps, cfg.data.micro_batch_size, cfg.data.prefix) == \
        (2, 3e-4, 7, 4, "x")
    with pytest.raises(TypeError, match="no run setting named 'learning_rate'"):
        override(cfg, learning_rate=1.0)


def test_unknown_recipe():
    with pytest.raises(LayoutError, match="unknown recipe 'ernie-huge'"):
        recipe("ernie-huge")


@pytest.mark.parametrize("changes,world,message", [
    (dict(tp=3), 3, "num_attention_heads=4 is not divisible by tp=3"),
    (dict(pp=2, vpp=4), 2, r"num_hidden_layers=4 is not divisible by pp\*vpp=8"),
    (dict(global_batch_size=6), 2, "global batch 6 is not divisible by micro batch 2 x data-parallel size 2"),
    (dict(tp=2), 3, r"world size 3 is not divisible by tp\*pp = 2"),
    (dict(sequence_parallel=True), 1, "sequence parallelism needs tp >= 2"),
    (dict(precision="fp8"), 1, "precision 'fp8' is not one of fp32, bf16, fp16"),
    (dict(bucket_size=1000), 2, "bucket_size sets the buckets of overlap_grad_reduce"),
    (dict(overlap_grad_reduce=True, fsdp=True), 2, "drop --overlap-grad-reduce"),
    (dict(overlap_param_gather=True, overlap_grad_reduce=True), 2, "add --distributed-optimizer or drop "
                                                                   "--overlap-param-gather"),
    (dict(overlap_param_gather=True, distributed_optimizer=True), 2, "needs --overlap-grad-reduce"),
    (dict(overlap_param_gather=True, fsdp=True), 2, "--fsdp all-gathers each layer's parameters before its "
                                                    "forward already; drop --overlap-param-gather"),
    (dict(overlap_param_gather=True, overlap_grad_reduce=True, distributed_optimizer=True, compile=True), 2,
     "--compile with --overlap-param-gather"),
    (dict(async_save=True), 1, "without --save-interval there are none"),
])
def test_layouts_that_cannot_work_fail_first(changes, world, message):
    cfg = override(recipe("ernie-debug"), **changes)
    with pytest.raises(LayoutError, match=message):
        cfg.check(world_size=world)


def test_the_family_and_head_follow_the_model_type():
    from zhnlp.models import ernie, ernie4_5

    assert (recipe("ernie-debug").family, recipe("ernie-debug").head) == (ernie.FAMILY, "mlm")
    for name in ("ernie4.5-debug", "ernie4.5-tiny", "ernie4.5-0.3b"):
        assert (recipe(name).family, recipe(name).head) == (ernie4_5.FAMILY, "causal_lm"), name
    arch = recipe("ernie4.5-0.3b").architecture()
    assert (arch.hidden_size, arch.num_hidden_layers, arch.num_attention_heads, arch.num_key_value_heads,
            arch.head_dim, arch.intermediate_size, arch.vocab_size, arch.rope_theta, arch.tie_word_embeddings) == \
        (1024, 18, 16, 2, 128, 3072, 103424, 500000.0, True)
    cfg = recipe("ernie4.5-debug")
    cfg.model["model_type"] = "gpt2"
    with pytest.raises(LayoutError, match=r"recipe 'ernie4.5-debug': model: model_type 'gpt2' is not supported"):
        cfg.check(world_size=1)


@pytest.mark.parametrize("changes,world,message", [
    (dict(tp=4), 4, "num_key_value_heads=2 is not divisible by tp=4"),
    (dict(pp=3), 3, r"num_hidden_layers=4 is not divisible by pp\*vpp=3"),
    (dict(ep=2), 2, "ep=2 needs a mixture-of-experts model; 'ernie4_5' has no experts"),
    (dict(moe_aux_loss_coeff=0.01), 1, r"the moe settings \(moe_aux_loss_coeff, moe_expert_capacity_factor\) need "
                                       "a mixture-of-experts model"),
])
def test_decoder_layouts_that_cannot_work_fail_first(changes, world, message):
    cfg = override(recipe("ernie4.5-debug"), **changes)
    with pytest.raises(LayoutError, match=message):
        cfg.check(world_size=world)


def test_moe_with_tensor_parallelism_needs_sequence_parallelism():
    # megatron-core raises a ValueError deep inside the first training step otherwise
    with pytest.raises(LayoutError, match="a mixture-of-experts model with tp=2 needs --sequence-parallel"):
        override(recipe("ernie4.5-moe-debug"), tp=2, ep=2).check(world_size=4)
    override(recipe("ernie4.5-moe-debug"), tp=2, ep=2, sequence_parallel=True).check(world_size=4)


def test_causal_lm_settings_are_refused_for_masked_lm():
    with pytest.raises(LayoutError, match="reset_attention and eod_mask_loss are causal-LM settings"):
        override(recipe("ernie-debug"), reset_attention=True).check(world_size=1)


def test_decoder_flops_count_every_weight_a_token_passes_through():
    import transformers

    from tests.tiny_decoder import CONFIGS
    from zhnlp.models.ernie4_5 import Ernie4_5Config
    from zhnlp.training.trainer import decoder_flops

    hf = transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(**CONFIGS["untied_bias"]))
    weights = sum(m.weight.numel() for m in hf.modules() if isinstance(m, torch.nn.Linear))  # lm_head included
    arch = Ernie4_5Config.from_dict(hf.config.to_dict())
    layers, heads, hd = arch.num_hidden_layers, arch.num_attention_heads, arch.head_dim
    assert decoder_flops(arch, tokens=3, s=10) == 6 * weights * 3 + 6 * layers * heads * hd * 10 * 3
    big = recipe("ernie4.5-0.3b").architecture()  # ERNIE-4.5-0.3B: 0.36B weights, the embeddings counted once
    assert decoder_flops(big, tokens=1, s=0) == 6 * 360_710_144


@pytest.mark.parametrize("changes,message", [
    (dict(distributed_optimizer=True), "--fsdp already shards the optimizer states over the data-parallel ranks; "
                                       "drop --distributed-optimizer"),
    (dict(precision="fp16"), "--fsdp with fp16: .* use --precision bf16 or fp32"),
])
def test_fsdp_refuses_what_megatron_cannot_combine_with_it(changes, message):
    cfg = override(recipe("ernie-debug"), fsdp=True, **changes)
    with pytest.raises(LayoutError, match=message):
        cfg.check(world_size=2)
    override(recipe("ernie-debug"), fsdp=True, tp=2, pp=2).check(world_size=8)  # TP and PP compose with it


def test_fsdp_refuses_expert_parallelism_and_per_token_loss():
    cfg = override(recipe("ernie4.5-moe-debug"), fsdp=True, ep=2, per_token_loss=True)
    with pytest.raises(LayoutError, match=r"--fsdp with ep=2: .*; --fsdp with per_token_loss"):
        cfg.check(world_size=2)
