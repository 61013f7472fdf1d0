"""``paraspace study`` and ``paraspace trace`` on serving spaces (issue 15).

study: Optuna over the serving dimensions, throughput per GPU maximised under
the SLA, infeasibility as the training study's constraint, Parquet parts with
``paraspace serve``'s schema, resumable. trace: one deployment's simulated
iterations as a Perfetto (Chrome trace) file with a KV-cache counter track.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import polars as pl
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from paraspace.explorer.cli import main
from paraspace.explorer.serve import evaluate_space, is_serving_space
from paraspace.explorer.serve_study import ServingProblem, run_serving_study, search_space
from paraspace.explorer.study import default_storage
from paraspace.results import serving_schema
from paraspace.spaces import serving as sp

LLAMA = "llama3.1-70b-h100-8-fp8"
TTFT_SLA = 0.08
TPOT_SLA = 0.006


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def toy_space(tmp_path: Path, **dims) -> Path:
    """Llama 3 8B on 8 H100 (16 users, 1024 in / 64 out, TTFT <= 80 ms, TPOT <= 6 ms): small
    enough that a grid study visits every combination, and its SLA rules out the two tp = 4
    aggregated rows of the most throughput (TTFT ~84 ms) and every tp = 1 row (TPOT ~7 ms)."""
    dimensions = {"tp": [1, 2, 4], "max_batch": [8, 16], "mode": ["agg", "disagg"], "prefill_tp": [2],
                  "prefill_instances": [1, 2], **dims}
    lines = ['name = "toy-serve"', 'description = "toy"', 'model = "llama3-8b"', 'hardware = "h100-sxm5-80gb"',
             "devices = 8", "simulate_top = 1000", "[workload]", "input_len = 1024", "output_len = 64",
             "concurrency = 16", "n_requests = 128", "[sla]", f"ttft_s = {TTFT_SLA}", f"tpot_s = {TPOT_SLA}",
             "[dimensions]"]
    for key, values in dimensions.items():
        lines.append(f"{key} = {json.dumps(values)}")
    path = tmp_path / "toy-serve.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------- study


def test_search_space_and_row_ids_are_the_serving_spaces():
    """The search space is each dimension with more than one value; a trial's parameters
    map to the row_id ``paraspace serve`` gives the same combination."""
    loaded = sp.load_serving(LLAMA)
    space = search_space(loaded)
    assert space["tp"] == [1, 2, 4, 8] and space["mode"] == ["agg", "disagg"]
    assert space["kv_dtype"] == ["fp8", "bf16"]
    assert space["scheduler"] == ["continuous", "continuous-unchunked", "static"]
    assert "dtype" not in space and "ep" not in space  # one value each
    problem = ServingProblem(loaded)
    cols = sp.encode(loaded).columns
    pick = np.arange(0, cols["row_id"].size, 7)
    values = sp.dimension_values(loaded)  # a column's code -> its position -> the value Optuna sees
    params = [{name: space[name][values[name].tolist().index(cols[name][i])] for name in space} for i in pick]
    assert problem.row_ids(params).tolist() == cols["row_id"][pick].tolist()


def test_grid_study_finds_the_best_feasible_deployment(tmp_path):
    """A grid study visiting every combination of a small space finds, as its best feasible
    trial, the deployment an exhaustive ``serve`` with every runnable row simulated ranks
    first; every COMPLETE trial's Parquet row is the serve row of its combination, and the
    constraint says feasible exactly where the row meets the SLA."""
    loaded = sp.load_serving(str(toy_space(tmp_path)))
    n = int(np.prod([len(v) for v in search_space(loaded).values()]))
    summary = run_serving_study(loaded, n_trials=n, out_dir=tmp_path / "out", sampler="grid", batch=8)
    ranked, _ = evaluate_space(loaded, simulate_top=10**6)
    feasible = ranked["feasible"] > 0
    best = ranked["output_tokens_per_s_per_gpu"][feasible].max()
    assert ranked["output_tokens_per_s_per_gpu"].max() > best  # the SLA bites, the top row first
    assert summary.best[0]["output_tokens_per_s_per_gpu"] == best
    assert summary.best[0]["row_id"] in ranked["row_id"][feasible & (ranked["output_tokens_per_s_per_gpu"] == best)]
    throughputs = [b["output_tokens_per_s_per_gpu"] for b in summary.best]
    assert throughputs == sorted(throughputs, reverse=True)
    df = pl.read_parquet(tmp_path / "out" / "toy-serve" / "*.parquet")
    assert df.columns == serving_schema.arrow_schema().names
    study = optuna.load_study(study_name="toy-serve", storage=default_storage(tmp_path / "out", "toy-serve"))
    assert len(study.trials) == n
    by_row = {int(r): i for i, r in enumerate(ranked["row_id"])}
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(complete) == df.height > 0
    for t in complete:
        row = df.filter(pl.col("row_id") == t.user_attrs["row_id"]).row(0, named=True)
        i = by_row[t.user_attrs["row_id"]]
        assert t.values[0] == row["output_tokens_per_s_per_gpu"] == ranked["output_tokens_per_s_per_gpu"][i]
        fits = t.system_attrs["constraints"][0]
        assert (fits <= 0) == bool(ranked["feasible"][i]) == row["feasible"] == t.user_attrs["feasible"]
        if fits <= 0:
            assert row["ttft_s"] <= TTFT_SLA and row["tpot_s"] <= TPOT_SLA
        else:
            assert row["ttft_s"] > TTFT_SLA or row["tpot_s"] > TPOT_SLA or row["infeasible_reason"] == "overloaded"
            assert fits == pytest.approx(max(row["ttft_s"] / TTFT_SLA, row["tpot_s"] / TPOT_SLA) - 1, rel=1e-12)
    for t in study.trials:
        if t.state == TrialState.PRUNED:  # a broken rule, or no throughput to tell
            assert t.system_attrs["constraints"] == [1.0]
            assert "rule" in t.user_attrs or t.user_attrs["reason"] in ("weights-oom", "kv-too-small")


def test_cli_study_on_a_serving_space_resumes(tmp_path):
    """``paraspace study SERVING_SPACE``: the trials, the Parquet parts, the best table; a
    second run adds to the same study; two objectives with throughput-user."""
    args = ["study", LLAMA, "--trials", "24", "--batch", "12", "--sampler", "random", "--out", str(tmp_path),
            "--no-progress"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "24 new trials (24 in total)" in first.output
    again = CliRunner().invoke(main, [*args[:3], "12", *args[4:]])
    assert again.exit_code == 0, again.output
    assert "12 new trials (36 in total)" in again.output
    df = pl.read_parquet(tmp_path / LLAMA / "*.parquet")
    assert df.columns == serving_schema.arrow_schema().names and df["row_id"].n_unique() <= 36
    study = optuna.load_study(study_name=LLAMA, storage=default_storage(tmp_path, LLAMA))
    feasible = [t for t in study.trials if t.state == TrialState.COMPLETE and t.system_attrs["constraints"][0] <= 0]
    if feasible:  # the best table: trial, throughput, the dimensions searched, row_id
        best = max(feasible, key=lambda t: t.values[0])
        assert "row_id" in again.output and f"{best.user_attrs['row_id']}" in again.output
    else:
        assert "no feasible trial yet" in again.output
    two = CliRunner().invoke(main, ["study", LLAMA, "--trials", "12", "--objective", "throughput-user",
                                    "--study-name", "two", "--out", str(tmp_path), "--no-progress"])
    assert two.exit_code == 0, two.output
    study = optuna.load_study(study_name="two", storage=default_storage(tmp_path, "two"))
    assert study.metric_names == ["output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user"]
    assert all(d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions)


def test_study_without_simulation_keeps_the_analytic_values(tmp_path):
    """``simulate=False``: every told trial's row is the analytic tier's row of its
    combination (``serve`` with no row simulated), ``simulated`` 0 and its p90s unknown;
    the grid's best feasible trial is the analytic ranking's best feasible row."""
    loaded = sp.load_serving(str(toy_space(tmp_path)))
    n = int(np.prod([len(v) for v in search_space(loaded).values()]))
    summary = run_serving_study(loaded, n_trials=n, out_dir=tmp_path / "out", sampler="grid", batch=8,
                                simulate=False)
    ranked, _ = evaluate_space(loaded, simulate_top=0)
    feasible = ranked["feasible"] > 0
    assert summary.best[0]["output_tokens_per_s_per_gpu"] == ranked["output_tokens_per_s_per_gpu"][feasible].max()
    df = pl.read_parquet(tmp_path / "out" / "toy-serve" / "*.parquet")
    assert df.height > 0 and df["simulated"].not_().all() and df["ttft_p90_s"].is_nan().all()
    by_row = {int(r): i for i, r in enumerate(ranked["row_id"])}
    for row in df.iter_rows(named=True):
        i = by_row[row["row_id"]]
        assert row["ttft_s"] == ranked["ttft_s"][i] and row["tpot_s"] == ranked["tpot_s"][i]
    simulated, _ = evaluate_space(loaded, simulate_top=10**6)  # the simulation does change the values
    assert not np.array_equal(simulated["ttft_s"], ranked["ttft_s"])


def test_cli_no_simulate_is_a_serving_option(tmp_path):
    """``--no-simulate`` runs a serving study with no simulated row; on a training space it is
    refused with one line naming the option."""
    space = toy_space(tmp_path)
    result = CliRunner().invoke(main, ["study", str(space), "--trials", "24", "--no-simulate", "--out",
                                       str(tmp_path / "out"), "--no-progress"])
    assert result.exit_code == 0, result.output
    df = pl.read_parquet(tmp_path / "out" / "toy-serve" / "*.parquet")
    assert df.height > 0 and df["simulated"].not_().all()
    training = CliRunner().invoke(main, ["study", "--trials", "2", "--no-simulate", "--out", str(tmp_path)])
    assert training.exit_code == 2 and "Traceback" not in training.output
    assert "--no-simulate: expected only with a serving space" in training.output


def test_cli_study_refuses_a_training_objective_on_a_serving_space(tmp_path):
    result = CliRunner().invoke(main, ["study", LLAMA, "--objective", "time", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--objective = time: expected one of throughput, throughput-user for a serving space" in result.output


def test_max_mem_makes_the_parquet_rows_over_the_cap_infeasible(tmp_path):
    """With --max-mem the Parquet's feasible column is the study's constraint: a row the SLA
    admits but whose peak memory exceeds the cap is written infeasible (memory-cap), so
    ``paraspace top`` on the folder names the study's best (before, those rows stayed
    feasible in the file and top ranked a deployment the study had refused)."""
    path = toy_space(tmp_path)
    loaded = sp.load_serving(str(path))
    ranked, _ = evaluate_space(loaded, simulate_top=10**6)
    peaks = np.sort(ranked["mem_peak_bytes"][ranked["feasible"] > 0])
    assert peaks[0] < peaks[-1]  # the cap below must split the feasible rows
    cap_gib = float(peaks[0] + peaks[-1]) / 2 / 1024**3
    n = int(np.prod([len(v) for v in search_space(loaded).values()]))
    summary = run_serving_study(loaded, n_trials=n, out_dir=tmp_path / "out", sampler="grid", batch=8,
                                max_mem_gib=cap_gib)
    df = pl.read_parquet(tmp_path / "out" / "toy-serve" / "*.parquet")
    over = df.filter(pl.col("mem_peak_bytes") > cap_gib * 1024**3)
    assert over.height > 0 and not over["feasible"].any()
    under_sla = over.filter((pl.col("ttft_s") <= TTFT_SLA) & (pl.col("tpot_s") <= TPOT_SLA))
    assert under_sla.height > 0  # rows only the cap rules out
    assert set(under_sla["infeasible_reason"].cast(pl.String)) == {"memory-cap"}
    kept = df.filter(pl.col("feasible"))
    assert kept.height > 0 and (kept["mem_peak_bytes"] <= cap_gib * 1024**3).all()
    best = summary.best[0]["output_tokens_per_s_per_gpu"]
    assert best == kept["output_tokens_per_s_per_gpu"].max()
    result = CliRunner().invoke(main, ["top", str(tmp_path / "out" / "toy-serve"), "-n", "1", "--columns", "row_id"],
                                env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    shown = [int(w[0]) for w in (line.split() for line in result.output.splitlines()) if w[:1] and w[0].isdigit()]
    assert shown == [summary.best[0]["row_id"]]


def test_an_edited_empirical_length_file_is_another_space(tmp_path):
    """The space digest a study's resume checks covers an empirical length CSV's numbers:
    the same TOML over an edited file is another workload (its trials must not mix), over
    an identical copy the same one."""
    from paraspace.explorer.sweep import space_digest

    def digest(lengths: str) -> str:
        (tmp_path / "lengths.csv").write_text("input_tokens\n" + lengths)
        path = toy_space(tmp_path)
        text = path.read_text().replace(
            "input_len = 1024", 'input_len = { distribution = "empirical", path = "lengths.csv", '
                                'column = "input_tokens" }')
        path.write_text(text)
        return space_digest(sp.load_serving(str(path)))

    first = digest("512\n1024\n")
    assert digest("512\n1024\n") == first
    assert digest("512\n2048\n") != first


def test_serving_spaces_are_told_apart_from_training_ones(tmp_path):
    assert is_serving_space(LLAMA) and is_serving_space(str(toy_space(tmp_path)))
    assert not is_serving_space("llama3-8b-h100-64") and not is_serving_space(None)
    assert not is_serving_space(str(tmp_path / "missing.toml"))


# --------------------------------------------------------------------------- trace


def run_trace(tmp_path: Path, space: str, *sets: str) -> dict:
    args = ["trace", "--space", space, "--out", str(tmp_path / "t")]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 't.json'} and {tmp_path / 't.png'}" in result.output
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((tmp_path / "t.json").read_text())


def check_trace(trace: dict) -> dict[str, list]:
    """The invariants every serving trace keeps; returns its events by phase."""
    events = trace["traceEvents"]
    by = {ph: [e for e in events if e["ph"] == ph] for ph in ("X", "C", "b", "e", "M")}
    tracks: dict[tuple[int, int], list] = {}
    for e in by["X"]:
        assert e["dur"] >= 0
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for slices in tracks.values():  # one iteration at a time on an engine; EP slices within theirs
        slices.sort(key=lambda e: e["ts"])
        for a, b in zip(slices, slices[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-6 * max(1.0, abs(a["ts"]))
    caps = trace["otherData"]["kv_capacity_tokens"]
    assert by["C"] and all(e["name"] == "kv cache tokens" for e in by["C"])
    for e in by["C"]:
        for value in e["args"].values():
            assert 0 <= value <= caps[e["pid"]]
    assert len(by["b"]) == len(by["e"])
    return by


def test_trace_of_an_aggregated_deployment(tmp_path):
    """Llama 3.1 70B at tp 4 aggregated: one engine's iterations (prefill, decode and mixed),
    as many slices as the simulation's iterations, the cache counter within capacity."""
    trace = run_trace(tmp_path, LLAMA, "mode=agg", "tp=4", "scheduler=continuous")
    by = check_trace(trace)
    sim = trace["otherData"]["simulation"]
    assert trace["otherData"]["strategy"]["tp"] == 4
    iterations = [e for e in by["X"] if e["tid"] == 0]
    assert len(iterations) == sim["iterations"] > 0
    assert sum(e["args"]["prompt_tokens"] > 0 for e in iterations) == sim["prefill_iterations"] > 0
    assert {e["name"] for e in iterations} <= {"prefill", "decode", "mixed"} and "decode" in {e["name"] for e in iterations}
    assert max(e["args"]["cached"] for e in by["C"]) == sim["kv_peak_tokens"]
    last = max(e["ts"] + e["dur"] for e in iterations)
    assert last == pytest.approx(sim["makespan_s"] * 1e6, rel=1e-12)


