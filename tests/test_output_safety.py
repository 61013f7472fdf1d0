"""Output safety and results integrity (issue 16): failed runs leave earlier files byte-identical,
outputs are named after the problem run and stay inside their folder, every file carries its
space's digest, and top / pareto / compare / report refuse mixed spaces, missing shards and
ambiguous rows."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_cli_paths import space_toml

import paraspace.explorer.sweep as sweep_mod
from paraspace.explorer.cli import main
from paraspace.results import schema
from paraspace.results.rank import ResultsError, compare, open_results, top
from paraspace.results.writer import read_metadata
from paraspace.spaces.catalog import load_space

SMALL = "llama3-8b-h100-64"
SMALL_FILE = f"results/{SMALL}.parquet"


def run(*argv: str):
    return CliRunner().invoke(main, [*argv])


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(result, message: str) -> None:
    """Exit status 2, the exact message as the output's last line, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.output.rstrip("\n").splitlines()[-1] == f"Error: {message}"
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """One sweep of the small space; tests copy it rather than sweep again."""
    out = tmp_path_factory.mktemp("small") / f"{SMALL}.parquet"
    result = run("sweep", SMALL, "--out", str(out), "--no-progress", "-n", "0")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def tiny_space(tmp_path) -> Path:
    """A space of two combinations (tp 4 or 8), both valid."""
    return space_toml(tmp_path / "tiny.toml", pp="[1]")


# --------------------------------------------------------------------------- 1. failures keep earlier results


def test_sweep_without_a_valid_candidate_leaves_the_earlier_file_byte_identical(small, tmp_path):
    out = tmp_path / "kept.parquet"
    shutil.copy(small, out)
    before = sha(out)
    result = run("sweep", SMALL, "--devices", "100", "--out", str(out), "--no-progress")
    source = load_space(SMALL).source
    one_line_error(result, f"{source} (with command-line devices): dimensions = 2,304 combinations: expected at least "
                           f"one valid candidate (see the table above; {out} left as it was)")
    assert sha(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.parquet"]  # no partial left either


def test_run_sweep_discards_an_empty_result_unless_it_is_a_shard(small, tmp_path):
    space = load_space(SMALL, {"devices": 100})
    out = tmp_path / "r.parquet"
    shutil.copy(small, out)
    before = sha(out)
    summary = sweep_mod.run_sweep(space, out, progress=False)
    assert (summary.n_rows, summary.written, sha(out)) == (0, False, before)
    summary = sweep_mod.run_sweep(space, out, progress=False, keep_empty=True)
    assert summary.written and pq.read_metadata(out).num_rows == 0


def test_a_shard_without_a_valid_candidate_writes_its_empty_part(tmp_path):
    """An empty part is a shard's complete answer: the dataset needs it to look whole."""
    out = tmp_path / "part-0-of-2.parquet"
    result = run("sweep", SMALL, "--devices", "100", "--shard", "0/2", "--out", str(tmp_path), "--no-progress")
    assert result.exit_code == 0, result.output
    assert result.output.endswith(f"llama3-8b-h100-sxm5-80gb-100 shard 0/2: no valid candidate; wrote {out} (0 rows)\n")
    assert pq.read_metadata(out).num_rows == 0


def test_more_shards_than_combinations_is_refused_before_anything_is_written(tiny_space, tmp_path):
    out = tmp_path / "part.parquet"
    out.write_bytes(b"an earlier part")
    result = run("sweep", str(tiny_space), "--shard", "2/3", "--out", str(out), "--no-progress")
    one_line_error(result, "command line: --shard = '2/3': expected at most 2 shards (the space has 2 combinations; "
                           "every shard needs at least one)")
    assert out.read_bytes() == b"an earlier part"


@pytest.mark.parametrize("extra", [(), ("--shard", "0/2"), ("--dask", "local")])
def test_a_columns_typo_is_refused_before_the_sweep_writes(tiny_space, tmp_path, monkeypatch, extra):
    """--columns is checked against the result's columns first: an earlier file at --out stays as it
    was, nothing is evaluated (the table it names is printed only after the sweep)."""
    out = tmp_path / ("k4.parquet" if not extra else "parts")
    out.mkdir() if extra else out.write_bytes(b"PAR1 an earlier result")
    before = sorted(p.name for p in tmp_path.rglob("*")), (out.read_bytes() if not extra else b"")

    def never(*args, **kwargs):
        raise AssertionError("evaluated, though --columns was wrong")

    monkeypatch.setattr("paraspace.explorer.cli.run_sweep", never)
    monkeypatch.setattr("paraspace.explorer.distributed.run_on_dask", never)
    result = run("sweep", str(tiny_space), "--out", str(out), "--columns", "row_id,foo", "--no-progress", *extra)
    one_line_error(result, "command line: --columns 'foo': expected a column of the results, e.g. row_id, tp, "
                           "step_time_s, mem_peak_GiB (paraspace top --wide lists them all)")
    assert (sorted(p.name for p in tmp_path.rglob("*")), out.read_bytes() if not extra else b"") == before


def test_columns_of_the_results_pass_the_early_check(tiny_space, tmp_path):
    result = run("sweep", str(tiny_space), "--out", str(tmp_path / "t.parquet"), "--no-progress",
                 "--columns", "rank,row_id,tp,mbs,mem_peak_GiB,fits")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert ["#", "row_id", "tp", "micro_batch", "mem_peak_GiB", "feasible"] in [line.split() for line in lines]


def test_more_dask_shards_than_combinations_is_refused(tiny_space, tmp_path):
    result = run("sweep", str(tiny_space), "--dask", "local", "--shards", "3", "--out", str(tmp_path / "d"))
    one_line_error(result, "command line: --shards = 3: expected at most 2 shards (the space has 2 combinations; "
                           "every shard needs at least one)")
    assert not (tmp_path / "d").exists()


def test_the_file_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    import pyarrow as pa

    from paraspace.results.writer import ResultWriter

    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(f"replace {Path(b).name}"), real_replace(a, b))[1])
    with ResultWriter(tmp_path / "r.parquet", pa.schema([("a", pa.int64())]), {}, {}) as writer:
        writer.write(pa.table({"a": [1]}))
        writer.close()
    assert events == ["fsync", "replace r.parquet", "fsync"]  # the file, the rename, the folder


