"""Distributed checkpoints with resume, written so that an interrupted save never looks complete.

Layout under ``OUTPUT/checkpoints``::

    step_0000010/              a complete checkpoint (renamed into place as the last act)
        model/                 megatron-core dist_checkpointing: model and optimizer state,
                               sharded tensors with global shapes, so any TP/PP/DP layout can load it
        trainer.json           step, data position, scheduler state, loss scaler, run config
        rng/rank_00000.safetensors   per-rank RNG state (restored when the layout is unchanged)
        manifest.json          relative path -> size in bytes of every file above, written last
    step_0000020.incomplete/   a save in progress or one that crashed: ignored, removed by the next save

A save writes into ``step_N.incomplete``, waits for every rank, and rank 0 writes the manifest
and renames the directory to ``step_N``; then checkpoints beyond the newest ``keep`` are deleted.
``latest(dir)`` returns the newest complete one.

With ``--async-save`` (``save(..., background=True)``) the state is captured when the save is called and
written by a forked process (megatron's async dist_checkpointing, ``AsyncCallsQueue``) while training goes on;
trainer.json and the RNG files go into ``step_N.incomplete`` at once. :func:`finish_saves` (at every step, without
waiting; before the next save, at the end of training and on a stop signal, waiting) completes a save whose
write every rank has finished: megatron's metadata, then the manifest and the rename as above. A process
killed during the background write therefore leaves only ``step_N.incomplete``.

A complete checkpoint can still be damaged afterwards (a file deleted, a disk that filled up
during a copy). :func:`problem` names what is wrong with one from its files alone (the manifest;
for checkpoints written before manifests, the files megatron's ``.metadata`` names, read with a
restricted unpickler that admits only checkpoint-metadata classes), and :func:`resume` (rank 0
decides, every rank follows) takes the newest checkpoint without a problem, saying which newer
ones it passed over and why; when every one is damaged it stops with a CheckpointError instead
of quietly starting from step 0.

The distributed optimizer's state is stored in model space, in the same dist_checkpointing directory: per
parameter its fp32 main copy and Adam moments at the parameter's shape, under the parameter's own sharding
(megatron's "fully reshardable" layout, written by our own code: megatron 0.16's cuts the gathered buffers at
offsets that ignore the padding between buckets), with the optimizers' common state (param groups with Adam's
step, loss scaler). So it resumes exactly under any other DP, TP, PP or EP layout (tested DP=2 -> 1, TP=2 -> DP=2,
PP=2 -> 1, TP=2 -> PP=2, EP=2 -> 1). Saving costs each data-parallel rank the full model-space state of its
model-parallel part for a moment (one sum over the data-parallel group completes it). Checkpoints written before
this format (``distopt/mp_rank_TT_PPP.pt``, the dp-zero gather) still resume, in their own layout only. The
optimizer state restarts, with a message, when the run switches between the plain and the distributed optimizer.

Under ``--fsdp`` the model and optimizer state are written in the same format, each tensor cut to the
rows this rank's FSDP shard holds (:mod:`zhnlp.training.fsdp`): they resume exactly and reshard like the
plain optimizer's (e.g. saved under FSDP, continued on one process without it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import pickle
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.distributed import cpu
from zhnlp.errors import CheckpointError
from zhnlp.training import fsdp

logger = logging.getLogger("zhnlp")

_COMPLETE = re.compile(r"^step_(\d{7})$")
MANIFEST = "manifest.json"


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _COMPLETE.match(p.name)), key=lambda p: p.name)


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (not verified: see :func:`newest_loadable`)."""
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


# ------------------------------------------------------------------------------ verification
_INFO_KEYS = ("step", "scheduler", "layout", "distributed_optimizer", "model")


def _write_manifest(work: Path) -> None:
    files = {f.relative_to(work).as_posix(): f.stat().st_size for f in sorted(work.rglob("*")) if f.is_file()}
    (work / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1) + "\n", encoding="utf-8")


