"""Compile the kernels ahead of a run, each group once, the groups in parallel.

Numba compiles a kernel on its first call and keeps the machine code in its cache
(``kernels.jit``: one folder per version of the kernels' sources), so a fresh machine's
first sweep spends minutes compiling and later ones none. Processes that start
together on a cold cache each compile every kernel they call: two pytest workers,
or two sweep shards on one node, compile the training tiers twice over (measured on
the test suite, 2 cores: about 1,200 s of compiling, 380 s of it twice).

``precompile`` compiles each group of kernels (``GROUPS``) in a process of its own,
``jobs`` at a time, longest first, through the calls a run makes on a small catalog
space, so the cache holds the signatures a run reads. Run it once per machine and
kernel version (``paraspace precompile``; the test suite does it before its workers
start); on a warm cache each group only loads what it finds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

#: rows of a catalog space each group evaluates: enough for every kernel to run once
ROWS = 16


def _training_rows(ref: str):
    """(packed space, its first ``ROWS`` encoded rows) of a catalog training space."""
    from paraspace.explorer.evaluate import pack
    from paraspace.spaces.catalog import load_space
    from paraspace.spaces.encode import Encoder

    space = load_space(ref)
    cols = Encoder(space).encode_all().columns
    return space, pack(space), {k: np.ascontiguousarray(v[:ROWS]) for k, v in cols.items()}


def training() -> None:
    """The analytic tier (``kernels.training``): every sweep and study row."""
    from paraspace.explorer.evaluate import analytic

    _, packed, cols = _training_rows("llama3-8b-h100-64")
    analytic(packed, cols)


def event() -> None:
    """The event tier (``kernels.event_tier``, ``kernels.pipeline``, ``kernels.engine``):
    the simulated rows and ``paraspace trace``. Called directly, without the analytic
    tier (the ``training`` group's), on unit step times: compiling needs types, not values."""
    from paraspace.explorer import timeline
    from paraspace.explorer.evaluate import kernel_strategy
    from paraspace.kernels.event_tier import DEFAULT_BUCKETS, simulate_rows

    space, packed, cols = _training_rows("llama3-8b-h100-64")
    n = len(cols["tp"])
    ones = np.ones(n)
    simulate_rows(*kernel_strategy(cols), packed.model, packed.device, packed.tiers, packed.tiles, packed.workload,
                  np.ones(n, dtype=bool), ones.copy(), ones.copy(), ones.copy(), DEFAULT_BUCKETS)
    row = {k: int(v[0]) for k, v in cols.items()}
    timeline.capture(space, packed, row)


def serving() -> None:
    """The serving tiers (``kernels.serving``, ``kernels.serving_sim``): analytic rows,
    the simulation of aggregated and disaggregated deployments, and their traces, under
    a closed loop of fixed lengths and under Poisson arrivals of drawn lengths with
    speculative decoding (which the simulation takes with other argument types)."""
    from paraspace.explorer import serve_timeline
    from paraspace.explorer.serve import evaluate_space
    from paraspace.spaces.serving import load_serving

    for ref in ("llama3.1-70b-h100-8-fp8", "deepseek-v3-h800-disagg", "qwen3-235b-a22b-h200-8"):
        space = load_serving(ref)
        evaluate_space(space, simulate_top=1)
        serve_timeline.capture(space, {})


#: group -> its compile call, the longest first, so that on 2 processes the event tier
#: runs beside the other two (cold cache, 2 cores, 2026-11-27: event 260-283 s, training
#: 146-173 s, serving 108-145 s before it ran a Poisson space too; about 360 s in all in
#: the test suite's cold run)
GROUPS: dict[str, Callable[[], None]] = {"event": event, "training": training, "serving": serving}


def _timed(name: str) -> tuple[str, float]:
    began = time.perf_counter()
    GROUPS[name]()
    return name, time.perf_counter() - began


def precompile(jobs: int = 2, groups: tuple[str, ...] = tuple(GROUPS)) -> dict[str, float]:
    """Compile ``groups`` (``GROUPS``' names) in up to ``jobs`` fresh processes; the
    seconds each took, by name. A group that fails raises its error here."""
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown kernel groups {unknown}; expected some of {list(GROUPS)}")
    # spawned, not forked: a fresh interpreter per group, as a run's workers are
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(groups))), mp_context=get_context("spawn")) as pool:
        return dict(pool.map(_timed, groups))
