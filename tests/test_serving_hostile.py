"""Hostile input to serving spaces (issue 15, item 7): nonsense values are a one-line
error naming the file, the field, the value and what was expected (exit status 2,
never a traceback); valid input that cannot be served is a run whose rows are
infeasible with a reason, and whose headline says why; a failed run leaves what
was written before untouched. The last test is a property test over random
mutations of a valid serving TOML.

The base space, Llama 3 8B on 2 H100 (4 candidates: tp 1 or 2, max_batch 8 or 16),
evaluates in well under a second once the kernels are compiled.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import tomli_w
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_fuzz_cli import leaf_paths

from paraspace.explorer import serve
from paraspace.explorer.cli import main
from paraspace.kernels import serving_sim
from paraspace.spaces import serving as sp

BASE: dict[str, Any] = {
    "name": "hostile", "description": "a small serving space to break", "model": "llama3-8b",
    "hardware": "h100-sxm5-80gb", "devices": 2, "host_overhead_us": 200.0, "simulate_top": 2,
    "workload": {"input_len": 512, "output_len": 64, "concurrency": 8, "n_requests": 64},
    "sla": {"ttft_s": 2.0, "tpot_s": 0.05},
    "dimensions": {"tp": [1, 2], "max_batch": [8, 16]},
}


def changed(changes: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """BASE with ``"table.key": value`` (or ``"key": value``) set and ``drop`` keys removed."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for dotted, value in changes.items():
        *tables, key = dotted.split(".")
        target = raw
        for table in tables:
            target = target.setdefault(table, {})
        target[key] = value
    for dotted in drop:
        *tables, key = dotted.split(".")
        target = raw
        for table in tables:
            target = target[table]
        del target[key]
    return raw


def write(folder: Path, raw: dict[str, Any], name: str = "space.toml") -> Path:
    path = folder / name
    path.write_text(tomli_w.dumps(raw))
    return path


def serve_cli(path: Path, out: Path, *extra: str) -> Result:
    return CliRunner().invoke(main, ["serve", str(path), "--out", str(out), "-n", "3", *extra],
                              catch_exceptions=True)


def assert_one_line_error(result: Result, path: Path, field: str, value: str, expected: str) -> str:
    """Exit status 2, no uncaught exception, no traceback, and one line 'Error: FILE: FIELD = VALUE: expected ...'."""
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"uncaught {type(exc).__name__}: {exc}\n{result.output}"
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    line = lines[0]
    assert line.startswith(f"Error: {path}: {field} = {value}: expected "), line
    assert expected in line, line
    return line


# --------------------------------------------------------------------------- 1. impossible SLAs


@pytest.mark.parametrize("change, field, value, expected", [
    ({"sla.ttft_s": 0.0}, "sla.ttft_s", "0.0", "greater than 0"),
    ({"sla.ttft_s": -1.0}, "sla.ttft_s", "-1.0", "greater than 0"),
    ({"sla.tpot_s": math.nan}, "sla.tpot_s", "nan", "a finite number"),
    ({"sla.tpot_s": math.inf}, "sla.tpot_s", "inf", "a finite number"),
    ({"sla.tpot_p90_s": -0.0}, "sla.tpot_p90_s", "-0.0", "greater than 0"),
    ({"sla.ttft_s": "fast"}, "sla.ttft_s", "'fast'", "a valid number"),
    # a 90th-percentile target tighter than the mean target: taken for swapped values
    ({"sla.ttft_p90_s": 1.0}, "sla.ttft_p90_s", "1.0", "at least the mean target sla.ttft_s = 2"),
    ({"sla.tpot_p90_s": 0.01}, "sla.tpot_p90_s", "0.01", "at least the mean target sla.tpot_s = 0.05"),
])
def test_nonsense_sla_is_a_one_line_error(tmp_path, change, field, value, expected):
    path = write(tmp_path, changed(change))
    assert_one_line_error(serve_cli(path, tmp_path / "out.parquet"), path, field, value, expected)
    assert not (tmp_path / "out.parquet").exists()


