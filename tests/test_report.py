"""paraspace report: one self-contained HTML page, rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    results = folder / "small.parquet"
    assert CliRunner().invoke(main, ["sweep", "llama3-8b-h100-64", "--out", str(results), "--no-progress",
                                     "-n", "0"]).exit_code == 0
    out = folder / "report.html"
    result = CliRunner().invoke(main, ["report", str(results), "--out", str(out), "-n", "5"])
    assert result.exit_code == 0, result.output
    return out


def _outside_scripts(text: str) -> str:
    return re.sub(r"<script>.*?</script>", "", text, flags=re.S)


def test_page_is_self_contained(page):
    text = page.read_text()
    for heading in ("Best configurations", "Step time vs memory", "Where the time goes", "Sensitivity",
                    "The two best, side by side"):
        assert heading in text
    # three interactive Plotly charts, Plotly's JavaScript embedded once, nothing fetched from elsewhere
    assert len(re.findall(r'class="plotly-graph-div"', text)) == 3
    assert text.count("<script>") >= 2 and "Plotly.newPlot" in text
    html_only = _outside_scripts(text)
    assert not re.search(r'(src|href)="(http|//|/)', html_only)
    assert not re.search(r"<script[^>]+src=", text)
    assert 'table class="sortable" id="best"' in html_only
    assert html_only.count("<tr>") >= 1 + 5  # a header and the five best rows


def test_breakdown_bars_end_at_the_ranked_step_time(page):
    """Each best row's bar: the closed form's parts plus the event engine's correction
    add up to the simulated step time the ranking used."""
    import json

    import polars as pl

    from paraspace.results.report import SIM_DELTA
    from paraspace.results.schema import STEP_PARTS

    text = page.read_text()
    rows = json.loads(re.search(r"const ROWS = (\{.*?\});", text, flags=re.S).group(1))
    frame = pl.read_parquet(page.parent / "small.parquet")
    best = frame.filter(pl.col("feasible")).sort("step_time_s").head(5)
    for row in best.iter_rows(named=True):
        shown = rows[str(row["row_id"])]
        total = sum(shown[p] for p in STEP_PARTS) + shown[SIM_DELTA]
        assert total == pytest.approx(row["step_time_s"], rel=1e-12)
        assert shown["step_time_lo_s"] < shown["step_time_s"] < shown["step_time_hi_s"]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (.ci/run installs it)")
def test_page_renders_in_headless_chromium(page, tmp_path):
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000", f"--screenshot={shot}",
         page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.is_file(), proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a rendered page, not a blank one


def test_serving_results_get_the_serving_page(tmp_path):
    """A paraspace serve result: the best deployments, the throughput-per-GPU against
    throughput-per-user front, sensitivity; self-contained like the training page."""
    from paraspace.explorer.serve import run_serve
    from paraspace.spaces.serving import load_serving

    served = tmp_path / "serve.parquet"
    run_serve(load_serving("llama3.1-70b-h100-8-fp8"), served, simulate_top=2)
    out = tmp_path / "serve.html"
    result = CliRunner().invoke(main, ["report", str(served), "--out", str(out), "-n", "5"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    for heading in ("Best deployments", "Throughput per GPU against throughput per user", "Sensitivity"):
        assert heading in text
    assert len(re.findall(r'class="plotly-graph-div"', text)) == 2
    assert not re.search(r'(src|href)="(http|//|/)', _outside_scripts(text))
    assert "output_tokens_per_s_per_gpu" in _outside_scripts(text)
    # every plotted deployment (all the feasible ones: fewer than the scatter's sample) can be clicked,
    # its panel the file's values
    import json

    import polars as pl

    rows = json.loads(re.search(r"const ROWS = (\{.*?\});", text).group(1))
    feasible = pl.read_parquet(served).filter(pl.col("feasible"))
    assert set(rows) >= {str(i) for i in feasible["row_id"]}
    one = feasible.row(feasible.height - 1, named=True)
    assert rows[str(one["row_id"])]["ttft_s"] == one["ttft_s"]


def test_held_dimensions_show_the_feasible_rows_values(tmp_path):
    """tp 1 or 8 on 8 GPUs, one sequence per GPU at tp 1: only tp 8 fits, so tp is held at 8
    among the feasible rows and the note says so (not the infeasible first row's tp 1)."""
    space = tmp_path / "held.toml"
    space.write_text('name = "held"\ndescription = "d"\nmodel = "llama3-8b"\nhardware = "h100-sxm5-80gb"\n'
                     'devices = 8\nglobal_batch = 8\nseq_len = 4096\n[dimensions]\ntp = [1, 8]\npp = [1]\n'
                     'micro_batch = [1]\nrecompute = ["full"]\nzero = [0]\n')
    runner = CliRunner()
    out = tmp_path / "held.parquet"
    assert runner.invoke(main, ["sweep", str(space), "--out", str(out), "--no-progress", "-n", "0"]).exit_code == 0
    import polars as pl

    feasible = pl.read_parquet(out).filter(pl.col("feasible"))
    assert feasible["tp"].to_list() == [8]
    html_out = tmp_path / "held.html"
    assert runner.invoke(main, ["report", str(out), "--out", str(html_out)]).exit_code == 0
    note = re.search(r"Held at one value: ([^.<]*)", html_out.read_text()).group(1)
    assert note.startswith("devices = 8, tp = 8, pp = 1, dp = 1,")
