"""megatron's tensor-parallel linears, computed with ``F.linear``.

megatron-core's linears run ``matmul`` and add the bias separately (or hand the bias back to
the caller with ``skip_bias_add``), which on a GPU is fused later. On a CPU that leaves an
extra full pass over every activation. These subclasses keep megatron's parameters,
attributes and communication (copy / all-reduce / sequence-parallel gather and
reduce-scatter from ``megatron.core.tensor_parallel.mappings``) and compute the GEMM with
the bias fused (``addmm``) wherever the bias may be added before the communication:

* column-parallel: the bias is sharded like the output, so it is always fused; the layer
  returns ``(output, None)`` even with ``skip_bias_add`` (callers add a None bias as nothing);
* row-parallel: the partial outputs are summed across ranks first, so the bias is fused only
  when tensor parallelism is off; otherwise it is added (or handed back) after the reduction.

MoE experts (``is_expert``) under expert or tensor parallelism communicate nothing here: megatron marks
them ``explicit_expert_comm`` because the token dispatcher moves their inputs and outputs.
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel import mappings as M


class ColumnLinear(ColumnParallelLinear):
    """Column-parallel linear: output features split across TP ranks."""

    def forward(self, input_, weight=None, runtime_gather_output=None):
        weight = self.weight if weight is None else weight
        if self.explicit_expert_comm:  # the MoE token dispatcher gathers and scatters
            return F.linear(input_, weight, self.bias), None
        tp = self.tp_group.size() if self.tp_group is not None else 1
        if self.sequence_parallel:
            input_ = M.gather_from_sequence_parallel_region(input_, group=self.tp_group)  # (s, b, h)
        elif tp > 1:
            input_ = M.copy_to_tensor_model_parallel_region(input_, group=self.tp_group)
        output = F.linear(input_, weight, self.bias)  # (s, b, out/tp)
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather and tp > 1:
            output = M.gather_from_tensor_model_parallel_region(output, group=self.tp_group)
        return output, None


class RowLinear(RowParallelLinear):
    """Row-parallel linear: input features split across TP ranks, outputs summed."""

    def forward(self, input_):
        tp = self.tp_group.size() if self.tp_group is not None else 1
        if tp == 1 or self.explicit_expert_comm:  # experts (no biases): the MoE token dispatcher reduces
            return F.linear(input_, self.weight, self.bias), None
        output = F.linear(input_, self.weight)  # partial sums (s, b, out)
        if self.sequence_parallel:
            output = M.reduce_scatter_to_sequence_parallel_region(output, group=self.tp_group)
        else:
            output = M.reduce_from_tensor_model_parallel_region(output, group=self.tp_group)
        if self.bias is None or self.skip_bias_add:
            return output, self.bias
        return output + self.bias, None
