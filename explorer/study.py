"""``paraspace study``: Optuna searches a space too large to enumerate.

The Optuna search space is the TOML space's own dimensions (a categorical
distribution over each dimension's values; an omitted dp stays derived, as in
a sweep). Trials are asked in batches so the kernels see arrays: each batch is
encoded with the sweep's validity rules and evaluated by the same analytic and
event tiers, then told back. Infeasible candidates (a broken rule, or peak
memory over the cap) are constraint violations (``constraints_func``), never
exceptions (``Trial.set_constraint``, Optuna 5's replacement for
``constraints_func``, which TPE and NSGA-II honour). Objectives: step time and peak memory (multi-objective), or step
time alone. Storage defaults to a journal file in the results folder, so a
study resumes after a crash or Ctrl-C; any Optuna storage URL (an RDB such as
PostgreSQL) lets many processes share one study. Every trial's metrics row is
written to Parquet with the sweep's schema, one part file per batch, so
studies and sweeps are analysed the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from explorer.evaluate import pack
from explorer.sweep import enum_labels, evaluate_encoded, provenance, result_schema, column_docs
from results.writer import ResultWriter, to_arrow
from spaces.catalog import LoadedSpace
from spaces.encode import DIMENSIONS, Encoder
from spaces.enums import labels

SAMPLERS = ("tpe", "nsga2", "random", "grid")
OBJECTIVES = ("time-memory", "time")
#: objective values told for a combination that breaks a rule (it has no prediction)
PENALTY = 1e30
#: the one constraint: > 0 when a rule is broken (1) or memory exceeds the cap (relative excess)
CONSTRAINT = "fits"


@dataclass
class StudySummary:
    study_name: str
    n_trials_total: int
    n_new: int
    best: list[dict[str, Any]]
    parts: list[Path]
    seconds: float


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


def make_sampler(name: str, seed: int | None, space: dict[str, list[Any]]) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.GridSampler(space, seed=seed)


def default_storage(out_dir: Path, study_name: str) -> optuna.storages.BaseStorage:
    from optuna.storages.journal import JournalFileBackend

    out_dir.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(out_dir / f"{study_name}.journal")))


def run_study(loaded: LoadedSpace, *, n_trials: int, out_dir: Path, study_name: str | None = None,
              storage: str | None = None, sampler: str = "tpe", objective: str = "time-memory",
              max_mem_gib: float | None = None, batch: int = 64, timeout_s: float | None = None,
              seed: int | None = 0) -> StudySummary:
    encoder = Encoder(loaded)
    packed = pack(loaded)
    space = search_space(encoder)
    name = study_name or loaded.spec.name
    directions = ["minimize", "minimize"] if objective == "time-memory" else ["minimize"]
    study = _open_study(name, storage or default_storage(out_dir, name), directions, make_sampler(sampler, seed, space))
    cap = max_mem_gib * 1024**3 if max_mem_gib is not None else loaded.hardware.device.hbm_capacity_bytes
    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
    labels_, table_schema = enum_labels(), result_schema()
    parts: list[Path] = []
    began = time.perf_counter()
    done = 0
    while done < n_trials and (timeout_s is None or time.perf_counter() - began < timeout_s):
        trials = [study.ask(distributions) for _ in range(min(batch, n_trials - done))]
        params = [t.params for t in trials]
        ids = encoder.row_ids(_positions(encoder, params, space))
        enc = encoder.encode_ids(ids)
        kept = {int(r): i for i, r in enumerate(enc.columns["row_id"])}
        cols = evaluate_encoded(packed, enc) if enc.n_rows else None
        for trial, rid in zip(trials, ids):
            row = kept.get(int(rid))
            if row is None:  # breaks a validity rule: a constraint violation, no prediction
                trial.set_constraint(CONSTRAINT, 1.0)
                trial.set_user_attr("row_id", int(rid))
                study.tell(trial, [PENALTY] * len(directions))
                continue
            step, mem = float(cols["step_time_s"][row]), float(cols["mem_peak_bytes"][row])
            trial.set_constraint(CONSTRAINT, (mem - cap) / cap)
            trial.set_user_attr("row_id", int(rid))
            study.tell(trial, [step, mem] if len(directions) == 2 else [step])
        if cols is not None and enc.n_rows:
            part = out_dir / name / f"part-{int(time.time() * 1e6)}-{trials[0].number}.parquet"
            with ResultWriter(part, table_schema, provenance(loaded), column_docs()) as writer:
                writer.write(to_arrow(cols, table_schema, labels_))
                writer.close({"paraspace.study": {"name": name, "trials": [t.number for t in trials]}})
            parts.append(part)
        done += len(trials)
    feasible = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
                and max(_constraint(t), default=1.0) <= 0]
    best = sorted(feasible, key=lambda t: t.values[0])[:5]
    return StudySummary(
        study_name=name, n_trials_total=len(study.trials), n_new=done,
        best=[{"trial": t.number, "step_time_s": t.values[0], **t.params, "row_id": t.user_attrs["row_id"]}
              for t in best],
        parts=parts, seconds=time.perf_counter() - began,
    )


def _open_study(name: str, storage: Any, directions: list[str], sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create or join the study. Workers started together on a fresh database race
    to create Optuna's tables and the study; the loser retries and joins."""
    from sqlalchemy.exc import SQLAlchemyError

    for attempt in range(5):
        try:
            return optuna.create_study(study_name=name, storage=storage, directions=directions, sampler=sampler,
                                       load_if_exists=True)
        except (SQLAlchemyError, optuna.exceptions.DuplicatedStudyError):
            time.sleep(0.5 * (attempt + 1))
    return optuna.create_study(study_name=name, storage=storage, directions=directions, sampler=sampler,
                               load_if_exists=True)


def _constraint(trial: optuna.trial.FrozenTrial) -> list[float]:
    """The constraint values a trial was told with (1.0 when it has none)."""
    values = getattr(trial, "constraints", None)
    if isinstance(values, dict):
        return list(values.values()) or [1.0]
    return list(values) if values else [1.0]


__all__ = ["OBJECTIVES", "SAMPLERS", "StudySummary", "run_study", "search_space"]
