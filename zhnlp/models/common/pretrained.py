"""The model object users hold: one call signature for every parallel layout.

:class:`PretrainedModel` owns this rank's model chunks (one, or ``vpp`` with a virtual
pipeline) and makes ``model(input_ids, ...)`` behave as on one device:

* TP > 1: the chunk's outputs are already complete on every rank (logits are gathered).
* PP > 1: a forward-only megatron pipeline schedule runs the stages; the last stage's
  outputs are broadcast so every rank receives them.

It also runs the family's conversion table: ``from_checkpoint`` (transformers directory in)
and ``save_pretrained`` (transformers directory out).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed, fileio
from zhnlp.distributed import cpu
from zhnlp.conversion import engine
from zhnlp.models.common import heads as H
from zhnlp.models.common.family import Family

logger = logging.getLogger("zhnlp")


class ModelOutput(dict):
    """Outputs by transformers' names, as attributes or keys; absent fields read as None."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)


class PretrainedModel(torch.nn.Module):
    """A model of one family with one head, built for the current parallel layout."""

    def __init__(self, family: Family, arch, head: str, run_options: dict | None = None):
        super().__init__()
        with cpu.device_mode():
            self._build(family, arch, head, run_options)

    def _build(self, family: Family, arch, head: str, run_options: dict | None) -> None:
        from megatron.core import parallel_state as ps

        self.family, self.config, self.head = family, arch, head
        self.layout = distributed.layout()
        lay = self.layout
        self.run_options = dict(run_options or {})
        self.transformer_config = family.transformer_config(arch, tp=lay.tp, pp=lay.pp, vpp=lay.vpp,
                                                            **self.run_options)
        chunks = []
        for vp in range(lay.vpp or 1):
            vp_stage = vp if lay.vpp else None
            chunks.append(family.model_class(
                self.transformer_config, arch, head,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                vp_stage=vp_stage))
        self.chunks = torch.nn.ModuleList(chunks)
        # checkpoint keys whose weights were freshly initialised rather than loaded (a new task head);
        # from_config: every parameter. Pipelines refuse such a model unless told otherwise.
        self.fresh_weights: list[str] = []
        if torch.cuda.is_available():  # megatron builds on the CPU (use_cpu_initialization)
            self.chunks.to(distributed.device())

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, family: Family, arch, head: str, seed: int = 1234, **run_options) -> "PretrainedModel":
        """A freshly initialised model (transformers' initialisation: N(0, initializer_range),
        zero biases, unit LayerNorm), identical for every layout and rank."""
        # megatron would initialise its layers itself and then be overwritten: skip that pass
        model = cls(family, arch, head, {"perform_initialization": False, **run_options})
        for chunk in model.chunks:
            model._init_parameters(chunk, None, seed)
        model.fresh_weights = sorted({n for c in model.chunks for n in engine.global_param_names(c).values()})
        return model

    @classmethod
    def from_checkpoint(cls, family: Family, arch, head: str, directory: Path, seed: int = 1234,
                        **run_options) -> "PretrainedModel":
        """Load a transformers checkpoint directory, reading only this rank's slices."""
        bridge = family.bridge
        reader = engine.CheckpointReader(directory, rename=bridge.normalise_key(arch))
        table = bridge.table(arch)
        table.ignores = table.ignores + bridge.other_heads_keys(arch, table, head)
        expected = bridge.expected_keys(arch, table, head)
        report = engine.check_keys(table, expected, reader.keys(), set(bridge.HEAD_PARTS[head]), str(directory))
        engine.check_shapes(bridge.expected_shapes(arch, table, head), reader, str(directory))
        model = cls(family, arch, head, {"perform_initialization": False, **run_options})
        lay = model.layout
        fresh = set(report.fresh)
        for chunk in model.chunks:
            left = engine.load_chunk(chunk, table, reader, lay.tp_rank, lay.tp, fresh)
            model._init_parameters(chunk, set(left), seed)
        model.fresh_weights = list(report.fresh)
        if report.fresh and lay.rank == 0:
            logger.warning("%s has no weights for %s; they are freshly initialised (fine-tune before use).",
                           directory, ", ".join(report.fresh))
        model.eval()
        return model

    def _init_parameters(self, chunk, only: set[str] | None, seed: int) -> None:
        """transformers-style initialisation of ``only`` (global names) or of every parameter.

        Seeded per parameter name so that the values do not depend on the layout or rank."""
        std = self.config.initializer_range
        names = engine.global_param_names(chunk)
        dims = engine.split_dims(chunk)
        with torch.no_grad():
            for local, p in chunk.named_parameters():
                name = names[local]
                if only is not None and name not in only:
                    continue
                if name.endswith("bias"):
                    p.zero_()
                elif "layernorm" in name:
                    p.fill_(1.0)
                else:
                    # draw the full (unsplit) tensor, then keep this rank's shard of it
                    dim, shape = dims[local], list(p.shape)
                    if dim is not None:
                        shape[dim] *= self.layout.tp
                    # the tied MLM decoder on a last stage must start equal to the word embeddings
                    source = "embedding.word_embeddings.weight" if name == "output_layer.weight" else name
                    gen = torch.Generator().manual_seed(seed + _stable_hash(source))
                    value = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
                    if name.endswith("word_embeddings.weight") or name == "output_layer.weight":
                        value[self.config.vocab_size:] = 0  # vocabulary padding rows
                    if dim is not None:
                        value = value.narrow(dim, self.layout.tp_rank * p.shape[dim], p.shape[dim])
                    p.copy_(value)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None,
                position_ids=None, labels=None, start_positions=None, end_positions=None) -> ModelOutput:
        """Run the model; inputs are batch-first ``(b, s)``. Every rank receives complete outputs."""
        with cpu.scope():  # megatron's layers ask torch.cuda for their device
            return self._forward(input_ids, attention_mask, token_type_ids, task_type_ids, position_ids, labels,
                                 start_positions, end_positions)

    def _forward(self, input_ids, attention_mask, token_type_ids, task_type_ids, position_ids, labels,
                 start_positions, end_positions) -> ModelOutput:
        dev = distributed.device()
        batch = {k: v.to(dev) for k, v in dict(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            task_type_ids=task_type_ids, position_ids=position_ids).items() if v is not None}
        targets = {k: v.to(dev) for k, v in dict(
            labels=labels, start_positions=start_positions, end_positions=end_positions).items() if v is not None}
        seq = batch["input_ids"].shape[1]
        if self.transformer_config.sequence_parallel and seq % self.layout.tp:
            raise ValueError(f"under sequence parallelism the sequence length must be a multiple of tp={self.layout.tp}, "
                             f"got {seq}; pad the batch (e.g. tokenizer(..., pad_to_multiple_of={self.layout.tp})).")
        if self.layout.pp == 1:
            return ModelOutput(self.chunks[0](**batch, **targets))
        out = self._pipeline_forward(batch)
        loss = H.head_loss(self.head, out, self.config.num_labels, self.config.problem_type, **targets)
        if loss is not None:
            out["loss"] = loss
        return ModelOutput(out)

    def _pipeline_forward(self, batch: dict) -> dict:
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        b, s = batch["input_ids"].shape
        lay = self.layout
        n = 1
        if lay.vpp:
            # megatron's interleaved schedule needs at least pp micro-batches of equal size
            if b % lay.pp:
                raise ValueError(f"with a virtual pipeline (vpp={lay.vpp}) the batch size must be a multiple of "
                                 f"pp={lay.pp}, got {b}; pad the batch or run without vpp.")
            n = lay.pp
        mbs = b // n
        micro = [{k: v[i * mbs:(i + 1) * mbs] for k, v in batch.items()} for i in range(n)]

        def step(data_iterator, chunk):
            return chunk(**next(data_iterator)), None

        iters = [iter(micro) for _ in self.chunks] if lay.vpp else iter(micro)
        with cpu.device_mode():
            results = get_forward_backward_func()(
                forward_step_func=step, data_iterator=iters, model=list(self.chunks), num_microbatches=n,
                seq_length=s, micro_batch_size=mbs, forward_only=True)
        shapes = self.chunks[-1].output_shapes(b, s)
        src = ps.get_pipeline_model_parallel_last_rank()
        group = ps.get_pipeline_model_parallel_group()
        out = {}
        for name, shape in shapes.items():
            if lay.is_last_stage:
                t = torch.cat([r[name] for r in results]).to(self.transformer_config.params_dtype).contiguous()
            else:
                t = torch.empty(shape, dtype=self.transformer_config.params_dtype, device=distributed.device())
            dist.broadcast(t, src=src, group=group)
            out[name] = t
        return out

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` and safetensors that transformers loads back exactly.

        Collective: every rank must call it. Files are written to temporary names and moved
        into place, so an interrupted save leaves an earlier checkpoint in the directory intact.
        """
        with cpu.device_mode():
            self._save_pretrained(Path(directory))

    def _save_pretrained(self, directory: Path) -> None:
        lay, bridge = self.layout, self.family.bridge
        if lay.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
        distributed.barrier()
        table = bridge.table(self.config)
        rename = bridge.save_prefix_rename(self.config, self.head)
        shard = "model.safetensors" if lay.pp == 1 else f"model-{lay.pp_rank + 1:05d}-of-{lay.pp:05d}.safetensors"
        if lay.dp_rank == 0:
            from megatron.core import parallel_state as ps

            tensors = {}
            for chunk in self.chunks:
                gathered = engine.gather_chunk(chunk, table, ps.get_tensor_model_parallel_group(), lay.tp)
                tensors.update({rename(k): v for k, v in gathered.items()})
            if lay.tp_rank == 0:
                engine.write_safetensors(tensors, directory / shard)
        distributed.barrier()
        if lay.rank == 0:
            if lay.pp > 1:
                self._write_index(directory)
            config = self.config.to_dict(architecture=bridge.hf_architecture(self.config, self.head))
            config["dtype"] = str(self.transformer_config.params_dtype).removeprefix("torch.")
            fileio.write_json(directory / "config.json", config)
        distributed.barrier()

    def _write_index(self, directory: Path) -> None:
        from safetensors import safe_open

        weight_map, total = {}, 0
        for stage in range(self.layout.pp):
            name = f"model-{stage + 1:05d}-of-{self.layout.pp:05d}.safetensors"
            with safe_open(str(directory / name), framework="pt") as f:
                for k in f.keys():
                    weight_map[k] = name
                    t = f.get_slice(k)
                    numel = 1
                    for d in t.get_shape():
                        numel *= d
                    total += numel * torch.finfo(self.transformer_config.params_dtype).bits // 8
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        fileio.write_json(directory / "model.safetensors.index.json", index)
        stale = directory / "model.safetensors"
        if stale.exists():  # a single-file save from an earlier run would shadow the shards
            stale.unlink()


def _stable_hash(name: str) -> int:
    """A process-independent hash (Python's hash() is salted per process)."""
    import zlib

    return zlib.crc32(name.encode())
