"""Monitoring: metrics.jsonl, TensorBoard scalars, progress output, and the loss/lr plot."""

import argparse
import io
import json

import pytest

from zhnlp.training.monitor import MetricsError, Monitor, add_cli, plot_run


def metrics(step, loss=None, **extra):
    m = {"step": step, "loss": 10.0 / step if loss is None else loss, "lr": 1e-4 * min(1.0, step / 5),
         "grad_norm": 1.5, "loss_scale": 1.0, "skipped": 0, "tokens_per_s": 12345.6, "mfu": 0.25,
         "max_memory_bytes": 2**30}
    m.update(extra)
    return m


class Tty(io.StringIO):
    def isatty(self):
        return True


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_lines_and_append_on_resume(tmp_path):
    out = io.StringIO()
    with Monitor(tmp_path, total_steps=6, tensorboard=False, stream=out) as mon:
        for step in (1, 2, 3):
            mon.log(metrics(step))
            assert len(read_jsonl(tmp_path / "metrics.jsonl")) == step  # flushed at every call
    with Monitor(tmp_path, total_steps=6, tensorboard=False, start_step=3, stream=out) as mon:
        for step in (4, 5, 6):
            mon.log(metrics(step, grad_norm=None))
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0] == metrics(1)
    assert records[5]["grad_norm"] is None
    # not a TTY: one plain line per log, with an ETA while steps remain
    lines = out.getvalue().splitlines()
    assert len(lines) == 6
    assert lines[0].startswith("step      1/6  loss 10.0000  lr 2.00e-05  grad_norm 1.500  12,346 tok/s  eta ")
    assert "grad_norm" not in lines[4] and lines[5].endswith("eta 00:00")


def test_tensorboard_scalars_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Monitor(tmp_path, total_steps=4, progress=False) as mon:
        for step in (1, 2, 3, 4):
            mon.log(metrics(step, grad_norm=None if step == 2 else 0.5, note="text"))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {f"train/{k}" for k in ("loss", "lr", "grad_norm", "loss_scale", "skipped", "tokens_per_s",
                                           "mfu", "max_memory_bytes")}
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4]
    assert [e.value for e in loss] == pytest.approx([10.0, 5.0, 10 / 3, 2.5])
    assert [e.step for e in acc.Scalars("train/grad_norm")] == [1, 3, 4]  # None is skipped
    assert acc.Scalars("train/lr")[-1].value == pytest.approx(8e-5)


def test_progress_bar_on_a_tty(tmp_path):
    tty = Tty()
    with Monitor(tmp_path, total_steps=10, tensorboard=False, stream=tty, start_step=2) as mon:
        mon.log(metrics(3))
        mon.log(metrics(5))
    text = tty.getvalue()
    assert "5/10" in text and "loss=2.0000" in text and "lr=1.00e-04" in text and "tok/s=12,346" in text
    assert "step " not in text  # the bar, not plain lines


def test_disabled_monitor_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    with Monitor(run, total_steps=3, enabled=False) as mon:
        mon.log(metrics(1))
        mon.log({"no": "step"})  # not even checked
    assert not run.exists()
    assert capsys.readouterr() == ("", "")


def test_log_needs_a_step(tmp_path):
    with Monitor(tmp_path, total_steps=1, tensorboard=False, progress=False) as mon:
        with pytest.raises(ValueError, match="'step'"):
            mon.log({"loss": 1.0})
    with pytest.raises(RuntimeError, match="after close"):
        mon.log(metrics(1))


