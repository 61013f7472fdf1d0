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


def test_page_is_self_contained(page):
    text = page.read_text()
    for heading in ("Best configurations", "Step time vs memory", "Where the time goes", "Sensitivity"):
        assert heading in text
    assert len(re.findall(r'src="data:image/png;base64,', text)) == 2
    assert not re.search(r'(src|href)="(http|//|/)', text)  # nothing fetched from elsewhere
    assert text.count("<tr>") >= 5 + 10  # five best rows, one sensitivity row per dimension


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