def test_trace_of_a_disaggregated_deployment(tmp_path):
    """Disaggregated Llama 3.1 70B: prefill replicas' and decode engines' tracks, one KV
    transfer a request (async slices; n_requests for each decode engine), decode slices as
    many as the decode iterations."""
    trace = run_trace(tmp_path, LLAMA, "mode=disagg")
    by = check_trace(trace)
    sim = trace["otherData"]["simulation"]
    names = {e["pid"]: e["args"]["name"] for e in by["M"] if e["name"] == "process_name"}
    decode_pids = {p for p, n in names.items() if n.startswith("decode engine")}
    prefill_pids = {p for p, n in names.items() if n.startswith("prefill replica")}
    assert decode_pids and prefill_pids
    decode = [e for e in by["X"] if e["pid"] in decode_pids and e["tid"] == 0]
    prefill = [e for e in by["X"] if e["pid"] in prefill_pids]
    assert len(decode) == sim["iterations"] and {e["name"] for e in decode} == {"decode"}
    assert len(prefill) == sim["prefill_iterations"] and {e["name"] for e in prefill} == {"prefill"}
    n_requests = sp.load_serving(LLAMA).spec.workload.n_requests  # each decode engine's
    assert len(by["b"]) == n_requests * len(decode_pids) and {e["pid"] for e in by["b"]} <= prefill_pids
    for e in by["C"]:
        if e["pid"] in decode_pids and "reserved" in e["args"]:
            assert e["args"]["cached"] <= e["args"]["reserved"]


