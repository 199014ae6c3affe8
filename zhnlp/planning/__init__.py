"""The auto-parallel planner: what a recipe costs per rank under a parallel layout, as pure functions of the
architecture and the layout (no process groups, no tensors), so that a layout for a thousand GPUs can be
planned on a laptop.

* :mod:`zhnlp.planning.params`: the parameters each rank holds (exact: tested against the built models).
* :mod:`zhnlp.planning.memory`: the persistent memory per rank (weights, gradient buffer, optimizer states),
  checked against the allocator-level measurements of ``peak_tensor_bytes``.

Not here yet (see the README's planner section for what is and is not done): activation memory, the time
model and the layout search (``zhnlp plan``).
"""

from zhnlp.planning.layout import Layout
from zhnlp.planning.memory import static_memory
from zhnlp.planning.params import params_per_rank, stage_params

__all__ = ["Layout", "params_per_rank", "stage_params", "static_memory"]
