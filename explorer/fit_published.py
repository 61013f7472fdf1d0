"""Fit the hardware profiles' efficiency knobs to published training runs.

    python -m paraspace.explorer.fit_published ../shared/validation/training.csv

For each device family (a100: a100-sxm4-40gb/80gb; h100: h100/h800/h200, which
extend it), two knobs are fitted by coordinate descent over grids (two rounds),
each scored by the mean over the fit sources of each source's mean absolute
error on its ``ok`` rows (every source weighs the same, however many rows it
published; the target is per source too):

* ``gemm_max_efficiency``: the achieved fraction of the dense peak of a large,
  perfectly tiled GEMM (every row);
* ``attention_efficiency_flash1``: the achieved fraction of the 16-bit peak of
  first-generation fused attention (only rows whose ``attention`` column says
  ``flash1``; with none in the fit set it is not fitted).

Where no fit row exercises the first-generation kernel (a source left out is the
only one that ran it), ``attention_efficiency_flash1`` is not identified and keeps
its prior, ``flash1_prior``: half the FlashAttention-2 efficiency, the speed-up the
FlashAttention-2 paper reports (Dao 2023, arXiv:2307.08691, abstract: "around 2x
speedup compared to FlashAttention", 50-73% of the A100's peak against 25-40%).

The FlashAttention-2 ``attention_efficiency`` keeps its documented value (fitting
it as well drove it to the grid's floor, below anything FlashAttention-2
measures, and generalised worse); so do the memory efficiencies.

Generalisation is recorded by leave-one-source-out: each source's error with the
knobs fitted on the other sources only, beside its error under the final fit
(all fit sources). Sources not named by ``--fit-source`` (default: all) are only
ever held out. Nothing is keyed on a row, a model or a source beyond choosing
the fit set. Write the chosen values into the catalog TOMLs by hand, with the
printed record beside them.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from paraspace.explorer import validate
from paraspace.spaces import catalog
from paraspace.spaces.schema import Hardware

FAMILIES = {"a100": ("a100-sxm4-40gb", "a100-sxm4-80gb"),
            "h100": ("h100-sxm5-80gb", "h800-sxm5-80gb", "h200-sxm-141gb", "h100-sxm5-96gb-500w")}
#: the knobs fitted, in coordinate-descent order, with their grids
GRIDS = {
    "gemm_max_efficiency": tuple(float(g) for g in np.round(np.arange(0.40, 0.901, 0.025), 3)),
    "attention_efficiency_flash1": tuple(float(g) for g in np.round(np.arange(0.10, 0.501, 0.02), 3)),
}
ROUNDS = 2
#: FlashAttention-2's speed over the first-generation kernel (Dao 2023, arXiv:2307.08691,
#: abstract: "around 2x"; 50-73% of the A100's peak against FlashAttention's 25-40%)
FA2_SPEEDUP_OVER_FA1 = 2.0


def flash1_prior(fa2_efficiency: float) -> float:
    """``attention_efficiency_flash1`` before any flash1 row is fitted: the device's
    FlashAttention-2 efficiency over ``FA2_SPEEDUP_OVER_FA1``."""
    return fa2_efficiency / FA2_SPEEDUP_OVER_FA1


def predict_all(rows: list[dict], source: str, device_update: dict[str, dict[str, float]]) -> list[validate.RowResult]:
    """Predict ``rows`` with the named profiles' device fields replaced."""
    original: Callable[..., Hardware] = validate.load_hardware

    def patched(name: str, **kw: Any) -> Hardware:
        hw = original(name, **kw)
        update = device_update.get(name)
        return hw.model_copy(update={"device": hw.device.model_copy(update=update)}) if update else hw

    validate.load_hardware = patched
    try:
        return [validate.predict_training(r, source) for r in rows]
    finally:
        validate.load_hardware = original


def errors_by_source(results: Iterable[validate.RowResult]) -> dict[str, list[float]]:
    """Signed errors of the ``ok`` predictions of ``ok`` rows, per source."""
    out: dict[str, list[float]] = {}
    for r in results:
        if r.status == "ok" and r.quality == "ok" and r.error is not None:
            out.setdefault(r.source, []).append(r.error)
    return out


def _errors(args: tuple[list[dict], str, dict[str, dict[str, float]]]) -> dict[str, list[float]]:
    return errors_by_source(predict_all(*args))


def source_score(by_source: dict[str, list[float]]) -> float:
    """Mean over sources of each source's mean absolute error."""
    return float(np.mean([np.mean(np.abs(v)) for v in by_source.values()])) if by_source else float("nan")


