"""paraspace study: Optuna over the same kernels, resumable, Parquet with the sweep's schema."""

from __future__ import annotations

import optuna
import polars as pl
import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.explorer.study import run_study, search_space
from paraspace.explorer.sweep import result_schema
from paraspace.spaces.catalog import load_space
from paraspace.spaces.encode import Encoder

SMALL = "llama3-8b-h100-64"


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_search_space_is_the_toml_space():
    space = search_space(Encoder(load_space(SMALL)))
    assert space["tp"] == [1, 2, 4, 8]
    assert space["recompute"] == ["none", "selective", "full"]
    assert space["schedule"] == ["1f1b", "interleaved"]
    assert "dp" not in space  # derived from tp, pp, cp as in a sweep


def test_study_finds_good_rows_and_resumes(tmp_path):
    loaded = load_space(SMALL)
    first = run_study(loaded, n_trials=60, out_dir=tmp_path, batch=20, seed=1)
    assert first.n_trials_total == 60
    again = run_study(loaded, n_trials=40, out_dir=tmp_path, batch=20, seed=1)
    assert again.n_trials_total == 100 and again.n_new == 40  # nothing lost, nothing repeated
    parts = sorted((tmp_path / loaded.spec.name).glob("*.parquet"))
    assert len(parts) == len(first.parts) + len(again.parts)
    df = pl.read_parquet(parts)
    assert df.columns == result_schema().names
    # every feasible best trial is a real, valid row whose prediction the Parquet holds
    best = again.best[0]
    row = df.filter(pl.col("row_id") == best["row_id"]).row(0, named=True)
    assert row["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-12)
    assert row["feasible"]
    # and it is competitive with the exhaustive sweep of the same space (2304 combinations)
    assert best["step_time_s"] <= 1.3 * sweep_best(tmp_path)


def sweep_best(tmp_path) -> float:
    out = tmp_path / "sweep.parquet"
    result = CliRunner().invoke(main, ["sweep", SMALL, "--out", str(out), "--no-progress", "-n", "0"])
    assert result.exit_code == 0
    return pl.read_parquet(out).filter(pl.col("feasible"))["step_time_s"].min()


def test_cli_study_with_a_memory_cap(tmp_path):
    result = CliRunner().invoke(main, ["study", SMALL, "--trials", "30", "--batch", "15", "--objective", "time",
                                       "--max-mem", "30", "--out", str(tmp_path), "--sampler", "random"])
    assert result.exit_code == 0, result.output
    assert "30 new trials" in result.output
    df = pl.read_parquet(tmp_path / SMALL / "*.parquet")
    from paraspace.explorer.study import default_storage

    study = optuna.load_study(study_name=SMALL, storage=default_storage(tmp_path, SMALL))
    assert len(study.trials) == 30
    feasible = [t for t in study.trials if max(t.constraints.values()) <= 0]
    for t in feasible:  # the cap, not the device's 80 GiB, decides feasibility
        row = df.filter(pl.col("row_id") == t.user_attrs["row_id"]).row(0, named=True)
        assert row["mem_peak_bytes"] <= 30 * 1024**3


def test_unknown_sampler_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["study", SMALL, "--sampler", "cmaes", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "cmaes" in result.output
