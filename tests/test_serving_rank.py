"""top and pareto on serving results (issue 15, item 3): the serve ranking, SLA filters
and the throughput-per-GPU against throughput-per-user front."""

from __future__ import annotations

import polars as pl
import pytest

from paraspace.explorer.serve import run_serve
from paraspace.results import rank
from paraspace.spaces.serving import load_serving


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "llama.parquet"
    run_serve(load_serving("llama3.1-70b-h100-8-fp8"), out, simulate_top=4)
    return out


def test_top_ranks_a_serving_result_as_serve_does(served):
    best = rank.top(served, 20)
    frame = pl.read_parquet(served)
    expected = frame.sort(["feasible", "output_tokens_per_s_per_gpu", "ttft_s", "row_id"],
                          descending=[True, True, False, False], nulls_last=True).head(20)
    assert best["row_id"].to_list() == expected["row_id"].to_list()


def test_sla_limits_filter_and_refuse_training_files(served, tmp_path):
    every = pl.read_parquet(served)
    # limits at one row's own latencies: that row passes, and exactly the rows under both do
    row = every.filter(pl.col("feasible")).sort("row_id").row(0, named=True)
    ttft, tpot = row["ttft_s"], row["tpot_s"]
    limited = rank.top(served, 100_000, max_ttft_s=ttft, max_tpot_s=tpot)
    assert row["row_id"] in limited["row_id"].to_list()
    assert limited["ttft_s"].max() <= ttft and limited["tpot_s"].max() <= tpot
    assert limited.height == every.filter((pl.col("ttft_s") <= ttft) & (pl.col("tpot_s") <= tpot)).height
    from click.testing import CliRunner

    from paraspace.explorer.cli import main

    train = tmp_path / "t.parquet"
    assert CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--out", str(train), "--no-progress", "-n", "0",
                                     "--no-simulate"]).exit_code == 0
    with pytest.raises(rank.ResultsError, match="--max-ttft = 0.5: expected a serving result"):
        rank.top(train, 5, max_ttft_s=0.5)


def test_pareto_of_a_serving_result_is_the_throughput_front(served):
    """No feasible row has at least the throughput per GPU and per user of a front row
    and more of one of them; every feasible row is matched or beaten by a front row."""
    front = rank.pareto(served)
    rows = pl.read_parquet(served).filter(pl.col("feasible"))
    gpu, user = rank.SERVING_FRONT
    assert front.height >= 1
    for f in front.iter_rows(named=True):
        beats = rows.filter((pl.col(gpu) >= f[gpu]) & (pl.col(user) >= f[user])
                            & ((pl.col(gpu) > f[gpu]) | (pl.col(user) > f[user])))
        assert beats.height == 0
    for r in rows.iter_rows(named=True):
        assert any(f[gpu] >= r[gpu] and f[user] >= r[user] for f in front.iter_rows(named=True))


def test_cli_top_takes_the_sla_limits(served):
    from click.testing import CliRunner

    from paraspace.explorer.cli import main

    every = pl.read_parquet(served)
    limit = float(every["ttft_s"].median())
    out = CliRunner().invoke(main, ["top", str(served), "--max-ttft", str(limit), "-n", "1000", "--columns",
                                    "row_id,ttft_s"], env={"COLUMNS": "120"})
    assert out.exit_code == 0, out.output
    shown = {int(line.split()[0]) for line in out.output.splitlines() if line.split()[:1] and line.split()[0].isdigit()}
    assert shown == set(every.filter(pl.col("ttft_s") <= limit)["row_id"].to_list())