def _merge(parts: Iterable[dict[str, list[float]]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).extend(v)
    return out


#: each grid point's rows go to the pool in this many slices (both processes work on every point)
SLICES = 2


def fitted_knobs(rows: list[dict]) -> list[str]:
    """The knobs ``rows`` exercise (FA1's only where a row ran it)."""
    return [k for k in GRIDS if k != "attention_efficiency_flash1" or any(r.get("attention") == "flash1" for r in rows)]


def fit_jobs(rows: list[dict]) -> int:
    """Pool jobs of one ``fit_knobs`` call on ``rows`` (for progress)."""
    return ROUNDS * SLICES * sum(len(GRIDS[k]) for k in fitted_knobs(rows))


class Progress:
    """Counts finished pool jobs against the total known up front; ``on_job(done, total)``."""

    def __init__(self, total: int, on_job: Callable[[int, int], object] | None) -> None:
        self.total, self.done, self.on_job = total, 0, on_job

    def step(self) -> None:
        self.done += 1
        if self.on_job is not None:
            self.on_job(self.done, self.total)


def fit_knobs(pool: ProcessPoolExecutor, rows: list[dict], path: str, profiles: tuple[str, ...],
              start: dict[str, float], progress: Progress | None = None) -> dict[str, float]:
    """Coordinate descent over ``GRIDS`` minimising ``source_score`` of ``rows``;
    a knob no row exercises keeps its ``start`` value."""
    chosen = dict(start)
    halves = [rows[i::SLICES] for i in range(SLICES)]
    for _ in range(ROUNDS):
        for knob in fitted_knobs(rows):
            jobs = [(half, path, {p: {**chosen, knob: g} for p in profiles}) for g in GRIDS[knob] for half in halves]
            parts = []
            for part in pool.map(_errors, jobs):
                parts.append(part)
                if progress is not None:
                    progress.step()
            scores = [(source_score(_merge(parts[i:i + SLICES])), g)
                      for i, g in zip(range(0, len(parts), SLICES), GRIDS[knob])]
            chosen[knob] = min(scores)[1]
    return chosen


def _fit_sets(rows: list[dict], fit_sources: set[str] | None) -> dict[str, tuple[list[dict], list[dict]]]:
    """Per family: its dense rows and those of them the knobs are fitted on."""
    out = {}
    for family, profiles in FAMILIES.items():
        mine = [r for r in rows if r.get("gpu") in profiles and not r.get("n_experts")]
        fit_rows = [r for r in mine if fit_sources is None or r["source"] in fit_sources]
        if fit_rows:
            out[family] = (mine, fit_rows)
    return out


def total_jobs(sets: dict[str, tuple[list[dict], list[dict]]]) -> int:
    """Pool jobs of a whole ``fit``: per family the fit on every fit row, then one per
    source held out (for a source that is not the only one)."""
    total = 0
    for mine, fit_rows in sets.values():
        total += fit_jobs(fit_rows)
        for source in sorted({r["source"] for r in mine}):
            others = [r for r in fit_rows if r["source"] != source]
            if others:
                total += fit_jobs(others)
    return total


def _summary(by_source: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"rows": len(v), "mape": float(np.mean(np.abs(v))), "signed": float(np.mean(v))}
            for k, v in sorted(by_source.items())}


def fit(path: str, fit_sources: set[str] | None = None, workers: int = 2,
        on_job: Callable[[int, int], object] | None = None) -> dict[str, Any]:
    """Per family: the fitted knobs, each source's error before / after the fit,
    and its leave-one-source-out error (``None`` for a source that is the only one).
    ``on_job(done, total)`` hears every finished pool job (a grid point's slice of rows)."""
    df = validate.read(path)
    rows = list(df.iter_rows(named=True))
    record: dict[str, Any] = {}
    sets = _fit_sets(rows, fit_sources)
    progress = Progress(total_jobs(sets), on_job)
    with ProcessPoolExecutor(workers) as pool:
        for family, (mine, fit_rows) in sets.items():
            profiles = FAMILIES[family]
            base = validate.load_hardware(profiles[0]).device
            start = {"gemm_max_efficiency": base.gemm_max_efficiency,
                     "attention_efficiency_flash1": flash1_prior(base.attention_efficiency)}
            chosen = fit_knobs(pool, fit_rows, path, profiles, start, progress)
            before = _summary(errors_by_source(predict_all(mine, path, {})))
            after = _summary(errors_by_source(predict_all(mine, path, {p: dict(chosen) for p in profiles})))
            held: dict[str, float | None] = {}
            for source in sorted({r["source"] for r in mine}):
                others = [r for r in fit_rows if r["source"] != source]
                if not others:
                    held[source] = None
                    continue
                knobs = fit_knobs(pool, others, path, profiles, start, progress)
                errs = errors_by_source(predict_all([r for r in mine if r["source"] == source], path,
                                                    {p: dict(knobs) for p in profiles}))
                held[source] = source_score(errs) if errs else None
            record[family] = {
                "knobs": {k: chosen[k] for k in GRIDS},
                "sources": {k: {"before": before.get(k), "after": v, "held_out_mape": held.get(k)}
                            for k, v in after.items()},
            }
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--fit-source", action="append", help="source key(s) to fit on (default: every source)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (it shows on a terminal only)")
    args = ap.parse_args()
    known = set(catalog.names("hardware"))
    assert all(p in known for ps in FAMILIES.values() for p in ps)
    from tqdm import tqdm

    # every pool job is one grid point's slice of rows: a second or two each on 2 cores
    with tqdm(unit="fit", desc="fitting knobs (all sources, then each left out)", leave=False, mininterval=0.5,
              disable=True if args.no_progress else None) as bar:
        def on_job(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        record = fit(args.file, set(args.fit_source) if args.fit_source else None, on_job=on_job)
    for family, r in record.items():
        print(f"{family}: " + ", ".join(f"{k} = {v}" for k, v in r["knobs"].items()))
        for source, e in r["sources"].items():
            was = f"{100 * e['before']['mape']:5.1f}%" if e["before"] else "    -"
            held = "   -" if e["held_out_mape"] is None else f"{100 * e['held_out_mape']:5.1f}%"
            print(f"  {source:<34} {e['after']['rows']:>3} ok rows: MAPE {was} -> {100 * e['after']['mape']:5.1f}%"
                  f" (signed {100 * e['after']['signed']:+.1f}%), fitted without it: {held}")


if __name__ == "__main__":
    main()
