"""paraspace study: Optuna over the same kernels, resumable, Parquet with the sweep's schema."""

from __future__ import annotations

import json

import numpy as np
import optuna
import polars as pl
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from paraspace.explorer import study as study_mod
from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import pack
from paraspace.explorer.study import default_storage, run_study, search_space
from paraspace.explorer.sweep import result_schema
from paraspace.results.writer import read_metadata
from paraspace.spaces.catalog import load_space
from paraspace.spaces.encode import DIMENSION_NAMES, Encoder
from paraspace.spaces.enums import Reason
from paraspace.spaces.errors import CatalogError

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


def test_infeasible_trials_are_constraints_never_sentinel_values(tmp_path):
    """A rule-breaking combination has no prediction: PRUNED, no values, constraint 1, its rule named.
    Every COMPLETE trial carries real seconds and bytes, and its constraint: (peak - cap) / cap."""
    loaded = load_space(SMALL)
    run_study(loaded, n_trials=40, out_dir=tmp_path, batch=20, sampler="random", seed=5)
    trials = optuna.load_study(study_name=SMALL, storage=default_storage(tmp_path, SMALL)).trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert pruned and complete and len(pruned) + len(complete) == 40
    rules = {r.name.lower() for r in Reason if r != Reason.VALID}
    for t in pruned:
        assert t.values is None and list(t.constraints.values()) == [1.0]
        assert t.user_attrs["rule"] in rules and t.user_attrs["feasible"] is False
        assert t.system_attrs["constraints"] == [1.0]  # the list optuna-dashboard reads
    cap = loaded.hardware.device.hbm_capacity_bytes
    for t in complete:
        step, mem = t.values
        assert 0 < step < 1e3 and 0 < mem < 2**50
        assert t.system_attrs["constraints"] == [pytest.approx((mem - cap) / cap, rel=1e-12)]


def _params_of(encoder: Encoder, space: dict, row_id: int) -> dict:
    """A combination's Optuna parameters (the search space's values at its position)."""
    index = np.unravel_index(row_id, encoder.shape)
    return {name: space[name][int(index[DIMENSION_NAMES.index(name)])] for name in space}


def test_a_part_keeps_exactly_the_told_trials(tmp_path, monkeypatch):
    """One batch asks the same combination twice and dies after telling the first: the staged part
    settles with that trial's row only (keyed by trial number, not row_id), the other stays RUNNING."""
    loaded = load_space(SMALL)
    encoder = Encoder(loaded)
    space = search_space(encoder)
    valid = int(encoder.encode_all().columns["row_id"][0])
    study = optuna.create_study(study_name="s", storage=default_storage(tmp_path, "s"),
                                directions=["minimize", "minimize"])
    trials = []
    for _ in range(2):
        study.enqueue_trial(_params_of(encoder, space, valid))
        trial = study.ask()
        for key, values in space.items():
            trial.suggest_categorical(key, values)
        trials.append(trial)
    tell = study.tell

    def dies_after_one(*args, **kwargs):
        if study.get_trials(states=(TrialState.COMPLETE,)):
            raise KeyboardInterrupt
        return tell(*args, **kwargs)

    monkeypatch.setattr(study, "tell", dies_after_one)
    pending, part_dir = tmp_path / "pending", tmp_path / "parts"
    pending.mkdir()
    with pytest.raises(KeyboardInterrupt):
        study_mod._evaluate_and_tell(study, trials, study_mod.TrainingProblem(loaded, packed=pack(loaded)), pending,
                                     part_dir, "s")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.RUNNING]
    study_mod._settle(study, pending, part_dir)
    (part,) = part_dir.glob("*.parquet")
    assert json.loads(read_metadata(part)["paraspace.study"])["trials"] == [trials[0].number]
    assert pl.read_parquet(part)["row_id"].to_list() == [valid]


