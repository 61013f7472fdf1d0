"""A study's journal and Parquet parts under damage and interrupts: a journal cut mid-write (or
not one) is refused in one line naming the file, its bad line and what to do, before Optuna
appends to it (the file stays byte-identical); a part being settled after an interrupt leaves no
staging file; a SIGTERM whose exception was lost stops the study before its next batch."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from test_study_recovery import assert_parquet_matches_trials

from paraspace.explorer import signals
from paraspace.explorer.cli import main
from paraspace.explorer.study import check_journal, default_storage, run_study
from paraspace.spaces.catalog import load_space
from paraspace.spaces.errors import CatalogError

SMALL = "llama3-8b-h100-64"
FAIL, RUNNING = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def loaded():
    return load_space(SMALL)


@pytest.fixture(scope="module")
def journal_bytes(loaded, tmp_path_factory) -> bytes:
    """A real journal: six trials in two batches."""
    out = tmp_path_factory.mktemp("journal")
    run_study(loaded, n_trials=6, out_dir=out, batch=3, sampler="random")
    return (out / f"{SMALL}.journal").read_bytes()


def study_with_journal(tmp_path: Path, content: bytes):
    """``paraspace study`` on a folder whose journal holds ``content``; the result and the journal."""
    journal = tmp_path / f"{SMALL}.journal"
    journal.write_bytes(content)
    result = CliRunner().invoke(main, ["study", SMALL, "--trials", "2", "--batch", "2", "--out", str(tmp_path),
                                       "--no-progress"])
    return result, journal


def one_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    lines = result.output.strip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def cut_mid_entry(journal: bytes) -> tuple[bytes, int]:
    """The journal cut in the middle of its last entry (a run killed while writing it); that line's number."""
    last = journal.rstrip(b"\n").rfind(b"\n") + 1
    return journal[:last + 40], journal.count(b"\n")


@pytest.mark.parametrize("damage", ["cut", "garbage", "garbage line", "not an entry", "middle"])
def test_a_damaged_journal_is_one_line_and_left_as_it_was(tmp_path, journal_bytes, damage):
    lines = journal_bytes.splitlines(keepends=True)
    content, number, what = {
        "cut": (*cut_mid_entry(journal_bytes), "this line is cut off, with no newline at its end"),
        "garbage": (b"garbage{", 1, "this line is cut off"),
        "garbage line": (journal_bytes + b"garbage{\n", len(lines) + 1, "not a JSON object with an op_code"),
        "not an entry": (journal_bytes + b'{"x": 1}\n', len(lines) + 1, "not a JSON object with an op_code"),
        "middle": (b"".join([*lines[:3], b"garbage{\n", *lines[3:]]), 4, "not a JSON object with an op_code"),
    }[damage]
    result, journal = study_with_journal(tmp_path, content)
    line = one_line(result)
    assert line.startswith(f"Error: {journal}: line {number} = ")
    assert what in line and "The journal is left as it was: move it aside" in line and "--study-name" in line
    assert journal.read_bytes() == content  # Optuna appended nothing to it
    assert not os.path.lexists(f"{journal}.lock")
    assert not (tmp_path / SMALL).exists()  # no trial ran, no part written


def test_the_cut_journal_of_the_audit(tmp_path, journal_bytes):
    """``head -c 2771`` of a real journal: the study's first entries whole, the one being written cut."""
    result, journal = study_with_journal(tmp_path, journal_bytes[:2771])
    line = one_line(result)
    assert f"{journal}: line " in line and "cut off" in line
    assert journal.read_bytes() == journal_bytes[:2771]


def test_a_journal_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / f"{SMALL}.journal").mkdir()
    with pytest.raises(CatalogError, match=r"\.journal: journal = .*expected an Optuna journal file"):
        default_storage(tmp_path, SMALL)


