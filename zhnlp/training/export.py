"""``zhnlp export CHECKPOINT DIR``: a training checkpoint -> a transformers-format directory.

The model weights are read from the distributed checkpoint (whatever layout wrote it) into a
model built for this process's layout, written by ``save_pretrained`` (config.json +
safetensors, loadable by transformers and by zhnlp: ``AutoModelForMaskedLM`` for an encoder,
``AutoModelForCausalLM`` for an ERNIE 4.5 decoder) together with the tokenizer the corpus was
preprocessed with. The family and head follow the checkpoint's ``model["model_type"]``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from zhnlp.errors import CheckpointError
from zhnlp.fileio import swap_directory


def export(checkpoint: str | Path, output: str | Path, overwrite: bool = False) -> Path:
    """Write the pretrained model of ``checkpoint`` (a step directory or a run's checkpoints
    folder, newest complete one; masked LM or causal LM, as trained) and its tokenizer to ``output``.

    An ``output`` that holds anything is refused unless ``overwrite``; then it must be a model
    directory (it has a config.json: zhnlp never replaces a folder of other files), and it is
    replaced as a whole once the new model is complete (an earlier model's extra shards or
    tokenizer files cannot linger beside the new one)."""
    from megatron.core import dist_checkpointing

    from zhnlp import distributed
    from zhnlp.distributed import cpu
    from zhnlp.models.common.pretrained import PretrainedModel
    from zhnlp.training.checkpoint import unreadable_as_checkpoint_error
    from zhnlp.training.config import RunConfig

    out = Path(output)
    _check_target(out, overwrite)
    path = _loadable(Path(checkpoint))
    info = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    distributed.layout()
    run = RunConfig(recipe=info.get("recipe", "?"), model=info["model"])  # family and head from model_type
    model = PretrainedModel.from_config(run.family, run.architecture(), run.head)
    with cpu.device_mode(), unreadable_as_checkpoint_error(path):
        template = {f"model{i}": c.sharded_state_dict() for i, c in enumerate(model.chunks)}
        state = dist_checkpointing.load(template, str(path / "model"))
    for i, chunk in enumerate(model.chunks):
        chunk.load_state_dict(state[f"model{i}"])
    name = info.get("tokenizer")
    if name and distributed.layout().rank == 0:
        from zhnlp.tokenizers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name)
    else:
        tokenizer = None
    save_model_directory(model, tokenizer, out)
    return out


def save_model_directory(model, tokenizer, directory: Path) -> None:
    """Write ``model`` (collective) and ``tokenizer`` (if given; rank 0) into ``DIRECTORY.incomplete``,
    then swap that in for ``directory`` as a whole, so that an interrupted save leaves the previous
    model intact and no file of it lingers beside the new one."""
    from zhnlp import distributed

    work = directory.with_name(directory.name + ".incomplete")
    rank0 = distributed.layout().rank == 0
    if rank0 and work.exists():
        shutil.rmtree(work)
    distributed.barrier()
    model.save_pretrained(work)
    if rank0:
        if tokenizer is not None:
            tokenizer.save_pretrained(work)
        swap_directory(work, directory)
    distributed.barrier()


def _loadable(path: Path) -> Path:
    """The checkpoint to export: ``path`` itself when it is a step directory (which must be whole),
    else the newest loadable one under ``path`` or ``path/checkpoints``, naming newer damaged ones
    on stderr. Reads only files, so every rank of a torchrun export makes the same choice."""
    import os

    from zhnlp.training.checkpoint import checkpoint_dirs, damaged_note, newest_loadable, problem

    if (path / "trainer.json").exists() or (path / "model").is_dir():
        why = "an unfinished save, never marked complete" if path.name.endswith(".incomplete") else problem(path)
        if why is not None:
            earlier = [p for p in checkpoint_dirs(path.parent) if p.name < path.name and problem(p) is None]
            hint = f"export an earlier one, e.g. {earlier[-1]}" if earlier else "restore its files"
            raise CheckpointError(f"checkpoint {path} is damaged ({why}); {hint}.")
        return path
    root = path if checkpoint_dirs(path) else path / "checkpoints"
    found, damaged = newest_loadable(root)
    if found is None:
        raise CheckpointError(f"no complete checkpoint at {path}; pass a step_NNNNNNN directory or the run "
                              "directory that holds checkpoints/.")
    if os.environ.get("RANK", "0") == "0":
        for p, why in damaged:
            logging.getLogger("zhnlp").warning(damaged_note(p, why, found))
    return found


def _check_target(out: Path, overwrite: bool) -> None:
    from zhnlp.errors import OutputExistsError
    from zhnlp.fileio import entries

    found = entries(out)
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"export target {out} is a file; pass a directory to write the model into.")
    if found and not overwrite:
        raise OutputExistsError(f"export target {out} already holds {', '.join(found[:5])}; pass --overwrite to "
                                "replace that model, or choose another directory.")
    if found and not (out / "config.json").is_file():
        raise OutputExistsError(f"export target {out} holds files but no config.json, so it is not a model "
                                "directory; zhnlp will not replace it even with --overwrite: choose another directory.")


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a training checkpoint as a transformers model directory")
    p.add_argument("checkpoint", help="step_NNNNNNN directory, or a run directory (newest complete checkpoint)")
    p.add_argument("output", help="directory to write (config.json, model.safetensors, tokenizer files); "
                                  "must be new or empty unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace the model directory already at OUTPUT")
    p.set_defaults(func=lambda args: print(export(args.checkpoint, args.output, overwrite=args.overwrite)) or 0)
