"""The paraspace CLI end to end on small spaces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result

from paraspace.explorer.cli import main
from paraspace.explorer.sweep import result_schema
from paraspace.results.schema import META_CATALOG, META_ENCODING, META_SPACE, META_VERSION
from paraspace.results.writer import read_metadata
from paraspace.spaces.catalog import names

SMALL = "llama3-8b-h100-64"


def run(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "small.parquet"
    result = run("sweep", SMALL, "--out", str(out), "--no-progress", "-n", "5")
    assert result.exit_code == 0, result.output
    return out


def test_catalog_lists_everything():
    result = run("catalog")
    assert result.exit_code == 0
    for kind in ("hardware", "model", "space"):
        for name in names(kind):
            assert name in result.output
    from paraspace.spaces.topology import topology_names

    assert "topology:" in result.output
    assert all(name in result.output for name in topology_names())
    from paraspace.spaces import serving

    # serving spaces are listed too, under their own heading, each with its description
    listed = result.output.split("serving:\n", 1)[1].split("topology:")[0]
    for name in serving.names():
        assert name in listed and serving.load_serving(name).spec.description in listed


def test_topology_command_lists_routes_and_the_all_to_all_bound():
    """br166-ocs: 0 -> 13 goes over its blink mate 5 then IB (the stranger via a mate);
    the bound of 16 dies sending 7 MiB to each other is 4.207 ms (busiest link an IB one)."""
    result = run("topology", "br166-ocs")
    assert result.exit_code == 0, result.output
    assert "0 -> 13: 0->5 blink  5->13 ib" in result.output
    assert "hops per pair: 1: 80, 2: 112, 3: 48" in result.output
    assert "4.207 ms" in result.output
    bad = run("topology", "br166-ocs", "--src", "16")
    assert bad.exit_code == 2 and "--src = 16" in bad.output and "0..15" in bad.output


def test_sweep_writes_ranked_parquet(small_sweep):
    df = pl.read_parquet(small_sweep)
    # 2304 combinations of the small space, 840 valid (also counted by test_encode's reference)
    assert df.height == 840
    assert df.columns == result_schema().names
    assert df["row_id"].is_unique().all()
    steps = df.select(
        (pl.col("compute_s") + pl.col("tp_comm_s") + pl.col("cp_comm_s") + pl.col("bubble_s") + pl.col("pp_comm_s")
         + pl.col("dp_comm_s") + pl.col("optimizer_s") - pl.col("step_time_analytic_s")).abs().max()
    ).item()
    assert steps < 1e-9
    assert set(df["recompute"].unique()) == {"none", "selective", "full"}
    assert df.filter(~pl.col("feasible"))["infeasible_reason"].unique().to_list() in ([], ["out_of_memory"])


def test_sweep_metadata_has_provenance(small_sweep):
    meta = read_metadata(small_sweep)
    assert set(meta) >= {META_VERSION, META_SPACE, META_CATALOG, META_ENCODING}
    space = json.loads(meta[META_SPACE])
    assert space["toml"]["name"] == SMALL
    assert space["model"]["hidden"] == 4096
    enc = json.loads(meta[META_ENCODING])
    assert enc["n_rows"] == 840
    assert enc["n_rows"] + sum(enc["dropped_first"].values()) == enc["n_combinations"] == 2304
    assert len(meta[META_CATALOG]) == 64


def test_sweep_prints_top_table_sorted(small_sweep, tmp_path):
    out = tmp_path / "again.parquet"
    result = run("sweep", SMALL, "--out", str(out), "--no-progress", "-n", "3", "--explain")
    assert result.exit_code == 0
    assert "840 candidates" in result.output
    assert "device_count" in result.output and "kept" in result.output
    best = pl.read_parquet(out).filter(pl.col("feasible")).sort("step_time_s").row(0, named=True)
    assert f"{best['step_time_s']:.3f}" in result.output
    # identical inputs give identical files' data (determinism across runs)
    assert pl.read_parquet(out).equals(pl.read_parquet(small_sweep))


def test_dry_run_explains_without_writing(tmp_path):
    result = run("sweep", SMALL, "--dry-run", "--out", str(tmp_path / "x.parquet"))
    assert result.exit_code == 0
    assert "pp1_schedule" in result.output
    assert not (tmp_path / "x.parquet").exists()


def test_eval_json_matches_the_sweep_row(small_sweep):
    df = pl.read_parquet(small_sweep)
    row = df.filter(
        (pl.col("tp") == 2) & (pl.col("pp") == 2) & (pl.col("cp") == 1) & (pl.col("vpp") == 1)
        & (pl.col("micro_batch") == 1) & (pl.col("recompute") == "selective") & pl.col("sequence_parallel")
        & (pl.col("zero") == 1) & (pl.col("schedule") == "1f1b")
    ).row(0, named=True)
    result = run("eval", "--space", SMALL, "--set", "tp=2", "--set", "pp=2", "--set", "recompute=selective",
                 "--set", "sequence_parallel=true", "--set", "zero=1", "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert list(got) == df.columns
    for key, value in row.items():  # row_id too: the configuration's id in the space, the sweep's
        if isinstance(value, float) and not isinstance(value, bool):
            assert got[key] == pytest.approx(value, rel=1e-12), key
        else:  # strings, flags, integers and nulls compare exactly (approx refuses them with rel= on pytest 9.1+)
            assert got[key] == value, key


def test_eval_human_report():
    result = run("eval", "--model", "llama3-70b", "--hardware", "h100-sxm5-80gb", "--devices", "1024",
                 "--global-batch", "512", "--seq-len", "8192", "--set", "tp=8", "--set", "pp=4",
                 "--set", "sequence_parallel=true", "--set", "zero=1")
    assert result.exit_code == 0, result.output
    assert "strategy: tp=8 pp=4 dp=32" in result.output
    assert "bubble_s" in result.output and "mem_peak_bytes" in result.output


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--set", "tp=16"], ["tp does not divide heads", "tp_heads"]),
        (["--set", "tp=5"], ["tp*pp*cp = 5", "devices = 64"]),
        (["--set", "pp=2", "--set", "vpp=2"], ["vpp_schedule"]),
        (["--set", "foo=1"], ["--set foo=1", "KEY=VALUE", "micro_batch"]),
        (["--set", "recompute=partial"], ["dimensions.recompute", "'partial'", "['none', 'selective', 'full', 'norms', 'moe-dispatch', "
                                               "'selective-ops']"]),
        (["--set", "tp"], ["--set 'tp'", "KEY=VALUE"]),
        (["--set", "tp=x"], ["command line: --set tp = 'x'", "integer"]),
        (["--dtype", "fp4"], ["dtype", "'fp4'"]),
    ],
)
def test_eval_rejects_bad_input(args, needles):
    result = run("eval", "--space", SMALL, *args)
    assert result.exit_code == 2, result.output
    for needle in needles:
        assert needle in result.output


def test_eval_needs_the_workload():
    result = run("eval", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb")
    assert result.exit_code == 2
    assert "--devices" in result.output


def test_sweep_user_files_and_overrides(tmp_path):
    model = tmp_path / "tiny.toml"
    model.write_text(
        'extends = "llama3-8b"\nname = "tiny"\ndescription = "llama3-8b with 8 layers"\nlayers = 8\n'
    )
    space = tmp_path / "space.toml"
    space.write_text(
        'name = "mine"\ndescription = "user space"\nmodel = "tiny.toml"\nhardware = "a100-sxm4-80gb"\n'
        'devices = 16\nglobal_batch = 64\nseq_len = 2048\n[dimensions]\ntp = [1, 2, 4, 8]\npp = [1, 2]\n'
    )
    out = tmp_path / "mine.parquet"
    result = run("sweep", str(space), "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    df = pl.read_parquet(out)
    assert df.height > 0 and set(df["pp"].unique()) <= {1, 2}
    # --hardware replaces the space's hardware
    out2 = tmp_path / "mine-h100.parquet"
    result = run("sweep", str(space), "--hardware", "h100-sxm5-80gb", "--out", str(out2), "--no-progress")
    assert result.exit_code == 0, result.output
    assert json.loads(read_metadata(out2)[META_SPACE])["hardware"]["name"] == "h100-sxm5-80gb"
    assert pl.read_parquet(out2)["step_time_s"].sum() < df["step_time_s"].sum()


def test_sweep_bad_input_keeps_existing_output(tmp_path, small_sweep):
    out = tmp_path / "keep.parquet"
    shutil.copy(small_sweep, out)
    before = out.read_bytes()
    space = tmp_path / "bad.toml"
    space.write_text('name = "bad"\ndescription = "x"\nmodel = "llama3-8b"\nhardware = "h100-sxm5-80gb"\n'
                     'devices = 0\nglobal_batch = 8\nseq_len = 128\n')
    result = run("sweep", str(space), "--out", str(out), "--no-progress")
    assert result.exit_code == 2
    assert str(space) in result.output and "devices = 0" in result.output and "greater than 0" in result.output
    assert out.read_bytes() == before


def test_sweep_with_no_valid_row_fails_clearly(tmp_path):
    space = tmp_path / "empty.toml"
    space.write_text('name = "empty"\ndescription = "x"\nmodel = "llama3-8b"\nhardware = "h100-sxm5-80gb"\n'
                     'devices = 3\nglobal_batch = 8\nseq_len = 128\n[dimensions]\ntp = [2]\n')
    result = run("sweep", str(space), "--out", str(tmp_path / "e.parquet"), "--no-progress")
    assert result.exit_code == 2
    assert "expected at least one valid candidate" in result.output
    assert "device_count" in result.output


def test_default_sweep_through_the_console_script(tmp_path):
    """`paraspace sweep` with no arguments, as README's first command runs it."""
    exe = shutil.which("paraspace")
    cmd = [exe] if exe else [sys.executable, "-m", "paraspace.explorer.cli"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run([*cmd, "sweep", "--no-progress"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "results" / "llama3-70b-h100-1024.parquet"
    assert out.is_file()
    assert not list((tmp_path / "results").glob("*.partial"))
    df = pl.read_parquet(out)
    assert df.height == 64044  # 414,720 combinations, 64,044 valid (see --explain)
    best = df.filter(pl.col("feasible")).sort("step_time_s").row(0, named=True)
    assert best["mem_peak_bytes"] <= 80 * 1024**3
    assert "top 10" in proc.stdout


def test_sweep_says_up_front_when_it_will_take_minutes(tmp_path, monkeypatch):
    """2,304 combinations can need 2,304 simulations at most, whatever --simulate-top
    allows (it once counted 100,000 and said "about 2 minutes" for a 4-second run):
    2 x 2,304 / ENCODE_PER_S + 2,304 / SIMULATE_PER_S = 2.3 s, no warning. At 20
    simulations a second (a slower machine) the same sweep is 2 x 2,304 / 2e6 + 2,304 / 20
    = 115 s, past the 60 s warning: "about 2 minutes" before the work starts."""
    from paraspace.explorer import sweep
    from paraspace.explorer.sweep import ENCODE_PER_S, SIMULATE_PER_S, expected_seconds

    assert expected_seconds(2304, 100_000, True) == pytest.approx(2 * 2304 / ENCODE_PER_S + 2304 / SIMULATE_PER_S,
                                                                  rel=1e-15)
    assert expected_seconds(2304, 100, True) == pytest.approx(2 * 2304 / ENCODE_PER_S + 100 / SIMULATE_PER_S,
                                                              rel=1e-15)
    assert expected_seconds(2304, 100_000, False) == pytest.approx(2304 / ENCODE_PER_S, rel=1e-15)
    unwarned = run("sweep", "llama3-8b-h100-64", "--simulate-top", "100000", "--no-progress", "-n", "0",
                   "--out", str(tmp_path / "w.parquet"))
    assert unwarned.exit_code == 0 and "minutes" not in unwarned.output, unwarned.output
    monkeypatch.setattr(sweep, "SIMULATE_PER_S", 20.0)
    result = run("sweep", "llama3-8b-h100-64", "--simulate-top", "100000", "--no-progress", "-n", "0",
                 "--out", str(tmp_path / "x.parquet"))
    assert result.exit_code == 0, result.output
    assert "2,304 combinations and up to 2,304 simulations: about 2 minutes" in result.output


@pytest.mark.parametrize("args, message", [
    (("eval", "--space", "llama3-8b-h100-64", "--set", "tp=2", "--set", "tp=4"),
     "Error: command line: --set tp=4: expected tp once (already --set tp=2)"),
    (("trace", "--space", "llama3.1-70b-h100-8-fp8", "--set", "tp=2", "--set", "tp=4"),
     "Error: command line: --set tp=4: expected tp once (already --set tp=2)"),
    (("eval", "--space", "llama3-8b-h100-64", "--set", "dp=5"),
     "Error: command line: --set dp=5: expected a valid configuration, but tp*pp*dp*cp != devices (rule "
     "device_count; with devices=64 tp=1 pp=1 cp=1 "),
])
def test_a_set_given_twice_or_breaking_a_rule_names_what_the_command_line_gave(args, message, tmp_path):
    """A repeated --set would silently keep the last value; a configuration a rule drops is
    named by the --set values first, then the sizes it came with (not the space's every
    default, which hid dp=5 in a line of them)."""
    result = run(*args, *(("--out", str(tmp_path / "t")) if args[0] == "trace" else ()))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert message in result.output, result.output
