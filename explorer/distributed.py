"""Run a sweep's shards on a Dask distributed cluster.

    paraspace sweep SPACE --dask tcp://scheduler:8786 --shards 64
    paraspace sweep SPACE --dask local --shards 4        # a LocalCluster on this machine

Each shard is the same deterministic slice of the product that ``--shard I/N``
evaluates, run by ``explorer.sweep.run_sweep`` on a worker and written as
``OUT/part-I-of-N.parquet`` (a shared filesystem is assumed for a remote
cluster); the folder is then one dataset for ``top``, ``pareto`` and
``compare``. The loaded space (model and hardware resolved) is pickled to the
workers, so they need the package, not the caller's files.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paraspace.explorer.signals import deferred_interrupts
from paraspace.explorer.sweep import DEFAULT_CHUNK, run_sweep, shard_path, shard_range
from paraspace.results.writer import ensure_folder, partial_path
from paraspace.spaces.catalog import LoadedSpace
from paraspace.spaces.errors import CatalogError

#: how long to try reaching a scheduler before saying it cannot be reached
CONNECT_TIMEOUT_S = 10.0


def _run_shard(space: LoadedSpace, out: str, index: int, count: int, chunk_rows: int,
               options: dict[str, Any]) -> dict[str, Any]:
    """On a worker: evaluate shard ``index`` of ``count`` with the sweep's ``options``
    (``run_sweep``'s simulate, max_tasks, simulate_top) and write it."""
    from paraspace.spaces.encode import Encoder

    n = Encoder(space).n_combinations
    start, stop = shard_range(n, index, count)
    summary = run_sweep(space, shard_path(Path(out), index, count), chunk_rows=chunk_rows, progress=False,
                        start=start, stop=stop, keep_empty=True, **options)
    return {"path": str(summary.path), "n_combinations": summary.n_combinations, "n_rows": summary.n_rows,
            "n_feasible": summary.n_feasible, "n_simulated": summary.n_simulated, "seconds": summary.seconds,
            "first_reason": summary.first_reason.tolist(), "breaks": summary.breaks.tolist()}


def dask_setup(worker: Any) -> None:
    """Run in each worker process of the local cluster (its ``preload``): ignore SIGINT. A
    terminal's Ctrl-C reaches the whole process group, and workers that took it died
    mid-shard with a traceback each; the caller alone takes it and closes the cluster
    (the nannies end the workers with SIGTERM). The worker's own logging is quieted as the
    caller's is when it stops (``_quiet_shutdown``): a worker whose heartbeat was in flight
    as the scheduler closed logged its failure with a traceback after the run's one line.
    A shard's failure still reaches the caller, as the exception its future raises."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _quiet_shutdown()


def _quiet_shutdown() -> None:
    """A stopped or failed run closes the cluster mid-task: the client's gather tasks end
    with AllExit ("Task exception was never retrieved") and distributed warns of
    cancelled tasks and lost workers. The run says once what happened; this noise goes."""
    for name in ("distributed", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


#: ``PYTHONWARNINGS`` entry that quiets the multiprocessing resource tracker's warning of
#: leaked semaphores: the tracker (a process of its own, started with the local cluster's
#: first worker) warns at exit of the semaphores of workers a Ctrl-C or a failure ended,
#: after the run has said once what happened
TRACKER_QUIET = "ignore:resource_tracker:UserWarning"


@contextmanager
def quiet_resource_tracker() -> Iterator[None]:
    """While a local cluster starts (its workers, and with them the resource tracker,
    inherit the environment then), ``TRACKER_QUIET`` joins ``PYTHONWARNINGS``; the
    caller's environment is as it was afterwards."""
    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(w for w in (before, TRACKER_QUIET) if w)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = before


def connect(address: str, cluster: Any, timeout_s: float) -> Any:
    """A Client of ``cluster``, or of the scheduler at ``address``; a ``CatalogError`` naming
    the address when it cannot be reached or read."""
    from dask.distributed import Client

    if cluster is not None:
        return Client(cluster)
    try:
        return Client(address, timeout=timeout_s)
    except (OSError, TimeoutError, ValueError, TypeError) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise CatalogError("command line", "--dask", address, "the address of a running Dask scheduler "
                           f"(tcp://HOST:PORT) or 'local' (could not connect: {reason[:200]})") from None


def run_on_dask(space: LoadedSpace, out_dir: Path, address: str, shards: int,
                chunk_rows: int = DEFAULT_CHUNK, connect_timeout_s: float | None = None,
                options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Submit every shard to the cluster at ``address`` ("local": a LocalCluster) and wait;
    ``options`` go to every shard's ``run_sweep`` (simulate, max_tasks, simulate_top).

    A run that fails or is stopped (Ctrl-C, SIGTERM) ends the local cluster's workers in the middle
    of their shards: their staging files (``part-I-of-N.parquet.partial``) are removed then, as a
    shard's own writer removes its file after an error (``results.writer``)."""
    from dask.distributed import LocalCluster

    # a local cluster's workers log errors only (a shard's error reaches the caller through gather)
    # and ignore SIGINT (its preload: this module's dask_setup)
    cluster = None
    started = done = False
    try:
        try:
            if address == "local":  # started whole: a Ctrl-C meanwhile is raised once it is up, then it is closed
                with deferred_interrupts(), quiet_resource_tracker():
                    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=logging.ERROR, preload=[__name__])
            with connect(address, cluster, CONNECT_TIMEOUT_S if connect_timeout_s is None else connect_timeout_s) \
                    as client:
                ensure_folder(out_dir)
                started = True
                try:
                    futures = [client.submit(_run_shard, space, str(out_dir), i, shards, chunk_rows,
                                             options or {}, pure=False) for i in range(shards)]
                    parts = client.gather(futures)
                except BaseException:  # before the client closes: closing it is what ends its gather tasks
                    _quiet_shutdown()
                    raise
                done = True
                return parts
        finally:
            if cluster is not None:
                if not done:
                    _quiet_shutdown()
                cluster.close()
    finally:
        if started and not done:  # after the workers are gone: nothing writes them any more
            for i in range(shards):
                partial_path(shard_path(out_dir, i, shards)).unlink(missing_ok=True)


__all__ = ["run_on_dask"]