def _json_file(path: Path, name: str) -> tuple[dict | None, str | None]:
    """(the object in ``path``, None) or (None, what is wrong with it)."""
    if not path.is_file():
        return None, f"{name} is missing"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return None, f"{name} is not UTF-8 text"
    except json.JSONDecodeError as e:
        return None, f"{name} is not valid JSON ({e.msg} at line {e.lineno})"
    if not isinstance(value, dict):
        return None, f"{name} does not hold a JSON object"
    return value, None


def _size_problem(path: Path, rel: str, size: int, exact: bool) -> str | None:
    file = path / rel
    if not file.is_file():
        return f"{rel} is missing"
    actual = file.stat().st_size
    if actual != size if exact else actual < size:
        return f"{rel} has {actual:,} bytes, {'' if exact else 'at least '}{size:,} expected"
    return None


class _NotMetadata(Exception):
    """A ``.metadata`` that names a class outside checkpoint metadata: not ours to judge."""


class _MetadataUnpickler(pickle.Unpickler):
    """Reads torch.distributed.checkpoint's ``.metadata`` admitting only the plain-data classes it
    is made of (tensor and chunk descriptions, storage locations, dtypes), so that reading it for
    a check can never run code; anything else raises _NotMetadata."""

    _ALLOWED = {
        "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                                  "TensorStorageMetadata", "BytesStorageMetadata",
                                                  "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
        "torch.distributed.checkpoint.planner": {"SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"},
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "torch": {"Size"},
    }

    def find_class(self, module: str, name: str):
        if name in self._ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _NotMetadata(f"{module}.{name}")


def _storage_problem(path: Path) -> str | None:
    """For a checkpoint without a manifest: every byte range megatron's ``model/.metadata`` records
    must exist in the file it names."""
    meta_file = path / "model" / ".metadata"
    try:
        with open(meta_file, "rb") as f:
            meta = _MetadataUnpickler(f).load()
        storage = meta.storage_data.values()
        needed: dict[str, int] = {}
        for item in storage:
            needed[item.relative_path] = max(needed.get(item.relative_path, 0), item.offset + item.length)
    except _NotMetadata:
        return None  # a metadata format this check does not know: the load itself will tell
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError):
        return "model/.metadata is damaged"
    for rel, size in sorted(needed.items()):
        why = _size_problem(path / "model", rel, size, exact=False)
        if why is not None:
            return f"model/{why}"
    return None


def problem(path: Path) -> str | None:
    """What makes the complete checkpoint ``path`` unloadable, in a few words (e.g.
    ``model/__0_0.distcp is missing``), or None when every file it needs is there, whole.

    Checked: trainer.json (valid, with the fields resuming reads, the step of the directory's
    name); the RNG file of every rank and the distributed-optimizer file of every model-parallel
    rank of the layout that saved it; then every file's size against the manifest or, for
    checkpoints saved before manifests, the byte ranges megatron's ``.metadata`` records. Reads
    only small files and file sizes, so every rank reaches the same verdict on a shared filesystem."""
    info, why = _json_file(path / "trainer.json", "trainer.json")
    if why is not None:
        return why
    missing = [k for k in _INFO_KEYS if k not in info]
    if missing:
        return f"trainer.json lacks {', '.join(missing)}"
    named = _COMPLETE.match(path.name)
    if named and int(named.group(1)) != info["step"]:
        return f"trainer.json says step {info['step']!r}, the directory step {int(named.group(1))}"
    try:
        tp, pp, dp = (int(info["layout"][k]) for k in ("tp", "pp", "dp"))
    except (KeyError, TypeError, ValueError):
        return f"trainer.json has no valid layout ({info['layout']!r})"
    needed = [f"rng/rank_{r:05d}.safetensors" for r in range(tp * pp * dp)] + ["model/metadata.json",
                                                                              "model/.metadata"]
    if info["distributed_optimizer"] and info.get("optimizer_format") != DISTOPT_FORMAT:  # the legacy format
        needed += [f"distopt/mp_rank_{t:02d}_{p:03d}.pt" for t in range(tp) for p in range(pp)]
    for rel in needed:
        if not (path / rel).is_file():
            return f"{rel} is missing"
    if not (path / MANIFEST).exists():
        return _storage_problem(path)
    manifest, why = _json_file(path / MANIFEST, MANIFEST)
    if why is not None:
        return why
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(n, int) for n in files.values()):
        return f"{MANIFEST} has no valid file list"
    for rel, size in sorted(files.items()):
        why = _size_problem(path, rel, size, exact=True)
        if why is not None:
            return why
    return None


