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
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.distributed import cpu
from zhnlp.conversion import engine
from zhnlp.models.common import heads as H
from zhnlp.models.common.family import Family
from zhnlp.models.common.outputs import ModelOutput

logger = logging.getLogger("zhnlp")


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
        self.transformer_config = family.transformer_config(
            arch, tp=lay.tp, pp=lay.pp, vpp=lay.vpp, expert_model_parallel_size=lay.ep,
            expert_tensor_parallel_size=lay.etp, **self.run_options)
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
        self.compiled = False  # compiled mode (zhnlp.models.common.compiled.compile_layers)
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
                        ignore_mismatched_sizes: bool = False, **run_options) -> "PretrainedModel":
        """Load a transformers checkpoint directory, reading only this rank's slices.

        ``ignore_mismatched_sizes``: weights whose checkpoint shape differs from the architecture's (a task
        head of another size) are freshly initialised, named in a warning, instead of refused."""
        bridge = family.bridge
        reader = engine.CheckpointReader(directory, rename=bridge.normalise_key(arch))
        table = bridge.table(arch)
        table.ignores = table.ignores + bridge.other_heads_keys(arch, table, head)
        expected = bridge.expected_keys(arch, table, head)
        report = engine.check_keys(table, expected, reader.keys(), set(bridge.HEAD_PARTS[head]), str(directory))
        expected_shapes = bridge.expected_shapes(arch, table, head)
        mismatched = engine.check_shapes(expected_shapes, reader, str(directory),
                                         ignore_mismatched=ignore_mismatched_sizes)
        model = cls(family, arch, head, {"perform_initialization": False, **run_options})
        lay = model.layout
        fresh = set(report.fresh) | set(mismatched)
        if mismatched and lay.rank == 0:
            logger.warning("%s: weights of another size were freshly initialised (ignore_mismatched_sizes=True): %s; "
                           "fine-tune before use.", directory, "; ".join(
                               f"{k}: checkpoint {tuple(reader.shape(k))}, model {tuple(expected_shapes[k][0])}"
                               for k in mismatched))
        for chunk in model.chunks:
            left = engine.load_chunk(chunk, table, reader, lay.tp_rank, lay.tp, fresh, expert_tp=(lay.etp_rank, lay.etp))
            model._init_parameters(chunk, set(left), seed)
        model.fresh_weights = sorted(fresh)
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
                    # draw the full (unsplit) tensor, then keep this rank's shard of it; routed experts are
                    # split by the expert tensor-parallel group (and named by their global expert index)
                    dim, shape = dims[local], list(p.shape)
                    tp, tp_rank = ((self.layout.etp, self.layout.etp_rank) if engine.is_expert(local)
                                   else (self.layout.tp, self.layout.tp_rank))
                    if dim is not None:
                        shape[dim] *= tp
                    # the tied MLM decoder on a last stage must start equal to the word embeddings
                    tied = getattr(self.config, "tie_word_embeddings", True)  # the encoders' MLM decoder is tied
                    source = "embedding.word_embeddings.weight" if name == "output_layer.weight" and tied else name
                    gen = torch.Generator().manual_seed(seed + _stable_hash(source))
                    value = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
                    if name.endswith("word_embeddings.weight") or name == "output_layer.weight":
                        value[self.config.vocab_size:] = 0  # vocabulary padding rows
                    if dim is not None and self._gated(local):
                        # SwiGLU's fused [gate; up]: each rank holds [gate_r; up_r], not a slice of the whole
                        half = p.shape[dim] // 2
                        value = torch.cat([v.narrow(dim, tp_rank * half, half)
                                           for v in value.chunk(2, dim=dim)], dim=dim)
                    elif dim is not None:
                        value = value.narrow(dim, tp_rank * p.shape[dim], p.shape[dim])
                    p.copy_(value)

    def _gated(self, local: str) -> bool:
        """Whether parameter ``local`` is a gated MLP's fused first projection (megatron's ``linear_fc1``
        with ``gated_linear_unit``), whose TP shards interleave the gate and up halves."""
        return self.transformer_config.gated_linear_unit and local.endswith("linear_fc1.weight")

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None,
                position_ids=None, labels=None, start_positions=None, end_positions=None, *,
                output_hidden_states: bool | None = None, output_attentions: bool | None = None,
                output_router_logits: bool | None = None, return_dict: bool | None = None) -> ModelOutput | tuple:
        """Run the model; inputs are batch-first ``(b, s)``. Every rank receives complete outputs.

        ``output_hidden_states=True`` adds ``hidden_states``: the embeddings' output and every layer's,
        ``num_hidden_layers + 1`` tensors ``(b, s, h)`` (one per layer applied: more for ALBERT with
        ``inner_group_num`` > 1), as transformers returns them. ``return_dict=False`` returns the tuple of
        present outputs (``out.to_tuple()``). Attention probabilities are not available: megatron's attention
        does not return them.

        Mixture-of-experts models: ``output_router_logits=True`` (default: the config's ``output_router_logits``)
        adds ``router_logits``, one ``(b*s, experts)`` float32 tensor per MoE layer (batch-major rows, as
        transformers), and ``aux_loss``, transformers' load-balancing loss over them (padding excluded by
        ``attention_mask``); with ``labels`` the loss then includes ``router_aux_loss_coef x aux_loss``.
        """
        if output_attentions:
            from zhnlp.models.common.loading import UnsupportedOptionError

            raise UnsupportedOptionError("output_attentions=True is not supported: megatron-core's attention "
                                         "does not return its probabilities; drop the argument.")
        routers = self._router_outputs(output_router_logits)
        with cpu.scope():  # megatron's layers ask torch.cuda for their device
            if not routers:
                out = self._forward(input_ids, attention_mask, token_type_ids, task_type_ids, position_ids, labels,
                                    start_positions, end_positions, bool(output_hidden_states))
            else:
                from zhnlp.models.common import hidden_states as HS

                with HS.Recorder(self.chunks, routers=True) as recorder:
                    out = self._forward(input_ids, attention_mask, token_type_ids, task_type_ids, position_ids,
                                        labels, start_positions, end_positions, bool(output_hidden_states))
                out = self._with_router_outputs(out, recorder, input_ids.shape, attention_mask)
        return out if return_dict is None or return_dict else out.to_tuple()

    def _router_outputs(self, requested: bool | None) -> bool:
        """Whether this call returns router logits (MoE models only; None: the config's choice)."""
        moe = bool(getattr(self.config, "is_moe", False))
        if requested is None:
            return moe and bool(getattr(self.config, "output_router_logits", False))
        if requested and not moe:
            from zhnlp.models.common.loading import UnsupportedOptionError

            raise UnsupportedOptionError(f"output_router_logits=True needs a mixture-of-experts model; this "
                                         f"{self.config.model_type} model has no router. Drop the argument.")
        return bool(requested)

    def _with_router_outputs(self, out: ModelOutput, recorder, shape, attention_mask) -> ModelOutput:
        """``out`` with ``router_logits`` and ``aux_loss`` added (and the aux loss in ``loss``), in transformers'
        order."""
        from zhnlp.models.common.moe_outputs import load_balancing_loss

        b, s = shape
        cfg = self.config
        layers = [i + 1 for i in cfg.moe_layers]  # megatron's layer_number is 1-based
        logits = recorder.complete(self.layout, torch.float32, cfg.num_hidden_layers, indices=layers)
        # (b, s, E) -> (b*s, E): batch-major rows, as transformers returns them
        router_logits = tuple(t[:b].reshape(b * s, -1) for t in logits)
        mask = None if attention_mask is None else attention_mask.to(router_logits[0].device)
        aux = load_balancing_loss(router_logits, cfg.moe_num_experts, cfg.moe_k, mask)
        fields = dict(out, aux_loss=aux, router_logits=router_logits)
        if fields.get("loss") is not None:
            fields["loss"] = fields["loss"] + cfg.router_aux_loss_coef * aux
        return ModelOutput(fields)

    def _forward(self, input_ids, attention_mask, token_type_ids, task_type_ids, position_ids, labels,
                 start_positions, end_positions, hidden_states: bool = False) -> ModelOutput:
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
        if not hidden_states:
            return self._run(batch, targets)
        from zhnlp.models.common import hidden_states as HS

        with HS.Recorder(self.chunks) as recorder:
            out = self._run(batch, targets)
        b = batch["input_ids"].shape[0]  # (a virtual pipeline may have run extra rows: dropped)
        out["hidden_states"] = tuple(h[:b] for h in recorder.complete(
            self.layout, self.transformer_config.params_dtype, self.transformer_config.num_layers))
        return ModelOutput(out)

    def _run(self, batch: dict, targets: dict) -> ModelOutput:
        if self.layout.pp == 1:
            return ModelOutput(self.chunks[0](**batch, **targets))
        out = self._pipeline_forward(batch)
        if self.head == "causal_lm":
            from zhnlp.models.common.decoder import causal_lm_loss

            loss = causal_lm_loss(out["logits"], targets.get("labels"))
        else:
            loss = H.head_loss(self.head, out, self.config.num_labels, self.config.problem_type,
                               attention_mask=batch.get("attention_mask"), **targets)
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
            # megatron's interleaved schedule needs at least pp micro-batches of equal size: a batch that is not a
            # multiple of pp runs with copies of its last row, dropped from every output afterwards
            extra = -b % lay.pp
            if extra:
                batch = {k: torch.cat([v, v[-1:].expand(extra, *v.shape[1:])]) for k, v in batch.items()}
            n = lay.pp
        rows = batch["input_ids"].shape[0]
        mbs = rows // n
        micro = [{k: v[i * mbs:(i + 1) * mbs] for k, v in batch.items()} for i in range(n)]

        def step(data_iterator, chunk):
            # the "loss" handed to the schedule is a placeholder (forward only); the outputs dict is what
            # it stores. A tensor is needed there: with MoE megatron reads its device for the aux-loss scale.
            return chunk(**next(data_iterator)), lambda out: (torch.zeros((), device=distributed.device()), out)

        iters = [iter(micro) for _ in self.chunks] if lay.vpp else iter(micro)
        with cpu.device_mode():
            results = get_forward_backward_func()(
                forward_step_func=step, data_iterator=iters, model=list(self.chunks), num_microbatches=n,
                seq_length=s, micro_batch_size=mbs, forward_only=True)
        shapes = self.chunks[-1].output_shapes(rows, s)
        src = ps.get_pipeline_model_parallel_last_rank()
        group = ps.get_pipeline_model_parallel_group()
        out = {}
        for name, shape in shapes.items():
            if lay.is_last_stage:
                t = torch.cat([r[name] for r in results]).to(self.transformer_config.params_dtype).contiguous()
            else:
                t = torch.empty(shape, dtype=self.transformer_config.params_dtype, device=distributed.device())
            dist.broadcast(t, src=src, group=group)
            out[name] = t[:b]
        return out

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 20, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 repetition_penalty: float = 1.0, eos_token_id=None, pad_token_id=None, streamer=None):
        """Decoder models: continue ``input_ids`` (b, s) by up to ``max_new_tokens`` with a KV cache; returns
        prompt + new ids as transformers' ``generate`` does (greedy unless ``do_sample``). ``streamer``: an
        object with ``put(ids)`` / ``end()`` (transformers' TextStreamer works)."""
        if self.head != "causal_lm":
            raise TypeError("generate() needs a decoder model (zhnlp.AutoModelForCausalLM); "
                            f"this is a {self.head} model.")
        from zhnlp.models.common.generation import generate

        # compiled layers run eagerly here: the KV cache is state that grows every step (see models.common.compiled)
        with torch.compiler.set_stance("force_eager") if getattr(self, "compiled", False) else nullcontext():
            return generate(self, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p,
                            repetition_penalty, eos_token_id, pad_token_id, streamer)

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, directory: str | os.PathLike, *, max_shard_size: int | str = "50GB",
                        push_to_hub: bool = False, safe_serialization: bool = True, **hub_kwargs) -> None:
        """Write ``config.json`` and safetensors that transformers loads back exactly.

        ``max_shard_size`` (bytes or ``"200MB"``-style, transformers' default 50GB): larger models are split
        into ``model-0000i-of-0000N.safetensors`` with an index, by huggingface_hub's splitter.
        ``push_to_hub=True`` then uploads the directory with huggingface_hub (``repo_id`` defaults to the
        directory's name; ``token``, ``private``, ``commit_message``, ``revision``, ``create_pr`` as in
        transformers); a failed upload raises :class:`~zhnlp.models.common.saving.PushToHubError` and leaves
        the local save intact.

        Collective: every rank must call it. Files are written to temporary names and moved
        into place, so an interrupted save leaves an earlier checkpoint in the directory intact.
        """
        from zhnlp.models.common import saving

        if not safe_serialization:
            raise ValueError("safe_serialization=False: zhnlp writes safetensors only (pickled weights can run "
                             "code when loaded); drop the argument.")
        options = saving.push_options(hub_kwargs) if push_to_hub else {}
        if hub_kwargs and not push_to_hub:
            raise TypeError(f"save_pretrained got unexpected arguments {sorted(hub_kwargs)} (they are for "
                            "push_to_hub=True).")
        with cpu.device_mode():
            saving.save(self, Path(directory), max_shard_size=max_shard_size)
        if push_to_hub:
            saving.push(Path(directory), options.pop("repo_id", None), **options)

    def push_to_hub(self, repo_id: str, *, max_shard_size: int | str = "50GB", **hub_kwargs) -> str | None:
        """Save into a temporary directory and upload it to hub repo ``repo_id`` (see save_pretrained)."""
        import tempfile

        from zhnlp.models.common import saving

        options = saving.push_options({"repo_id": repo_id, **hub_kwargs})
        with tempfile.TemporaryDirectory(prefix="zhnlp-push-") as tmp:
            with cpu.device_mode():
                saving.save(self, Path(tmp), max_shard_size=max_shard_size)
            return saving.push(Path(tmp), options.pop("repo_id"), **options)

    # ------------------------------------------------------------------ transformers' model API
    @property
    def device(self) -> torch.device:
        """The device this rank's parameters live on."""
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype."""
        return self.transformer_config.params_dtype

    def moe_metrics(self) -> dict:
        """Mixture-of-experts figures since the last call (tokens per expert min/max per MoE layer, the
        auxiliary loss): see :func:`zhnlp.models.common.moe.moe_metrics`. Collective; empty without experts."""
        if not getattr(self.config, "is_moe", False):
            return {}
        from zhnlp.models.common.moe import moe_metrics

        return moe_metrics(self)

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters of the whole model (every TP shard and PP stage), counted as transformers counts the
        same model: the vocabulary without its padding rows, tied weights once."""
        from zhnlp.models.common import api

        return api.num_parameters(self, only_trainable, exclude_embeddings)

    def get_input_embeddings(self):
        """The word-embedding module (megatron's vocabulary-parallel embedding: this rank's rows of the
        padded vocabulary); None on pipeline stages without the embeddings."""
        embedding = getattr(self.chunks[0], "embedding", None)
        return None if embedding is None else embedding.word_embeddings

    def get_output_embeddings(self):
        """The masked-LM vocabulary projection (tied to the input embeddings), or None."""
        return getattr(self.chunks[-1], "output_layer", None)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True):
        """Change the vocabulary size (``config.vocab_size``) to ``new_num_tokens``, as transformers does:
        existing rows are kept, new rows start at the mean of the old ones (``mean_resizing=True``) or from
        the model's initialisation. Collective. Returns the new input embeddings."""
        from zhnlp.models.common import api

        if new_num_tokens is None and pad_to_multiple_of is None:
            return self.get_input_embeddings()
        with cpu.device_mode():
            api.resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of, mean_resizing)
        return self.get_input_embeddings()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each layer's activations in the backward pass instead of keeping them (megatron's full
        recompute, one layer at a time): less memory, about a third more compute, same gradients."""
        if gradient_checkpointing_kwargs and set(gradient_checkpointing_kwargs) - {"use_reentrant"}:
            raise TypeError(f"gradient_checkpointing_kwargs {sorted(gradient_checkpointing_kwargs)}: only "
                            "use_reentrant is accepted (megatron's recompute decides the rest).")
        c = self.transformer_config
        c.recompute_granularity, c.recompute_method, c.recompute_num_layers = "full", "uniform", 1

    def gradient_checkpointing_disable(self) -> None:
        c = self.transformer_config
        c.recompute_granularity, c.recompute_method, c.recompute_num_layers = None, None, None

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.transformer_config.recompute_granularity == "full"


def _stable_hash(name: str) -> int:
    """A process-independent hash (Python's hash() is salted per process)."""
    import zlib

    return zlib.crc32(name.encode())
