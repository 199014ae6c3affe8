"""The launchers: scripts/pretrain.sh (torchrun), the Slurm batch script and the Kubeflow manifest.

The fast tests check syntax, the usage text and the commands the launchers build (with a stub
interpreter that prints its arguments, and stub ``scontrol``/``srun`` for Slurm); the slow ones
train 2 steps through scripts/pretrain.sh on one node and on two loopback "nodes".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port

LAUNCHER = ROOT / "scripts" / "pretrain.sh"
SBATCH = ROOT / "scripts" / "slurm" / "pretrain.sbatch"
MANIFEST = ROOT / "scripts" / "k8s" / "pytorchjob.yaml"


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def stub_python(tmp_path) -> Path:
    """An interpreter that only prints the arguments it was given, one per line."""
    return _executable(tmp_path / "python", '#!/usr/bin/env bash\nprintf "ARG %s\\n" "$@"\n')


def _run(cmd, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, **(env or {})}, **kw)


def _args(out: str) -> list[str]:
    return [line[4:] for line in out.splitlines() if line.startswith("ARG ")]


def _pretrain_args(argv: list[str]) -> argparse.Namespace:
    """Parse the `zhnlp pretrain` part of a command with the real command-line parser."""
    from zhnlp.cli import build_parser

    start = argv.index("zhnlp") + 1
    return build_parser("pretrain").parse_args(argv[start:])


# ------------------------------------------------------------------------------ syntax, usage
@pytest.mark.parametrize("script", [LAUNCHER, SBATCH], ids=["pretrain.sh", "pretrain.sbatch"])
def test_shell_syntax(script):
    proc = _run(["bash", "-n", str(script)])
    assert proc.returncode == 0, proc.stderr
    assert "set -euo pipefail" in script.read_text()


def test_launcher_help():
    assert os.access(LAUNCHER, os.X_OK)
    proc = _run([str(LAUNCHER), "-h"])
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: scripts/pretrain.sh")
    for option in ("--nnodes", "--node-rank", "--nproc-per-node", "--rdzv-endpoint", "--rdzv-id", "--max-restarts"):
        assert option in proc.stdout


# ------------------------------------------------------------------------------ pretrain.sh commands
def test_one_node_is_standalone_and_passes_arguments_through(stub_python):
    proc = _run([str(LAUNCHER), "--python", str(stub_python), "--nproc-per-node", "3", "--",
                 "--recipe", "ernie-debug", "--tp", "2", "--steps", "5"], env={"OMP_NUM_THREADS": ""})
    assert proc.returncode == 0, proc.stderr
    args = _args(proc.stdout)
    assert args[:2] == ["-m", "torch.distributed.run"]
    assert {"--nproc-per-node=3", "--nnodes=1", "--standalone", "--max-restarts=0"} <= set(args)
    assert args[args.index("zhnlp") - 1:] == ["-m", "zhnlp", "pretrain", "--recipe", "ernie-debug", "--tp", "2",
                                               "--steps", "5"]
    assert "[pretrain.sh]" in proc.stdout and "torch.distributed.run" in proc.stdout  # the command is printed
    assert "OMP_NUM_THREADS=" in proc.stdout


def test_unknown_options_start_the_trainer_arguments(stub_python):
    proc = _run([str(LAUNCHER), "--python", str(stub_python), "--nproc-per-node", "1", "--recipe", "ernie-debug"])
    assert proc.returncode == 0, proc.stderr
    assert _args(proc.stdout)[-3:] == ["pretrain", "--recipe", "ernie-debug"]


def test_several_nodes_use_c10d(stub_python):
    proc = _run([str(LAUNCHER), "--python", str(stub_python), "--nnodes", "2", "--node-rank", "1",
                 "--nproc-per-node", "4", "--rdzv-endpoint", "host0:29400", "--rdzv-id", "job7", "--max-restarts", "3",
                 "--", "--recipe", "ernie-3.0-base"])
    assert proc.returncode == 0, proc.stderr
    args = _args(proc.stdout)
    assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=host0:29400",
            "--rdzv-id=job7", "--max-restarts=3"} <= set(args)
    assert "--standalone" not in args and not any(a.startswith("--node-rank") for a in args)
    assert not any(a.startswith("--rdzv-conf") for a in args)


def test_an_elastic_job_passes_the_rendezvous_settings(stub_python):
    proc = _run([str(LAUNCHER), "--python", str(stub_python), "--nnodes", "1:4", "--nproc-per-node", "2",
                 "--rdzv-endpoint", "host0:29400", "--rdzv-conf", "last_call_timeout=5", "--", "--resume"])
    assert proc.returncode == 0, proc.stderr
    assert {"--nnodes=1:4", "--rdzv-conf=last_call_timeout=5", "--rdzv-backend=c10d"} <= set(_args(proc.stdout))


def test_static_rendezvous_passes_the_node_rank(stub_python):
    proc = _run([str(LAUNCHER), "--python", str(stub_python), "--nnodes", "3", "--node-rank", "2",
                 "--master-addr", "master-0", "--master-port", "23456", "--", "--recipe", "ernie-debug"])
    assert proc.returncode == 0, proc.stderr
    assert {"--nnodes=3", "--node-rank=2", "--master-addr=master-0", "--master-port=23456"} <= set(_args(proc.stdout))


def test_environment_variables_set_the_options(stub_python):
    proc = _run([str(LAUNCHER), "--", "--recipe", "ernie-debug"],
                env={"PYTHON": str(stub_python), "NNODES": "2", "NPROC_PER_NODE": "2",
                     "RDZV_ENDPOINT": "h:1234", "RDZV_ID": "envjob", "MAX_RESTARTS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert {"--nnodes=2", "--nproc-per-node=2", "--rdzv-endpoint=h:1234", "--rdzv-id=envjob",
            "--max-restarts=1"} <= set(_args(proc.stdout))


def test_processes_per_node_default(stub_python, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = f"{bin_dir}:{os.environ['PATH']}"
    visible = _run([str(LAUNCHER), "--python", str(stub_python)], env={"CUDA_VISIBLE_DEVICES": "0,1,2,5"})
    assert "--nproc-per-node=4" in _args(visible.stdout)
    _executable(bin_dir / "nvidia-smi", "#!/usr/bin/env bash\nprintf 'GPU 0: X\\nGPU 1: X\\nGPU 2: X\\n'\n")
    listed = _run([str(LAUNCHER), "--python", str(stub_python)], env={"CUDA_VISIBLE_DEVICES": "", "PATH": path})
    assert "--nproc-per-node=3" in _args(listed.stdout)
    _executable(bin_dir / "nvidia-smi", "#!/usr/bin/env bash\nexit 9\n")
    cpu = _run([str(LAUNCHER), "--python", str(stub_python)], env={"CUDA_VISIBLE_DEVICES": "", "PATH": path})
    assert "--nproc-per-node=2" in _args(cpu.stdout)


def test_omp_threads(stub_python):
    proc = _run([str(LAUNCHER), "--python", str(stub_python), "--nproc-per-node", "1"], env={"OMP_NUM_THREADS": "7"})
    assert "OMP_NUM_THREADS=7" in proc.stdout
    proc = _run([str(LAUNCHER), "--python", str(stub_python), "--nproc-per-node", "10000"], env={"OMP_NUM_THREADS": ""})
    assert "OMP_NUM_THREADS=1" in proc.stdout  # never 0


def test_dry_run_prints_without_running():
    proc = _run([str(LAUNCHER), "--dry-run", "--python", "/nonexistent/python", "--", "--recipe", "ernie-debug"])
    assert proc.returncode == 0, proc.stderr
    assert "/nonexistent/python -m torch.distributed.run" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "2"], "needs --rdzv-endpoint"),
    (["--nproc-per-node", "0"], "positive integer"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "not below"),
    (["--rdzv-endpoint", "h:1", "--master-addr", "h"], "not both"),
    (["--rdzv-endpoint", "hostonly"], "HOST:PORT"),
    (["--nnodes"], "needs a value"),
    (["--rdzv-conf", "last_call_timeout=5"], "pass --rdzv-endpoint"),
])
def test_launcher_errors(stub_python, argv, message):
    proc = _run([str(LAUNCHER), "--python", str(stub_python), *argv])
    assert proc.returncode == 2
    assert message in proc.stderr and not _args(proc.stdout)


# ------------------------------------------------------------------------------ Slurm
def test_sbatch_runs_one_launcher_per_node(stub_python, tmp_path):
    """Slurm is simulated: scontrol expands the node list, srun runs its command once per node."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "scontrol", '#!/usr/bin/env bash\n[[ "$1 $2" == "show hostnames" ]] || exit 1\n'
                                      'printf "gpu-a17\\ngpu-a18\\n"\n')
    _executable(bin_dir / "srun", '#!/usr/bin/env bash\necho "SRUN $*"\nwhile [[ $1 == -* ]]; do shift; done\n'
                                  'for ((n = 0; n < SLURM_JOB_NUM_NODES; n++)); do SLURM_NODEID=$n "$@"; done\n')
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "16",
           "SLURM_GPUS_PER_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHON": str(stub_python),
           "ZHNLP_REPO": "", "MAX_RESTARTS": ""}
    proc = _run(["bash", str(SBATCH), "--recipe", "ernie-3.0-base", "--tp", "2", "--output", "/shared/runs/a b"],
                env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    srun = next(line for line in proc.stdout.splitlines() if line.startswith("SRUN "))
    assert "--ntasks-per-node=1" in srun and "--cpus-per-task=16" in srun and "--gpus-per-node=4" in srun
    assert "node rank 0 of 2" in proc.stdout and "node rank 1 of 2" in proc.stdout
    everything = _args(proc.stdout)
    starts = [i for i, a in enumerate(everything) if a == "torch.distributed.run"]
    assert len(starts) == 2  # one torchrun per node
    for begin, end in zip(starts, [s - 1 for s in starts[1:]] + [len(everything)]):  # s - 1: its "-m"
        args = everything[begin:end]
        assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=gpu-a17:29500",
                "--rdzv-id=4242", "--max-restarts=3"} <= set(args)
        ns = _pretrain_args(args)
        assert (ns.recipe, ns.tp, ns.output) == ("ernie-3.0-base", 2, "/shared/runs/a b")