def test_grid_sampler_refuses_a_space_too_large_to_list(tmp_path):
    with pytest.raises(CatalogError) as err:
        run_study(load_space("llama3-70b-h100-1024"), n_trials=5, out_dir=tmp_path / "out", sampler="grid")
    message = str(err.value)
    assert "--sampler = 'grid'" in message and f"{study_mod.MAX_GRID:,}" in message and "414,720" in message
    assert "--sampler tpe or random" in message
    assert not (tmp_path / "out").exists()  # refused before any storage or folder was made


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--max-mem", "0"], ["--max-mem", "0<x"]),
        (["--seed", "-1"], ["--seed", "-1 is not in the range 0<=x<=4294967295"]),
        (["--storage", "garbage"], ["--storage = 'garbage'", "an Optuna storage URL", "postgresql+psycopg2://"]),
        (["--storage", "nosuchdb://host/db"], ["--storage = 'nosuchdb://host/db'", "an Optuna storage URL"]),
        (["--sampler", "grid", "--space-is", "llama3-70b-h100-1024"], ["--sampler = 'grid'", "tpe or random"]),
    ],
)
def test_cli_study_refuses_bad_options_in_one_line(tmp_path, args, needles):
    if "--space-is" in args:  # the space is the command's argument
        args = [args[-1], *args[:2]]
    result = CliRunner().invoke(main, ["study", *args, "--trials", "1", "--out", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1
    for needle in needles:
        assert needle in error[0]


def test_a_refused_storage_leaves_no_folder_behind(tmp_path, monkeypatch):
    """A database that cannot be opened fails the study at once, before its first trial: the --out
    folder it would have created (and its workers' folder) are not left behind, empty; a
    folder that was there before stays."""
    url = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    for out, existed in ((tmp_path / "fresh" / "deeper", False), (tmp_path / "there", True)):
        if existed:
            out.mkdir()
        waits: list[float] = []
        monkeypatch.setattr(study_mod.time, "sleep", waits.append)
        result = CliRunner().invoke(main, ["study", "llama3-8b-h100-64", "--storage", url, "--trials", "1",
                                           "--out", str(out)])
        assert result.exit_code == 2 and "a database that accepts connections" in result.output, result.output
        assert "OperationalError: (sqlite3.OperationalError) unable to open database file" in result.output
        assert waits == []  # refused at once: the retries (7.5 s of waiting) are for workers racing to create tables
        assert out.exists() == existed and (not existed or list(out.iterdir()) == [])
    assert not (tmp_path / "fresh").exists()


def test_a_study_stopped_before_its_first_batch_says_it_wrote_no_metrics(tmp_path):
    """--timeout 0 ends the study before a batch: no Parquet part is written, and the
    headline says so instead of pointing at a folder that does not exist."""
    result = CliRunner().invoke(main, ["study", "llama3-8b-h100-64", "--timeout", "0", "--out", str(tmp_path),
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "0 new trials (0 in total)" in result.output and "no metrics written" in result.output
    assert not (tmp_path / "llama3-8b-h100-64").exists()


def test_each_batch_reports_trials_done_and_the_best_feasible_step(tmp_path):
    """on_batch hears 8, 16, 24 trials and a best step that never rises; the last one
    equals the summary's best."""
    from paraspace.explorer.study import run_study
    from paraspace.spaces.catalog import load_space

    heard: list[tuple[int, float | None]] = []
    summary = run_study(load_space("llama3-8b-h100-64"), n_trials=24, out_dir=tmp_path, batch=8, sampler="random",
                        on_batch=lambda done, best: heard.append((done, best)))
    assert [d for d, _ in heard] == [8, 16, 24]
    bests = [b for _, b in heard if b is not None]
    assert bests == sorted(bests, reverse=True)
    assert bests[-1] == summary.best[0]["step_time_s"]


def test_batch_under_deadline_by_hand():
    """The first batch is one trial; then as many as the time left holds at the last
    batch's rate: 10 s left at 0.3 s a trial is 33, capped by the batch size; never 0."""
    assert study_mod.batch_under_deadline(64, 10.0, None) == 1
    assert study_mod.batch_under_deadline(64, 10.0, 0.3) == 33
    assert study_mod.batch_under_deadline(16, 10.0, 0.3) == 16
    assert study_mod.batch_under_deadline(64, 0.1, 0.3) == 1
    assert study_mod.batch_under_deadline(64, -1.0, 0.3) == 1
    assert study_mod.batch_under_deadline(64, 10.0, 0.0) == 64


def test_timeout_is_overrun_by_about_a_trial_not_a_batch(tmp_path):
    """A problem whose trials take 0.4 s each under --timeout 1 with batches of 64: the
    study stops after about 3 trials (0.4 s alone, then the 0.6 s left hold one more at 0.4 s,
    then 0.2 s left: one more, then none left), not after a whole batch of 64 (25 s)."""
    import time

    loaded = load_space("llama3-8b-h100-64")

    class Slow(study_mod.TrainingProblem):
        def evaluate(self, ids):
            time.sleep(0.4 * len(ids))
            return super().evaluate(ids)

    problem = Slow(loaded, packed=pack(loaded))
    problem.evaluate(np.array([0], dtype=np.int64))  # compile before the clock starts
    summary = study_mod.optimise(problem, n_trials=64, out_dir=tmp_path, batch=64, timeout_s=1.0, sampler="random")
    assert 1 <= summary.n_new <= 4  # a slow machine's overhead can leave no time after the first