def test_p90_equal_to_the_mean_target_is_accepted(tmp_path):
    path = write(tmp_path, changed({"sla.ttft_p90_s": 2.0, "sla.tpot_p90_s": 0.05}))
    result = serve_cli(path, tmp_path / "out.parquet")
    assert result.exit_code == 0, result.output


def infeasible_frame(out: Path) -> pl.DataFrame:
    frame = pl.read_parquet(out)
    assert frame.height > 0 and frame["feasible"].null_count() == 0
    assert not frame["feasible"].any()
    return frame.with_columns(pl.col("infeasible_reason").cast(pl.String))


def test_unreachable_tpot_target_is_an_explained_infeasible_run(tmp_path):
    """A TPOT target of 1 us: no deployment decodes a token of an 8B model that fast
    (the weights alone, 16 GB over 3.35 TB/s, take ~2.4 ms at tp 2). The run completes;
    every row misses sla.tpot_s; the headline names it as the binding target."""
    path, out = write(tmp_path, changed({"sla.tpot_s": 1e-6})), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    frame = infeasible_frame(out)
    assert set(frame["infeasible_reason"]) == {"sla-tpot"}
    assert "no candidate meets the SLA; the binding target is sla.tpot_s = 1e-06 s" in result.output
    # TTFT (2 s) is met by every row: the best-per-target line says so
    assert f"target 2 s, met by {frame.height} of {frame.height}" in result.output
    assert "target 1e-06 s, met by 0 of" in result.output


def test_the_binding_target_is_the_closest_candidates_worst_miss(tmp_path):
    """Both targets out of reach: each row's worst ratio of metric to target, the smallest
    of them over the rows picks the closest candidate, whose worst target binds."""
    path, out = write(tmp_path, changed({"sla.ttft_s": 1e-3, "sla.tpot_s": 1e-4})), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    frame = infeasible_frame(out)
    ratios = np.stack([frame["ttft_s"].to_numpy() / 1e-3, frame["tpot_s"].to_numpy() / 1e-4], axis=1)
    worst = ratios.max(axis=1)
    closest = int(np.argmin(worst))
    binding = ("ttft_s", "tpot_s")[int(np.argmax(ratios[closest]))]
    line = next(ln for ln in result.output.splitlines() if ln.startswith("no candidate meets the SLA"))
    assert f"the binding target is sla.{binding} = " in line
    assert f"(row_id {frame['row_id'][closest]})" in line
    assert f"{worst[closest]:.3g}x the target" in line
    assert all(r.startswith("sla-") for r in frame["infeasible_reason"])


# --------------------------------------------------------------------------- 2. lengths the KV cache cannot hold


@pytest.mark.parametrize("input_len, longest", [
    (2_000_000, "2,000,064"),  # fixed: 2,000,000 prompt + 64 output tokens
    ({"distribution": "lognormal", "mean": 5_000_000.0, "sigma": 0.5}, None),
])
def test_requests_larger_than_any_kv_cache_are_explained_rows(tmp_path, input_len, longest):
    """Llama 3 8B holds 128 KiB of KV a token (32 layers x 8 KV heads x 128 x K and V x 2
    bytes): an H100's ~60 GiB left beside the weights hold ~0.5M tokens, two ~1M. A prompt
    of millions fits neither: every row kv-too-small, nothing simulated, and the headline
    gives the longest request against the roomiest engine's cache."""
    path, out = write(tmp_path, changed({"workload.input_len": input_len})), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    frame = infeasible_frame(out)
    assert set(frame["infeasible_reason"]) == {"kv-too-small"}
    assert not frame["simulated"].any()
    assert "kv-too-small: a request does not fit the replica's KV cache: the longest request is" in result.output
    if longest is not None:
        assert f"the longest request is {longest} tokens" in result.output
    caps = frame["kv_capacity_tokens"] / frame["pp"]
    assert (caps < 2_000_064).all() and (caps > 0).all()
    assert f"the roomiest engine's cache holds {caps.max():,.0f}" in result.output


