"""Performance tools: profile breakdown parser, scaling simulator, and bench --reference/--profile runs.
No timing assertions: only structure and sanity."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlrmkit.cli import main
from dlrmkit.perf.profile import PHASES, Interval, breakdown, phase_of, step_breakdown


def test_breakdown_innermost_wins_and_sums_to_one():
    ivs = [Interval("embedding_lookup", 0, 50), Interval("all_to_all", 10, 30), Interval("top_mlp", 60, 80)]
    shares = breakdown(ivs, total=100, start=0)
    assert set(shares) == set(PHASES)
    assert shares["all_to_all"] == pytest.approx(0.2)
    assert shares["embedding_lookup"] == pytest.approx(0.3)
    assert shares["top_mlp"] == pytest.approx(0.2)
    assert shares["other"] == pytest.approx(0.3)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_phase_names():
    assert phase_of("dlrmkit::bottom_mlp") == "bottom_mlp"
    assert phase_of("c10d::alltoall_base_") == "all_to_all"
    assert phase_of("gloo:all_reduce") == "all_reduce"
    assert phase_of("autograd::engine::evaluate_function: AddmmBackward0") == "backward"
    assert phase_of("aten::mm") is None
    assert phase_of("dlrmkit::nonsense") is None


class _Ev:
    def __init__(self, name, start, end):
        self.name = name
        self.time_range = type("TR", (), {"start": start, "end": end})()


def test_step_breakdown_from_events():
    events = [
        _Ev("dlrmkit::step", 0, 1000),
        _Ev("dlrmkit::optimizer", 900, 1000),
        _Ev("aten::mm", 0, 10),
        _Ev("dlrmkit::step", 2000, 3000),
        _Ev("dlrmkit::optimizer", 2500, 3000),
    ]
    shares, step_s = step_breakdown(events)
    assert step_s == pytest.approx(1000e-6)
    assert shares["optimizer"] == pytest.approx(0.3)


def test_bench_reference_and_profile(tmp_path):
    out, trace, png = tmp_path / "b.json", tmp_path / "t.json", tmp_path / "b.png"
    rc = main(
        [
            "bench",
            "--no-compile",
            "--model",
            "small",
            "--batch-size",
            "64",
            "--steps",
            "1",
            "--windows",
            "1",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--reference",
            "--profile",
            "--profile-steps",
            "1",
            "--trace",
            str(trace),
            "--plot",
            str(png),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["reference_samples_per_s"] > 0 and result["speedup_vs_reference"] > 0
    assert sum(result["profile_shares"].values()) == pytest.approx(1.0)
    assert result["profile_shares"]["bottom_mlp"] > 0 and result["profile_shares"]["optimizer"] > 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.stat().st_size > 1000


def test_bench_fraction_is_the_median_of_side_by_side_window_ratios(tmp_path):
    """The bound is timed after every window; the fraction compares each window with its own bound."""
    import statistics

    out = tmp_path / "b.json"
    assert (
        main(
            [
                "bench",
                "--no-compile",
                "--model",
                "small",
                "--batch-size",
                "64",
                "--steps",
                "1",
                "--windows",
                "3",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    r = json.loads(out.read_text())
    assert len(r["window_compute_bounds"]) == len(r["window_samples_per_s"]) == 3
    ratios = [a / b for a, b in zip(r["window_samples_per_s"], r["window_compute_bounds"])]
    assert r["compute_bound_fraction"] == pytest.approx(statistics.median(ratios))
    assert r["compute_bound_samples_per_s"] == pytest.approx(statistics.median(r["window_compute_bounds"]))


def test_reference_model_learns_one_batch():
    from dlrmkit.perf.workload import random_batches
    from dlrmkit.model.dlrm import ModelConfig
    from dlrmkit.perf.reference import ReferenceDLRM, per_table, reference_step_fn

    cfg = ModelConfig(13, [50, 60, 70], 8, [16, 8], [16, 1])
    batch = random_batches(cfg, 32, 1, seed=0)[0]
    step, model = reference_step_fn(cfg, lr=0.05, seed=0)
    values, offsets = per_table(batch.ids)

    def loss():
        return torch.nn.functional.binary_cross_entropy_with_logits(model(batch.dense, values, offsets), batch.labels)

    before = float(loss())
    for _ in range(20):
        step(batch)
    assert float(loss()) < before
    assert isinstance(model, ReferenceDLRM) and model.tables[0].sparse


def test_simulator_monotonic_and_sane():
    from dlrmkit.parallel.plan import PRESET_TABLES, make_plan
    from dlrmkit.perf.simulate import PROFILES, anchor_errors, simulate, simulate_scaling

    rows, dim = PRESET_TABLES["criteo-1tb-mlperf"]
    a100, h100 = PROFILES["a100-80gb"], PROFILES["h100"]
    small, big = make_plan(rows, dim, 8, batch_size=16384), make_plan(rows, dim, 8, batch_size=65536)
    assert simulate(big, a100)["step_s"] > simulate(small, a100)["step_s"]  # more work, longer step
    assert simulate(big, h100)["samples_per_s"] > simulate(big, a100)["samples_per_s"]  # faster hardware
    assert simulate(big, a100, "amp")["samples_per_s"] > simulate(big, a100)["samples_per_s"]
    runs = simulate_scaling(rows, dim, a100, [1, 8, 64, 1024], 65536, "amp")
    shares = [r["comm_share"] for r in runs]
    assert shares[0] == 0 and shares == sorted(shares) and shares[-1] < 1  # strong scaling: comm grows
    for r in runs:
        assert math.isfinite(r["samples_per_s"]) and r["samples_per_s"] > 0
    for a in anchor_errors(rows, dim):  # within a factor of 3 of the published figures
        assert 1 / 3 < a["estimate"] / a["samples_per_s"] < 3


def test_plan_simulate_cli(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert (
        main(["plan", "--tables-preset", "criteo-kaggle", "--simulate", "--world-size", "8", "--json", str(out)]) == 0
    )
    assert "samples/s" in capsys.readouterr().out
    assert json.loads(out.read_text())["runs"][0]["world_size"] == 8
    assert main(["plan", "--tables-preset", "criteo-kaggle"]) == 2  # no --world-size, no --simulate


def test_threads_default_and_placement(monkeypatch):
    from dlrmkit.device import table_placement
    from dlrmkit.perf.bench_perf import default_threads

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert default_threads(0) == 1
    assert default_threads(3) == 3
    if torch.cuda.is_available():
        pytest.skip("CPU-only placement checks; this machine has a GPU")
    assert table_placement("auto", 1 << 30)[0] == "host"
    assert main(["bench", "--table-placement", "device", "--steps", "1"]) == 2  # no GPU: one-line error


def test_fbgemm_embeddings_match_native():
    from dlrmkit.perf.fbgemm_embedding import fbgemm_available

    ok, why = fbgemm_available()
    if not ok:
        pytest.skip(f"needs fbgemm-gpu-cpu: {why}")
    from dlrmkit.perf.workload import random_batches
    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.perf.fbgemm_embedding import FbgemmEmbeddings

    cfg = ModelConfig(13, [50, 60, 70], 8, [16, 8], [16, 1])
    model = DLRM(cfg)
    model.reset_parameters(0)
    batch = random_batches(cfg, 16, 1, seed=1)[0]
    fb = FbgemmEmbeddings(model.embeddings, lr=0.1)
    torch.testing.assert_close(fb(batch.ids), model.embeddings(batch.ids), rtol=1e-5, atol=1e-6)
