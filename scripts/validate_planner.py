"""Set the planner's memory model beside measurements on this machine.

Each configuration below is a real ``zhnlp pretrain`` run (torchrun, gloo, 1-4 processes) of a debug recipe for
``STEPS`` steps; its ``peak_tensor_bytes`` (allocator level, the maximum over ranks: see
:mod:`zhnlp.training.peak_memory`) is set beside the planner's prediction for the same recipe and layout
(:func:`zhnlp.planning.peak_memory`, the largest stage; for the encoders with the number of positions the
corpus's masking gives the head, since its documents are shorter than the sequence). Prints a Markdown table with
the error of each and writes OUTPUT/memory.json.

How the per-tensor accounting of :mod:`zhnlp.planning.activations` was found: profile one step of a one-process
run with ``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)`` and list the
tensors live at the peak of ``torch.profiler._memory_profiler.MemoryProfileTimeline`` with the op that allocated
each; with distinct widths (e.g. hidden 96, head_dim 20, FFN 176) every size names its tensor.

    .venv/bin/python scripts/validate_planner.py [--output runs/planner-validation] [--only NAME,...]

Finished measurements are kept in OUTPUT/memory.json: a second call measures only what is missing (``--again``
measures everything again).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zhnlp.distributed import free_port  # noqa: E402  (after the checkout is on the path)

STEPS = 3

# name -> (processes, recipe, zhnlp pretrain flags). The shapes are chosen so that activations, parameters and
# optimizer states each dominate somewhere: long sequences and large micro-batches on the tiny widths.
CONFIGS = {
    "enc-1p": (1, "ernie-debug", []),
    "enc-1p-long": (1, "ernie-debug", ["--seq-length", "256", "--micro-batch-size", "8", "--global-batch-size", "16"]),
    "enc-1p-long-full": (1, "ernie-debug", ["--seq-length", "256", "--micro-batch-size", "8",
                                            "--global-batch-size", "16", "--recompute", "full"]),
    "enc-1p-bf16": (1, "ernie-debug", ["--precision", "bf16", "--seq-length", "128", "--micro-batch-size", "8",
                                       "--global-batch-size", "16"]),
    "enc-dp2-distopt": (2, "ernie-debug", ["--distributed-optimizer"]),
    "enc-dp2-distopt-bf16": (2, "ernie-debug", ["--distributed-optimizer", "--precision", "bf16"]),
    "enc-dp2-fsdp": (2, "ernie-debug", ["--fsdp", "--seq-length", "128", "--micro-batch-size", "4",
                                        "--global-batch-size", "16"]),
    "enc-tp2": (2, "ernie-debug", ["--tp", "2", "--seq-length", "128", "--micro-batch-size", "8",
                                   "--global-batch-size", "16"]),
    "enc-tp2-sp": (2, "ernie-debug", ["--tp", "2", "--sequence-parallel", "--seq-length", "128",
                                      "--micro-batch-size", "8", "--global-batch-size", "16"]),
    "enc-pp2": (2, "ernie-debug", ["--pp", "2", "--seq-length", "128", "--micro-batch-size", "4",
                                   "--global-batch-size", "16"]),
    "enc-pp2-vpp2": (2, "ernie-debug", ["--pp", "2", "--vpp", "2", "--seq-length", "128", "--micro-batch-size", "4",
                                        "--global-batch-size", "16"]),
    "enc-tp2-pp2": (4, "ernie-debug", ["--tp", "2", "--pp", "2", "--seq-length", "128", "--micro-batch-size", "4",
                                       "--global-batch-size", "16"]),
    "dec-1p-long": (1, "ernie4.5-debug", ["--seq-length", "256", "--micro-batch-size", "8",
                                          "--global-batch-size", "16"]),
    "dec-1p-selective": (1, "ernie4.5-debug", ["--seq-length", "256", "--micro-batch-size", "8",
                                               "--global-batch-size", "16", "--recompute", "selective"]),
    "dec-tp2-sp": (2, "ernie4.5-debug", ["--tp", "2", "--sequence-parallel", "--seq-length", "128",
                                         "--micro-batch-size", "8", "--global-batch-size", "16"]),
    "dec-tp2-sp-bf16": (2, "ernie4.5-debug", ["--tp", "2", "--sequence-parallel", "--precision", "bf16",
                                              "--seq-length", "128", "--micro-batch-size", "8",
                                              "--global-batch-size", "16"]),
    "dec-pp2-dp2-distopt": (4, "ernie4.5-debug", ["--pp", "2", "--distributed-optimizer", "--seq-length", "128",
                                                  "--micro-batch-size", "4", "--global-batch-size", "16"]),
    "dec-dp2-fsdp-bf16": (2, "ernie4.5-debug", ["--fsdp", "--precision", "bf16", "--seq-length", "128",
                                                "--micro-batch-size", "4", "--global-batch-size", "16"]),
    "dec-dp2-fp16": (2, "ernie4.5-debug", ["--precision", "fp16", "--seq-length", "128", "--micro-batch-size", "4",
                                           "--global-batch-size", "16"]),
    "moe-1p": (1, "ernie4.5-moe-debug", ["--seq-length", "128", "--micro-batch-size", "8",
                                         "--global-batch-size", "16"]),
    "moe-ep2": (2, "ernie4.5-moe-debug", ["--ep", "2", "--seq-length", "128", "--micro-batch-size", "8",
                                          "--global-batch-size", "16"]),
    "moe-tp2-sp": (2, "ernie4.5-moe-debug", ["--tp", "2", "--sequence-parallel", "--seq-length", "128",
                                             "--micro-batch-size", "8", "--global-batch-size", "16"]),
    "moe-ep2-tp2-sp": (4, "ernie4.5-moe-debug", ["--ep", "2", "--tp", "2", "--sequence-parallel",
                                                 "--seq-length", "128", "--micro-batch-size", "8",
                                                 "--global-batch-size", "16"]),
}


def measure(nproc: int, recipe: str, flags: list[str], steps: int = STEPS) -> dict:
    """Run the configuration for ``steps`` steps; its last metrics line (``peak_tensor_bytes`` among them)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--recipe", recipe, "--output",
               f"{tmp}/run", "--steps", str(steps), "--log-interval", "1", "--warmup-steps", "0", *flags]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        lines = Path(f"{tmp}/run/metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=ROOT / "runs" / "planner-validation")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--again", action="store_true", help="measure again what was measured before")
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / "memory.json"
    measured = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and not args.again else {}
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    for name in names:
        nproc, recipe, flags = CONFIGS[name]
        if name not in measured:
            m = measure(nproc, recipe, flags)
            measured[name] = {"peak_tensor_bytes": m["peak_tensor_bytes"]}
            path.write_text(json.dumps(measured, indent=1), encoding="utf-8")
    print("| configuration | processes | recipe and flags | measured peak MiB | predicted MiB | error | "
          "phase |\n|---|---|---|---|---|---|---|")
    errors = {}
    for name in names:
        nproc, recipe_name, flags = CONFIGS[name]
        peak = measured[name]["peak_tensor_bytes"]
        stage = predicted(nproc, recipe_name, flags)
        errors[name] = stage["total"] / peak - 1
        print(f"| {name} | {nproc} | {recipe_name} {' '.join(flags)} | {peak / 2**20:.2f} | "
              f"{stage['total'] / 2**20:.2f} | {100 * errors[name]:+.1f}% | {stage['phase']} |", flush=True)
    within = sum(abs(e) <= 0.10 for e in errors.values())
    print(f"\n{within} of {len(errors)} configurations within 10%; largest error "
          f"{100 * max(map(abs, errors.values())):.1f}%")
    return 0