def test_a_prompt_only_the_wider_replicas_hold_is_feasible_there_and_explained_elsewhere(tmp_path):
    """700,000-token prompts: one H100's cache (~0.5M tokens) cannot hold one, two H100s'
    (~1M) can: tp 1 rows are kv-too-small, tp 2 rows run (and are simulated) to finite
    latencies."""
    path, out = write(tmp_path, changed({"workload.input_len": 700_000, "sla": {}})), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out).with_columns(pl.col("infeasible_reason").cast(pl.String))
    narrow, wide = frame.filter(pl.col("tp") == 1), frame.filter(pl.col("tp") == 2)
    assert set(narrow["infeasible_reason"]) == {"kv-too-small"}
    assert (narrow["kv_capacity_tokens"] < 700_064).all()
    assert wide["feasible"].all() and (wide["kv_capacity_tokens"] >= 700_064).all()
    assert wide["simulated"].all() and (wide["ttft_s"] > 0).all() and wide["ttft_s"].is_finite().all()


def test_the_simulation_reports_requests_it_can_never_admit(tmp_path):
    """Forced onto every row (the analytic tier would not simulate them), the simulation
    ends and charges kv-too-small where the prompts drawn from 512, 512, 512 and 1,000,000
    tokens include one the engine's cache cannot hold, in a closed loop and under Poisson
    arrivals; rows whose cache holds it run to the end."""
    csv = tmp_path / "lengths.csv"
    csv.write_text("tokens\n512\n512\n512\n1000000\n")
    for arrivals in ({"concurrency": 4}, {"rate_per_s": 2.0}):
        workload = {"input_len": {"distribution": "empirical", "path": str(csv)}, "output_len": 16,
                    "n_requests": 40, **arrivals}
        space = sp.serving_from_raw(changed({"workload": workload, "sla": {}}), str(tmp_path / "s.toml"), tmp_path)
        in_len, _, _ = serve.sample_requests(space)
        assert in_len.max() == 1_000_000 and in_len.min() == 512  # both drawn (seed 0)
        cols = sp.encode(space).columns
        packed = serve.pack_serving(space)
        srv = serve.serving_records(space, cols)
        metrics = serve.analytic(packed, srv, cols, serve.serving_records(space, cols, prefill=True))
        metrics["simulated"] = np.zeros(len(cols["tp"]))
        for key in ("ttft_p90_s", "tpot_p90_s"):
            metrics[key] = np.full(len(cols["tp"]), np.nan)
        serve.simulate(space, packed, srv, cols, metrics, np.arange(len(cols["tp"])))
        cap = metrics["kv_capacity_tokens"] / cols["pp"]
        never = cap < 1_000_016
        assert never.any() and (~never).any()  # tp 1 cannot hold it, tp 2 can
        assert (metrics["reason"][never] == sp.Feasible.KV_TOO_SMALL).all()
        assert np.isnan(metrics["ttft_p90_s"][never]).all()
        assert (metrics["reason"][~never] != sp.Feasible.KV_TOO_SMALL).all()
        assert np.isfinite(metrics["ttft_p90_s"][~never]).all()


def test_simulation_kernel_ends_stuck_on_a_request_behind_the_others():
    """The kernel itself: the 3rd of 6 requests needs 1,000 tokens of a 600-token cache;
    the two before it complete, then it heads an empty engine and the run stops stuck
    (closed loop and Poisson), in a handful of iterations rather than forever."""
    grid = np.array([1.0, 2.0, 4096.0])
    zero = np.zeros((1, 3))
    in_len, out_len, gaps = np.array([100.0, 100.0, 1000.0, 100.0, 100.0, 100.0]), np.full(6, 8.0), np.ones(6)
    for clients, rate in ((2.0, 0.0), (0.0, 10.0)):
        sim = serving_sim.simulate_rows(in_len, out_len, gaps, np.array([clients]), np.array([rate]),
                                        np.array([4.0]), np.array([512.0]), np.array([1], np.int8),
                                        np.zeros(1, np.int8), np.array([600.0]), 1e-3, np.zeros(1), np.zeros(1), 0.0, grid, zero, zero,
                                        np.zeros(1, np.int32), 0.0, 0, zero, zero, False)
        assert sim[0, serving_sim.S_STUCK] == 1.0
        assert math.isnan(sim[0, serving_sim.S_TTFT])
        assert sim[0, serving_sim.S_ITERATIONS] < 100


