"""Fully sharded data parallelism (``--fsdp``): megatron-core's wrapper around torch FSDP2.

Each model chunk is wrapped in megatron's ``TorchFullyShardedDataParallel``, which applies torch's
``fully_shard`` to every transformer layer and then to the chunk itself: every parameter becomes a
``DTensor`` sharded along its first dimension over the data-parallel group (``Shard(0)``, chunks of
``ceil(rows / dp)`` rows, the last ones shorter or empty). A layer's parameters are all-gathered just
before its forward and again before its backward and freed afterwards; gradients are reduce-scattered
(averaged) into sharded ``.grad`` DTensors during the backward. The optimizer is megatron's plain one
over these sharded parameters, so Adam's moments (and, in bf16/fp16, the fp32 main parameters) are
sharded the same way. Tensor parallelism composes: the DTensor's local rows are rows of this rank's
tensor-parallel shard.

megatron's Megatron-FSDP (``use_megatron_fsdp``) is not used: it drives CUDA streams, events and
NCCL-specific buffers throughout, which the CPU/gloo runtime cannot stand in for.

Checkpoints keep the format of every other layout (model weights as megatron's sharded tensors with
global shapes, so an FSDP checkpoint loads under DDP, another TP, or another FSDP size, and the
other way round). megatron's own DTensor handling assumes even shards and mis-splits SwiGLU's fused
weight, so :func:`sharded_state_dict` builds the state dict as the unsharded layout would (each
sharded parameter stands in as a meta tensor of its full shape) and then narrows every tensor, or
every piece a factory makes of it, to the rows this rank holds (irregular shards, which megatron's
torch_dist format supports).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from zhnlp.errors import LayoutError


def wrap(config, chunk):
    """``chunk`` wrapped in megatron's TorchFullyShardedDataParallel over the data-parallel group
    (call inside :func:`zhnlp.distributed.cpu.device_mode`)."""
    from megatron.core.distributed import TorchFullyShardedDataParallel, TorchFullyShardedDataParallelConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    ddp = TorchFullyShardedDataParallelConfig(reshard_after_forward=True)
    # one FSDP unit per transformer layer; the chunk's own unit holds the rest (embeddings, final norm, head).
    # megatron's default set adds ColumnParallelLinear, whose instances inside a layer would be sharded a
    # second time (it drops them only for transformer_impl "local"; zhnlp's specs are local modules while
    # the config keeps the default name)
    class FullyShardedChunk(TorchFullyShardedDataParallel):
        def finish_grad_sync(self, force_all_reduce: bool = False) -> None:
            """Nothing to finish: FSDP2 reduce-scatters during the backward. (megatron 0.16's
            finalize_model_grads passes ``force_all_reduce``, which its base class does not accept.)"""

    return FullyShardedChunk(config, ddp, chunk, sub_modules_to_wrap={TransformerLayer})


def check(cfg) -> list[str]:
    """The settings ``--fsdp`` cannot be combined with, as problems for :meth:`RunConfig.check`."""
    p, problems = cfg.parallel, []
    if not p.fsdp:
        return problems
    if cfg.optimizer.distributed_optimizer:
        problems.append("--fsdp already shards the optimizer states over the data-parallel ranks; drop "
                        "--distributed-optimizer (or drop --fsdp to keep megatron's DDP with the distributed "
                        "optimizer)")
    if p.ep > 1:
        problems.append(f"--fsdp with ep={p.ep}: expert parallelism needs megatron's expert-data-parallel "
                        "gradient reduction, which the FSDP2 wrapper does not do; drop --fsdp or use ep=1")
    if cfg.precision == "fp16":
        problems.append("--fsdp with fp16: megatron's loss-scaled fp16 optimizer is not built for sharded "
                        "parameters; use --precision bf16 or fp32")
    if cfg.data.per_token_loss:
        problems.append("--fsdp with per_token_loss: the FSDP2 wrapper averages gradients over the data-parallel "
                        "ranks and cannot rescale them by the global token count; drop one of them")
    return problems


# ------------------------------------------------------------------------------ checkpoints
def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _local(param) -> torch.Tensor:
    """The local shard of the DTensor ``param``, always the same tensor object (``_local_tensor``):
    megatron's optimizer checkpointing matches the model's sharded tensors to the optimizer's
    parameters by identity, while torch 2.13's ``to_local()`` of a Parameter DTensor returns a fresh
    view on every call."""
    return param._local_tensor


@contextlib.contextmanager
def stable_local_tensors():
    """While megatron builds the optimizer's sharded state dict, its ``to_local_if_dtensor`` returns
    :func:`_local` (the identity it relies on; see there) instead of a fresh view."""
    import megatron.core.dist_checkpointing.optimizer as moptim

    own = moptim.to_local_if_dtensor
    moptim.to_local_if_dtensor = lambda t: _local(t) if _is_dtensor(t) else t
    try:
        yield
    finally:
        moptim.to_local_if_dtensor = own


def _rows(param) -> tuple[int, int]:
    """(first row, rows) of the full (tensor-parallel-local) tensor that this rank's shard of the
    FSDP2 parameter ``param`` holds: ``Shard(0)`` in ``torch.chunk`` pieces over the mesh."""
    from torch.distributed.tensor import Shard

    (placement,) = param.placements
    if not isinstance(placement, Shard) or placement.dim != 0:
        raise LayoutError(f"an FSDP parameter is placed as {placement}; zhnlp's checkpoints expect Shard(0)")
    mesh = param.device_mesh
    size, rank = mesh.size(), mesh.get_local_rank()
    full = param.shape[0]
    per = -(-full // size)
    first = min(per * rank, full)
    return first, _local(param).shape[0] if full else 0


@contextlib.contextmanager
def _full_shape_stand_ins(module):
    """Every FSDP-sharded parameter of ``module`` replaced by a meta tensor of its full shape while the
    block runs (ties kept: one stand-in per parameter); yields ``id(stand-in) -> parameter``."""
    swapped, stand_ins = [], {}
    by_param: dict[int, torch.nn.Parameter] = {}
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is None or not _is_dtensor(p):
                continue
            if id(p) not in by_param:
                stand = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                           requires_grad=p.requires_grad)
                by_param[id(p)] = stand
                stand_ins[id(stand)] = p
            swapped.append((sub, name, p))
            sub._parameters[name] = by_param[id(p)]
    try:
        yield stand_ins
    finally:
        for sub, name, p in swapped:
            sub._parameters[name] = p


def _narrowed(sh, data, first: int, count: int, at: int):
    """The ShardedTensor ``sh`` (of a full-shape tensor, whose row ``at`` is its row 0) cut to rows
    ``first .. first+count`` of the full tensor, holding ``data`` (those rows, this rank's)."""
    replica = sh.replica_id
    if isinstance(replica, tuple):  # (pipeline, tensor, data-parallel): every data-parallel rank owns its rows
        replica = (*replica[:-1], 0)
    axis = sh.prepend_axis_num
    offset = list(sh.global_offset)
    offset[axis] += first - at
    shape = list(sh.local_shape)
    shape[0] = count
    return dataclasses.replace(sh, data=data, dtype=data.dtype, local_shape=tuple(shape),
                               global_offset=tuple(offset), axis_fragmentations=None, replica_id=replica)


def _row_range(view, full) -> tuple[int, int]:
    """(first row, rows) of ``full`` that the meta view ``view`` is (a run of whole rows, as
    ``torch.chunk`` along dimension 0 makes)."""
    row = int(torch.tensor(full.shape[1:]).prod()) if full.dim() > 1 else 1
    if view.shape[1:] != full.shape[1:] or view.storage_offset() % max(row, 1) or not view.is_contiguous():
        raise LayoutError("a checkpoint factory splits an FSDP-sharded weight other than by whole rows; "
                          "zhnlp cannot narrow it to the FSDP shards")
    return view.storage_offset() // max(row, 1), view.shape[0]


class _NarrowedFactory:
    """Builds the pieces a megatron ShardedTensorFactory makes of a full-shape weight, each cut to the
    rows this rank's FSDP shard holds, and merges them back into the shard when loading."""

    def __init__(self, factory, param, first: int, count: int):
        self.factory, self.param, self.first, self.count = factory, param, first, count

    def build(self, key, data, replica_id, flattened_range):
        full = torch.empty(self.param.shape, dtype=data.dtype, device="meta")
        pieces = self.factory.build_fn(key, full, replica_id, flattened_range)
        out = []
        for sh in pieces if isinstance(pieces, list) else [pieces]:
            start, rows = _row_range(sh.data, full)
            lo, hi = max(start, self.first), min(start + rows, self.first + self.count)
            if hi > lo:
                out.append(_unprepended(_narrowed(sh, data[lo - self.first:hi - self.first], lo, hi - lo, start)))
        return out

    def merge(self, pieces):
        # loaded with the prepended unit axes of _unprepended: drop them, then stack the rows again
        rows = [t.reshape(-1, *self.param.shape[1:]) for t in pieces]
        return torch.cat(rows, dim=0) if rows else None


def _unprepended(sh):
    """``sh`` with its prepended axes (megatron's stacked layers) made ordinary axes of length 1:
    megatron 0.16's writer for irregular shards ignores ``prepend_axis_num``."""
    if not sh.prepend_axis_num:
        return sh
    ones = (1,) * sh.prepend_axis_num
    return dataclasses.replace(sh, data=sh.data.view(*ones, *sh.data.shape), local_shape=ones + tuple(sh.local_shape),
                               prepend_axis_num=0)


def unprepend(state) -> list:
    """Apply :func:`_unprepended` to every irregular ShardedTensor in ``state`` (in place, before
    saving or loading); returns ``(path, shape)`` of each, for :func:`restore_shapes` after a load."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    changed = []

    def walk(container, path):
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for k, v in list(items):
            if isinstance(v, (dict, list)):
                walk(v, path + (k,))
            elif isinstance(v, ShardedTensor) and v.axis_fragmentations is None and v.prepend_axis_num:
                changed.append((path + (k,), tuple(v.local_shape)))
                container[k] = _unprepended(v)

    walk(state, ())
    return changed


def restore_shapes(loaded, changed: list) -> None:
    """Give the tensors that :func:`unprepend` reshaped their own shapes again, in ``loaded``."""
    for path, shape in changed:
        container = loaded
        for k in path[:-1]:
            container = container[k]
        container[path[-1]] = container[path[-1]].reshape(shape)


def sharded_state_dict(module) -> dict:
    """``module.sharded_state_dict()`` in the unsharded layout's format, holding this rank's FSDP rows.

    Every tensor whose data is a sharded parameter holds that parameter's local shard (the very tensor
    the optimizer's state is keyed by, so megatron's optimizer state maps onto it); factories (SwiGLU's
    fused weight) yield their pieces cut to this rank's rows."""
    from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    with _full_shape_stand_ins(module) as stand_ins:
        state = module.sharded_state_dict()

    def narrow(x):
        param = stand_ins.get(id(getattr(x, "data", None)))
        if param is None:
            return x
        first, count = _rows(param)
        local = _local(param)
        if isinstance(x, ShardedTensor):
            return _narrowed(x, local, first, count, 0)
        if isinstance(x, ShardedTensorFactory):
            made = _NarrowedFactory(x, param, first, count)
            return dataclasses.replace(x, data=local, build_fn=made.build, merge_fn=made.merge)
        raise LayoutError(f"unexpected checkpoint entry {type(x).__name__} for an FSDP-sharded weight")

    dict_list_map_inplace(narrow, state)
    return state


def load_into(module, state: dict) -> None:
    """Copy a state dict loaded from :func:`sharded_state_dict` into ``module``: the sharded
    parameters' local rows in place, everything else through ``load_state_dict``."""
    params = dict(module.named_parameters())
    rest = {}
    with torch.no_grad():
        for name, value in state.items():
            p = params.get(name)
            if p is not None and _is_dtensor(p):
                _local(p).copy_(value)
            else:
                rest[name] = value
    missing, unexpected = module.load_state_dict(rest, strict=False)
    if unexpected:
        raise LayoutError(f"checkpoint entries with no place in the model: {unexpected}")


def optimizer_state_to_dtensors(optimizer) -> None:
    """After megatron's optimizer ``load_state_dict``: torch's optimizer holds the loaded moments as
    plain tensors of the local shard's shape; make them DTensors placed like their parameters."""
    from torch.distributed.tensor import DTensor

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        for p, state in inner.state.items():
            if not _is_dtensor(p):
                continue
            for k, v in list(state.items()):
                if torch.is_tensor(v) and not _is_dtensor(v) and v.shape == _local(p).shape:
                    state[k] = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False,
                                                  shape=p.shape, stride=p.stride())
