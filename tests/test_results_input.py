"""Result files and --where conditions that top, pareto, compare and report cannot use: one
'Error:' line naming the file, the field, its value and what was expected, never a traceback.

A file written by paraspace and edited afterwards (a column dropped or retyped, the footer
damaged) is refused where it is opened, against the columns and types ``results.schema`` and
``results.serving_schema`` define; a --where condition is type-checked before any row is read;
a null metric is shown as '-' in the tables and the report's hovers."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from paraspace.explorer import display
from paraspace.explorer.cli import main
from paraspace.results import rank
from paraspace.results.rank import ResultsError, top

TINY = """
    name = "tiny"
    description = "eight combinations, two of each enum value"
    model = "llama3-8b"
    hardware = "h100-sxm5-80gb"
    devices = 64
    global_batch = 256
    seq_len = 8192
    [dimensions]
    tp = [4, 8]
    pp = [1, 2]
    recompute = ["none", "full"]
    """

SERVING = """
    name = "small-serving"
    description = "two deployments"
    model = "llama3-8b"
    hardware = "h100-sxm5-80gb"
    devices = 2
    simulate_top = 1
    [workload]
    input_len = 512
    output_len = 64
    concurrency = 8
    n_requests = 32
    [sla]
    ttft_s = 2.0
    tpot_s = 0.05
    [dimensions]
    tp = [1, 2]
    pp = [1]
    dtype = ["bf16"]
    kv_dtype = ["bf16"]
    max_batch = [8]
    max_tokens = [4096]
    scheduler = ["continuous"]
    overlap_scheduler = [false]
    mode = ["agg"]
    """


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(result: Result, *fragments: str) -> str:
    """Exit status 2 with one 'Error:' line, the last, holding every fragment; no traceback."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("Error: "), result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error: ")] == [last], result.output
    for fragment in fragments:
        assert fragment in last, last
    return last


def written(tmp_path_factory, command: str, toml: str, *options: str) -> Path:
    """``paraspace COMMAND`` on the space ``toml`` in a fresh folder: the Parquet it wrote."""
    folder = tmp_path_factory.mktemp(command)
    (folder / "space.toml").write_text(textwrap.dedent(toml))
    out = folder / "space.parquet"
    result = run(command, folder / "space.toml", "--out", out, *options)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """A training sweep of eight combinations: tp 4 or 8, pp 1 or 2, recompute none or full."""
    return written(tmp_path_factory, "sweep", TINY, "--no-progress", "-n", "0")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A paraspace serve result of two deployments."""
    return written(tmp_path_factory, "serve", SERVING)


def tampered(source: Path, out: Path, edit: Callable[[pa.Table], pa.Table],
             metadata: Callable[[dict[bytes, bytes]], dict[bytes, bytes]] = lambda meta: meta) -> Path:
    """``source`` rewritten by pyarrow with its table edited and its paraspace footer kept (``metadata``
    may change it): a file that still says paraspace wrote it."""
    table = pq.read_table(source)
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != b"ARROW:schema"}
    pq.write_table(edit(table).replace_schema_metadata(metadata(meta)), out)
    return out


def dropped(name: str) -> Callable[[pa.Table], pa.Table]:
    return lambda table: table.drop_columns([name])


def retyped(name: str, typ: pa.DataType) -> Callable[[pa.Table], pa.Table]:
    """``name`` stored as ``typ``: numbers as text or integers, an enum's labels as their codes."""
    def edit(table: pa.Table) -> pa.Table:
        column = table[name].combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.indices
        values = [None if v is None else (str(v) if typ == pa.string() else int(v)) for v in column.to_pylist()]
        return table.set_column(table.schema.get_field_index(name), name, pa.array(values, typ))
    return edit


def nulled(name: str, typ: pa.DataType = pa.float64()) -> Callable[[pa.Table], pa.Table]:
    return lambda table: table.set_column(table.schema.get_field_index(name), name, pa.nulls(table.num_rows, typ))


COMMANDS = {
    "top": lambda path, tmp: ["top", path],
    "pareto": lambda path, tmp: ["pareto", path],
    "compare": lambda path, tmp: ["compare", path, "--ids", "0", "--ids", "1"],
    "report": lambda path, tmp: ["report", path, "--out", tmp / "report.html"],
}

