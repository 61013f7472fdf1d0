"""paraspace results: the Parquet schema, writers, and the analysis API for notebooks.

    >>> import polars as pl
    >>> from paraspace.results import load, top, pareto
    >>> df = load("results/llama3-70b-h100-1024.parquet")     # doctest: +SKIP
    >>> df.filter(pl.col("feasible") & (pl.col("tp") == 8)).sort("step_time_s").head(5).collect()  # doctest: +SKIP
    >>> pareto("results/llama3-70b-h100-1024.parquet", "step_time_s", "mem_peak_bytes")  # doctest: +SKIP

``load`` returns a polars LazyFrame over a result file or a folder of them
(sharded nightly output, study parts), checked to hold one space definition
(the ``paraspace.space_sha256`` footer key of every file), every ``part-I-of-N``
shard, and one result per row_id (exact repeats, as study folders hold, are
dropped; ``open_results`` says how many): integer strategy columns, enum columns
(recompute, schedule, optimizer, infeasible_reason) as categorical strings,
booleans as booleans, and every metric with its unit in its name; the units
and meanings are in ``results.schema.METRICS`` and in each file's metadata
(``results.writer.read_metadata``).
"""

from __future__ import annotations

from paraspace.results.rank import Results, ResultsError, compare, open_results, pareto, ranked, top
from paraspace.results.rank import scan as load
from paraspace.results.writer import read_metadata

__all__ = ["Results", "ResultsError", "compare", "load", "open_results", "pareto", "ranked", "read_metadata", "top"]
