"""Smoke test of bench/bench_kernels.py at tiny sizes, so that the bench cannot rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_kernels.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_kernels_runs_and_agrees(capsys):
    results = _bench_module().main(["--n", "2000", "--ref-n", "200"])
    # main raises if the kernels and the plain-Python reference disagree on the sample
    assert [r["kernel"] for r in results] == ["gemm_time_s", "collective_time_s"]
    for r in results:
        assert r["n"] == 2000 and r["ref_n"] == 200
        assert r["kernel_rate"] > 0 and r["ref_rate"] > 0
        assert r["worst_rel"] <= 1e-9
    out = capsys.readouterr().out
    assert "numba threads:" in out and "gemm_time_s" in out and "collective_time_s" in out


def test_bench_kernels_fails_loudly_on_disagreement():
    bench = _bench_module()
    with pytest.raises(RuntimeError, match="disagree on 1 of 3 rows"):
        bench.measure("fake", lambda rows: np.ones(rows), lambda rows: ([1.0, 1.0 + 1e-6, 1.0], 1e-3), 8, 3)
