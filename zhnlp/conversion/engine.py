"""The one engine that runs a family's mapping table, per rank, in both directions.

Loading: every rank reads only the slices its parameters hold (safetensors slices are read
from disk without loading the rest). Before any weight is read, the checkpoint's keys are
accounted for against the *whole* model (all layers, all stages): each key must be consumed
by a mapping or covered by an Ignore, and each expected key must be present unless it
belongs to a task head that is being freshly initialised. Every rank reaches the same verdict,
so a bad checkpoint fails everywhere at once instead of hanging a collective.

Saving: tensor-parallel shards are all-gathered within each TP group, the table is run
backwards, and the first TP/DP rank of each pipeline stage writes that stage's tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp.conversion.mappings import Ignore, Mapping, Tied
from zhnlp.errors import CheckpointError


# ----------------------------------------------------------------------------- checkpoint files
class CheckpointReader:
    """Tensors of a transformers checkpoint directory, read lazily and by row ranges.

    Accepts ``model.safetensors``, a sharded ``model.safetensors.index.json``, or a
    ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``: no code is unpickled).
    ``rename`` normalises legacy key spellings (e.g. LayerNorm ``gamma``/``beta``).
    """

    def __init__(self, directory: str | Path, rename=None):
        self.dir = Path(directory)
        self._rename = rename or (lambda k: k)
        self._files: dict[str, tuple[Path, str]] = {}  # normalised key -> (file, stored key)
        self._handles = {}
        self._torch_state = None
        single, index = self.dir / "model.safetensors", self.dir / "model.safetensors.index.json"
        binary = self.dir / "pytorch_model.bin"
        if single.exists():
            self._index_safetensors([single])
        elif index.exists():
            try:
                data = json.loads(index.read_text(encoding="utf-8"))
                problem = None
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                problem = str(e)
            if problem is None:
                weight_map = data.get("weight_map") if isinstance(data, dict) else None
                if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                    problem = "no weight_map object of key -> shard file name"
            if problem:
                raise CheckpointError(f"{index} is not a valid safetensors index ({problem}); it must be a JSON "
                                      'object with "weight_map": {key: shard file}. Re-save the checkpoint.')
            missing = sorted({f for f in weight_map.values() if not (self.dir / f).exists()})
            if missing:
                raise CheckpointError(f"{index} lists shard files that are missing: {missing}; "
                                      "the download is incomplete, fetch it again.")
            self._index_safetensors(sorted({self.dir / f for f in weight_map.values()}))
        elif binary.exists():
            try:
                self._torch_state = torch.load(binary, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # torch raises several types for corrupt or non-weight pickles
                raise CheckpointError(f"cannot read {binary} as plain tensors ({type(e).__name__}: {e}). "
                                      "zhnlp only loads weights-only checkpoints; convert it to safetensors "
                                      "with transformers (save_pretrained) in a trusted environment.") from None
            for k in self._torch_state:
                self._files[self._rename(k)] = (binary, k)
        else:
            raise CheckpointError(f"{self.dir} has no model weights (model.safetensors, "
                                  "model.safetensors.index.json or pytorch_model.bin).")

    def _index_safetensors(self, files):
        from safetensors import SafetensorError, safe_open

        for f in files:
            try:
                handle = safe_open(str(f), framework="pt")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{f} is not a readable safetensors file ({e}); it may be truncated or "
                                      "corrupt: download or save it again.") from None
            self._handles[f] = handle
            for k in handle.keys():
                self._files[self._rename(k)] = (f, k)

    def keys(self) -> set[str]:
        return set(self._files)

    def _slice(self, key):
        f, stored = self._files[key]
        if self._torch_state is not None:
            return self._torch_state[stored]
        return self._handles[f].get_slice(stored)

    def shape(self, key) -> tuple[int, ...]:
        s = self._slice(key)
        return tuple(s.shape) if isinstance(s, torch.Tensor) else tuple(s.get_shape())

    def dtype(self, key) -> torch.dtype:
        s = self._slice(key)
        if isinstance(s, torch.Tensor):
            return s.dtype
        return self[key, (0, 1)].dtype if s.get_shape() else self[key, None].dtype

    def __getitem__(self, item):
        key, rows = item[:2]
        cols = item[2] if len(item) > 2 else None
        s = self._slice(key)
        r = slice(*rows) if rows is not None else slice(None)
        t = s[r, cols[0]: cols[1]] if cols is not None else s[r]
        return t.clone() if isinstance(s, torch.Tensor) else t

    def __call__(self, key, rows=None):
        return self[key, rows]

    def columns(self, start: int, end: int) -> "_ColumnView":
        """A view of this reader that returns only columns ``[start, end)`` (row-parallel shards)."""
        return _ColumnView(self, (start, end))


class TensorReader(CheckpointReader):
    """Full transformers-named tensors held in memory, read like a checkpoint directory (used to rebuild a
    model with other sizes, e.g. ``resize_token_embeddings``)."""

    def __init__(self, tensors: dict[str, torch.Tensor], name: str = "(in memory)"):
        self.dir = Path(name)
        self._rename = lambda k: k
        self._torch_state = tensors
        self._files = {k: (None, k) for k in tensors}
        self._handles = {}


class _ColumnView:
    def __init__(self, reader: CheckpointReader, cols: tuple[int, int]):
        self.reader, self.cols = reader, cols
        self.shape, self.dtype = reader.shape, reader.dtype

    def __call__(self, key, rows=None):
        return self.reader[key, rows, self.cols]


# ----------------------------------------------------------------------------- the table
@dataclass
class Table:
    """A family's mappings plus the keys it ignores."""

    mappings: list[Mapping]
    ignores: list[Ignore] = field(default_factory=list)

    def find(self, name: str) -> tuple[Mapping, int | None]:
        for m in self.mappings:
            ok, layer = m.match(name)
            if ok:
                return m, layer
        raise KeyError(f"no mapping for megatron parameter {name!r}")


