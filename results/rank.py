"""Ranking, Pareto fronts and comparisons of result files, on polars lazy scans.

Every function takes a result file or a folder of them (a partitioned
dataset) and never loads more than the query needs.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from paraspace.results.schema import META_VERSION, RANK_BY


class ResultsError(ValueError):
    """A results path, column or expression that cannot be used."""


def scan(path: str | Path) -> pl.LazyFrame:
    """A result file or a folder of them as a LazyFrame; refuses what paraspace did not write."""
    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ResultsError(f"{path}: RESULTS = {str(path)!r}: expected a paraspace Parquet file or a folder of them")
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(files[0]).metadata.metadata or {}
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for non-Parquet files
        raise ResultsError(f"{files[0]}: file: expected a Parquet file ({err})") from None
    if META_VERSION.encode() not in meta:
        raise ResultsError(f"{files[0]}: metadata: expected a file written by paraspace (no {META_VERSION} key)")
    return pl.scan_parquet(path / "**/*.parquet" if path.is_dir() else path)


def _check_columns(frame: pl.LazyFrame, columns: list[str], path: str | Path) -> None:
    known = frame.collect_schema().names()
    for col in columns:
        if col not in known:
            raise ResultsError(f"{path}: column = {col!r}: expected one of {known}")


def ranked(frame: pl.LazyFrame, by: tuple[str, ...] = RANK_BY) -> pl.LazyFrame:
    """Feasible rows first, then ascending ``by``; row_id breaks ties so the order is total."""
    return frame.sort(["feasible", *by, "row_id"], descending=[True, *([False] * len(by)), False])


def filtered(path: str | Path, *, where: str | None = None, max_mem_gib: float | None = None) -> pl.LazyFrame:
    frame = scan(path)
    if max_mem_gib is not None:
        frame = frame.filter(pl.col("mem_peak_bytes") <= max_mem_gib * 1024**3)
    if where:
        try:
            expr = pl.sql_expr(where)
            frame.filter(expr).head(0).collect()  # validate names and types now, not at print time
        except Exception as err:  # noqa: BLE001 - polars reports SQL and column errors with several types
            raise ResultsError(f"{path}: --where = {where!r}: expected a SQL condition over the columns ({err})") \
                from None
        frame = frame.filter(expr)
    return frame


def top(path: str | Path, n: int = 10, by: tuple[str, ...] = RANK_BY, *, where: str | None = None,
        max_mem_gib: float | None = None) -> pl.DataFrame:
    frame = filtered(path, where=where, max_mem_gib=max_mem_gib)
    _check_columns(frame, list(by), path)
    return ranked(frame, by).head(n).collect()


def pareto(path: str | Path, x: str = "step_time_s", y: str = "mem_peak_bytes", *, where: str | None = None,
           feasible_only: bool = True) -> pl.DataFrame:
    """Rows no other row beats on both ``x`` and ``y`` (both minimised), by ascending x."""
    frame = filtered(path, where=where)
    _check_columns(frame, [x, y], path)
    if feasible_only:
        frame = frame.filter(pl.col("feasible"))
    best_before = pl.col(y).cum_min().shift(1, fill_value=float("inf"))
    return frame.sort([x, y, "row_id"]).filter(pl.col(y) < best_before).collect()


def compare(path: str | Path, ids: list[int]) -> pl.DataFrame:
    """The rows with these row_ids side by side (one column per id), with the
    difference of the numeric ones when there are two."""
    frame = scan(path).filter(pl.col("row_id").is_in(ids)).collect()
    missing = sorted(set(ids) - set(frame["row_id"].to_list()))
    if missing:
        raise ResultsError(f"{path}: --ids = {missing}: expected row_ids present in the results")
    frame = frame.sort(pl.col("row_id").replace_strict(ids, list(range(len(ids)))))
    cols = [c for c in frame.columns if c != "row_id"]
    table = pl.DataFrame({"column": cols, **{str(rid): [str(frame[c][k]) for c in cols] for k, rid in enumerate(ids)}})
    if len(ids) == 2:
        diffs = []
        for c in cols:
            a, b = frame[c][0], frame[c][1]
            diffs.append(f"{b - a:+.6g}" if isinstance(a, int | float) and not isinstance(a, bool) else
                         ("" if a == b else "differs"))
        table = table.with_columns(pl.Series("difference", diffs))
    return table
