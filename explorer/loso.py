"""Leave-one-source-out (LOSO) accuracy of ``paraspace validate`` on training and inference rows.

The headline error of a model whose knobs are fitted on published runs is how it
does on a source it was not fitted on. For each source of ``training.csv``, the
calibrated knobs of ``explorer.fit_published`` (per GPU family: ``gemm_max_efficiency``
and ``attention_efficiency_flash1``) are fitted on every other source and that
source is predicted with them; the in-sample figure (the catalog profiles, fitted
on all sources) is reported beside it.

To make this a minute rather than an hour, each row is predicted once per point
of a coarse knob grid (``COARSE``: its whole search of unknown fields at each
point), and its step time between the points is interpolated linearly in
log(time) over log(knob) on the fine grid the fit searches (``FINE``): step
time falls smoothly as an efficiency rises (roughly as its inverse where that
knob's kernel dominates). The fit is ``explorer.fit_published``'s criterion, the mean
over fit sources of each source's mean absolute error on its ``ok`` dense rows,
minimised here exhaustively over the fine grid instead of by coordinate descent.
A family none of whose other sources is in the fit set takes the knobs fitted on
the other sources of every family. Nothing is keyed on a row, model or source
beyond which rows are left out.

Inference rows (``inference_run``): their predictions read only knobs fitted on
``training.csv`` (``INFERENCE_KNOBS``), so an inference source is always left out
of the fit already, and its leave-one-source-out error is its in-sample one.
"""

from __future__ import annotations

import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from paraspace.explorer import fit_published, validate

KNOBS = ("gemm_max_efficiency", "attention_efficiency_flash1")
#: knob values each row is predicted at
COARSE = {"gemm_max_efficiency": (0.40, 0.50, 0.60, 0.70, 0.85),
          "attention_efficiency_flash1": (0.10, 0.18, 0.28, 0.40, 0.50)}
#: knob values the fit chooses among (interpolated from COARSE)
FINE = {k: tuple(float(x) for x in np.round(np.linspace(v[0], v[-1], 19), 4)) for k, v in COARSE.items()}


@dataclass(frozen=True)
class Surfaces:
    """Per row: its family's index (-1: no fitted family) and its predicted step
    time at every FINE knob pair (rows x len(FINE gemm) x len(FINE flash1))."""

    family: np.ndarray
    seconds: np.ndarray


def interpolate(coarse: np.ndarray, xs: tuple[float, ...], fine: tuple[float, ...], axis: int) -> np.ndarray:
    """``coarse`` sampled at knob values ``xs`` along ``axis``, at ``fine`` values:
    linear in log(time) over log(knob), flat outside."""
    lx, lf = np.log(xs), np.log(fine)
    moved = np.moveaxis(np.log(coarse), axis, -1)
    out = np.empty(moved.shape[:-1] + (len(fine),))
    for idx in np.ndindex(*moved.shape[:-1]):
        out[idx] = np.interp(lf, lx, moved[idx])
    return np.exp(np.moveaxis(out, -1, axis))


def _predict(args: tuple[list[dict], str, dict[str, dict[str, float]]]) -> list[float]:
    results = fit_published.predict_all(*args)
    return [r.predicted if r.predicted is not None else np.nan for r in results]


def surfaces(rows: list[dict], path: str, workers: int = 2, on_job: Any = None) -> Surfaces:
    """Predict ``rows`` at every COARSE knob pair of their family, then interpolate onto
    FINE; ``on_job(done, total)`` hears each (knob pair, worker slice) as it finishes."""
    families = list(fit_published.FAMILIES)
    family = np.array([next((i for i, f in enumerate(families) if r.get("gpu") in fit_published.FAMILIES[f]), -1)
                       for r in rows])
    pairs = list(product(COARSE[KNOBS[0]], COARSE[KNOBS[1]]))
    coarse = np.full((len(rows), len(pairs)), np.nan)
    profiles = [p for f in families for p in fit_published.FAMILIES[f]]
    jobs = []
    for g, a in pairs:
        update = {p: {KNOBS[0]: g, KNOBS[1]: a} for p in profiles}
        jobs += [(rows[i::workers], path, update) for i in range(workers)]
    # spawned, not forked: the parent has run numba's OpenMP threads already
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_predict, job) for job in jobs]
        for done, _ in enumerate(as_completed(futures), start=1):
            if on_job is not None:
                on_job(done, len(futures))
        parts = [f.result() for f in futures]
    for j in range(len(pairs)):
        for i in range(workers):
            coarse[i::workers, j] = parts[j * workers + i]
    cube = coarse.reshape(len(rows), len(COARSE[KNOBS[0]]), len(COARSE[KNOBS[1]]))
    cube = interpolate(cube, COARSE[KNOBS[0]], FINE[KNOBS[0]], axis=1)
    cube = interpolate(cube, COARSE[KNOBS[1]], FINE[KNOBS[1]], axis=2)
    return Surfaces(family=family, seconds=cube)


