"""What makes ALBERT different, in one process: which group serves which layer (against transformers' own
AlbertTransformer), weights shared by parameter identity within a model chunk, gradients that sum over the
layers of a group, hidden states per layer applied, the config's refusals, and CKIP's albert-tiny-chinese.
(Every head's outputs and the round trip run in the table-driven test_parity_single.py.)"""

import pytest
import torch
import transformers

import zhnlp
from zhnlp import hub
from tests.tiny import CONFIGS, hf_model, inputs
from zhnlp.errors import CheckpointError, LayoutError, ModelNotFoundError
from zhnlp.models.albert import AlbertConfig


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


@pytest.mark.parametrize("layers,groups,inner", [(4, 1, 1), (4, 3, 2), (6, 4, 1), (5, 2, 3), (7, 7, 1), (12, 5, 2)])
def test_layer_slots_follow_transformers(layers, groups, inner):
    """The (group, layer in group) each applied layer uses is the one transformers' AlbertTransformer calls."""
    cfg = transformers.AlbertConfig(vocab_size=20, embedding_size=4, hidden_size=8, num_attention_heads=2,
                                    intermediate_size=8, num_hidden_layers=layers, num_hidden_groups=groups,
                                    inner_group_num=inner)
    model = transformers.AlbertModel(cfg).eval()
    called = []
    for g, group in enumerate(model.encoder.albert_layer_groups):
        for k, layer in enumerate(group.albert_layers):
            layer.register_forward_hook(lambda *_, slot=(g, k): called.append(slot))
    with torch.no_grad():
        model(torch.ones(1, 3, dtype=torch.long))
    arch = AlbertConfig(embedding_size=4, hidden_size=8, num_attention_heads=2, intermediate_size=8,
                        num_hidden_layers=layers, num_hidden_groups=groups, inner_group_num=inner)
    assert list(arch.layer_slots) == called
    assert arch.num_layers == layers * inner == len(called)


def test_layers_of_a_group_share_parameters_within_a_chunk(tmp_path):
    hf = hf_model("albert_groups", "base")
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModel.from_pretrained(tmp_path / "hf")
    layers = model.chunks[0].encoder.layers
    # applications 0, 0, 1, 2 of groups with 2 layers each: megatron layers 0-1 and 2-3 are group 0's
    for a, b in ((0, 2), (1, 3)):
        assert layers[a].mlp.linear_fc1.weight is layers[b].mlp.linear_fc1.weight
        assert layers[a].self_attention.linear_qkv.weight is layers[b].self_attention.linear_qkv.weight
    assert layers[0].mlp.linear_fc1.weight is not layers[1].mlp.linear_fc1.weight  # group 0's two layers differ
    assert layers[4].mlp.linear_fc1.weight is not layers[0].mlp.linear_fc1.weight
    assert [layer.shares_parameters_of for layer in layers] == [0, 1, 0, 1, 4, 5, 6, 7]
    # the modules stay apart: only the last layer computes [CLS] alone under a classifier
    assert not any(getattr(p, "shared", False) for p in model.parameters())  # one chunk: no copies to sync
    assert model.num_parameters() == hf.num_parameters()
    assert model.num_parameters(exclude_embeddings=True) == hf.num_parameters(exclude_embeddings=True)


def test_hidden_states_are_one_per_layer_applied(tmp_path):
    hf = hf_model("albert_groups", "base")
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModel.from_pretrained(tmp_path / "hf")
    batch = {k: v for k, v in inputs("albert_groups", "base").items() if k != "labels"}
    with torch.no_grad():
        ours, ref = model(**batch, output_hidden_states=True), hf(**batch, output_hidden_states=True)
    assert len(ours.hidden_states) == len(ref.hidden_states) == 4 * 2 + 1
    for i, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states)):
        assert (a - b).abs().max() <= 1e-5, f"hidden_states[{i}]"


@pytest.mark.parametrize("head", ["sequence_classification", "mlm"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradients_sum_over_the_layers_of_a_group(tmp_path, head, checkpointing):
    """A fine-tuning step's gradients equal transformers' for every weight, the shared ones included (also when
    each layer is recomputed in the backward pass and the shared weight collects its gradient per layer)."""
    hf = hf_model("albert_groups", head, classifier_dropout_prob=0.0)  # dropout off: the same computation
    hf.save_pretrained(tmp_path / "hf")
    model = (zhnlp.AutoModelForSequenceClassification if head != "mlm" else
             zhnlp.AutoModelForMaskedLM).from_pretrained(tmp_path / "hf").train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    hf.train()
    batch = inputs("albert_groups", head)
    hf(**batch).loss.backward()
    model(**batch).loss.backward()
    grads = {n: p.grad for n, p in hf.named_parameters()}
    for p in model.parameters():  # map the gradients through the conversion table
        p.data.copy_(p.grad)
    model.save_pretrained(tmp_path / "grads")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "grads" / "model.safetensors"))
    assert saved.keys() == {n for n in grads if n != "predictions.decoder.weight"} - {"predictions.decoder.bias"}
    for name, g in saved.items():
        torch.testing.assert_close(g, grads[name], rtol=0, atol=1e-5, msg=name)