def test_sbatch_header():
    text = SBATCH.read_text()
    for directive in ("--nodes=", "--ntasks-per-node=1", "--gpus-per-node=", "--time="):
        assert f"#SBATCH {directive}" in text
    assert "scontrol show hostnames" in text and "SLURM_NODEID" in text


# ------------------------------------------------------------------------------ Kubernetes
@pytest.fixture(scope="module")
def job() -> dict:
    return yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))


def test_pytorchjob_structure(job):
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] >= 1
    for kind, replica in replicas.items():
        pod = replica["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
        assert "REGISTRY" in container["image"]  # the placeholder
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == int(spec["nprocPerNode"])
        assert any(p["name"] == "pytorchjob-port" for p in container["ports"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert "persistentVolumeClaim" in volumes["shared"] and mounts["shared"] == "/shared"
        script = " ".join(container["command"] + container["args"])
        assert "scripts/pretrain.sh" in script and "--recipe" in script


def test_pytorchjob_command_matches_the_operator_environment(job, stub_python):
    """Run the pod's command here with the variables the operator sets for worker pod 0 (node 1)."""
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["bash", "-c"]
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": job["spec"]["nprocPerNode"],
           "MASTER_ADDR": "zhnlp-pretrain-master-0", "MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "16",
           "PYTHON": str(stub_python)}
    proc = _run(["bash", "-c", *container["args"]], env=env)
    assert proc.returncode == 0, proc.stderr
    args = _args(proc.stdout)
    assert {"--nnodes=2", "--node-rank=1", "--nproc-per-node=8", "--master-addr=zhnlp-pretrain-master-0",
            "--master-port=23456"} <= set(args)
    ns = _pretrain_args(args)
    assert ns.recipe in {"ernie-3.0-base", "ernie-3.0-xbase"} and ns.output.startswith("/shared/")
    assert ns.prefix.startswith("/shared/")  # --data sets the corpus prefix


# ------------------------------------------------------------------------------ real runs
def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.distributed
def test_launcher_trains_on_one_node(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [str(LAUNCHER), "--nproc-per-node", "2", "--nnodes", "1", "--", "--recipe", "ernie-debug", "--steps", "2",
         "--tp", "2", "--output", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    metrics = _metrics(out)
    assert [m["step"] for m in metrics] == [1, 2]


@pytest.mark.slow
@pytest.mark.distributed
def test_launcher_trains_on_two_loopback_nodes(tmp_path):
    out = tmp_path / "run"
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    agents = [subprocess.Popen(
        [str(LAUNCHER), "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1", "--rdzv-endpoint", endpoint,
         "--rdzv-id", "zhnlp-launch-test", "--", "--recipe", "ernie-debug", "--steps", "2", "--tp", "2",
         "--output", str(out)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in range(2)]
    try:
        outputs = [a.communicate(timeout=600)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    assert all(a.returncode == 0 for a in agents), "\n".join(o[-4000:] for o in outputs)
    metrics = _metrics(out)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["loss"] > 0 for m in metrics)
    assert f"--rdzv-endpoint={endpoint}" in outputs[0]  # the printed command
