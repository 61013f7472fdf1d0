"""``paraspace study`` on a serving space: Optuna over the serving dimensions.

The training study's loop, storage, workers and crash recovery
(``explorer.study.optimise``) with a serving ``Problem``:

* the search space is each serving dimension with more than one value
  (``spaces.serving.DIMENSIONS``; enum labels, bools, ints), a trial's
  combination its flat position in the space's product (``row_id``, as
  ``paraspace serve`` numbers it);
* a batch's valid combinations go through the analytic tier and, every one
  that the analytic tier finds runnable, through the iteration-level
  simulation (aggregated engines and whole disaggregated deployments,
  ``explorer.serve.evaluate_columns``), so p90 SLA targets are checked; with
  ``simulate`` off (``paraspace study --no-simulate``) the analytic tier's
  values stand, its p90s unknown (NaN, not checked), for spaces too big to
  simulate every trial of (the simulation is ~1,000x the analytic tier's cost);
* objectives: output tokens per second per GPU, maximised (``throughput``),
  or that and tokens per second per user (``throughput-user``: the two axes
  of ``paraspace pareto`` on a serving file);
* feasibility is one constraint value ``fits``, as the training study's:
  the largest relative excess over the SLA targets (value / target - 1 over
  the mean and p90 TTFT and TPOT targets the space sets; a p90 only where
  simulated) and, with ``--max-mem``, over the memory cap ((peak - cap) /
  cap); at most 0 when feasible. A row over the cap is written infeasible
  (``Feasible.MEMORY_CAP``), so ``paraspace top`` agrees with the study's
  best. A row the engines cannot sustain (Poisson overload) is told with its
  values and ``fits`` = 1. A row without a
  throughput (weights or a request do not fit the memory; a simulation that
  got stuck) has no objective value: it is told PRUNED with ``fits`` = 1 and
  its reason in the user attribute ``reason``, like a combination breaking a
  validity rule (``rule``), and has no Parquet row.

Every told trial's row is written to Parquet with ``paraspace serve``'s
schema (``results.serving_schema``), one part per batch, as the training
study writes the sweep's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from paraspace.explorer import serve
from paraspace.explorer.sweep import provenance, space_digest
from paraspace.explorer.study import GRACE_S, HEARTBEAT_S, Outcome, Problem, StudySummary, mark_over_cap, optimise
from paraspace.results import serving_schema as schema
from paraspace.results.writer import ResultWriter, to_arrow
from paraspace.spaces import serving as sp

OBJECTIVES = ("throughput", "throughput-user")
#: the columns of each objective, maximised
OBJECTIVE_COLUMNS = {"throughput": ["output_tokens_per_s_per_gpu"],
                     "throughput-user": ["output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user"]}
#: (metric column, its SLA target field) checked by the constraint
SLA_COLUMNS = (("ttft_s", "ttft_s"), ("ttft_p90_s", "ttft_p90_s"), ("tpot_s", "tpot_s"), ("tpot_p90_s", "tpot_p90_s"))
#: reasons whose rows carry no throughput: no objective value
NO_VALUE = (sp.Feasible.WEIGHTS_OOM, sp.Feasible.KV_TOO_SMALL)


def search_space(space: sp.LoadedServing) -> dict[str, list[Any]]:
    """Each serving dimension with more than one value, as Optuna sees it: the TOML's
    values (labels, bools, ints), in its order."""
    dims = space.spec.dimensions
    out: dict[str, list[Any]] = {}
    for name in sp.DIMENSIONS:
        raw = list(getattr(dims, name))
        if len(raw) < 2:
            continue
        if isinstance(raw[0], str):
            out[name] = [str(v) for v in raw]
        elif name in sp.BOOL_DIMENSIONS:
            out[name] = [bool(v) for v in raw]
        else:
            out[name] = [int(v) for v in raw]
    return out


class ServingProblem(Problem):
    """A serving space: throughput per GPU maximised subject to the SLA (module doc)."""

    def __init__(self, space: sp.LoadedServing, *, objective: str = "throughput",
                 max_mem_gib: float | None = None, simulate: bool = True) -> None:
        self.loaded = space
        self.simulate = simulate
        self.name = space.spec.name
        self.space = search_space(space)
        self.objective = OBJECTIVE_COLUMNS[objective]
        self.directions = ["maximize"] * len(self.objective)
        self.metric_names = list(self.objective)
        self.cap = max_mem_gib * 1024**3 if max_mem_gib is not None else None
        self.question = {"space_sha256": space_digest(space), "mem_cap_bytes": self.cap, "simulate": simulate}
        self.shape = tuple(len(getattr(space.spec.dimensions, n)) for n in sp.DIMENSIONS)
        self.packed = serve.pack_serving(space)
        self.schema = schema.arrow_schema()
        self.labels = serve.enum_columns()
        sla = space.spec.sla
        self.targets = [(column, getattr(sla, field)) for column, field in SLA_COLUMNS if getattr(sla, field)]

    def row_ids(self, params: list[dict[str, Any]]) -> np.ndarray:
        index = []
        for name, n in zip(sp.DIMENSIONS, self.shape):
            if name in self.space:
                position = {v: i for i, v in enumerate(self.space[name])}
                index.append(np.array([position[p[name]] for p in params], dtype=np.int64))
            else:
                index.append(np.zeros(len(params), dtype=np.int64))
        return np.ravel_multi_index(tuple(index), self.shape).astype(np.int64)

    def evaluate(self, ids: np.ndarray) -> tuple[dict[str, np.ndarray] | None, np.ndarray]:
        enc = sp.encode(self.loaded, ids)
        if enc.n_rows == 0:
            return None, enc.columns["row_id"]
        cols = enc.columns
        metrics = serve.evaluate_columns(self.loaded, cols, self.packed, simulate_top=enc.n_rows if self.simulate else 0)
        if self.cap is not None:  # feasible is reason == OK (explorer.serve)
            mark_over_cap(metrics, "reason", self.cap, int(sp.Feasible.MEMORY_CAP))
        return {**cols, **metrics, "infeasible_reason": metrics["reason"].astype(np.int8)}, cols["row_id"]

    def outcome(self, cols: dict[str, np.ndarray], row: int) -> Outcome:
        reason = sp.Feasible(int(cols["reason"][row]))
        attrs: dict[str, Any] = {"feasible": reason == sp.Feasible.OK, "reason": sp.enum_labels(sp.Feasible)[reason]}
        values = [float(cols[c][row]) for c in self.objective]
        if reason in NO_VALUE or not all(np.isfinite(values)):
            return Outcome(None, 1.0, attrs | {"feasible": False})
        excess = [float(cols[c][row]) / target - 1.0 for c, target in self.targets if np.isfinite(cols[c][row])]
        if self.cap is not None:
            excess.append((float(cols["mem_peak_bytes"][row]) - self.cap) / self.cap)
        fits = max(excess, default=-1.0)
        if reason == sp.Feasible.OVERLOADED:
            fits = max(fits, 1.0)
        elif reason != sp.Feasible.OK and fits <= 0.0:  # an SLA miss by less than the ratio's rounding
            fits = float(np.nextafter(0.0, 1.0))
        attrs["feasible"] = fits <= 0.0
        return Outcome(values, fits, attrs)

    def broken_rule(self, row_id: int) -> str:
        first = sp.encode(self.loaded, np.array([row_id], dtype=np.int64)).first_reason
        return sp.ServingReason(int(np.flatnonzero(first[1:])[0]) + 1).name.lower()

    def write_part(self, path: Path, cols: dict[str, np.ndarray], footer: dict[str, Any]) -> None:
        with ResultWriter(path, self.schema, provenance(self.loaded), schema.column_docs()) as writer:
            writer.write(to_arrow(cols, self.schema, self.labels))
            writer.close(footer)

    def best_entry(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return {"trial": trial.number, **dict(zip(self.objective, trial.values)), **trial.params,
                "row_id": trial.user_attrs["row_id"]}


def run_serving_study(space: sp.LoadedServing, *, n_trials: int, out_dir: Path, study_name: str | None = None,
                      storage: str | None = None, sampler: str = "tpe", objective: str = "throughput",
                      max_mem_gib: float | None = None, batch: int = 64, timeout_s: float | None = None,
                      seed: int | None = 0, heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S,
                      on_batch: Callable[[int, float | None], object] | None = None,
                      simulate: bool = True) -> StudySummary:
    """Run ``n_trials`` more trials of the named study of a serving space (module doc);
    ``on_batch`` hears the trials done and the best feasible throughput per GPU so far;
    ``simulate`` False keeps every trial at the analytic tier's values (module doc)."""
    return optimise(ServingProblem(space, objective=objective, max_mem_gib=max_mem_gib, simulate=simulate),
                    n_trials=n_trials,
                    out_dir=out_dir, study_name=study_name, storage=storage, sampler=sampler, batch=batch,
                    timeout_s=timeout_s, seed=seed, heartbeat_s=heartbeat_s, grace_s=grace_s, on_batch=on_batch)


__all__ = ["OBJECTIVES", "ServingProblem", "run_serving_study", "search_space"]