def newest_loadable(root: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint under ``root`` without a :func:`problem` (None when there
    is no checkpoint at all), and the newer damaged ones passed over, each with its problem.

    Raises:
        CheckpointError: checkpoints exist but every one of them is damaged.
    """
    damaged = []
    for path in reversed(checkpoint_dirs(root)):
        why = problem(path)
        if why is None:
            return path, damaged
        damaged.append((path, why))
    if damaged:
        listed = "; ".join(f"{p.name}: {why}" for p, why in damaged)
        raise CheckpointError(f"no loadable checkpoint in {root} ({listed}); restore the damaged files, or move "
                              "these directories aside to start from step 0.")
    return None, []


def damaged_note(path: Path, why: str, instead: Path) -> str:
    """The one line saying that ``path`` is passed over for ``instead``."""
    return (f"checkpoint {path} is damaged ({why}); using {instead.name} instead (the damaged one is left "
            f"in place for inspection)")


def resume(trainer) -> Path | None:
    """``--resume``: load the newest loadable checkpoint under OUTPUT/checkpoints into ``trainer``
    and return it, or say that the run starts from step 0 when there is none (collective). Rank 0
    chooses and broadcasts the choice, so every rank loads the same checkpoint."""
    root = trainer.output / "checkpoints"
    choice = [None, [], None]  # path, notes, error
    if dist.get_rank() == 0:
        try:
            found, damaged = newest_loadable(root)
            choice = [None if found is None else str(found), [damaged_note(p, why, found) for p, why in damaged],
                      None]
        except CheckpointError as e:
            choice = [None, [], str(e)]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(choice, src=0)
    found, notes, error = choice
    if error is not None:
        raise CheckpointError(error)
    if dist.get_rank() == 0:
        for note in notes:
            logger.warning(note)
        if found is None:
            logger.info("--resume: no checkpoint in %s yet; starting from step 0", root)
    if found is None:
        return None
    load(trainer, Path(found))
    if dist.get_rank() == 0:
        logger.info("resumed from %s (step %d)", found, trainer.step)
    return Path(found)


# The distributed optimizer's state in model space (megatron's "fully reshardable" layout): per parameter its main
# parameter and Adam moments as tensors of the parameter's shape, stored under the parameter's own sharding, so that
# any DP/TP/PP (and EP) layout can load them; a chained optimizer's (MoE) keys are the same. Each rank loads every
# parameter of its own and megatron's ``load_parameter_state_from_fully_reshardable`` keeps this rank's slice.
DISTOPT_FORMAT = "model_space"
def _sharded_state(trainer, with_optimizer: bool, loading: bool = False):
    # the chunks inside megatron's DDP wrappers: their keys carry no "module." prefix
    if trainer.cfg.parallel.fsdp:  # the same format, each tensor cut to this rank's FSDP rows
        model = {f"model{i}": fsdp.sharded_state_dict(chunk.module) for i, chunk in enumerate(trainer.chunks)}
    else:
        model = {f"model{i}": _module_state(chunk.module) for i, chunk in enumerate(trainer.chunks)}
    state = dict(model)
    if with_optimizer:
        # when loading, the optimizer first creates its (empty) state so that there is a slot per tensor
        with fsdp.stable_local_tensors() if trainer.cfg.parallel.fsdp else contextlib.nullcontext():
            if trainer.cfg.optimizer.distributed_optimizer:
                # the common state is the saving layout's (as the first rank has it): a layout may chain another
                # number of optimizers (MoE: experts apart from the rest, or not), and the tensors go by their keys
                inner = _inner(trainer.optimizer)
                state["optimizer"] = {"common": [opt.state_dict() for opt in inner] if not loading else None,
                                      "params": {i: _model_space_state(opt, model, loading)
                                                 for i, opt in enumerate(inner)}}
            else:
                state["optimizer"] = trainer.optimizer.sharded_state_dict(model, is_loading=loading)
    if trainer.cfg.parallel.fsdp:
        trainer.fsdp_reshaped = fsdp.unprepend(state)  # the shapes to restore after a load
    return state


def _model_space_state(opt, model_state: dict, loading: bool = False) -> dict:
    """One distributed optimizer's parameter state in model space (for ``loading``: the same entries, empty): per
    parameter, by its index in the order megatron's loader expects (buffer by buffer, as ``param_index_map`` lists
    them), the main parameter and moments at the parameter's shape, each as a copy of the parameter's own sharded
    tensor (same sharding and replica id: the main replica writes it).

    Each data-parallel rank fills the rows it owns into flat zero buffers that one sum over the data-parallel
    group completes (the ranks' ranges partition every parameter). megatron 0.16's own save for this layout cuts
    the gathered buffer by ``param_index_map`` offsets, which do not account for the padding between buckets: a
    parameter in a bucket of its own (the tied embedding under pipeline parallelism) got another's values."""
    from collections import ChainMap
    from dataclasses import replace

    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory
    from megatron.core.dist_checkpointing.utils import extract_sharded_tensors_and_factories

    if loading:
        _allocate_state(opt)  # its common state must exist to be loaded into
    sharded, _ = extract_sharded_tensors_and_factories(model_state)
    meta = {id(t.data): t for t in nested_values(sharded)}
    owned = ChainMap(*(bucket["param_map"] for maps in opt.gbuf_ranges for buckets in maps.values()
                       for bucket in buckets))
    params = [p for buffer in opt.buffers for p in buffer.param_index_map]
    keys = ("param", "exp_avg", "exp_avg_sq")
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel())
    flat = {k: (torch.empty if loading else torch.zeros)(offsets[-1], dtype=torch.float32) for k in keys}
    for i, p in enumerate(params if not loading else ()):
        if p not in owned:
            continue
        rows = owned[p]["param"]
        group, order = opt.model_param_group_index_map[p]
        main = opt.optimizer.param_groups[group]["params"][order]
        values = {"param": main.detach(), **{k: opt.optimizer.state[main][k] for k in keys[1:]}}
        for k in keys:
            flat[k][offsets[i] + rows.start:offsets[i] + rows.end] = values[k].view(-1).float()
    dp_group = getattr(opt, "data_parallel_group_gloo", None) or opt.data_parallel_group
    for k in keys if not loading else ():  # CPU tensors: over gloo where megatron made one (a GPU run's is NCCL)
        dist.all_reduce(flat[k], group=dp_group)
    param_state = {}
    for i, p in enumerate(params):
        if id(p) not in meta:
            raise CheckpointError(f"a parameter of shape {tuple(p.shape)} is missing from the model's checkpoint "
                                  "view; its optimizer state cannot be saved or loaded.")
        m = meta[id(p)]
        param_state[i] = {}
        for k in keys:
            data = flat[k][offsets[i]:offsets[i + 1]].view(p.shape)
            extra = {} if isinstance(m, ShardedTensorFactory) else {"dtype": data.dtype}
            param_state[i][k] = replace(m, key=f"optimizer.state.{k}.{m.key}", data=data, **extra)
    return param_state


