"""The ERNIE 4.5 mixture-of-experts decoder against transformers' Ernie4_5_MoeForCausalLM in one process: logits,
loss and gradients on a right-padded batch (also with transformers' router outputs and load-balancing loss),
greedy generation, the HF -> zhnlp -> HF round trip, that the
correction bias really changes the choice of experts (and only the choice), and the layout errors."""

import json

import pytest
import torch

import zhnlp
from tests.tiny_decoder import MOE_CONFIGS, hf_moe_grads, hf_moe_model, inputs
from zhnlp.auto import AutoModelForCausalLM
from zhnlp.conversion import engine
from zhnlp.errors import LayoutError


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


def _pair(tmp_path, name, seed=0, **extra):
    hf = hf_moe_model(name, seed=seed, **extra)
    hf.save_pretrained(tmp_path / "hf")
    return hf, AutoModelForCausalLM.from_pretrained(tmp_path / "hf")


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_logits_loss_generation_match_transformers(tmp_path, name):
    hf, model = _pair(tmp_path, name)
    assert model.config.model_type == "ernie4_5_moe"
    assert model.config.moe_layers == ([1, 2, 3] if name == "moe_shared" else [1, 3])
    batch = inputs()
    with torch.no_grad():
        ref, out = hf(**batch), model(**batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out.logits[real], ref.logits[real], rtol=0, atol=2e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-5)
    prompt = batch["input_ids"][:, :5]
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(prompt, max_new_tokens=8, eos_token_id=[]), expected)


@pytest.mark.parametrize("routed", [False, True], ids=["lm-loss", "with-aux-loss"])
@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_gradients_match_transformers(tmp_path, name, routed):
    """With ``output_router_logits=True`` the loss includes transformers' load-balancing loss (weighted 0.5 here,
    so that its gradients through the router count)."""
    hf, model = _pair(tmp_path, name, **({"router_aux_loss_coef": 0.5} if routed else {}))
    hf.train()
    model.train()
    batch = inputs(seed=1)
    hf(**batch, output_router_logits=routed).loss.backward()
    model(**batch, output_router_logits=routed).loss.backward()
    ref = hf_moe_grads(hf)
    table = model.family.bridge.table(model.config)
    names = engine.global_param_names(model.chunks[0])
    checked = set()
    for local, p in model.chunks[0].named_parameters():
        if not p.requires_grad:  # the correction bias is not trained (transformers: requires_grad=False)
            assert local.endswith("e_score_correction_bias") and p.grad is None
            continue
        mapping, layer = table.find(names[local])
        for key, grad in mapping.to_hf(p.grad, layer).items():
            torch.testing.assert_close(grad, ref[key], rtol=1e-4, atol=1e-6, msg=key)
            checked.add(key)
    assert checked == set(ref) - ({"lm_head.weight"} if hf.config.tie_word_embeddings else set())


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_router_outputs_match_transformers(tmp_path, name):
    hf, model = _pair(tmp_path, name)
    batch = inputs()
    with torch.no_grad():
        ref, out = hf(**batch, output_router_logits=True), model(**batch, output_router_logits=True)
        plain = model(**batch)
    assert list(out.keys()) == ["loss", "aux_loss", "logits", "router_logits"]
    assert len(out.router_logits) == len(ref.router_logits) == len(model.config.moe_layers)
    rows = batch["attention_mask"].bool().reshape(-1)  # padding rows carry no meaning on either side
    for ours, theirs in zip(out.router_logits, ref.router_logits):
        assert ours.shape == theirs.shape == (rows.numel(), model.config.moe_num_experts)
        torch.testing.assert_close(ours[rows], theirs[rows], rtol=0, atol=2e-5)
    torch.testing.assert_close(out.aux_loss, ref.aux_loss, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-5)
    assert float(out.loss - plain.loss) == pytest.approx(model.config.router_aux_loss_coef * float(out.aux_loss),
                                                         abs=1e-6)
    assert "router_logits" not in plain and "aux_loss" not in plain  # off unless asked (config default: off)
    assert out.to_tuple()[1] is out.aux_loss  # transformers' order: loss, aux_loss, logits, ..., router_logits


