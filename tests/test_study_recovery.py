"""A study whose worker dies mid-batch resumes with no trial lost, none left RUNNING, none repeated.

A worker killed between ask and tell leaves its trials RUNNING in the storage.
The next `paraspace study` fails them and queues their parameters again
(Optuna's RetryHeartbeatStaleTrialCallback), found either by the dead worker's
released lock (any storage, same results folder) or by Optuna's heartbeat (RDB
storages). The Parquet parts hold exactly one row set per told trial.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import polars as pl
import pytest

from paraspace.explorer import study as study_mod
from paraspace.explorer.study import default_storage, run_study, search_space
from paraspace.results.writer import read_metadata
from paraspace.spaces.catalog import load_space
from paraspace.spaces.encode import Encoder

SMALL = "llama3-8b-h100-64"
RUNNING, COMPLETE, PRUNED, FAIL, WAITING = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE,
                                            optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL,
                                            optuna.trial.TrialState.WAITING)


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def loaded():
    return load_space(SMALL)


def journal(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=SMALL, storage=default_storage(out, SMALL))


def distributions(loaded) -> dict[str, optuna.distributions.BaseDistribution]:
    return {k: optuna.distributions.CategoricalDistribution(v) for k, v in search_space(Encoder(loaded)).items()}


def assert_recovered(study: optuna.Study, lost: dict[int, dict]) -> None:
    """Nothing RUNNING or WAITING; each lost trial FAIL, evaluated again once with its own parameters."""
    trials = study.get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state in (RUNNING, WAITING)]
    retries = {t.system_attrs["failed_trial"]: t for t in trials if "failed_trial" in t.system_attrs}
    for number, params in lost.items():
        assert trials[number].state == FAIL
        # the same candidate (a trial killed while its parameters were being written gets the rest sampled)
        # told: COMPLETE, or PRUNED where the combination breaks a validity rule
        assert retries[number].state in (COMPLETE, PRUNED) and params.items() <= retries[number].params.items()
    assert len([t for t in trials if t.state == FAIL]) == len(lost)


def assert_parquet_matches_trials(study: optuna.Study, part_dir: Path) -> None:
    """Each told trial with a prediction (COMPLETE) has its row in exactly one part, row i of a part being
    trial i of its footer; no part holds a row of an untold or rule-breaking (PRUNED) trial."""
    trials = study.get_trials(deepcopy=False)
    listed: list[int] = []
    for path in sorted(part_dir.glob("*.parquet")):
        numbers = json.loads(read_metadata(path)["paraspace.study"])["trials"]
        assert all(trials[n].state == COMPLETE for n in numbers), path.name
        rows = pl.read_parquet(path)["row_id"].to_list()
        assert rows == [trials[n].user_attrs["row_id"] for n in numbers], path.name
        listed += numbers
    assert len(listed) == len(set(listed))  # no trial in two parts
    assert {t.number for t in trials if t.state == COMPLETE} == set(listed)
    assert not list(part_dir.glob("*.partial"))


def workers_left(out: Path) -> list[str]:
    return sorted(p.name for p in (out / f".{SMALL}.workers").iterdir())


def test_sigkilled_study_resumes_with_no_trial_lost(tmp_path, loaded):
    """A real `paraspace study` process, SIGKILLed mid-batch, then resumed."""
    part_dir = tmp_path / SMALL
    cmd = [sys.executable, "-m", "paraspace.explorer.cli", "study", SMALL, "--trials", "100000", "--batch", "200",
           "--sampler", "random", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    for attempt in range(3):  # a kill landing exactly between two batches leaves nothing RUNNING: kill again
        proc = subprocess.Popen([*cmd, "--seed", str(attempt)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        start = len(list(part_dir.glob("*.parquet")))
        while len(list(part_dir.glob("*.parquet"))) == start:  # one batch published: well into the next
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no batch published in 120 s"
            time.sleep(0.02)
        time.sleep(0.2 + 0.15 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()
        running = journal(tmp_path).get_trials(deepcopy=False, states=(RUNNING,))
        if running:
            break
    assert running, "three kills all landed between batches"
    # the dead worker's claim is still there: its lock (released by the kernel) and its batch's trial list
    token = next(p.stem for p in (tmp_path / f".{SMALL}.workers").glob("*.lock"))
    claimed = {int(x) for x in (tmp_path / f".{SMALL}.workers" / f"{token}.trials").read_text().split()}
    lost = {t.number: t.params for t in running}
    assert len(set(lost) - claimed) <= 1  # at most the one trial being created as it died

    began = time.perf_counter()
    summary = run_study(loaded, n_trials=len(lost) + 10, out_dir=tmp_path, batch=64, sampler="random", seed=9)
    assert time.perf_counter() - began < 20  # a journal lock left by the kill is not waited out (30 s)
    assert not os.path.lexists(tmp_path / f"{SMALL}.journal.lock")
    assert summary.n_recovered == len(lost)
    study = journal(tmp_path)
    assert_recovered(study, lost)
    assert_parquet_matches_trials(study, part_dir)
    assert workers_left(tmp_path) == []


def test_orphans_asked_but_never_told_are_retried(tmp_path, loaded):
    """Trials asked and never told (a process that died before even claiming them), storage closed."""
    run_study(loaded, n_trials=20, out_dir=tmp_path, batch=10, sampler="random")
    study = journal(tmp_path)
    asked = [study.ask(distributions(loaded)) for _ in range(5)]
    asked[0].set_constraint("fits", -0.5)  # a constraint set just before dying is not inherited
    lost = {t.number: t.params for t in asked}
    del study, asked
    # and it died appending to the journal: Optuna's symlink lock is left behind
    lock = tmp_path / f"{SMALL}.journal.lock"
    os.symlink(tmp_path / f"{SMALL}.journal", lock)

    began = time.perf_counter()
    summary = run_study(loaded, n_trials=10, out_dir=tmp_path, batch=10, sampler="random", seed=3)
    assert time.perf_counter() - began < 10 and not os.path.lexists(lock)  # not its 30 s grace period
    assert summary.n_recovered == 5 and summary.n_trials_total == 20 + 5 + 10
    study = journal(tmp_path)
    assert_recovered(study, lost)
    assert_parquet_matches_trials(study, tmp_path / SMALL)


def test_a_live_workers_trials_are_left_alone_until_it_dies(tmp_path, loaded):
    """Two workers on one journal: the one starting must not steal the trials the other has out."""
    run_study(loaded, n_trials=10, out_dir=tmp_path, batch=10, sampler="random")
    study = journal(tmp_path)
    other = study_mod._Worker(tmp_path / f".{SMALL}.workers")
    with other:
        other.begin()
        for _ in range(4):
            other.own(study.ask(distributions(loaded)).number)
        lost = {n: study.trials[n].params for n in other.numbers}
        summary = run_study(loaded, n_trials=10, out_dir=tmp_path, batch=10, sampler="random", seed=1)
        assert summary.n_recovered == 0
        assert {t.number for t in journal(tmp_path).get_trials(states=(RUNNING,))} == set(lost)
        other.clean = False  # it dies: the kernel drops its lock, its claim stays on disk
    summary = run_study(loaded, n_trials=10, out_dir=tmp_path, batch=10, sampler="random", seed=2)
    assert summary.n_recovered == 4
    assert_recovered(journal(tmp_path), lost)
    assert workers_left(tmp_path) == []


class Interrupt(KeyboardInterrupt):
    pass


@pytest.mark.parametrize("how", ["ctrl-c", "died"])
def test_a_batch_cut_during_its_tells_keeps_exactly_the_told_rows(tmp_path, loaded, monkeypatch, how):
    """Killed after its Parquet part is staged and half its trials told: the part is published with
    the told trials' rows only, the others are retried and land in a later part."""
    run_study(loaded, n_trials=10, out_dir=tmp_path, batch=10, sampler="random")
    told = []
    real_tell = optuna.Study.tell

    def tell(self, trial, values=None, state=None, skip_if_finished=False):
        batch = state != FAIL  # the batch's tells (COMPLETE, or PRUNED for a broken rule); FAIL is the give-back's
        if batch and len(told) == 6:
            raise Interrupt
        out = real_tell(self, trial, values, state, skip_if_finished)
        if batch:
            told.append(trial.number)
        return out

    monkeypatch.setattr(optuna.Study, "tell", tell)
    if how == "died":  # SIGKILL at that point: nothing is given back, the next start reclaims it
        monkeypatch.setattr(study_mod, "_give_back", lambda study, worker, *a: setattr(worker, "clean", False))
    with pytest.raises(Interrupt):
        run_study(loaded, n_trials=20, out_dir=tmp_path, batch=20, sampler="random", seed=5)
    monkeypatch.undo()
    study = journal(tmp_path)
    cut = [t for t in study.trials[10:30] if t.number not in told]
    assert len(cut) == 14
    lost = {t.number: t.params for t in cut}
    if how == "ctrl-c":  # given back at once: FAIL, with retries WAITING; the told rows published
        assert {t.state for t in cut} == {FAIL}
        assert_parquet_matches_trials(study, tmp_path / SMALL)
    else:
        assert {t.state for t in cut} == {RUNNING}
        assert len(list((tmp_path / f".{SMALL}.workers").glob("*/*.pending"))) == 1
    summary = run_study(loaded, n_trials=14, out_dir=tmp_path, batch=20, sampler="random", seed=6)
    assert summary.n_recovered == (0 if how == "ctrl-c" else 14)
    study = journal(tmp_path)
    assert_recovered(study, lost)
    assert_parquet_matches_trials(study, tmp_path / SMALL)
    assert workers_left(tmp_path) == []


