"""Paths and resumptions found by the training CLI audit: an output that cannot be written is
one 'Error:' line naming it (never a traceback, never after the run, never at the cost of an
earlier result); trace writes PREFIX.json and PREFIX.png and says when the configuration does
not fit; sharded sweeps write one part per shard into a folder; a study refuses to resume over
other dimensions, or with a database driver that is not installed; eval gives the row_id of
the space's enumeration; --set values are blamed on the command line."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import textwrap
from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

import paraspace.results.writer as writer_mod
from paraspace.explorer import cli
from paraspace.explorer.cli import main
from paraspace.explorer.study import check_options, default_storage
from paraspace.results.rank import ResultsError
from paraspace.results.writer import ResultWriter, check_writable

SMALL = "llama3-8b-h100-64"
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
#: a file name over every file system's 255-byte limit
LONG = "x" * 300


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def refused(result: Result, *fragments: str) -> None:
    """Exit status 2, an 'Error: ...' line last, every fragment in the output, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.splitlines()[-1].startswith("Error: "), result.output
    assert isinstance(result.exception, SystemExit)
    for fragment in fragments:
        assert fragment in result.output, result.output


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def space_toml(path: Path, tp: str = "[4, 8]", name: str = "tiny", pp: str = "[1, 2]") -> Path:
    """A space of a few combinations on the small model (each tp valid)."""
    path.write_text(textwrap.dedent(f"""
        name = "{name}"
        description = "a few combinations"
        model = "llama3-8b"
        hardware = "h100-sxm5-80gb"
        devices = 64
        global_batch = 256
        seq_len = 8192
        [dimensions]
        tp = {tp}
        pp = {pp}
        """))
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """One sweep of a four-combination space: a result to report on and to keep."""
    folder = tmp_path_factory.mktemp("swept")
    out = folder / "tiny.parquet"
    result = run("sweep", str(space_toml(folder / "tiny.toml")), "--out", str(out), "--no-progress", "-n", "0")
    assert result.exit_code == 0, result.output
    return out


# --------------------------------------------------------------------------- 1. outputs that cannot be written


@pytest.mark.parametrize("argv", [
    ["sweep", SMALL],
    ["trace", "--space", SMALL],
    ["report", "x.parquet"],
    ["study", SMALL],
    ["serve", "llama3.1-8b-h100-8"],
    ["calibrate", "gemm", str(EXAMPLES / "gemm-h100.csv"), "--hardware", "h100-sxm5-80gb"],
])
def test_an_empty_out_is_refused_by_every_command(argv, tmp_path, monkeypatch):
    """pathlib reads '' as '.': refused at the option, before anything is loaded or run."""
    monkeypatch.chdir(tmp_path)
    result = run(*argv, "--out", "")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "Invalid value for '--out': '': expected a path to write (an empty one names no file)" in result.output
    assert list(tmp_path.iterdir()) == []


def test_sweep_refuses_an_unwritable_out_before_it_runs_and_keeps_the_earlier_file(swept, tmp_path, monkeypatch):
    """A folder where the staging file NAME.partial goes: found by the check before the sweep's
    minutes (run_sweep is never called), and the earlier result is left byte-identical."""
    out = tmp_path / "run.parquet"
    shutil.copy(swept, out)
    before = sha(out)
    (tmp_path / "run.parquet.partial").mkdir()
    monkeypatch.setattr(cli, "run_sweep", lambda *a, **k: pytest.fail("swept before checking --out"))
    refused(run("sweep", str(space_toml(tmp_path / "tiny.toml")), "--out", str(out), "--no-progress"),
            f"Error: {out}: expected a file that can be written ({out}.partial: Is a directory)")
    assert sha(out) == before