# --------------------------------------------------------------------------- 3. bad values, names and files


BAD_INPUT = [
    # (changes, dropped keys, field, value as shown, expected)
    ({"workload.input_len": {"distribution": "zipf", "mean": 512.0}}, (), "workload.input_len.distribution",
     "'zipf'", "'fixed', 'lognormal' or 'empirical'"),
    ({"workload.output_len": {"distribution": "lognormal", "mean": 0.0, "sigma": 1.0}}, (),
     "workload.output_len.mean", "0.0", "greater than or equal to 1"),
    ({"workload.output_len": {"distribution": "lognormal", "sigma": 1.0}}, (), "workload.output_len.mean",
     "(missing)", "required for a lognormal length"),
    ({"workload.input_len": {"distribution": "empirical", "path": "missing.csv"}}, (), "workload.input_len.path",
     "'missing.csv'", "a readable CSV file of request lengths"),
    ({"workload.input_len": {"distribution": "empirical"}}, (), "workload.input_len.path", "(missing)",
     "a CSV file of request lengths"),
    ({"workload.input_len": {"distribution": "empirical", "path": "two.csv", "column": "tokens"}}, (),
     "workload.input_len.column", "'tokens'", "a column of two.csv: one of ['prompt', 'answer']"),
    ({"workload.input_len": {"distribution": "empirical", "path": "two.csv"}}, (), "workload.input_len.column",
     "(missing)", "the column of two.csv to read, one of ['prompt', 'answer']"),
    ({"workload.input_len": {"distribution": "empirical", "path": "garbage.csv"}}, (), "workload.input_len.column",
     "'tokens'", "garbage.csv line 3 holds 'lots'"),
    ({"workload.input_len": {"distribution": "empirical", "path": "negative.csv"}}, (), "workload.input_len.column",
     "'tokens'", "each in [1, 16777216] (negative.csv line 2 holds '-5')"),
    ({"workload.input_len": {"distribution": "empirical", "path": "header.csv"}}, (), "workload.input_len.path",
     "'header.csv'", "at least one length under its header"),
    ({"workload.input_len": {"distribution": "empirical", "path": "one.csv", "mean": 10.0}}, (),
     "workload.input_len.mean", "10.0", "no mean for an empirical length"),
    ({"workload.input_len": {"mean": 512.0, "path": "one.csv"}}, (), "workload.input_len.path", "'one.csv'",
     "no path for a fixed length"),
    ({"workload.rate_per_s": 0.0}, ("workload.concurrency",), "workload.rate_per_s", "0.0", "greater than 0"),
    ({"workload.rate_per_s": -3.0}, ("workload.concurrency",), "workload.rate_per_s", "-3.0", "greater than 0"),
    ({"workload.rate_per_s": 4.0}, (), "workload.concurrency", "8", "exactly one of concurrency"),
    ({"workload.concurrency": 0}, (), "workload.concurrency", "0", "greater than 0"),
    ({"workload.n_requests": 0}, (), "workload.n_requests", "0", "greater than or equal to 1"),
    ({"workload.n_requests": "many"}, (), "workload.n_requests", "'many'", "a valid integer"),
    ({"workload.acceptance_rate": 1.5}, (), "workload.acceptance_rate", "1.5", "less than or equal to 1"),
    ({"workload.acceptance_rate": -0.1}, (), "workload.acceptance_rate", "-0.1", "greater than or equal to 0"),
    ({"dimensions.draft_tokens": [0, 2]}, (), "workload.acceptance_rate", "(missing)", "a probability in [0, 1]"),
    ({"workload.prefix_hit_rate": 1.0}, (), "workload.prefix_hit_rate", "1.0", "less than 1"),
    ({"dimensions.tpp": [1, 2]}, (), "dimensions.tpp", "[1, 2]", "one of the known keys ['attention_dp'"),
    ({"workload.concurency": 8}, ("workload.concurrency",), "workload.concurency", "8", "one of the known keys"),
    ({"dimensions.tp": ["two"]}, (), "dimensions.tp.0", "'two'", "a valid integer"),
    ({"dimensions.tp": 2}, (), "dimensions.tp", "2", "a valid tuple"),
    ({"devices": "8"}, (), "devices", "'8'", "a valid integer"),
    ({"workload.output_len": "long"}, (), "workload.output_len", "'long'", ""),
    ({"dimensions.tp": [1, 1]}, (), "dimensions.tp", "[1, 1]", "distinct values"),
    ({"dimensions.kv_dtype": ["fp8", "fp8"]}, (), "dimensions.kv_dtype", "['fp8', 'fp8']", "distinct values"),
    ({"dimensions.scheduler": ["fifo"]}, (), "dimensions.scheduler.0", "'fifo'", "'static', 'continuous' or 'continuous-unchunked'"),
    ({"dimensions.dtype": ["fp7"]}, (), "dimensions.dtype", "'fp7'", "one of ['bf16', 'fp16', 'fp4', 'fp8', 'int8']"),
    ({"fp8_scaling": "blocky"}, (), "fp8_scaling", "'blocky'", "'tensor', 'row' or 'block'"),
    ({"model": "llama9"}, (), "model", "'llama9'", "a model TOML path or one of ['deepseek-v2'"),
    ({"hardware": "h999"}, (), "hardware", "'h999'", "a hardware TOML path or one of ['a100-sxm4-40gb'"),
    ({"model": "nowhere/model.toml"}, (), "model", "'nowhere/model.toml'", "an existing TOML file"),
    ({}, ("workload",), "workload", "(missing)", "a value (this field is required)"),
    ({}, ("workload.input_len",), "workload.input_len", "(missing)", "a value (this field is required)"),
]