def test_gantt_rows_are_the_engines_and_the_senders_of_transfers(tmp_path):
    """The PNG's Gantt has a row per engine that iterated and, under each prefill replica
    of a disaggregated run, one of the transfers it sent; the picture draws every bar:
    as many rectangles as the timeline has events, each at its start and duration."""
    from paraspace.explorer.serve_timeline import capture
    from paraspace.results.serving_trace import TRANSFER, gantt_rows, write_gantt_png

    tl = capture(sp.load_serving(LLAMA), {"mode": "disagg"})
    rows = gantt_rows(tl)
    senders = sorted({int(e) for e in tl.engine[tl.kind == TRANSFER]})
    workers = sorted({int(e) for e in tl.engine[tl.kind != TRANSFER]})
    assert [e for e, t in rows if t] == senders and [e for e, t in rows if not t] == workers
    assert len(rows) == len(senders) + len(workers) and len(senders) > 0
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    real_savefig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        gantt = fig.axes[0]
        for collection in gantt.collections:
            for p in collection.get_paths():
                xs = p.vertices[:, 0]
                drawn.append((round(float(xs.min()), 9), round(float(xs.max() - xs.min()), 9)))
        return real_savefig(fig, *args, **kwargs)

    plt.Figure.savefig = spy
    try:
        write_gantt_png(tl, tmp_path / "g.png")
    finally:
        plt.Figure.savefig = real_savefig
    expected = sorted(zip(np.round(tl.start_s, 9), np.round(tl.end_s - tl.start_s, 9)))
    assert sorted(drawn) == [(float(a), float(b)) for a, b in expected]