def resolved(recipe_name: str, flags: list[str]):
    from zhnlp.cli import build_parser
    from zhnlp.training.command import resolve

    return resolve(build_parser("pretrain").parse_args(["pretrain", "--recipe", recipe_name, *flags]))


def masked_positions(cfg, nproc: int, steps: int) -> int | None:
    """The most positions any micro-batch of the first ``steps`` steps asks the masked-LM head to predict (the
    corpus's documents are shorter than the sequence, so fewer than ``mask_prob`` of it): the same samples,
    in the same order, as the trainer's (:meth:`zhnlp.training.trainer.Trainer._micro_batches`)."""
    from zhnlp.planning import Layout
    from zhnlp.tokenizers import AutoTokenizer

    if cfg.architecture().model_type not in ("ernie", "bert"):
        return None
    from zhnlp.data.demo import demo_corpus
    from zhnlp.data.pretraining import MaskedLMDataset, SpecialTokens
    from zhnlp.training.trainer import _corpus_tokenizer

    d = cfg.data
    prefix = d.prefix or str(demo_corpus(objective="mlm"))
    tok = AutoTokenizer.from_pretrained(d.tokenizer or _corpus_tokenizer(prefix))
    data = MaskedLMDataset(prefix, SpecialTokens.from_tokenizer(tok), seq_length=d.seq_length,
                           mask_prob=d.mask_prob, max_ngram=d.max_ngram, seed=cfg.seed)
    dp = Layout.from_run(cfg, nproc).dp
    per_rank = d.global_batch_size // dp
    most = 0
    for step in range(steps):
        for rank in range(dp):
            first = step * d.global_batch_size + rank * per_rank
            for start in range(0, per_rank, d.micro_batch_size):
                count = sum(int((data[(first + start + i) % len(data)]["labels"] != -100).sum())
                            for i in range(d.micro_batch_size))
                most = max(most, count)
    return most


def predicted(nproc: int, recipe_name: str, flags: list[str]) -> dict:
    """The planner's peak of the run's largest stage."""
    from zhnlp.planning import Layout, peak_memory

    cfg = resolved(recipe_name, flags)
    d = cfg.data
    stages = peak_memory(cfg.architecture(), Layout.from_run(cfg, nproc), micro_batch=d.micro_batch_size,
                         seq_length=d.seq_length, global_batch=d.global_batch_size,
                         predicted_tokens=masked_positions(cfg, nproc, STEPS))
    return max(stages, key=lambda s: s["total"])


if __name__ == "__main__":
    sys.exit(main())
