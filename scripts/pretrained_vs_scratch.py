"""Does pretraining help? A small ERNIE from scratch vs the same model pretrained by
``zhnlp pretrain``, each fine-tuned on three real Chinese tasks on this CPU.

1. Pretrain ``--recipe`` (default ernie-tiny: 4 layers, hidden 128) with masked LM and
   whole-word/entity masking on the project's corpus (People's Daily, January 1998; fetched and
   preprocessed on first use) under torchrun with ``--nproc`` processes, then export it.
2. Write the same architecture with random weights (transformers' initialisation) as "scratch".
3. Fine-tune both with the same settings (``tasks/`` recipes, shortened for a CPU):
   ``sentiment-reviews`` (accuracy on its test split), CMRC2018 trial (EM/F1 on the held-out 20%
   of its articles) and ``msra-ner`` (entity F1 on its test set).
4. Write OUTPUT/results.json and print a Markdown table (the README's table comes from here).

    .venv/bin/python scripts/pretrained_vs_scratch.py [--output runs/pretrained-vs-scratch]
        [--pretrain-steps 4000] [--nproc 2] [--tasks sentiment,cmrc2018,ner] [--quick]

``--quick`` shrinks everything to check the script itself (a minute or two; numbers meaningless).
Finished steps are kept: a second run (or one per ``--tasks`` subset, e.g. two in parallel on two
cores) only does what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from zhnlp.distributed import free_port

ROOT = Path(__file__).resolve().parent.parent

# Fine-tuning settings shared by both starting points (CPU-sized; the tasks/ recipes hold the
# full-size ones).
FINETUNE = {
    "sentiment": ("sentiment_reviews.py", ["epochs=2", "lr=2e-4", "max_length=128", "batch_size=32",
                                           "eval_batch_size=128"]),
    "cmrc2018": ("cmrc2018.py", ["epochs=4", "lr=2e-4", "max_length=256", "doc_stride=128", "batch_size=16",
                                 "eval_batch_size=32"]),
    "ner": ("msra_ner.py", ["epochs=1", "lr=2e-4", "max_length=128", "batch_size=32", "eval_batch_size=128",
                            "max_train_examples=20000"]),
}
QUICK = ["max_steps=3", "max_train_examples=200", "log_interval=1"]
METRIC = {"sentiment": ("accuracy", "macro_f1"), "cmrc2018": ("em", "f1"), "ner": ("f1", "precision", "recall")}


def run(cmd: list[str], log: Path) -> None:
    """Run ``cmd``, its output into ``log``; stop with the log's tail when it fails."""
    print("$", " ".join(cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if code != 0:
        sys.exit(f"failed ({code}): {' '.join(cmd)}\n" + log.read_text(encoding="utf-8")[-4000:])


def _status(run_dir: Path) -> str | None:
    """The ``status`` of a fine-tuning run's metrics.json (None when there is none)."""
    path = run_dir / "metrics.json"
    return json.loads(path.read_text(encoding="utf-8")).get("status") if path.is_file() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=ROOT / "runs" / "pretrained-vs-scratch")
    ap.add_argument("--recipe", default="ernie-tiny")
    ap.add_argument("--pretrain-steps", type=int, default=4000)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--tasks", default="sentiment,cmrc2018,ner")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    steps = 4 if args.quick else args.pretrain_steps

    # 1. pretrain and export (skipped when a finished export is there: re-runs only fine-tune)
    pretrained = out / "pretrained"
    if not (pretrained / "config.json").is_file():
        from zhnlp.data.demo import demo_corpus

        corpus = demo_corpus()
        start = time.time()
        run([py, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}", "--master-addr=127.0.0.1",
             f"--master-port={free_port()}", "-m", "zhnlp", "pretrain", "--recipe", args.recipe, "--data", str(corpus),
             "--output", str(out / "pretrain"), "--overwrite", "--steps", str(steps), "--save-interval", str(steps),
             "--seed", str(args.seed), "--log-interval", "20"], out / "pretrain.log")
        timings = {"pretrain_steps": steps, "pretrain_s": round(time.time() - start, 1)}
        (out / "pretrain.json").write_text(json.dumps(timings) + "\n", encoding="utf-8")
        run([py, "-m", "zhnlp", "export", str(out / "pretrain"), str(pretrained), "--overwrite"], out / "export.log")
    # 2. the same architecture, random weights
    scratch = out / "scratch"
    if not (scratch / "config.json").is_file():
        import zhnlp
        from zhnlp.tokenizers import AutoTokenizer

        config = json.loads((pretrained / "config.json").read_text(encoding="utf-8"))
        zhnlp.AutoModelForMaskedLM.from_config(config, seed=args.seed).save_pretrained(scratch)
        AutoTokenizer.from_pretrained(pretrained).save_pretrained(scratch)
        zhnlp.distributed.shutdown()

    # 3. fine-tune both
    results = {}
    for task in args.tasks.split(","):
        script, settings = FINETUNE[task]
        for start_from, model in (("scratch", scratch), ("pretrained", pretrained)):
            run_dir = out / f"{task}-{start_from}"
            sets = settings + (QUICK if args.quick else []) + [f"seed={args.seed}"]
            if _status(run_dir) != "complete":  # a finished run is kept (re-runs only collect)
                run([py, str(ROOT / "tasks" / script), "--model", str(model), "--output", str(run_dir), "--overwrite",
                     *[x for s in sets for x in ("--set", s)]], out / f"{task}-{start_from}.log")
            metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
            results.setdefault(task, {})[start_from] = {
                "test": {k: metrics["test"][k] for k in METRIC[task]},
                "dev": {k: metrics["dev"][k] for k in METRIC[task]},
                "steps": metrics["steps"], "train_examples": metrics["train_examples"],
                "time_s": metrics["time_s"]}
    done = out / "pretrain.json"  # written when this directory's model was pretrained
    timings = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else {"pretrain_steps": steps}
    steps = timings["pretrain_steps"]
    summary = {"recipe": args.recipe, "nproc": args.nproc, "quick": args.quick, **timings, "results": results,
               "finetune_settings": {t: FINETUNE[t][1] for t in results}}
    (out / "results.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    # 4. the table
    print(f"\n{args.recipe}, pretrained {steps} steps; test scores (held-out 20% for CMRC2018):\n")
    print("| task | metric | from scratch | pretrained |")
    print("|---|---|---|---|")
    for task, by_start in results.items():
        for metric in METRIC[task]:
            cells = [by_start[s]["test"][metric] for s in ("scratch", "pretrained")]
            scale = 1 if task == "cmrc2018" else 100  # CMRC2018's metric is already in percent
            print(f"| {task} | {metric} | {cells[0] * scale:.2f} | {cells[1] * scale:.2f} |")
    print(f"\nwritten: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