def _allocate_state(opt) -> None:
    """Give a distributed optimizer that has not stepped yet its Adam state (megatron's ``state_dict`` and
    ``sharded_state_dict`` read Adam's step count from it): megatron's ``load_state_dict`` allocates it when
    handed the optimizer's own param groups at step 0; loading overwrites it."""
    if len(opt.optimizer.state):
        return
    groups = [{k: v for k, v in g.items() if k != "params"} | {"step": 0}
              for g in opt.optimizer.state_dict()["param_groups"]]
    opt.load_state_dict({"optimizer": {"param_groups": groups}})
    _own_steps(opt)


def _own_steps(opt) -> None:
    """megatron's ``load_state_dict`` gives every parameter the same ``step`` tensor; torch's Adam increments it in
    place per parameter, so each parameter needs its own."""
    for s in opt.optimizer.state.values():
        if "step" in s:
            s["step"] = s["step"].detach().clone()


def _module_state(module):
    """A chunk's sharded state dict (task-head chunks: see ErnieModel.sharded_state_dict)."""
    return module.sharded_state_dict()


def _inner(optimizer) -> list:
    """The distributed optimizers inside megatron's ChainedOptimizer (or the optimizer itself)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _load_distributed_optimizer(opt, state: dict | None, common: dict, param_state_format: str = "dp_zero") -> None:
    """Restore one distributed optimizer: param groups, loss scaler and Adam's step count from ``common``;
    main parameters and moments from ``state``: megatron's model-space tensors (``param_state_format``
    "model_space", every rank) or the legacy dp-zero gather (None off the first data-parallel rank, which
    scatters it).

    megatron's ``load_state_dict`` allocates the Adam state and gives every parameter the same ``step`` tensor
    object, while its parameter-state loaders copy exactly the keys the state holds and have no ``step``. So:
    allocate, set ``step`` aside, copy the tensors, and give each parameter its own ``step``."""
    opt.load_state_dict(common)
    steps = {p: s.pop("step") for p, s in opt.optimizer.state.items() if "step" in s}
    if param_state_format == DISTOPT_FORMAT:
        opt.load_parameter_state_from_fully_reshardable(state)
    else:
        opt.load_parameter_state_from_dp_zero(state)
    for p, step in steps.items():
        opt.optimizer.state[p]["step"] = step
    _own_steps(opt)


def _load_model_space_optimizer(optimizer, loaded: dict) -> None:
    """Restore the distributed optimizer(s) from what dist_checkpointing loaded into :func:`_sharded_state`'s
    entries: each inner optimizer's parameters from its own entries; param groups (matched by megatron on their
    weight-decay, learning-rate and expert flags), Adam's step and the loss scaler from the saving layout's."""
    commons = loaded["common"]
    common = {"optimizer": {**commons[0]["optimizer"],
                            "param_groups": [g for c in commons for g in c["optimizer"]["param_groups"]]}}
    if "grad_scaler" in commons[0]:
        common["grad_scaler"] = commons[0]["grad_scaler"]
    with torch.no_grad():  # it copies into the fp32 main parameters, which require grad
        for i, opt in enumerate(_inner(optimizer)):
            _load_distributed_optimizer(opt, loaded["params"][i], common, DISTOPT_FORMAT)


def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    out = {"torch": torch.get_rng_state()}
    for name, state in tensor_parallel.get_cuda_rng_tracker().get_states().items():
        out[f"tracker.{name}"] = state
    return out


def _set_rng_state(states: dict) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(states["torch"])
    tracker = {k.removeprefix("tracker."): v for k, v in states.items() if k.startswith("tracker.")}
    tensor_parallel.get_cuda_rng_tracker().set_states(tracker)


def _save_strategy():
    """megatron's torch_dist writer with one writer thread."""
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    return TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)


