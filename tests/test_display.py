"""Terminal output (explorer.display, issue 17): tables that fit 80 and 120 columns, the
held-constant note, memory in GiB, --columns and --wide, the first-run note, and
command-line messages in words rather than Python reprs."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import numba
import polars as pl
import pytest
from click.testing import CliRunner
from rich.console import Console

from paraspace.explorer import display
from paraspace.explorer.cli import main
from paraspace.results import pareto, top
from paraspace.spaces.encode import DIMENSION_NAMES

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
GIB = 1024**3


def run(*args: str, width: int = 80):
    return CliRunner(env={"COLUMNS": str(width)}).invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """The example space (48 candidates, 6 dimensions varying) swept once."""
    out = tmp_path_factory.mktemp("display") / "my-space.parquet"
    result = run("sweep", str(EXAMPLES / "my-space.toml"), "--out", str(out), "--no-progress", "-n", "0")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def crowded(results) -> pl.DataFrame:
    """Ten rows whose every dimension varies, with the longest enum labels: the worst case for width."""
    frame = top(results, 10)
    cycles = {"schedule": ["interleaved", "dualpipe"], "dispatch": ["sendrecv-allgather", "alltoall"],
              "recompute": ["selective", "none"], "ep_placement": ["inner", "outer"],
              "optimizer": ["adam", "adam8bit"], "devices": [16, 1024], "vpp": [1, 12], "cp": [1, 16]}
    changes = []
    for name in DIMENSION_NAMES:
        values = cycles.get(name)
        if values is None:
            values = [True, False] if frame.schema[name] == pl.Boolean else [1, 2]
        column = list(itertools.islice(itertools.cycle(values), frame.height))
        dtype = pl.String if isinstance(values[0], str) else frame.schema[name]
        changes.append(pl.Series(name, column, dtype=dtype))
    return frame.with_columns(changes)


def rendered(text: str, width: int) -> str:
    """``text`` printed by a rich Console of ``width`` columns, as a terminal would show it."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(text, markup=False, highlight=False, emoji=False)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("which", ["results", "crowded"])
def test_the_table_fits_the_terminal(request, width, which):
    frame = top(request.getfixturevalue("results"), 10) if which == "results" else request.getfixturevalue(which)
    text = display.table_text(frame, width=width)
    shown = rendered(text, width)
    assert max(len(line) for line in shown.splitlines()) <= width
    assert shown.rstrip("\n").splitlines() == text.splitlines()  # nothing rewrapped: it already fit
    header = text.splitlines()[0].split()
    assert header[:2] == ["#", "row_id"]
    assert {"step_time_s", "MFU", "mem_GiB", "fits"} <= set(header)
    for row_id in frame["row_id"]:
        assert f" {row_id} " in text


def test_a_wide_terminal_shows_the_band_and_more_dimensions(crowded):
    narrow = display.table_text(crowded, width=80)
    wide = display.table_text(crowded, width=300)
    assert "80% band" in wide.splitlines()[0] and "80% band" not in narrow.splitlines()[0]
    assert "not shown (too narrow):" in narrow
    assert "80% band" in " ".join(narrow.split("not shown (too narrow):")[1].split())  # the note may wrap anywhere
    assert len(wide.splitlines()[0].split()) > len(narrow.splitlines()[0].split())
    assert "sendrecv-allgather" in wide  # labels whole, never folded mid-word


def test_held_note_lists_the_dimensions_at_one_value(results):
    frame = top(results, 100)  # every row
    differ, held = display.varying(frame)
    assert set(held) == {d for d in DIMENSION_NAMES if frame[d].n_unique() == 1}
    assert set(differ) == set(DIMENSION_NAMES) - set(held)
    assert set(differ) == {"tp", "pp", "dp", "micro_batch", "recompute", "zero"}  # the example space's lists
    text = display.table_text(frame, width=120)
    note = " ".join(text.split("same in every row: ")[1].split("\n")[:3])
    for name in held:
        assert name in note
    assert "devices=16" in note  # held off its default: with its value
    header = text.splitlines()[0].split()
    for name in held:
        assert name not in header and display.SHORT_HEADERS.get(name) not in header


def test_memory_shows_in_gib(results):
    frame = top(results, 3)
    text = display.table_text(frame, width=120)
    for value in frame["mem_peak_bytes"]:
        assert f"{value / GIB:.1f}" in text
        assert str(int(value)) not in text and f"{value:.4e}" not in text
    wide = display.table_text(frame, wide=True)
    assert "mem_peak_GiB" in wide and "mem_weights_GiB" in wide and "_bytes" not in wide.splitlines()[0]


