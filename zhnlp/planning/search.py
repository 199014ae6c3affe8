"""The layout search behind ``zhnlp plan`` and ``zhnlp pretrain --parallel auto``.

Every layout of ``gpus`` devices that the model admits is scored with the memory model
(:func:`zhnlp.planning.activations.peak_memory`, the largest pipeline stage) and the time model
(:func:`zhnlp.planning.timing.step_time`): tensor parallelism inside a node (dividing the attention and KV heads;
with sequence parallelism, which megatron needs for MoE with TP and which only saves memory), pipeline stages
dividing the layers (interleaved chunks when the micro-batches allow), expert parallelism dividing the experts,
recompute none / selective / full, the distributed optimizer over the data-parallel ranks (FSDP on request:
see :func:`layouts`), and the micro-batch size. A layout fits when its predicted peak plus a reserve (the CUDA
context, communication buffers and allocator fragmentation, which tensor accounting does not see) is within the
device memory; the fitting ones are ranked by predicted step time, ties by memory. When none fits, the same
layouts with the optimizer states in host memory (``--optimizer-offload``) are tried before giving up.
"""

from __future__ import annotations

import dataclasses
import itertools

from zhnlp.errors import LayoutError, ZhnlpError
from zhnlp.planning.activations import _is_decoder, peak_memory
from zhnlp.planning.layout import Layout

GiB = 2 ** 30
RESERVE_FRACTION = 0.10  # of the device memory: allocator fragmentation
RESERVE_BYTES = 2 * GiB  # CUDA context, NCCL buffers, workspace


@dataclasses.dataclass
class Candidate:
    layout: Layout
    micro_batch: int
    memory: dict  # the largest stage's parts (bytes) and "total"
    time: dict | None = None  # step_time's parts (seconds), "total", "tokens_per_s", "mfu"
    fits: bool = True
    reason: str = ""

    def to_dict(self) -> dict:
        lay = self.layout
        parts = {k: v for k, v in self.memory.items() if isinstance(v, int) and k not in ("total",)}
        return {"layout": {"world_size": lay.world, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "dp": lay.dp,
                           "ep": lay.ep, "etp": lay.expert_tp, "sequence_parallel": lay.sequence_parallel,
                           "recompute": lay.recompute or "none", "distributed_optimizer": lay.distributed_optimizer,
                           "fsdp": lay.fsdp, "optimizer_offload": lay.optimizer_offload, "precision": lay.precision,
                           "micro_batch_size": self.micro_batch},
                "memory_bytes": {"total": self.memory["total"], **parts, "phase": self.memory["phase"]},
                "step_time_s": self.time["total"] if self.time else None,
                "step_time_parts_s": {k: v for k, v in (self.time or {}).items()
                                      if k not in ("total", "flops", "tokens_per_s", "mfu")},
                "tokens_per_s": self.time["tokens_per_s"] if self.time else None,
                "mfu": self.time["mfu"] if self.time else None, "fits": self.fits, "reason": self.reason}

    def flags(self) -> str:
        """The ``zhnlp pretrain`` flags of this layout."""
        lay = self.layout
        out = [f"--tp {lay.tp}", f"--pp {lay.pp}"]
        out += [f"--vpp {lay.vpp}"] if lay.vpp else []
        out += [f"--ep {lay.ep}"] if lay.ep > 1 else []
        out += [f"--etp {lay.etp}"] if lay.etp is not None and lay.etp != lay.tp else []
        out += ["--sequence-parallel"] if lay.sequence_parallel else []
        out += [f"--recompute {lay.recompute}"] if lay.recompute else []
        out += ["--distributed-optimizer"] if lay.distributed_optimizer else []
        out += ["--fsdp"] if lay.fsdp else []
        out += [f"--optimizer-offload {lay.optimizer_offload:g}"] if lay.optimizer_offload else []
        out += [f"--precision {lay.precision}", f"--micro-batch-size {self.micro_batch}"]
        return " ".join(out)


def usable_memory(gpu_memory: int) -> int:
    """Bytes of a device the planner lets tensors use."""
    return int(gpu_memory * (1 - RESERVE_FRACTION)) - RESERVE_BYTES


def evaluate(arch, layout: Layout, *, micro_batch: int, global_batch: int, seq_length: int, hardware,
             gpu_memory: int | None = None, mask_prob: float = 0.15, predicted_tokens: int | None = None,
             with_time: bool = True) -> Candidate:
    """Memory (and time) of one layout; ``fits`` against ``gpu_memory`` (default: the hardware's)."""
    from zhnlp.planning.timing import hardware as get_hardware

    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    stages = peak_memory(arch, layout, micro_batch=micro_batch, seq_length=seq_length, global_batch=global_batch,
                         predicted_tokens=predicted_tokens, mask_prob=mask_prob)
    memory = max(stages, key=lambda s: s["total"])
    limit = usable_memory(gpu_memory or hw.memory_bytes)
    cand = Candidate(layout, micro_batch, memory)
    if memory["total"] > limit:
        cand.fits = False
        cand.reason = (f"does not fit: {memory['total'] / GiB:.1f} GiB per device at its peak "
                       f"({memory['phase']}), {limit / GiB:.1f} GiB usable")
    if with_time:
        cand.time = _step_time(arch, cand, global_batch=global_batch, seq_length=seq_length, hw=hw,
                               mask_prob=mask_prob)
    return cand