def save(trainer, keep: int = 3, background: bool = False) -> Path:
    """Save the trainer's state at its current step (collective) and return the checkpoint's path.

    ``background`` (``--async-save``): the state is captured now and written by a forked process while
    training goes on; the path is where the checkpoint will be once :func:`finish_saves` has completed it
    (until then it is ``step_N.incomplete``). A save in flight is completed before the next one starts."""
    from megatron.core import dist_checkpointing
    from safetensors.torch import save_file

    finish_saves(trainer, blocking=True)  # at most one save in flight: it completes before this one starts
    lay = trainer.layout
    root = trainer.output / "checkpoints"
    final = root / f"step_{trainer.step:07d}"
    work = root / f"{final.name}.incomplete"
    if dist.get_rank() == 0:
        if work.exists():
            shutil.rmtree(work)
        (work / "model").mkdir(parents=True)
        (work / "rng").mkdir()
    distributed.barrier()
    distopt = trainer.cfg.optimizer.distributed_optimizer
    with cpu.device_mode():
        request = dist_checkpointing.save(_sharded_state(trainer, with_optimizer=True), str(work / "model"),
                                          sharded_strategy=_save_strategy(), async_sharded_save=background)
    save_file({k: v.contiguous() for k, v in _rng_state().items()},
              str(work / "rng" / f"rank_{dist.get_rank():05d}.safetensors"))
    if dist.get_rank() == 0:
        info = {"step": trainer.step, "consumed_samples": trainer.step * trainer.cfg.data.global_batch_size,
                "scheduler": trainer.scheduler.state_dict(), "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp,
                                                                         "vpp": lay.vpp, "ep": lay.ep, "etp": lay.etp,
                                                                         "fsdp": trainer.cfg.parallel.fsdp},
                "distributed_optimizer": distopt, "optimizer_format": DISTOPT_FORMAT if distopt else "plain",
                "recipe": trainer.cfg.recipe, "model": trainer.cfg.model,
                "tokenizer": trainer.tokenizer_name}
        extra = getattr(trainer, "checkpoint_state", None)
        if extra is not None:  # the caller's own state (fine-tuning: evaluations, best model, callbacks)
            info["state"] = extra()
        (work / "trainer.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    commit = functools.partial(_commit, trainer, trainer.step, work, final, keep)
    if not background:
        commit()
        return final
    request.add_finalize_fn(commit)  # after megatron's own (the shards' .metadata, metadata.json)
    _schedule(trainer, request, work)
    return final


def _commit(trainer, step: int, work: Path, final: Path, keep: int) -> None:
    """Make ``work`` (every rank's files written) the complete checkpoint ``final`` (collective)."""
    root = final.parent
    distributed.barrier()
    if dist.get_rank() == 0:  # the one step that makes the checkpoint count
        _write_manifest(work)  # every rank's files are written (the barrier): their sizes are final
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
        for old in checkpoint_dirs(root)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob("*.incomplete"):
            shutil.rmtree(stale, ignore_errors=True)
    distributed.barrier()
    trainer.last_checkpoint = (step, final)


# Test hook, never for real runs: the background writer waits this many seconds before writing, so that tests
# can train past a save, or kill a run, while its write is certainly still in flight.
TEST_WRITE_DELAY = "ZHNLP_TEST_ASYNC_WRITE_DELAY"


def _delayed(seconds: float, write, *args, **kwargs):
    import time

    time.sleep(seconds)
    return write(*args, **kwargs)


def _schedule(trainer, request, work: Path) -> None:
    """Start ``request``'s write in the background with megatron's AsyncCallsQueue (collective).

    Its caller forks the writer: the child's memory is a copy-on-write snapshot taken at the fork, so the
    optimizer steps that follow change the trainer's pages, never what is written (megatron's staging copy,
    ``tensor.to("cpu")``, is no copy for tensors already on the CPU)."""
    import os

    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    delay = float(os.environ.get(TEST_WRITE_DELAY) or 0)
    if delay and request.async_fn is not None:
        request = request._replace(async_fn=functools.partial(_delayed, delay, request.async_fn))
    if getattr(trainer, "async_saves", None) is None:
        trainer.async_saves = AsyncCallsQueue(persistent=False)  # a forked writer per save
    with cpu.device_mode():
        trainer.async_saves.schedule_async_request(request)
    trainer.saving = work


def finish_saves(trainer, blocking: bool) -> None:
    """Complete the background saves whose writes every rank has finished (collective: the ranks agree
    with one small all-reduce): megatron's finalization (the shards' metadata), then the manifest and the
    rename to ``step_N``. ``blocking``: wait for the write in flight first. A no-op without one."""
    from torch.distributed.checkpoint.api import CheckpointException

    queue = getattr(trainer, "async_saves", None)
    if queue is None or not queue.get_num_unfinalized_calls():
        return
    try:
        with cpu.device_mode():
            queue.maybe_finalize_async_calls(blocking=blocking)
    except CheckpointException as e:
        cause = next(iter(e.failures.values()), e) if e.failures else e
        cause = cause[0] if isinstance(cause, tuple) else cause
        raise CheckpointError(f"writing checkpoint {trainer.saving} in the background failed "
                              f"({type(cause).__name__}: {str(cause).strip()[:200]}); it stays incomplete and "
                              "--resume ignores it: fix the cause (e.g. free disk space) and resume.") from e


@contextlib.contextmanager
def unreadable_as_checkpoint_error(path: Path):
    """Reading checkpoint files that passed :func:`problem` can still fail (bytes damaged in place,
    a file replaced by another run's): one line naming the checkpoint instead of the reader's
    traceback (which stays chained, for ``--debug``)."""
    import logging

    from megatron.core.dist_checkpointing.core import CheckpointingException
    from torch.distributed.checkpoint.api import CheckpointException

    def drop_fallback_traceback(record: logging.LogRecord) -> bool:
        # torch's loader logs the unreadable .metadata with its traceback (on the root logger) before
        # retrying and raising: the error below says it in one line
        return not record.getMessage().startswith("Global metadata is not found")

    root = logging.getLogger()
    root.addFilter(drop_fallback_traceback)
    try:
        yield
    except (CheckpointingException, CheckpointException, RuntimeError, ValueError, OSError, EOFError,
            KeyError, pickle.UnpicklingError) as e:
        if isinstance(e, CheckpointError):
            raise
        cause = e
        if isinstance(e, CheckpointException) and e.failures:  # torch's wrapper: {rank: (error, stack)}
            cause = next(iter(e.failures.values()))
            cause = cause[0] if isinstance(cause, tuple) else cause
        text = str(cause).strip()
        first = text.splitlines()[0][:200] if text else "no message"
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(cause).__name__}: {first}); it is damaged: "
                              "move it aside to use the one before it.") from e
    finally:
        root.removeFilter(drop_fallback_traceback)


