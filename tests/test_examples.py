"""The examples run as written (issue 17): every command of docs/examples/README.md, in order, from
a folder laid out like the repository root, and the README's two calibrate commands."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.results import top
from paraspace.spaces.catalog import load_hardware

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"


def commands(markdown: Path, prefix: str = "") -> list[str]:
    """The lines of the file's ```bash blocks that start with ``prefix``, comments dropped."""
    lines, inside = [], False
    for line in markdown.read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash"
            continue
        if inside and line.startswith(prefix):
            lines.append(line.split("  #")[0].strip())
    return lines


def run_as_written(line: str, cwd: Path) -> str:
    """One shell line: ``paraspace ...`` through the CLI, ``python ...`` as a process; its output."""
    argv = shlex.split(line)
    if argv[0] == "paraspace":
        result = CliRunner().invoke(main, argv[1:], catch_exceptions=False)
        assert result.exit_code == 0, f"{line}\n{result.output}"
        return result.stdout  # what the reader sees printed; the first run's compile notice goes to stderr
    assert argv[0] == "python", line
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def repo_root(tmp_path, monkeypatch) -> Path:
    """A scratch folder that looks like the repository root (docs/ linked in): outputs land in it."""
    (tmp_path / "docs").symlink_to(ROOT / "docs", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_examples_readme_runs_in_order(repo_root):
    lines = commands(EXAMPLES / "README.md")
    assert [shlex.split(line)[:2] for line in lines] == [
        ["paraspace", "calibrate"], ["paraspace", "calibrate"], ["paraspace", "eval"], ["paraspace", "sweep"],
        ["paraspace", "top"], ["paraspace", "pareto"], ["python", "docs/examples/analyze_results.py"]]
    out = [run_as_written(line, repo_root) for line in lines]

    gemm, both = load_hardware(str(repo_root / "my-h100-gemm.toml")), load_hardware(str(repo_root / "my-h100.toml"))
    assert "15 bf16 shapes" in out[0] and "worst round-trip error 0.00%" in out[0]
    assert len(gemm.device.gemm_efficiency) == 15  # one (m, n, k, efficiency) point per shape
    assert both.device.gemm_efficiency == gemm.device.gemm_efficiency  # the comm fit extends the GEMM fit
    ib = next(link for link in both.links if link.name == "ib")
    assert "tier ib from 11 measurements" in out[1]
    assert ib.op_bandwidth_GB_per_s["all_reduce"] == pytest.approx(44.65, rel=0.01)
    assert out[2].startswith("my-3b on 8 x ")  # the custom model on the calibrated profile
    assert "48 combinations -> 48 candidates" in out[3]

    results = repo_root / "results" / "my-space.parquet"
    assert pl.read_parquet(results).height == 48
    best = top(results, 1).row(0, named=True)
    assert f" {best['row_id']} " in out[4] and f"{best['step_time_s']:.3f}" in out[4]
    assert out[5].splitlines()[1].split() == ["row_id", "tp", "pp", "step_time_s", "mem_peak_GiB"]
    assert f"fastest that fits: row_id {best['row_id']}: tp={best['tp']}" in out[6]
    assert "configurations on the step time / memory front" in out[6]


def test_the_readme_calibrate_commands_write_distinct_files(repo_root):
    lines = commands(ROOT / "README.md", "paraspace calibrate")
    assert len(lines) == 2
    outs = [shlex.split(line)[shlex.split(line).index("--out") + 1] for line in lines]
    assert len(set(outs)) == 2
    for line in lines:
        run_as_written(line, repo_root)
    first, second = (load_hardware(str(repo_root / name)) for name in outs)
    assert first.name != second.name
    assert second.device.gemm_efficiency == first.device.gemm_efficiency  # the second keeps the first's fit


def test_the_space_file_names_its_model_by_a_relative_path():
    text = (EXAMPLES / "my-space.toml").read_text()
    assert 'model = "my-model.toml"' in text and "paraspace sweep docs/examples/my-space.toml" in text