EXPERTS = ".mlp.experts.local_experts."  # megatron's SequentialMLP: the experts this rank holds


def is_expert(name: str) -> bool:
    """Whether a parameter belongs to an MoE layer's routed experts (split by expert, then by the expert
    tensor-parallel group instead of the tensor-parallel one)."""
    return EXPERTS in name


def global_param_names(chunk) -> dict[str, str]:
    """Local parameter name -> name with the *global* layer index (pipeline stages own a slice
    of the layers and number them from 0 locally) and, for routed experts, the global expert index
    (expert-parallel ranks own a slice of the experts and number them from 0 locally).

    A layer whose weights are those of an earlier layer (ALBERT's shared layers: its
    ``shares_parameters_of`` attribute, a global 0-based layer index) names them by that layer, so that
    every copy of a shared weight, on whichever stage or chunk, has one name."""
    out = {}
    for name, _ in chunk.named_parameters():
        parts = name.split(".")
        if len(parts) > 2 and parts[0] == "encoder" and parts[1] == "layers":
            layer = chunk.encoder.layers[int(parts[2])]
            parts[2] = str(getattr(layer, "shares_parameters_of", layer.layer_number - 1))
            if is_expert(name):  # encoder.layers.L.mlp.experts.local_experts.J....
                j = parts.index("local_experts") + 1
                parts[j] = str(layer.mlp.local_expert_indices[int(parts[j])])
        out[name] = ".".join(parts)
    return out


def split_dims(chunk) -> dict[str, int | None]:
    """Local parameter name -> the dimension tensor parallelism splits it along (None: replicated).

    Inferred from the module that owns the parameter: column-parallel linears split their
    output dimension (weight rows and bias), row-parallel linears their input dimension
    (weight columns; the bias is replicated), vocab-parallel embeddings their rows. The
    parameters are also given megatron's ``tensor_model_parallel``/``partition_dim``
    attributes, which megatron sets only when it initialises the weights itself and which
    its optimizer and gradient clipping read.
    """
    from megatron.core.tensor_parallel import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                               set_tensor_model_parallel_attributes)

    dims = {}
    for mod_name, module in chunk.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            dim = None
            if isinstance(module, ColumnParallelLinear) or isinstance(module, VocabParallelEmbedding):
                dim = 0
            elif isinstance(module, RowParallelLinear) and p_name == "weight":
                dim = 1
            if dim is not None and not getattr(p, "tensor_model_parallel", False):
                set_tensor_model_parallel_attributes(p, True, dim, 1)
            dims[f"{mod_name}.{p_name}" if mod_name else p_name] = dim
    return dims


