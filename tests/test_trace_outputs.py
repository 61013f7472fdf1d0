"""trace's two files follow the output rules of every command (results.writer): both targets are
checked before anything is simulated or written, an existing file is replaced only where it is an
earlier trace of ours (marked: the JSON's first key, the PNG's text chunk), and both are staged and
renamed together, so a failure or an interrupt leaves the earlier pair byte-identical and no
staging file behind."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.results import trace as trace_mod
from paraspace.results.rank import ResultsError
from paraspace.results.trace import (
    PNG_SIGNATURE,
    TRACE_START,
    Timeline,
    check_trace_files,
    png_is_ours,
    write_chrome_trace,
    write_gantt_png,
    write_text,
    written_together,
)

matplotlib.use("Agg")

SMALL = "llama3-8b-h100-64"
SERVING = "llama3.1-70b-h100-8-fp8"


def timeline(title: str = "toy") -> Timeline:
    """Two stages, three tasks: enough for both files, without a simulation."""
    return Timeline(device=np.array([0, 0, 1]), stream=np.array([0, 1, 0]), kind=np.array([0, 1, 0]),
                    micro=np.array([0, -1, 0]), chunk=np.array([0, -1, 0]),
                    start_s=np.array([0.0, 0.001, 0.002]), end_s=np.array([0.001, 0.002, 0.003]),
                    stream_names=("compute", "ib"), kind_names=("forward", "pp"), title=title)


def earlier_pair(prefix: Path) -> dict[Path, str]:
    """An earlier trace of ours at PREFIX.json / PREFIX.png; their digests."""
    write_chrome_trace(timeline("earlier"), prefix.with_name(prefix.name + ".json"))
    write_gantt_png(timeline("earlier"), prefix.with_name(prefix.name + ".png"))
    return digests(prefix.parent)


def digests(folder: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    last = result.output.rstrip("\n").splitlines()[-1]
    assert last.startswith("Error: ") and all(n in last for n in needles), last
    return last


def run(*argv: str):
    return CliRunner().invoke(main, list(argv))


def test_both_files_are_marked_as_ours_and_still_load(tmp_path):
    json_path = write_chrome_trace(timeline(), tmp_path / "t.json")
    png_path = write_gantt_png(timeline(), tmp_path / "t.png")
    text = json_path.read_text()
    assert text.startswith(TRACE_START)
    data = json.loads(text)  # the mark is one more top-level key; the trace is unchanged
    assert data["generator"] == "paraspace trace" and data["otherData"]["title"] == "toy"
    assert any(e["ph"] == "X" for e in data["traceEvents"])
    assert png_path.read_bytes()[:8] == PNG_SIGNATURE and png_is_ours(png_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.png"]  # no staging file left
    write_text("{}", tmp_path / "e.json")
    assert json.loads((tmp_path / "e.json").read_text()) == {"generator": "paraspace trace"}


def test_an_earlier_trace_of_ours_is_replaced(tmp_path):
    before = earlier_pair(tmp_path / "t")
    write_chrome_trace(timeline("later"), tmp_path / "t.json")
    write_gantt_png(timeline("later"), tmp_path / "t.png")
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["title"] == "later"
    assert digests(tmp_path) != before and len(digests(tmp_path)) == 2


def test_a_png_not_written_by_trace_is_not_ours(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    fig.savefig(tmp_path / "plain.png")
    plt.close(fig)
    assert not png_is_ours(tmp_path / "plain.png")
    with pytest.raises(ResultsError, match=r"plain\.png: .*without the text 'Software: paraspace trace'"):
        check_trace_files(tmp_path / "x.json", tmp_path / "plain.png")


@pytest.mark.parametrize("space", [SMALL, SERVING])
def test_foreign_files_at_the_prefix_are_refused_before_anything_runs(tmp_path, monkeypatch, space):
    """trace --out out/mine over someone's mine.json and mine.png: refused, both kept, no simulation."""
    (tmp_path / "mine.json").write_text('{"mine": 1}\n')
    (tmp_path / "mine.png").write_bytes(PNG_SIGNATURE + b"not ours")
    before = digests(tmp_path)
    monkeypatch.setattr("paraspace.explorer.timeline.capture", never)
    monkeypatch.setattr("paraspace.explorer.serve_timeline.capture", never)
    one_line_error(run("trace", "--space", space, "--out", str(tmp_path / "mine")),
                   f"{tmp_path / 'mine.json'}: output file", "trace JSON written by paraspace trace",
                   "refusing to overwrite it")
    (tmp_path / "mine.json").unlink()
    del before[tmp_path / "mine.json"]
    one_line_error(run("trace", "--space", space, "--out", str(tmp_path / "mine")),
                   f"{tmp_path / 'mine.png'}: output file", "Gantt PNG written by paraspace trace")
    assert digests(tmp_path) == before