# --------------------------------------------------------------------------- 2. named after the problem run


def test_overrides_name_the_output_after_model_hardware_and_devices(small, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    shutil.copy(small, SMALL_FILE)
    before = sha(Path(SMALL_FILE))
    (tmp_path / "my-model.toml").write_text('extends = "llama3-8b"\nname = "my-model"\n'
                                            'description = "Llama 3 8B under another name"\n')
    result = run("sweep", SMALL, "--model", "./my-model.toml", "--hardware", "h200-sxm-141gb", "--no-progress",
                 "-n", "0")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("my-model-h200-sxm-141gb-64: my-model on 64 x h200-sxm-141gb,")
    assert "wrote results/my-model-h200-sxm-141gb-64.parquet" in result.output
    assert sha(Path(SMALL_FILE)) == before
    meta = read_metadata("results/my-model-h200-sxm-141gb-64.parquet")
    assert meta[schema.META_DIGEST] != read_metadata(SMALL_FILE)[schema.META_DIGEST]


def test_devices_override_names_the_shard_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("sweep", SMALL, "--devices", "128", "--shard", "0/2", "--no-progress", "-n", "0")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "results/llama3-8b-h100-sxm5-80gb-128/part-0-of-2.parquet").is_file()


# --------------------------------------------------------------------------- 7. names stay inside the folder


