"""``explorer.fit_published``: progress over its pool jobs, and the coordinate descent
it counts, on a stand-in prediction whose best knob is known.

The real fit predicts every row at every grid point (minutes); here ``predict_all``
is replaced by a closed form and the process pool by an in-process one, so the test
checks the bookkeeping: the total announced up front is the number of jobs that
finish, ``done`` climbs by one to it, and the descent lands on the known optimum.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from paraspace.explorer import fit_published

#: the stand-in's best gemm_max_efficiency: on the grid (0.40, 0.425, ..., 0.90)
BEST = 0.7


class InlinePool:
    def __init__(self, workers: int) -> None:
        self.workers = workers

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn, jobs):  # noqa: ANN001, ANN201 - ProcessPoolExecutor.map's shape
        return map(fn, jobs)


def stand_in(rows, source, device_update):  # noqa: ANN001, ANN201 - predict_all's shape
    """Each row's error is |knob - BEST| (signed +), whatever the row: the fit must find BEST."""
    knob = next(iter(device_update.values()), {}).get("gemm_max_efficiency", 0.5)
    return [SimpleNamespace(status="ok", quality="ok", source=r["source"], error=abs(knob - BEST)) for r in rows]


@pytest.fixture
def toy(tmp_path, monkeypatch):
    monkeypatch.setattr(fit_published, "predict_all", stand_in)
    monkeypatch.setattr(fit_published, "ProcessPoolExecutor", InlinePool)
    rows = [{"source": s, "gpu": "a100-sxm4-80gb", "n_experts": None, "attention": "flash2"}
            for s in ("src-a", "src-a", "src-b", "src-c")]
    monkeypatch.setattr(fit_published.validate, "read", lambda path: SimpleNamespace(
        iter_rows=lambda named: iter(rows)))
    return rows


def test_progress_counts_every_job_to_the_announced_total(toy):
    calls: list[tuple[int, int]] = []
    record = fit_published.fit("toy.csv", on_job=lambda done, total: calls.append((done, total)))
    # one family (a100); gemm only (no flash1 row): 2 rounds x 2 slices x 21 grid points = 84 jobs
    # per fit; the fit on all rows + one per source left out (3 sources, each with others) = 4 fits
    assert len(fit_published.GRIDS["gemm_max_efficiency"]) == 21
    assert fit_published.fit_jobs(toy) == 2 * 2 * 21 == 84
    assert len(calls) == 4 * 84
    assert [d for d, _ in calls] == list(range(1, 4 * 84 + 1))
    assert {t for _, t in calls} == {4 * 84}
    assert record["a100"]["knobs"]["gemm_max_efficiency"] == BEST


def test_flash1_rows_add_their_knob_to_the_count(toy):
    toy[0]["attention"] = "flash1"
    grids = fit_published.GRIDS
    per_fit = 2 * 2 * (len(grids["gemm_max_efficiency"]) + len(grids["attention_efficiency_flash1"]))
    assert fit_published.fit_jobs(toy) == per_fit
    # without src-a's rows no row ran flash1: those fits count gemm only
    sets = fit_published._fit_sets(toy, None)
    assert fit_published.total_jobs(sets) == 3 * per_fit + 2 * 2 * len(grids["gemm_max_efficiency"])


def test_no_callback_is_fine(toy):
    assert fit_published.fit("toy.csv")["a100"]["knobs"]["gemm_max_efficiency"] == BEST
