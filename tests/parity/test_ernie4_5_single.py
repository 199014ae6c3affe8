"""The dense ERNIE 4.5 decoder against transformers' Ernie4_5ForCausalLM in one process: logits and loss on a
right-padded batch, gradients, the HF -> zhnlp -> HF round trip, and the loading errors."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import zhnlp
from tests.tiny_decoder import BASE, CONFIGS, hf_model, inputs
from zhnlp.auto import AutoModelForCausalLM
from zhnlp.conversion import engine
from zhnlp.errors import CheckpointError


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


def _pair(tmp_path, name, seed=0):
    hf = hf_model(name, seed=seed)
    hf.save_pretrained(tmp_path / "hf")
    return hf, AutoModelForCausalLM.from_pretrained(tmp_path / "hf")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_loss_match_transformers(tmp_path, name):
    hf, model = _pair(tmp_path, name)
    batch = inputs()
    with torch.no_grad():
        ref, out = hf(**batch), model(**batch)
    real = batch["attention_mask"].bool()
    assert out.logits.shape == ref.logits.shape == (3, 10, BASE["vocab_size"])
    torch.testing.assert_close(out.logits[real], ref.logits[real], rtol=0, atol=2e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-5)
    # no mask and explicit position ids (shifted by 3) give transformers' logits too
    ids = batch["input_ids"]
    pos = torch.arange(3, 13).expand(3, 10)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, position_ids=pos).logits, hf(ids, position_ids=pos).logits,
                                   rtol=0, atol=2e-5)
    assert model(ids).loss is None


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradients_match_transformers(tmp_path, name):
    hf, model = _pair(tmp_path, name)
    model.train()
    batch = inputs(seed=1)
    hf(**batch).loss.backward()
    model(**batch).loss.backward()
    ref = {n: p.grad for n, p in hf.named_parameters()}
    table = model.family.bridge.table(model.config)
    names = engine.global_param_names(model.chunks[0])
    checked = set()
    for local, p in model.chunks[0].named_parameters():
        mapping, layer = table.find(names[local])
        for key, grad in mapping.to_hf(p.grad, layer).items():
            torch.testing.assert_close(grad, ref[key], rtol=1e-4, atol=1e-6, msg=key)
            checked.add(key)
    assert checked == {n for n in ref if not (n == "lm_head.weight" and hf.config.tie_word_embeddings)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_round_trip_is_bit_exact(tmp_path, name):
    hf, model = _pair(tmp_path, name, seed=1)
    model.save_pretrained(tmp_path / "zh")
    back = type(hf).from_pretrained(tmp_path / "zh").eval()
    a, b = hf.state_dict(), back.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    cfg = back.config
    assert (cfg.model_type, cfg.tie_word_embeddings, cfg.use_bias) == ("ernie4_5", CONFIGS[name]["tie_word_embeddings"],
                                                                       CONFIGS[name]["use_bias"])
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.rope_parameters["rope_theta"]) == (2, 8, 10000.0)
    assert json.loads((tmp_path / "zh" / "config.json").read_text())["architectures"] == ["Ernie4_5ForCausalLM"]


def _edit(tmp_path, name, change_weights=None, change_config=None):
    hf = hf_model(name)
    hf.save_pretrained(tmp_path / "hf")
    if change_weights:
        path = tmp_path / "hf" / "model.safetensors"
        tensors = load_file(path)
        change_weights(tensors)
        save_file(tensors, path, metadata={"format": "pt"})
    if change_config:
        path = tmp_path / "hf" / "config.json"
        cfg = json.loads(path.read_text())
        change_config(cfg)
        path.write_text(json.dumps(cfg))
    return tmp_path / "hf"


def test_missing_weight_is_named(tmp_path):
    d = _edit(tmp_path, "untied_bias", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing weights \[model.layers.1.mlp.up_proj.weight\]"):
        AutoModelForCausalLM.from_pretrained(d)


def test_unexpected_weight_is_named(tmp_path):
    d = _edit(tmp_path, "tied", lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected weights .*model.layers.0.extra.weight"):
        AutoModelForCausalLM.from_pretrained(d)


def test_shape_mismatch_names_the_parameter(tmp_path):
    d = _edit(tmp_path, "tied", change_config=lambda c: c.update(num_key_value_heads=4))
    with pytest.raises(CheckpointError, match=r"shape mismatch for encoder.layers.0.self_attention.linear_qkv.weight "
                                              r"\(model.layers.0.self_attn.k_proj.weight: expected \(32, 24\), "
                                              r"found \(16, 24\)\)"):
        AutoModelForCausalLM.from_pretrained(d)


def test_unsupported_rope_scaling_is_refused(tmp_path):
    d = _edit(tmp_path, "tied", change_config=lambda c: c.update(
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}))
    with pytest.raises(CheckpointError, match=r"config.json: rope_parameters has rope_type 'yarn'; zhnlp implements "
                                              r"only the default"):
        AutoModelForCausalLM.from_pretrained(d)


def test_fresh_weights_from_config_and_loaded_none(tmp_path):
    hf, model = _pair(tmp_path, "untied_bias")
    assert model.fresh_weights == []
    fresh = AutoModelForCausalLM.from_config(dict(CONFIGS["untied_bias"], model_type="ernie4_5"))
    assert "encoder.layers.2.mlp.linear_fc1.weight" in fresh.fresh_weights
    with torch.no_grad():
        out = fresh(**inputs())
    assert out.logits.shape == (3, 10, BASE["vocab_size"]) and torch.isfinite(out.loss)
    assert fresh.num_parameters() == sum(p.numel() for p in hf.parameters())


def test_hidden_states_match_transformers(tmp_path):
    """Embeddings' output, every layer's, the last one normed (as transformers returns them); logits unchanged."""
    hf, model = _pair(tmp_path, "untied_bias")
    batch = {k: v for k, v in inputs().items() if k != "labels"}
    with torch.no_grad():
        ref, out = hf(**batch, output_hidden_states=True), model(**batch, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a[real], b[real], rtol=0, atol=2e-5)
    torch.testing.assert_close(out.logits[real], ref.logits[real], rtol=0, atol=2e-5)
    with torch.no_grad():  # the final norm is back in place afterwards
        torch.testing.assert_close(model(**batch).logits[real], ref.logits[real], rtol=0, atol=2e-5)


def test_token_type_ids_are_refused(tmp_path):
    _, model = _pair(tmp_path, "tied")
    ids = inputs()["input_ids"]
    with pytest.raises(TypeError, match="ERNIE 4.5 has no token_type_ids"):
        model(ids, None, torch.zeros_like(ids))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_generation_is_token_identical(tmp_path, name):
    """Left-padded prompts, with and without an end-of-sequence token, as transformers' generate gives them
    (weights scaled up so that a random model does not just repeat one token)."""
    hf = hf_model(name, initializer_range=0.5)
    hf.save_pretrained(tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ids = inputs()["input_ids"][:, :6]
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    ids = ids.masked_fill(mask == 0, 0)
    ref = hf.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    assert torch.equal(out, ref)
    assert len(set(ref[0, 6:].tolist())) > 3  # a real continuation, not one repeated token
    eos = int(ref[0, 10])
    ref = hf.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=16, eos_token_id=eos, pad_token_id=0),
                       ref)
    # an unpadded prompt; top_k=1 sampling is greedy; a streamer sees the prompt, then each new token
    plain = inputs()["input_ids"][:2, :5]
    ref = hf.generate(plain, attention_mask=torch.ones_like(plain), max_new_tokens=8, do_sample=False,
                      eos_token_id=None, pad_token_id=0)
    seen = []

    class Streamer:
        def put(self, value):
            seen.append(value)

        def end(self):
            seen.append("end")

    assert torch.equal(model.generate(plain, max_new_tokens=8, eos_token_id=[], streamer=Streamer()), ref)
    assert torch.equal(seen[0], plain) and len(seen) == 10 and seen[-1] == "end"
    assert torch.equal(model.generate(plain, max_new_tokens=8, eos_token_id=[], do_sample=True, top_k=1), ref)
    ref = hf.generate(plain, attention_mask=torch.ones_like(plain), max_new_tokens=8, do_sample=False,
                      repetition_penalty=1.5, eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(plain, max_new_tokens=8, eos_token_id=[], repetition_penalty=1.5), ref)


def test_generate_is_for_decoders(tmp_path):
    from tests.tiny import hf_model as encoder_model

    encoder_model("bert", "mlm").save_pretrained(tmp_path / "bert")
    with pytest.raises(TypeError, match=r"generate\(\) needs a decoder model"):
        zhnlp.AutoModelForMaskedLM.from_pretrained(tmp_path / "bert").generate(torch.ones(1, 3, dtype=torch.long))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_full_shapes_describe_the_built_model(name):
    """bridge.full_shapes (checked against a checkpoint before any stage is built) equals the built model's."""
    from zhnlp.models.common.pretrained import PretrainedModel
    from zhnlp.models.ernie4_5 import FAMILY, Ernie4_5Config

    arch = Ernie4_5Config.from_dict(dict(CONFIGS[name], model_type="ernie4_5"))
    model = PretrainedModel(FAMILY, arch, "causal_lm", {"perform_initialization": False})
    full = FAMILY.bridge.full_shapes(arch)
    table = FAMILY.bridge.table(arch)
    for gname, p in zip(engine.global_param_names(model.chunks[0]).values(), model.chunks[0].parameters()):
        mapping, _ = table.find(gname)
        assert tuple(p.shape) == full[mapping.megatron], gname


