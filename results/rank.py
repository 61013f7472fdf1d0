"""Ranking, Pareto fronts and comparisons of result files, on polars lazy scans.

Every function takes a result file or a folder of them (a partitioned
dataset) and never loads more than the query needs. A folder is read only when
it is one problem's complete results (``open_results``): every file written by
paraspace for one space definition (the ``paraspace.space_sha256`` footer key),
every ``part-I-of-N`` of a shard array present, and one result per row_id
(study folders evaluate a row in several batches: exact repeats are dropped,
and said; different results for one row are refused).
"""

from __future__ import annotations

import difflib
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from paraspace.results import serving_schema
from paraspace.results.schema import META_DIGEST, META_SPACE, META_VERSION, METRICS, RANK_BY


class ResultsError(ValueError):
    """A results path, column or expression that cannot be used."""


#: a shard of a nightly job array, as ``sweep --shard I/N`` and ``--dask`` name it
SHARD_FILE = re.compile(r"part-(\d+)-of-(\d+)\.parquet")
#: the metrics ``pareto`` can minimise: numeric metric columns
NUMERIC_METRICS = tuple(c.name for c in METRICS if pa.types.is_integer(c.type) or pa.types.is_floating(c.type))
#: the same for serving results (``paraspace serve``), whose columns are results.serving_schema's
SERVING_NUMERIC = tuple(c.name for c in serving_schema.METRICS
                        if pa.types.is_integer(c.type) or pa.types.is_floating(c.type))
#: a serving result's front: the most output tokens per second per GPU against per user (both maximised)
SERVING_FRONT = ("output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user")
_LISTED = 4  # files named per group in an error before "and N more"


@dataclass(frozen=True)
class Results:
    """A result file or folder, checked to hold one space's complete results, rows keyed by row_id."""

    path: Path
    #: every row once: rows repeated exactly (one row_id evaluated in several study batches) are dropped
    frame: pl.LazyFrame
    files: tuple[Path, ...]
    #: ``paraspace.space_sha256`` of every file (None: written before paraspace recorded it)
    digest: str | None
    #: the space's name as its files record it
    space: str
    #: exact repeats dropped from ``frame``
    n_repeats: int = 0

    @property
    def note(self) -> str:
        """What was done to the rows that a reader should know ("" when nothing)."""
        if not self.n_repeats:
            return ""
        return (f"note: {self.path}: {self.n_repeats:,} rows repeat another row exactly (the same row_id evaluated "
                "more than once, e.g. by several study batches); each is shown once")


def _listed(items: list[str]) -> str:
    """The first few items, and how many more."""
    more = f" and {len(items) - _LISTED} more" if len(items) > _LISTED else ""
    return ", ".join(items[:_LISTED]) + more


def _names(files: list[Path], root: Path) -> str:
    return _listed([str(f.relative_to(root)) if root.is_dir() else f.name for f in files])


def _footer(file: Path) -> dict[bytes, bytes]:
    try:
        meta = pq.ParquetFile(file).metadata.metadata or {}
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for non-Parquet files
        raise ResultsError(f"{file}: file: expected a Parquet file ({' '.join(str(err).split())[:200]})") from None
    if META_VERSION.encode() not in meta:
        raise ResultsError(f"{file}: metadata: expected a file written by paraspace (no {META_VERSION} key)")
    return meta


def written_for(file: str | Path) -> str:
    """The name of the space a result file records; a ``ResultsError`` naming ``file`` when it is not a
    Parquet file written by paraspace (or is gone)."""
    return _space_name(_footer(Path(file)))


def _space_name(meta: dict[bytes, bytes]) -> str:
    try:
        return str(json.loads(meta[META_SPACE.encode()])["toml"]["name"])
    except (KeyError, TypeError, ValueError):
        return "(unnamed space)"


