"""Training monitoring: a metrics log, TensorBoard scalars, a progress bar, and loss curves.

:class:`Monitor` takes the trainer's per-step metrics dicts (``step``, ``loss``, ``lr``,
``grad_norm``, ...) and sends each one to three places:

* ``OUTPUT/metrics.jsonl``: one JSON object per call, flushed at once; a resumed run appends;
* ``OUTPUT/tensorboard/``: TensorBoard event files, one scalar per numeric key (tag ``train/KEY``);
* the terminal: a tqdm bar with ETA and loss, lr and tokens/s, or one plain line per call when
  the output stream is not a terminal (log files, torchrun, CI).

Only the logging rank should log; every other rank builds ``Monitor(..., enabled=False)``, whose
methods do nothing. :func:`plot_run` draws the loss and learning-rate curves of a finished (or
running) run from its ``metrics.jsonl``, and where the trainer logged it, its time per step stacked
by part (:data:`TIME_PARTS`); ``zhnlp plot RUN_DIR`` is its command.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import IO, Any

from zhnlp.errors import ZhnlpError

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CURVES_FILE = "curves.png"
# a step's time in parts (the trainer's metrics; see README, "Monitoring"): the first seven and other_s add up to
# step_time_s; the data wait comes before the step and the checkpoint after it
TIME_PARTS = {"compute_s": "compute", "tp_comm_s": "TP comm", "pp_comm_s": "PP comm", "pp_bubble_s": "PP bubble",
              "ep_comm_s": "EP comm", "grad_sync_s": "DP grad sync", "optimizer_s": "optimizer",
              "other_s": "other", "data_wait_s": "data wait", "checkpoint_s": "checkpoint"}


class MetricsError(ZhnlpError, ValueError):
    """A metrics file that is missing, empty or malformed."""


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars as Python numbers, so that they serialise as JSON."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def _number(value: Any) -> float | None:
    """A finite-or-not real number for TensorBoard, or None for anything else (None, strings, lists)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


class Monitor:
    """Logs training metrics to ``metrics.jsonl``, TensorBoard and a progress bar.

    ``total_steps`` is the step the run stops at (for the bar and the ETA; None for none);
    ``start_step`` the step it resumes from. ``stream`` (default ``sys.stdout``) receives the bar,
    or plain lines when it is not a TTY. With ``enabled=False`` nothing is created or written.
    """

    def __init__(self, output_dir: str | Path, total_steps: int | None, enabled: bool = True,
                 tensorboard: bool = True, progress: bool = True, start_step: int = 0,
                 stream: IO[str] | None = None):
        self.output_dir = Path(output_dir)
        self.total_steps = total_steps
        self.start_step = start_step
        self.enabled = enabled
        self._closed = False
        self._jsonl = None
        self._writer = None
        self._bar = None
        self._stream = None
        if not enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.output_dir / METRICS_FILE, "a", encoding="utf-8")
        if tensorboard:
            self._writer = self._summary_writer()
        if progress:
            self._stream = sys.stdout if stream is None else stream
            isatty = getattr(self._stream, "isatty", None)
            if isatty is not None and isatty():
                from tqdm import tqdm

                self._bar = tqdm(total=total_steps, initial=start_step, unit="step", file=self._stream,
                                 dynamic_ncols=True, desc="train")
        self._t0 = time.perf_counter()

    def _summary_writer(self):
        try:
            import tensorboard  # noqa: F401  (torch's writer needs the package for its protobufs)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            warnings.warn("TensorBoard logging is off: the `tensorboard` package is not installed "
                          "(pip install tensorboard).", stacklevel=3)
            return None
        # On resume, purge_step hides events at or after the resumed step left by the earlier run.
        purge = self.start_step + 1 if self.start_step > 0 else None
        writer = SummaryWriter(log_dir=str(self.output_dir / TENSORBOARD_DIR), purge_step=purge)
        # the Custom Scalars tab: the step's time parts in one chart, communication bytes and bandwidth in two
        kinds = ("tp", "pp", "dp", "ep")
        writer.add_custom_scalars({"step time": {
            "parts (s)": ["Multiline", [f"train/{k}" for k in ("step_time_s", *TIME_PARTS)]],
            "communication bytes": ["Multiline", [f"train/{k}_bytes" for k in kinds]],
            "bandwidth (bytes/s)": ["Multiline", [f"train/{k}_bytes_per_s" for k in kinds]]}})
        return writer

    # ------------------------------------------------------------------------------ logging
    def log(self, metrics: dict) -> None:
        """Record one step's metrics; ``metrics["step"]`` is required."""
        if not self.enabled:
            return
        if self._closed:
            raise RuntimeError("Monitor.log() after close()")
        if "step" not in metrics:
            raise ValueError(f"metrics need a 'step' key; got {sorted(metrics)}")
        record = {k: _plain(v) for k, v in metrics.items()}
        step = int(record["step"])
        self._jsonl.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._jsonl.flush()
        if self._writer is not None:
            for key, value in record.items():
                number = _number(value)
                if key != "step" and number is not None:
                    self._writer.add_scalar(f"train/{key}", number, global_step=step)
            self._writer.flush()
        if self._bar is not None:
            self._bar.set_postfix_str(f"loss={_fmt(record.get('loss'), '.4f')}, lr={_fmt(record.get('lr'), '.2e')}, "
                                      f"tok/s={_fmt(record.get('tokens_per_s'), ',.0f')}", refresh=False)
            self._bar.update(max(0, step - self._bar.n))
        elif self._stream is not None:
            print(self._line(record, step), file=self._stream, flush=True)

    def _line(self, m: dict, step: int) -> str:
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"step {step:>6}{total}", f"loss {_fmt(m.get('loss'), '.4f')}", f"lr {_fmt(m.get('lr'), '.2e')}"]
        if m.get("grad_norm") is not None:
            parts.append(f"grad_norm {m['grad_norm']:.3f}")
        if m.get("tokens_per_s") is not None:
            parts.append(f"{m['tokens_per_s']:,.0f} tok/s")
        eta = self._eta(step)
        if eta is not None:
            parts.append(f"eta {eta}")
        return "  ".join(parts)

    def _eta(self, step: int) -> str | None:
        done = step - self.start_step
        elapsed = time.perf_counter() - self._t0
        if not self.total_steps or done <= 0 or elapsed <= 0:
            return None
        remaining = max(0, self.total_steps - step) * elapsed / done
        from tqdm import tqdm

        return tqdm.format_interval(remaining)

    # ------------------------------------------------------------------------------ closing
    def close(self) -> None:
        """Flush and close everything; calling it twice is harmless."""
        if not self.enabled or self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.close()
        self._jsonl.close()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------- curves