def fit_index(seconds: np.ndarray, measured: np.ndarray, sources: np.ndarray,
              prior: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The knob grid point minimising the mean over sources of each source's mean
    absolute error (``fit_published.source_score``) of ``seconds`` (rows x grid...).
    Among equally good points (a knob no fit row exercises: flash1 without a
    flash1 source) the one nearest ``prior``, the knob's value before fitting."""
    ape = np.abs(seconds / measured.reshape((-1,) + (1,) * (seconds.ndim - 1)) - 1.0)
    with warnings.catch_warnings():  # a grid point no row of a source could be predicted at: NaN, skipped
        warnings.simplefilter("ignore", RuntimeWarning)
        per_source = [np.nanmean(ape[sources == s], axis=0) for s in np.unique(sources)]
        score = np.nanmean(np.stack(per_source), axis=0)
    best = np.argwhere(score <= np.nanmin(score) + 1e-12)
    if prior is not None:
        best = best[np.argsort(np.abs(best - np.array(prior)).sum(axis=1), kind="stable")]
    return tuple(int(i) for i in best[0])


def leave_one_source_out(family: np.ndarray, seconds: np.ndarray, measured: np.ndarray, sources: np.ndarray,
                         fit_rows: np.ndarray, priors: dict[int, tuple[int, ...]] | None = None) -> np.ndarray:
    """Each row's step time with its family's knobs fitted on the ``fit_rows`` of
    every other source (``seconds``: rows x knob grid; ``family`` -1: a row no knob
    is fitted for, predicted at the grid point fitted on the other sources of all
    families). Rows of a family with no other source in the fit set take that pooled
    point too. ``priors``: per family, the grid point of its knobs before fitting
    (the tie-break of ``fit_index``)."""
    priors = priors or {}
    out = np.full(len(measured), np.nan)
    for held in np.unique(sources):
        train = fit_rows & (sources != held)
        if not train.any():
            continue
        for fam in np.unique(family[sources == held]):
            rows = (sources == held) & (family == fam)
            mine = train & (family == fam)
            pool = mine if fam >= 0 and mine.any() else train
            point = fit_index(seconds[pool], measured[pool], sources[pool], priors.get(int(fam)))
            out[rows] = seconds[(rows,) + point]
    return out


def knob_priors() -> dict[int, tuple[int, ...]]:
    """Per family (``fit_published.FAMILIES`` order), the FINE grid point of its knobs
    before fitting, ``fit_published``'s start: the profile's GEMM knob, and for FA1
    ``fit_published.flash1_prior`` of its FA2 efficiency (the tie-break of ``fit_index``
    where no fit row exercises FA1)."""
    priors = {}
    for i, name in enumerate(fit_published.FAMILIES):
        device = validate.load_hardware(fit_published.FAMILIES[name][0]).device
        start = (device.gemm_max_efficiency, fit_published.flash1_prior(device.attention_efficiency))
        priors[i] = tuple(int(np.argmin(np.abs(np.array(FINE[k]) - v))) for k, v in zip(KNOBS, start))
    return priors


def run(path: str, results: list[validate.RowResult], workers: int = 2, on_job: Any = None) -> list[float | None]:
    """LOSO step time of every training row of ``path`` (None where the row has no
    prediction); ``results`` are ``validate.run``'s, in the file's order; ``on_job``
    as in ``surfaces``."""
    rows = list(validate.read(path).iter_rows(named=True))
    keep = [i for i, r in enumerate(results) if r.status in ("ok", "oom")]
    surf = surfaces([rows[i] for i in keep], path, workers, on_job)
    measured = np.array([results[i].measured or np.nan for i in keep])
    sources = np.array([results[i].source for i in keep])
    fit_rows = np.array([results[i].status == "ok" and results[i].quality == "ok" and not rows[i].get("n_experts")
                         and surf.family[j] >= 0 for j, i in enumerate(keep)])
    held = leave_one_source_out(surf.family, surf.seconds, measured, sources, fit_rows, knob_priors())

    out: list[float | None] = [None] * len(results)
    for j, i in enumerate(keep):
        out[i] = None if np.isnan(held[j]) else float(held[j])
    return out


#: the calibrated device knobs (``explorer.fit_published``) that inference predictions
#: read: GEMM efficiency everywhere; attention runs the FlashAttention-2 class
#: (``explorer.evaluate.pack_hardware``'s default), so the FA1 knob is never read. The
#: per-iteration host time of the serving simulation (``validate.SERVING_HOST_US``) and
#: the memory efficiencies are documented values, not fitted on anything.
INFERENCE_KNOBS = ("gemm_max_efficiency",)


def fit_sources(training: str | Path) -> set[str]:
    """Sources whose rows ``explorer.fit_published`` fits the knobs on: the ``ok`` dense
    rows of ``training`` on a GPU of a fitted family."""
    profiles = {p for ps in fit_published.FAMILIES.values() for p in ps}
    return {r["source"] for r in validate.read(training).iter_rows(named=True)
            if r.get("quality") == "ok" and not r.get("n_experts") and r.get("gpu") in profiles}


def inference_run(path: str | Path, results: list[validate.RowResult],
                  training: str | Path | None = None) -> tuple[list[float | None], dict[str, str]]:
    """Leave-one-source-out predictions of an inference file's rows (``results``:
    ``validate.run``'s, in the file's order) and, per source, why they are what they are.

    The knobs inference reads (``INFERENCE_KNOBS``) are fitted on ``training`` (default:
    ``training.csv`` beside ``path``), never on inference rows. Leaving out an inference
    source that has no row in that fit leaves the fit set, hence the knobs, hence every
    prediction unchanged: its held-out prediction is its in-sample one, exactly. A
    source that does appear in the training fit would need the knobs refitted without
    it; that is not done here, so its rows get None with the reason, as does every row
    when the training file is missing (the fit set is then unknown)."""
    training = Path(training) if training is not None else Path(path).with_name("training.csv")
    sources = sorted({r.source for r in results})
    if not training.is_file():
        why = f"no {training.name} beside the file: the knobs' fit set is unknown"
        return [None] * len(results), {s: why for s in sources}
    fitted = fit_sources(training)
    notes = {}
    for s in sources:
        notes[s] = (f"in the {training.name} knob fit: refitting {', '.join(INFERENCE_KNOBS)} without it is not "
                    "implemented" if s in fitted else
                    f"not among the {training.name} sources {', '.join(INFERENCE_KNOBS)} is fitted on: the fit "
                    "without it is the fit, so leave-one-source-out equals in sample")
    held = [r.predicted if r.status in ("ok", "oom") and r.source not in fitted else None for r in results]
    return held, notes


def held_residuals(rows: list[dict], results: list[validate.RowResult], loso_seconds: list[float | None]
                   ) -> tuple[np.ndarray, list, np.ndarray]:
    """The residuals the uncertainty bands are fitted on (``explorer.bands``): r =
    log(measured / held-out prediction) of every ``ok`` row predicted (status ok)
    without its own source, with each row's band traits and source. ``rows`` are the
    file's, in ``results``' order."""
    from paraspace.explorer import bands

    use = [i for i, r in enumerate(results)
           if r.quality == "ok" and r.status == "ok" and loso_seconds[i] and r.measured]
    residuals = np.array([np.log(results[i].measured / loso_seconds[i]) for i in use])
    return (residuals, [bands.traits_of_row(rows[i]) for i in use],
            np.array([results[i].source for i in use]))


def band_coverage(rows: list[dict], results: list[validate.RowResult],
                  loso_seconds: list[float | None]) -> dict[str, float | int]:
    """``explorer.bands.coverage`` of the held-out residuals (``held_residuals``): the
    share of ``ok`` rows whose measured step time falls inside the 80% band fitted
    without their source (issue 14's target: 75-85%)."""
    from paraspace.explorer import bands

    residuals, traits, sources = held_residuals(rows, results, loso_seconds)
    return bands.coverage(residuals, traits, sources)


def summary(results: list[validate.RowResult], loso_seconds: list[float | None]) -> dict:
    """``validate.summary`` of the LOSO predictions (same rows, held-out step times)."""
    held = [validate.RowResult(**{**r.__dict__, "predicted": p}) for r, p in zip(results, loso_seconds)]
    return validate.summary(held)


__all__ = ["COARSE", "FINE", "INFERENCE_KNOBS", "band_coverage", "held_residuals", "inference_run",
           "leave_one_source_out", "run", "summary", "surfaces"]
