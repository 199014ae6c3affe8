"""zhnlp installed from a wheel (not editable) into a fresh virtual environment: the model zoo ships inside it.

The wheel is built from this source tree with ``pip wheel --no-deps``; the fresh environment gets it with
``pip install --no-deps --no-index`` and borrows the other dependencies (torch, megatron-core, ...) from the test
interpreter's site-packages through a ``.pth`` line, so nothing is downloaded. The editable install of the
development environment is not active there (its finder is registered by a ``.pth`` file that a plain path
entry does not run), and the commands run from a directory outside the source tree.
"""

import json
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp / "dist"), str(ROOT)], capture_output=True, text=True, cwd=tmp)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp / "dist").glob("zhnlp-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                              "--no-index", str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_paths()["purelib"]]
    (Path(purelib) / "zhnlp-test-deps.pth").write_text("\n".join(deps) + "\n")
    return venv, wheel, tmp


def _run(venv, tmp, *argv):
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=tmp, env=env)


def test_wheel_carries_the_model_cards(installed):
    import zipfile

    from zhnlp.cards import cards_dir

    _, wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(Path(n).name for n in names if n.startswith("zhnlp/model_cards/") and n.endswith(".md"))
    assert shipped == sorted(p.name for p in cards_dir().glob("*.md")) and len(shipped) >= 10


def test_installed_package_lists_the_zoo_and_its_version(installed):
    venv, _, tmp = installed
    where = _run(venv, tmp, str(venv / "bin" / "python"), "-c", "import zhnlp; print(zhnlp.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), "the wheel's copy must be the one imported"
    listed = _run(venv, tmp, str(venv / "bin" / "zhnlp"), "models", "--json")
    assert listed.returncode == 0, listed.stderr
    from zhnlp.cards import list_models

    assert [c["name"] for c in json.loads(listed.stdout)] == [c.name for c in list_models()]
    version = _run(venv, tmp, str(venv / "bin" / "zhnlp"), "--version")
    import zhnlp

    assert version.stdout.strip() == f"zhnlp {zhnlp.__version__}"


def test_installed_package_builds_and_runs_a_model(installed):
    """The engine (megatron-core through the CPU layer) works from the installed wheel, not only the tree."""
    venv, _, tmp = installed
    code = ("import torch, zhnlp\n"
            "card = zhnlp.list_models()[0].config\n"
            "cfg = dict(card, num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,"
            " vocab_size=100)\n"
            "m = zhnlp.AutoModel.from_config(cfg)\n"
            "print(tuple(m(torch.tensor([[1, 2, 3]])).last_hidden_state.shape))")
    run = _run(venv, tmp, str(venv / "bin" / "python"), "-c", code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "(1, 3, 32)"
