"""``output_hidden_states=True``: every layer's output, complete on every rank; and
``output_router_logits=True`` (mixture of experts): every MoE layer's router logits.

Forward hooks record the embeddings' output (index 0) and each transformer layer's (its global
``layer_number``) while zhnlp's forward runs; pipeline micro-batches are concatenated. Under sequence
parallelism a recorded tensor holds this rank's part of the sequence and is gathered over the TP group;
under pipeline parallelism each stage broadcasts the layers it owns, so every rank returns the whole tuple.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


class Recorder(contextlib.AbstractContextManager):
    """Records hidden states of ``chunks`` (this rank's model chunks) while the ``with`` block runs; with
    ``routers=True`` instead the router logits ``x W^T`` (float32, ``(s, b, E)``, with autograd) of every MoE
    layer, under the layer's global ``layer_number``."""

    def __init__(self, chunks, routers: bool = False):
        self.chunks = chunks
        self.routers = routers
        self.recorded: dict[int, list[torch.Tensor]] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        if self.routers:
            for chunk in self.chunks:
                for layer in chunk.encoder.layers:
                    router = getattr(layer.mlp, "router", None)
                    if router is not None:
                        self._hook_router(router, layer.layer_number)
            return self
        for chunk in self.chunks:
            # a head that reads only [CLS] lets the last layer skip other positions: not while recording
            if hasattr(chunk, "all_positions"):
                self._stack.enter_context(chunk.all_positions())
            embedding = getattr(chunk, "embedding", None)
            if embedding is not None:
                self._hook(embedding, 0)
            for layer in chunk.encoder.layers:
                self._hook(layer, layer.layer_number)
        return self

    def _hook(self, module, index: int) -> None:
        def record(_module, _inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self.recorded.setdefault(index, []).append(hidden)

        handle = module.register_forward_hook(record)
        self._stack.callback(handle.remove)

    def _hook_router(self, router, index: int) -> None:
        def record(module, inputs, _output):
            x = inputs[0]  # (s, b, h): the tokens this rank routes
            logits = torch.nn.functional.linear(x.float(), module.weight.float())
            self.recorded.setdefault(index, []).append(logits)

        handle = router.register_forward_hook(record)
        self._stack.callback(handle.remove)

    def __exit__(self, *exc):
        self._stack.close()
        return False

    def complete(self, layout, dtype: torch.dtype, num_layers: int, indices=None) -> tuple[torch.Tensor, ...]:
        """``num_layers + 1`` tensors ``(b, s, h)`` (or those of ``indices``), the same on every rank (collective
        under TP/SP and PP)."""
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        mine = {}
        for index, parts in self.recorded.items():
            parts = [p.transpose(0, 1) for p in parts]  # (s, b, h) -> (b, s, h) per micro-batch
            full = torch.cat(parts, dim=0)
            if self.chunks[0].config.sequence_parallel:
                # (b, s/tp, h) on each TP rank -> (b, s, h)
                full = tensor_parallel.gather_from_sequence_parallel_region(
                    full.transpose(0, 1).contiguous(), tensor_parallel_output_grad=False).transpose(0, 1)
            mine[index] = full
        indices = list(range(num_layers + 1)) if indices is None else list(indices)
        if layout.pp == 1:
            return tuple(mine[i] for i in indices)
        group = ps.get_pipeline_model_parallel_group()
        ranks = dist.get_process_group_ranks(group)
        owners = [None] * layout.pp
        shapes = {i: tuple(t.shape) for i, t in mine.items()}
        dist.all_gather_object(owners, shapes, group=group)
        out = []
        for i in indices:
            stage = next(st for st, held in enumerate(owners) if i in held)
            if stage == layout.pp_rank:
                t = mine[i].to(dtype).contiguous()
            else:
                t = torch.empty(owners[stage][i], dtype=dtype, device=mine_device(mine))
            dist.broadcast(t, src=ranks[stage], group=group)
            out.append(t)
        return tuple(out)


def mine_device(mine: dict) -> torch.device:
    from zhnlp import distributed

    return next(iter(mine.values())).device if mine else distributed.device()
