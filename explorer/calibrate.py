"""Fit the hardware profiles' efficiency knobs to published training runs.

    python -m explorer.calibrate ../shared/validation/training.csv \\
        --fit-source mosaicml-llm-foundry

For each device family (a100: a100-sxm4-40gb/80gb; h100: h100/h800/h200, which
extend it), a grid over ``gemm_max_efficiency`` (the achieved fraction of the
dense peak of a large, perfectly tiled GEMM) is scored by the mean absolute
error of the family's ``ok`` rows from the fit sources only; the other knobs
keep their documented values (fitting attention efficiency as well drove it
to the grid's floor, below anything FlashAttention-2 measures, and
generalised worse to the held-out sources); the other sources are held out and reported separately, so the
record shows whether the fit generalises. Nothing is keyed on a row, a model or
a source beyond choosing the fit set. Write the chosen values into the catalog
TOMLs by hand, with the printed record beside them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from explorer import validate
from spaces import catalog
from spaces.schema import Hardware

FAMILIES = {"a100": ("a100-sxm4-40gb", "a100-sxm4-80gb"), "h100": ("h100-sxm5-80gb", "h800-sxm5-80gb",
                                                                  "h200-sxm-141gb")}
GEMM_GRID = tuple(float(g) for g in np.round(np.arange(0.40, 0.901, 0.05), 2))


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


def mape(results: Iterable[validate.RowResult]) -> tuple[float, float, int]:
    errs = [r.error for r in results if r.status == "ok" and r.quality == "ok" and r.error is not None]
    if not errs:
        return float("nan"), float("nan"), 0
    return float(np.mean(np.abs(errs))), float(np.mean(errs)), len(errs)


def fit(path: str, fit_sources: set[str]) -> dict[str, Any]:
    df = validate.read(path)
    rows = list(df.iter_rows(named=True))
    record: dict[str, Any] = {}
    for family, profiles in FAMILIES.items():
        mine = [r for r in rows if r.get("gpu") in profiles and not r.get("n_experts")]
        fit_rows = [r for r in mine if r["source"] in fit_sources]
        held_rows = [r for r in mine if r["source"] not in fit_sources]
        if not fit_rows:
            continue
        scores = [(mape(predict_all(fit_rows, path, {p: {"gemm_max_efficiency": g} for p in profiles}))[0], g)
                  for g in GEMM_GRID]
        gemm = min(scores)[1]
        update = {p: {"gemm_max_efficiency": gemm} for p in profiles}
        before_fit, before_held = mape(predict_all(fit_rows, path, {})), mape(predict_all(held_rows, path, {}))
        after_fit, after_held = mape(predict_all(fit_rows, path, update)), mape(predict_all(held_rows, path, update))
        record[family] = {
            "gemm_max_efficiency": gemm,
            "fit": {"rows": after_fit[2], "mape_before": before_fit[0], "mape_after": after_fit[0],
                    "signed_after": after_fit[1]},
            "held_out": {"rows": after_held[2], "mape_before": before_held[0], "mape_after": after_held[0],
                         "signed_after": after_held[1]},
        }
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--fit-source", action="append", required=True, help="source key(s) to fit on")
    args = ap.parse_args()
    known = set(catalog.names("hardware"))
    assert all(p in known for ps in FAMILIES.values() for p in ps)
    record = fit(args.file, set(args.fit_source))
    for family, r in record.items():
        print(f"{family}: gemm_max_efficiency = {r['gemm_max_efficiency']}")
        for part in ("fit", "held_out"):
            p = r[part]
            print(f"  {part:<9} {p['rows']:>3} ok rows: MAPE {100 * p['mape_before']:.1f}% -> {100 * p['mape_after']:.1f}%"
                  f" (signed {100 * p['signed_after']:+.1f}%)")


if __name__ == "__main__":
    main()
