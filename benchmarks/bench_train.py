"""Pretraining speed: tokens/s and MFU of the zhnlp trainer, and on CPU its ratio to a plain
transformers ``ErnieForMaskedLM`` training step at the same shape.

The zhnlp side is the real engine (:class:`zhnlp.training.trainer.Trainer`: megatron DDP,
megatron's Adam with gradient clipping, the LR scheduler, the forward/backward schedule) on
synthetic masked-LM batches (15% of the tokens predicted), so no corpus is needed. The
transformers side is the usual loop: forward with labels, ``backward``, ``clip_grad_norm_``,
``torch.optim.AdamW`` step, ``zero_grad``. Same architecture, batch and data; dropout as in the
recipe. The two sides alternate step by step (ABBA) and each figure is the median ms/step.
ratio = transformers_ms / zhnlp_ms (> 1: zhnlp faster).

Run:

    .venv/bin/python benchmarks/bench_train.py [--recipe ernie-3.0-mini] [--seq 128]
        [--micro-batch 8] [--global-batch 8] [--steps 8] [--threads 2] [--precision fp32]
        [--peak-tflops 1.0] [--no-compare] [--json]

Under torchrun (any TP/PP/DP layout; the transformers comparison is skipped, it has no such
layout):

    torchrun --nproc-per-node 2 benchmarks/bench_train.py --recipe ernie-3.0-base --tp 2 \\
        --precision bf16 --peak-tflops 989

MFU = model FLOPs per step (6 x parameters in the matmuls x tokens, plus attention) / time /
(peak per device x devices). On a CPU the peak is what you pass (``--peak-tflops``); the
default 1.0 makes the column read as achieved TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def synthetic_batch(batch: int, seq: int, vocab: int, seed: int) -> dict:
    """Random Chinese-vocabulary tokens, [CLS] first, 15% of positions predicted."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(670, min(vocab, 8000), (batch, seq), generator=g)  # the CJK block of the BERT vocab
    ids[:, 0] = 101
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(batch, seq, generator=g) < 0.15
    labels[chosen] = ids[chosen]
    ids = ids.masked_fill(chosen, 103)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
            "labels": labels}


def build_trainer(args, batches):
    from zhnlp.models.common.pretrained import PretrainedModel
    from zhnlp.models.ernie import FAMILY, ErnieConfig
    from zhnlp.training.config import override, recipe
    from zhnlp.training.trainer import Trainer

    cfg = override(recipe(args.recipe), tp=args.tp, pp=args.pp, steps=10_000, seq_length=args.seq,
                   micro_batch_size=args.micro_batch, global_batch_size=args.global_batch,
                   precision=args.precision, peak_tflops=args.peak_tflops, warmup_steps=0,
                   output=str(Path(tempfile.gettempdir()) / "zhnlp-bench-train"))
    arch = ErnieConfig.from_dict(cfg.model)
    return Trainer(cfg, model=lambda run: PretrainedModel.from_config(FAMILY, arch, "mlm", seed=cfg.seed, **run),
                   batches=batches), cfg


def transformers_side(cfg, batch):
    import transformers

    fields = dict(cfg.model)
    fields.pop("model_type")
    model = transformers.ErnieForMaskedLM(transformers.ErnieConfig(**fields)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def step():
        out = model(**batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(out.loss)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="ernie-3.0-mini")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--peak-tflops", type=float, default=1.0)
    ap.add_argument("--no-compare", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    from zhnlp import distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = world // (args.tp * args.pp)
    per_rank = args.global_batch // dp
    # the same global batch every step (its rows split over the data-parallel ranks)
    cache = {}

    def batches(step):
        lay = distributed.layout()
        if "b" not in cache:
            full = synthetic_batch(args.global_batch, args.seq, 21128, seed=0)
            mine = {k: v[lay.dp_rank * per_rank:(lay.dp_rank + 1) * per_rank] for k, v in full.items()}
            cache["b"] = [{k: v[i:i + args.micro_batch] for k, v in mine.items()}
                          for i in range(0, per_rank, args.micro_batch)]
        return cache["b"]

    trainer, cfg = build_trainer(args, batches)
    compare = world == 1 and not args.no_compare and args.precision == "fp32"
    hf_step = transformers_side(cfg, synthetic_batch(args.global_batch, args.seq, 21128, seed=0)) if compare else None

    times = {"zhnlp": [], "transformers": []}
    metrics = []
    for i in range(args.warmup + args.steps):
        order = ["zhnlp", "transformers"] if i % 2 == 0 else ["transformers", "zhnlp"]
        for side in order:
            if side == "transformers" and hf_step is None:
                continue
            start = time.perf_counter()
            if side == "zhnlp":
                m = trainer.train_step()
            else:
                hf_step()
            elapsed = time.perf_counter() - start
            if i >= args.warmup:
                times[side].append(elapsed)
                if side == "zhnlp":
                    metrics.append(m)
    zh = statistics.median(times["zhnlp"])
    tokens = args.global_batch * args.seq
    result = {"recipe": args.recipe, "layout": {"tp": args.tp, "pp": args.pp, "dp": dp}, "precision": args.precision,
              "batch": [args.global_batch, args.seq], "zhnlp_ms": round(zh * 1e3, 1),
              "tokens_per_s": round(tokens / zh, 1),
              "mfu": round(statistics.median(m["mfu"] for m in metrics), 4), "peak_tflops": args.peak_tflops}
    if compare:
        hf = statistics.median(times["transformers"])
        result.update(transformers_ms=round(hf * 1e3, 1), ratio=round(hf / zh, 3))
    if distributed.layout().rank == world - 1:
        if args.json:
            print(json.dumps(result))
        else:
            print(f"{args.recipe} tp={args.tp} pp={args.pp} dp={dp} {args.precision} batch {args.global_batch}x{args.seq}: "
                  f"zhnlp {result['zhnlp_ms']:.1f} ms/step, {result['tokens_per_s']:,.0f} tokens/s, "
                  f"MFU {result['mfu']:.2%} of {args.peak_tflops} TFLOP/s per device")
            if compare:
                print(f"transformers ErnieForMaskedLM {result['transformers_ms']:.1f} ms/step -> "
                      f"ratio {result['ratio']:.2f}x (goal >= 1.0x)")
    distributed.barrier()
    distributed.shutdown()


if __name__ == "__main__":
    main()