def test_rdb_heartbeat_fails_stale_trials(tmp_path, loaded):
    """Optuna's heartbeat on an RDB storage (SQLite here): trials of a worker elsewhere (no lock in this
    results folder) that stopped beating longer than the grace period ago are failed and retried."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    run_study(loaded, n_trials=10, out_dir=tmp_path, storage=url, batch=10, sampler="random",
              heartbeat_s=1, grace_s=1)
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2)
    study = optuna.load_study(study_name=SMALL, storage=storage)
    with pytest.warns(UserWarning, match="Heartbeat"):
        asked = [study.ask(distributions(loaded)) for _ in range(3)]
    for trial in asked:
        storage.record_heartbeat(trial._trial_id)
    lost = {t.number: t.params for t in asked}
    storage.engine.dispose()
    # a trial that beat within the grace period is alive: only the silent ones go (a grace of a
    # minute here: on a loaded CI machine the start of a run can take more than 2 s after the beat)
    summary = run_study(loaded, n_trials=5, out_dir=tmp_path, storage=url, batch=5, sampler="random",
                        heartbeat_s=1, grace_s=60)
    assert summary.n_recovered == 0
    time.sleep(3.5)  # SQLite's now() counts whole seconds
    summary = run_study(loaded, n_trials=5, out_dir=tmp_path, storage=url, batch=5, sampler="random",
                        heartbeat_s=1, grace_s=2)
    assert summary.n_recovered == 3
    study = optuna.load_study(study_name=SMALL, storage=url)
    assert_recovered(study, lost)
    assert_parquet_matches_trials(study, tmp_path / SMALL)
