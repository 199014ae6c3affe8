"""``save_pretrained``: the family's table run backwards, written as transformers writes it.

Tensor-parallel shards are gathered within each TP group (by the engine); each pipeline stage's first
TP/DP rank splits its stage's tensors into files of at most ``max_shard_size`` with huggingface_hub's own
splitter and writes them. The file names (``model.safetensors``, or ``model-0000i-of-0000N.safetensors``
with ``model.safetensors.index.json``) are numbered over all stages, so the directory is exactly what
transformers writes for the same model and size limit. ``push_to_hub`` uploads the finished directory
with huggingface_hub.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed, fileio
from zhnlp.conversion import engine
from zhnlp.errors import ZhnlpError

logger = logging.getLogger("zhnlp")

SINGLE = "model.safetensors"
_WEIGHT_FILE = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")
INDEX = "model.safetensors.index.json"


class PushToHubError(ZhnlpError):
    """The model was saved locally but could not be uploaded."""


def save(model, directory: Path, max_shard_size: int | str = "50GB") -> None:
    """Write config.json and the safetensors files of ``model`` into ``directory`` (collective)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    lay, bridge = model.layout, model.family.bridge
    if lay.rank == 0:
        if directory.exists() and not directory.is_dir():
            raise NotADirectoryError(f"{directory} is a file; save_pretrained writes into a directory.")
        directory.mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    table = bridge.table(model.config)
    rename = bridge.save_prefix_rename(model.config, model.head)
    writer = lay.dp_rank == 0 and lay.tp_rank == 0  # one writer per pipeline stage
    groups: list[list[str]] = []
    tensors: dict[str, torch.Tensor] = {}
    if lay.dp_rank == 0 or lay.ep > 1:  # expert-parallel peers of a writer sit at other DP ranks: all gather
        from megatron.core import parallel_state as ps

        experts = (ps.get_expert_tensor_parallel_group(), lay.etp, ps.get_expert_model_parallel_group(), lay.ep)
        for chunk in model.chunks:
            gathered = engine.gather_chunk(chunk, table, ps.get_tensor_model_parallel_group(), lay.tp, experts)
            if writer:
                tensors.update({rename(k): v for k, v in gathered.items()})
        constants = getattr(bridge, "constant_weights", None)  # tables transformers stores, zhnlp recomputes
        if writer and lay.pp_rank == 0 and constants is not None:
            dtype = model.transformer_config.params_dtype
            tensors.update({rename(k): v.to(dtype) for k, v in constants(model.config).items()})
        if writer:
            split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
            groups = [sorted(keys) for _, keys in sorted(split.filename_to_tensors.items())]
    # every stage's shard count and sizes, in stage order, to number the files over the whole model
    mine = (groups, {k: _nbytes(tensors[k]) for keys in groups for k in keys}) if writer else None
    plan = [entry for entry in _gather_pp(mine) if entry is not None]  # (shard key lists, sizes) by stage
    total_files = sum(len(g) for g, _ in plan)
    names = [SINGLE] if total_files == 1 else [f"model-{i + 1:05d}-of-{total_files:05d}.safetensors"
                                                for i in range(total_files)]
    if writer:
        first = sum(len(g) for g, _ in plan[:lay.pp_rank])
        for i, keys in enumerate(groups):
            engine.write_safetensors({k: tensors[k] for k in keys}, directory / names[first + i])
    distributed.barrier()
    if lay.rank == 0:
        weight_map, total = {}, 0
        i = 0
        for g, sizes in plan:
            for keys in g:
                weight_map.update({k: names[i] for k in keys})
                i += 1
            total += sum(sizes.values())
        if total_files > 1:
            fileio.write_json(directory / INDEX, {"metadata": {"total_size": total},
                                                  "weight_map": dict(sorted(weight_map.items()))})
        _remove_stale(directory, set(names), keep_index=total_files > 1)
        config = model.config.to_dict(architecture=bridge.hf_architecture(model.config, model.head))
        config["dtype"] = str(model.transformer_config.params_dtype).removeprefix("torch.")
        fileio.write_json(directory / "config.json", config)
    distributed.barrier()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _gather_pp(mine):
    """Every pipeline stage's ``mine`` (None on non-writers), indexed by stage, on every rank."""
    lay = distributed.layout()
    if not dist.is_initialized() or lay.world_size == 1:
        return [mine]
    everything = [None] * lay.world_size
    dist.all_gather_object(everything, (lay.pp_rank, mine))
    by_stage = [None] * lay.pp
    for stage, value in everything:
        if value is not None:
            by_stage[stage] = value
    return by_stage


def _remove_stale(directory: Path, written: set[str], keep_index: bool) -> None:
    """Weight files of an earlier save that the new one does not overwrite would shadow or confuse it."""
    for path in directory.glob("model*.safetensors"):
        if path.name not in written and _WEIGHT_FILE.fullmatch(path.name):  # only names save_pretrained writes
            path.unlink()
    if not keep_index and (directory / INDEX).exists():
        (directory / INDEX).unlink()


def push(directory: Path, repo_id: str | None, *, token=None, private: bool | None = None,
         commit_message: str | None = None, revision: str | None = None, create_pr: bool = False) -> str | None:
    """Upload ``directory`` to hub repo ``repo_id`` (created when missing) on rank 0; every rank gets the
    same outcome. Returns the commit URL on rank 0."""
    repo = repo_id or directory.resolve().name
    lay = distributed.layout()
    problem, url = None, None
    if lay.rank == 0:
        from huggingface_hub import HfApi

        try:
            api = HfApi(token=token)
            api.create_repo(repo, private=private, exist_ok=True, token=token)
            info = api.upload_folder(repo_id=repo, folder_path=str(directory), token=token, revision=revision,
                                     commit_message=commit_message or "Upload model (zhnlp)", create_pr=create_pr)
            url = str(getattr(info, "commit_url", info))
            logger.info("pushed %s to the hub: %s", directory, url)
        except Exception as e:  # network, auth and permission errors all end here with one message
            problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if dist.is_initialized() and lay.world_size > 1:
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem:
        raise PushToHubError(f"the model is saved in {directory}, but pushing it to hub repo {repo!r} failed "
                             f"({problem}); check the token and network, then upload it with "
                             f"`hf upload {repo} {directory}`.")
    return url


def push_options(kwargs: dict) -> dict:
    """transformers' push_to_hub keyword arguments that zhnlp passes on; anything else is refused by name."""
    known = {"repo_id", "token", "private", "commit_message", "revision", "create_pr"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"save_pretrained got unexpected arguments {unknown}; with push_to_hub=True it also takes "
                        f"{sorted(known)}.")
    return dict(kwargs)