def test_config_round_trip_and_checks():
    from zhnlp.models.ernie4_5 import Ernie4_5Config

    raw = dict(CONFIGS["untied_bias"], model_type="ernie4_5", use_cache=True, custom_key=[1, 2])
    cfg = Ernie4_5Config.from_dict(raw)
    assert (cfg.rope_theta, cfg.extra["custom_key"], cfg.padded_vocab_size) == (10000.0, [1, 2], 256)
    again = cfg.to_dict(architecture="Ernie4_5ForCausalLM")
    assert again["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0} and again["use_cache"]
    assert Ernie4_5Config.from_dict(again) == Ernie4_5Config.from_dict(raw | {"architectures": again["architectures"]})
    legacy = Ernie4_5Config.from_dict({k: v for k, v in raw.items() if k != "rope_parameters"} | {"rope_theta": 5e5})
    assert legacy.rope_theta == 5e5
    with pytest.raises(CheckpointError, match=r"num_attention_heads=4 is not a multiple of num_key_value_heads=3"):
        Ernie4_5Config.from_dict(dict(raw, num_key_value_heads=3))
    with pytest.raises(CheckpointError, match=r"rope_scaling has rope_type 'linear'"):
        Ernie4_5Config.from_dict(dict(raw, rope_scaling={"type": "linear", "factor": 2.0}))
    with pytest.raises(CheckpointError, match=r"hidden_size=0 is not a valid size"):
        Ernie4_5Config.from_dict(dict(raw, hidden_size=0))
    from zhnlp.errors import LayoutError

    with pytest.raises(LayoutError, match=r"num_key_value_heads=2 is not divisible by tp=4"):
        cfg.check_layout(4, 1)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_many_tokens_take_onednn_and_match_transformers(tmp_path, name, monkeypatch):
    """Products of more than SPLIT_ROWS tokens go through oneDNN on a CPU (zhnlp.models.common.linear): logits,
    loss and every gradient (the tied output projection's included) still match transformers'."""
    from zhnlp.models.common import linear as L

    calls = []
    real = L.onednn.onednn_linear
    monkeypatch.setattr(L.onednn, "onednn_linear", lambda *a: calls.append(1) or real(*a))
    hf, model = _pair(tmp_path, name)
    model.train()
    batch = inputs(batch=3, seq=40, seed=2)  # 120 rows
    ref, out = hf(**batch), model(**batch)
    assert calls, "the products did not take the oneDNN path"
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(out.logits[mask], ref.logits[mask], rtol=0, atol=2e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-5)
    ref.loss.backward()
    out.loss.backward()
    grads = {n: p.grad for n, p in hf.named_parameters()}
    table = model.family.bridge.table(model.config)
    names = engine.global_param_names(model.chunks[0])
    for local, p in model.chunks[0].named_parameters():
        mapping, layer = table.find(names[local])
        for key, grad in mapping.to_hf(p.grad, layer).items():
            torch.testing.assert_close(grad, grads[key], rtol=1e-4, atol=1e-6, msg=key)
