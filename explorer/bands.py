"""Calibrated uncertainty bands on predicted step times.

A prediction's 80% band comes from the leave-one-source-out residuals of the
published training runs (``explorer.loso``): r = log(measured / predicted) of
every ``ok`` row predicted without its own source. The rows are grouped by what
they exercise, from the finest class to the coarsest:

1. dense or MoE x GPU family x pipelined or not x scale (up to 64 GPUs, more);
2. dense or MoE x GPU family;
3. dense or MoE;
4. all rows.

A prediction takes the finest class holding at least ``MIN_RESIDUALS``
residuals, and its band is [t exp(lo), t exp(hi)] of that class's residuals:
``step_time_lo_s`` and ``step_time_hi_s``.

lo and hi are split-conformal bounds (Lei, G'Sell, Rinaldo, Tibshirani,
Wasserman, "Distribution-free predictive inference for regression", JASA 2018,
section 2.2) over a CDF that weighs every source the same. Rows of one source
are not exchangeable with a new source's: they share its trainer, its cluster
and its way of reporting, so a source of 147 rows would otherwise set the band
every other source is judged by. Dunn, Wasserman and Ramdas ("Distribution-free
prediction sets for two-layer hierarchical models", JASA 2023, "CDF pooling")
pool the groups' empirical CDFs with equal weight: residual i of a class gets
weight w_i = 1 / (rows of its source in the class), normalised to sum 1, and
with W(x) the weight at or below x and W(x-) the weight below it,

  lo = the largest residual x with W(x-) <= (0.1 (n + 1) - 1) / n,
  hi = the smallest residual x with W(x) >= 0.9 (n + 1) / n   (the largest if none),

n the class's residual count. With equal weights these are the
floor((n + 1) 0.1)-th and ceil((n + 1) 0.9)-th smallest of the n, the plain
split-conformal order statistics under which a new residual exchangeable with
the class's falls between them with probability at least 80% for any n (plain
sample quantiles promise that only as n grows; with a dozen residuals they
undercover). The band table is data, written by ``tools/validation_report.py``
into ``spaces/catalog/bands/training.toml`` with its provenance; nothing in it
is keyed to a source, model or row: a source only sets its rows' weights.

Coverage is checked the same way the band is meant to be used, on a source it
was not fitted on: for each source, the table is fitted on the other sources'
residuals and applied to its LOSO predictions; ``coverage`` is the share of
rows whose measured time falls inside (target 75-85%).
"""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: the band's tails of log(measured / predicted): 10% below, 10% above (an 80% band)
QUANTILES = (0.10, 0.90)
#: fewest residuals a class needs before it gives a band of its own
MIN_RESIDUALS = 12
#: GPUs above which a run is "large" for the scale split
LARGE_SCALE_GPUS = 64
TABLE = Path(__file__).resolve().parents[1] / "spaces" / "catalog" / "bands" / "training.toml"


@dataclass(frozen=True)
class RowTraits:
    """What a prediction exercises, as the band classes see it."""

    moe: bool
    family: str
    pipelined: bool
    gpus: int


def family_of(hardware: str) -> str:
    """The calibration family of a catalog hardware name (``explorer.fit_published.FAMILIES``), else "other"."""
    from paraspace.explorer.fit_published import FAMILIES

    return next((f for f, names in FAMILIES.items() if hardware in names), "other")


def traits_of_row(row: dict[str, str | None]) -> RowTraits:
    """A validation row's traits from its columns."""
    return RowTraits(moe=bool(row.get("n_experts")), family=family_of(row.get("gpu") or ""),
                     pipelined=int(float(row.get("pp") or 1)) > 1, gpus=int(float(row.get("n_gpus") or 1)))


def class_keys(traits: RowTraits) -> tuple[str, ...]:
    """The row's classes, finest first, ending in "all"."""
    kind = "moe" if traits.moe else "dense"
    scale = "large" if traits.gpus > LARGE_SCALE_GPUS else "small"
    pipe = "pp" if traits.pipelined else "nopp"
    return (f"{kind}/{traits.family}/{pipe}/{scale}", f"{kind}/{traits.family}", kind, "all")


def conformal_bounds(residuals: list[float] | np.ndarray, weights: list[float] | np.ndarray | None = None
                     ) -> tuple[float, float]:
    """The split-conformal (lo, hi) of ``residuals`` under ``weights`` (module doc;
    None: equal, when they are the floor((n + 1) q10)-th and the ceil((n + 1) q90)-th
    of the n sorted, clipped to 1 .. n)."""
    xs = np.asarray(residuals, float)
    order = np.argsort(xs, kind="stable")
    xs = xs[order]
    n = xs.size
    w = np.ones(n) if weights is None else np.asarray(weights, float)[order]
    at_or_below = np.cumsum(w) / w.sum()
    below = at_or_below - w / w.sum()
    # the thresholds of the module doc, less a rounding allowance: with equal weights
    # W is k / n up to rounding and must meet a threshold it equals
    eps = 1e-9
    lo_level = (QUANTILES[0] * (n + 1) - 1) / n
    hi_level = QUANTILES[1] * (n + 1) / n
    lo = int(np.searchsorted(below, lo_level + eps, side="right")) - 1
    hi = int(np.searchsorted(at_or_below, hi_level - eps, side="left"))
    return float(xs[min(max(lo, 0), n - 1)]), float(xs[min(hi, n - 1)])