def read_metrics(path: str | Path) -> list[dict]:
    """The records of a ``metrics.jsonl``; a MetricsError names the first bad line."""
    path = Path(path)
    if not path.is_file():
        raise MetricsError(f"no metrics file at {path}; is this a training run's output directory?")
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise MetricsError(f"{path} line {number}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(record, dict):
                raise MetricsError(f"{path} line {number}: expected a JSON object, got {type(record).__name__}")
            step = record.get("step")
            if isinstance(step, bool) or not isinstance(step, (int, float)):
                raise MetricsError(f"{path} line {number}: no numeric 'step' field")
            records.append(record)
    if not records:
        raise MetricsError(f"{path} is empty: the run has not logged a step yet")
    return records


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one key; a step logged twice (a resumed run) keeps its latest value."""
    by_step: dict[float, float] = {}
    for r in records:
        value = r.get(key)
        if _finite(value):
            by_step[r["step"]] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def time_parts(records: list[dict]) -> tuple[list[float], dict[str, list[float]]]:
    """(steps, label -> seconds per step) of the :data:`TIME_PARTS` in the records that have ``step_time_s`` (a
    step logged twice keeps its latest record; a missing or negative part counts 0), leaving out the parts that
    are 0 throughout (e.g. ``tp_comm_s`` without tensor parallelism). Empty for a run logged without them."""
    by_step = {r["step"]: r for r in records if _finite(r.get("step_time_s"))}
    steps = sorted(by_step)
    parts = {}
    for key, label in TIME_PARTS.items():
        values = [max(0.0, float(v)) if _finite(v := by_step[s].get(key)) else 0.0 for s in steps]
        if any(values):
            parts[label] = values
    return steps, parts


def _stacked(ax, steps: list[float], parts: dict[str, list[float]]) -> None:
    """The step-time parts stacked per step: bars for a few steps, a stacked area for many."""
    if len(steps) > 40:
        ax.stackplot(steps, *parts.values(), labels=list(parts), linewidth=0)
    else:
        width = 0.8 * min((b - a for a, b in zip(steps, steps[1:])), default=1.0)
        bottom = [0.0] * len(steps)
        for label, values in parts.items():
            ax.bar(steps, values, width=width, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("time per step (s)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    ax.grid(True, alpha=0.3)


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


DEV_FILE = "metrics.json"  # fine-tuning's summary: its "epochs" list holds every evaluation


def read_dev_scores(run_dir: str | Path) -> dict[str, tuple[list[float], list[float]]]:
    """The dev scores of a fine-tuning run (``metrics.json`` beside ``metrics.jsonl``): score name ->
    (steps, values), for every numeric score of every evaluation; empty for a pretraining run."""
    path = Path(run_dir) / DEV_FILE
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetricsError(f"{path} is not valid JSON ({e}); the run may still be writing it: try again.") from None
    evaluations = summary.get("epochs") if isinstance(summary, dict) else None
    scores: dict[str, tuple[list[float], list[float]]] = {}
    for entry in evaluations if isinstance(evaluations, list) else []:
        dev = entry.get("dev") if isinstance(entry, dict) else None
        at = entry.get("step", entry.get("epoch")) if isinstance(entry, dict) else None
        if not isinstance(dev, dict) or isinstance(at, bool) or not isinstance(at, (int, float)):
            continue
        for name, value in dev.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps, values = scores.setdefault(name, ([], []))
                steps.append(float(at))
                values.append(float(value))
    return scores


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Draw the loss and learning-rate curves of ``run_dir/metrics.jsonl`` into a PNG; returns its path.

    A fine-tuning run's dev scores (its ``metrics.json``) get a panel below, and the time per step stacked by
    part (:func:`time_parts`: compute, communication, gradient sync, optimizer, data wait, checkpoint) the last
    one. ``run_dir`` may also be the metrics file itself. The default output is ``curves.png`` beside it.
    """
    run_dir = Path(run_dir)
    metrics = run_dir if run_dir.is_file() else run_dir / METRICS_FILE
    records = read_metrics(metrics)
    loss_steps, loss = _series(records, "loss")
    lr_steps, lr = _series(records, "lr")
    if not loss and not lr:
        raise MetricsError(f"{metrics} has no finite 'loss' or 'lr' values to plot")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ZhnlpError("plotting needs matplotlib: pip install matplotlib") from None

    # A Figure with its own Agg canvas: no pyplot, so no global backend switch in the caller's process.
    dev = read_dev_scores(metrics.parent)
    time_steps, parts = time_parts(records)
    ratios = [2, 1] + [1.5] * (bool(dev) + bool(parts))
    fig = Figure(figsize=(8, 6 + 2.5 * (len(ratios) - 2)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(len(ratios), 1, sharex=True, height_ratios=ratios))
    ax_loss, ax_lr = axes[:2]
    name = metrics.parent.name or str(metrics.parent)
    fig.suptitle(f"{name}: {len(records)} logged steps")
    if loss:
        window = max(1, len(loss) // 50)
        if window > 1:
            ax_loss.plot(loss_steps, loss, color="tab:blue", alpha=0.3, linewidth=0.8, label="loss")
            ax_loss.plot(loss_steps, _smooth(loss, window), color="tab:blue", linewidth=1.5,
                         label=f"mean of {window}")
            ax_loss.legend(loc="upper right")
        else:
            ax_loss.plot(loss_steps, loss, color="tab:blue", linewidth=1.5, marker="." if len(loss) < 30 else None)
    else:
        ax_loss.text(0.5, 0.5, "no loss values", ha="center", va="center", transform=ax_loss.transAxes)
    ax_loss.set_ylabel("loss")
    ax_loss.grid(True, alpha=0.3)
    if lr:
        ax_lr.plot(lr_steps, lr, color="tab:orange", linewidth=1.5)
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    else:
        ax_lr.text(0.5, 0.5, "no learning-rate values", ha="center", va="center", transform=ax_lr.transAxes)
    ax_lr.set_ylabel("learning rate")
    ax_lr.grid(True, alpha=0.3)
    if dev:
        ax_dev = axes[2]
        for name, (steps, values) in sorted(dev.items()):
            ax_dev.plot(steps, values, marker="o", linewidth=1.5, label=name)
        ax_dev.set_ylabel("dev score")
        ax_dev.legend(loc="lower right")
        ax_dev.grid(True, alpha=0.3)
    if parts:
        _stacked(axes[-1], time_steps, parts)
    axes[-1].set_xlabel("step")

    out = Path(output) if output is not None else metrics.parent / CURVES_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


# ---------------------------------------------------------------------------------- command
def add_cli(subparsers) -> None:
    p = subparsers.add_parser("plot", help="draw a run's loss, learning-rate and dev-score curves and its time per "
                                           "step (PNG)",
                              description="Read RUN_DIR/metrics.jsonl and draw loss and learning rate against step; "
                                          "a fine-tuning run's dev scores (RUN_DIR/metrics.json) get a panel below, "
                                          "and the time per step stacked by part (compute, TP/PP/EP communication, "
                                          "pipeline bubble, gradient sync, optimizer, data wait, checkpoint) the "
                                          "last one.")
    p.add_argument("run_dir", metavar="DIR", help="run directory holding metrics.jsonl (or the file itself)")
    p.add_argument("-o", "--output", metavar="PNG", help="image path (default: DIR/curves.png)")
    p.set_defaults(func=_plot)


def _plot(args) -> int:
    print(plot_run(args.run_dir, args.output))
    return 0
