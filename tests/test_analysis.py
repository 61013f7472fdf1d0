"""paraspace top / pareto / compare on sweep output."""

from __future__ import annotations

import polars as pl
import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.results.rank import ResultsError, compare, pareto, top


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis") / "small.parquet"
    result = CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--out", str(out), "--no-progress", "-n", "0"])
    assert result.exit_code == 0, result.output
    return out


def test_top_filters_and_orders(results):
    df = pl.read_parquet(results)
    got = top(results, 5, ("step_time_s", "mem_peak_bytes"), where="tp = 2 AND pp <= 2", max_mem_gib=40)
    expected = (df.filter((pl.col("tp") == 2) & (pl.col("pp") <= 2) & (pl.col("mem_peak_bytes") <= 40 * 1024**3))
                .sort(["feasible", "step_time_s", "mem_peak_bytes", "row_id"], descending=[True, False, False, False])
                .head(5))
    assert got["row_id"].to_list() == expected["row_id"].to_list()
    assert (got["tp"] == 2).all()


def test_pareto_front_is_non_dominated(results):
    front = pareto(results)
    df = pl.read_parquet(results).filter(pl.col("feasible"))
    assert front.height >= 1
    # along the front x grows and y falls strictly
    assert front["step_time_s"].is_sorted() and (front["mem_peak_bytes"].diff().drop_nulls() < 0).all()
    # nothing in the file beats a front row on both
    for x, y in zip(front["step_time_s"], front["mem_peak_bytes"]):
        beats = df.filter((pl.col("step_time_s") <= x) & (pl.col("mem_peak_bytes") <= y)
                          & ((pl.col("step_time_s") < x) | (pl.col("mem_peak_bytes") < y)))
        assert beats.height == 0
    # the fastest feasible row starts the front
    assert front["step_time_s"][0] == df["step_time_s"].min()


def test_compare_two_rows(results):
    ids = pl.read_parquet(results)["row_id"].head(2).to_list()
    table = compare(results, ids)
    assert table.columns == ["column", str(ids[0]), str(ids[1]), "difference"]
    step = table.filter(pl.col("column") == "step_time_s").row(0, named=True)
    assert float(step["difference"]) == pytest.approx(float(step[str(ids[1])]) - float(step[str(ids[0])]), rel=1e-5)


def test_compare_a_number_beside_a_null_differs_either_way(results):
    """A simulated row beside one the event tier did not run: the simulation's columns are
    a number in one and null in the other, whichever comes first (a TypeError when the
    number came first)."""
    df = pl.read_parquet(results)
    ran = df.filter(pl.col("simulated"))["row_id"][0]
    not_ran = df.filter(~pl.col("simulated"))["row_id"][0]
    for ids in ([ran, not_ran], [not_ran, ran]):
        row = compare(results, ids).filter(pl.col("column") == "bubble_sim_s").row(0, named=True)
        assert row["difference"] == "differs", row


@pytest.mark.parametrize(("args", "needle"), [
    (["top", "{r}", "--by", "nope"], "column = 'nope'"),
    (["top", "{r}", "--where", "tp ==== 3"], "--where = 'tp ==== 3'"),
    (["pareto", "{r}", "--y", "bogus"], "--y = 'bogus': expected a numeric metric column to minimise"),
    (["compare", "{r}", "--ids", "999999999"], "--ids = [999999999]: expected row_ids present"),
    (["top", "{bad}"], "expected a Parquet file"),
])
def test_bad_input_is_named(results, tmp_path, args, needle):
    bad = tmp_path / "notes.parquet"
    bad.write_text("not parquet")
    argv = [a.format(r=results, bad=bad) for a in args]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert needle in result.output


def test_foreign_parquet_is_refused(tmp_path):
    path = tmp_path / "other.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(path)
    with pytest.raises(ResultsError, match="written by paraspace"):
        top(path)


def test_cli_prints(results):
    out = CliRunner().invoke(main, ["pareto", str(results)])
    assert out.exit_code == 0 and "front" in out.output
    out = CliRunner().invoke(main, ["top", str(results), "-n", "2", "--by", "mem_peak_bytes"])
    assert out.exit_code == 0 and "step_time_s" in out.output


