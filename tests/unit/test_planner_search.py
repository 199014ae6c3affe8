"""The layout search (zhnlp.planning.search), `zhnlp plan` and `zhnlp pretrain --parallel auto`: what is chosen
satisfies every constraint, fits, and is the fastest that does; what cannot be done is said in one message."""

import copy
import json

import pytest

from zhnlp.cli import main
from zhnlp.planning import Layout, peak_memory
from zhnlp.planning.search import evaluate, plan, usable_memory
from zhnlp.planning.timing import hardware, step_time
from zhnlp.training.config import override, recipe


def test_the_best_layouts_fit_divide_the_model_and_come_fastest_first():
    arch = recipe("ernie4.5-21b-a3b").architecture()
    result = plan(arch, 64, global_batch=1024, seq_length=4096, hardware="h100", top=5)
    assert result["fitting"] >= 5 and len(result["best"]) == 5
    times = [c.time["total"] for c in result["best"]]
    assert times == sorted(times)
    for cand in result["best"]:
        lay = cand.layout
        assert cand.memory["total"] <= usable_memory(hardware("h100").memory_bytes)
        assert arch.num_attention_heads % lay.tp == 0 and arch.num_key_value_heads % lay.tp == 0
        assert arch.num_hidden_layers % (lay.pp * (lay.vpp or 1)) == 0 and arch.moe_num_experts % lay.ep == 0
        assert lay.tp <= 8 and (lay.tp == 1 or lay.sequence_parallel)  # TP inside a node; MoE with TP needs SP
        assert (1024 // lay.dp) % cand.micro_batch == 0
    # every reason names what was wrong
    assert all(c.reason.startswith(("fits but", "does not fit")) for c in result["rejected"])


@pytest.mark.parametrize("name, gpus, family", [
    ("ernie4.5-21b-a3b", 64, dict(tp=1, pp=1, ep=8)),  # the publication's: experts inside a node, no TP or PP
    ("ernie4.5-300b-a47b", 384, dict(tp=4, pp=6, ep=2)),  # experts inside a node, pipeline across nodes (+ TP)
])
def test_ernie_4_5_on_h800_clusters_gets_the_published_family(name, gpus, family):
    """README's "Published runs": intra-node expert parallelism and the distributed optimizer. FSDP is searched
    too; under it every micro-batch gathers all the weights, experts included, which loses here."""
    arch = recipe(name).architecture()
    [best] = plan(arch, gpus, global_batch=1024, seq_length=4096, hardware="h800", top=1)["best"]
    lay = best.layout
    assert {k: getattr(lay, k) for k in family} == family and lay.distributed_optimizer and not lay.fsdp
    # FSDP of an MoE model (ep=1) moves every expert's weights, every micro-batch: slower than the whole chosen step
    fsdp = evaluate(arch, Layout(world=gpus, tp=8, pp=3 if gpus % 3 == 0 else 1, sequence_parallel=True, fsdp=True,
                                 precision="bf16"),
                    micro_batch=1, global_batch=1024, seq_length=4096, hardware="h800")
    assert fsdp.time["dp"] > best.time["total"]


def test_when_nothing_fits_the_planner_says_what_would():
    arch = recipe("ernie4.5-300b-a47b").architecture()
    result = plan(arch, 8, global_batch=64, seq_length=4096, hardware="h100")
    assert result["best"] == [] and result["fitting"] == 0
    assert "no layout of 8 devices fits" in result["needs"] and "devices would" in result["needs"]


def test_plan_json_for_one_layout_is_the_models_figures(capsys):
    code = main(["plan", "--recipe", "ernie4.5-0.3b", "--world-size", "8", "--tp", "2", "--pp", "2",
                 "--sequence-parallel", "--precision", "bf16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["searched"] == 1
    [chosen] = out["best"]
    cfg = recipe("ernie4.5-0.3b")
    layout = Layout(world=8, tp=2, pp=2, sequence_parallel=True, precision="bf16")
    batch = dict(micro_batch=cfg.data.micro_batch_size, seq_length=cfg.data.seq_length,
                 global_batch=cfg.data.global_batch_size)
    stages = peak_memory(cfg.architecture(), layout, **batch)
    assert chosen["memory_bytes"]["total"] == max(s["total"] for s in stages)
    parts = ("weights", "gradients", "optimizer_states", "activations", "head", "transient")
    assert sum(chosen["memory_bytes"][k] for k in parts) == chosen["memory_bytes"]["total"]
    assert chosen["step_time_s"] == pytest.approx(step_time(cfg.architecture(), layout, hardware="h100",
                                                            **batch)["total"])
    assert chosen["layout"]["dp"] == 2 and chosen["layout"]["micro_batch_size"] == cfg.data.micro_batch_size


def test_plan_prints_the_search_and_the_reasons(capsys):
    assert main(["plan", "--recipe", "ernie-3.0-base", "--gpus", "8", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "#1  --tp" in out and "#2  --tp" in out and "memory/device" in out and "MFU" in out
    assert "Not chosen:" in out and "slower" in out


@pytest.mark.parametrize("argv, message", [
    (["--world-size", "8", "--tp", "3"], "not divisible"),
    (["--gpus", "8", "--gpu", "tpu9"], "unknown hardware 'tpu9'"),
    (["--gpu-memory", "lots", "--gpus", "8"], "not a memory size"),
    ([], "--gpus N"),
])
def test_plan_refuses_with_one_clear_line(capsys, argv, message):
    assert main(["plan", "--recipe", "ernie4.5-0.3b", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_nothing_fits_exits_1_with_the_way_out(capsys):
    assert main(["plan", "--recipe", "ernie4.5-300b-a47b", "--gpus", "8", "--global-batch-size", "64"]) == 1
    assert "devices would" in capsys.readouterr().out


def test_fsdp_is_searched_and_chosen_where_only_it_fits():
    """With devices too small for every layout that keeps whole weights on a rank, the planner picks --fsdp (and
    the layout it picks is one the trainer accepts)."""
    from zhnlp.planning.search import RESERVE_BYTES, RESERVE_FRACTION, layouts

    arch = recipe("ernie4.5-0.3b").architecture()
    batch = dict(global_batch=64, seq_length=4096, hardware="a100-80")
    leanest = {True: float("inf"), False: float("inf")}
    for layout, mb in layouts(arch, 8, gpus_per_node=8, precision="bf16", global_batch=64):
        total = evaluate(arch, layout, micro_batch=mb, with_time=False, **batch).memory["total"]
        leanest[layout.fsdp] = min(leanest[layout.fsdp], total)
    assert leanest[True] < leanest[False]  # 16 heads over 2 key/value heads: TP 2 at most, so FSDP saves most
    usable = (leanest[True] + leanest[False]) // 2  # room for FSDP only
    memory = int((usable + RESERVE_BYTES) / (1 - RESERVE_FRACTION)) + 1
    result = plan(arch, 8, gpu_memory=memory, top=3, precision="bf16", **batch)
    assert result["best"] and all(c.layout.fsdp for c in result["best"]), [c.flags() for c in result["best"]]
    lay = result["best"][0].layout
    override(recipe("ernie4.5-0.3b"), tp=lay.tp, pp=lay.pp, fsdp=True, sequence_parallel=lay.sequence_parallel,
             recompute=lay.recompute).check(world_size=8)


def test_gpt3_175b_on_1024_a100s_gets_the_published_family():
    """Narayanan et al. (SC'21) trained GPT-3 175B on 1,024 A100-80GB with TP 8 (inside a node) and PP 16,
    global batch 1,536 of 2,048 tokens. Its shape as a decoder here: 96 layers of width 12,288 (SwiGLU of
    32,768 has GPT-3's 8h^2 MLP parameters), 96 heads, vocabulary 51,200."""
    arch = copy.deepcopy(recipe("ernie4.5-0.3b").architecture())
    for key, value in dict(hidden_size=12288, num_hidden_layers=96, num_attention_heads=96, num_key_value_heads=96,
                           head_dim=128, intermediate_size=32768, vocab_size=51200,
                           max_position_embeddings=2048).items():
        setattr(arch, key, value)
    result = plan(arch, 1024, global_batch=1536, seq_length=2048, hardware="a100-80", top=1)
    [best] = result["best"]
    assert best.layout.tp == 8 and best.layout.pp > 1  # TP inside the node, pipeline across nodes
    published = evaluate(arch, Layout(world=1024, tp=8, pp=16, precision="bf16"), micro_batch=1,
                         global_batch=1536, seq_length=2048, hardware="a100-80")
    assert published.fits


def test_parallel_auto_sets_the_layout_and_refuses_hand_set_flags(capsys, monkeypatch):
    from zhnlp.planning.auto import choose_layout

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cfg = recipe("ernie4.5-moe-debug")
    best = choose_layout(cfg, 2)
    lay = best.layout
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.ep) == (lay.tp, lay.pp, lay.ep)
    assert cfg.data.micro_batch_size == best.micro_batch and cfg.recompute == lay.recompute
    cfg.check(2)  # what it chose is a layout the trainer accepts
    assert main(["pretrain", "--recipe", "ernie-debug", "--parallel", "auto", "--tp", "2", "--print-config"]) == 2
    assert "--parallel auto chooses the layout itself; drop --tp" in capsys.readouterr().err


def test_parallel_auto_refuses_a_layout_set_in_the_config_file(tmp_path, capsys, monkeypatch):
    """A --config file that changes a layout setting would be silently replaced by the planner's choice: refused,
    naming the setting. A file written by --print-config repeats the recipe's own layout and is accepted."""
    import json

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert main(["pretrain", "--recipe", "ernie-debug", "--print-config"]) == 0
    dump = json.loads(capsys.readouterr().out)
    (tmp_path / "full.json").write_text(json.dumps(dump), encoding="utf-8")
    assert main(["pretrain", "--config", str(tmp_path / "full.json"), "--parallel", "auto", "--print-config"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["parallel"]["tp"] == 1 and chosen["data"]["micro_batch_size"] >= 1
    (tmp_path / "tp2.json").write_text(json.dumps({"recipe": "ernie-debug", "parallel": {"tp": 2},
                                                   "recompute": "full"}), encoding="utf-8")
    assert main(["pretrain", "--config", str(tmp_path / "tp2.json"), "--parallel", "auto", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "the --config file sets recompute='full', tp=2; remove those settings" in err


def test_calibrated_hardware_round_trips_and_a_bad_file_is_named(tmp_path, capsys):
    import dataclasses

    from zhnlp.planning.calibrate import calibration_layouts, load_hardware, save_hardware

    fitted = dataclasses.replace(hardware("cpu"), efficiency=3.5, intra_bandwidth=float("inf"), intra_latency=1e-3)
    save_hardware(fitted, tmp_path / "hw.json")
    assert load_hardware(tmp_path / "hw.json") == fitted
    assert main(["plan", "--recipe", "ernie-debug", "--gpus", "2", "--hardware-file", str(tmp_path / "hw.json"),
                 "--top", "1"]) == 0
    assert "2 x cpu" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text('{"speed": 1}', encoding="utf-8")
    assert main(["plan", "--recipe", "ernie-debug", "--gpus", "2", "--hardware-file", str(tmp_path / "bad.json")]) == 2
    assert "is not a hardware description written by `zhnlp plan --calibrate`" in capsys.readouterr().err
    # what a calibration measures: compute vs fixed costs at one process, then each kind of link
    flags = [f for _, f in calibration_layouts(recipe("ernie4.5-moe-debug"), 4)]
    assert ["--tp", "2", "--sequence-parallel"] in flags and ["--pp", "2"] in flags and ["--ep", "2"] in flags
    assert sum(1 for n, _ in calibration_layouts(recipe("ernie4.5-moe-debug"), 4) if n == 1) == 2