def _step_time(arch, cand: Candidate, *, global_batch: int, seq_length: int, hw, mask_prob: float) -> dict:
    from zhnlp.planning.timing import step_time

    return step_time(arch, cand.layout, global_batch=global_batch, micro_batch=cand.micro_batch,
                     seq_length=seq_length, hardware=hw, head="causal_lm" if _is_decoder(arch) else "mlm",
                     mask_prob=mask_prob)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(arch, gpus: int, *, gpus_per_node: int, precision: str, global_batch: int):
    """Every (layout, micro-batch) the model and the batch admit on ``gpus`` devices, fully sharded ones included
    (``--fsdp``: not with expert parallelism or fp16, as zhnlp.training.fsdp refuses)."""
    moe = bool(getattr(arch, "is_moe", False))
    heads = arch.num_attention_heads
    kv = getattr(arch, "num_key_value_heads", heads)
    layers = arch.num_hidden_layers
    for tp in [t for t in _divisors(min(gpus_per_node, gpus)) if heads % t == 0 and kv % t == 0]:
        for pp in [p for p in _divisors(layers) if gpus % (tp * p) == 0]:
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            for vpp in [None] + [v for v in (2, 3, 4) if pp > 1 and layers % (pp * v) == 0]:
                try:
                    arch.check_layout(tp, pp, vpp)
                except (LayoutError, ValueError):
                    continue
                expert_options = [(1, None)]
                if moe:
                    expert_options = [(ep, etp) for ep in _divisors(arch.moe_num_experts)
                                      for etp in sorted({1, tp}) if (tp * dp) % (ep * etp) == 0
                                      and arch.moe_intermediate_size % etp == 0 and (ep > 1 or etp == tp)]
                for (ep, etp), recompute, sharding in itertools.product(
                        expert_options, (None, "selective", "full"), ("ddp", "distopt", "fsdp")):
                    if sharding != "ddp" and dp == 1 or sharding == "fsdp" and (
                            ep > 1 or precision == "fp16"):  # what zhnlp.training.fsdp refuses
                        continue
                    layout = Layout(world=gpus, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp if etp != tp else None,
                                    sequence_parallel=tp > 1, distributed_optimizer=sharding == "distopt",
                                    fsdp=sharding == "fsdp", precision=precision, recompute=recompute)
                    for mb in (1, 2, 4, 8):
                        per_rank = global_batch // dp
                        if per_rank % mb or (vpp and (per_rank // mb) % pp):
                            continue
                        yield layout, mb


def plan(arch, gpus: int, *, global_batch: int, seq_length: int, hardware="h100", gpus_per_node: int | None = None,
         gpu_memory: int | None = None, precision: str = "bf16", top: int = 5, mask_prob: float = 0.15) -> dict:
    """Search the layouts of ``gpus`` devices: ``best`` (up to ``top`` fitting candidates, fastest first),
    ``rejected`` (the best candidate of each tensor x pipeline shape that was not chosen, with its reason),
    ``searched`` and ``fitting`` counts; when nothing fits, ``needs`` says what would."""
    from zhnlp.planning.timing import hardware as get_hardware

    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    per_node = gpus_per_node or hw.gpus_per_node
    memory = gpu_memory or hw.memory_bytes
    if gpus < 1:
        raise ZhnlpError(f"--gpus must be at least 1, got {gpus}")
    searched, fitting, smallest, too_big = 0, [], None, {}
    for layout, mb in layouts(arch, gpus, gpus_per_node=per_node, precision=precision, global_batch=global_batch):
        searched += 1
        cand = evaluate(arch, layout, micro_batch=mb, global_batch=global_batch, seq_length=seq_length,
                        hardware=hw, gpu_memory=memory, mask_prob=mask_prob, with_time=False)
        if smallest is None or cand.memory["total"] < smallest.memory["total"]:
            smallest = cand
        if cand.fits:
            fitting.append(cand)
        else:  # the leanest layout of each tensor x pipeline shape that does not fit
            key = (layout.tp, layout.pp)
            if key not in too_big or cand.memory["total"] < too_big[key].memory["total"]:
                too_big[key] = cand
    if searched == 0:
        raise ZhnlpError(f"no layout of {gpus} devices divides this model and a global batch of {global_batch} "
                         f"(tensor parallelism must divide the {arch.num_attention_heads} heads, pipeline stages "
                         f"the {arch.num_hidden_layers} layers, data parallelism the global batch); change --gpus "
                         "or --global-batch-size.")
    if not fitting and hw.name != "cpu":  # what offloading the optimizer states to the host would fit
        for layout, mb in layouts(arch, gpus, gpus_per_node=per_node, precision=precision,
                                  global_batch=global_batch):
            if not layout.fsdp:
                offloaded = dataclasses.replace(layout, distributed_optimizer=True, optimizer_offload=1.0)
                cand = evaluate(arch, offloaded, micro_batch=mb,
                                global_batch=global_batch, seq_length=seq_length, hardware=hw, gpu_memory=memory,
                                mask_prob=mask_prob, with_time=False)
                if cand.fits:
                    cand.reason = "fits only with the optimizer states in host memory (--optimizer-offload)"
                    fitting.append(cand)
    for cand in fitting:  # the memory is known: only the time is left to compute
        cand.time = _step_time(arch, cand, global_batch=global_batch, seq_length=seq_length, hw=hw,
                               mask_prob=mask_prob)
    fitting.sort(key=lambda c: (c.time["total"], c.memory["total"]))
    result = {"gpus": gpus, "gpus_per_node": per_node, "hardware": hw.name, "gpu_memory_bytes": memory,
              "usable_bytes": usable_memory(memory), "searched": searched, "fitting": len(fitting),
              "best": fitting[:top], "rejected": []}
    if not fitting:
        result["needs"] = _what_would_fit(arch, smallest, gpus, global_batch=global_batch, seq_length=seq_length,
                                          hw=hw, per_node=per_node, memory=memory, precision=precision,
                                          mask_prob=mask_prob)
        smallest.time = None
        result["rejected"] = [smallest]
        return result
    best = fitting[0]
    shown = {(c.layout.tp, c.layout.pp) for c in result["best"]}
    for cand in fitting[top:]:  # the fastest of every other tensor x pipeline shape: why it lost
        key = (cand.layout.tp, cand.layout.pp)
        if key in shown:
            continue
        shown.add(key)
        cand.reason = _why_slower(cand, best)
        result["rejected"].append(cand)
    shapes = sorted(too_big.values(), key=lambda c: c.memory["total"])
    result["rejected"] += [c for c in shapes if (c.layout.tp, c.layout.pp) not in shown][:3]
    return result


def _why_slower(cand: Candidate, best: Candidate) -> str:
    extra = cand.time["total"] / best.time["total"] - 1
    parts = {k: cand.time.get(k, 0) - best.time.get(k, 0)
             for k in ("compute", "overhead", "tp", "pp", "dp", "ep", "bubble", "optimizer")}
    worst = max(parts, key=parts.get)
    names = {"compute": "more compute on its busiest rank (recomputation, an unbalanced pipeline stage)",
             "overhead": "more per-layer overhead", "tp": "more tensor-parallel communication",
             "pp": "more pipeline communication", "dp": "more data-parallel gradient traffic",
             "ep": "more expert all-to-all", "bubble": "a larger pipeline bubble",
             "optimizer": "a slower optimizer step"}
    return f"fits but {100 * extra:.0f}% slower, mostly {names[worst]}"


def _what_would_fit(arch, smallest: Candidate, gpus: int, **kw) -> str:
    """What the user could change when no layout of ``gpus`` devices fits."""
    need = smallest.memory["total"]
    for more in (2, 4, 8, 16, 32, 64):
        n = gpus * more
        for layout, mb in layouts(arch, n, gpus_per_node=kw["per_node"], precision=kw["precision"],
                                  global_batch=kw["global_batch"] if kw["global_batch"] % n == 0 else n):
            gb = kw["global_batch"] if kw["global_batch"] % n == 0 else n
            cand = evaluate(arch, layout, micro_batch=mb, global_batch=gb, seq_length=kw["seq_length"],
                            hardware=kw["hw"], gpu_memory=kw["memory"], mask_prob=kw["mask_prob"], with_time=False)
            if cand.fits:
                return (f"no layout of {gpus} devices fits (the smallest needs {need / GiB:.1f} GiB per device, "
                        f"{usable_memory(kw['memory']) / GiB:.1f} GiB usable): {n} devices would "
                        f"({cand.flags()}{'' if gb == kw['global_batch'] else f', global batch {gb}'}), "
                        f"or devices with at least {(need + 2 * GiB) / 0.9 / GiB:.0f} GiB.")
    return (f"no layout fits: the smallest needs {need / GiB:.1f} GiB per device; use devices with more memory, a "
            "shorter --seq-length or a smaller model.")
