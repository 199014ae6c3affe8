"""Measured learning from real pretrained Chinese weights: fine-tune a fetched model on real tasks on this CPU and
set the results beside a from-scratch model and a TF-IDF + logistic-regression baseline.

1. ``zhnlp models fetch MODEL`` (default ``m3e-small``: a 4-layer BERT, hidden 512, further trained on Chinese
   sentence pairs; research / non-commercial licence, printed when fetched).
2. Fine-tune it with the ``tasks/`` recipes, shortened for 2 CPU cores (``FINETUNE`` below; each run is kept under
   about an hour by the subsets and lengths chosen there):
   ``sentiment`` (sentiment-reviews, accuracy), ``lcqmc`` (sentence pairs, accuracy), ``ner`` (MSRA entity F1),
   ``mrc`` (DRCD converted to Simplified + the CMRC2018 trial training articles, EM/F1 on the held-out trial
   articles); ``stsb`` scores the model's sentence embeddings on STS-B-zh's test split without fine-tuning
   (Spearman of the cosines, the pooling from the model card).
3. The TF-IDF + LR baseline (``zhnlp.baselines``) on the same training data for the classification tasks.
4. OUTPUT/results.json and a Markdown table (the README's table comes from here). The from-scratch column is the
   ernie-tiny of ``scripts/pretrained_vs_scratch.py`` (README), where that script measured the task.

    .venv/bin/python scripts/real_weights.py [--model m3e-small] [--output runs/real-weights]
        [--tasks sentiment,lcqmc,ner,stsb,mrc] [--seed 1234] [--quick]

``--quick`` shrinks every run to a few steps to check the script itself (numbers meaningless). Finished runs are
kept: a second call only does what is missing (e.g. one task at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# recipe script, settings (CPU-sized: subsets and lengths chosen so that each run takes well under an hour)
FINETUNE = {
    "sentiment": ("sentiment_reviews.py", ["epochs=4", "lr=5e-5", "max_length=160", "batch_size=32",
                                           "eval_batch_size=128"]),
    "lcqmc": ("lcqmc.py", ["epochs=1", "lr=5e-5", "max_length=64", "batch_size=32", "eval_batch_size=256",
                           "max_train_examples=40000"]),
    "ner": ("msra_ner.py", ["epochs=1", "lr=1e-4", "max_length=128", "batch_size=32", "eval_batch_size=128",
                            "max_train_examples=20000"]),
    "mrc": ("drcd_cmrc2018.py", ["epochs=1", "lr=1e-4", "max_length=256", "doc_stride=128", "batch_size=32",
                                 "eval_batch_size=64"]),
}
QUICK = ["max_steps=3", "max_train_examples=200", "log_interval=1"]
METRIC = {"sentiment": ("accuracy", "macro_f1"), "lcqmc": ("accuracy", "macro_f1"), "mrc": ("em", "f1"),
          "ner": ("f1", "precision", "recall"), "stsb": ("spearman", "pearson")}
PERCENT_ALREADY = {"mrc", "stsb"}  # metrics already in percent
# ernie-tiny from scratch, fine-tuned by scripts/pretrained_vs_scratch.py with the same kind of settings (README)
SCRATCH = {"sentiment": {"accuracy": 81.11, "macro_f1": 80.89}, "mrc": {"em": 0.00, "f1": 11.52},
           "ner": {"f1": 14.85}}
BASELINE_DATA = {"sentiment": "sentiment-reviews", "lcqmc": "lcqmc"}


def run(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` with its output into ``log``; stop with the log's tail when it fails."""
    print("$", " ".join(map(str, cmd)), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "PYTHONWARNINGS": "ignore"}
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.call([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if code != 0:
        sys.exit(f"failed ({code}): {' '.join(map(str, cmd))}\n" + log.read_text(encoding="utf-8")[-4000:])


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tfidf_baseline(task: str, limit: int | None) -> dict:
    """Accuracy and macro-F1 (0-1) of the TF-IDF + LR baseline trained on the first ``limit`` training rows."""
    from zhnlp.baselines import TfidfClassifier
    from zhnlp.data.fetch import fetch
    from zhnlp.metrics import classification_scores

    data = fetch(BASELINE_DATA[task])
    train, test = _read(data / "train.jsonl")[:limit], _read(data / "test.jsonl")

    def item(row):
        return (row["text"], row["text_pair"]) if "text_pair" in row else row["text"]

    start = time.time()
    clf = TfidfClassifier().fit([item(r) for r in train], [r["label"] for r in train])
    predicted = clf.predict([item(r) for r in test])
    scores = classification_scores(predicted, [r["label"] for r in test])
    return {"accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"], "train_examples": len(train),
            "time_s": round(time.time() - start, 1)}


def _limit(settings: list[str]) -> int | None:
    found = [int(s.split("=")[1]) for s in settings if s.startswith("max_train_examples=")]
    return found[-1] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="m3e-small", help="a fetchable model name (zhnlp models list) or a directory")
    ap.add_argument("--output", type=Path, default=ROOT / "runs" / "real-weights")
    ap.add_argument("--tasks", default="sentiment,lcqmc,ner,stsb,mrc")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = sorted(set(tasks) - set(METRIC))
    if unknown:
        ap.error(f"unknown task(s) {unknown}; choose from {', '.join(METRIC)}")
    if not Path(args.model).is_dir():
        run([py, "-m", "zhnlp", "models", "fetch", args.model], out / "fetch.log")
        print((out / "fetch.log").read_text(encoding="utf-8"))  # the licence of the weights

    path = out / "results.json"
    results = json.loads(path.read_text(encoding="utf-8"))["results"] if path.is_file() else {}
    for task in tasks:
        entry = results.get(task, {})
        if task == "stsb":
            if "model" not in entry or args.quick:
                from zhnlp.data.fetch import fetch
                from zhnlp.pipelines.sentence_embeddings import evaluate_sts

                start = time.time()
                scores = evaluate_sts(args.model, fetch("stsb-zh") / "test.jsonl", batch_size=64)
                entry["model"] = {"test": {k: scores[k] for k in METRIC[task]}, "pooling": scores["pooling"],
                                  "pairs": scores["total"], "time_s": round(time.time() - start, 1),
                                  "fine_tuned": False}
        else:
            script, settings = FINETUNE[task]
            run_dir = out / task
            sets = settings + (QUICK if args.quick else []) + [f"seed={args.seed}"]
            metrics_file = run_dir / "metrics.json"
            done = metrics_file.is_file() and json.loads(metrics_file.read_text(encoding="utf-8")).get(
                "status") == "complete"
            if not done:
                run([py, ROOT / "tasks" / script, "--model", args.model, "--output", run_dir, "--overwrite",
                     *[x for s in sets for x in ("--set", s)]], out / f"{task}.log")
            metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
            entry["model"] = {"test": {k: metrics["test"][k] for k in METRIC[task]},
                              "dev": {k: metrics["dev"][k] for k in METRIC[task]}, "steps": metrics["steps"],
                              "train_examples": metrics["train_examples"], "time_s": metrics["time_s"],
                              "settings": sets}
            if task in BASELINE_DATA and ("baseline" not in entry or args.quick):
                entry["baseline"] = tfidf_baseline(task, 200 if args.quick else _limit(settings))
        results[task] = entry
        summary = {"model": args.model, "seed": args.seed, "quick": args.quick, "results": results}
        path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    print(f"\n{args.model}: test scores, % (CMRC2018: the held-out 20% of the trial articles)\n")
    print(f"| task | metric | {args.model} | ernie-tiny from scratch | TF-IDF + LR | {args.model} time |")
    print("|---|---|---|---|---|---|")
    for task, entry in results.items():
        for metric in METRIC[task]:
            scale = 1 if task in PERCENT_ALREADY else 100
            ours = entry["model"]["test"][metric] * scale
            scratch = SCRATCH.get(task, {}).get(metric)
            base = entry.get("baseline", {}).get(metric)
            cells = [f"{ours:.2f}", "-" if scratch is None else f"{scratch:.2f}",
                     "-" if base is None else f"{base * 100:.2f}", f"{entry['model']['time_s'] / 60:.0f} min"]
            print(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