@dataclass
class LoadReport:
    fresh: list[str]  # heads' checkpoint keys that were missing: freshly initialised
    ignored: list[str]


def check_keys(table: Table, expected: dict[str, str | None], present: set[str], fresh_heads: set[str],
               source: str) -> LoadReport:
    """Account for every key. ``expected``: key -> owning head (None = encoder)."""
    unknown = sorted(k for k in present - set(expected) if not any(i.covers(k) for i in table.ignores))
    missing = sorted(k for k in set(expected) - present if expected[k] not in fresh_heads)
    problems = []
    if missing:
        problems.append(f"missing weights {_short(missing)}")
    if unknown:
        problems.append(f"unexpected weights that no mapping consumes {_short(unknown)}")
    if problems:
        raise CheckpointError(f"checkpoint {source} does not match this model: " + "; ".join(problems)
                              + ". Check that the checkpoint and the model class belong together "
                                "(family, head, number of layers).")
    fresh = sorted(k for k in set(expected) - present)
    ignored = sorted(k for k in present - set(expected))
    return LoadReport(fresh=fresh, ignored=ignored)


def check_shapes(expected: dict[str, tuple[tuple[int, ...], str]], reader: CheckpointReader, source: str,
                 skip: set[str] = frozenset(), ignore_mismatched: bool = False) -> list[str]:
    """Compare every checkpoint key's shape with the one the architecture implies, for the whole
    model at once and before any weight is read, so every rank reaches the same verdict.

    ``expected``: key -> (shape, megatron parameter name), in the order to report them; keys
    absent from the checkpoint or in ``skip`` (freshly initialised heads) are not checked.
    ``ignore_mismatched``: return the keys whose shape differs (to be freshly initialised)
    instead of raising.
    """
    present = reader.keys()
    differ = [k for k, (shape, _) in expected.items()
              if k in present and k not in skip and tuple(reader.shape(k)) != tuple(shape)]
    if differ and not ignore_mismatched:
        wrong = [_mismatch(expected[k][1], k, expected[k][0], reader.shape(k)) for k in differ]
        more = f"; ... and {len(wrong) - 4} more" if len(wrong) > 4 else ""
        raise CheckpointError(f"checkpoint {source} does not match its config.json: " + "; ".join(wrong[:4])
                              + more + ". " + _SHAPE_FIX)
    return differ


def _mismatch(param: str, key: str, expected, found) -> str:
    return f"shape mismatch for {param} ({key}: expected {_shape(expected)}, found {_shape(found)})"


_SHAPE_FIX = ("The config.json does not describe these weights: fix its sizes (vocab_size, hidden_size, "
              "intermediate_size, max_position_embeddings, type_vocab_size, num_labels, ...) or use the config.json "
              "that came with the checkpoint; or, to start a task head of another size (e.g. num_labels), pass "
              "ignore_mismatched_sizes=True to from_pretrained to re-initialise the weights named.")


def _shape(shape) -> str:
    return str(tuple(shape))


def _short(keys: list[str], limit: int = 12) -> str:
    more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return "[" + ", ".join(keys[:limit]) + "]" + more