def test_shards_merge_to_the_unsharded_sweep(tmp_path, results):
    """Three shards of the small space, scanned as one dataset, equal the single
    sweep row for row (every feasible candidate is simulated in both)."""
    folder = tmp_path / "nightly"
    for i in range(3):
        out = CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--shard", f"{i}/3", "--out", str(folder),
                                        "--no-progress", "-n", "0"])
        assert out.exit_code == 0, out.output
    merged = top(folder, 100_000)
    single = top(results, 100_000)
    assert merged.equals(single)


@pytest.mark.parametrize("spec", ["5/4", "1", "a/b", "-1/3", "3/3"])
def test_bad_shard_spec(spec, tmp_path):
    out = CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--shard", spec, "--out", str(tmp_path / "x.parquet")])
    assert out.exit_code == 2 and f"--shard = {spec!r}" in out.output


def test_notebook_api_types(results):
    from paraspace import results as api

    frame = api.load(results)
    schema = frame.collect_schema()
    assert schema["tp"] == pl.Int32 and schema["sequence_parallel"] == pl.Boolean
    assert schema["recompute"] == pl.Categorical and schema["step_time_s"] == pl.Float64
    best = api.top(results, 1).row(0, named=True)
    assert best["recompute"] in ("none", "selective", "full")
    assert "paraspace.version" in api.read_metadata(results)


def test_dask_local_cluster_equals_the_local_sweep(tmp_path, results):
    """The same three shards on a Dask LocalCluster (two worker processes) give
    the single sweep's rows exactly."""
    pytest.importorskip("dask.distributed", reason="dask[distributed] (the test extra) is not installed")
    folder = tmp_path / "dask"
    out = CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--dask", "local", "--shards", "3", "--out",
                                    str(folder), "-n", "0"])
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in folder.glob("*.parquet")) == [f"part-{i}-of-3.parquet" for i in range(3)]
    assert top(folder, 100_000).equals(top(results, 100_000))


def test_dask_honours_every_sweep_option(tmp_path):
    """--no-simulate reaches the workers (nothing simulated), --explain prints the
    summed rule counts, and --shard with --dask is refused in one line."""
    pytest.importorskip("dask.distributed", reason="dask[distributed] (the test extra) is not installed")
    folder = tmp_path / "dask"
    out = CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--dask", "local", "--shards", "2", "--out",
                                    str(folder), "-n", "0", "--no-simulate", "--explain"])
    assert out.exit_code == 0, out.output
    assert "0 simulated" in out.output and "kept" in out.output and "2,304 combinations" in out.output
    frame = pl.concat([pl.read_parquet(p) for p in sorted(folder.glob("*.parquet"))])
    assert not frame["simulated"].any()
    refused = CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--dask", "local", "--shard", "0/2"])
    assert refused.exit_code == 2 and "--shard = '0/2' with --dask: expected one of them" in refused.output


def test_simulated_rows_rank_first(tmp_path):
    """A sweep simulates its best few by the closed form; the default ranking puts those
    (their values checked by the event tier) before the rest, each part by step time;
    a ranking by another column does not look at it."""
    out = tmp_path / "top5.parquet"
    result = CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--out", str(out), "--no-progress", "-n", "0",
                                       "--simulate-top", "5"])
    assert result.exit_code == 0, result.output
    df = pl.read_parquet(out)
    feasible = df.filter(pl.col("feasible"))
    assert feasible["simulated"].sum() == 5 and feasible.height > 5
    got = top(out, feasible.height)
    assert got["simulated"].to_list() == [True] * 5 + [False] * (feasible.height - 5)
    for part in (got.head(5), got.tail(feasible.height - 5)):
        assert part["step_time_s"].to_list() == sorted(part["step_time_s"].to_list())
    # an unsimulated row's closed form is below some simulated step: the case the order is for
    assert got["step_time_s"][5] < got["step_time_s"][:5].max()
    by_mfu = top(out, feasible.height, ("mfu",))
    assert by_mfu["mfu"].to_list() == sorted(by_mfu["mfu"].to_list())
