"""One training loop on megatron-core for every parallel layout.

The model comes from zhnlp's family code (layout-independent initialisation), is wrapped in
megatron's DistributedDataParallel per chunk, optimised by megatron's optimizer (plain or
distributed) with its parameter scheduler, and stepped by megatron's forward/backward
schedules (no pipelining, 1F1B, interleaved). Objectives differ only in their step function:
:func:`forward_step` (the model's head computes the loss) serves masked LM (the encoders), causal LM
(the decoders) and fine-tuning. The family, and with it the pretraining head and dataset, follows the
recipe's ``model["model_type"]`` (:attr:`RunConfig.family`, :attr:`RunConfig.head`).

Precision: fp32; bf16 (bf16 weights, fp32 main parameters in the optimizer); fp16 with
dynamic loss scaling (overflowing steps are skipped and counted in the metrics).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.distributed import cpu
from zhnlp.distributed.meter import CommMeter
from zhnlp.errors import ZhnlpError
from zhnlp.planning.timing import decoder_flops, train_flops  # noqa: F401  (decoder_flops: re-exported)
from zhnlp.training.config import RunConfig
from zhnlp.training.peak_memory import PeakTensorMemory


def forward_step(data_iterator, model):
    """Forward one micro-batch of any objective: the head computes the loss from the labels in the
    batch (``labels`` for masked LM, classification and tagging; ``start_positions`` and
    ``end_positions`` for spans). The last stage returns the loss (the head's mean)."""
    batch = next(data_iterator)
    kwargs = {"fp32_output": False} if model.config.bf16 or model.config.fp16 else {}  # Float16Module: keep the dict
    out = model(**batch, gather_logits=False, **kwargs)

    def loss_func(output):
        loss = output["loss"]
        if model.config.calculate_per_token_loss:
            # causal LM over the global batch's target tokens: megatron sums (loss x targets) over the
            # micro-batches and scales the gradients by the total target count of every data-parallel rank
            from zhnlp.models.common.decoder import causal_lm_targets

            count = causal_lm_targets(batch["labels"]).to(loss.device)
            total = loss * count
            return total, count.int(), {"loss": torch.stack([total.detach().float(), count.float()])}
        # a copy: the schedule divides the returned loss by the number of micro-batches in place
        return loss, {"loss": loss.detach().clone()}

    return out, loss_func


masked_lm_step = forward_step  # pretraining's step: the MLM head's loss over the masked tokens
causal_lm_step = forward_step  # the decoders': the causal-LM loss over every position (labels shifted inside)


# the parts of a step the communication meter charges its calls to (zhnlp.distributed.meter)
FORWARD_BACKWARD, GRAD_SYNC, OPTIMIZER = "forward_backward", "grad_sync", "optimizer"

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # --precision -> parameters


def run_options(cfg: RunConfig) -> dict:
    """The run-side model options of ``cfg`` (precision, sequence parallelism, recompute; for a
    mixture-of-experts model the ``moe`` section: aux-loss weight, capacity and token dropping) that
    ``PretrainedModel`` passes to megatron's TransformerConfig."""
    dtype = DTYPES[cfg.precision]
    run = {"sequence_parallel": cfg.parallel.sequence_parallel}
    if getattr(cfg.architecture(), "is_moe", False):
        run.update(dataclasses.asdict(cfg.moe))  # megatron's field names
    if dtype != torch.float32:  # half-precision weights; the optimizer keeps fp32 main copies
        run.update(params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16)
    if cfg.data.per_token_loss:
        run["calculate_per_token_loss"] = True
    if cfg.recompute == "full":
        run.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif cfg.recompute == "selective":
        run.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    return run


def _offload_options(o) -> dict:
    """megatron-core's hybrid device optimizer for ``--optimizer-offload`` (GPU runs; checked by RunConfig.check):
    that fraction of the distributed optimizer's states, and its Adam step, live in host memory."""
    if o.optimizer_offload is None:
        return {}
    return {"optimizer_cpu_offload": True, "optimizer_offload_fraction": float(o.optimizer_offload),
            "use_precision_aware_optimizer": True}


def _corpus_tokenizer(prefix: str) -> str:
    """The tokenizer ``zhnlp preprocess`` recorded in ``PREFIX.json``."""
    from zhnlp.errors import DataError

    meta = Path(f"{prefix}.json")
    try:
        tokenizer = json.loads(meta.read_text(encoding="utf-8")).get("tokenizer")
    except FileNotFoundError:
        tokenizer = None
    except (ValueError, AttributeError):  # not JSON / not an object
        raise DataError(f"{meta} is damaged (not the JSON object zhnlp preprocess writes); preprocess the corpus "
                        "again, or name its tokenizer in the run config (data.tokenizer).") from None
    if not isinstance(tokenizer, str):
        raise DataError(f"{meta} is missing or names no tokenizer; preprocess the corpus again with zhnlp "
                        "preprocess, or name its tokenizer in the run config (data.tokenizer).")
    return tokenizer


# default data: the demo corpus
DEMO_RECIPES = ("ernie-debug", "ernie-tiny", "ernie4.5-debug", "ernie4.5-tiny", "ernie4.5-moe-debug")


class Trainer:
    """Builds model, optimizer, scheduler and data for a :class:`RunConfig` and trains it."""

    def __init__(self, cfg: RunConfig, model=None, batches=None, tokenizer_name: str | None = None):
        """Args:
            cfg: the run.
            model: ``model(run_options) -> PretrainedModel``, built after the process groups exist
                (fine-tuning loads a checkpoint with a task head here). Default: a fresh model of
                ``cfg.model`` with its family's pretraining head (masked LM for the encoders, causal LM
                for the decoders) trained on ``cfg.data`` (pretraining).
            batches: ``batches(step) -> list of micro-batch dicts`` for this data-parallel rank;
                required with ``model``.
            tokenizer_name: recorded in checkpoints (export writes this tokenizer).
        """
        p = cfg.parallel
        self.cfg = cfg
        self.layout = lay = distributed.init(tp=p.tp, pp=p.pp, vpp=p.vpp, ep=p.ep, etp=p.etp, seed=cfg.seed)
        cfg.check(lay.world_size)
        # allocator-level peak (parameters, gradient buffers, optimizer states, activations) from here on
        self.peak_memory = PeakTensorMemory(window=cfg.logging.memory_window)
        self.peak_memory.start()
        try:
            self._build(cfg, model, batches, tokenizer_name)
        except BaseException:
            self.peak_memory.close()  # a profiler left running at exit crashes the interpreter
            raise

    def _build(self, cfg: RunConfig, model, batches, tokenizer_name) -> None:
        """Model (``model`` or a fresh one of the recipe), DDP wrapping, optimizer and scheduler."""
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        from zhnlp.models.common.pretrained import PretrainedModel

        p, o, lay = cfg.parallel, cfg.optimizer, self.layout
        dtype = DTYPES[cfg.precision]
        run = run_options(cfg)
        if model is None:
            self.dataset = self._dataset()
            self.batches = Prefetch(self._micro_batches) if cfg.data.prefetch else self._micro_batches
            self.model = PretrainedModel.from_config(cfg.family, cfg.architecture(), cfg.head, seed=cfg.seed, **run)
        else:
            if batches is None:
                raise TypeError("Trainer(model=...) needs batches=step -> micro-batches as well")
            self.model, self.batches = model(run), batches
            self.tokenizer_name = tokenizer_name
        if cfg.compile:  # torch.compile of the transformer layers, in place (zhnlp.models.common.compiled)
            from zhnlp.models.common.compiled import compile_layers

            compile_layers(self.model)
        self.config = tconf = self.model.transformer_config
        with cpu.device_mode():
            chunks = self.model.chunks
            # --overlap-param-gather: the optimizer step updates each rank's shard only; the next forward's
            # pre-hooks wait for each bucket's all-gather and start the next bucket's. Under the interleaved
            # schedule megatron starts each chunk's gathers itself, at the same point on every stage (aligned).
            aligned = p.overlap_param_gather and len(chunks) > 1
            ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=p.overlap_grad_reduce,
                                                use_distributed_optimizer=o.distributed_optimizer,
                                                bucket_size=p.bucket_size, align_param_gather=aligned,
                                                overlap_param_gather=p.overlap_param_gather)
            if dtype != torch.float32:
                from megatron.core.transformer.module import Float16Module

                chunks = [Float16Module(tconf, c) for c in chunks]
            if p.fsdp:  # torch FSDP2 through megatron (see zhnlp.training.fsdp)
                from zhnlp.training import fsdp

                self.chunks = [fsdp.wrap(tconf, c) for c in chunks]
            else:
                self.chunks = [DistributedDataParallel(tconf, ddp, c) for c in chunks]
            self.optimizer = get_megatron_optimizer(OptimizerConfig(
                optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay, adam_beta1=o.adam_beta1,
                adam_beta2=o.adam_beta2, adam_eps=o.adam_eps, clip_grad=o.clip_grad, params_dtype=dtype,
                bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
                initial_loss_scale=o.initial_loss_scale,  # fp16: dynamic loss scaling from here
                use_distributed_optimizer=o.distributed_optimizer, overlap_param_gather=p.overlap_param_gather,
                **_offload_options(o)), self.chunks)
            self.scheduler = OptimizerParamScheduler(
                self.optimizer, init_lr=0.0, max_lr=o.lr, min_lr=o.min_lr, lr_warmup_steps=o.warmup_steps,
                lr_decay_steps=max(cfg.steps, o.warmup_steps + 1), lr_decay_style=o.decay_style,
                start_wd=o.weight_decay, end_wd=o.weight_decay, wd_incr_steps=cfg.steps, wd_incr_style="constant")
        # megatron reads these from the model config inside its schedules
        tconf.finalize_model_grads_func = finalize_model_grads  # DP/TP/embedding gradient reductions
        family_grads = self.model.family.finalize_grads
        if family_grads is not None:  # the family's own reductions first (ALBERT: its shared layers' copies)
            def finalize(model, *args, **kwargs):
                family_grads(model)
                return finalize_model_grads(model, *args, **kwargs)

            tconf.finalize_model_grads_func = finalize
        self._grad_sync_s = 0.0  # this step's time in the gradient reductions after the backward
        self._checkpoint_s = 0.0  # time saving checkpoints since the last logged step
        self.comm = CommMeter()  # the step's communication by kind (tp, pp, dp, ep)
        tconf.finalize_model_grads_func = self._timed(tconf.finalize_model_grads_func)
        tconf.no_sync_func = [c.no_sync for c in self.chunks] if len(self.chunks) > 1 else self.chunks[0].no_sync
        if p.overlap_grad_reduce:  # the pipeline schedules start each chunk's reduction after its last backward
            tconf.grad_sync_func = ([c.start_grad_sync for c in self.chunks] if len(self.chunks) > 1
                                    else self.chunks[0].start_grad_sync)
        if aligned:  # the interleaved schedule starts each chunk's parameter gathers (megatron's param_sync_func)
            tconf.param_sync_func = [c.start_param_sync for c in self.chunks]
        tconf.grad_scale_func = self.optimizer.scale_loss
        self.dp_group = ps.get_data_parallel_group()
        self.logging_rank = lay.world_size - 1  # on the last pipeline stage, where the loss is
        self.output = Path(cfg.output)
        self.step = 0

    def _dataset(self):
        """The pretraining samples of the recipe's objective: masked LM (encoders) or packed causal LM
        (decoders) over ``data.prefix``, or over the demo corpus for the debug/tiny recipes."""
        from zhnlp.data.causal_lm import CausalLMDataset, check_objective, corpus_info
        from zhnlp.data.pretraining import MaskedLMDataset, SpecialTokens, check_corpus_prefix
        from zhnlp.tokenizers import AutoTokenizer

        d, causal = self.cfg.data, self.cfg.head == "causal_lm"
        objective = "causal-lm" if causal else "mlm"
        if d.prefix is None and self.cfg.recipe in DEMO_RECIPES:
            # the project's own corpus, fetched and preprocessed once (by rank 0; the others wait)
            from zhnlp.data.demo import demo_corpus

            if dist.get_rank() == 0:
                demo_corpus(objective=objective)
            distributed.barrier()
            d.prefix = str(demo_corpus(objective=objective))
        if d.prefix is None:
            raise ZhnlpError(f"no training data: pass --data PREFIX (a corpus preprocessed with `zhnlp preprocess"
                             f"{' --objective causal-lm' if causal else ''}`).")
        if Path(f"{d.prefix}.json").is_file():  # the corpus says what it was prepared for
            check_objective(d.prefix, objective, self.cfg.recipe)
        check_corpus_prefix(d.prefix, objective)
        tokenizer = d.tokenizer or _corpus_tokenizer(d.prefix)
        self.tokenizer_name = tokenizer
        tok = AutoTokenizer.from_pretrained(tokenizer)
        vocab = len(tok.get_vocab())
        if vocab > self.cfg.model["vocab_size"]:
            raise ZhnlpError(f"the tokenizer has {vocab} tokens but the model's vocab_size is "
                             f"{self.cfg.model['vocab_size']}; use a model with a large enough vocabulary.")
        if not causal:
            return MaskedLMDataset(d.prefix, SpecialTokens.from_tokenizer(tok), seq_length=d.seq_length,
                                   mask_prob=d.mask_prob, max_ngram=d.max_ngram, seed=self.cfg.seed)
        eod, eos = corpus_info(d.prefix).get("eod_token_id"), self.cfg.model.get("eos_token_id")
        if eod is not None and eod != eos:
            raise ZhnlpError(f"--data {d.prefix} ends documents with token id {eod} "
                             f"({corpus_info(d.prefix).get('eod_token')}) but the model's eos_token_id is {eos!r}; "
                             "set the model's eos_token_id to the corpus's EOD (--config with model.eos_token_id) "
                             "so that generation stops where training saw documents end.")
        return CausalLMDataset(d.prefix, d.seq_length, seed=self.cfg.seed, reset_attention=d.reset_attention,
                               eod_mask_loss=d.eod_mask_loss)

    # ------------------------------------------------------------------------------ data
    def _micro_batches(self, step: int) -> list[dict]:
        """This data-parallel rank's micro-batches of global batch ``step`` (samples in order,
        wrapping around the dataset): the global batch is the same for every layout."""
        d, lay = self.cfg.data, self.layout
        per_rank = d.global_batch_size // lay.dp
        first = step * d.global_batch_size + lay.dp_rank * per_rank
        indices = [(first + i) % len(self.dataset) for i in range(per_rank)]
        samples = [self.dataset[i] for i in indices]
        batches = []
        for start in range(0, per_rank, d.micro_batch_size):
            group = samples[start:start + d.micro_batch_size]
            # the dataset's fields: masked LM (input_ids, attention_mask, token_type_ids, labels), causal LM
            # (input_ids, labels; with reset attention also document_ids, position_ids)
            batches.append({k: torch.as_tensor(np.stack([s[k] for s in group])) for k in group[0]})
        return batches

    # ------------------------------------------------------------------------------ loop
    def train_step(self) -> dict:
        """One optimizer step over one global batch; returns its metrics."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        d = self.cfg.data
        waited = time.perf_counter()
        micro = self.batches(self.step)
        waited = time.perf_counter() - waited
        seq = micro[0]["input_ids"].shape[1]  # fine-tuning pads each global batch to its longest sample
        start = time.perf_counter()
        self._grad_sync_s = 0.0
        with cpu.device_mode(), self.comm.measuring() as comm:
            for c in self.chunks:
                c.train()
                c.zero_grad_buffer()
            self.optimizer.zero_grad()
            iters = [iter(micro) for _ in self.chunks] if len(self.chunks) > 1 else iter(micro)
            forward_backward = time.perf_counter()
            with comm.during(FORWARD_BACKWARD):
                losses = get_forward_backward_func()(
                    forward_step_func=forward_step, data_iterator=iters, model=self.chunks,
                    num_microbatches=len(micro), seq_length=seq, micro_batch_size=d.micro_batch_size,
                    forward_only=False)
            optimizer = time.perf_counter()
            forward_backward = optimizer - forward_backward
            with comm.during(OPTIMIZER):
                ok, grad_norm, _ = self.optimizer.step()
                self.scheduler.step(increment=1)
            optimizer = time.perf_counter() - optimizer
            loss = torch.zeros(())
            if losses and self.config.calculate_per_token_loss:  # (loss sum, targets) over micro-batches and ranks
                total = torch.stack([x["loss"] for x in losses]).sum(0)
                dist.all_reduce(total, group=self.dp_group)
                loss = total[0] / total[1].clamp(min=1)
            elif losses:  # last pipeline stage: mean over micro-batches, then over data-parallel ranks
                loss = torch.stack([x["loss"].float() for x in losses]).mean()
                dist.all_reduce(loss, group=self.dp_group)
                loss /= self.layout.dp
        elapsed = time.perf_counter() - start
        self.step += 1
        tokens = d.global_batch_size * seq
        parts = self._parts(forward_backward, optimizer, elapsed)
        return {"step": self.step, "loss": float(loss), "lr": self.optimizer.param_groups[0]["lr"],
                "grad_norm": float(grad_norm) if grad_norm is not None else None,
                "loss_scale": float(self.optimizer.get_loss_scale()), "skipped": int(not ok),
                "tokens_per_s": tokens / elapsed, "mfu": self._flops(tokens, seq) / elapsed / self._peak(),
                "step_time_s": elapsed, "data_wait_s": waited, **parts, **self.comm.traffic(),
                **self._ranks(parts["compute_s"], elapsed),
                "max_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                **self._peak_tensor_bytes(),
                **self._model_metrics()}

    def _parts(self, forward_backward: float, optimizer: float, elapsed: float) -> dict:
        """The step's time in named parts that add up to ``elapsed`` (see README, "Monitoring"): the forward and
        backward less its communication (``compute_s``), tensor-, pipeline- and expert-parallel communication
        (``tp_comm_s``, ``pp_comm_s``, and ``pp_bubble_s``: waiting for a neighbouring stage's activations or
        gradients), the data-parallel communication (``grad_sync_s``: megatron's gradient reductions after the
        backward, buckets reduced during it, parameter all-gathers ``--overlap-param-gather`` left to the forward,
        the loss average), ``optimizer_s`` (its own collectives included) and the rest (``other_s``)."""
        comm = self.comm
        split = (FORWARD_BACKWARD, None)  # phases whose communication is split out (finalize's and the optimizer's
        # stay in grad_sync_s and optimizer_s)
        spent = {kind: sum(comm.time(kind, phase) for phase in split) for kind in ("tp", "dp", "ep")}
        pp = sum(comm.time("pp", phase, receive_wait=False) for phase in split)
        bubble = sum(comm.time("pp", phase, receive_wait=True) for phase in split)
        in_forward_backward = sum(comm.time(kind, FORWARD_BACKWARD) for kind in ("tp", "pp", "dp", "ep"))
        parts = {"compute_s": forward_backward - self._grad_sync_s - in_forward_backward,
                 "tp_comm_s": spent["tp"], "pp_comm_s": pp, "pp_bubble_s": bubble,
                 "ep_comm_s": spent["ep"], "grad_sync_s": self._grad_sync_s + spent["dp"], "optimizer_s": optimizer}
        parts["other_s"] = elapsed - sum(parts.values())
        return parts

    def _timed(self, finalize):
        """megatron's ``finalize_model_grads`` (the gradient reductions after the backward: data-parallel, or the
        wait for the buckets ``--overlap-grad-reduce`` started; the tied embedding's and sequence-parallel
        norms') with its time added to this step's ``grad_sync_s``."""

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                with self.comm.during(GRAD_SYNC):  # its communication is grad_sync_s, whatever the kind
                    return finalize(*args, **kwargs)
            finally:
                self._grad_sync_s += time.perf_counter() - start

        return timed

    def _ranks(self, compute: float, elapsed: float) -> dict:
        """Every rank's compute and step time (one small all-gather): the spread of the step time and the slowest
        rank, the one with the most compute time (in synchronous training the others spend the difference
        waiting in the gradient reduction or the pipeline, so their step times are alike)."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world == 1:
            return {}
        mine = torch.tensor([compute, elapsed], dtype=torch.float64, device=distributed.device())  # NCCL: a GPU
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        every = torch.stack(every).cpu()
        slowest = int(every[:, 0].argmax())
        return {"step_time_min_s": float(every[:, 1].min()), "step_time_max_s": float(every[:, 1].max()),
                "compute_max_s": float(every[slowest, 0]), "compute_min_s": float(every[:, 0].min()),
                "slowest_rank": slowest}

    def _peak_tensor_bytes(self) -> dict:
        """``peak_tensor_bytes``: the allocator-level peak over all ranks since the model was built (see
        :mod:`zhnlp.training.peak_memory`; on a CPU known from step ``logging.memory_window`` on)."""
        peak = self.peak_memory.after_step(self.step)
        return {} if peak is None else {"peak_tensor_bytes": peak}

    def _model_metrics(self) -> dict:
        """Figures the model itself reports after a step, logged into metrics.jsonl beside the loss: a
        mixture-of-experts model's ``moe_metrics()`` (e.g. ``moe_aux_loss``, tokens per expert min/max
        per layer). Every rank calls it after the optimizer step (it may reduce over ranks; the logging
        rank's dict is what is logged); a model without the method reports nothing."""
        report = getattr(self.model, "moe_metrics", None)
        return dict(report()) if report is not None else {}

    def train(self, steps: int | None = None, after_step=None) -> list[dict]:
        """Train to ``steps`` (default: the config's). On the logging rank: OUTPUT/metrics.jsonl,
        TensorBoard events in OUTPUT/tensorboard and a progress bar with ETA.

        ``after_step(metrics) -> bool`` (collective: every rank calls it after every step, before the
        step's checkpoint, so that a checkpoint holds what it did, and before the step is logged, so that
        the record has the checkpoints' time) lets a caller evaluate, save or stop: True ends the loop
        after this step (the return value is then the history so far). Fine-tuning evaluates and stops
        early through it.

        With ``checkpoint.resume`` the newest loadable checkpoint under OUTPUT/checkpoints is
        loaded first (damaged newer ones are named and passed over); with
        ``checkpoint.save_interval`` one is written every that many steps; with ``checkpoint.async_save``
        in the background, completed at the first step after its write is done on every rank (at the latest
        before the next save, at the end of this call or on a stop signal).

        SIGTERM or SIGINT (on any rank) ends the loop after the current step on every rank: with
        ``checkpoint.save_on_stop`` a checkpoint is written, then :class:`zhnlp.errors.Interrupted`
        is raised, carrying ``step`` (the steps done), ``checkpoint`` (the path, or None) and
        ``history`` (this call's metrics, as the return value would have been)."""
        from zhnlp.training import checkpoint

        ck = self.cfg.checkpoint
        with contextlib.closing(self.peak_memory):  # stopped however this ends (a failed resume included)
            try:
                if ck.resume:
                    checkpoint.resume(self)
                return self._loop(steps, after_step)
            finally:
                if isinstance(self.batches, Prefetch):
                    self.batches.close()

    def _loop(self, steps, after_step) -> list[dict]:
        from zhnlp.training import checkpoint
        from zhnlp.training.monitor import Monitor
        from zhnlp.training.signals import stop_signals

        ck = self.cfg.checkpoint
        history = []
        end = self.cfg.steps if steps is None else steps
        monitor = Monitor(self.output, total_steps=end, enabled=dist.get_rank() == self.logging_rank,
                          start_step=self.step)
        with monitor, stop_signals() as stop:
            while self.step < end:
                m = self.train_step()
                self.finish_saves(blocking=False)  # complete a background save whose write is done
                if not torch.isfinite(torch.tensor(m["loss"])):
                    good = checkpoint.latest(self.output / "checkpoints")
                    raise ZhnlpError(f"the loss became {m['loss']} at step {m['step']}; stopping. Last good checkpoint: "
                                     f"{good or 'none'}. Lower the learning rate and resume from it.")
                history.append(m)
                done = bool(after_step(m)) if after_step is not None else False
                if ck.save_interval and self.step % ck.save_interval == 0:
                    self.save(keep=ck.keep)
                m["checkpoint_s"] = self._checkpoint_s  # this step's saves, and earlier ones not yet logged
                if m["step"] % self.cfg.logging.log_interval == 0:
                    monitor.log(m)
                    self._checkpoint_s = 0.0
                signum = stop.agreed()  # every rank, every step: all stop after the same one
                if signum:
                    self.finish_saves(blocking=True)  # this step's background save counts as saved
                    self._stop(signum, self._saved_now(), history)
                if done:
                    break
            self.finish_saves(blocking=True)
        self.gather_params()  # the caller's model holds the trained weights
        return history

    def gather_params(self) -> None:
        """Complete the parameter all-gathers that ``--overlap-param-gather`` leaves to the next forward (collective;
        nothing to do without it). The distributed optimizer's step updates each rank's shard of the parameters
        only; the rest of the weights stay those of the step before until the next forward's pre-hooks wait for
        them. Whatever reads the weights between steps calls this first: :meth:`save`, fine-tuning's evaluation
        and best-model export, and the end of :meth:`train` (so the model a caller gets back is the trained one).
        The next forward then finds the gathers done."""
        if not self.cfg.parallel.overlap_param_gather:
            return
        with cpu.device_mode():
            for chunk in self.chunks:
                chunk.start_param_sync(force_sync=True)

    def save(self, keep: int = 3, wait: bool = False) -> Path:
        """:func:`zhnlp.training.checkpoint.save` (collective), its time reported in the metrics of the step (or,
        between logged steps, of the next logged one) as ``checkpoint_s``. With ``checkpoint.async_save`` (and not
        ``wait``) the write goes on in the background: the path is complete once :meth:`finish_saves` says so."""
        from zhnlp.training import checkpoint

        start = time.perf_counter()
        try:
            self.gather_params()  # the checkpoint holds the updated weights, not the stale parts of each rank's copy
            return checkpoint.save(self, keep=keep, background=self.cfg.checkpoint.async_save and not wait)
        finally:
            self._checkpoint_s += time.perf_counter() - start

    def finish_saves(self, blocking: bool) -> None:
        """:func:`zhnlp.training.checkpoint.finish_saves` (collective), its time (the training loop's stall)
        counted in ``checkpoint_s`` like the saves'."""
        from zhnlp.training import checkpoint

        queue = getattr(self, "async_saves", None)
        if queue is None or not queue.get_num_unfinalized_calls():
            return  # nothing in flight: no time to count
        start = time.perf_counter()
        try:
            checkpoint.finish_saves(self, blocking=blocking)
        finally:
            self._checkpoint_s += time.perf_counter() - start

    def _saved_now(self):
        """The checkpoint written at the current step (by the loop or by ``after_step``), or None."""
        step, path = getattr(self, "last_checkpoint", (None, None))
        return path if step == self.step else None

    def _flops(self, tokens: int, s: int) -> float:
        """Model FLOPs of one step at sequence length ``s``: :func:`zhnlp.planning.timing.train_flops` (the
        planner's time model counts the same), of the decoder config for a causal LM, else of the recipe's
        ``model`` fields."""
        causal = self.model.head == "causal_lm"
        return train_flops(self.model.config if causal else self.cfg.model, tokens, s, head=self.model.head,
                           mask_prob=self.cfg.data.mask_prob, sequence_parallel=self.cfg.parallel.sequence_parallel)

    def _peak(self) -> float:
        return self.cfg.logging.peak_tflops * 1e12 * self.layout.world_size

    def _stop(self, signum: int, saved, history: list[dict]) -> None:
        """End training for the stop signal ``signum``, which every rank agreed on after this step:
        save (unless this step was just saved, or the caller turned ``save_on_stop`` off) and raise
        Interrupted. A second Ctrl-C during the save abandons it as ``.incomplete``, which resuming ignores."""
        import signal

        from zhnlp.errors import Interrupted
        from zhnlp.training import checkpoint

        ck, name = self.cfg.checkpoint, signal.Signals(signum).name
        path = saved
        if path is None and ck.save_on_stop:
            try:
                path = self.save(keep=ck.keep, wait=True)
            except KeyboardInterrupt:
                previous = checkpoint.latest(self.output / "checkpoints")
                raise Interrupted(f"stopped by {name} at step {self.step}; the checkpoint save was aborted by a "
                                  f"second SIGINT; the last complete checkpoint is {previous or 'none'}",
                                  signal.SIGINT) from None
        self.gather_params()  # every rank agreed to stop here: the model the caller keeps is up to date
        where = f"; checkpoint {path}; continue with --resume" if path is not None else ""
        stop = Interrupted(f"stopped by {name} at step {self.step}{where}", signum)
        stop.step, stop.checkpoint, stop.history = self.step, path, history
        raise stop


class Prefetch:
    """``make(step)`` (a pure function of the step: the micro-batches of global batch ``step``) with the next step's
    result prepared on a background thread while the caller computes this one. Asked for another step than the
    one prepared (a resume, a second ``train()``), it makes that step itself; the results are those of ``make``."""

    def __init__(self, make):
        from concurrent.futures import ThreadPoolExecutor

        self.make = make
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zhnlp-data")
        self.pending = None  # (step, future)

    def __call__(self, step: int):
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] == step:
            batches = pending[1].result()  # an error making it is raised here, in the step that needs it
        else:
            if pending is not None:
                pending[1].cancel()
            batches = self.make(step)
        self.pending = (step + 1, self.pool.submit(self.make, step + 1))
        return batches

    def close(self) -> None:
        """Drop what was prepared ahead and stop the thread; a later call starts it again."""
        from concurrent.futures import ThreadPoolExecutor

        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zhnlp-data")
