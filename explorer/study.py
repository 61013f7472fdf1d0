"""``paraspace study``: Optuna searches a space too large to enumerate.

The Optuna search space is the TOML space's own dimensions (a categorical
distribution over each dimension's values; an omitted dp stays derived, as in
a sweep). Trials are asked in batches so the kernels see arrays: each batch is
encoded with the sweep's validity rules and evaluated by the same analytic and
event tiers, then told back. Under a timeout the batches are sized to the time
left (``batch_under_deadline``). Objectives: step time and peak memory
(multi-objective), or step time alone. Infeasibility is only ever a constraint,
never a made-up objective value: one constraint value per trial, ``fits``,
stored where ``constraints_func`` stores it (the trial's system attribute
``constraints``, a list) since that is the form both read: Optuna's samplers
(TPE and NSGA-II rank infeasible trials last) and optuna-dashboard (which
greys infeasible trials out; it does not read ``Trial.set_constraint``'s
per-name keys). It is set before the trial is told, so no sampler sees a
finished trial without it:

* over the memory cap: COMPLETE with its real step time and memory, and the
  constraint ``fits`` = (peak - cap) / cap > 0; optuna-dashboard draws it as an
  infeasible point on the same axes as the feasible ones. Its Parquet row says the same
  (``feasible`` false, ``infeasible_reason`` out_of_memory; the cap is in every part's
  footer), so ``paraspace top`` on the study's folder ranks its trials as the study does;
  a row under the cap that does not fit otherwise (offloaded tensors over the host
  memory) is told with the smallest positive ``fits``.
* breaking a validity rule (tp not dividing the heads, ...): the combination
  has no prediction at all, so it is told PRUNED, with no values, the
  constraint ``fits`` = 1 and the rule's name in the user attribute ``rule``.
  The dashboard lists it in the trials table and leaves it out of the plots
  (their axes stay on real step times and memory, where a sentinel such as
  1e30 squashed every real point onto zero); TPE counts it among the
  infeasible, "above" trials, so it learns to avoid the rule.

Storage defaults to a journal file in the results folder, so a study resumes
after a crash or Ctrl-C; any Optuna storage URL (an RDB such as PostgreSQL)
lets many processes share one study. A study resumes only for the question it was
created with: its objective, dimensions, space definition (``paraspace.space_sha256``),
memory cap and, serving, simulation setting (the last three as its user attributes);
any other is refused before a trial is asked. Every trial's metrics row is
written to Parquet with the sweep's schema, one part file per batch, so
studies and sweeps are analysed the same way.

A worker killed mid-batch (SIGKILL, power loss) leaves its asked trials
RUNNING. They are found and failed, and their parameters queued again
(``optuna.storages.RetryHeartbeatStaleTrialCallback``), so no candidate is
lost and none is left dangling:

* by the worker's lock (any storage, same results folder): each worker holds
  an ``flock`` on ``OUT/.STUDY.workers/TOKEN.lock`` for its lifetime and lists
  the trials of its batch in flight next to it; the kernel drops the lock when
  the process dies, so the next ``paraspace study`` on that folder knows, at
  once, which RUNNING trials are orphans. With the journal (no heartbeats in
  Optuna's ``JournalStorage``), a RUNNING trial no worker lists is an orphan
  too when no other worker is alive.
* by Optuna's heartbeat (RDB storages, workers on other machines):
  ``RDBStorage(heartbeat_interval=..., grace_period=...,
  heartbeat_stale_trial_callback=...)``; one thread keeps every trial of the
  batch beating while it is evaluated, and ``optuna.storages.fail_stale_trials``
  runs at start and after each batch.

A batch's Parquet part is written before its trials are told and moved into
the dataset only after. It holds one row per trial with a prediction, and its
footer lists those trials' numbers row by row (``paraspace.study`` ->
``trials``), so a part left behind by a dead worker keeps exactly the rows of
the trials it had told, keyed by trial number (a batch may sample one
combination twice, once told and once not): the Parquet output neither loses
nor repeats a trial.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import optuna
import pyarrow as pa
import pyarrow.parquet as pq
from optuna.trial import TrialState

from paraspace.explorer.evaluate import pack
from paraspace.explorer.signals import raise_if_terminated
from paraspace.explorer.sweep import (
    column_docs,
    enum_labels,
    evaluate_encoded,
    provenance,
    result_schema,
    space_digest,
)
from paraspace.results.writer import ResultWriter, ensure_folder, partial_path, read_metadata, to_arrow, writing
from paraspace.spaces.catalog import LoadedSpace
from paraspace.spaces.encode import DIMENSIONS, Encoder
from paraspace.spaces.enums import Feasibility, Reason, labels
from paraspace.spaces.errors import MISSING, CatalogError

try:
    import fcntl
except ImportError:  # not POSIX: no lock-based liveness; RDB heartbeats still apply
    fcntl = None  # type: ignore[assignment]

_log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "nsga2", "random", "grid")
OBJECTIVES = ("time-memory", "time")
#: the grid sampler lists every combination in memory (``optuna.samplers.GridSampler``): at most this many
MAX_GRID = 100_000
#: the system attribute of a trial's constraint values, as ``constraints_func`` writes it
#: (``optuna.study._constrained_optimization``): here one value, ``fits``, > 0 when a rule
#: is broken (1) or memory exceeds the cap (the relative excess)
CONSTRAINTS_ATTR = "constraints"
#: a --storage URL that works with the test extra's driver (psycopg2-binary)
POSTGRES_URL = "postgresql+psycopg2://user:password@host/db"
#: Optuna's heartbeat on RDB storages: each trial of the batch in flight beats every HEARTBEAT_S
#: seconds; a RUNNING trial silent for GRACE_S is failed and queued again by whichever worker looks
HEARTBEAT_S = 10
GRACE_S = 60
#: a candidate whose evaluation killed its worker this many times stays FAIL instead of being retried
MAX_RETRY = 3
#: suffix of a batch's Parquet part while its trials are being told
PENDING = ".pending"


@dataclass
class StudySummary:
    study_name: str
    n_trials_total: int
    n_new: int
    best: list[dict[str, Any]]
    parts: list[Path]
    seconds: float
    #: trials of dead workers found RUNNING, failed and (up to MAX_RETRY times) queued again
    n_recovered: int = 0


def search_space(encoder: Encoder) -> dict[str, list[Any]]:
    """Each varying dimension's values as Optuna sees them (enum labels, bools, ints)."""
    out: dict[str, list[Any]] = {}
    for dim in DIMENSIONS:
        values = encoder.values[dim.name]
        if dim.name == "dp" and encoder.derive_dp:
            continue
        if dim.enum is not None:
            names = labels(dim.enum)
            out[dim.name] = [names[int(v)] for v in values]
        elif dim.boolean:
            out[dim.name] = [bool(v) for v in values]
        else:
            out[dim.name] = [int(v) for v in values]
    return {k: v for k, v in out.items() if len(v) > 1}


