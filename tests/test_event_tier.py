"""The event tier on real candidates: agreement with the analytic tier where
they must agree, the Parquet/CLI plumbing, and timeline export."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import evaluate, pack
from paraspace.explorer.timeline import capture
from paraspace.kernels.engine import KIND_NAMES
from paraspace.results.trace import chrome_trace
from paraspace.spaces.catalog import load_space, space_from_raw
from paraspace.spaces.encode import Encoder

SMALL = "llama3-8b-h100-64"


def one_space(tmp_path, **dims):
    raw = {"name": "t", "description": "t", "model": "llama3-8b", "hardware": "h100-sxm5-80gb", "devices": 64,
           "global_batch": 64, "seq_len": 4096, "dimensions": {k: [v] for k, v in dims.items()}}
    return space_from_raw(raw, "test", tmp_path)


def evaluated(space):
    enc = Encoder(space).encode_all()
    assert enc.n_rows == 1
    return enc.columns, evaluate(pack(space), enc.columns)


def test_single_stage_without_data_parallelism_equals_the_closed_form(tmp_path):
    """pp = 1 and dp * cp = 1: nothing overlaps and there is no bubble, so the
    simulated step is the m passes plus the optimizer, the analytic closed form,
    up to the rounding of each pass to whole nanoseconds (<= 1 ns per task)."""
    space = one_space(tmp_path, tp=8, pp=1, dp=1, micro_batch=1)
    space = space_from_raw({**space.raw, "devices": 8}, "test", tmp_path)
    cols, out = evaluated(space)
    assert out["simulated"][0] == 1.0
    n_tasks = out["n_tasks"][0]
    assert abs(out["step_time_s"][0] - out["step_time_analytic_s"][0]) <= n_tasks * 1e-9
    assert out["bubble_sim_s"][0] == pytest.approx(0.0, abs=n_tasks * 1e-9)  # the optimizer is compute too


def test_simulated_step_is_bounded_by_the_busiest_compute_stream(tmp_path):
    space = one_space(tmp_path, tp=2, pp=4, zero=1, sequence_parallel=True)
    cols, out = evaluated(space)
    m = cols["n_microbatches"][0]
    per_micro_compute = out["stage_fwd_s"][0] + out["stage_bwd_s"][0]
    assert out["step_time_s"][0] >= m * per_micro_compute * (1 - 1e-6) - out["tp_comm_s"][0]
    # throughput columns follow the simulated step
    tokens = 64 * 4096 / (out["step_time_s"][0] * 64)
    assert out["tokens_per_s_per_gpu"][0] == pytest.approx(tokens, rel=1e-12)
    # 1F1B: stage 0 holds min(p, m) micro-batches at its peak
    assert out["inflight_peak_stage0"][0] == min(4, m)


def test_unsimulated_rows_keep_the_analytic_step(tmp_path):
    space = one_space(tmp_path, tp=2, pp=4)
    enc = Encoder(space).encode_all()
    out = evaluate(pack(space), enc.columns, max_tasks=1)
    assert out["simulated"][0] == 0.0
    assert out["step_time_s"][0] == out["step_time_analytic_s"][0]
    assert np.isnan(out["bubble_sim_s"][0])


def test_parquet_nulls_and_cli_switches(tmp_path):
    out = tmp_path / "a.parquet"
    result = CliRunner().invoke(main, ["sweep", SMALL, "--out", str(out), "--no-progress", "--max-tasks", "600"])
    assert result.exit_code == 0, result.output
    df = pl.read_parquet(out)
    assert df["simulated"].any() and not df["simulated"].all()
    unsimulated = df.filter(~pl.col("simulated"))
    assert unsimulated["bubble_sim_s"].null_count() == unsimulated.height
    assert (unsimulated["step_time_s"] == unsimulated["step_time_analytic_s"]).all()
    result = CliRunner().invoke(main, ["sweep", SMALL, "--out", str(out), "--no-progress", "--no-simulate"])
    assert result.exit_code == 0
    assert not pl.read_parquet(out)["simulated"].any()


def test_timeline_capture_and_chrome_trace(tmp_path):
    space = one_space(tmp_path, tp=2, pp=4, zero=1)
    enc = Encoder(space).encode_all()
    row = {k: int(v[0]) for k, v in enc.columns.items()}
    tl = capture(space, pack(space), row)
    cols, out = evaluated(space)
    assert tl.step_s == pytest.approx(out["step_time_s"][0], abs=1e-9)
    assert tl.start_s.size == out["n_tasks"][0]
    trace = chrome_trace(tl)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == tl.start_s.size
    assert {e["pid"] for e in complete} == {0, 1, 2, 3}
    assert all(e["dur"] >= 0 and e["args"]["kind"] in KIND_NAMES for e in complete)
    forwards = [e for e in complete if e["args"]["kind"] == "forward" and e["pid"] == 0]
    assert sorted({e["args"]["micro_batch"] for e in forwards}) == list(range(row["n_microbatches"]))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "compute" in names and "ib" in names and "ib dp" in names  # per tier: critical (PP, EP) and DP streams


def test_trace_command_writes_json_and_png(tmp_path):
    prefix = tmp_path / "run"
    result = CliRunner().invoke(main, ["trace", "--space", SMALL, "--set", "pp=4", "--set", "tp=2", "--out",
                                       str(prefix)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "run.json").read_text())
    assert any(e["ph"] == "X" for e in data["traceEvents"])
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_catalog_space_event_tier_is_deterministic():
    space = load_space(SMALL)
    enc = Encoder(space).encode_all()
    a = evaluate(pack(space), enc.columns)
    b = evaluate(pack(space), enc.columns)
    for key in a:
        assert np.array_equal(a[key], b[key], equal_nan=True), key
