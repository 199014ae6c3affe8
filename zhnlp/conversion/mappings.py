"""Mapping classes: how one megatron parameter relates to transformers checkpoint keys.

A family's bridge is a list of these. Names may contain ``*`` for the (global, 0-based)
layer index, and a second ``*`` for the (global) expert index of a mixture-of-experts layer; the
index passed around as ``layer`` is then the tuple ``(layer, expert)``. The mappings know nothing about tensor or pipeline parallelism: they turn
*full* tensors into *full* tensors. The engine (:mod:`zhnlp.conversion.engine`) slices and
gathers, inferring the split dimension from the attributes megatron's parallel layers put
on their parameters (``tensor_model_parallel``, ``partition_dim``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

import torch


def _fill(pattern: str, layer: int | tuple[int, ...] | None) -> str:
    if layer is None:
        return pattern
    for index in (layer if isinstance(layer, tuple) else (layer,)):
        pattern = pattern.replace("*", str(index), 1)
    return pattern


def _compile(pattern: str) -> re.Pattern:
    return re.compile("^" + re.escape(pattern).replace(r"\*", r"(\d+)") + "$")


@dataclass
class Mapping:
    """Base: ``megatron`` parameter name pattern; ``head`` names the task head owning it (None: encoder)."""

    megatron: str

    def __post_init__(self):
        self._re = _compile(self.megatron)
        self.head = getattr(self, "head", None)

    def match(self, name: str) -> tuple[bool, int | None]:
        m = self._re.match(name)
        if not m:
            return False, None
        groups = tuple(int(g) for g in m.groups())
        return True, (None if not groups else groups[0] if len(groups) == 1 else groups)

    def hf_keys(self, layer: int | None) -> list[str]:
        """Checkpoint keys this mapping reads (and, unless tied, writes)."""
        raise NotImplementedError

    def hf_shapes(self, layer: int | None, full: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """The shape each checkpoint key must have, given the parameter's *full* (unsplit,
        vocabulary-padded) megatron shape ``full``."""
        raise NotImplementedError

    def to_megatron(self, read, layer: int | None, rows: tuple[int, int] | None, full_rows: int | None):
        """Build this rank's tensor. ``read(key, rows=None)`` returns a checkpoint tensor, or only
        rows ``[start, end)`` of it (read from disk without loading the rest)."""
        raise NotImplementedError

    def to_hf(self, full: torch.Tensor, layer: int | None) -> dict[str, torch.Tensor]:
        raise NotImplementedError


@dataclass
class Rename(Mapping):
    """One checkpoint tensor <-> one parameter. ``vocab=True``: rows are the vocabulary, which
    megatron pads to a multiple of 128 (zero rows in, sliced off out)."""

    hf: str = ""
    vocab: bool = False
    head: str | None = None
    vocab_size: int | None = None  # set by the engine for vocab mappings

    def hf_keys(self, layer):
        return [_fill(self.hf, layer)]

    def hf_shapes(self, layer, full):
        # the checkpoint holds the real vocabulary rows only; megatron's padding rows are not saved
        shape = (self.vocab_size, *full[1:]) if self.vocab else tuple(full)
        return {_fill(self.hf, layer): shape}

    def to_megatron(self, read, layer, rows, full_rows):
        key = _fill(self.hf, layer)
        if not self.vocab:
            return read(key, rows)
        start, end = rows if rows is not None else (0, full_rows)
        have = min(end, self.vocab_size) - start
        real = read(key, (start, start + have)) if have > 0 else None
        if have == end - start:
            return real
        pad_shape = (end - start - max(have, 0),) + tuple(read.shape(key)[1:])
        pad = torch.zeros(pad_shape, dtype=read.dtype(key))
        return pad if real is None else torch.cat([real, pad])

    def to_hf(self, full, layer):
        if self.vocab:
            full = full[: self.vocab_size]
        return {_fill(self.hf, layer): full}


@dataclass
class Tied(Rename):
    """A second copy of a tensor another mapping owns (the tied MLM decoder on a last pipeline
    stage that is not also the first). Read like Rename; never written, never counted as a key."""

    def to_hf(self, full, layer):
        return {}


@dataclass
class FuseQKV(Mapping):
    """Separate Q, K, V <-> megatron's fused QKV, interleaved per head:
    ``[q_0; k_0; v_0; q_1; k_1; v_1; ...]`` along dim 0, each block ``head_dim`` rows, so a
    tensor-parallel split of dim 0 gives each rank whole heads."""

    q: str = ""
    k: str = ""
    v: str = ""
    head_dim: int | None = None  # set by the engine
    head: str | None = None

    def hf_keys(self, layer):
        return [_fill(p, layer) for p in (self.q, self.k, self.v)]

    def hf_shapes(self, layer, full):
        # (3*nh*hd, ...) fused -> (nh*hd, ...) for each of Q, K and V
        return {k: (full[0] // 3, *full[1:]) for k in self.hf_keys(layer)}

    def to_megatron(self, read, layer, rows, full_rows):
        hd = self.head_dim
        # rows of the fused tensor -> the heads they hold -> the same heads' rows in Q, K, V
        start, end = rows if rows is not None else (0, full_rows)
        h0, h1 = start // (3 * hd), end // (3 * hd)
        parts = [read(k, (h0 * hd, h1 * hd)) for k in self.hf_keys(layer)]  # each (nh_l*hd, ...)
        rest = parts[0].shape[1:]
        stacked = torch.stack([p.reshape(h1 - h0, hd, *rest) for p in parts], dim=1)  # (nh_l, 3, hd, ...)
        return stacked.reshape((h1 - h0) * 3 * hd, *rest)

    def to_hf(self, full, layer):
        hd = self.head_dim
        rest = full.shape[1:]
        per_head = full.reshape(-1, 3, hd, *rest)  # (nh, 3, hd, ...)
        return {k: per_head[:, i].reshape(-1, *rest).contiguous() for i, k in enumerate(self.hf_keys(layer))}


@dataclass
class Ignore:
    """Checkpoint keys that are known and deliberately not loaded, with the reason."""

    pattern: str
    reason: str

    def covers(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key, self.pattern)


@dataclass
class FuseGQA(Mapping):
    """Separate Q, K, V of grouped-query attention <-> megatron's fused QKV, grouped per key/value head:
    ``[q heads of group 0; k_0; v_0; q heads of group 1; k_1; v_1; ...]`` along dim 0 (each head
    ``head_dim`` rows), so a tensor-parallel split of dim 0 gives each rank whole groups."""

    q: str = ""
    k: str = ""
    v: str = ""
    head_dim: int | None = None
    num_heads: int | None = None
    num_groups: int | None = None
    head: str | None = None

    def hf_keys(self, layer):
        return [_fill(p, layer) for p in (self.q, self.k, self.v)]

    def hf_shapes(self, layer, full):
        q, k, v = self.hf_keys(layer)
        hd, rest = self.head_dim, tuple(full[1:])
        return {q: (self.num_heads * hd, *rest), k: (self.num_groups * hd, *rest), v: (self.num_groups * hd, *rest)}

    def to_megatron(self, read, layer, rows, full_rows):
        hd, per = self.head_dim, self.num_heads // self.num_groups
        group_rows = (per + 2) * hd
        start, end = rows if rows is not None else (0, full_rows)
        g0, g1 = start // group_rows, end // group_rows
        q, k, v = self.hf_keys(layer)
        q = read(q, (g0 * per * hd, g1 * per * hd))
        k, v = read(k, (g0 * hd, g1 * hd)), read(v, (g0 * hd, g1 * hd))
        rest = q.shape[1:]
        n = g1 - g0
        fused = torch.cat([q.reshape(n, per * hd, *rest), k.reshape(n, hd, *rest), v.reshape(n, hd, *rest)], dim=1)
        return fused.reshape(n * group_rows, *rest)

    def to_hf(self, full, layer):
        hd, per = self.head_dim, self.num_heads // self.num_groups
        rest = full.shape[1:]
        grouped = full.reshape(self.num_groups, (per + 2) * hd, *rest)
        q, k, v = grouped.split([per * hd, hd, hd], dim=1)
        return {key: t.reshape(-1, *rest).contiguous() for key, t in zip(self.hf_keys(layer), (q, k, v))}


@dataclass
class FuseGateUp(Mapping):
    """SwiGLU's gate and up projections <-> megatron's gated ``linear_fc1``. Megatron's GLU halves each
    rank's *own* output (``act(x[:n/2]) * x[n/2:]``), so rank r holds ``[gate_r; up_r]`` and the
    TP-gathered tensor is ``[gate_0; up_0; gate_1; up_1; ...]``: the split depends on the TP size, taken
    from the rows asked for (loading) and from the current layout (saving)."""

    gate: str = ""
    up: str = ""
    head: str | None = None
    expert: bool = False  # an MoE expert's fc1: split by the expert tensor-parallel size, not tp

    def hf_keys(self, layer):
        return [_fill(self.gate, layer), _fill(self.up, layer)]

    def hf_shapes(self, layer, full):
        return {k: (full[0] // 2, *full[1:]) for k in self.hf_keys(layer)}

    def to_megatron(self, read, layer, rows, full_rows):
        start, end = rows if rows is not None else (0, full_rows)
        half, first = (end - start) // 2, start // 2  # this rank's rows of gate and of up
        gate, up = self.hf_keys(layer)
        return torch.cat([read(gate, (first, first + half)), read(up, (first, first + half))])

    def to_hf(self, full, layer):
        from zhnlp import distributed

        lay = distributed.layout()
        tp = lay.etp if self.expert else lay.tp
        rest = full.shape[1:]
        per_rank = full.reshape(tp, 2, full.shape[0] // (2 * tp), *rest)  # (tp, gate|up, ffn/tp, ...)
        gate, up = self.hf_keys(layer)
        return {gate: per_rank[:, 0].reshape(-1, *rest).contiguous(),
                up: per_rank[:, 1].reshape(-1, *rest).contiguous()}


@dataclass
class Unsqueeze(Rename):
    """A 1-D parameter <-> a checkpoint tensor with a leading axis of 1 (``(n,)`` <-> ``(1, n)``), e.g.
    ERNIE 4.5's expert-score correction bias, which transformers stores per expert *group*."""

    def hf_shapes(self, layer, full):
        return {_fill(self.hf, layer): (1, *full)}

    def to_megatron(self, read, layer, rows, full_rows):
        return read(_fill(self.hf, layer)).reshape(-1)

    def to_hf(self, full, layer):
        return {_fill(self.hf, layer): full.reshape(1, -1)}


@dataclass
class SharedLayer(Mapping):
    """One checkpoint weight that serves several layers (ALBERT's layer groups): every megatron layer ``j``
    (``*`` in ``megatron``) reads the keys of ``inner`` (a Rename or FuseQKV whose checkpoint names have two
    ``*``: group and layer within the group) at ``slots[j]``, its ``(group, inner)`` index. Loading fills each
    layer's copy from the same keys; saving writes them once (the engine skips the copies marked ``shared``)."""

    inner: Mapping | None = None
    slots: tuple[tuple[int, int], ...] = ()
    head: str | None = None

    def hf_keys(self, layer):
        return self.inner.hf_keys(self.slots[layer])

    def hf_shapes(self, layer, full):
        return self.inner.hf_shapes(self.slots[layer], full)

    def to_megatron(self, read, layer, rows, full_rows):
        return self.inner.to_megatron(read, self.slots[layer], rows, full_rows)

    def to_hf(self, full, layer):
        return self.inner.to_hf(full, self.slots[layer])
