"""Output is never left looking complete before it is, and earlier output is never lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import paraspace.explorer.sweep as sweep_mod
from paraspace.results.writer import PARTIAL_SUFFIX, ResultWriter, read_metadata
from paraspace.spaces.catalog import load_space

SCHEMA = pa.schema([("a", pa.int64())])


def test_complete_write_renames_and_keeps_late_metadata(tmp_path):
    out = tmp_path / "r.parquet"
    with ResultWriter(out, SCHEMA, {"paraspace.version": "x"}, {}) as w:
        w.write(pa.table({"a": [1, 2]}))
        assert not out.exists() and (tmp_path / ("r.parquet" + PARTIAL_SUFFIX)).exists()
        w.write(pa.table({"a": [3]}))
        w.close({"paraspace.encoding": {"n_rows": 3}})
    assert pl.read_parquet(out)["a"].to_list() == [1, 2, 3]
    assert read_metadata(out)["paraspace.encoding"] == '{"n_rows": 3}'
    assert not list(tmp_path.glob("*" + PARTIAL_SUFFIX))


def test_exception_mid_write_leaves_no_file_and_keeps_the_old_one(tmp_path):
    out = tmp_path / "r.parquet"
    pq.write_table(pa.table({"a": [7]}), out)
    before = out.read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        with ResultWriter(out, SCHEMA, {}, {}) as w:
            w.write(pa.table({"a": [1, 2]}))
            raise RuntimeError("boom")
    assert out.read_bytes() == before
    assert not list(tmp_path.glob("*" + PARTIAL_SUFFIX))


def test_interrupted_sweep_keeps_previous_result(tmp_path, monkeypatch):
    space = load_space("llama3-8b-h100-64")
    out = tmp_path / "s.parquet"
    sweep_mod.run_sweep(space, out, chunk_rows=500, progress=False)
    before = out.read_bytes()
    real = sweep_mod.evaluate_encoded
    calls = {"n": 0}

    def interrupt_on_third_chunk(packed, enc, **options):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(packed, enc, **options)

    monkeypatch.setattr(sweep_mod, "evaluate_encoded", interrupt_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        sweep_mod.run_sweep(space, out, chunk_rows=500, progress=False)
    assert calls["n"] == 3
    assert out.read_bytes() == before
    assert not list(tmp_path.glob("*" + PARTIAL_SUFFIX))


def test_killed_process_leaves_only_an_unreadable_partial(tmp_path):
    """A process killed outright (no cleanup runs) leaves NAME.parquet.partial, never NAME.parquet,
    and the partial file has no Parquet footer, so no reader takes it for a result."""
    out = tmp_path / "k.parquet"
    script = textwrap.dedent(f"""
        import os, pyarrow as pa
        from paraspace.results.writer import ResultWriter
        w = ResultWriter({str(out)!r}, pa.schema([("a", pa.int64())]), {{}}, {{}}).__enter__()
        for _ in range(50):
            w.write(pa.table({{"a": list(range(10000))}}))
        os._exit(9)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1], capture_output=True)
    assert proc.returncode == 9, proc.stderr
    assert not out.exists()
    partial = tmp_path / ("k.parquet" + PARTIAL_SUFFIX)
    assert partial.exists()
    with pytest.raises(pl.exceptions.ComputeError):
        pl.read_parquet(partial)