def test_columns_pick_exactly_those(results):
    frame = top(results, 4)
    text = display.table_text(frame, columns=["row_id", "tp", "mem_peak_GiB", "step_time_s", "rank"], width=80)
    assert text.splitlines()[0].split() == ["row_id", "tp", "mem_peak_GiB", "step_time_s", "#"]
    assert "same in every row" not in text
    with pytest.raises(display.ColumnError, match="'tpp'.*did you mean 'tp'"):
        display.table_text(frame, columns=["tpp"])


def test_wide_shows_every_column(results):
    frame = top(results, 2)
    header = display.table_text(frame, wide=True).splitlines()[0].split()
    expected = [display.gib_name(c) for c in frame.columns if c != "infeasible_reason"]
    assert header == ["#", *expected]


@pytest.mark.parametrize("width", [80, 120])
def test_top_and_pareto_end_to_end(results, width):
    best = top(results, 1).row(0, named=True)
    out = run("top", str(results), "-n", "5", width=width)
    assert out.exit_code == 0, out.output
    assert max(len(line) for line in out.output.splitlines()) <= width
    assert f"{best['step_time_s']:.3f}" in out.output and f" {best['row_id']} " in out.output
    assert "same in every row:" in out.output

    front = pareto(results)
    out = run("pareto", str(results), width=width)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == f"{front.height} rows on the step_time_s / mem_peak_bytes front:"
    assert max(len(line) for line in lines) <= width
    assert "row_id" in lines[1] and "mem_GiB" in lines[1]
    for row in front.iter_rows(named=True):
        assert f"{row['mem_peak_bytes'] / GIB:.1f}" in out.output
    assert "e+10" not in out.output and "e10" not in out.output


def test_columns_and_wide_options(results, tmp_path):
    out = run("top", str(results), "-n", "3", "--columns", "row_id,tp,pp,mem_peak_GiB")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0].split() == ["row_id", "tp", "pp", "mem_peak_GiB"]
    out = run("pareto", str(results), "--wide")
    assert out.exit_code == 0 and "tokens_per_s_per_gpu" in out.output.splitlines()[1]
    out = run("top", str(results), "--columns", "tp,bogus")
    assert out.exit_code == 2 and "--columns 'bogus': expected a column of the results" in out.output
    out = run("sweep", str(EXAMPLES / "my-space.toml"), "--out", str(tmp_path / "s.parquet"), "--no-progress",
              "-n", "2", "--columns", "row_id,step_time_s")
    assert out.exit_code == 0, out.output
    assert ["row_id", "step_time_s"] in [line.split() for line in out.output.splitlines()]


def test_by_metric_is_shown(results):
    out = run("top", str(results), "-n", "3", "--by", "tokens_per_s_per_gpu", width=120)
    assert out.exit_code == 0 and "tokens_per_s_per_gpu" in out.output.splitlines()[0]


# --------------------------------------------------------------------------- first run


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty kernel cache folder, the announcement not yet made, the JIT on."""
    monkeypatch.setattr(display, "kernel_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(display, "_announced", False)
    monkeypatch.setattr(numba.config, "DISABLE_JIT", 0)
    return tmp_path


def test_first_run_says_the_kernels_compile_once(fresh):
    said: list[str] = []
    assert display.kernels_need_compiling()
    assert display.announce_compile(said.append)
    assert not display.announce_compile(said.append)  # once per process
    assert said == [f"compiling kernels once, about a minute; later runs start in seconds (cache: {fresh})"]


def test_a_filled_cache_says_nothing(fresh):
    import sys

    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    for name in display.ENTRY_KERNELS:
        (fresh / f"{name}-12.{tag}.nbi").write_bytes(b"")
    said: list[str] = []
    assert not display.kernels_need_compiling()
    assert not display.announce_compile(said.append) and said == []


def test_the_cache_folder_is_numbas(results):
    """After a sweep the entry kernels' index files are where kernel_cache_dir looks."""
    if numba.config.DISABLE_JIT:
        pytest.skip("NUMBA_DISABLE_JIT: nothing is compiled")
    assert not display.kernels_need_compiling(), display.kernel_cache_dir()