def test_a_png_target_that_cannot_be_written_leaves_the_earlier_json(tmp_path, monkeypatch):
    """trace --out out/pd with out/pd.png a folder: refused before pd.json is touched."""
    before = earlier_pair(tmp_path / "pd")
    (tmp_path / "pd.png").unlink()
    (tmp_path / "pd.png").mkdir()
    del before[tmp_path / "pd.png"]
    monkeypatch.setattr("paraspace.explorer.timeline.capture", never)
    one_line_error(run("trace", "--space", SMALL, "--set", "tp=2", "--out", str(tmp_path / "pd")),
                   f"{tmp_path / 'pd.png'}: output file", "it is a folder")
    assert digests(tmp_path) == before


def never(*args, **kwargs):
    raise AssertionError("simulated, though the output was refused")


def cut_savefig(monkeypatch, stop: type[BaseException]) -> None:
    """The PNG's ``savefig`` writes its staged file, then raises ``stop`` (an interrupt, a full disk)."""
    real = matplotlib.figure.Figure.savefig

    def cut(fig, path, **kwargs):
        real(fig, path, **kwargs)
        raise OSError(28, "No space left on device") if stop is OSError else stop()

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_a_failure_while_writing_the_png_replaces_neither_file(tmp_path, monkeypatch, stop):
    """After the JSON is written, before the PNG is: the earlier pair stays byte-identical and no
    staging file is left."""
    before = earlier_pair(tmp_path / "t")
    cut_savefig(monkeypatch, stop)
    with pytest.raises(ResultsError if stop is OSError else KeyboardInterrupt):
        with written_together():
            write_chrome_trace(timeline("later"), tmp_path / "t.json")
            write_gantt_png(timeline("later"), tmp_path / "t.png")
    assert digests(tmp_path) == before  # t.json.partial, t.png.partial: gone too


def test_an_interrupted_write_alone_leaves_the_earlier_file(tmp_path, monkeypatch):
    before = earlier_pair(tmp_path / "t")
    cut_savefig(monkeypatch, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        write_gantt_png(timeline("later"), tmp_path / "t.png")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(trace_mod, "publish", interrupted)  # the staged JSON is whole, not yet renamed
    with pytest.raises(KeyboardInterrupt):
        write_chrome_trace(timeline("later"), tmp_path / "t.json")
    assert digests(tmp_path) == before


def test_written_together_publishes_both_only_at_the_end(tmp_path):
    before = earlier_pair(tmp_path / "t")
    with written_together():
        write_chrome_trace(timeline("later"), tmp_path / "t.json")
        write_gantt_png(timeline("later"), tmp_path / "t.png")
        assert {p: d for p, d in digests(tmp_path).items() if not p.name.endswith(".partial")} == before
    after = digests(tmp_path)
    assert sorted(p.name for p in after) == ["t.json", "t.png"]
    assert all(after[p] != before[p] for p in before)


def test_trace_command_replaces_its_own_earlier_trace(tmp_path):
    prefix = tmp_path / "run"
    for tp in (2, 4):
        result = run("trace", "--space", SMALL, "--set", f"tp={tp}", "--set", "pp=4", "--out", str(prefix))
        assert result.exit_code == 0, result.output
        assert json.loads((tmp_path / "run.json").read_text())["otherData"]["title"].count(f"tp={tp}") == 1
    assert png_is_ours(tmp_path / "run.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.png"]
