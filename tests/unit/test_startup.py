"""What ``import zhnlp`` and the light commands load, and what zhnlp leaves changed in torch afterwards.

Startup is guarded by the modules loaded, not by timing: importing torch alone takes about a second here,
megatron-core two more, transformers one.
"""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "megatron", "transformers", "datasets", "tokenizers", "safetensors", "huggingface_hub",
         "numpy", "jieba", "rjieba", "sentencepiece")


def _loaded_after(code: str) -> set[str]:
    """Top-level packages of the heavy list that ``code``, run in a fresh interpreter, leaves in sys.modules."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1])) & set(HEAVY)


def test_import_zhnlp_loads_no_heavy_library():
    assert _loaded_after("import zhnlp; zhnlp.__version__; zhnlp.ZhnlpError; dir(zhnlp)") == set()


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["models"], ["models", "--json"], ["data", "list"],
                                  ["data", "--help"]])
def test_light_commands_load_no_heavy_library(argv):
    code = ("import contextlib, io, zhnlp.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    code = zhnlp.cli.main({argv!r})\n"
            "assert code == 0, code")
    assert _loaded_after(code) == set()


def test_public_names_resolve_lazily():
    """Every name in ``zhnlp.__all__`` is importable on first access (and the heavy ones load then)."""
    code = ("import zhnlp\n"
            "missing = [n for n in zhnlp.__all__ if not hasattr(zhnlp, n)]\n"
            "assert not missing, missing\n"
            "assert zhnlp.AutoModel.__module__ == 'zhnlp.auto'\n"
            "assert callable(zhnlp.pipeline) and callable(zhnlp.finetune)\n")
    assert "torch" in _loaded_after(code)


def test_unknown_attribute_is_an_attribute_error():
    import zhnlp

    with pytest.raises(AttributeError, match="no attribute 'AutoModelForMagic'"):
        zhnlp.AutoModelForMagic  # noqa: B018


def test_version_flag_and_attribute_agree(capsys):
    import zhnlp
    from zhnlp.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"zhnlp {zhnlp.__version__}"
    from importlib.metadata import version

    assert version("zhnlp") == zhnlp.__version__  # pyproject reads the same attribute


# The CPU layer must not change torch outside zhnlp's own calls into megatron-core.
SIDE_EFFECTS = r"""
import sys, json
sys.path.insert(0, {tests!r})
import torch
import torch.distributed as dist
import zhnlp
from tiny import CONFIGS

def cuda_state():
    try:
        current = str(torch.cuda.current_device())
    except Exception as e:  # a CPU build raises
        current = type(e).__name__
    try:
        moved = torch.ones(1).cuda().device.type
    except Exception as e:
        moved = type(e).__name__
    try:
        made = torch.zeros(1, device="cuda").device.type
    except Exception as e:
        made = type(e).__name__
    return dict(available=torch.cuda.is_available(), current=current, moved=moved, made=made,
                type=torch.ones(1).type(), seed_is_cpu=torch.cuda.manual_seed.__module__)

before = cuda_state()
model = zhnlp.AutoModelForMaskedLM.from_config(dict(CONFIGS["ernie3"]))
after_build = cuda_state()
model.train()
ids = torch.randint(1, 250, (2, 8))
out = model(ids, labels=ids)
after_forward = cuda_state()
out.loss.backward()  # the user's own backward, outside any zhnlp call: megatron's Functions run in the layer
after_backward = cuda_state()
grads = all(p.grad is not None for p in model.parameters() if p.requires_grad)
print(json.dumps(dict(before=before, after_build=after_build, after_forward=after_forward,
                      after_backward=after_backward, grads=grads, dist=dist.is_initialized(),
                      installed=zhnlp.distributed.cpu.installed(), active=zhnlp.distributed.cpu.active())))
zhnlp.distributed.shutdown()
print(json.dumps(dict(dist_after_shutdown=dist.is_initialized())))
"""


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU layer is only used without CUDA")
def test_cpu_layer_leaves_torch_cuda_unchanged_outside_zhnlp_calls(tmp_path):
    from pathlib import Path

    tests = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", SIDE_EFFECTS.format(tests=tests)], capture_output=True, text=True,
                         check=True)
    first, second = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    before = first["before"]
    assert before["available"] is False and before["current"] != "cpu" and before["moved"] != "cpu"
    assert before["made"] != "cpu" and before["type"] == "torch.FloatTensor"
    for moment in ("after_build", "after_forward", "after_backward"):
        assert first[moment] == before, moment
    assert first["grads"] and first["installed"] and not first["active"]
    # A world of one stays initialised while zhnlp models exist (megatron's layers hold its process groups);
    # zhnlp.distributed.shutdown() hands torch.distributed back (README: "torch.distributed after inference").
    assert first["dist"] is True and second["dist_after_shutdown"] is False
