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
from paraspace.results.schema import (META_DIGEST, META_SPACE, META_VERSION, METRIC_NAMES, METRICS, N_MICROBATCHES,
                                      RANK_BY, ROW_ID, Column)


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
#: the columns every training result holds, with their types (results.schema); its strategy columns come
#: from the space's dimension table and are checked where a condition uses them (``_where``)
TRAINING_COLUMNS: tuple[Column, ...] = (ROW_ID, N_MICROBATCHES, *METRICS)
#: the metric columns only a serving result holds: a file with any of them is read as one
SERVING_ONLY = frozenset(c.name for c in serving_schema.METRICS) - set(METRIC_NAMES)
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


def _read_footer(file: Path) -> tuple[dict[bytes, bytes], pa.Schema]:
    """A paraspace file's key-value metadata and Arrow schema; a ``ResultsError`` naming ``file`` when
    it is not a Parquet file written by paraspace (or is gone)."""
    try:
        with pq.ParquetFile(file) as parquet:
            meta, schema = parquet.metadata.metadata or {}, parquet.schema_arrow
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for non-Parquet files
        raise ResultsError(f"{file}: file: expected a Parquet file ({' '.join(str(err).split())[:200]})") from None
    if META_VERSION.encode() not in meta:
        raise ResultsError(f"{file}: metadata: expected a file written by paraspace (no {META_VERSION} key)")
    return meta, schema


def _footer(file: Path) -> dict[bytes, bytes]:
    return _read_footer(file)[0]


def _check_text(file: Path, meta: dict[bytes, bytes]) -> None:
    """Every footer key and value UTF-8 text, as paraspace writes them (polars refuses the file otherwise)."""
    for key, value in meta.items():
        for raw in (key, value):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                near = raw[max(err.start - 16, 0):err.start + 8]
                raise ResultsError(f"{file}: metadata {key.decode('utf-8', 'backslashreplace')!r} = {near!r} (byte "
                                   f"{err.start}: 0x{raw[err.start]:02x}): expected UTF-8 text, as paraspace writes "
                                   "it (the file's footer was damaged or edited; write it again with "
                                   "paraspace or restore it)") from None


def _type_text(expected: pa.DataType) -> str:
    """What a column of Arrow type ``expected`` holds, in words."""
    if pa.types.is_dictionary(expected):
        return "an enum (text labels, Arrow dictionary<string>)"
    if pa.types.is_boolean(expected):
        return "true/false (Arrow bool)"
    if pa.types.is_integer(expected):
        return f"integers (Arrow {expected})"
    if pa.types.is_floating(expected):
        return f"numbers (Arrow {expected})"
    return f"Arrow {expected}"


def _is_text(typ: pa.DataType) -> bool:
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)


def _type_fits(expected: pa.DataType, found: pa.DataType) -> bool:
    """Whether a column stored as ``found`` reads as the schema's ``expected`` does: an enum as a
    dictionary of text or text, an integer as any integer, a float as any number."""
    if pa.types.is_dictionary(expected):
        return _is_text(found) or (pa.types.is_dictionary(found) and _is_text(found.value_type))
    if pa.types.is_boolean(expected):
        return pa.types.is_boolean(found)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(found)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(found) or pa.types.is_integer(found)
    return found == expected


def _check_schema(file: Path, schema: pa.Schema) -> None:
    """The columns a result of ``file``'s kind holds (``TRAINING_COLUMNS``; a serving result's
    ``serving_schema.COLUMNS``), each once and of its type; a ``ResultsError`` naming the file,
    the column and what was expected (a file edited after paraspace wrote it)."""
    names = schema.names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ResultsError(f"{file}: column {_listed([repr(n) for n in twice])} = more than one column of that name: "
                           "expected each column once, as paraspace writes it")
    serving = not SERVING_ONLY.isdisjoint(names)
    kind, required = ("serving", serving_schema.COLUMNS) if serving else ("training", TRAINING_COLUMNS)
    missing = [c.name for c in required if c.name not in names]
    if missing:
        raise ResultsError(f"{file}: column {_listed([repr(n) for n in missing])} = missing: expected every column "
                           f"of a paraspace {kind} result; the file was edited after paraspace wrote it (write it "
                           "again with paraspace or restore it)")
    for column in required:
        found = schema.field(column.name).type
        if not _type_fits(column.type, found):
            raise ResultsError(f"{file}: column {column.name!r} = Arrow {found}: expected {_type_text(column.type)}, "
                               f"as a paraspace {kind} result holds it; the file was edited after paraspace wrote "
                               "it (write it again with paraspace or restore it)")


