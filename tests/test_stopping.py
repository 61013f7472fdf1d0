"""A run stopped by SIGTERM (a Slurm time limit, ``timeout``, Kubernetes) or Ctrl-C cleans up as
after an error: its staging file ``NAME.partial`` is removed, an earlier result stays
byte-identical, one line says so, and the exit status is 128 + the signal's number (143, 130)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

import paraspace.explorer.sweep as sweep_mod
import paraspace.results.writer as writer_mod
from paraspace.explorer import cli, signals
from paraspace.results.writer import PARTIAL_SUFFIX, ResultWriter

SMALL = "llama3-8b-h100-64"
#: an earlier result to keep: the writer replaces only files that begin with Parquet's magic
EARLIER = b"PAR1 an earlier result, kept byte for byte"
STOPPED = "stopped (exit status {}); its staged output removed, earlier results left as they were"


def test_sigterm_mid_sweep_removes_the_partial_keeps_the_earlier_file_and_exits_143(tmp_path):
    """A real `paraspace sweep`, signalled once its NAME.parquet.partial exists: the second pass
    (36 chunks of 64 rows, most simulated) then has seconds left, the poll a few milliseconds."""
    out = tmp_path / "r.parquet"
    out.write_bytes(EARLIER)
    partial = tmp_path / ("r.parquet" + PARTIAL_SUFFIX)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "paraspace.explorer.cli", "sweep", SMALL, "--out", str(out),
                             "--no-progress", "-n", "0", "--chunk-rows", "64"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a first run compiles the kernels
    while not partial.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no partial file in 300 s"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.splitlines()[-1] == "SIGTERM: " + STOPPED.format(143) and "Traceback" not in stderr, stderr
    assert "wrote" not in stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]
    assert out.read_bytes() == EARLIER


def test_ctrl_c_exits_130_with_the_same_line(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_sweep", interrupted)
    result = CliRunner().invoke(cli.main, ["sweep", SMALL, "--out", str(tmp_path / "r.parquet"), "--no-progress"])
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines()[-1] == "Ctrl-C: " + STOPPED.format(130)
    assert "Aborted!" not in result.output and list(tmp_path.iterdir()) == []


def test_the_sigterm_handler_is_set_only_while_a_command_runs(tmp_path, monkeypatch):
    seen = []

    def broken(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGTERM))
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "run_sweep", broken)
    before = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(cli.main, ["sweep", SMALL, "--out", str(tmp_path / "r.parquet"), "--no-progress"])
    assert isinstance(result.exception, RuntimeError)
    assert seen == [signals._on_sigterm] and signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_whose_exception_is_lost_still_stops_the_sweep_before_it_publishes(tmp_path, monkeypatch):
    """The handler's exception raised inside C code that clears errors (numba's dispatcher probing
    an argument's attributes: seen about one run in thirty) is lost; the sweep raises it again at
    its next chunk or before publishing, never writes its result, and a second SIGTERM changes nothing."""
    out = tmp_path / "r.parquet"
    out.write_bytes(EARLIER)
    real = sweep_mod.evaluate_encoded

    def swallowed(*args, **kwargs):
        cols = real(*args, **kwargs)
        for _ in range(2):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)  # the handler runs here, in the main thread
            except KeyboardInterrupt:
                pass  # lost, as C code that clears errors loses it
        return cols

    monkeypatch.setattr(sweep_mod, "evaluate_encoded", swallowed)
    result = CliRunner().invoke(cli.main, ["sweep", SMALL, "--out", str(out), "--no-progress", "-n", "0"])
    assert result.exit_code == 143, result.output
    assert result.stderr.splitlines()[-1] == "SIGTERM: " + STOPPED.format(143)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"] and out.read_bytes() == EARLIER


@pytest.mark.parametrize("where", ["check_replaceable", "publish"])
def test_an_interrupt_while_closing_removes_the_partial(tmp_path, monkeypatch, where):
    """The footer is written and the file about to be renamed when the signal lands."""
    out = tmp_path / "r.parquet"
    out.write_bytes(EARLIER)
    writer = ResultWriter(out, pa.schema([("a", pa.int64())]), {}, {})

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt  # what SIGTERM raises too (cli.Terminated)

    with pytest.raises(KeyboardInterrupt), writer:
        writer.write(pa.table({"a": [1, 2]}))
        monkeypatch.setattr(writer_mod, where, interrupt)
        writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]
    assert out.read_bytes() == EARLIER


def test_an_interrupt_as_the_writer_opens_removes_the_partial(tmp_path, monkeypatch):
    """The staging file is made and the writer assigned when the signal lands, before ``__enter__``
    returns, so ``__exit__`` never runs: CI saw a SIGTERM there leave ``r.parquet.partial`` behind."""
    out = tmp_path / "r.parquet"
    out.write_bytes(EARLIER)
    real = writer_mod.writing

    @contextlib.contextmanager
    def interrupted_after(path, **kwargs):
        with real(path, **kwargs):
            yield path
        if writer_mod.partial_path(path).exists():
            raise KeyboardInterrupt  # the block (the open and the assignment) has run

    monkeypatch.setattr(writer_mod, "writing", interrupted_after)
    with pytest.raises(KeyboardInterrupt):
        with ResultWriter(out, pa.schema([("a", pa.int64())]), {}, {}):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]
    assert out.read_bytes() == EARLIER


class _CloseInterrupted:
    """``os`` as ``results.writer`` sees it, but ``close`` is interrupted once it has closed."""

    def __getattr__(self, name):
        return getattr(os, name)

    def close(self, fd):
        os.close(fd)
        raise KeyboardInterrupt


@pytest.mark.parametrize("leftover", [False, True])
def test_an_interrupt_while_probing_the_output_removes_only_the_probe(tmp_path, monkeypatch, leftover):
    """``check_writable`` makes ``NAME.partial`` to see that it can, and removes it; a SIGTERM
    between the two (a job stopped as it starts) removes it still; an earlier run's leftover
    staging file is neither removed nor truncated."""
    out = tmp_path / "r.parquet"
    staged = tmp_path / ("r.parquet" + PARTIAL_SUFFIX)
    if leftover:
        staged.write_bytes(b"half")
    monkeypatch.setattr(writer_mod, "os", _CloseInterrupted())
    with pytest.raises(KeyboardInterrupt):
        writer_mod.check_writable(out)
    assert [p.name for p in tmp_path.iterdir()] == ([staged.name] if leftover else [])
    assert not leftover or staged.read_bytes() == b"half"


def test_a_stopped_dask_run_removes_its_shards_partial_files(tmp_path, monkeypatch):
    """The driver stopped while workers write their parts: after the workers are gone, every
    part-I-of-N.parquet.partial of the run is removed; complete files are left as they are."""
    pytest.importorskip("dask.distributed", reason="dask[distributed] (the test extra) is not installed")
    from paraspace.explorer import distributed
    from paraspace.spaces.catalog import load_space

    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "part-0-of-2.parquet").write_bytes(EARLIER)

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def submit(self, fn, space, out, index, count, *args, **kwargs):  # a worker, half way through its part
            (Path(out) / f"part-{index}-of-{count}.parquet{PARTIAL_SUFFIX}").write_bytes(b"half")

        def gather(self, futures):
            raise KeyboardInterrupt  # what SIGTERM raises too (cli.Terminated)

    monkeypatch.setattr(distributed, "connect", lambda *a: Client())
    with pytest.raises(KeyboardInterrupt):
        distributed.run_on_dask(load_space(SMALL), folder, "tcp://scheduler:8786", 2)
    assert sorted(p.name for p in folder.iterdir()) == ["part-0-of-2.parquet"]
    assert (folder / "part-0-of-2.parquet").read_bytes() == EARLIER


def test_deferred_interrupts_hold_a_signal_until_the_block_ends():
    """A Ctrl-C inside ``deferred_interrupts`` lets the block finish, then raises; one that
    arrives before the block fails raises the interrupt, not the failure it caused; a SIGTERM
    held inside ``sigterm_interrupts`` comes out as ``Terminated``. Handlers are put back."""
    before = signal.getsignal(signal.SIGINT)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals.deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached.append(True)
    assert reached == [True] and signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt) as caught:
        with signals.deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            raise RuntimeError("Nanny failed to start worker process")
    assert type(caught.value) is KeyboardInterrupt
    with signals.sigterm_interrupts():
        with pytest.raises(signals.Terminated):
            with signals.deferred_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
    with signals.deferred_interrupts():  # nothing held: nothing raised
        pass


def test_ctrl_c_to_a_local_dask_run_is_one_line(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the driver and the local
    cluster's workers. Signalled once a worker is writing its part, the run exits 130 with
    the one Ctrl-C line: the workers ignore SIGINT (the driver closes them), the client's
    cancelled gathers and distributed's shutdown warnings are not printed (before: a
    traceback per worker and per shard, then warnings)."""
    pytest.importorskip("dask.distributed", reason="dask[distributed] (the test extra) is not installed")
    folder = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "paraspace.explorer.cli", "sweep", SMALL, "--out", str(folder),
                             "--no-progress", "-n", "0", "--chunk-rows", "64", "--dask", "local", "--shards", "4"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 300  # the workers compile the kernels on a first run
    while not (folder.is_dir() and any(p.name.endswith(PARTIAL_SUFFIX) for p in folder.iterdir())):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no partial part in 300 s"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["Ctrl-C: " + STOPPED.format(130)], stderr
    assert not any(p.name.endswith(PARTIAL_SUFFIX) for p in folder.iterdir())


