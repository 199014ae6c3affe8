"""ERNIE 4.5 decoder parity with transformers at TP=2 (with and without sequence parallelism), PP=2 and
PP=2 x VPP=2 (gloo, two processes): logits, loss, hidden states, greedy generation (across the pipeline stages too; refused by
name under sequence parallelism), the save -> transformers round trip and, at TP=2, gradients. Kept small: two tiny 4-layer checkpoints, one
job per layout."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import torchrun
from tests.tiny_decoder import CONFIGS, MOE_CONFIGS, hf_model, hf_moe_model, inputs

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
WORKER = Path(__file__).with_name("decoder_parity_worker.py")


def _prepare(root, names, build):
    for name in names:
        case = root / name
        hf = build(name)
        hf.save_pretrained(case / "hf")
        batch = inputs()
        with torch.no_grad():
            hidden = hf(**batch, output_hidden_states=True).hidden_states
        prompt = batch["input_ids"][:, :6]
        generated = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
        hf.train()
        ref = hf(**batch)
        ref.loss.backward()
        save_file({k: v.contiguous() for k, v in batch.items()}, str(case / "inputs.safetensors"))
        expected = {"logits": ref.logits.detach().contiguous(), "loss": ref.loss.detach().reshape(())}
        expected.update({f"grad.{n}": p.grad.contiguous() for n, p in hf.named_parameters() if p.grad is not None})
        expected.update({f"hidden.{i}": h.contiguous() for i, h in enumerate(hidden)})
        expected["generated"] = generated.contiguous()
        if hasattr(hf.config, "moe_num_experts"):  # transformers' router outputs: logits per MoE layer, aux loss
            with torch.no_grad():
                routed = hf.eval()(**batch, output_router_logits=True)
            expected.update({f"router.{i}": r.contiguous() for i, r in enumerate(routed.router_logits)})
            expected.update({"aux_loss": routed.aux_loss.reshape(()), "loss_with_aux": routed.loss.reshape(())})
        save_file(expected, str(case / "reference.safetensors"))
    return root


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp("decoder-cases"), CONFIGS, lambda n: hf_model(n, num_hidden_layers=4))


@pytest.fixture(scope="module")
def moe_cases(tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp("moe-cases"), MOE_CONFIGS, hf_moe_model)


@pytest.mark.parametrize("tp,pp,vpp,sp", [(2, 1, None, False), (2, 1, None, True), (1, 2, None, False),
                                         (1, 2, 2, False)], ids=["tp2", "tp2-sp", "pp2", "pp2-vpp2"])
def test_layout_matches_transformers(cases, tp, pp, vpp, sp):
    import transformers

    flags = [f"--tp={tp}", f"--pp={pp}"] + ([f"--vpp={vpp}"] if vpp else []) + (["--sp"] if sp else [])
    torchrun(WORKER, 2, cases, *flags)
    tag = f"tp{tp}pp{pp}" + (f"vpp{vpp}" if vpp else "") + ("sp" if sp else "")
    for case in sorted(p for p in cases.iterdir() if (p / "hf").is_dir()):
        for rank in range(2):
            d = json.loads((case / f"result-{tag}-rank{rank}.json").read_text())["diffs"]
            assert d["logits"] <= 2e-5 and d["loss"] <= 1e-5 and d["hidden"] <= 2e-5, (case.name, tag, rank, d)
            if pp == 1:
                assert d["grads"] <= 1e-5 and d["grad_keys_missing"] == 0, (case.name, tag, rank, d)
            assert d["generated_equal"], (case.name, tag, rank, "greedy generation differs")
        a = transformers.Ernie4_5ForCausalLM.from_pretrained(case / "hf").state_dict()
        b = transformers.Ernie4_5ForCausalLM.from_pretrained(case / f"saved-{tag}").state_dict()
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]), f"{case.name} [{tag}] round trip changed {k}"


@pytest.mark.parametrize("nprocs,layout", [
    (2, dict(ep=2)), (2, dict(tp=2, ep=2, etp=1)), (2, dict(pp=2)), (4, dict(tp=2, ep=2, sp=True))],
    ids=["ep2", "tp2-ep2-etp1", "pp2", "tp2-ep2-etp2-sp"])
def test_moe_layout_matches_transformers(moe_cases, nprocs, layout):
    """Expert parallelism (each rank holds half of the experts), TP x EP with and without expert tensor
    parallelism, and a pipeline through dense and MoE layers: logits, loss, hidden states, greedy generation
    (where there is no pipeline and no sequence parallelism) and the save -> transformers round trip."""
    import transformers

    tp, pp, ep, etp, sp = (layout.get(k, d) for k, d in (("tp", 1), ("pp", 1), ("ep", 1), ("etp", None), ("sp", False)))
    flags = [f"--tp={tp}", f"--pp={pp}", f"--ep={ep}"] + ([f"--etp={etp}"] if etp else []) + (["--sp"] if sp else [])
    torchrun(WORKER, nprocs, moe_cases, *flags)
    tag = f"tp{tp}pp{pp}" + ("sp" if sp else "") + (f"ep{ep}etp{etp or tp}" if ep > 1 else "")
    for case in sorted(p for p in moe_cases.iterdir() if (p / "hf").is_dir()):
        for rank in range(nprocs):
            d = json.loads((case / f"result-{tag}-rank{rank}.json").read_text())["diffs"]
            assert d["logits"] <= 2e-5 and d["loss"] <= 1e-5 and d["hidden"] <= 2e-5, (case.name, tag, rank, d)
            assert d["router_layers"] == d["router_layers_expected"] > 0, (case.name, tag, rank, d)
            assert d["router_logits"] <= 2e-5 and d["aux_loss"] <= 1e-6 and d["loss_with_aux"] <= 1e-5, \
                (case.name, tag, rank, d)
            assert d["generated_equal"], (case.name, tag, rank, "greedy generation differs")
        a = transformers.Ernie4_5_MoeForCausalLM.from_pretrained(case / "hf").state_dict()
        b = transformers.Ernie4_5_MoeForCausalLM.from_pretrained(case / f"saved-{tag}").state_dict()
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]), f"{case.name} [{tag}] round trip changed {k}"