def test_trace_shows_ep_traffic_of_an_attention_dp_moe_deployment(tmp_path):
    """Qwen3-235B-A22B with attention DP over 8 ranks and experts over 8: an EP slice on its
    own track at the start of every iteration, shorter than the iteration."""
    trace = run_trace(tmp_path, "qwen3-235b-a22b-h200-8", "tp=8", "ep=8", "attention_dp=true", "draft_tokens=0")
    by = check_trace(trace)
    iterations = {e["ts"]: e for e in by["X"] if e["tid"] == 0}
    ep = [e for e in by["X"] if e["tid"] == 1]
    assert len(ep) == len(iterations) > 0
    for e in ep:
        it = iterations[e["ts"]]
        assert 0 < e["dur"] <= it["dur"] and e["name"] == "ep dispatch+combine"


def test_traced_run_is_the_run_serve_simulates(tmp_path):
    """The traced deployment's latencies are those ``serve`` reports for its row when it
    simulates every runnable candidate (the same simulation, the log only watching)."""
    path = str(toy_space(tmp_path))
    trace = run_trace(tmp_path, path, "mode=disagg", "tp=2", "prefill_instances=2", "max_batch=16")
    sim, strategy = trace["otherData"]["simulation"], trace["otherData"]["strategy"]
    ranked, _ = evaluate_space(sp.load_serving(path), simulate_top=10**6)
    i = int(np.flatnonzero(ranked["row_id"] == strategy["row_id"])[0])
    assert ranked["simulated"][i] == 1
    assert ranked["ttft_s"][i] == sim["ttft_s"] and ranked["tpot_s"][i] == sim["tpot_s"]


@pytest.mark.parametrize("sets, expected", [
    (("tpp=4",), "--set = 'tpp': expected KEY=VALUE with KEY one of mode, tp"),
    (("tp=3",), "--set tp = 3: expected one of the space's values [1, 2, 4, 8]"),
    (("mode=both",), "--set mode = 'both': expected one of the space's values ['agg', 'disagg']"),
])
def test_trace_bad_settings_are_errors_not_tracebacks(tmp_path, sets, expected):
    args = ["trace", "--space", LLAMA, "--out", str(tmp_path / "t")]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert expected in result.output
    assert not (tmp_path / "t.json").exists()


def test_trace_event_kinds_are_spelt_once():
    from paraspace.kernels import serving_sim
    from paraspace.results import serving_trace

    assert serving_trace.KIND_NAMES == serving_sim.LOG_KIND_NAMES
    assert serving_trace.TRANSFER == serving_sim.LOG_TRANSFER