def test_a_name_too_long_is_one_line_in_every_command(swept, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space = str(space_toml(tmp_path / "tiny.toml"))
    refused(run("sweep", space, "--out", f"{LONG}.parquet", "--no-progress"),
            f"Error: {LONG}.parquet: expected a file that can be written (File name too long)")
    refused(run("report", str(swept), "--out", f"{LONG}.html"),
            f"Error: {LONG}.html: expected a file that can be written (File name too long)")
    refused(run("trace", "--space", space, "--set", "tp=8", "--out", LONG),
            f"Error: {LONG}.json: expected a file that can be written (File name too long)")
    refused(run("study", space, "--trials", "1", "--no-progress", "--out", LONG),
            f"Error: {LONG}: expected a folder that can be written (")
    refused(run("calibrate", "gemm", str(EXAMPLES / "gemm-h100.csv"), "--hardware", "h100-sxm5-80gb",
                "--out", f"{LONG}.toml"),
            f"Error: {LONG}.toml: expected a file that can be written (File name too long)")
    assert list(tmp_path.iterdir()) == [tmp_path / "tiny.toml"]


def test_report_and_study_name_the_output_they_cannot_write(swept, tmp_path):
    page = tmp_path / "report.html"
    (tmp_path / "report.html.partial").mkdir()
    refused(run("report", str(swept), "--out", str(page)),
            f"Error: {page}: expected a file that can be written ({page}.partial: Is a directory)")
    out = tmp_path / "studies"
    out.mkdir()
    (out / ".tiny.workers").write_text("not a folder")
    refused(run("study", str(space_toml(tmp_path / "tiny.toml")), "--trials", "1", "--no-progress", "--out", str(out)),
            f"Error: {out}: expected a folder that can be written ({out / '.tiny.workers'}: File exists)")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be created")
def test_a_folder_that_takes_no_file_is_one_line(swept):
    """/proc takes no new file, even for root (for whom permission bits do not apply)."""
    refused(run("sweep", str(swept.parent / "tiny.toml"), "--out", "/proc/x.parquet", "--no-progress"),
            "Error: /proc/x.parquet: expected a file that can be written (/proc/x.parquet.partial: No such file or "
            "directory)")
    with pytest.raises(ResultsError, match=r"^/proc/y\.parquet: expected a file that can be written"):
        check_writable("/proc/y.parquet")


def test_result_writer_turns_a_refused_rename_into_one_error_and_keeps_the_earlier_file(swept, tmp_path,
                                                                                      monkeypatch):
    """The rename onto the target fails (an immutable file, a read-only mount): a ResultsError
    naming the target, the staging file removed, the earlier result byte-identical."""
    out = tmp_path / "kept.parquet"
    shutil.copy(swept, out)
    before = sha(out)

    def refuse(finished: Path, target: Path) -> None:
        raise PermissionError(1, "Operation not permitted", str(target))

    monkeypatch.setattr(writer_mod, "publish", refuse)
    table = pq.read_table(swept)
    with pytest.raises(ResultsError, match=r"kept\.parquet: expected a file that can be written \(Operation not "
                                           r"permitted\)"):
        with ResultWriter(out, table.schema, {}, {}) as writer:
            writer.write(table)
            writer.close()
    assert sha(out) == before and list(tmp_path.glob("*.partial")) == []


def test_check_writable_keeps_an_earlier_staging_file(tmp_path):
    """The probe creates and removes its own staging file; one already there is neither truncated nor removed."""
    target = tmp_path / "a.parquet"
    check_writable(target)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a.parquet.partial").write_bytes(b"PAR1 left by a killed run")
    check_writable(target)
    assert (tmp_path / "a.parquet.partial").read_bytes() == b"PAR1 left by a killed run"


# --------------------------------------------------------------------------- 2. trace PREFIX.json / PREFIX.png


@pytest.mark.parametrize(("prefix", "files"), [
    ("llama3-8b.tp2", ("llama3-8b.tp2.json", "llama3-8b.tp2.png")),
    ("run", ("run.json", "run.png")),
    ("run.json", ("run.json", "run.png")),
    ("run.PNG", ("run.json", "run.png")),
    ("a.b.json.png", ("a.b.json.json", "a.b.json.png")),
    ("out/v1.2", ("out/v1.2.json", "out/v1.2.png")),
])
def test_trace_files_append_the_suffix(prefix, files):
    assert cli._trace_files(Path(prefix)) == tuple(Path(f) for f in files)


@pytest.mark.parametrize("prefix", [".json", "out/.png", "."])
def test_a_trace_prefix_without_a_name_is_refused(prefix):
    with pytest.raises(cli.InputError, match=r"--out = .*: expected a file name prefix"):
        cli._trace_files(Path(prefix))


def test_two_traces_whose_prefixes_differ_after_a_dot_keep_both(tmp_path):
    for tp in (2, 4):
        result = run("trace", "--space", SMALL, "--set", f"tp={tp}", "--set", "pp=4", "--out",
                     str(tmp_path / f"llama3-8b.tp{tp}"))
        assert result.exit_code == 0, result.output
        assert f"wrote {tmp_path}/llama3-8b.tp{tp}.json and {tmp_path}/llama3-8b.tp{tp}.png" in result.output
        assert "does NOT fit" not in result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["llama3-8b.tp2.json", "llama3-8b.tp2.png", "llama3-8b.tp4.json", "llama3-8b.tp4.png"]
    titles = {json.loads((tmp_path / f"llama3-8b.tp{tp}.json").read_text())["otherData"]["title"] for tp in (2, 4)}
    assert len(titles) == 2


# --------------------------------------------------------------------------- 3. sharded sweeps write a folder


def test_shards_write_their_parts_into_the_out_folder(tmp_path):
    space = str(space_toml(tmp_path / "tiny.toml"))
    folder = tmp_path / "nightly"
    for i in range(2):
        result = run("sweep", space, "--shard", f"{i}/2", "--out", str(folder), "--no-progress", "-n", "0")
        assert result.exit_code == 0, result.output
        assert f"wrote {folder / f'part-{i}-of-2.parquet'}" in result.output
    assert sorted(p.name for p in folder.iterdir()) == ["part-0-of-2.parquet", "part-1-of-2.parquet"]
    whole = run("top", str(folder), "-n", "10", "--columns", "row_id")
    assert whole.exit_code == 0, whole.output
    assert sorted(int(line) for line in whole.output.splitlines()[2:]) == [0, 1, 2, 3]


@pytest.mark.parametrize("flag", [["--shard", "0/2"], ["--dask", "tcp://127.0.0.1:9", "--shards", "2"]])
def test_a_parquet_out_with_shards_is_refused(flag, tmp_path):
    out = tmp_path / "nightly.parquet"
    refused(run("sweep", str(space_toml(tmp_path / "tiny.toml")), *flag, "--out", str(out), "--no-progress"),
            f"Error: command line: --out = '{out}' with {flag[0]}: expected a folder ({flag[0]} writes one "
            "part-I-of-N.parquet per shard into it, which top, pareto and compare read as one dataset), "
            f"e.g. --out {tmp_path / 'nightly'}")
    assert not out.exists()


# --------------------------------------------------------------------------- 4, 5. studies


def _states(out: Path, name: str) -> list[str]:
    study = optuna.load_study(study_name=name, storage=default_storage(out, name))
    return [t.state.name for t in study.trials]


def test_resuming_a_study_over_changed_dimensions_is_refused_before_any_trial(tmp_path):
    out = tmp_path / "out"
    space = space_toml(tmp_path / "tiny.toml", tp="[1, 2]")
    args = ["--trials", "2", "--batch", "2", "--no-progress", "--out", str(out)]
    assert run("study", str(space), *args).exit_code == 0
    before = _states(out, "tiny")
    space_toml(space, tp="[1, 2, 8]")
    for _ in range(2):  # a retry leaves nothing behind either
        refused(run("study", str(space), *args),
                f"Error: {out / 'tiny.journal'}: study 'tiny': dimensions.tp = [1, 2, 8]: expected [1, 2], the "
                "values the study's trials were asked with (the space tiny changed, or is not the one this study "
                "searched: give another --study-name, or restore the space)")
    refused(run("study", SMALL, "--study-name", "tiny", *args), "study 'tiny': dimensions.tp = [1, 2, 4, 8]")
    assert _states(out, "tiny") == before == ["COMPLETE", "COMPLETE"]
    assert run("study", str(space), "--study-name", "tiny-wider", *args).exit_code == 0  # the suggested way out


def test_a_storage_url_whose_driver_is_missing_is_refused_with_the_working_form(tmp_path, monkeypatch):
    """postgresql:// means psycopg 3 to SQLAlchemy 2; the test extra installs psycopg2. The driver's
    import fails here whatever is installed."""
    from sqlalchemy.engine import make_url

    def missing() -> None:
        raise ImportError("No module named 'psycopg'", name="psycopg")

    dialect = make_url("postgresql://u@127.0.0.1:1/db").get_dialect()
    monkeypatch.setattr(dialect, "import_dbapi", staticmethod(missing))
    refused(run("study", SMALL, "--trials", "1", "--no-progress", "--out", str(tmp_path),
                "--storage", "postgresql://u@127.0.0.1:1/db"),
            f"--storage = 'postgresql://u@127.0.0.1:1/db': expected a URL whose database driver is installed "
            f"(postgresql+{dialect.driver} needs the Python module 'psycopg', which is missing: install it, or name "
            "one that is: postgresql+psycopg2://user:password@host/db (psycopg2-binary, in the test extra))")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(importlib.util.find_spec("psycopg2") is None, reason="psycopg2 (the test extra) is not installed")
def test_the_suggested_storage_form_passes_the_check():
    check_options("x", {"tp": [1]}, sampler="tpe", storage="postgresql+psycopg2://u@127.0.0.1:1/db")


# --------------------------------------------------------------------------- 6. trace says when it does not fit


def test_trace_of_a_configuration_that_does_not_fit_says_so(tmp_path):
    evaluated = json.loads(run("eval", "--space", SMALL, "--json").stdout)
    assert not evaluated["feasible"]
    result = run("trace", "--space", SMALL, "--out", str(tmp_path / "oom"))
    assert result.exit_code == 0, result.output
    assert (f"this configuration does NOT fit (out_of_memory): peak memory "
            f"{evaluated['mem_peak_bytes'] / 2**30:.2f} GiB of 80.0 GiB per device") in result.output
    assert (tmp_path / "oom.json").exists() and (tmp_path / "oom.png").exists()


# --------------------------------------------------------------------------- 7. eval's row_id, --set blamed


def test_eval_gives_the_row_id_of_the_space_or_none(tmp_path):
    space = space_toml(tmp_path / "tiny.toml")
    swept = tmp_path / "tiny.parquet"
    assert run("sweep", str(space), "--out", str(swept), "--no-progress", "-n", "0").exit_code == 0
    rows = pq.read_table(swept, columns=["row_id", "tp", "pp"]).to_pylist()
    for row in rows:
        got = json.loads(run("eval", "--space", str(space), "--set", f"tp={row['tp']}", "--set",
                             f"pp={row['pp']}", "--json").stdout)
        assert got["row_id"] == row["row_id"]
    outside = json.loads(run("eval", "--space", str(space), "--set", "tp=2", "--json").stdout)  # tp 2 not listed
    assert "row_id" not in outside and outside["tp"] == 2
    flags = json.loads(run("eval", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--devices", "64",
                           "--global-batch", "256", "--seq-len", "8192", "--set", "tp=8", "--json").stdout)
    assert "row_id" not in flags


def test_a_set_size_that_does_not_divide_the_devices_is_blamed_on_the_command_line(tmp_path):
    refused(run("eval", "--space", SMALL, "--set", "tp=3"),
            "Error: command line: --set tp=3: tp*pp*cp = 3: expected a divisor of devices = 64")
    refused(run("eval", "--space", SMALL, "--set", "tp=2", "--set", "pp=3"),
            "Error: command line: --set tp=2 --set pp=3: tp*pp*cp = 6: expected a divisor of devices = 64")
    fixed = space_toml(tmp_path / "three.toml", tp="[3]")  # the space's own single value: the space is blamed
    refused(run("eval", "--space", str(fixed)), f"Error: {fixed}: tp*pp*cp = 3: expected a divisor of devices = 64")