@pytest.mark.parametrize("changes, drop, field, value, expected", BAD_INPUT,
                         ids=[f"{case[2]}={case[3]}" for case in BAD_INPUT])
def test_bad_input_is_one_line_naming_file_field_value_and_expectation(tmp_path, changes, drop, field, value,
                                                                       expected):
    (tmp_path / "two.csv").write_text("prompt,answer\n100,20\n")
    (tmp_path / "one.csv").write_text("tokens\n100\n")
    (tmp_path / "garbage.csv").write_text("tokens\n100\nlots\n")
    (tmp_path / "negative.csv").write_text("tokens\n-5\n")
    (tmp_path / "header.csv").write_text("tokens\n")
    path, out = write(tmp_path, changed(changes, drop)), tmp_path / "out.parquet"
    assert_one_line_error(serve_cli(path, out), path, field, value, expected)
    assert not out.exists()


def test_an_empirical_length_csv_is_drawn_from(tmp_path):
    """Prompts from a CSV of 100, 200, 300 and 400 tokens (a blank line and another
    column besides): the mean the headline shows is (100 + 200 + 300 + 400) / 4 = 250,
    and every simulated prompt is one of the four."""
    (tmp_path / "prompts.csv").write_text("id,tokens\na,100\nb,200\n\nc,300\nd,400\n")
    raw = changed({"workload.input_len": {"distribution": "empirical", "path": "prompts.csv", "column": "tokens"}})
    path, out = write(tmp_path, raw), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    assert "empirical 250 in" in result.output
    space = sp.load_serving(str(path))
    assert space.spec.workload.input_len.mean == 250.0
    in_len, _, _ = serve.sample_requests(space)
    assert set(np.unique(in_len)) <= {100.0, 200.0, 300.0, 400.0} and len(np.unique(in_len)) == 4
    assert pl.read_parquet(out)["feasible"].all()


# --------------------------------------------------------------------------- what a failed run leaves