def test_a_whole_journal_still_resumes(tmp_path, loaded, journal_bytes):
    (tmp_path / f"{SMALL}.journal").write_bytes(journal_bytes)
    check_journal(tmp_path / f"{SMALL}.journal")
    check_journal(tmp_path / "missing.journal")
    (tmp_path / "empty.journal").write_bytes(b"")
    check_journal(tmp_path / "empty.journal")
    summary = run_study(loaded, n_trials=3, out_dir=tmp_path, batch=3, sampler="random", seed=1)
    assert summary.n_trials_total == 9


def test_a_cut_end_written_right_now_is_read_again_under_the_journal_lock(tmp_path, journal_bytes, monkeypatch):
    """A worker appending as the study starts shows a last line in the making: read again under Optuna's
    lock (the appender holds it), it is whole, and nothing is refused."""
    journal = tmp_path / f"{SMALL}.journal"
    cut, _ = cut_mid_entry(journal_bytes)
    journal.write_bytes(cut)
    from optuna.storages.journal import JournalFileSymlinkLock

    real_acquire = JournalFileSymlinkLock.acquire

    def acquire(lock):  # the appender finishes its entry, then releases the lock we wait on
        journal.write_bytes(journal_bytes)
        return real_acquire(lock)

    monkeypatch.setattr(JournalFileSymlinkLock, "acquire", acquire)
    check_journal(journal)
    assert not os.path.lexists(f"{journal}.lock")


class Interrupt(KeyboardInterrupt):
    pass


def test_an_interrupt_while_settling_a_part_leaves_no_staging_file(tmp_path, loaded, monkeypatch):
    """Ctrl-C mid-batch gives the batch back: its told trials' rows are re-written to the parts folder
    (stage, then rename). A second interrupt between the two leaves no ``.partial`` there, and the
    batch's claim for the next start, which publishes those rows."""
    part_dir = tmp_path / SMALL
    told = []
    real_tell, real_replace = optuna.Study.tell, os.replace

    def tell(self, trial, values=None, state=None, skip_if_finished=False):
        if state != FAIL and len(told) == 4:
            raise Interrupt
        if state != FAIL:
            told.append(trial)
        return real_tell(self, trial, values, state, skip_if_finished)

    def replace(src, dst, *args, **kwargs):
        if Path(src).parent == part_dir and str(src).endswith(".partial"):
            raise Interrupt  # the staged part is written, not yet renamed
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "tell", tell)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Interrupt):
        run_study(loaded, n_trials=10, out_dir=tmp_path, batch=10, sampler="random")
    monkeypatch.undo()
    assert part_dir.is_dir() and not list(part_dir.iterdir())  # staged, removed; nothing half done
    assert len(list((tmp_path / f".{SMALL}.workers").glob("*/*.pending"))) == 1  # the claim, kept
    run_study(loaded, n_trials=4, out_dir=tmp_path, batch=4, sampler="random", seed=2)
    study = optuna.load_study(study_name=SMALL, storage=default_storage(tmp_path, SMALL))
    assert_parquet_matches_trials(study, part_dir)
    assert not list((tmp_path / f".{SMALL}.workers").iterdir())


def test_a_lost_sigterm_stops_the_study_before_its_next_batch(tmp_path, loaded, monkeypatch):
    """SIGTERM whose exception was lost inside a kernel (explorer.signals): the batch in flight is told
    and published, no further batch is asked."""
    with pytest.raises(signals.Terminated):
        run_study(loaded, n_trials=12, out_dir=tmp_path, batch=4, sampler="random",
                  on_batch=lambda done, best: monkeypatch.setattr(signals, "_received", True))
    monkeypatch.undo()
    study = optuna.load_study(study_name=SMALL, storage=default_storage(tmp_path, SMALL))
    assert len(study.trials) == 4 and not study.get_trials(states=(RUNNING,))
    assert len(list((tmp_path / SMALL).glob("*.parquet"))) <= 1
    assert sorted(p.name for p in (tmp_path / f".{SMALL}.workers").iterdir()) == []