def _one_space(path: Path, footers: dict[Path, dict[bytes, bytes]]) -> tuple[str | None, str]:
    """The digest and space name all files share; a ``ResultsError`` listing the spaces when they differ."""
    groups: dict[str | None, list[Path]] = defaultdict(list)
    for file, meta in footers.items():
        digest = meta.get(META_DIGEST.encode())
        groups[digest.decode() if digest else None].append(file)
    if len(groups) > 1:
        listed = "; ".join(f"{_space_name(footers[files[0]])} [{(digest or 'no digest')[:12]}]: {_names(files, path)}"
                           for digest, files in groups.items())
        raise ResultsError(f"{path}: {META_DIGEST} = {len(groups)} different space definitions ({listed}): expected "
                           "the files of one space, never ranked together; give one file or one space's folder")
    (digest, files), = groups.items()
    return digest, _space_name(footers[files[0]])


def _complete_shards(path: Path, files: list[Path]) -> None:
    """Every ``part-I-of-N`` of a folder present, all of one N; a ``ResultsError`` naming what is missing."""
    counts: dict[Path, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for file in files:
        match = SHARD_FILE.fullmatch(file.name)
        if match:
            counts[file.parent][int(match[2])].add(int(match[1]))
    for folder, by_count in counts.items():
        if len(by_count) > 1:
            raise ResultsError(f"{folder}: shards = parts of {' and of '.join(map(str, sorted(by_count)))} shards: "
                               "expected the parts of one shard array (remove the other run's parts)")
        (count, present), = by_count.items()
        missing = sorted(set(range(count)) - present)
        extra = sorted(present - set(range(count)))
        if missing or extra:
            shown = _listed([f"part-{i}-of-{count}.parquet" for i in missing])
            what = f"{len(missing)} of {count} missing ({shown})" if missing else f"part-{extra[0]}-of-{count} found"
            raise ResultsError(f"{folder}: shards = {what}: expected part-0-of-{count} to part-{count - 1}-of-{count} "
                               "(a shard that failed or has not finished; rerun it with --shard I/N)")


def _keyed(path: Path, files: list[Path]) -> tuple[pl.LazyFrame, int]:
    """The files' rows with exact repeats dropped, and how many were; a ``ResultsError`` when one
    row_id holds different results (two evaluations of one row disagree)."""
    frame = pl.scan_parquet(files)
    n_rows, n_ids = frame.select(pl.len(), pl.col("row_id").n_unique()).collect().row(0)
    if n_ids == n_rows:
        return frame, 0
    frame = frame.unique()
    n_distinct = frame.select(pl.len()).collect().item()
    if n_distinct > n_ids:
        rid = frame.group_by("row_id").len().filter(pl.col("len") > 1).select(pl.col("row_id").min()).collect().item()
        found = (pl.scan_parquet(files, include_file_paths="file")
                 .filter(pl.col("row_id") == rid).select(pl.col("file").unique().sort()).collect()["file"])
        raise ResultsError(f"{path}: row_id = {rid}: expected one result per row, found different ones in "
                           f"{_names([Path(f) for f in found], path)} (runs with other settings or versions "
                           "in one folder; keep one)")
    return frame, n_rows - n_distinct


def open_results(path: str | Path | Results) -> Results:
    """A result file or a folder of them, checked: paraspace files of one space definition
    (one ``paraspace.space_sha256``), every shard of a shard array present, one result per row_id."""
    if isinstance(path, Results):
        return path
    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ResultsError(f"{path}: RESULTS = {str(path)!r}: expected a paraspace Parquet file or a folder of them")
    footers = {f: _footer(f) for f in files}
    digest, space = _one_space(path, footers)
    if path.is_dir():  # one part given on its own is a file to read, not a dataset to complete
        _complete_shards(path, files)
    frame, repeats = _keyed(path, files)
    return Results(path, frame, tuple(files), digest, space, repeats)


def scan(path: str | Path | Results) -> pl.LazyFrame:
    """A result file or a folder of them as a LazyFrame (checked by ``open_results``)."""
    return open_results(path).frame


def _check_columns(frame: pl.LazyFrame, columns: list[str], path: str | Path) -> None:
    known = frame.collect_schema().names()
    for col in columns:
        if col not in known:
            raise ResultsError(f"{path}: column = {col!r}: expected one of {known}")


def is_serving(frame: pl.LazyFrame) -> bool:
    """A ``paraspace serve`` result (TTFT and TPOT columns) rather than a training sweep's."""
    return "ttft_s" in frame.collect_schema().names()


def ranked(frame: pl.LazyFrame, by: tuple[str, ...] = RANK_BY) -> pl.LazyFrame:
    """Feasible rows first, then ascending ``by`` (null and NaN last); row_id breaks ties so the order is total.
    Under the default order the simulated rows come before the rest: the event tier (or
    the serving simulation) checked their values, while the others keep the closed form's,
    which the simulation mostly lengthens (a sweep simulates the best ``simulate_top`` by
    the closed form, so an unsimulated row would otherwise rank above simulated ones it
    may not beat). A serving result under the default order ranks as ``paraspace serve``
    does (``serving_schema.RANK``: then the most output tokens per second per GPU, then
    the shortest TTFT)."""
    types = frame.collect_schema()
    if by == RANK_BY and is_serving(frame):
        order = list(serving_schema.RANK)
    else:
        simulated = [("simulated", True)] if by == RANK_BY and "simulated" in types else []
        order = [("feasible", True), *simulated, *((name, False) for name in by)]
    keys = [pl.col(name).fill_nan(None) if name in types and types[name].is_float() else pl.col(name)
            for name, _ in order]  # NaN last, as null
    return frame.sort([*keys, pl.col("row_id")], descending=[*(d for _, d in order), False], nulls_last=True)


#: what --where may hold besides column names: SQL operators and literals, a few functions
WHERE_KEYWORDS = ("AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "BETWEEN", "LIKE", "ILIKE")
WHERE_FUNCTIONS = ("ABS", "ROUND", "LOWER", "UPPER", "COALESCE")
WHERE_EXAMPLE = "tp = 8 AND schedule = 'interleaved'"
_WHERE_TOKEN = re.compile(r"""\s+|(?P<string>'(?:[^']|'')*')|(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"""
                          r"""|"(?P<quoted>[^"]+)"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><=|>=|<>|!=|==|[=<>+\-*/%(),])""")


def _where_words(where: str, columns: list[str], path: Path) -> None:
    """Refuse anything in ``where`` but the file's columns, literals, operators and ``WHERE_FUNCTIONS``:
    no query, no table function (``read_csv(...)``), so a condition can read nothing but the results."""
    expected = f"a column of the file or one of {', '.join(WHERE_KEYWORDS)} (a condition such as \"{WHERE_EXAMPLE}\")"
    pos = 0
    while pos < len(where):
        token = _WHERE_TOKEN.match(where, pos)
        if token is None:
            raise ResultsError(f"{path}: --where character {pos + 1} = {where[pos]!r}: expected {expected}")
        pos = token.end()
        name = token["word"] or token["quoted"]
        if name is None or name in columns or (token["word"] and name.upper() in WHERE_KEYWORDS):
            continue
        if token["word"] and where[pos:].lstrip().startswith("("):
            if name.upper() in WHERE_FUNCTIONS:
                continue
            raise ResultsError(f"{path}: --where function = {name!r}: expected one of {', '.join(WHERE_FUNCTIONS)} "
                               "(a condition over the file's columns, not a query or a table function)")
        close = difflib.get_close_matches(name, columns, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ResultsError(f"{path}: --where name = {name!r}: expected {expected}{hint}")


def _where(frame: pl.LazyFrame, where: str, path: Path) -> pl.Expr:
    """``where`` as a filter over ``frame``'s columns, checked now rather than at print time; errors in words,
    never polars' query plan."""
    _where_words(where, frame.collect_schema().names(), path)
    try:
        expr = pl.sql_expr(where)
        frame.filter(expr).head(0).collect()
    except Exception as err:  # noqa: BLE001 - polars reports SQL and type errors with several types
        parse = isinstance(err, pl.exceptions.SQLInterfaceError | pl.exceptions.SQLSyntaxError)
        reason = "it does not parse" if parse else " ".join(str(err).split("\n", 1)[0].split())[:160]
        raise ResultsError(f"{path}: --where = {where!r}: expected a SQL condition over the columns such as "
                           f"\"{WHERE_EXAMPLE}\" ({reason})") from None
    return expr


def filtered(path: str | Path | Results, *, where: str | None = None, max_mem_gib: float | None = None,
             max_ttft_s: float | None = None, max_tpot_s: float | None = None) -> pl.LazyFrame:
    """The rows under the limits given; the latency limits (SLA targets) apply to serving results."""
    results = open_results(path)
    frame = results.frame
    if max_mem_gib is not None:
        frame = frame.filter(pl.col("mem_peak_bytes") <= max_mem_gib * 1024**3)
    for option, column, limit in (("--max-ttft", "ttft_s", max_ttft_s), ("--max-tpot", "tpot_s", max_tpot_s)):
        if limit is None:
            continue
        if not is_serving(frame):
            raise ResultsError(f"{results.path}: {option} = {limit}: expected a serving result (paraspace serve); "
                               "this file has no latency columns")
        frame = frame.filter(pl.col(column) <= limit)
    if where:
        frame = frame.filter(_where(frame, where, results.path))
    return frame


def top(path: str | Path | Results, n: int = 10, by: tuple[str, ...] = RANK_BY, *, where: str | None = None,
        max_mem_gib: float | None = None, max_ttft_s: float | None = None,
        max_tpot_s: float | None = None) -> pl.DataFrame:
    results = open_results(path)
    frame = filtered(results, where=where, max_mem_gib=max_mem_gib, max_ttft_s=max_ttft_s, max_tpot_s=max_tpot_s)
    if not (by == RANK_BY and is_serving(frame)):  # the default order of a serving result is its own
        _check_columns(frame, list(by), results.path)
    return ranked(frame, by).head(n).collect()


def front_axes(frame: pl.LazyFrame, x: str = "step_time_s", y: str = "mem_peak_bytes") -> tuple[str, str, bool]:
    """The two columns ``pareto`` draws its front on when asked for ``x`` and ``y``, and whether
    both are maximised: on a serving result the default axes stand for ``SERVING_FRONT``."""
    if is_serving(frame) and (x, y) == ("step_time_s", "mem_peak_bytes"):
        return SERVING_FRONT[0], SERVING_FRONT[1], True
    return x, y, False


def pareto(path: str | Path | Results, x: str = "step_time_s", y: str = "mem_peak_bytes", *,
           where: str | None = None, feasible_only: bool = True) -> pl.DataFrame:
    """Rows no other row beats on both ``x`` and ``y`` (numeric metrics, both minimised), by ascending x.
    On a serving result the default axes are ``SERVING_FRONT``, both maximised (the
    throughput per GPU a deployment gives against the speed each user sees)."""
    results = open_results(path)
    serving = is_serving(results.frame)
    if front_axes(results.frame, x, y)[2]:
        frame = filtered(results, where=where)
        if feasible_only:
            frame = frame.filter(pl.col("feasible"))
        gpu, user = SERVING_FRONT
        best_before = pl.col(user).cum_max().shift(1, fill_value=float("-inf"))
        return (frame.sort([gpu, user, "row_id"], descending=[True, True, False], nulls_last=True)
                .filter(pl.col(gpu).is_not_null() & (pl.col(user) > best_before)).collect())
    numeric = SERVING_NUMERIC if serving else NUMERIC_METRICS
    for axis, name in (("x", x), ("y", y)):
        if name not in numeric:
            raise ResultsError(f"{results.path}: --{axis} = {name!r}: expected a numeric metric column to minimise, "
                               f"one of {', '.join(numeric)}")
    frame = filtered(results, where=where)
    if feasible_only:
        frame = frame.filter(pl.col("feasible"))
    best_before = pl.col(y).cum_min().shift(1, fill_value=float("inf"))
    return frame.sort([x, y, "row_id"]).filter(pl.col(y) < best_before).collect()


def compare(path: str | Path | Results, ids: list[int]) -> pl.DataFrame:
    """The rows with these row_ids side by side (one column per id), with the
    difference of the numeric ones when there are two."""
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ResultsError(f"command line: --ids = {list(ids)}: expected distinct row_ids "
                           f"({', '.join(map(str, repeated))} given more than once)")
    results = open_results(path)
    frame = results.frame.filter(pl.col("row_id").is_in(ids)).collect()
    missing = sorted(set(ids) - set(frame["row_id"].to_list()))
    if missing:
        raise ResultsError(f"{results.path}: --ids = {missing}: expected row_ids present in the results")
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