@pytest.mark.parametrize("bad", [
    {"sla.ttft_s": -1.0},  # a schema error
    {"dimensions.max_batch": [16384]},  # no candidate: max_tokens 8192 < max_batch 16384 on every row
])
def test_a_failed_run_leaves_the_previous_result_untouched(tmp_path, bad):
    """Before: a run with no candidate wrote an empty Parquet over the previous result, then exited 2."""
    out = tmp_path / "results" / "out.parquet"
    assert serve_cli(write(tmp_path, BASE), out).exit_code == 0
    before = out.read_bytes()
    result = serve_cli(write(tmp_path, changed(bad), "bad.toml"), out)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.parquet"]


def test_zero_candidates_says_so_and_explains(tmp_path):
    path, out = write(tmp_path, changed({"dimensions.max_batch": [16384]})), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "wrote nothing (no candidate)" in result.output and "token_budget" in result.output
    assert f"Error: {path}: dimensions = 2 combinations: expected at least one valid candidate" in result.output
    assert not out.exists()


# --------------------------------------------------------------------------- loads the simulation cannot represent


def test_a_poisson_rate_past_the_clocks_resolution_keeps_analytic_values(tmp_path):
    """Before: at 1e-300 requests/s the simulated rows' arrivals sit ~1e302 s apart and each
    iteration rounds away: feasible rows with a TTFT of exactly 0 (NaN at 5e-324, whose
    arrivals overflow). Such engines serve each request alone, the analytic tier's case."""
    raw = changed({"workload.rate_per_s": 1e-300}, ("workload.concurrency",))
    path, out = write(tmp_path, raw), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out)
    assert frame["feasible"].all() and not frame["simulated"].any()
    assert (frame["ttft_s"] > 0).all() and frame["ttft_s"].is_finite().all()
    assert "4 candidates keep the analytic tier's values" in result.output
    assert "past the resolution of the simulation's clock" in result.output


def test_a_target_of_the_smallest_float_is_missed_infinitely_not_a_crash(tmp_path):
    """Found by the property test: sla.ttft_s = 5e-324 (positive, so valid) made the
    binding-target line overflow metric / target (a warning, an error under the suite's
    filters) and print the best TTFT as ratio x target = inf. The miss is infinite; the
    best value is the metric itself."""
    raw = changed({"sla.ttft_s": 5e-324})
    path, out = write(tmp_path, raw), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out)
    assert not frame["feasible"].any()
    assert "the binding target is sla.ttft_s = 4.94066e-324 s" in result.output
    best = float(result.output.split("best per target: ttft_s ")[1].split(" s")[0])
    assert best == pytest.approx(frame["ttft_s"].min(), rel=1e-3) and math.isfinite(best)


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_an_overloaded_deployment_reports_what_it_serves_not_what_is_offered(tmp_path, mode):
    """Before: at 1e6 requests/s the overloaded rows reported the offered rate as their
    throughput (32,000,000 tokens/s per GPU on 2 H100) and the KV footprint of the
    unbounded batch the fixed point reached (~16,000 GiB). An overloaded engine serves
    what its full batch sustains, whatever is offered, and its queue, so TTFT, grows
    without bound: the same throughput at 1e6 and 1e7 requests/s, far below both; TTFT
    infinite; the KV footprint within a full batch's."""
    dims = {"tp": [1], "max_batch": [8, 16]}
    if mode == "disagg":
        dims.update({"mode": ["disagg"], "prefill_tp": [1], "prefill_instances": [1]})
    frames = []
    for rate in (1e6, 1e7):
        raw = changed({"workload.rate_per_s": rate, "dimensions": dims, "simulate_top": 0}, ("workload.concurrency",))
        path, out = write(tmp_path, raw, f"space-{rate:.0e}.toml"), tmp_path / f"out-{rate:.0e}.parquet"
        result = serve_cli(path, out)
        assert result.exit_code == 0, result.output
        frames.append(pl.read_parquet(out).sort("max_batch"))
    low, high = frames
    assert (low["infeasible_reason"].cast(pl.String) == "overloaded").all()
    assert low["requests_per_s"].to_list() == high["requests_per_s"].to_list()
    assert (low["requests_per_s"] < 1e4).all()
    assert low["ttft_s"].is_infinite().all() and low["e2e_latency_s"].is_infinite().all()
    # KV bytes per token of Llama 3 8B in 16 bits: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes
    # = 131,072; a full batch of 16 holds at most 16 x (512 + 64) tokens: 1.21 GB
    assert (low["mem_kv_bytes"] <= 16 * (512 + 64) * 131072 * (1 + 1e-9)).all()


