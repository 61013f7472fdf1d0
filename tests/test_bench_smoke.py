"""The engine bench at a tiny size, so that a change of the kernels' arguments
cannot break it unnoticed (bench_kernels and bench_moe have their own)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_engine_runs_and_agrees(capsys):
    load("bench_engine").main(["--rows", "40", "--reference", "2"])
    out = capsys.readouterr().out
    assert "configurations/s" in out and "step times agree to 0.0e+00 s" in out
