"""Ranking result files with polars lazy scans."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from results.schema import RANK_BY


def scan(path: str | Path) -> pl.LazyFrame:
    """A result file or a folder of them (a partitioned dataset) as a LazyFrame."""
    path = Path(path)
    return pl.scan_parquet(path / "**/*.parquet" if path.is_dir() else path)


def ranked(frame: pl.LazyFrame, by: tuple[str, ...] = RANK_BY) -> pl.LazyFrame:
    """Feasible rows first, then ascending ``by``; row_id breaks ties so the order is total."""
    return frame.sort(["feasible", *by, "row_id"], descending=[True, *([False] * len(by)), False])


def top(path: str | Path, n: int = 10, by: tuple[str, ...] = RANK_BY) -> pl.DataFrame:
    return ranked(scan(path), by).head(n).collect()