def test_more_users_per_engine_than_requests_is_not_simulated_as_a_burst(tmp_path):
    """Before: 2^24 closed-loop users with 64 simulated requests sent all 64 at t = 0 and the
    simulation called the burst feasible (TTFT ~1 s) where the loop queues for days."""
    path, out = write(tmp_path, changed({"workload.concurrency": 2**24})), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exit_code == 0, result.output
    frame = infeasible_frame(out)
    assert not frame["simulated"].any() and set(frame["infeasible_reason"]) == {"sla-ttft"}
    assert "at least n_requests = 64 users per engine" in result.output


def test_one_output_token_has_no_decode_speed_rather_than_a_division_by_zero(tmp_path):
    """output_len = 1: every request ends with its first token, TPOT is 0 and a user's decode
    speed undefined. Before: the simulated rows divided by that 0 (a RuntimeWarning on stderr,
    inf tokens/s per user in the Parquet); now NaN, as the analytic tier writes."""
    path, out = write(tmp_path, changed({"workload.output_len": 1})), tmp_path / "out.parquet"
    result = serve_cli(path, out)
    assert result.exception is None and result.exit_code == 0, result.output
    frame = pl.read_parquet(out)
    assert frame["simulated"].sum() == 2 and (frame["tpot_s"] == 0).all()
    assert frame["output_tokens_per_s_per_user"].is_nan().all()


# --------------------------------------------------------------------------- 4. property: random mutations


EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))
FUZZ = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])

#: the bases of the property test: BASE with every SLA target and a lognormal output length, so that
#: mutations reach those fields too, in a closed loop and under Poisson arrivals
FUZZ_BASES = [changed({"sla": {"ttft_s": 2.0, "ttft_p90_s": 4.0, "tpot_s": 0.05, "tpot_p90_s": 0.1},
                       "workload.output_len": {"distribution": "lognormal", "mean": 64.0, "sigma": 0.5},
                       # whole prompts (a budget a long prompt can exceed) and the overlap scheduler
                       "dimensions.scheduler": ["continuous", "continuous-unchunked"],
                       "dimensions.overlap_scheduler": [False, True], "dimensions.max_tokens": [1024],
                       **arrivals}, drop)
              for arrivals, drop in (({}, ()), ({"workload.rate_per_s": 20.0}, ("workload.concurrency",)))]

hostile_values = st.one_of(
    st.sampled_from([0, -1, 1, 2, 2**24, 2**31, 2**63 - 1, -(2**63), 0.0, -0.0, 1e-300, 5e-324, 1e308, -1.5,
                     math.nan, math.inf, -math.inf, 0.5, 1.0, True, False, "", "x", "lognormal", "empirical",
                     "fixed", "continuous", "disagg", "fp8", "bf16", [], [0], [1, 1], [2, 1], ["a"], {}, {"x": 1},
                     {"distribution": "lognormal", "mean": 1e7, "sigma": 5.0}]),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8),
    st.lists(st.integers(-4, 20), max_size=3),
)

LABELS = ["fp8", "bf16", "static", "continuous", "continuous-unchunked", "agg", "disagg", "lognormal", "fixed"]