def source_weights(sources: list[str] | np.ndarray) -> np.ndarray:
    """Each row's weight in its class: 1 / the rows of its source there (module doc)."""
    _, inverse, counts = np.unique(np.asarray(sources), return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def fit(residuals: np.ndarray, traits: list[RowTraits], sources: list[str] | np.ndarray | None = None
        ) -> dict[str, tuple[float, float, int]]:
    """Per class with at least ``MIN_RESIDUALS`` residuals: (lo, hi, n),
    ``conformal_bounds`` with every source weighing the same (``sources`` None:
    each row its own source)."""
    labels = np.arange(len(residuals)).astype(str) if sources is None else np.asarray(sources)
    groups: dict[str, list[tuple[float, str]]] = {}
    for r, t, s in zip(residuals, traits, labels):
        if math.isfinite(r):
            for key in class_keys(t):
                groups.setdefault(key, []).append((float(r), str(s)))
    table = {}
    for key, members in sorted(groups.items()):
        if len(members) >= MIN_RESIDUALS or key == "all":
            xs, names = zip(*members)
            table[key] = (*conformal_bounds(xs, source_weights(names)), len(members))
    return table


def band(table: dict[str, tuple[float, float, int]], traits: RowTraits, seconds: float) -> tuple[float, float]:
    """``seconds``' 80% band from the finest class of ``traits`` the table holds."""
    for key in class_keys(traits):
        if key in table:
            lo, hi, _ = table[key]
            return seconds * math.exp(lo), seconds * math.exp(hi)
    raise KeyError("the band table has no 'all' class")


def band_factors(table: dict[str, tuple[float, float, int]], moe: bool, family: str, pipelined: np.ndarray,
                 gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the factors exp(q10) and exp(q90) of its class (rows of one space
    share moe and family; pipelining and scale vary by row)."""
    lo = np.empty(len(pipelined))
    hi = np.empty(len(pipelined))
    for pp in (False, True):
        for large in (False, True):
            rows = (pipelined == pp) & ((gpus > LARGE_SCALE_GPUS) == large)
            if rows.any():
                lo[rows], hi[rows] = band(table, RowTraits(moe, family, pp, LARGE_SCALE_GPUS + 1 if large else 1), 1.0)
    return lo, hi


@functools.cache
def committed() -> dict[str, tuple[float, float, int]]:
    """The committed band table, read once per process."""
    return load(TABLE)


def coverage(residuals: np.ndarray, traits: list[RowTraits], sources: np.ndarray) -> dict[str, float | int]:
    """Share of rows inside the band fitted without their source (see the module doc);
    a source no other source's residual can judge (it is the only one) is not counted."""
    inside = total = 0
    for held in np.unique(sources):
        mine = sources == held
        table = fit(residuals[~mine], [t for t, m in zip(traits, mine) if not m], sources[~mine])
        if "all" not in table:  # no other source has a residual: no band to judge this one by
            continue
        for r, t in zip(residuals[mine], [t for t, m in zip(traits, mine) if m]):
            if not math.isfinite(r):
                continue
            lo, hi = band(table, t, 1.0)
            total += 1
            inside += math.log(lo) <= r <= math.log(hi)
    return {"n": total, "coverage": inside / total if total else float("nan")}


def load(path: Path = TABLE) -> dict[str, tuple[float, float, int]]:
    """The committed band table (class -> (lo, hi, n), stored as q10 / q90)."""
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    return {k: (float(v["q10"]), float(v["q90"]), int(v["n"])) for k, v in data["classes"].items()}


def to_toml(table: dict[str, tuple[float, float, int]], provenance: str) -> str:
    """The band table as TOML (``tomli_w``), with its provenance as comments."""
    import tomli_w

    body = tomli_w.dumps({"classes": {k: {"q10": round(lo, 6), "q90": round(hi, 6), "n": n}
                                      for k, (lo, hi, n) in table.items()}})
    header = "".join(f"# {line}\n" for line in provenance.splitlines())
    return header + body


__all__ = ["RowTraits", "band", "band_factors", "committed", "class_keys", "conformal_bounds", "coverage", "family_of", "fit",
           "load", "source_weights", "to_toml", "traits_of_row"]