def test_router_outputs_follow_the_config_and_need_experts(tmp_path):
    hf, model = _pair(tmp_path, "moe_shared", output_router_logits=True)
    batch = inputs()
    with torch.no_grad():
        assert "router_logits" in model(**batch) and "router_logits" not in model(**batch, output_router_logits=False)
    from tests.tiny_decoder import hf_model
    from zhnlp.models.common.loading import UnsupportedOptionError

    hf_model("tied").save_pretrained(tmp_path / "dense")
    dense = AutoModelForCausalLM.from_pretrained(tmp_path / "dense")
    with pytest.raises(UnsupportedOptionError, match="output_router_logits=True needs a mixture-of-experts model"):
        dense(**batch, output_router_logits=True)


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_round_trip_is_bit_exact(tmp_path, name):
    hf, model = _pair(tmp_path, name, seed=1)
    model.save_pretrained(tmp_path / "zh")
    back = type(hf).from_pretrained(tmp_path / "zh").eval()
    a, b = hf.state_dict(), back.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    saved = json.loads((tmp_path / "zh" / "config.json").read_text())
    assert saved["architectures"] == ["Ernie4_5_MoeForCausalLM"] and saved["model_type"] == "ernie4_5_moe"
    for key in ("moe_num_experts", "moe_k", "moe_intermediate_size", "moe_num_shared_experts", "moe_layer_interval",
                "moe_layer_start_index", "use_bias", "tie_word_embeddings"):
        assert saved[key] == getattr(hf.config, key), key


def test_correction_bias_changes_the_choice_not_the_weights(tmp_path):
    """With the correction bias zeroed the outputs change (it decides which experts run); with a bias that is
    the same for every expert nothing changes (it never enters the weights, which are renormalised)."""
    hf, model = _pair(tmp_path, "moe_shared")
    batch = inputs()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        base = model(**batch).logits
        routers = [m for m in model.chunks[0].modules() if hasattr(m, "e_score_correction_bias")]
        assert len(routers) == 3
        saved = [r.e_score_correction_bias.clone() for r in routers]
        for r in routers:
            r.e_score_correction_bias.zero_()
        assert (model(**batch).logits[real] - base[real]).abs().max() > 1e-4
        for r, s in zip(routers, saved):
            r.e_score_correction_bias.copy_(s + 0.5)
        torch.testing.assert_close(model(**batch).logits[real], base[real], rtol=0, atol=1e-6)


def test_moe_layout_errors_name_the_sizes(tmp_path):
    hf_moe_model("moe_shared").save_pretrained(tmp_path / "hf")
    arch = zhnlp.AutoConfig.from_pretrained(tmp_path / "hf")
    with pytest.raises(LayoutError, match=r"moe_num_experts=4 is not divisible by ep=3"):
        arch.check_experts(3, 1, 1)
    with pytest.raises(LayoutError, match=r"moe_intermediate_size=12 is not divisible by the expert tensor-parallel "
                                          r"size etp=5"):
        arch.check_experts(1, 5, 1)


def test_moe_metrics_count_the_routed_tokens_and_the_aux_loss(tmp_path):
    """Tokens per expert over the steps since the last call (each token goes to moe_k experts), the auxiliary
    load-balancing loss megatron computed (1.0 = perfectly even), and a reset after each call."""
    from zhnlp.models.common.pretrained import PretrainedModel
    from zhnlp.models.ernie4_5 import FAMILY, Ernie4_5Config

    hf_moe_model("moe_shared").save_pretrained(tmp_path / "hf")
    arch = Ernie4_5Config.from_json_file(tmp_path / "hf" / "config.json")
    model = PretrainedModel.from_checkpoint(FAMILY, arch, "causal_lm", tmp_path / "hf", moe_aux_loss_coeff=0.01)
    model.train()
    batch = inputs()
    routers = [m for m in model.chunks[0].modules() if hasattr(m, "e_score_correction_bias")]
    for _ in range(2):
        model(**batch).loss.backward()
    counts = [r.tokens_per_expert.clone() for r in routers]
    assert all(int(c.sum()) == 2 * 30 * 2 for c in counts)  # 2 steps x 30 tokens (padding routed too) x top-2
    report = model.moe_metrics()
    assert report["moe_tokens_per_expert_min"] == [int(c.min()) for c in counts]
    assert report["moe_tokens_per_expert_max"] == [int(c.max()) for c in counts]
    assert report["moe_max_over_mean"] == pytest.approx(max(float(c.max() / c.mean()) for c in counts))
    assert 1.0 <= report["moe_aux_loss"] < 4.0  # E * sum(f_i * p_i): 1 when even, at most E
    after = model.moe_metrics()
    assert after["moe_tokens_per_expert_max"] == [0, 0, 0]
    model.eval()
    with torch.no_grad():
        model(**batch)
    assert model.moe_metrics()["moe_tokens_per_expert_max"] == [0, 0, 0]  # evaluation is not counted
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf", moe_k=3).config.moe_k == 3  # MoE overrides