def plausible_like(value: Any) -> st.SearchStrategy[Any]:
    """Values of ``value``'s type inside the schema's usual bounds (counts, seconds, labels,
    dimension lists), so that a share of the mutants runs: lengths past the KV cache,
    SLAs out of reach, loads past the engines, new dimension values."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(1, 64), st.integers(1, 2_000_000))
    if isinstance(value, float):
        return st.one_of(st.floats(1e-3, 10.0), st.floats(1e-6, 1e4))
    if isinstance(value, str):
        return st.sampled_from([value, *LABELS])
    if isinstance(value, list) and value and isinstance(value[0], int):
        return st.lists(st.integers(1, 16), min_size=1, max_size=3, unique=True)
    if isinstance(value, list):
        return st.lists(st.sampled_from(LABELS), min_size=1, max_size=2, unique=True)
    return st.just(value)

def mutate(data: Any, path: tuple, op: str, value: Any) -> None:
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "drop":
        del parent[last]
    elif op == "add" and isinstance(parent[last], dict):
        parent[last][f"extra_{len(parent[last])}"] = value
    else:
        parent[last] = value


@st.composite
def mutated_space(draw: st.DrawFn) -> dict[str, Any]:
    """One of FUZZ_BASES with one to three values replaced, dropped or joined by a key:
    hostile mutants (any value, drops, unknown keys) or plausible ones (a value of the
    same type, in range: ``plausible_like``), half and half."""
    import copy

    data = copy.deepcopy(draw(st.sampled_from(FUZZ_BASES)))
    plausible = draw(st.booleans())
    ops = ["replace"] if plausible else ["replace", "replace", "drop", "add"]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(leaf_paths(data)))
        current = data
        for part in path:
            current = current[part]
        value = draw(plausible_like(current) if plausible else st.one_of(hostile_values, plausible_like(current)))
        mutate(data, path, draw(st.sampled_from(ops)), copy.deepcopy(value))  # a copy: sampled values are shared
    return data


def check_outcome(folder: Path, raw: dict[str, Any]) -> None:
    """Exit 0 with a Parquet whose every row has a feasible flag and, when infeasible,
    a reason (and 'ok' when feasible); or a non-zero exit whose one-line message names
    the file; never an uncaught exception or a traceback."""
    path, out = folder / "space.toml", folder / "out.parquet"
    out.unlink(missing_ok=True)
    path.write_text(tomli_w.dumps(raw))
    result = CliRunner().invoke(main, ["serve", str(path), "--out", str(out), "-n", "2"], catch_exceptions=True)
    shown = f"{tomli_w.dumps(raw)}\n{result.output[-2000:]}"
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{shown}\nuncaught {type(exc).__name__}: {exc}"
    assert "Traceback" not in result.output, shown
    event(f"exit {result.exit_code}")
    if result.exit_code == 0:
        frame = pl.read_parquet(out).with_columns(pl.col("infeasible_reason").cast(pl.String))
        assert frame.height > 0, shown
        assert frame["feasible"].null_count() == 0 and frame["infeasible_reason"].null_count() == 0, shown
        labels = set(sp.enum_labels(sp.Feasible))
        assert set(frame["infeasible_reason"]) <= labels, shown
        assert (frame["feasible"] == (frame["infeasible_reason"] == "ok")).all(), shown
        fit = frame.filter(pl.col("feasible"))
        for column in ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s_per_gpu", "mem_peak_bytes"):
            assert fit[column].is_finite().all() and (fit[column] >= 0).all(), f"{shown}\n{column}"
        assert (fit["ttft_s"] > 0).all(), shown
    else:
        assert result.exit_code == 2, shown
        assert str(path) in result.output, shown
        error = [line for line in result.output.splitlines() if line.startswith("Error: ")]
        assert len(error) == 1, shown
        assert not out.exists(), shown


@settings(max_examples=EXAMPLES, **FUZZ)
@given(raw=mutated_space())
def test_random_mutations_of_a_serving_space(tmp_path_factory, raw):
    check_outcome(tmp_path_factory.mktemp("mutated"), raw)


@pytest.mark.slow
@settings(max_examples=20 * EXAMPLES, **FUZZ)
@given(raw=mutated_space())
def test_random_mutations_of_a_serving_space_at_length(tmp_path_factory, raw):
    check_outcome(tmp_path_factory.mktemp("mutated"), raw)