def _checked_footer(file: Path) -> dict[bytes, bytes]:
    """``_footer``, with the footer's text and the file's columns checked (``_check_text``, ``_check_schema``)."""
    meta, schema = _read_footer(file)
    _check_text(file, meta)
    _check_schema(file, schema)
    return meta


def written_for(file: str | Path) -> str:
    """The name of the space a result file records; a ``ResultsError`` naming ``file`` when it is not a
    Parquet file written by paraspace (or is gone)."""
    return _space_name(_footer(Path(file)))


def written_digest(file: str | Path) -> str | None:
    """The space definition a result file records (its ``paraspace.space_sha256``; None: written before
    paraspace recorded it); a ``ResultsError`` naming ``file`` as ``written_for``."""
    digest = _footer(Path(file)).get(META_DIGEST.encode())
    return digest.decode() if digest else None


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
    (one ``paraspace.space_sha256``), each with the columns and types of its kind of result
    (``results.schema``, ``results.serving_schema``), every shard of a shard array present,
    one result per row_id."""
    if isinstance(path, Results):
        return path
    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ResultsError(f"{path}: RESULTS = {str(path)!r}: expected a paraspace Parquet file or a folder of them")
    footers = {f: _checked_footer(f) for f in files}
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


def _where_words(where: str, columns: list[str], path: Path) -> list[str]:
    """Refuse anything in ``where`` but the file's columns, literals, operators and ``WHERE_FUNCTIONS``:
    no query, no table function (``read_csv(...)``), so a condition can read nothing but the results.
    The columns it names, in order."""
    expected = f"a column of the file or one of {', '.join(WHERE_KEYWORDS)} (a condition such as \"{WHERE_EXAMPLE}\")"
    used: list[str] = []
    pos = 0
    while pos < len(where):
        token = _WHERE_TOKEN.match(where, pos)
        if token is None:
            raise ResultsError(f"{path}: --where character {pos + 1} = {where[pos]!r}: expected {expected}")
        pos = token.end()
        name = token["word"] or token["quoted"]
        if name in columns:
            if name not in used:
                used.append(name)
            continue
        if name is None or (token["word"] and name.upper() in WHERE_KEYWORDS):
            continue
        if token["word"] and where[pos:].lstrip().startswith("("):
            if name.upper() in WHERE_FUNCTIONS:
                continue
            raise ResultsError(f"{path}: --where function = {name!r}: expected one of {', '.join(WHERE_FUNCTIONS)} "
                               "(a condition over the file's columns, not a query or a table function)")
        close = difflib.get_close_matches(name, columns, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ResultsError(f"{path}: --where name = {name!r}: expected {expected}{hint}")
    return used


_SHOWN_LABELS = 8  # labels of an enum column named in a --where error


def _column_values(frame: pl.LazyFrame, column: str, dtype: pl.DataType) -> str:
    """What a condition may compare ``column`` with, in words: an enum's labels (those present), text, a number."""
    if dtype == pl.Boolean:
        return f"{column} is TRUE or FALSE"
    if dtype.is_integer():
        return f"{column} is an integer"
    if dtype.is_numeric():
        return f"{column} is a number"
    if isinstance(dtype, pl.Categorical | pl.Enum) or dtype == pl.String:
        try:
            labels = (frame.select(pl.col(column).drop_nulls().unique().cast(pl.String).sort())
                      .collect()[column].to_list())
        except pl.exceptions.PolarsError:
            labels = []
        more = f" and {len(labels) - _SHOWN_LABELS} more" if len(labels) > _SHOWN_LABELS else ""
        quoted = ", ".join("'" + label.replace("'", "''") + "'" for label in labels[:_SHOWN_LABELS])
        return f"{column} is text in single quotes" + (f" ({quoted}{more} in these results)" if labels else "")
    return f"{column} is {dtype}"


def _reason(err: Exception) -> str:
    """The first line of a polars error, in one line of at most 160 characters."""
    return " ".join(str(err).split("\n", 1)[0].split())[:160]