def test_plot_writes_a_png(tmp_path):
    with Monitor(tmp_path, total_steps=120, tensorboard=False, progress=False) as mon:
        for step in range(1, 121):
            mon.log(metrics(step))
    path = plot_run(tmp_path)
    assert path == tmp_path / "curves.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    other = plot_run(tmp_path / "metrics.jsonl", output=tmp_path / "sub" / "x.png")
    assert other.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_errors(tmp_path):
    with pytest.raises(MetricsError, match="no metrics file"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(MetricsError, match="is empty"):
        plot_run(tmp_path)
    good = json.dumps(metrics(1))
    (tmp_path / "metrics.jsonl").write_text(f"{good}\n{good}\n{good[:20]}\n")
    with pytest.raises(MetricsError, match="line 3: not valid JSON"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(f"{good}\n[1, 2]\n")
    with pytest.raises(MetricsError, match="line 2: expected a JSON object"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"loss": 1.0}\n')
    with pytest.raises(MetricsError, match="line 1: no numeric 'step'"):
        plot_run(tmp_path)
    assert not (tmp_path / "curves.png").exists()


def test_plot_command(tmp_path, capsys):
    with Monitor(tmp_path, total_steps=3, tensorboard=False, progress=False) as mon:
        for step in (1, 2, 3):
            mon.log(metrics(step))
    parser = argparse.ArgumentParser(prog="zhnlp")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plot", str(tmp_path), "-o", str(tmp_path / "c.png")])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0


def png_size(path):
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_draws_a_fine_tuning_runs_dev_scores(tmp_path):
    from zhnlp.training.monitor import read_dev_scores

    with Monitor(tmp_path, total_steps=30, tensorboard=False, progress=False) as mon:
        for step in range(1, 31):
            mon.log(metrics(step))
    assert read_dev_scores(tmp_path) == {}
    plain = png_size(plot_run(tmp_path, output=tmp_path / "plain.png"))
    evaluations = [{"epoch": 1, "step": 10, "train_loss": 0.9, "dev": {"accuracy": 0.6, "f1": 0.5, "total": 40}},
                   {"epoch": 2, "step": 20, "train_loss": 0.5, "dev": {"accuracy": 0.7, "f1": 0.65, "total": 40}},
                   {"epoch": 3, "step": 30, "train_loss": 0.4, "dev": {"accuracy": 0.75, "f1": float("nan")}}]
    (tmp_path / "metrics.json").write_text(json.dumps({"status": "complete", "epochs": evaluations}))
    scores = read_dev_scores(tmp_path)
    assert scores["accuracy"] == ([10.0, 20.0, 30.0], [0.6, 0.7, 0.75])
    assert scores["f1"] == ([10.0, 20.0], [0.5, 0.65])  # a NaN score is left out
    with_dev = png_size(plot_run(tmp_path))
    assert with_dev[0] == plain[0] and with_dev[1] > plain[1]  # a third panel below the other two
    (tmp_path / "metrics.json").write_text('{"epochs": [')
    with pytest.raises(MetricsError, match="metrics.json is not valid JSON"):
        plot_run(tmp_path)


def test_plot_stacks_the_time_per_step(tmp_path):
    from zhnlp.training.monitor import time_parts

    def timed(step, **parts):  # a TP run: no pipeline or expert parallelism, a checkpoint every 5 steps
        times = {"compute_s": 0.1, "tp_comm_s": 0.05, "pp_comm_s": 0.0, "pp_bubble_s": 0.0, "ep_comm_s": 0.0,
                 "grad_sync_s": 0.02, "optimizer_s": 0.01, "other_s": -1e-6, "data_wait_s": 0.001,
                 "checkpoint_s": 0.5 if step % 5 == 0 else 0.0, **parts}
        return metrics(step, step_time_s=0.18, **times)

    with Monitor(tmp_path, total_steps=10, tensorboard=False, progress=False) as mon:
        for step in range(1, 11):
            mon.log(timed(step))
        mon.log(timed(10, compute_s=0.3))  # a resumed run logs step 10 again: the latest record counts
    steps, parts = time_parts(read_metrics_file(tmp_path))
    assert steps == list(range(1, 11))
    assert list(parts) == ["compute", "TP comm", "DP grad sync", "optimizer", "data wait", "checkpoint"]
    assert parts["compute"][-1] == 0.3 and parts["checkpoint"][4] == 0.5 and parts["checkpoint"][3] == 0.0
    assert time_parts([metrics(1), metrics(2)]) == ([], {})  # logged without the parts: no panel
    stacked = png_size(plot_run(tmp_path, output=tmp_path / "stacked.png"))
    (tmp_path / "plain").mkdir()
    with Monitor(tmp_path / "plain", total_steps=10, tensorboard=False, progress=False) as mon:
        for step in range(1, 11):
            mon.log(metrics(step))
    plain = png_size(plot_run(tmp_path / "plain"))
    assert stacked[0] == plain[0] and stacked[1] > plain[1]  # a panel below the loss and learning rate
    many = tmp_path / "many"
    with Monitor(many, total_steps=100, tensorboard=False, progress=False) as mon:
        for step in range(1, 101):
            mon.log(timed(step))
    assert png_size(plot_run(many)) == stacked  # many steps: a stacked area instead of bars, the same layout


def read_metrics_file(run_dir):
    from zhnlp.training.monitor import read_metrics

    return read_metrics(run_dir / "metrics.jsonl")