def load_chunk(chunk, table: Table, reader: CheckpointReader, tp_rank: int, tp_size: int, fresh_keys: set[str],
               expert_tp: tuple[int, int] = (0, 1)) -> list[str]:
    """Copy this rank's slices into ``chunk``; returns the local parameters left freshly initialised.
    ``expert_tp``: (rank, size) in the expert tensor-parallel group, which splits the routed experts."""
    names = global_param_names(chunk)
    params = dict(chunk.named_parameters())
    dims = split_dims(chunk)
    left_fresh = []
    dense_tp = tp_rank, tp_size
    for local, gname in names.items():
        p = params[local]
        tp_rank, tp_size = expert_tp if is_expert(local) else dense_tp
        mapping, layer = table.find(gname)
        keys = mapping.hf_keys(layer)
        if any(k in fresh_keys for k in keys):
            left_fresh.append(gname)
            continue
        dim = dims[local]
        full = list(p.shape)  # the unsplit parameter: this rank's shard times tp along the split dim
        if dim is not None:
            full[dim] *= tp_size
        for key, shape in mapping.hf_shapes(layer, tuple(full)).items():
            # checked before reading: a TP slice of a tensor of the wrong size can look right
            if tuple(reader.shape(key)) != tuple(shape):
                raise CheckpointError(f"checkpoint {reader.dir} does not match its config.json: "
                                      f"{_mismatch(gname, key, shape, reader.shape(key))}. {_SHAPE_FIX}")
        rows = full_rows = None
        if dim is None:
            full_rows = p.shape[0] if p.dim() else None
        elif dim == 0:
            full_rows = p.shape[0] * tp_size
            rows = (tp_rank * p.shape[0], (tp_rank + 1) * p.shape[0])
        if dim == 1:  # row-parallel linear: this rank's columns of the input dimension
            cols = reader.columns(tp_rank * p.shape[1], (tp_rank + 1) * p.shape[1])
            tensor = mapping.to_megatron(cols, layer, None, p.shape[0])
        else:
            tensor = mapping.to_megatron(reader, layer, rows, full_rows)
        if tuple(tensor.shape) != tuple(p.shape):
            found = ", ".join(f"{k} {_shape(reader.shape(k))}" for k in keys)
            raise CheckpointError(f"shape mismatch for {gname} (from {found}): this rank's slice is "
                                  f"{_shape(tensor.shape)}, the model expects {_shape(p.shape)}. {_SHAPE_FIX}")
        with torch.no_grad():
            p.copy_(tensor.to(p.dtype))
    return left_fresh


def _all_gather(tensor, group, size: int) -> list[torch.Tensor]:
    pieces = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(pieces, tensor.contiguous(), group=group)
    return pieces


def gather_chunk(chunk, table: Table, tp_group, tp_size: int, experts=None) -> dict[str, torch.Tensor]:
    """Full transformers tensors of this chunk's parameters (collective over the TP group).

    ``experts``: ``(etp_group, etp_size, ep_group, ep_size)`` for a model with routed experts: their shards
    are gathered over the expert tensor-parallel group, then every expert-parallel rank's experts are
    collected (collective over the EP group: every rank of it must call)."""
    names = global_param_names(chunk)
    dims = split_dims(chunk)
    out = {}
    for local, p in chunk.named_parameters():
        full = p.detach()
        dim = dims[local]
        group, size = tp_group, tp_size
        if is_expert(local):
            group, size = experts[0], experts[1]
        if dim is not None and size > 1:
            full = torch.cat(_all_gather(full, group, size), dim=dim)
        mapping, layer = table.find(names[local])
        if isinstance(mapping, Tied) or getattr(p, "shared", False):
            # megatron's mark of a duplicate whose gradient is synchronised elsewhere (the tied output layer of a
            # last stage, a copy of a shared layer's weights another stage or chunk owns): never written
            continue
        if is_expert(local) and experts[3] > 1:  # rank r holds experts r*n .. r*n+n-1, in the same order
            local_index = int(local.split(".")[local.split(".").index("local_experts") + 1])
            n = len(chunk.encoder.layers[int(local.split(".")[2])].mlp.local_expert_indices)
            for r, piece in enumerate(_all_gather(full, experts[2], experts[3])):
                out.update({k: v.contiguous().clone()
                            for k, v in mapping.to_hf(piece, (layer[0], r * n + local_index)).items()})
            continue
        out.update({k: v.contiguous().clone() for k, v in mapping.to_hf(full, layer).items()})
    return out


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict | None = None) -> None:
    """Write atomically: a crash leaves the previous file (if any) untouched."""
    from safetensors.torch import save_file

    from zhnlp.fileio import atomic_path

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata or {"format": "pt"})