@pytest.mark.parametrize("name", ["../../ESCAPED", "/tmp/ESCAPED-abs", ".hidden", "a\\b"])
def test_a_space_name_that_leaves_the_output_folder_is_refused(tiny_space, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    tiny_space.write_text(tiny_space.read_text().replace('name = "tiny"', f"name = {json.dumps(name)}"))
    result = run("sweep", str(tiny_space), "--no-progress")
    one_line_error(result, f"{tiny_space}: name = {name!r}: expected a file name inside the output folder: no '/', "
                           "'\\', ':' or NUL, not starting with '.', at most 200 bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]
    assert not Path("/tmp/ESCAPED-abs.parquet").exists()


def test_a_study_name_that_leaves_the_output_folder_is_refused(tmp_path):
    result = run("study", SMALL, "--study-name", "../x", "--trials", "1", "--out", str(tmp_path / "st"))
    one_line_error(result, "command line: --study-name = '../x': expected a file name inside the output folder: no "
                           "'/', '\\', ':' or NUL, not starting with '.', at most 200 bytes")
    assert list(tmp_path.iterdir()) == []


def test_where_cannot_read_other_files(small, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\nTOP-SECRET\n")
    where = f"tp IN (SELECT a FROM read_csv('{secret}'))"
    result = run("top", str(small), "--where", where)
    one_line_error(result, f"{small}: --where name = 'SELECT': expected a column of the file or one of AND, OR, NOT, "
                           "IN, IS, NULL, TRUE, FALSE, BETWEEN, LIKE, ILIKE (a condition such as "
                           "\"tp = 8 AND schedule = 'interleaved'\")")
    result = run("top", str(small), "--where", f"read_csv('{secret}') IS NULL")
    one_line_error(result, f"{small}: --where function = 'read_csv': expected one of ABS, ROUND, LOWER, UPPER, "
                           "COALESCE (a condition over the file's columns, not a query or a table function)")
    assert "TOP-SECRET" not in result.output


@pytest.mark.parametrize(("where", "message"), [
    ("tpp = 8", "--where name = 'tpp': expected a column of the file or one of AND, OR, NOT, IN, IS, NULL, TRUE, "
                "FALSE, BETWEEN, LIKE, ILIKE (a condition such as \"tp = 8 AND schedule = 'interleaved'\"); "
                "did you mean 'tp'?"),
    ("tp = 8;", "--where character 7 = ';': expected a column of the file or one of AND, OR, NOT, IN, IS, NULL, "
                "TRUE, FALSE, BETWEEN, LIKE, ILIKE (a condition such as \"tp = 8 AND schedule = 'interleaved'\")"),
    ("tp = = 8", "--where = 'tp = = 8': expected a SQL condition over the columns such as "
                 "\"tp = 8 AND schedule = 'interleaved'\" (it does not parse)"),
])
def test_a_where_typo_is_one_line_in_words(small, where, message):
    result = run("top", str(small), "--where", where)
    one_line_error(result, f"{small}: {message}")
    assert "plan" not in result.output


def test_where_still_filters(small):
    got = top(small, 5, where="tp = 8 AND ABS(pp) <= 2 AND schedule = '1f1b'")
    assert got.height and (got["tp"] == 8).all() and (got["pp"] <= 2).all()


# --------------------------------------------------------------------------- 4. digests, shards, row keys


def test_every_file_carries_its_space_digest(small):
    assert read_metadata(small)[schema.META_DIGEST] == sweep_mod.space_digest(load_space(SMALL))
    opened = open_results(small.parent)
    assert (opened.space, opened.digest, opened.files) == (SMALL, sweep_mod.space_digest(load_space(SMALL)), (small,))
    assert sweep_mod.space_digest(load_space(SMALL)) != sweep_mod.space_digest(load_space(SMALL, {"devices": 128}))


def test_a_folder_of_two_spaces_is_not_ranked_together(small, tiny_space, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(small, folder / "a.parquet")
    assert run("sweep", str(tiny_space), "--out", str(folder / "b.parquet"), "--no-progress", "-n", "0").exit_code == 0
    digests = [read_metadata(folder / f)[schema.META_DIGEST][:12] for f in ("a.parquet", "b.parquet")]
    expected = (f"{folder}: paraspace.space_sha256 = 2 different space definitions ({SMALL} [{digests[0]}]: "
                f"a.parquet; tiny [{digests[1]}]: b.parquet): expected the files of one space, never ranked together; "
                "give one file or one space's folder")
    for argv in (["top", str(folder)], ["pareto", str(folder)], ["compare", str(folder), "--ids", "1", "--ids", "2"],
                 ["report", str(folder), "--out", str(tmp_path / "r.html")]):
        one_line_error(run(*argv), expected)


def _part(small: Path, out: Path, keep) -> None:  # noqa: ANN001 - a pyarrow mask function
    """Rows of the small sweep chosen by ``keep(row_id)``, with its footer metadata."""
    table = pq.read_table(small)
    pq.write_table(table.filter(keep(table["row_id"])), out)


def test_missing_shards_are_named(small, tmp_path):
    folder = tmp_path / "nightly"
    folder.mkdir()
    for i in (0, 3):
        _part(small, folder / f"part-{i}-of-4.parquet", lambda rid, i=i: pc.equal(pc.bit_wise_and(rid, 3), i))
    result = run("top", str(folder))
    one_line_error(result, f"{folder}: shards = 2 of 4 missing (part-1-of-4.parquet, part-2-of-4.parquet): expected "
                           "part-0-of-4 to part-3-of-4 (a shard that failed or has not finished; rerun it with "
                           "--shard I/N)")
    assert top(folder / "part-0-of-4.parquet", 1).height == 1  # one part on its own is a file, not a dataset
    _part(small, folder / "part-1-of-2.parquet", lambda rid: pc.equal(rid, -1))
    one_line_error(run("top", str(folder)), f"{folder}: shards = parts of 2 and of 4 shards: expected the parts of "
                                            "one shard array (remove the other run's parts)")


def test_compare_shows_the_right_row_when_a_folder_repeats_one(small, tmp_path):
    """A study folder holds one row_id in several parts: compare keys rows by row_id, shows each
    once and says so; the old code showed the repeated row in the other row's column."""
    ids = pl.read_parquet(small).sort("row_id")["row_id"].head(3).to_list()
    folder = tmp_path / "study"
    folder.mkdir()
    _part(small, folder / "part-1.parquet", lambda rid: pc.is_in(rid, value_set=pc.cast(ids, rid.type)))
    _part(small, folder / "part-2.parquet", lambda rid: pc.equal(rid, ids[0]))
    table = compare(folder, [ids[0], ids[2]])
    want = pl.read_parquet(small).filter(pl.col("row_id") == ids[2])["step_time_s"].item()
    assert table.filter(pl.col("column") == "step_time_s")[str(ids[2])].item() == str(want)
    assert open_results(folder).n_repeats == 1
    result = run("compare", str(folder), "--ids", str(ids[0]), "--ids", str(ids[2]))
    assert result.exit_code == 0
    assert (f"note: {folder}: 1 rows repeat another row exactly (the same row_id evaluated more than once, e.g. by "
            "several study batches); each is shown once") in result.output
    assert top(folder, 10)["row_id"].n_unique() == top(folder, 10).height == 3


def test_one_row_with_two_different_results_is_refused(small, tmp_path):
    rid = pl.read_parquet(small)["row_id"][0]
    folder = tmp_path / "two-runs"
    folder.mkdir()
    shutil.copy(small, folder / "a.parquet")
    table = pq.read_table(small).filter(pc.equal(pq.read_table(small)["row_id"], rid))
    table = table.set_column(table.schema.get_field_index("step_time_s"), "step_time_s",
                             pc.multiply(table["step_time_s"], 2.0))
    pq.write_table(table, folder / "b.parquet")
    with pytest.raises(ResultsError) as err:
        open_results(folder)
    assert str(err.value) == (f"{folder}: row_id = {rid}: expected one result per row, found different ones in "
                              "a.parquet, b.parquet (runs with other settings or versions in one folder; keep one)")


# --------------------------------------------------------------------------- 8. single-line errors


def test_pareto_of_a_strategy_column_is_refused(small):
    from paraspace.results.rank import NUMERIC_METRICS

    result = run("pareto", str(small), "--x", "tp")
    one_line_error(result, f"{small}: --x = 'tp': expected a numeric metric column to minimise, one of "
                           + ", ".join(NUMERIC_METRICS))
    assert {"step_time_s", "mem_peak_bytes", "tokens_per_s_per_gpu"} <= set(NUMERIC_METRICS)
    assert not {"tp", "row_id", "simulated", "feasible", "infeasible_reason"} & set(NUMERIC_METRICS)


def test_compare_the_same_id_twice_is_refused(small):
    one_line_error(run("compare", str(small), "--ids", "1", "--ids", "1"),
                   "command line: --ids = [1, 1]: expected distinct row_ids (1 given more than once)")


def test_out_under_a_file_is_refused(small, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    one_line_error(run("sweep", SMALL, "--out", str(blocker / "x.parquet"), "--no-progress"),
                   f"{blocker}: output folder = '{blocker}': expected a folder that exists or can be created "
                   f"({blocker} is a file)")
    one_line_error(run("report", str(small), "--out", str(blocker / "sub" / "r.html")),
                   f"{blocker / 'sub'}: output folder = '{blocker / 'sub'}': expected a folder that exists or can be "
                   f"created ({blocker} is a file)")


def test_out_in_a_missing_folder_is_created(small, tmp_path):
    result = run("report", str(small), "--out", str(tmp_path / "new" / "deeper" / "r.html"))
    assert result.exit_code == 0, result.output
    page = (tmp_path / "new" / "deeper" / "r.html").read_text()
    assert f"<title>paraspace report: {small}</title>" in page


def test_an_unreachable_dask_scheduler_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("dask.distributed", reason="dask[distributed] (the test extra) is not installed")
    import paraspace.explorer.distributed as distributed

    monkeypatch.setattr(distributed, "CONNECT_TIMEOUT_S", 0.5)
    result = run("sweep", SMALL, "--dask", "tcp://127.0.0.1:9", "--shards", "2", "--out", str(tmp_path / "d"))
    one_line_error(result, "command line: --dask = 'tcp://127.0.0.1:9': expected the address of a running Dask "
                           "scheduler (tcp://HOST:PORT) or 'local' (could not connect: Timed out trying to connect to "
                           "tcp://127.0.0.1:9 after 0.5 s)")
    assert not (tmp_path / "d").exists()


# --------------------------------------------------------------------------- 10. calibrate checks, then writes


@pytest.mark.parametrize(("kind", "header", "rows", "extra", "blamed"), [
    ("gemm", "m,n,k,dtype,tflops", ["4096,4096,4096,bf16,600", "1,1,1,bf16,1e-20"], [],
     "line 3 (fitted device.gemm_efficiency.0.3) = 1.010713563776046e-23"),
    ("comm", "op,ranks,bytes,gbps", ["all_gather,8,1000000000,50", "all_reduce,8,1000000000,1e-300"],
     ["--tier", "ib"], "line 3 (fitted links.1.op_bandwidth_GB_per_s.all_reduce) = 1.0000000000000514e-300"),
])
def test_calibrate_blames_the_csv_line_and_writes_nothing(tmp_path, kind, header, rows, extra, blamed):
    csv = tmp_path / "m.csv"
    csv.write_text("\n".join([header, *rows]) + "\n")
    out = tmp_path / "profile.toml"
    out.write_text("# Fitted by `paraspace calibrate gemm` from an earlier run\n")  # an earlier profile of ours
    before = sha(out)
    result = run("calibrate", kind, str(csv), "--hardware", "h100-sxm5-80gb", "--out", str(out), *extra)
    expected = "0.000001" if kind == "gemm" else "0.001"
    one_line_error(result, f"{csv}: {blamed}: expected greater than or equal to {expected}; these measurements give "
                           f"no valid profile ({out} left as it was)")
    assert sha(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "profile.toml"]
    out.unlink()
    result = run("calibrate", kind, str(csv), "--hardware", "h100-sxm5-80gb", "--out", str(out), *extra)
    assert result.output.endswith(f"({out} not written)\n") and not out.exists()


def test_calibrate_writes_a_valid_profile_in_a_new_folder(tmp_path):
    csv = tmp_path / "m.csv"
    csv.write_text("m,n,k,dtype,tflops\n4096,4096,4096,bf16,600\n")
    out = tmp_path / "new" / "profile.toml"
    result = run("calibrate", "gemm", str(csv), "--hardware", "h100-sxm5-80gb", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}: h100-sxm5-80gb-calibrated")
    assert sorted(p.name for p in out.parent.iterdir()) == ["profile.toml"]


def test_calibrate_refuses_a_collective_faster_than_a_nanosecond(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("op,ranks,bytes,gbps\nall_reduce,8,1000000000,1e300\n")
    result = run("calibrate", "comm", str(csv), "--hardware", "h100-sxm5-80gb", "--tier", "ib", "--out",
                 str(tmp_path / "o.toml"))
    one_line_error(result, f"{csv}: line 2, gbps = '1e300': expected a measurement of at least 1 ns per collective "
                           "(this row gives 0 s)")