def test_from_config_initialises_each_group_once():
    """A fresh model's copies of a group (named by the group's first layer) are one weight per group."""
    model = zhnlp.AutoModelForMaskedLM.from_config(dict(CONFIGS["albert_groups"]))
    fields = {k: v for k, v in CONFIGS["albert_groups"].items() if k != "model_type"}
    ref = transformers.AlbertForMaskedLM(transformers.AlbertConfig(**fields))
    assert model.num_parameters() == ref.num_parameters()
    layers = model.chunks[0].encoder.layers
    assert layers[2].post_mlp_layernorm.weight is layers[0].post_mlp_layernorm.weight


@pytest.mark.parametrize("head", ["base", "mlm", "sequence_classification", "token_classification",
                                  "question_answering"])
def test_full_shapes_describe_the_built_model(head):
    """bridge.full_shapes (a checkpoint's shapes are checked against it before any stage is built) equals the
    built model's parameters."""
    from zhnlp.conversion import engine
    from zhnlp.models.albert import FAMILY
    from zhnlp.models.common.pretrained import PretrainedModel

    arch = AlbertConfig.from_dict(dict(CONFIGS["albert_groups"], num_labels=3))
    model = PretrainedModel(FAMILY, arch, head, {"perform_initialization": False})
    table, shapes = FAMILY.bridge.table(arch), FAMILY.bridge.full_shapes(arch)
    names = engine.global_param_names(model.chunks[0])
    for local, p in model.chunks[0].named_parameters():
        mapping, _ = table.find(names[local])
        assert shapes[mapping.megatron] == tuple(p.shape), names[local]


def test_refusals_name_the_setting():
    with pytest.raises(CheckpointError, match=r"num_hidden_groups=4 with num_hidden_layers=2 leaves layer groups "
                                              r"\[1, 3\] unused"):
        AlbertConfig(num_hidden_layers=2, num_hidden_groups=4, hidden_size=8, num_attention_heads=2)
    with pytest.raises(CheckpointError, match="tie_word_embeddings=False"):
        AlbertConfig.from_dict(dict(CONFIGS["albert"], tie_word_embeddings=False))
    with pytest.raises(CheckpointError, match="position_embedding_type='relative_key'"):
        AlbertConfig.from_dict(dict(CONFIGS["albert"], position_embedding_type="relative_key"), source="c.json")
    with pytest.raises(CheckpointError, match="inner_group_num=0 is not a valid size"):
        AlbertConfig.from_dict(dict(CONFIGS["albert"], inner_group_num=0))
    with pytest.raises(CheckpointError, match="hidden_size 30 is not divisible by num_attention_heads 4"):
        AlbertConfig.from_dict(dict(CONFIGS["albert"], hidden_size=30))


def test_pipeline_splits_the_layers_applied():
    """3 applications of a 2-layer group are 6 megatron layers: 2 stages fit, 4 do not."""
    arch = AlbertConfig.from_dict(dict(CONFIGS["albert_groups"], num_hidden_layers=3, num_hidden_groups=1))
    arch.check_layout(tp=2, pp=2)
    with pytest.raises(LayoutError, match=r"num_hidden_layers x inner_group_num = 3 x 2 = 6 \(the layers applied\) "
                                          r"is not divisible by pp\*vpp=4"):
        arch.check_layout(tp=1, pp=4)


def test_config_round_trips_through_transformers(tmp_path):
    arch = AlbertConfig.from_dict(dict(CONFIGS["albert_groups"], net_structure_type=0, num_labels=3))
    arch.save_pretrained(tmp_path)
    ref = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(ref).__name__ == "AlbertConfig"
    for name in ("embedding_size", "num_hidden_groups", "inner_group_num", "classifier_dropout_prob", "num_labels"):
        assert getattr(ref, name) == getattr(arch, name)
    assert zhnlp.AutoConfig.from_pretrained(tmp_path).to_dict() == arch.to_dict()


# ---------------------------------------------------------------- real weights: CKIP's albert-tiny-chinese
def test_albert_tiny_chinese_matches_transformers():
    """CKIP's 4-layer ALBERT (one group, hidden 312, embeddings 128), once `zhnlp models fetch albert-tiny-chinese`
    has put it in the models cache: the same masked-LM logits as transformers on Chinese sentences."""
    try:
        directory = hub.resolve("albert-tiny-chinese")
    except ModelNotFoundError as e:
        pytest.skip(f"albert-tiny-chinese is not available: {e}")
    tokenizer = zhnlp.AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(["北京是中国的[MASK]都。", "今天天气很好，我们去公园散步吧！"], padding=True, return_tensors="pt")
    x = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    ref = transformers.AlbertForMaskedLM.from_pretrained(directory).eval()
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(directory)
    with torch.no_grad():
        ours, theirs = model(**x).logits, ref(**x).logits
    assert ours.shape == (2, x["input_ids"].shape[1], 21128)
    assert (ours - theirs).abs().max() <= 1e-4
    masked = (x["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0]
    assert tokenizer.decode(ours[0, masked].argmax()) == "首"
    assert model.num_parameters() == ref.num_parameters()