def test_the_resource_trackers_leak_warning_is_quieted_while_a_local_cluster_starts(monkeypatch):
    """The local cluster's resource tracker (a process of its own, started with its first
    worker) warned, after a Ctrl-C's one line, of the semaphores of the workers the stop
    ended ("resource_tracker: There appear to be 2 leaked semaphore objects", seen once
    under load). ``quiet_resource_tracker`` puts the filter in ``PYTHONWARNINGS`` while the
    cluster starts, beside the caller's own, and gives the caller its environment back; a
    Python started with it prints nothing for that warning and still prints the others."""
    from paraspace.explorer.distributed import TRACKER_QUIET, quiet_resource_tracker

    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")
    with quiet_resource_tracker():
        assert os.environ["PYTHONWARNINGS"] == f"default::DeprecationWarning,{TRACKER_QUIET}"
    assert os.environ["PYTHONWARNINGS"] == "default::DeprecationWarning"
    monkeypatch.delenv("PYTHONWARNINGS")
    with quiet_resource_tracker():
        assert os.environ["PYTHONWARNINGS"] == TRACKER_QUIET
        env = dict(os.environ)
    assert "PYTHONWARNINGS" not in os.environ
    code = ("import warnings; warnings.warn('resource_tracker: There appear to be 2 leaked semaphore objects to "
            "clean up at shutdown'); warnings.warn('another warning')")
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "leaked semaphore" not in quiet.stderr and "another warning" in quiet.stderr
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={k: v for k, v in env.items() if k != "PYTHONWARNINGS"})
    assert "leaked semaphore" in loud.stderr
