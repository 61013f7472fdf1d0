"""Several `paraspace study` processes cooperate on one study through PostgreSQL.

The fixture starts a real PostgreSQL server on loopback in a temporary folder
(the binaries come from Debian's postgresql package, which .ci/run installs);
where it cannot (no binaries, no psycopg2, not root to switch to the postgres
user), the test is skipped with the reason, never passed silently.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest

SMALL = "llama3-8b-h100-64"


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    matches = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return matches[-1] if matches else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url():
    initdb, postgres, runuser = _binary("initdb"), _binary("postgres"), shutil.which("runuser")
    if not (initdb and postgres):
        pytest.skip("PostgreSQL server binaries not found (install Debian's postgresql package)")
    pytest.importorskip("psycopg2", reason="psycopg2 (the test extra) is not installed")
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        if not runuser:
            pytest.skip("running as root without runuser to start postgres as another user")
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("no 'postgres' system user to run the server as")
        as_user = [runuser, "-u", "postgres", "--"]
    # not under pytest's tmp root: it is private to root, and the server runs as postgres
    base = Path(tempfile.mkdtemp(prefix="paraspace-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    if as_user:
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True)
    port = _free_port()
    log = base / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen([*as_user, postgres, "-D", str(data), "-k", str(sock), "-p", str(port),
                                   "-h", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=sink)
    import psycopg2

    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres").close()
            break
        except psycopg2.OperationalError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.terminate()
                pytest.skip(f"PostgreSQL did not start: {log.read_text()[-500:]}")
            time.sleep(0.2)
    yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    server.terminate()
    server.wait(timeout=30)
    shutil.rmtree(base, ignore_errors=True)


def test_two_processes_share_one_study(postgres_url, tmp_path):
    import optuna

    cmd = [sys.executable, "-m", "paraspace.explorer.cli", "study", SMALL, "--trials", "24", "--batch", "8", "--storage",
           postgres_url, "--study-name", "shared", "--out", str(tmp_path), "--sampler", "random"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    procs = [subprocess.Popen([*cmd, "--seed", str(seed)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for seed in (1, 2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-2000:]
    study = optuna.load_study(study_name="shared", storage=postgres_url)
    numbers = [t.number for t in study.trials]
    assert len(numbers) == 48 and len(set(numbers)) == 48  # both processes' trials, none lost or repeated
    told = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)  # PRUNED: a broken rule
    assert all(t.state in told for t in study.trials)
    parts = list((tmp_path / "shared").glob("*.parquet"))
    assert parts and pl.read_parquet(parts).height > 0
