"""Mixture-of-experts pieces on megatron-core's MoE layer, for decoders that route like ERNIE 4.5.

megatron's :class:`MoELayer` brings the token dispatchers (all-to-all over the expert-parallel group),
the expert-tensor-parallel split, token dropping / capacity and the auxiliary load-balancing losses.
What it has no switch for, and this module supplies:

* :class:`CorrectedSoftmaxRouter`: an fp32 softmax over the expert logits; a *correction bias* added to
  those probabilities only to choose the top-k experts (not to weight them); the chosen probabilities
  renormalised to sum to 1, with a minimum on the denominator (ERNIE 4.5's ``moe_norm_min``). megatron
  allows an expert bias only with sigmoid scores and does not renormalise pre-softmax top-k weights.
* :class:`RoutedExperts`: megatron's SequentialMLP, always without biases (ERNIE's experts have none,
  whatever ``use_bias`` says for the other linears).
* :class:`SharedExpertsMoE`: the MoE layer plus shared experts, a plain MLP of width
  ``moe_intermediate_size * num_shared`` that every token passes through and whose output is added; it
  may carry biases (megatron's SharedExpertMLP refuses them).

Shapes: the layer takes megatron's ``[s, b, h]`` (``[s/tp, b, h]`` under sequence parallelism); the router
sees ``[s*b, E]`` logits.
"""

from __future__ import annotations

import logging
from copy import copy

import torch
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from megatron.core.transformer.moe.moe_utils import apply_router_token_dropping
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec

from zhnlp.models.common.linear import ColumnLinear, RowLinear


class CorrectedSoftmaxRouter(TopKRouter):
    """Top-k router: ``p = softmax(x W^T)`` in float32; experts chosen by ``topk(p + correction)``; weights
    ``p[chosen] / max(sum p[chosen], norm_min)``. The correction bias is a frozen fp32 parameter
    (``requires_grad=False``: loaded and saved with the weights, never trained). The router has no bias.

    ``norm_min`` is read from the config attribute ``moe_router_norm_min`` (set by the family's
    ``transformer_config``; default 1e-12)."""

    def __init__(self, config, pg_collection=None):
        super().__init__(config=config, pg_collection=pg_collection)
        self.bias = None  # megatron adds one when add_bias_linear; ERNIE's gate has none
        self.e_score_correction_bias = torch.nn.Parameter(
            torch.zeros(config.num_moe_experts, dtype=torch.float32), requires_grad=False)
        self.norm_min = float(getattr(config, "moe_router_norm_min", 1e-12))

    def choose(self, logits):
        """``logits`` (tokens, E) -> (weights (tokens, E) with zeros off the chosen experts, chosen map bool)."""
        scores = torch.softmax(logits.float(), dim=-1)  # (t, E) fp32
        _, top = torch.topk(scores + self.e_score_correction_bias.float(), self.topk, dim=-1)  # (t, k)
        weights = scores.gather(1, top)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=self.norm_min)
        probs = torch.zeros_like(scores).scatter(1, top, weights).type_as(logits)
        chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(1, top, True)
        return probs, chosen

    def routing(self, logits, padding_mask=None):
        """megatron's routing with ERNIE's choice of experts: z-loss, token dropping (capacity) and the
        auxiliary load-balancing losses stay megatron's."""
        from megatron.core.transformer.moe.moe_utils import compute_routing_scores_for_aux_loss

        seq, bsz = logits.shape[:2]
        logits = logits.view(-1, self.config.num_moe_experts)  # (s*b, E)
        if padding_mask is not None:
            padding_mask = padding_mask.reshape(-1)
        logits = self.apply_z_loss(logits, padding_mask=padding_mask)
        probs, routing_map = self.choose(logits)
        if self.config.moe_expert_capacity_factor is not None:
            probs, routing_map = apply_router_token_dropping(
                probs, routing_map, router_topk=self.topk, capacity_factor=self.config.moe_expert_capacity_factor,
                drop_policy=self.config.moe_token_drop_policy,
                pad_to_capacity=self.config.moe_pad_expert_input_to_capacity)
        if self.training and torch.is_grad_enabled() and self.is_aux_loss_enabled():
            aux_map, aux_scores = compute_routing_scores_for_aux_loss(
                logits, self.topk, "softmax", fused=False, padding_mask=padding_mask)
            masked = padding_mask is not None
            probs = self._apply_aux_loss(probs, aux_scores, aux_map, with_padding_mask=masked)
            probs = self._apply_seq_aux_loss(probs, aux_scores, aux_map, seq, bsz, with_padding_mask=masked)
            probs = self._apply_global_aux_loss(probs, aux_scores, aux_map, with_padding_mask=masked)
        if self.training:  # tokens each expert received since the last moe_metrics() (this rank's tokens)
            counts = routing_map.sum(dim=0).detach().float()  # (E,)
            self.tokens_per_expert = counts if self.tokens_per_expert is None else self.tokens_per_expert + counts
            self.batches_routed += 1
        return probs, routing_map

    tokens_per_expert = None
    batches_routed = 0