def _positions(encoder: Encoder, params: list[dict[str, Any]], space: dict[str, list[Any]]) -> dict[str, np.ndarray]:
    pos = {d.name: np.zeros(len(params), dtype=np.int64) for d in DIMENSIONS}
    for name, values in space.items():
        index = {v: i for i, v in enumerate(values)}
        pos[name] = np.array([index[p[name]] for p in params], dtype=np.int64)
    return pos


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` once every grid point has a trial
    (``GridSampler.after_trial``), which is valid only inside ``Study.optimize``: told by
    ask/tell, the last grid point's tell raised after storing it. The loop stops asking
    instead (``_grid_left``)."""

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: TrialState,
                    values: Any) -> None:
        return None


def _grid_left(sampler: optuna.samplers.BaseSampler, space: dict[str, list[Any]], study: optuna.Study) -> int | None:
    """Grid points no trial has started (finished or running); None for other samplers."""
    if not isinstance(sampler, optuna.samplers.GridSampler):
        return None
    n = int(np.prod([len(v) for v in space.values()], dtype=object))
    started = {t.system_attrs["grid_id"] for t in study.get_trials(deepcopy=False)
               if "grid_id" in t.system_attrs and (t.state.is_finished() or t.state == TrialState.RUNNING)}
    return n - len(started)


def make_sampler(name: str, seed: int | None, space: dict[str, list[Any]]) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return _Grid(space, seed=seed)


def check_options(name: str, space: dict[str, list[Any]], *, sampler: str, storage: str | None) -> None:
    """Refuse, before anything is created, a grid too large to list and a storage URL that is not one
    (``name``: the space's, for the message)."""
    if sampler == "grid":
        n = int(np.prod([len(v) for v in space.values()], dtype=object))
        if n > MAX_GRID:
            raise CatalogError("command line", "--sampler", sampler,
                               f"a space of at most {MAX_GRID:,} combinations for a grid (Optuna's GridSampler lists "
                               f"them all in memory; {name} has {n:,}): use --sampler tpe or random")
    if storage is not None:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            dialect = make_url(storage).get_dialect()
        except (ArgumentError, NoSuchModuleError, ValueError) as err:
            raise CatalogError("command line", "--storage", storage,
                               f"an Optuna storage URL such as {POSTGRES_URL} or "
                               f"sqlite:///study.db ({str(err).splitlines()[0]})") from None
        try:  # the database driver the URL names (postgresql:// alone means psycopg 3 in SQLAlchemy 2)
            (getattr(dialect, "import_dbapi", None) or dialect.dbapi)()
        except ImportError as err:
            other = (f", or name one that is: {POSTGRES_URL} (psycopg2-binary, in the test extra)"
                     if dialect.name == "postgresql" and dialect.driver != "psycopg2" else "")
            raise CatalogError("command line", "--storage", storage,
                               f"a URL whose database driver is installed ({dialect.name}+{dialect.driver} needs the "
                               f"Python module {err.name or dialect.driver!r}, which is missing: install it{other})") \
                from None


def default_storage(out_dir: Path, study_name: str) -> optuna.storages.BaseStorage:
    """The study's journal file ``OUT/NAME.journal`` as an Optuna storage. A damaged journal (cut
    mid-write, or not one) is refused with a ``CatalogError`` naming the file and its first bad line
    before Optuna appends to it (``check_journal``); the file is never changed."""
    from optuna.storages.journal import JournalFileBackend

    ensure_folder(out_dir)
    journal = out_dir / f"{study_name}.journal"
    check_journal(journal)
    with writing(out_dir, what="a folder"):
        try:
            return optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError) as err:
            raise _damaged(journal, str(err) or type(err).__name__) from None  # its replay of a bad line


#: bytes of a journal's end read at a time to find its last line
_TAIL_BYTES = 1 << 16


def check_journal(journal: Path) -> None:
    """Refuse a journal that Optuna would extend into a worse one: one whose last entry is cut off
    (no newline: a study killed while writing it, or a partial copy) or is not a journal entry.
    Optuna's reader skips such a last line, then appends its next entry to it, and the journal no
    longer loads (a damaged line before the last one fails Optuna's own replay, caught by
    ``default_storage``). Cheap: only the end of the file is read. A worker appending right now
    can show a last line in the making, so a bad end is read again under Optuna's journal lock
    before it is refused. A ``CatalogError`` naming the file, the line and what to do."""
    from optuna.storages.journal import JournalFileSymlinkLock

    with writing(journal):
        if not os.path.lexists(journal):
            return
        if not journal.is_file():
            raise CatalogError(journal, "journal", str(journal), "an Optuna journal file (this is a folder or "
                               "another non-file; move it aside or give another --study-name)")
        if _last_entry_complete(journal):
            return
        lock = JournalFileSymlinkLock(str(journal))
        lock.acquire()
        try:
            complete = _last_entry_complete(journal)
        finally:
            with contextlib.suppress(RuntimeError):  # released by someone else after its grace period
                lock.release()
    if not complete:
        raise _damaged(journal)


def _last_entry_complete(journal: Path) -> bool:
    """Whether ``journal`` is empty or ends with a newline after a journal entry (a JSON object
    with an ``op_code``)."""
    with open(journal, "rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        if end == 0:
            return True
        tail = b""
        while end > 0 and b"\n" not in tail[:-1]:  # back to the newline before the last line
            start = max(0, end - _TAIL_BYTES)
            handle.seek(start)
            tail = handle.read(end - start) + tail
            end = start
    if not tail.endswith(b"\n"):
        return False
    return _is_entry(tail[:-1].rsplit(b"\n", 1)[-1])


def _is_entry(line: bytes) -> bool:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        return False
    return isinstance(entry, dict) and "op_code" in entry


def _damaged(journal: Path, reason: str | None = None) -> CatalogError:
    """The error of a journal that cannot be resumed: its first bad line (the whole file is read,
    on this error path only), what is wrong with it and what to do; ``reason``: Optuna's, where it
    failed on a line that looks whole."""
    aside = "The journal is left as it was: move it aside"
    with writing(journal):
        found = _first_bad_line(journal)
    if found is None:
        return CatalogError(journal, "entries", reason or "(unreadable)",
                            f"an Optuna journal that loads (Optuna cannot replay it). {aside} or give another "
                            "--study-name")
    number, line, what = found
    text = line.rstrip(b"\n").decode("utf-8", errors="replace")
    shown = text if len(text) <= 60 else text[:57] + "..."
    kept = f"its first {number - 1} lines hold the study up to there" if number > 1 else "it holds no entry"
    return CatalogError(journal, f"line {number}", shown,
                        f"a whole Optuna journal entry ({what}; a study killed while writing it, or a file cut "
                        f"short or edited). {aside} ({kept}) or give another --study-name")


def _first_bad_line(journal: Path) -> tuple[int, bytes, str] | None:
    """(number, text, what is wrong) of the first line of ``journal`` that is not a whole entry."""
    with open(journal, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                return number, line, "this line is cut off, with no newline at its end"
            if not _is_entry(line):
                return number, line, "this line is not one: not a JSON object with an op_code"
    return None


@dataclass
class Outcome:
    """How one evaluated trial is told: ``values`` (None: no objective value, told PRUNED
    and left out of the Parquet), the constraint ``fits`` (> 0: infeasible), and user attributes."""

    values: list[float] | None
    fits: float
    attrs: dict[str, Any]


class Problem(abc.ABC):
    """What a study searches (module doc): the training problem below; serving spaces
    have theirs (``explorer.serve_study``). The optimisation loop, storage, workers and
    recovery are shared."""

    name: str  # the space's name: the default study name
    space: dict[str, list[Any]]  # Optuna's search space
    #: what besides the objective and the dimensions makes the study's question (``QUESTION``): the
    #: space definition's digest, the memory cap, ...; stored as the study's user attributes by its
    #: first run, compared on every resume, and written in every Parquet part's ``paraspace.study`` footer
    question: dict[str, Any]
    directions: list[str]
    metric_names: list[str]  # the objectives' column names, as optuna-dashboard shows them

    @abc.abstractmethod
    def row_ids(self, params: list[dict[str, Any]]) -> np.ndarray:
        """The flat combination index of each trial's parameters."""

    @abc.abstractmethod
    def evaluate(self, ids: np.ndarray) -> tuple[dict[str, np.ndarray] | None, np.ndarray]:
        """(the columns of the valid combinations of ``ids`` in their order, or None when
        none is valid; the valid row ids in that order)."""

    @abc.abstractmethod
    def outcome(self, cols: dict[str, np.ndarray], row: int) -> Outcome:
        """Row ``row`` of ``cols`` as the trial's objective values, feasibility and attributes."""

    @abc.abstractmethod
    def broken_rule(self, row_id: int) -> str:
        """The name of the first validity rule a combination breaks."""

    @abc.abstractmethod
    def write_part(self, path: Path, cols: dict[str, np.ndarray], footer: dict[str, Any]) -> None:
        """Write ``cols`` as one Parquet part with the problem's schema and ``footer`` metadata."""

    @abc.abstractmethod
    def best_entry(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        """A feasible trial as the summary lists it."""


class TrainingProblem(Problem):
    """A training space: step time (and peak memory) minimised under a memory cap."""

    def __init__(self, loaded: LoadedSpace, *, objective: str = "time-memory", max_mem_gib: float | None = None,
                 packed: Any = None) -> None:
        self.loaded = loaded
        self.encoder = Encoder(loaded)
        self.name = loaded.spec.name
        self.space = search_space(self.encoder)
        self.directions = ["minimize", "minimize"] if objective == "time-memory" else ["minimize"]
        self.metric_names = ["step_time_s", "mem_peak_bytes"][:len(self.directions)]
        self.cap = max_mem_gib * 1024**3 if max_mem_gib is not None else loaded.hardware.device.hbm_capacity_bytes
        self.question = {"space_sha256": space_digest(loaded), "mem_cap_bytes": float(self.cap)}
        self._packed = packed
        self.schema, self.labels = result_schema(), enum_labels()

    @property
    def packed(self) -> Any:
        if self._packed is None:
            self._packed = pack(self.loaded)
        return self._packed

    def row_ids(self, params: list[dict[str, Any]]) -> np.ndarray:
        return self.encoder.row_ids(_positions(self.encoder, params, self.space))

    def evaluate(self, ids: np.ndarray) -> tuple[dict[str, np.ndarray] | None, np.ndarray]:
        enc = self.encoder.encode_ids(ids)
        cols = evaluate_encoded(self.packed, enc) if enc.n_rows else None
        if cols is not None:
            mark_over_cap(cols, "infeasible_reason", self.cap, int(Feasibility.OUT_OF_MEMORY))
        return cols, enc.columns["row_id"]

    def outcome(self, cols: dict[str, np.ndarray], row: int) -> Outcome:
        step, mem = float(cols["step_time_s"][row]), float(cols["mem_peak_bytes"][row])
        feasible = bool(cols["feasible"][row])
        fits = (mem - self.cap) / self.cap
        if not feasible and fits <= 0.0:  # under the cap, yet out of host memory (or of HBM under a larger cap)
            fits = float(np.nextafter(0.0, 1.0))
        return Outcome([step, mem][:len(self.directions)], fits, {"feasible": feasible})

    def broken_rule(self, row_id: int) -> str:
        first = self.encoder.encode_ids(np.array([row_id], dtype=np.int64)).first_reason
        return Reason(int(np.flatnonzero(first[1:])[0]) + 1).name.lower()

    def write_part(self, path: Path, cols: dict[str, np.ndarray], footer: dict[str, Any]) -> None:
        with ResultWriter(path, self.schema, provenance(self.loaded), column_docs()) as writer:
            writer.write(to_arrow(cols, self.schema, self.labels))
            writer.close(footer)

    def best_entry(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return {"trial": trial.number, "step_time_s": trial.values[0], **trial.params,
                "row_id": trial.user_attrs["row_id"]}


def run_study(loaded: LoadedSpace, *, n_trials: int, out_dir: Path, study_name: str | None = None,
              storage: str | None = None, sampler: str = "tpe", objective: str = "time-memory",
              max_mem_gib: float | None = None, batch: int = 64, timeout_s: float | None = None,
              seed: int | None = 0, heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S,
              on_batch: Callable[[int, float | None], object] | None = None) -> StudySummary:
    """Run ``n_trials`` more trials of the named study of a training space in batches;
    ``on_batch`` hears, after each batch, the trials done so far and the best feasible
    step time of the whole study (None while no trial is feasible)."""
    problem = TrainingProblem(loaded, objective=objective, max_mem_gib=max_mem_gib)
    return optimise(problem, n_trials=n_trials, out_dir=out_dir, study_name=study_name, storage=storage,
                    sampler=sampler, batch=batch, timeout_s=timeout_s, seed=seed, heartbeat_s=heartbeat_s,
                    grace_s=grace_s, on_batch=on_batch)


def optimise(problem: Problem, *, n_trials: int, out_dir: Path, study_name: str | None = None,
             storage: str | None = None, sampler: str = "tpe", batch: int = 64, timeout_s: float | None = None,
             seed: int | None = 0, heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S,
             on_batch: Callable[[int, float | None], object] | None = None) -> StudySummary:
    """Run ``n_trials`` more trials of ``problem``'s named study in batches (module doc);
    ``on_batch`` hears, after each batch, the trials done so far and the best feasible
    first objective of the whole study (None while no trial is feasible)."""
    space = problem.space
    check_options(problem.name, space, sampler=sampler, storage=storage)
    name = study_name or problem.name
    directions = problem.directions
    with _optuna_quiet():
        retry = _Retry(max_retry=MAX_RETRY)
    rdb: list[optuna.storages.RDBStorage] = []

    def open_storage() -> optuna.storages.BaseStorage:
        if storage is None:
            return default_storage(out_dir, name)
        # Optuna's heartbeat (RDBStorage only; JournalStorage has none in Optuna 5): trials whose
        # heartbeat is older than grace_period are failed by optuna.storages.fail_stale_trials, which
        # hands each to heartbeat_stale_trial_callback (here: queue its parameters again).
        rdb[:] = [optuna.storages.RDBStorage(storage, heartbeat_interval=heartbeat_s, grace_period=grace_s,
                                             heartbeat_stale_trial_callback=retry)]
        return rdb[0]

    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
    part_dir = out_dir / name
    parts: list[Path] = []
    began = time.perf_counter()
    done = 0
    per_trial_s: float | None = None  # the last batch's seconds a trial
    with _optuna_quiet(), _Worker(out_dir / f".{name}.workers") as worker:
        with _DeadWorkers(worker) as dead:
            if storage is None and not dead.live:
                _release_stale_journal_lock(out_dir / f"{name}.journal")
            study = _open_study(name, open_storage, directions, make_sampler(sampler, seed, space), storage)
            worker.started = True
            where = "--storage" if storage else out_dir / f"{name}.journal"
            _check_objective(study, problem, where)
            _check_space(study, problem, where)
            _check_question(study, problem, where)
            if study.metric_names is None:  # objective names, as optuna-dashboard shows them
                study.set_metric_names(problem.metric_names)
            dead.reclaim(study, part_dir, retry, journal=storage is None)
        optuna.storages.fail_stale_trials(study)
        with _Heartbeat(rdb[0] if rdb else None, heartbeat_s) as heart:
            while done < n_trials and (timeout_s is None or time.perf_counter() - began < timeout_s):
                raise_if_terminated()  # a SIGTERM whose exception was lost: no new batch after it (explorer.signals)
                left = _grid_left(study.sampler, space, study)
                if left == 0:  # every grid point has a trial
                    break
                worker.begin()
                size = min(batch, n_trials - done, left if left is not None else batch)
                if timeout_s is not None:  # a batch sized to the time left (batch_under_deadline)
                    size = batch_under_deadline(size, timeout_s - (time.perf_counter() - began), per_trial_s)
                batch_began = time.perf_counter()
                try:
                    trials = []
                    for _ in range(size):
                        trial = study.ask()  # claimed before its parameters are written, then suggested
                        worker.own(trial.number)  # as study.ask(distributions) would
                        heart.beat(trial)
                        for key, dist in distributions.items():
                            trial.suggest_categorical(key, dist.choices)
                        trials.append(trial)
                    part = _evaluate_and_tell(study, trials, problem, worker.pending, part_dir, name)
                except BaseException:  # Ctrl-C or an error mid-batch: give the batch back now
                    _give_back(study, worker, part_dir, retry)
                    raise
                heart.clear()
                per_trial_s = (time.perf_counter() - batch_began) / max(1, len(trials))
                if part is not None:
                    parts.append(part)
                done += len(trials)
                optuna.storages.fail_stale_trials(study)
                if on_batch is not None:
                    on_batch(done, best_feasible_value(study))
    feasible = [t for t in study.trials if t.state == TrialState.COMPLETE
                and max(_constraint(t), default=1.0) <= 0]
    sign = -1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else 1.0
    best: list[optuna.trial.FrozenTrial] = []
    for trial in sorted(feasible, key=lambda t: sign * t.values[0]):  # each configuration once: its first trial
        if len(best) < 5 and all(b.user_attrs["row_id"] != trial.user_attrs["row_id"] for b in best):
            best.append(trial)
    if retry.count:
        _log.warning("study %s: %d trials left RUNNING by dead workers were failed and queued again",
                     name, retry.count)
    return StudySummary(
        study_name=name, n_trials_total=len(study.trials), n_new=done,
        best=[problem.best_entry(t) for t in best],
        parts=parts, seconds=time.perf_counter() - began, n_recovered=retry.count,
    )


def mark_over_cap(cols: dict[str, np.ndarray], reason_key: str, cap: float, code: int) -> None:
    """In place: the rows that fit but whose ``mem_peak_bytes`` exceed the study's ``cap``
    become infeasible, ``code`` in ``cols[reason_key]``. The Parquet's feasible column is the
    study's, so ``paraspace top`` ranks no row the study refused (training and serving)."""
    over = (cols["feasible"] != 0) & (cols["mem_peak_bytes"] > cap)
    cols["feasible"] = np.where(over, 0, cols["feasible"]).astype(cols["feasible"].dtype)
    cols[reason_key] = np.where(over, code, cols[reason_key]).astype(cols[reason_key].dtype)


def batch_under_deadline(size: int, left_s: float, per_trial_s: float | None) -> int:
    """The trials of the next batch under ``--timeout``: the first batch is one trial
    (its time, compilation included, is the first estimate); later ones as many as
    the time left holds at the last batch's seconds a trial, at least one and at most
    ``size``. A batch is evaluated whole, so the deadline can be overrun by about one
    trial's time, not a whole batch's (64 simulated serving trials can take minutes)."""
    if per_trial_s is None:
        return min(size, 1)
    fits = int(left_s / per_trial_s) if per_trial_s > 0.0 else size
    return max(1, min(size, fits))


def best_feasible_value(study: optuna.Study) -> float | None:
    """The best first objective (by the study's direction) among its complete trials that meet the constraints."""
    values = [t.values[0] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if max(_constraint(t), default=1.0) <= 0]
    if not values:
        return None
    return max(values) if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else min(values)


#: the training study's name for it (its first objective is the step time)
best_feasible_step = best_feasible_value


def _evaluate_and_tell(study: optuna.Study, trials: list[optuna.Trial], problem: Problem, pending: Path,
                       part_dir: Path, name: str) -> Path | None:
    """One batch: evaluate, write its Parquet part aside, tell every trial, then publish the part.

    Row ``i`` of the part is the prediction of trial ``trials[i]`` of its footer; a trial that breaks
    a validity rule, or whose prediction has no objective value, has no row and is told PRUNED with a
    violated constraint (module docstring)."""
    params = [t.params for t in trials]
    ids = problem.row_ids(params)
    cols, kept = problem.evaluate(ids)
    # the kept row ids are the valid ones of ids, in order (validity depends on the combination only)
    row_of: dict[int, int] = {}
    for trial, rid in zip(trials, ids):
        if len(row_of) < kept.shape[0] and kept[len(row_of)] == rid:
            row_of[trial.number] = len(row_of)
    outcomes = {number: problem.outcome(cols, row) for number, row in row_of.items()} if cols is not None else {}
    told = [number for number in row_of if outcomes[number].values is not None]
    staged = None
    if told:
        rows = np.array([row_of[number] for number in told], dtype=np.int64)
        part = cols if len(told) == len(row_of) else {k: np.ascontiguousarray(v[rows]) for k, v in cols.items()}
        staged = pending / f"part-{int(time.time() * 1e6)}-{trials[0].number}.parquet{PENDING}"
        problem.write_part(staged, part, {"paraspace.study": {"name": name, "trials": told, **problem.question}})
    for trial, rid in zip(trials, ids):
        trial.set_user_attr("row_id", int(rid))
        outcome = outcomes.get(trial.number)
        if outcome is None:  # breaks a validity rule: no prediction, a violated constraint, PRUNED
            _set_fits(trial, 1.0)
            trial.set_user_attr("feasible", False)
            trial.set_user_attr("rule", problem.broken_rule(int(rid)))
            study.tell(trial, state=TrialState.PRUNED)
            continue
        _set_fits(trial, outcome.fits)
        for key, value in outcome.attrs.items():
            trial.set_user_attr(key, value)
        if outcome.values is None:  # a prediction without an objective value (module doc)
            study.tell(trial, state=TrialState.PRUNED)
            continue
        study.tell(trial, outcome.values)
    if staged is None:
        return None
    ensure_folder(part_dir)
    final = part_dir / staged.name.removesuffix(PENDING)
    os.replace(staged, final)
    return final


def _set_fits(trial: optuna.Trial, value: float) -> None:
    """The trial's constraint values where ``constraints_func`` stores them; set before the tell,
    so that no sampler sees the finished trial without them."""
    trial.storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [float(value)])


class _Retry(optuna.storages.RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a stale trial (a WAITING copy with the same parameters, ``failed_trial``
    and ``retry_history`` system attributes), minus constraint values set before the worker died:
    the retry sets its own. Counts the stale trials it was handed."""

    def __init__(self, max_retry: int | None) -> None:
        super().__init__(max_retry=max_retry)
        self.count = 0

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trial = copy.deepcopy(trial)
        trial.system_attrs = {k: v for k, v in trial.system_attrs.items() if not k.startswith("constraints")}
        self.count += 1
        super().__call__(study, trial)


@contextlib.contextmanager
def _optuna_quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        # heartbeats with ask/tell are deliberate here (see _Heartbeat); the retry callback,
        # fail_stale_trials and set_metric_names are marked experimental
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


class _Heartbeat:
    """Optuna's heartbeat for a batch told with ask/tell. ``Study.optimize`` runs one heartbeat thread
    per trial (``optuna.storages._heartbeat.HeartbeatThread``); here one thread beats for every trial of
    the batch in flight, each beating first right after its ask (``RDBStorage.record_heartbeat``: a trial
    that never beat is never stale). A no-op without an RDB storage."""

    def __init__(self, storage: optuna.storages.RDBStorage | None, interval_s: float) -> None:
        self.storage, self.interval_s = storage, interval_s
        self._ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paraspace-heartbeat", daemon=True)

    def __enter__(self) -> Self:
        if self.storage is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self, trial: optuna.Trial) -> None:
        if self.storage is not None:  # the storage's trial id, as Optuna's HeartbeatThread is given it
            self.storage.record_heartbeat(trial._trial_id)
            with self._lock:
                self._ids.add(trial._trial_id)

    def clear(self) -> None:
        with self._lock:
            self._ids.clear()

    def _run(self) -> None:
        assert self.storage is not None
        while not self._stop.wait(self.interval_s):
            with self._lock:
                ids = list(self._ids)
            for trial_id in ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception as exc:  # noqa: BLE001 - a missed beat is retried next interval
                    _log.warning("heartbeat of trial id %d failed: %s", trial_id, exc)


class _Worker:
    """This process's claim on the trials it has asked and not yet told.

    ``ROOT/TOKEN.lock`` is flock-ed for the process's lifetime (the kernel drops the lock when the process
    dies, SIGKILL included; after a power loss nothing holds it); ``ROOT/TOKEN.trials`` lists the numbers of
    the batch in flight, one a line, each appended right after its ask; ``ROOT/TOKEN/`` holds the batch's
    Parquet part until all its trials are told.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.pending = root / self.token
        self.numbers: list[int] = []
        self._fd: int | None = None
        self._trials: Any = None
        self.clean = True
        self._made: list[Path] = []
        #: the study opened (its storage answered): from then on the folders are the study's
        self.started = False

    def __enter__(self) -> Self:
        with writing(self.root.parent, what="a folder"):  # the study's --out: its first files are these
            # the folders this start creates, outermost first: a start that fails leaves none behind
            self._made = [p for p in (*reversed(self.root.parents), self.root) if not p.exists()]
            self.root.mkdir(parents=True, exist_ok=True)
            # locked under a private name, then renamed: a visible lock file is always held by a live worker
            making = self.root / f".{self.token}.making"
            self._fd = os.open(making, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(making, self.root / f"{self.token}.lock")
            self.pending.mkdir()
            self._trials = open(self.root / f"{self.token}.trials", "w")
        return self

    def begin(self) -> None:
        """A new batch: every trial of the previous one is told."""
        self._trials.seek(0)
        self._trials.truncate()
        self.numbers.clear()

    def own(self, number: int) -> None:
        self._trials.write(f"{number}\n")
        self._trials.flush()
        self.numbers.append(number)

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self._trials.close()
        if self.clean:  # else leave the claim for the next start to reclaim (the lock dies with us)
            (self.root / f"{self.token}.trials").unlink(missing_ok=True)
            shutil.rmtree(self.pending, ignore_errors=True)
            (self.root / f"{self.token}.lock").unlink(missing_ok=True)
        os.close(self._fd)
        if kind is not None and not self.started:  # a start refused (its --storage): the folders it made, if empty
            for folder in reversed(self._made):
                try:
                    folder.rmdir()
                except OSError:  # another worker's files, or this run's results: kept
                    break


def _try_lock(path: Path) -> int | None:
    """An fd holding ``path``'s lock if its worker is dead, else None (alive, or the file is gone)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


class _DeadWorkers:
    """The other workers on this results folder: the live ones (their lock is held) counted, the dead
    ones' locks taken for as long as this is open, so that one starting worker alone reclaims them."""

    def __init__(self, me: _Worker) -> None:
        self.me = me
        self.live = 0
        self.dead: list[tuple[str, int]] = []  # (token, held lock fd or -1 when its lock file is gone)

    def __enter__(self) -> Self:
        tokens = {p.name.removesuffix(".lock").removesuffix(".trials") for p in self.me.root.iterdir()
                  if not p.name.startswith(".")} - {self.me.token}
        for token in sorted(tokens):
            lock = self.me.root / f"{token}.lock"
            fd = _try_lock(lock) if lock.exists() else -1  # no lock file: its worker is gone
            if fd is None:
                self.live += 1
            else:
                self.dead.append((token, fd))
        return self

    def __exit__(self, *exc: object) -> None:
        for _, fd in self.dead:
            if fd >= 0:
                os.close(fd)

    def reclaim(self, study: optuna.Study, part_dir: Path, retry: _Retry, journal: bool) -> None:
        """Fail and queue again the trials dead workers left RUNNING; settle their Parquet parts."""
        root = self.me.root
        for token, _ in self.dead:
            _fail_and_retry(study, _read_numbers(root / f"{token}.trials"), retry)
            _settle(study, root / token, part_dir)
            shutil.rmtree(root / token, ignore_errors=True)
            (root / f"{token}.trials").unlink(missing_ok=True)
            (root / f"{token}.lock").unlink(missing_ok=True)
        if journal and not self.live and fcntl is not None:
            # killed between creating a trial and the line that claims it: no live worker can own it
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            _fail_and_retry(study, [t.number for t in running], retry)


def _release_stale_journal_lock(journal: Path) -> None:
    """Optuna's journal lock (``JournalFileSymlinkLock``, a symlink beside the file) outlives a worker
    killed while appending; others would wait its 30 s grace period before breaking it. With no live
    worker on the folder, it is stale now: released the way the lock releases itself."""
    from optuna.storages.journal import JournalFileSymlinkLock

    if os.path.lexists(f"{journal}.lock"):
        with contextlib.suppress(RuntimeError):  # someone else released it first
            JournalFileSymlinkLock(str(journal)).release()
        _log.warning("released the journal lock %s.lock left by a dead worker", journal)


def _give_back(study: optuna.Study, worker: _Worker, part_dir: Path, retry: _Retry) -> None:
    try:
        _fail_and_retry(study, worker.numbers, retry)
        _settle(study, worker.pending, part_dir)
    except BaseException as exc:  # the next start reclaims what is left (its claim stays on disk)
        worker.clean = False
        if not isinstance(exc, Exception):  # a second Ctrl-C or SIGTERM cut the give-back short: stop now
            raise
        _log.warning("could not give back the interrupted batch (the next start will): %s", exc)


def _read_numbers(path: Path) -> list[int]:
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return []
    return [int(line) for line in lines if line.strip().isdigit()]  # a torn last line is skipped


def _fail_and_retry(study: optuna.Study, numbers: list[int], retry: _Retry) -> None:
    """Fail each RUNNING trial of ``numbers`` and queue its parameters again, as
    ``optuna.storages.fail_stale_trials`` does with a stale trial: only the worker whose FAIL lands retries."""
    running = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    for number in numbers:
        trial = running.get(number)
        if trial is None:
            continue
        try:
            study.tell(number, state=TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):  # another worker got there first
            continue
        retry(study, trial)


def _settle(study: optuna.Study, pending: Path, part_dir: Path) -> None:
    """Publish what a dead or interrupted worker's staged Parquet parts hold for trials it did tell."""
    if not pending.is_dir():
        return
    for path in sorted(pending.iterdir()):
        if path.name.endswith(PENDING):
            table = pq.read_table(path)
            meta = dict(table.schema.metadata or {})
            info = json.loads(read_metadata(path)["paraspace.study"])  # a footer key, added at close
            states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
            if len(info["trials"]) != table.num_rows:  # staged before parts listed one trial per row
                _log.warning("dropped %s: staged by an older paraspace, its rows cannot be matched to trials; "
                             "their parameters stay in the study", path)
                path.unlink()
                continue
            keep = [states.get(n) == TrialState.COMPLETE for n in info["trials"]]  # row i is trial trials[i]
            told = [n for n, k in zip(info["trials"], keep) if k]
            table = table.filter(pa.array(keep, type=pa.bool_()))
            if table.num_rows:
                meta[b"paraspace.study"] = json.dumps({**info, "trials": told}, sort_keys=True).encode()
                part_dir.mkdir(parents=True, exist_ok=True)
                final = part_dir / path.name.removesuffix(PENDING)
                tmp = partial_path(final)
                try:
                    pq.write_table(table.replace_schema_metadata(meta), tmp, compression="zstd")
                    os.replace(tmp, final)
                finally:  # gone once renamed; else (an error, Ctrl-C or SIGTERM) no staged part stays
                    tmp.unlink(missing_ok=True)
        path.unlink()


def _open_study(name: str, open_storage: Callable[[], Any], directions: list[str],
                sampler: optuna.samplers.BaseSampler, url: str | None) -> optuna.Study:
    """Create or join the study. Workers started together on a fresh database race
    to create Optuna's tables and the study; the loser retries and joins. A database
    that still refuses afterwards is the ``--storage`` URL's error (``url``)."""
    from sqlalchemy.exc import SQLAlchemyError

    if url is not None:
        _check_connects(url)
    for attempt in range(5):
        try:
            return optuna.create_study(study_name=name, storage=open_storage(), directions=directions,
                                       sampler=sampler, load_if_exists=True)
        except (SQLAlchemyError, optuna.exceptions.DuplicatedStudyError):
            time.sleep(0.5 * (attempt + 1))
    try:
        return optuna.create_study(study_name=name, storage=open_storage(), directions=directions, sampler=sampler,
                                   load_if_exists=True)
    except SQLAlchemyError as err:  # still failing after the retries: the database itself
        raise _refused(url, err) from None


def _check_connects(url: str) -> None:
    """Refuse at once a database that takes no connection (a SQLite file in a folder that does
    not exist, a server that is not listening): waiting out ``_open_study``'s retries, meant for
    workers racing to create the tables, cannot help it (it took 7.5 s to say so)."""
    import sqlalchemy
    from sqlalchemy.exc import SQLAlchemyError

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as err:
        raise _refused(url, err) from None
    finally:
        engine.dispose()


def _refused(url: str | None, err: Exception) -> CatalogError:
    """The ``--storage`` error of a database that refuses its connection or its tables."""
    return CatalogError("command line", "--storage", url, "a database that accepts connections "
                        f"({type(err).__name__}: {str(err).splitlines()[0]})")


def _check_objective(study: optuna.Study, problem: Problem, where: str | Path) -> None:
    """Refuse to resume ``study`` for another objective than the one it was created with
    (other directions, or other metrics): Optuna would only warn, then fail every new trial
    told with the wrong number of values. A ``CatalogError`` naming the study, both objectives."""
    stored = [d.name.lower() for d in study.directions]
    names = study.metric_names  # None: created by a run that stopped before naming them
    if stored == problem.directions and (names is None or list(names) == problem.metric_names):
        return
    raise CatalogError(where, f"study {study.study_name!r}: --objective",
                       _objective_text(problem.directions, problem.metric_names),
                       f"the objective the study was created with, {_objective_text(stored, names)} (resume it "
                       "with that --objective, or give another --study-name)")


def _check_space(study: optuna.Study, problem: Problem, where: str | Path) -> None:
    """Refuse to resume ``study`` over other dimensions than its trials were asked with (a space
    whose values changed, or another space under the same --study-name): Optuna would fail the
    first trial asked ("CategoricalDistribution does not support dynamic value space"), leaving
    it behind, and its Parquet parts would mix two spaces. A ``CatalogError`` naming the study,
    the first dimension that differs and both lists, before any trial is asked."""
    stored: dict[str, list[Any]] = {}
    # finished trials only: a RUNNING one (a worker killed, or still busy, while suggesting) may hold some params
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        for key, dist in trial.distributions.items():
            if key not in stored and isinstance(dist, optuna.distributions.CategoricalDistribution):
                stored[key] = list(dist.choices)
    if not stored:  # no trial asked yet: nothing to differ from
        return
    for key in [*problem.space, *(k for k in stored if k not in problem.space)]:
        mine, theirs = problem.space.get(key), stored.get(key)
        if mine != theirs:
            asked = ("no such dimension: the study's trials were asked without it" if theirs is None
                     else f"{theirs}, the values the study's trials were asked with")
            raise CatalogError(where, f"study {study.study_name!r}: dimensions.{key}",
                               MISSING if mine is None else mine,
                               f"{asked} (the space {problem.name} changed, or is not the one this study searched: "
                               "give another --study-name, or restore the space)")


#: each entry of ``Problem.question``: the option that sets it, what it is, and its value as a refusal shows it
#: (from the entry and the space's name)
QUESTION: dict[str, tuple[str, str, Callable[[Any, str], str]]] = {
    "space_sha256": ("SPACE", "the space definition",
                     lambda digest, name: f"{name} (sha256 {str(digest)[:12]})"),
    "mem_cap_bytes": ("--max-mem", "the memory cap",
                      lambda cap, _: "none" if cap is None else f"{cap / 1024**3:g} GiB"),
    "simulate": ("--simulate/--no-simulate", "the simulation setting",
                 lambda simulate, _: "--simulate" if simulate else "--no-simulate"),
}


def _check_question(study: optuna.Study, problem: Problem, where: str | Path) -> None:
    """Refuse to resume ``study`` for another question than the one it was created with
    (``Problem.question``: another space definition with the same dimensions, such as another
    model; another --max-mem; another --simulate): its trials and Parquet parts would mix two
    problems, and its best be either's. A ``CatalogError`` naming the study, what differs and
    both values, before any trial is asked. A study without them (a first run, or one made by
    an older paraspace) records them as its user attributes, with the space's name."""
    stored = study.user_attrs
    for key, mine in problem.question.items():
        if key in stored and stored[key] != mine:
            option, what, shown = QUESTION[key]
            theirs = shown(stored[key], stored.get("space", "another space"))
            raise CatalogError(where, f"study {study.study_name!r}: {option}", shown(mine, problem.name),
                               f"{what} the study was created with, {theirs} (resume it with that {option}, or "
                               "give another --study-name)")
    for key, value in {"space": problem.name, **problem.question}.items():
        if key not in stored:
            study.set_user_attr(key, value)


def _objective_text(directions: list[str], metrics: list[str] | None) -> str:
    """``["maximize"], ["x"]`` as "maximize x"; unnamed metrics as "value 0", ..."""
    metrics = metrics or [f"value {i}" for i in range(len(directions))]
    return " and ".join(f"{d} {m}" for d, m in zip(directions, metrics, strict=True))


def _constraint(trial: optuna.trial.FrozenTrial) -> list[float]:
    """The constraint values a trial was told with (1.0 when it has none)."""
    values = getattr(trial, "constraints", None)
    if isinstance(values, dict):
        return list(values.values()) or [1.0]
    return list(values) if values else [1.0]


__all__ = ["OBJECTIVES", "SAMPLERS", "Outcome", "Problem", "StudySummary", "TrainingProblem", "optimise", "run_study",
           "search_space"]