def load(trainer, path: Path) -> None:
    """Restore ``trainer`` from the complete checkpoint ``path`` (collective). The layout may differ
    from the one that saved it, except for the distributed optimizer's state (see module doc)."""
    from megatron.core import dist_checkpointing
    from safetensors.torch import load_file

    info, why = _json_file(path / "trainer.json", "trainer.json")
    missing = [k for k in _INFO_KEYS if info is not None and k not in info]
    if why is not None or missing:
        why = why or f"trainer.json lacks {', '.join(missing)}"
        raise CheckpointError(f"{path} is not a complete zhnlp checkpoint ({why}); load a step_NNNNNNN directory "
                              "that `zhnlp pretrain` wrote.")
    if info["model"] != json.loads(json.dumps(trainer.cfg.model)):  # as trainer.json holds it (id2label keys: str)
        raise CheckpointError(f"{path} was saved for a different architecture than recipe {trainer.cfg.recipe!r}; "
                              "resume with the recipe that wrote it.")
    lay = trainer.layout
    saved = info["layout"]
    # MoE: megatron keeps one optimizer per expert group (ChainedOptimizer) whose state layout follows ep/etp
    # (a dense model's optimizer state reshards freely: etp, which defaults to tp, does not matter there)
    moe = bool(getattr(trainer.cfg.architecture(), "is_moe", False))
    same_experts = not moe or (saved.get("ep", 1), saved.get("etp", saved["tp"])) == (lay.ep, lay.etp)
    same_layout = same_experts and (saved["tp"], saved["pp"], saved["dp"], saved["vpp"]) == (lay.tp, lay.pp, lay.dp,
                                                                                             lay.vpp)
    distopt = info["distributed_optimizer"]
    # how the optimizer state comes back: "plain" and "model_space" (the distributed optimizer's since the
    # model-space format) reshard like the model; the legacy distributed format only under the same layout
    if distopt != trainer.cfg.optimizer.distributed_optimizer:
        restore, why = None, f"saved {'with' if distopt else 'without'} the distributed optimizer, resumed " \
                             f"{'without' if distopt else 'with'} it"
    elif distopt and info.get("optimizer_format") == DISTOPT_FORMAT:
        restore, why = DISTOPT_FORMAT, None
    elif distopt:
        restore = "legacy" if same_layout else None
        why = f"distributed-optimizer state in the older per-rank format, saved at tp={saved['tp']} pp={saved['pp']} " \
              f"dp={saved['dp']}, restores only in that layout"
    else:
        restore = "plain" if same_experts else None
        why = f"saved at ep={saved.get('ep', 1)} etp={saved.get('etp', saved['tp'])}: the experts' optimizer " \
              "state restores only at the same ep and etp without the distributed optimizer"
    with_optimizer = restore in ("plain", DISTOPT_FORMAT)
    with cpu.device_mode():
        with unreadable_as_checkpoint_error(path):
            state = dist_checkpointing.load(_sharded_state(trainer, with_optimizer, loading=True), str(path / "model"))
        if trainer.cfg.parallel.fsdp:
            fsdp.restore_shapes(state, trainer.fsdp_reshaped)
        for i, chunk in enumerate(trainer.chunks):
            if trainer.cfg.parallel.fsdp:
                fsdp.load_into(chunk.module, state[f"model{i}"])
            else:
                chunk.module.load_state_dict(state[f"model{i}"])
        if restore == "plain":
            trainer.optimizer.load_state_dict(state["optimizer"])
            if trainer.cfg.parallel.fsdp:
                fsdp.optimizer_state_to_dtensors(trainer.optimizer)
        elif restore == DISTOPT_FORMAT:
            _load_model_space_optimizer(trainer.optimizer, state["optimizer"])
        elif restore == "legacy":
            file = path / "distopt" / f"mp_rank_{lay.tp_rank:02d}_{lay.pp_rank:03d}.pt"
            # every rank needs the common state; only the first data-parallel rank the parameter state
            with unreadable_as_checkpoint_error(path):
                states = torch.load(file, map_location="cpu", weights_only=True) if file.is_file() else None
            if states is None:
                raise CheckpointError(f"{file} is missing; the checkpoint's distributed-optimizer state is incomplete.")
            with torch.no_grad():  # it copies into the fp32 main parameters, which require grad
                for state, opt in zip(states, _inner(trainer.optimizer)):
                    _load_distributed_optimizer(opt, state["params"] if lay.dp_rank == 0 else None, state["common"])
        elif dist.get_rank() == 0:
            logger.warning(f"{path}: the optimizer state cannot be restored ({why}); the model resumes, the "
                           "optimizer starts fresh.")
    trainer.scheduler.load_state_dict(info["scheduler"])
    trainer.step = info["step"]
    trainer.resumed_state = info.get("state")  # what checkpoint_state() returned when it was saved
    rng = path / "rng" / f"rank_{dist.get_rank():05d}.safetensors"
    if same_layout and rng.is_file():
        with unreadable_as_checkpoint_error(path):
            _set_rng_state(load_file(str(rng)))
    else:
        distributed.set_seed(trainer.cfg.seed + trainer.step)  # a new layout: fresh, deterministic streams