EDITED = {
    "no row_id": ("swept", dropped("row_id"), ["column 'row_id' = missing",
                                               "expected every column of a paraspace training result"]),
    "no feasible": ("swept", dropped("feasible"), ["column 'feasible' = missing"]),
    "no step_time_s": ("swept", dropped("step_time_s"), ["column 'step_time_s' = missing"]),
    "step_time_s as text": ("swept", retyped("step_time_s", pa.string()),
                            ["column 'step_time_s' = Arrow string: expected numbers (Arrow double)"]),
    "feasible as integers": ("swept", retyped("feasible", pa.int8()),
                             ["column 'feasible' = Arrow int8: expected true/false (Arrow bool)"]),
    "infeasible_reason as integers": ("swept", retyped("infeasible_reason", pa.int64()),
                                      ["column 'infeasible_reason' = Arrow int64: expected an enum"]),
    "serving: no ttft_s": ("served", dropped("ttft_s"), ["column 'ttft_s' = missing",
                                                         "expected every column of a paraspace serving result"]),
    "serving: mode as integers": ("served", retyped("mode", pa.int32()),
                                  ["column 'mode' = Arrow int32: expected an enum", "paraspace serving result"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(EDITED))
def test_an_edited_result_file_is_refused_naming_the_column(request, tmp_path, case, command):
    source, edit, fragments = EDITED[case]
    path = tampered(request.getfixturevalue(source), tmp_path / "edited.parquet", edit)
    refused(run(*COMMANDS[command](path, tmp_path)), f"{path}: ", *fragments)
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_undecodable_metadata_is_refused_naming_the_file(swept, tmp_path, command):
    path = tampered(swept, tmp_path / "edited.parquet", lambda table: table,
                    lambda meta: meta | {b"paraspace.version": b"garbage\xff"})
    refused(run(*COMMANDS[command](path, tmp_path)), f"{path}: metadata 'paraspace.version' = b'garbage\\xff'",
            "expected UTF-8 text")


def test_an_edited_part_of_a_folder_is_the_one_named(swept, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    tampered(swept, folder / "a.parquet", lambda table: table.slice(0, 4))
    bad = tampered(swept, folder / "b.parquet", lambda table: dropped("mem_peak_bytes")(table.slice(4)))
    refused(run("top", folder), f"{bad}: column 'mem_peak_bytes' = missing")


def test_a_number_column_stored_as_integers_is_read(swept, tmp_path):
    """An integer column where the schema has a float one holds numbers all the same."""
    path = tampered(swept, tmp_path / "ints.parquet", retyped("mem_peak_bytes", pa.int64()))
    assert top(path, 8)["row_id"].sort().to_list() == list(range(8))


@pytest.mark.parametrize("typ", [pa.float64(), pa.int64()])
def test_null_metrics_are_shown_as_a_dash(swept, tmp_path, typ):
    path = tampered(swept, tmp_path / "nulls.parquet",
                    lambda table: nulled("step_time_lo_s")(nulled("mem_peak_bytes", typ)(table)))
    result = run("top", path, "--columns", "row_id,mem_peak_GiB,step_time_s")
    assert result.exit_code == 0, result.output
    rows = result.output.splitlines()[2:10]
    assert len(rows) == 8 and all(row.split()[1] == "-" for row in rows), result.output
    assert run("pareto", path).exit_code == 0
    assert run("compare", path, "--ids", "0", "--ids", "1").exit_code == 0
    wide = run("top", path)
    assert wide.exit_code == 0 and "Traceback" not in wide.output, wide.output
    out = tmp_path / "nulls.html"
    result = run("report", path, "--out", out)
    assert result.exit_code == 0, result.output
    assert ", mem_peak_GiB -" in out.read_text()


def test_a_text_metric_in_a_hand_made_frame_is_shown_as_it_is():
    frame = pl.DataFrame({"row_id": [0], "step_time_s": ["slow"], "step_time_lo_s": ["a"], "step_time_hi_s": [1.0],
                          "mfu": ["high"], "mem_peak_bytes": ["lots"], "feasible": [True]})
    text = display.table_text(frame, width=120)
    assert "slow" in text and "high" in text and "lots" in text
    assert display.frame_text(frame, width=120)


# --------------------------------------------------------------------------- --where


@pytest.mark.parametrize(("command", "where", "fragments"), [
    ("top", "recompute = 1", ["recompute is text in single quotes ('full', 'none' in these results)"]),
    ("pareto", "recompute = 1", ["recompute is text"]),
    ("top", "tp = 'a'", ["tp is an integer"]),
    ("pareto", "tp = 'a'", ["tp is an integer"]),
    ("top", "recompute IN (1, 2) AND pp = 1", ["recompute is text", "pp is an integer"]),
    ("top", "step_time_s > 'x'", ["step_time_s is a number"]),
    ("top", "feasible AND ABS(schedule) > 1", ["schedule is text in single quotes ('1f1b' in these results)"]),
    ("top", "tp", ["expected a condition, true or false for each row"]),
])
def test_a_condition_of_the_wrong_type_is_named(swept, command, where, fragments):
    refused(run(command, swept, "--where", where), f"{swept}: --where = {where!r}: expected", *fragments)


def test_enum_columns_compare_as_text(swept):
    got = top(swept, 8, where="UPPER(recompute) = 'FULL' AND schedule LIKE '1f%' AND recompute >= 'f'")
    assert sorted(got["row_id"]) == [1, 3, 5, 7]
    assert set(got["recompute"]) == {"full"} and got.schema["recompute"] == pl.read_parquet(swept).schema["recompute"]
    assert run("top", swept, "--where", "recompute = 'full' AND tp = 8").exit_code == 0


def test_an_error_at_collection_names_the_condition(swept, monkeypatch):
    """What the check before the query cannot foresee (an error that depends on the rows) is still
    named, not polars' traceback."""
    monkeypatch.setattr(rank, "_where", lambda frame, where, path, used:
                        (pl.col("row_id") * 100).cast(pl.UInt8, strict=True) > 0)
    with pytest.raises(ResultsError, match=r"--where = 'tp = 4': expected a SQL condition"):
        top(swept, 2, where="tp = 4")