class RoutedExperts(SequentialMLP):
    """megatron's SequentialMLP (one MLP per local expert, expert-tensor-parallel), without biases."""

    def __init__(self, num_local_experts, config, submodules, pg_collection=None):
        config = copy(config)
        config.add_bias_linear = False
        super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection)


class SharedExpertsMoE(MoELayer):
    """megatron's MoE layer whose output gains that of the shared experts (an MLP every token passes
    through, width ``config.zhnlp_shared_expert_size``; none when that is 0/None)."""

    def __init__(self, config, submodules=None, layer_number=None, pg_collection=None):
        super().__init__(config, submodules=submodules, layer_number=layer_number, pg_collection=pg_collection)
        width = getattr(config, "zhnlp_shared_expert_size", None)
        self.shared_experts = None
        if width:
            shared = copy(config)
            shared.ffn_hidden_size = width
            self.shared_experts = MLP(shared, MLPSubmodules(linear_fc1=ColumnLinear, linear_fc2=RowLinear),
                                      ffn_hidden_size=width)

    def forward(self, hidden_states, intermediate_tensors=None, padding_mask=None):
        output, bias = super().forward(hidden_states, padding_mask=padding_mask)  # (s, b, h)
        if self.shared_experts is not None:
            shared, shared_bias = self.shared_experts(hidden_states)
            output = output + shared + (shared_bias if shared_bias is not None else 0)
        return output, bias


def moe_metrics(model) -> dict:
    """MoE figures of the training steps since the last call (collective: every rank calls it): per MoE layer the
    fewest and most tokens an expert received (over the whole global batch: all data-parallel ranks, all
    sequence-parallel shards) as ``moe_tokens_per_expert_min/max`` (lists by MoE layer, in layer order) and the
    worst ratio ``moe_max_over_mean``; with an auxiliary loss, its value per step averaged over the MoE layers
    (``moe_aux_loss``, before the coefficient). Empty for a model without experts."""
    import torch.distributed as dist
    from megatron.core.transformer.moe.moe_utils import (clear_aux_losses_tracker,
                                                         get_moe_layer_wise_logging_tracker)

    arch, lay = model.config, model.layout
    if not getattr(arch, "is_moe", False):
        return {}
    counts = torch.zeros(arch.num_hidden_layers, arch.moe_num_experts)
    batches = torch.zeros(arch.num_hidden_layers)  # micro-batches routed, per layer (summed over ranks)
    # TP ranks without sequence parallelism route the same tokens: count them once
    counted = model.transformer_config.sequence_parallel or lay.tp_rank == 0
    for chunk in model.chunks:
        for layer in chunk.encoder.layers:
            router = getattr(layer.mlp, "router", None)
            if router is not None and router.tokens_per_expert is not None:
                if counted:
                    counts[layer.layer_number - 1] = router.tokens_per_expert
                batches[layer.layer_number - 1] = router.batches_routed
                router.tokens_per_expert, router.batches_routed = None, 0
    dist.all_reduce(counts)
    dist.all_reduce(batches)
    moe = counts[arch.moe_layers]  # (moe layers, E)
    out = {"moe_tokens_per_expert_min": [int(x) for x in moe.min(dim=1).values],
           "moe_tokens_per_expert_max": [int(x) for x in moe.max(dim=1).values],
           "moe_max_over_mean": float((moe.max(dim=1).values / moe.mean(dim=1).clamp(min=1e-9)).max())}
    tracker = get_moe_layer_wise_logging_tracker()
    if "load_balancing_loss" in tracker:
        # (layers,): each rank's sum over its micro-batches; mean over every rank's micro-batches, then layers
        values = tracker["load_balancing_loss"]["values"].detach().float().cpu().clone()
        dist.all_reduce(values)
        layers = arch.moe_layers
        out["moe_aux_loss"] = float((values[layers] / batches[layers].clamp(min=1)).mean())
        clear_aux_losses_tracker()
    return out


def moe_mlp_spec() -> ModuleSpec:
    """Spec of the MoE MLP of a decoder layer (router, routed experts, shared experts)."""
    experts = ModuleSpec(module=RoutedExperts, submodules=MLPSubmodules(linear_fc1=ColumnLinear, linear_fc2=RowLinear))
    return ModuleSpec(module=SharedExpertsMoE,
                      submodules=MoESubmodules(experts=experts, router=CorrectedSoftmaxRouter))


class _KnownMoESpec(logging.Filter):
    """megatron's TransformerLayer warns "Unknown MLP type" for any MLP class other than its own few, although it
    builds ours correctly (the MoE layer then takes the default process groups, which are the ones in use)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Unknown MLP type" not in record.getMessage()


logging.getLogger("megatron.core.transformer.transformer_layer").addFilter(_KnownMoESpec())
