"""optuna-dashboard works on a study's storage as usual: the journal file and an RDB URL.

The dashboard is a WSGI app (``optuna_dashboard.wsgi(storage)``, the same app
``optuna-dashboard STORAGE`` serves); its JSON API is requested in-process, the
storage given the way a user gives it on the command line (a journal file path
or an RDB URL).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest

from paraspace.explorer.study import run_study, search_space
from paraspace.spaces.catalog import load_space
from paraspace.spaces.encode import Encoder

optuna_dashboard = pytest.importorskip("optuna_dashboard", reason="optuna-dashboard (the test extra) is not installed")

SMALL = "llama3-8b-h100-64"


def get(app, path: str) -> dict:
    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), (status, body[:500])
    return json.loads(body)


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_dashboard_lists_the_study_and_its_trials(tmp_path: Path, kind: str):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = load_space(SMALL)
    url = f"sqlite:///{tmp_path / 'study.db'}" if kind == "sqlite" else None
    summary = run_study(loaded, n_trials=24, out_dir=tmp_path, storage=url, batch=12, sampler="random")
    assert summary.n_trials_total == 24
    app = optuna_dashboard.wsgi(url or str(tmp_path / f"{SMALL}.journal"))

    studies = get(app, "/api/studies")["study_summaries"]
    assert [(s["study_name"], s["directions"]) for s in studies] == [(SMALL, ["minimize", "minimize"])]

    detail = get(app, f"/api/studies/{studies[0]['study_id']}")
    assert detail["objective_names"] == ["step_time_s", "mem_peak_bytes"]
    trials = detail["trials"]
    assert [t["number"] for t in trials] == list(range(24))
    # a rule-breaking combination has no prediction: Pruned, no values, the rule named; the others Complete
    assert {t["state"] for t in trials} == {"Complete", "Pruned"}
    space = search_space(Encoder(loaded))
    for trial in trials:
        assert {p["name"] for p in trial["params"]} == set(space)
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert int(attrs["row_id"]) >= 0 and attrs["feasible"] in ("True", "False")
        if trial["state"] == "Pruned":
            assert set(attrs) == {"row_id", "feasible", "rule"} and attrs["feasible"] == "False"
            assert not trial.get("values") and trial["constraints"] == [1.0]
        else:  # real step times (seconds) and peak memory (bytes) only: no sentinel squashes the plots
            assert set(attrs) == {"row_id", "feasible"}
            assert 0 < trial["values"][0] < 1e3 and 0 < trial["values"][1] < 2**50
    assert {a["key"] for a in detail["union_user_attrs"]} == {"row_id", "feasible", "rule"}
    # the Pareto front of step time and memory among the feasible trials
    assert detail["best_trials"] and all(b["values"][0] < 1e3 for b in detail["best_trials"])
    best = min(summary.best, key=lambda b: b["step_time_s"])
    by_number = {t["number"]: t for t in trials}
    assert by_number[best["trial"]]["values"][0] == pytest.approx(best["step_time_s"])
