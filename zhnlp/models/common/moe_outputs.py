"""transformers' mixture-of-experts outputs: the load-balancing ``aux_loss`` over the router logits.

transformers' MoE causal LMs (Ernie4_5_Moe among them) return, with ``output_router_logits=True``, the
Switch-Transformer balance loss: per MoE layer, the softmax of the router logits and its top-k experts (the
plain softmax: ERNIE's correction bias does not enter here); over all layers' real tokens together, ``f_e`` =
the share of top-k assignments that went to expert ``e`` and ``P_e`` = the mean routing probability of ``e``;
``aux_loss = E * sum_e f_e * P_e`` (1.0 for perfectly even routing). zhnlp computes the same quantity so that the
loss a user gets with labels is transformers' ``loss + router_aux_loss_coef * aux_loss``. (Training on the engine
uses megatron's own auxiliary loss, ``--moe-aux-loss-coeff``.)
"""

from __future__ import annotations

import torch


def load_balancing_loss(router_logits: tuple[torch.Tensor, ...], num_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``router_logits``: one ``(b*s, E)`` tensor per MoE layer (batch-major rows); ``attention_mask`` ``(b, s)``,
    1 = real token (None: every row counts). Returns the scalar balance loss (float32, differentiable)."""
    if not router_logits:
        return torch.zeros(())
    device = router_logits[0].device
    weight = (torch.ones(router_logits[0].shape[0], device=device) if attention_mask is None
              else attention_mask.reshape(-1).to(device=device, dtype=torch.float32))  # (b*s,)
    assigned = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probability = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)  # (t, E)
        top = probs.topk(top_k, dim=-1).indices  # (t, k)
        chosen = torch.zeros_like(probs).scatter(1, top, 1.0)  # (t, E): 1 where the token went
        assigned = assigned + (chosen * weight[:, None]).sum(0)
        probability = probability + (probs * weight[:, None]).sum(0)
        rows = rows + weight.sum()
    return num_experts * torch.sum((assigned / rows) * (probability / rows))
