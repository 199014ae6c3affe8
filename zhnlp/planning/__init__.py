"""The auto-parallel planner: what a recipe costs per rank under a parallel layout, as pure functions of the
architecture and the layout (no process groups, no tensors), so that a layout for a thousand GPUs can be
planned on a laptop.

* :mod:`zhnlp.planning.params`: the parameters each rank holds (exact: tested against the built models).
* :mod:`zhnlp.planning.memory`: the persistent memory per rank (weights, gradient buffer, optimizer states),
  checked against the allocator-level measurements of ``peak_tensor_bytes``.
* :mod:`zhnlp.planning.activations`: the transient peak per rank (saved activations of the micro-batches in
  flight, logits and loss tensors, the tied embedding's gradient, AdamW's temporaries) and :func:`peak_memory`,
  the whole predicted peak, checked against ``peak_tensor_bytes`` (``scripts/validate_planner.py``).
* :mod:`zhnlp.planning.timing`: the time per step (FLOPs, per-collective communication over intra- and
  inter-node links, pipeline bubble, optimizer) on a :class:`Hardware` preset, and :func:`calibrate`, which fits
  the hardware's constants to measured step times (``scripts/validate_timing.py``).

* :mod:`zhnlp.planning.search`: the layout search (``zhnlp plan``, :mod:`zhnlp.planning.command`;
  ``zhnlp pretrain --parallel auto``, :mod:`zhnlp.planning.auto`); :mod:`zhnlp.planning.calibrate`:
  ``zhnlp plan --calibrate``.
"""

from zhnlp.planning.activations import activation_memory, peak_memory
from zhnlp.planning.layout import Layout
from zhnlp.planning.memory import static_memory
from zhnlp.planning.params import params_per_rank, stage_params
from zhnlp.planning.timing import Hardware, Measurement, calibrate, hardware, step_time, train_flops

__all__ = ["Hardware", "Layout", "Measurement", "activation_memory", "calibrate", "hardware", "peak_memory",
           "params_per_rank", "stage_params", "static_memory", "step_time", "train_flops"]