def _where(frame: pl.LazyFrame, where: str, path: Path, used: list[str]) -> pl.Expr:
    """``where`` (naming the columns ``used``) as a filter over ``frame``'s columns, checked now rather
    than at print time: parsed, then evaluated on no rows of the frame's schema, which type-checks every
    comparison (an enum with a number, a number with text) as the query does; errors in words, never
    polars' query plan."""
    schema = frame.collect_schema()
    try:
        expr = pl.sql_expr(where)
    except Exception:  # noqa: BLE001 - polars reports SQL errors with several types
        raise ResultsError(f"{path}: --where = {where!r}: expected a SQL condition over the columns such as "
                           f"\"{WHERE_EXAMPLE}\" (it does not parse)") from None
    empty = pl.DataFrame(schema=schema)
    try:
        empty.filter(expr)
    except Exception as err:  # noqa: BLE001 - polars reports type errors with several types
        try:
            dtype = empty.select(expr).to_series().dtype
        except Exception:  # noqa: BLE001 - the same type error: described below
            dtype = None
        if dtype is not None and dtype not in (pl.Boolean, pl.Null):
            expected = f"a condition, true or false for each row, such as \"{WHERE_EXAMPLE}\""
        elif used:
            expected = ("each column compared with a value of its type: "
                        + "; ".join(_column_values(frame, c, schema[c]) for c in used))
        else:
            expected = f"a SQL condition over the columns such as \"{WHERE_EXAMPLE}\""
        raise ResultsError(f"{path}: --where = {where!r}: expected {expected} ({_reason(err)})") from None
    return expr


def _collected(frame: pl.LazyFrame, path: Path, where: str | None) -> pl.DataFrame:
    """``frame`` collected; an error of polars while a ``--where`` condition applies (one ``_where``
    could not foresee) is a ``ResultsError`` naming it."""
    try:
        return frame.collect()
    except pl.exceptions.PolarsError as err:
        if not where:
            raise
        raise ResultsError(f"{path}: --where = {where!r}: expected a SQL condition over the columns such as "
                           f"\"{WHERE_EXAMPLE}\" ({_reason(err)})") from None


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
        frame = _where_filtered(frame, where, results.path)
    return frame


def _where_filtered(frame: pl.LazyFrame, where: str, path: Path) -> pl.LazyFrame:
    """The rows of ``frame`` that ``where`` holds for. The enum columns it names are compared as text
    (so that LIKE, LOWER and the comparisons of text apply to them), then given back their type."""
    schema = frame.collect_schema()
    used = _where_words(where, schema.names(), path)
    enums = {c: schema[c] for c in used if isinstance(schema[c], pl.Categorical | pl.Enum)}
    text = frame.with_columns(pl.col(c).cast(pl.String) for c in enums) if enums else frame
    kept = text.filter(_where(text, where, path, used))
    return kept.with_columns(pl.col(c).cast(dtype) for c, dtype in enums.items()) if enums else kept


def top(path: str | Path | Results, n: int = 10, by: tuple[str, ...] = RANK_BY, *, where: str | None = None,
        max_mem_gib: float | None = None, max_ttft_s: float | None = None,
        max_tpot_s: float | None = None) -> pl.DataFrame:
    results = open_results(path)
    frame = filtered(results, where=where, max_mem_gib=max_mem_gib, max_ttft_s=max_ttft_s, max_tpot_s=max_tpot_s)
    if not (by == RANK_BY and is_serving(frame)):  # the default order of a serving result is its own
        _check_columns(frame, list(by), results.path)
    return _collected(ranked(frame, by).head(n), results.path, where)


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
        return _collected(frame.sort([gpu, user, "row_id"], descending=[True, True, False], nulls_last=True)
                          .filter(pl.col(gpu).is_not_null() & (pl.col(user) > best_before)), results.path, where)
    numeric = SERVING_NUMERIC if serving else NUMERIC_METRICS
    for axis, name in (("x", x), ("y", y)):
        if name not in numeric:
            raise ResultsError(f"{results.path}: --{axis} = {name!r}: expected a numeric metric column to minimise, "
                               f"one of {', '.join(numeric)}")
    frame = filtered(results, where=where)
    if feasible_only:
        frame = frame.filter(pl.col("feasible"))
    best_before = pl.col(y).cum_min().shift(1, fill_value=float("inf"))
    return _collected(frame.sort([x, y, "row_id"]).filter(pl.col(y) < best_before), results.path, where)


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
            numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
            diffs.append(f"{b - a:+.6g}" if numbers else ("" if a == b else "differs"))  # null beside a number: differs
        table = table.with_columns(pl.Series("difference", diffs))
    return table
