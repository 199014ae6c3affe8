"""Run under torchrun: pretrain a tiny ALBERT (masked LM, tests/tiny.py's sizes with the BERT-Chinese vocabulary)
for a few steps under the layout on the command line, then

* write the per-step losses and gradient norms, and whether every copy of every shared layer weight (over this
  rank's chunks and all pipeline stages) is bit-identical (``OUT/<tag>.json``, from the logging rank);
* save_pretrained the trained model (``OUT/<tag>-saved``), which transformers must load.

With ``--stop-at N`` the run saves distributed checkpoints every 2 steps and ends after step N; ``--resume`` continues
the run directory's newest one (``--run-dir`` names the directory, to resume under another layout).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for tests.tiny

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from tests.tiny import CONFIGS  # noqa: E402
from zhnlp import distributed  # noqa: E402
from zhnlp.conversion import engine  # noqa: E402
from zhnlp.training import override, recipe  # noqa: E402
from zhnlp.training.trainer import Trainer  # noqa: E402


def shared_copies(model) -> dict[str, list[torch.Tensor]]:
    """Global parameter name -> every copy of that shared layer weight in the model (all ranks of the pipeline
    group; this rank's TP shard)."""
    from megatron.core import parallel_state as ps

    mine: dict[str, list[torch.Tensor]] = {}
    for chunk in model.chunks:
        names = engine.global_param_names(chunk)
        for local, p in chunk.named_parameters():
            if hasattr(p, "shared_layer"):
                mine.setdefault(names[local], []).append(p.detach().float().clone())
    stages = [None] * ps.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(stages, mine, group=ps.get_pipeline_model_parallel_group())
    every: dict[str, list[torch.Tensor]] = {}
    for stage in stages:
        for name, tensors in stage.items():
            every.setdefault(name, []).extend(tensors)
    return every


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out", type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--config", default="albert")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--vpp", type=int, default=None)
    ap.add_argument("--recompute", default=None)
    ap.add_argument("--distributed-optimizer", action="store_true")
    ap.add_argument("--run-dir", default=None, help="run directory under OUT (default: the tag)")
    ap.add_argument("--stop-at", type=int, default=None, help="end after this step (a checkpoint every 2 steps)")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = override(recipe("ernie-debug"), prefix=args.data, steps=args.steps, tp=args.tp, pp=args.pp, vpp=args.vpp,
                   recompute=args.recompute, distributed_optimizer=args.distributed_optimizer or None,
                   output=str(args.out / (args.run_dir or args.tag)))
    cfg.model = dict(CONFIGS[args.config], vocab_size=21128, max_position_embeddings=64)
    cfg.data.seq_length = 32
    if args.stop_at is not None:
        cfg.checkpoint.save_interval = 2
    cfg.checkpoint.resume = args.resume
    trainer = Trainer(cfg)
    history = trainer.train(steps=args.stop_at)
    copies = shared_copies(trainer.model)
    held_twice = {name: tensors for name, tensors in copies.items() if len(tensors) > 1}
    identical = torch.tensor(float(all(torch.equal(t, tensors[0]) for tensors in held_twice.values() for t in tensors)))
    dist.all_reduce(identical, op=dist.ReduceOp.MIN)  # every rank's copies (each TP shard, each DP replica)
    trainer.model.save_pretrained(args.out / f"{args.tag}-saved")
    if dist.get_rank() == trainer.logging_rank:
        (args.out / f"{args.tag}.json").write_text(json.dumps(
            {"loss": [m["loss"] for m in history], "grad_norm": [m["grad_norm"] for m in history],
             "copies": sum(len(t) for t in held_twice.values()), "identical": bool(identical)}))
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
