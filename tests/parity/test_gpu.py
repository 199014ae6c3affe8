"""The NCCL/CUDA path (no CPU compatibility layer): parity with transformers on one GPU."""

import pytest
import torch

import zhnlp
from tests.tiny import hf_model, inputs

pytestmark = pytest.mark.gpu


def test_cuda_parity(tmp_path):
    zhnlp.distributed.init()
    hf = hf_model("ernie3", "mlm")
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf")
    assert next(model.parameters()).is_cuda
    assert not zhnlp.distributed.cpu.installed()
    batch = inputs("ernie3", "mlm")
    with torch.no_grad():
        ref = hf.cuda()(**{k: v.cuda() for k, v in batch.items()})
        out = model(**batch)
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-4)
