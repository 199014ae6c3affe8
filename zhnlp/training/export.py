"""``zhnlp export CHECKPOINT DIR``: a training checkpoint -> a transformers-format directory.

The model weights are read from the distributed checkpoint (whatever layout wrote it) into a
model built for this process's layout, written by ``save_pretrained`` (config.json +
safetensors, loadable by ``zhnlp.AutoModelForMaskedLM`` and by transformers) together with
the tokenizer the corpus was preprocessed with.
"""

from __future__ import annotations

import json
from pathlib import Path

from zhnlp.errors import CheckpointError


def export(checkpoint: str | Path, output: str | Path) -> Path:
    """Write the masked-LM model of ``checkpoint`` (a step directory or a run's checkpoints
    folder, newest complete one) and its tokenizer to ``output``."""
    from megatron.core import dist_checkpointing

    from zhnlp import distributed
    from zhnlp.distributed import cpu
    from zhnlp.models.common.pretrained import PretrainedModel
    from zhnlp.models.ernie import FAMILY, ErnieConfig
    from zhnlp.training.checkpoint import latest

    path = Path(checkpoint)
    if not (path / "trainer.json").is_file():
        found = latest(path) or latest(path / "checkpoints")
        if found is None:
            raise CheckpointError(f"no complete checkpoint at {path}; pass a step_NNNNNNN directory or the run "
                                  "directory that holds checkpoints/.")
        path = found
    info = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    distributed.layout()
    model = PretrainedModel.from_config(FAMILY, ErnieConfig.from_dict(info["model"]), "mlm")
    with cpu.device_mode():
        template = {f"model{i}": c.sharded_state_dict() for i, c in enumerate(model.chunks)}
        state = dist_checkpointing.load(template, str(path / "model"))
    for i, chunk in enumerate(model.chunks):
        chunk.load_state_dict(state[f"model{i}"])
    out = Path(output)
    model.save_pretrained(out)
    tokenizer = info.get("tokenizer")
    if tokenizer and distributed.layout().rank == 0:
        from zhnlp.tokenizers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(out)
    return out


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a training checkpoint as a transformers model directory")
    p.add_argument("checkpoint", help="step_NNNNNNN directory, or a run directory (newest complete checkpoint)")
    p.add_argument("output", help="directory to write (config.json, model.safetensors, tokenizer files)")
    p.set_defaults(func=lambda args: print(export(args.checkpoint, args.output)) or 0)
