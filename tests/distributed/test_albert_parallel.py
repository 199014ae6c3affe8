"""CKIP's albert-tiny-chinese (real weights: 4 layers sharing one group) under tensor and pipeline parallelism,
against transformers, once `zhnlp models fetch albert-tiny-chinese` has put it in the models cache. The tiny
random ALBERT configs run every head and layout in test_parity_parallel.py."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import zhnlp
from zhnlp import hub
from tests.conftest import torchrun
from zhnlp.errors import ModelNotFoundError

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
WORKER = Path(__file__).with_name("parity_worker.py")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    import transformers

    try:
        directory = hub.resolve("albert-tiny-chinese")
    except ModelNotFoundError as e:
        pytest.skip(f"albert-tiny-chinese is not available: {e}")
    root = tmp_path_factory.mktemp("albert-tiny")
    case = root / "albert-tiny-chinese-mlm"
    case.mkdir()
    (case / "hf").symlink_to(directory)
    tokenizer = zhnlp.AutoTokenizer.from_pretrained(directory)
    batch = dict(tokenizer(["北京是中国的[MASK]都。", "今天天气很好，我们去公园散步吧！"], padding=True, return_tensors="pt"))
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 6] = tokenizer.convert_tokens_to_ids("首")
    batch["labels"] = labels
    hf = transformers.AlbertForMaskedLM.from_pretrained(directory).eval()
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    save_file({k: v.contiguous() for k, v in batch.items()}, str(case / "inputs.safetensors"))
    expected = {"loss": ref.loss, "logits": ref.logits.contiguous()}
    expected.update({f"hidden_states.{i}": h.clone() for i, h in enumerate(ref.hidden_states)})
    save_file(expected, str(case / "reference.safetensors"))
    (case / "meta.json").write_text(json.dumps({"name": "albert-tiny-chinese", "head": "mlm"}))
    return root, hf


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_albert_tiny_chinese_under_a_layout(case, tp, pp):
    import transformers

    root, hf = case
    torchrun(WORKER, 2, root, "--tp", tp, "--pp", pp, "--save")
    tag = f"tp{tp}pp{pp}"
    for rank in range(2):
        result = json.loads((root / "albert-tiny-chinese-mlm" / f"result-{tag}-rank{rank}.json").read_text())
        assert not result["missing"]
        assert result["num_parameters"] == hf.num_parameters()
        for k, d in result["diffs"].items():
            assert d <= 1e-4, f"[{tag}] rank {rank}: {k} differs by {d:.2e}"
    back = transformers.AlbertForMaskedLM.from_pretrained(root / "albert-tiny-chinese-mlm" / f"saved-{tag}")
    a, b = hf.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
