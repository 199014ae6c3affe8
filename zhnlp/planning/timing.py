"""Time per training step: FLOPs, communication and the pipeline bubble, from the architecture, the layout and a
description of the hardware (no process groups, no tensors).

The parts of :func:`step_time`, in seconds on one rank of the busiest pipeline stage:

* ``compute``: the stage's model FLOPs (:func:`flop_counts`, the same count as the trainer's MFU figure) plus
  what recompute runs again (full: the layers' forward once more; selective: the attention core's forward),
  at the device's achievable rate (``peak x efficiency``). The FLOPs of a stage are split evenly over its
  ``tp x dp`` ranks (the routed experts' too: ``ep x etp x edp = tp x dp``). Where processes share a CPU's cores
  (``compute_slots``), the busy ones beyond the cores slow each other down.
* ``overhead``: a fixed cost per layer and micro-batch that does not grow with the FLOPs (kernel launches,
  framework work); small on a GPU with real widths (the fit on this project's CPU even puts it at zero: the
  debug recipes' 21,128-token vocabulary projection dominates their steps).
* ``tp``: per layer and micro-batch, two all-reduces of the ``b x s x h`` activations forward and two backward;
  with sequence parallelism two all-gathers and two reduce-scatters each way plus the backward's two all-gathers
  of the layer inputs again (for the weight gradients). Likewise at the ends: the vocabulary-parallel embedding's
  output, the output layer's input (and its gradient), and the three small all-reduces of the vocabulary-parallel
  loss (maximum, target logit, sum of exponentials) per micro-batch.
* ``pp``: point-to-point sends of the ``b x s x h`` activations forward and their gradients backward, per
  micro-batch and model chunk.
* ``dp``: the gradient reduction in fp32 (the trainer sets ``grad_reduce_in_fp32``): an all-reduce over the
  data-parallel ranks, or with the distributed optimizer a reduce-scatter and the parameters' all-gather (in
  their precision); routed experts over the expert-data-parallel ranks; the tied embedding's all-reduce between
  the first and the last stage.
  Under ``--fsdp``: per micro-batch two all-gathers of the weights (forward, backward) and a reduce-scatter of
  the gradients, in the parameters' precision.
* ``ep``: the MoE token all-to-alls (dispatch and combine, forward and backward) of ``tokens x k x h``.
* ``bubble``: the pipeline's fill and drain (1F1B and interleaved): the other stages' compute and overhead of one
  micro-batch, over ``vpp``; with balanced stages ``(pp - 1) / (vpp x m)`` of the compute (``m`` micro-batches
  per step and data-parallel rank). The debug recipes' stages are far from balanced (the vocabulary projection
  is most of their FLOPs, all on the last stage), so that their bubble is small.
* ``optimizer``: Adam's pass over the rank's optimizer states, at the memory bandwidth.

Collectives cost as rings: an all-reduce of ``B`` bytes over ``n`` ranks ``2 (n-1)/n x B / bandwidth +
2 (n-1) x latency``, an all-gather, reduce-scatter or all-to-all half that. A group crosses nodes (and uses the
inter-node link) when its ranks' stride puts them on different nodes; ranks are ordered as megatron orders them:
TP innermost, then DP (experts: expert-TP, EP, expert-DP), PP outermost.

Every part is a constant of the hardware times an amount (FLOPs, bytes, messages, layer calls), so that the
constants can be fitted to measured step times by least squares (:func:`calibrate`). On a real cluster: run a
few layouts for ten or so steps (``zhnlp pretrain ... --steps 10 --memory-window 0``), take each run's median
step time after the first two steps (``global_batch x seq_length / tokens_per_s`` in ``metrics.jsonl``), pass
them to :func:`calibrate` with the cluster's preset, and plan with the hardware it returns. Choose layouts that
exercise every link (a TP run inside a node, a DP run across nodes, a PP run): a constant no measurement
exercises keeps the preset's value. ``scripts/validate_timing.py`` does this on this machine's CPU processes
(and reports how well the calibrated model ranks the layouts); ``zhnlp plan --calibrate FILE`` runs such layouts
on one node itself and writes the fitted constants (:mod:`zhnlp.planning.calibrate`).

Checked on this project's machine (a shared 2-core CPU; 18 layouts of ernie-debug, ernie4.5-debug and
ernie4.5-moe-debug on 1-4 processes: data, tensor (with and without sequence parallelism), pipeline (with and
without interleaving), expert parallelism, the distributed optimizer, full recompute): the calibrated model ranks
the measured step times with Spearman 0.89 (0.88 leaving each layout out of the fit it is predicted by; 0.89
within the ten ernie4.5-debug layouts). Its worst miss: MoE with TP, EP and sequence parallelism on 4 processes
runs twice as long as predicted (gloo's emulated uneven collectives in the token dispatcher are not modelled).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from zhnlp.errors import ZhnlpError
from zhnlp.planning.layout import Layout
from zhnlp.planning.memory import BYTES
from zhnlp.planning.params import params_per_rank, stage_layers

# ---------------------------------------------------------------------------------------------------- FLOPs


def _get(arch, name: str):
    """A field of an architecture config or of a config.json dict."""
    return arch[name] if isinstance(arch, dict) else getattr(arch, name)


def flop_counts(arch, s: int, *, head: str = "causal_lm", mask_prob: float = 0.15,
                sequence_parallel: bool = False) -> dict:
    """Per token of a training step at sequence length ``s``, the model FLOPs the trainer's MFU figure counts,
    split by where they run: ``weights`` (per layer, the matmul weights a token passes through: 6 FLOPs each,
    forward 2 and backward 4), ``attention`` (per layer, the FLOPs of the attention scores and their weighted
    sum) and ``head`` (the vocabulary projection's weights, counted where it runs). :func:`train_flops` adds
    them up.

    Decoders (``head == "causal_lm"``, GQA): Q and O (``h x nh*hd`` each), K and V (``h x ng*hd`` each), the
    SwiGLU MLP (``3 x h x ffn``; in a mixture-of-experts layer the ``moe_k`` chosen experts, the shared ones and
    the router); the attention ``6 x 2 x s x nh*hd`` halved (causal); the vocabulary projection on every
    position. Encoders: ``4 h^2 + 2 h ffn`` per layer, attention ``12 h s``, the vocabulary projection only where
    it runs: on the masked positions (``mask_prob``) in masked-LM training, on every position under sequence
    parallelism, not at all for task heads."""
    h, layers = _get(arch, "hidden_size"), _get(arch, "num_hidden_layers")
    if head == "causal_lm":
        hd, nh, ng = _get(arch, "head_dim"), _get(arch, "num_attention_heads"), _get(arch, "num_key_value_heads")
        attention = 2 * h * nh * hd + 2 * h * ng * hd
        weights = []
        for layer in range(layers):
            if getattr(arch, "is_moe", False) and arch.is_moe_layer(layer):
                mlp = 3 * h * (arch.moe_k * arch.moe_intermediate_size + arch.shared_expert_size)
                mlp += h * arch.moe_num_experts  # the router
            else:
                mlp = 3 * h * _get(arch, "intermediate_size")
            weights.append(attention + mlp)
        return {"weights": weights, "attention": [6 * nh * hd * s] * layers, "head": h * _get(arch, "vocab_size")}
    out = 0.0
    if head == "mlm":
        out = h * _get(arch, "vocab_size") * (1.0 if sequence_parallel else mask_prob)
    return {"weights": [4 * h * h + 2 * h * _get(arch, "intermediate_size")] * layers,
            "attention": [12 * h * s] * layers, "head": out}


def train_flops(arch, tokens: int, s: int, *, head: str = "causal_lm", mask_prob: float = 0.15,
                sequence_parallel: bool = False) -> float:
    """Model FLOPs of one training step over ``tokens`` tokens in sequences of ``s`` (:func:`flop_counts`):
    the trainer's MFU figure is this over the step's seconds and the devices' peak."""
    c = flop_counts(arch, s, head=head, mask_prob=mask_prob, sequence_parallel=sequence_parallel)
    return 6 * (sum(c["weights"]) + c["head"]) * tokens + sum(c["attention"]) * tokens


def decoder_flops(arch, tokens: int, s: int) -> float:
    """:func:`train_flops` of a GQA decoder (dense or MoE) with the causal-LM head."""
    return train_flops(arch, tokens, s, head="causal_lm")


# ---------------------------------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class Hardware:
    """One kind of device and its links. Bandwidths are bytes/s per device in one direction (what a ring
    collective moves through each device), latencies seconds per message step. ``peak_flops``: dense bf16/fp16
    FLOP/s per device; ``peak_flops_fp32``: fp32 (without TF32). ``efficiency``: the fraction of peak that
    training's matmuls reach. ``layer_overhead``: seconds per layer and micro-batch that do not grow with the
    FLOPs (launches, framework work). ``compute_slots``: processes per node that compute at full speed at once (a
    CPU's cores, or fewer where the machine is shared; more processes share them); None: one device per process.
    """

    name: str
    peak_flops: float
    peak_flops_fp32: float
    memory_bytes: int
    memory_bandwidth: float
    intra_bandwidth: float
    inter_bandwidth: float
    intra_latency: float = 5e-6
    inter_latency: float = 1e-5
    gpus_per_node: int = 8
    efficiency: float = 0.45
    layer_overhead: float = 1e-4
    compute_slots: float | None = None

    def peak(self, precision: str) -> float:
        """Peak FLOP/s per device in ``precision`` (fp32, bf16, fp16)."""
        return self.peak_flops_fp32 if precision == "fp32" else self.peak_flops


GB = 10 ** 9
# Datasheet figures (dense, no sparsity; SXM parts). Link bandwidths per GPU and direction: NVLink (half the
# advertised bidirectional figure); inter-node one 400 Gb/s NIC per GPU (H100/H800/H200), 200 Gb/s (A100/A800),
# 100 Gb/s (V100), PCIe 4.0 and 200 Gb/s for the L40S. The latencies and the efficiency are typical values, to be
# calibrated (:func:`calibrate`).
_H100 = dict(peak_flops=989e12, peak_flops_fp32=67e12, memory_bytes=80 * GB, memory_bandwidth=3350 * GB,
             intra_bandwidth=450 * GB, inter_bandwidth=50 * GB)
_A100 = dict(peak_flops=312e12, peak_flops_fp32=19.5e12, memory_bytes=80 * GB, memory_bandwidth=2039 * GB,
             intra_bandwidth=300 * GB, inter_bandwidth=25 * GB)
PRESETS = {
    "h100": Hardware("h100", **_H100),
    "h800": Hardware("h800", **{**_H100, "intra_bandwidth": 200 * GB}),  # NVLink cut to 400 GB/s
    "h200": Hardware("h200", **{**_H100, "memory_bytes": 141 * GB, "memory_bandwidth": 4800 * GB}),
    "a100": Hardware("a100", **_A100),
    "a100-80": Hardware("a100-80", **_A100),
    "a100-40": Hardware("a100-40", **{**_A100, "memory_bytes": 40 * GB, "memory_bandwidth": 1555 * GB}),
    "a800": Hardware("a800", **{**_A100, "intra_bandwidth": 200 * GB}),  # NVLink cut to 400 GB/s
    "v100": Hardware("v100", peak_flops=125e12, peak_flops_fp32=15.7e12, memory_bytes=32 * GB,
                     memory_bandwidth=900 * GB, intra_bandwidth=150 * GB, inter_bandwidth=12.5 * GB),
    "l40s": Hardware("l40s", peak_flops=362e12, peak_flops_fp32=91.6e12, memory_bytes=48 * GB,
                     memory_bandwidth=864 * GB, intra_bandwidth=25 * GB, inter_bandwidth=25 * GB,
                     intra_latency=1e-5, gpus_per_node=8),
    # CPU processes on one machine (gloo over loopback, one thread each), as calibrated on a shared 2-core machine
    # by scripts/validate_timing.py (its fit leaves the bandwidths free: latency dominates the debug recipes'
    # collectives). compute_slots: filled in from the machine's cores by hardware("cpu").
    "cpu": Hardware("cpu", peak_flops=4e10, peak_flops_fp32=4e10, memory_bytes=8 * GB, memory_bandwidth=5 * GB,
                    intra_bandwidth=2 * GB, inter_bandwidth=0.1 * GB, intra_latency=1e-3, inter_latency=1e-3,
                    gpus_per_node=1024, efficiency=1.0, layer_overhead=0.0),
}


def hardware(name: str | Hardware = "h100", **overrides) -> Hardware:
    """The preset ``name`` (case-insensitive; see ``PRESETS``) with ``overrides`` (Hardware fields) applied."""
    if isinstance(name, Hardware):
        base = name
    else:
        base = PRESETS.get(str(name).lower())
        if base is None:
            raise ZhnlpError(f"unknown hardware {name!r}; the presets are {', '.join(PRESETS)} (override their "
                             f"fields, e.g. hardware('h100', inter_bandwidth=25e9), or build a Hardware).")
        if base.name == "cpu" and base.compute_slots is None:
            base = dataclasses.replace(base, compute_slots=os.cpu_count() or 1)
    try:
        return dataclasses.replace(base, **overrides)
    except TypeError:
        fields = ", ".join(f.name for f in dataclasses.fields(Hardware))
        raise ZhnlpError(f"unknown Hardware field among {', '.join(overrides)}; the fields are {fields}.") from None


def _resolve(hw: Hardware | str) -> Hardware:
    return hw if isinstance(hw, Hardware) else hardware(hw)


# ---------------------------------------------------------------------------------------------------- the model

# The constants of a Hardware that multiply the amounts (features) of the parts; calibrate() fits them.
FEATURES = ("peak_seconds", "calls", "intra_bytes", "intra_messages", "inter_bytes", "inter_messages",
            "memory_bytes")


def _coefficients(hw: Hardware) -> dict:
    return {"peak_seconds": 1 / hw.efficiency, "calls": hw.layer_overhead,
            "intra_bytes": 1 / hw.intra_bandwidth, "intra_messages": hw.intra_latency,
            "inter_bytes": 1 / hw.inter_bandwidth, "inter_messages": hw.inter_latency,
            "memory_bytes": 1 / hw.memory_bandwidth}


def crosses_nodes(size: int, stride: int, gpus_per_node: int) -> bool:
    """Whether a process group of ``size`` ranks ``stride`` apart spans more than one node."""
    return size > 1 and size * stride > gpus_per_node


def _collective(kind: str, nbytes: float, size: int, stride: int, hw: Hardware, count: float = 1) -> dict:
    """Ring cost amounts of ``count`` collectives ``kind`` (all_reduce, all_gather, reduce_scatter, all_to_all,
    p2p) of ``nbytes`` (the full, unsharded tensor) over ``size`` ranks ``stride`` apart."""
    if size <= 1 or count == 0:
        return {}
    if kind == "p2p":
        moved, steps = nbytes, 1
    else:
        factor = 2 if kind == "all_reduce" else 1
        moved, steps = factor * (size - 1) / size * nbytes, factor * (size - 1)
    link = "inter" if crosses_nodes(size, stride, hw.gpus_per_node) else "intra"
    return {f"{link}_bytes": count * moved, f"{link}_messages": count * steps}


def _add(*amounts: dict) -> dict:
    out: dict = {}
    for a in amounts:
        for k, v in a.items():
            out[k] = out.get(k, 0) + v
    return out


def step_amounts(arch, layout: Layout, *, global_batch: int, micro_batch: int, seq_length: int,
                 hardware: Hardware, head: str = "causal_lm", mask_prob: float = 0.15) -> dict:
    """What each part of :func:`step_time` is made of: ``{part: {feature: amount}}`` (features: ``FEATURES``;
    ``peak_seconds`` is FLOPs over the devices' peak), each part on its busiest pipeline stage."""
    hw, lay = hardware, layout
    tp, pp, dp, ep, s, b = lay.tp, lay.pp, lay.dp, lay.ep, seq_length, micro_batch
    vpp = lay.vpp or 1
    if global_batch % (dp * micro_batch):
        raise ZhnlpError(f"global batch {global_batch} is not a multiple of dp x micro batch = {dp} x {micro_batch}")
    m = global_batch // (dp * micro_batch)  # micro-batches per step and data-parallel rank
    h, act = _get(arch, "hidden_size"), BYTES[lay.precision]
    counts = flop_counts(arch, s, head=head, mask_prob=mask_prob, sequence_parallel=lay.sequence_parallel)
    is_moe = getattr(arch, "is_moe", False)
    layers_of = [stage_layers(_get(arch, "num_hidden_layers"), lay, st) for st in range(pp)]
    flops_of = [sum(6 * counts["weights"][i] + counts["attention"][i] for i in layers)
                + (6 * counts["head"] if st == pp - 1 else 0) for st, layers in enumerate(layers_of)]
    # busy processes of one node beyond the compute slots share them (a CPU's cores); a process of a lighter
    # pipeline stage is busy for its share of the busiest stage's time
    busy = min(lay.world, hw.gpus_per_node) * sum(flops_of) / (pp * max(flops_of))
    share = max(1.0, busy / hw.compute_slots) if hw.compute_slots else 1.0
    peak = hw.peak(lay.precision)
    tokens = b * s  # per micro-batch and data-parallel rank
    act_bytes = tokens * h * act  # one micro-batch's b x s x h activations

    stages = []
    params = params_per_rank(arch, lay)
    for st in range(pp):
        layers, per_token = layers_of[st], flops_of[st]
        if lay.recompute == "full":  # the layers' forward again
            per_token += sum(2 * counts["weights"][i] + counts["attention"][i] / 3 for i in layers)
        elif lay.recompute == "selective":  # the attention core's forward again
            per_token += sum(counts["attention"][i] / 3 for i in layers)
        compute = {"peak_seconds": share * per_token * tokens * m / tp / peak}  # tokens * m: this DP rank's
        overhead = {"calls": share * m * (len(layers) + 1)}
        # tensor parallelism: per layer and micro-batch (see the module docstring), and the embedding's all-reduce
        if lay.sequence_parallel:
            t = _add(_collective("all_gather", act_bytes, tp, 1, hw, 6 * len(layers) * m),
                     _collective("reduce_scatter", act_bytes, tp, 1, hw, 4 * len(layers) * m))
        else:
            t = _collective("all_reduce", act_bytes, tp, 1, hw, 4 * len(layers) * m)
        ends = [kind for where, kind in (
            (0, "all_reduce" if not lay.sequence_parallel else "reduce_scatter"),  # the embedding's output
            (0, "all_gather" if lay.sequence_parallel else None),  # ... its gradient
            (pp - 1, "all_reduce" if not lay.sequence_parallel else "all_gather"),  # the output layer's input
            (pp - 1, "reduce_scatter" if lay.sequence_parallel else None),  # ... its gradient
            (pp - 1, "all_gather" if lay.sequence_parallel else None)) if where == st and kind]  # again: weight grad
        for kind in ends:
            t = _add(t, _collective(kind, act_bytes, tp, 1, hw, m))
        if st == pp - 1 and head in ("causal_lm", "mlm"):  # the vocabulary-parallel loss: max, target, sum of exp
            t = _add(t, _collective("all_reduce", 4 * tokens, tp, 1, hw, 3 * m))
        # pipeline: activations forward, gradients backward, per micro-batch and chunk (each stage sends both)
        p2p = act_bytes / (tp if lay.sequence_parallel else 1)
        pipe = _collective("p2p", p2p, pp, tp * dp, hw, 2 * m * vpp) if pp > 1 else {}
        # data parallelism: the fp32 gradients (one buffer per model chunk), the parameters' all-gather
        dense, expert = params[st]["dense"], params[st]["expert"]
        edp, etp = lay.expert_dp, lay.expert_tp
        if getattr(lay, "fsdp", False):  # every micro-batch: weights gathered for forward and backward, gradients
            # reduce-scattered, all in the parameters' precision (megatron's FSDP2 wrapper does not skip syncs);
            # an MoE model's experts too (FSDP runs without expert parallelism, so they are sharded like the rest)
            sharded_params = dense + expert
            grads = _add(_collective("all_gather", act * sharded_params, dp, tp, hw, 2 * m * vpp),
                         _collective("reduce_scatter", act * sharded_params, dp, tp, hw, m * vpp))
        elif lay.distributed_optimizer:
            grads = _add(_collective("reduce_scatter", 4 * dense, dp, tp, hw, vpp),
                         _collective("all_gather", act * dense, dp, tp, hw, vpp),
                         _collective("reduce_scatter", 4 * expert, edp, etp * ep, hw, vpp if expert else 0),
                         _collective("all_gather", act * expert, edp, etp * ep, hw, vpp if expert else 0))
        else:
            grads = _add(_collective("all_reduce", 4 * dense, dp, tp, hw, vpp),
                         _collective("all_reduce", 4 * expert, edp, etp * ep, hw, vpp if expert else 0))
        tied = head != "causal_lm" or getattr(arch, "tie_word_embeddings", True)
        if tied and pp > 1 and st in (0, pp - 1):  # the tied embedding's two copies: one all-reduce
            vocab = _get(arch, "padded_vocab_size") if hasattr(arch, "padded_vocab_size") else _get(arch, "vocab_size")
            grads = _add(grads, _collective("all_reduce", 4 * vocab * h / tp, 2, tp * dp * (pp - 1), hw))
        # expert parallelism: dispatch and combine, forward and backward, of tokens x k x h
        moe_layers = sum(1 for i in layers if is_moe and arch.is_moe_layer(i))
        routed = tokens / (tp if lay.sequence_parallel else 1) * (arch.moe_k if is_moe else 0) * h * act
        experts = _collective("all_to_all", routed, ep, etp, hw, 4 * moe_layers * m) if moe_layers else {}
        # Adam: gradient read, moments (and fp32 main parameters) read and written, parameters written
        sharded = lay.distributed_optimizer or getattr(lay, "fsdp", False)
        owned = (-(-dense // dp) + -(-expert // edp)) if sharded else dense + expert
        state = 8 + (4 if lay.precision != "fp32" else 0)
        optimizer = {"memory_bytes": owned * (4 + 2 * state + (act if lay.precision != "fp32" else 0))}
        stages.append({"compute": compute, "overhead": overhead, "tp": t, "pp": pipe, "dp": grads, "ep": experts,
                       "optimizer": optimizer})
    coef = _coefficients(hw)

    def seconds(amounts: dict) -> float:
        return sum(coef[k] * v for k, v in amounts.items())

    out = {part: max((st[part] for st in stages), key=seconds) for part in stages[0]}
    # the pipeline's fill and drain: every stage but the busiest works one micro-batch (a 1/vpp chunk of it) while
    # the busiest waits; (pp - 1) / (vpp x m) of the compute when the stages are balanced
    busy = [_add(st["compute"], st["overhead"]) for st in stages]
    idle = _add(*(b for i, b in enumerate(busy) if i != busy.index(max(busy, key=seconds))))
    out["bubble"] = {k: v / (vpp * m) for k, v in idle.items()}
    return {k: out[k] for k in ("compute", "overhead", "tp", "pp", "dp", "ep", "bubble", "optimizer")}


def step_time(arch, layout: Layout, *, global_batch: int, micro_batch: int, seq_length: int,
              hardware: Hardware | str = "h100", head: str = "causal_lm", mask_prob: float = 0.15) -> dict:
    """Predicted seconds per training step, by part (see the module docstring), with ``total``; ``flops`` (the
    model FLOPs of the step, :func:`train_flops`), ``tokens_per_s`` and ``mfu`` (over the whole world's peak).
    ``head``: the recipe's pretraining head (``causal_lm`` for the decoders, ``mlm`` for the encoders)."""
    hw = _resolve(hardware)
    amounts = step_amounts(arch, layout, global_batch=global_batch, micro_batch=micro_batch,
                           seq_length=seq_length, hardware=hw, head=head, mask_prob=mask_prob)
    coef = _coefficients(hw)
    out = {part: sum(coef[k] * v for k, v in a.items()) for part, a in amounts.items()}
    out["total"] = sum(out.values())
    tokens = global_batch * seq_length
    out["flops"] = train_flops(arch, tokens, seq_length, head=head, mask_prob=mask_prob,
                               sequence_parallel=layout.sequence_parallel)
    out["tokens_per_s"] = tokens / out["total"]
    out["mfu"] = out["flops"] / out["total"] / (layout.world * hw.peak(layout.precision))
    return out


# ---------------------------------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Measurement:
    """A measured step time (seconds; a median after warm-up) of ``arch`` under ``layout`` and these batch
    settings."""

    arch: object
    layout: Layout
    seconds: float
    global_batch: int
    micro_batch: int
    seq_length: int
    head: str = "causal_lm"
    mask_prob: float = 0.15

    def amounts(self, hw: Hardware) -> dict:
        """The summed amounts of every part (``FEATURES``)."""
        parts = step_amounts(self.arch, self.layout, global_batch=self.global_batch, micro_batch=self.micro_batch,
                             seq_length=self.seq_length, hardware=hw, head=self.head, mask_prob=self.mask_prob)
        return _add(*parts.values())


def nnls(a: list[list[float]], y: list[float], iterations: int = 200) -> list[float]:
    """Non-negative least squares (Lawson and Hanson's active-set method): ``x >= 0`` minimising ``|a x - y|``."""
    import numpy as np

    a, y = np.asarray(a, dtype=float), np.asarray(y, dtype=float)
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    tol = 1e-10 * max(1.0, float(np.abs(a).max(initial=0.0)) * float(np.abs(y).max(initial=0.0)))
    for _ in range(iterations):
        w = a.T @ (y - a @ x)
        if passive.all() or (w[~passive] <= tol).all():
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol * 1e-3
            x[~passive] = 0.0
    return [float(v) for v in x]


def calibrate(measurements: list[Measurement], hardware: Hardware | str = "cpu") -> Hardware:
    """``hardware`` with its constants (efficiency, per-layer overhead, intra- and inter-node bandwidth and
    latency, memory bandwidth) fitted to the measured step times: non-negative least squares on the relative
    errors (each measurement weighs the same, whatever its length). A constant no measurement exercises keeps
    its value; one the fit sets to zero becomes free (an infinite bandwidth, no latency)."""
    hw = _resolve(hardware)
    if not measurements:
        raise ZhnlpError("calibrate() needs at least one measurement")
    if hw.compute_slots is None:
        return _refit(measurements, hw)[0]
    # processes sharing a CPU's cores: how many cores the runs had (the machine may be shared) is fitted too
    slots = sorted({1 + (hw.compute_slots - 1) * k / 8 for k in range(9)})
    return min((_refit(measurements, dataclasses.replace(hw, compute_slots=n)) for n in slots),
               key=lambda fit: fit[1])[0]


def _refit(measurements: list[Measurement], hw: Hardware) -> tuple[Hardware, float]:
    for _ in range(3):  # which stage is busiest in each part depends on the constants: fit again with the fitted
        hw, residual = _fit(measurements, hw)
    return hw, residual


def _fit(measurements: list[Measurement], hw: Hardware) -> tuple[Hardware, float]:
    """The constants' least-squares fit, and the sum of the squared relative errors."""
    import numpy as np

    rows = [m.amounts(hw) for m in measurements]
    used = [f for f in FEATURES if any(r.get(f, 0) > 0 for r in rows)]
    fixed = _coefficients(hw)
    a = np.array([[r.get(f, 0) / m.seconds for f in used] for r, m in zip(rows, measurements)])
    y = np.array([1 - sum(fixed[f] * r.get(f, 0) for f in FEATURES if f not in used) / m.seconds
                  for r, m in zip(rows, measurements)])
    scale = a.max(axis=0)  # columns of order one: the amounts differ by many orders of magnitude
    x = np.array(nnls(a / scale, y))
    residual = float(((a / scale) @ x - y) @ ((a / scale) @ x - y))
    fit = dict(zip(used, x / scale))

    def inverse(feature):
        return math.inf if fit[feature] == 0 else 1 / fit[feature]

    change = {}
    for feature, field, value in (("peak_seconds", "efficiency", inverse), ("calls", "layer_overhead", fit.get),
                                  ("intra_bytes", "intra_bandwidth", inverse),
                                  ("intra_messages", "intra_latency", fit.get),
                                  ("inter_bytes", "inter_bandwidth", inverse),
                                  ("inter_messages", "inter_latency", fit.get),
                                  ("memory_bytes", "memory_bandwidth", inverse)):
        if feature in fit:
            change[field] = float(value(feature))
    return dataclasses.replace(hw, **change), residual


def predict(measurement: Measurement, hardware: Hardware) -> float:
    """:func:`step_time`'s total for a measurement's settings."""
    m = measurement
    return step_time(m.arch, m.layout, global_batch=m.global_batch, micro_batch=m.micro_batch,
                     seq_length=m.seq_length, hardware=hardware, head=m.head, mask_prob=m.mask_prob)["total"]


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (ties get their mean rank): the metric's own
    (:func:`zhnlp.metrics.similarity.spearman`)."""
    from zhnlp.metrics.similarity import spearman as rank_correlation

    return rank_correlation(x, y)