def test_eval_prints_the_note_on_stderr(fresh):
    result = CliRunner().invoke(main, ["eval", "--space", str(EXAMPLES / "my-space.toml"), "--set", "tp=2",
                                       "--set", "pp=1", "--set", "micro_batch=1", "--set", "recompute=none",
                                       "--set", "zero=1"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("compiling kernels once, about a minute")


# --------------------------------------------------------------------------- messages in words


EVAL = ["eval", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--global-batch", "16", "--seq-len", "4096"]


def test_an_unknown_set_key_is_named_in_words():
    result = run(*EVAL, "--devices", "8", "--set", "foo=1")
    assert result.exit_code == 2
    assert "--set foo=1: expected KEY=VALUE with KEY one of devices, tp, pp" in result.output
    assert "(1,)" not in result.output and "[" not in result.output
    result = run(*EVAL, "--devices", "8", "--set", "tpp=2")
    assert result.exit_code == 2 and "did you mean tp?" in result.output


def test_set_devices_is_accepted_as_listed():
    """--set lists devices among its keys: --set devices=8 stands for --devices 8."""
    with_set = run(*EVAL, "--set", "devices=8", "--set", "tp=2", "--json")
    with_option = run(*EVAL, "--devices", "8", "--set", "tp=2", "--json")
    assert with_set.exit_code == 0, with_set.output
    assert with_set.output == with_option.output
    clash = run(*EVAL, "--devices", "16", "--set", "devices=8")
    assert clash.exit_code == 2 and "expected the --devices value 16" in clash.output


def test_a_where_typo_is_a_sentence_not_a_query_plan(results):
    out = run("top", str(results), "--where", "tpp = 2")
    assert out.exit_code == 2 and "did you mean 'tp'?" in out.output
    assert "FILTER" not in out.output and "DF [" not in out.output


def test_a_serving_result_shows_its_own_dimensions_and_metrics(tmp_path):
    out = tmp_path / "serve.parquet"
    result = run("serve", "llama3.1-70b-h100-8-fp8", "--out", str(out), "-n", "0")
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out).sort("output_tokens_per_s_per_gpu", descending=True).head(8)
    for width in (80, 120):
        text = display.table_text(frame, width=width)
        assert max(len(line) for line in rendered(text, width).splitlines()) <= width
        header = text.splitlines()[0].split()
        assert {"row_id", "ttft_s", "tpot_s", "tok/s/gpu", "mem_GiB", "fits"} <= set(header)
        assert "tok/s/gpu = output_tokens_per_s_per_gpu" in text
    differ, held = display.varying(frame)
    assert set(differ) | set(held) == set(display.dimensions(frame)) and "mode" in display.dimensions(frame)


def test_compare_fits_an_80_column_terminal(tmp_path):
    from click.testing import CliRunner

    from paraspace.explorer.cli import main

    out = tmp_path / "s.parquet"
    assert CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--out", str(out), "--no-progress", "-n", "0",
                                     "--no-simulate"]).exit_code == 0
    ids = [str(i) for i in pl.read_parquet(out).sort("row_id")["row_id"].head(2)]
    result = CliRunner().invoke(main, ["compare", str(out), "--ids", ids[0], "--ids", ids[1]], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["column", ids[0], ids[1], "difference"]
    assert max(len(line) for line in lines) <= 80
    assert any(line.split()[:1] == ["step_time_s"] for line in lines)


def test_a_frame_too_wide_for_the_terminal_is_printed_expanded_not_folded():
    """The study's best trials and ``compare`` print any frame: as a table where it fits,
    else one block per row (name, value) so that no header or label is cut mid-word."""
    frame = pl.DataFrame({"trial": [3, 7], "output_tokens_per_s_per_gpu": [312.0, 236.5],
                          "scheduler": ["continuous-unchunked", "static"]})
    table = display.frame_text(frame, width=120)
    assert table.splitlines()[0].split() == ["trial", "output_tokens_per_s_per_gpu", "scheduler"]
    assert len(table.splitlines()) == 4  # header, rule, two rows
    expanded = display.frame_text(frame, width=30)
    lines = expanded.splitlines()
    assert lines[0] == "-[ 1 ]-" and lines[4] == "-[ 2 ]-" and len(lines) == 8
    assert lines[1].split() == ["trial", "3"] and lines[3].split() == ["scheduler", "continuous-unchunked"]
    assert lines[6].split() == ["output_tokens_per_s_per_gpu", "236.5"]
