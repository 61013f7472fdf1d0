"""The engine's replay (``kernels.engine.replay_program`` / ``replay``): one graph
run for many sets of durations at once, the event tier's shared graphs.

The order in which the engine's pass resolves the tasks depends on the graph
only, so a graph's times for any durations follow from pulling each task's
start from its predecessors' ends in that order. Checked here: bit-equality
with ``run`` (and so with the plain-Python reference ``test_engine`` checks
``run`` against) on random graphs with synchronisation groups, several
duration sets per graph; deadlock found by the program whatever the
durations; and the per-set exposure helpers (``busy_prefix``/``exposed_ns``)
against brute-force interval arithmetic, with hand-derived cases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import random_graph

from paraspace.kernels import engine
from paraspace.kernels.engine import DEADLOCK, N_KINDS, OK


def _prepared(args):
    dur, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx = args
    plan = engine.prepare(sync, n_pred, order_ptr, order_idx)
    work = engine.workspace(dur.shape[0], plan[3].shape[0] - 1)
    return plan, work


def _replayed(args, sets: np.ndarray):
    """Ends of every set of durations (tasks x sets) by ``replay``, and the status."""
    dur, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx = args
    plan, work = _prepared(args)
    status, seq, pred_ptr, pred_idx = engine.replay_program(sync, succ_ptr, succ_idx, plan, work)
    end = np.full(sets.shape, -7, dtype=np.int64)
    if status == OK:
        engine.replay(np.ascontiguousarray(sets), seq, pred_ptr, pred_idx, plan[3], plan[4], end)
    return int(status), end


def _run(args, dur: np.ndarray):
    _, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx = args
    n = dur.shape[0]
    start = np.empty(n, dtype=np.int64)
    end = np.empty(n, dtype=np.int64)
    status = engine.simulate(np.ascontiguousarray(dur), res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr,
                             order_idx, start, end)
    return int(status), start, end


def test_replay_equals_run_on_random_graphs():
    rng = np.random.default_rng(20261125)
    n_checked = 0
    for _ in range(400):
        args = random_graph(rng, max_tasks=40, max_res=5, p_sync=0.3).arrays()
        n = args[0].shape[0]
        n_sets = int(rng.integers(1, 9))
        # set 0 is the graph's own durations; the others are new ones, ties included
        sets = np.empty((n, n_sets), dtype=np.int64)
        sets[:, 0] = args[0]
        sets[:, 1:] = rng.choice([0, 1, 2, 5, 100, 997], size=(n, n_sets - 1))
        status, end = _replayed(args, sets)
        assert status == OK
        for c in range(n_sets):
            status_c, start_c, end_c = _run(args, sets[:, c])
            assert status_c == OK
            assert end[:, c].tolist() == end_c.tolist()
            assert (end[:, c] - sets[:, c]).tolist() == start_c.tolist()  # start = end - duration
            n_checked += 1
    assert n_checked > 1000


def test_deadlock_is_a_property_of_the_graph():
    """Scrambled graphs often deadlock; the program says so exactly when ``run`` does,
    whatever the durations."""
    rng = np.random.default_rng(7)
    seen = {OK: 0, DEADLOCK: 0}
    for _ in range(300):
        args = random_graph(rng, max_tasks=20, max_res=4, scramble=True).arrays()
        n = args[0].shape[0]
        sets = rng.integers(0, 50, size=(n, 3)).astype(np.int64)
        status, end = _replayed(args, sets)
        for c in range(3):
            assert _run(args, sets[:, c])[0] == status
        seen[status] += 1
        if status == OK:
            for c in range(3):
                assert end[:, c].tolist() == _run(args, sets[:, c])[2].tolist()
    assert seen[OK] > 20 and seen[DEADLOCK] > 20


def test_sync_group_by_hand():
    """Two resources; task 0 (5 ns) on resource 0 then the collective {1, 2} on both
    resources; task 3 on resource 1 follows the collective. Set 0: durations (5, 3, 3,
    4): the collective starts when its last member arrives, at 5 (member 2's resource
    is idle from 0, member 1 waits for task 0), ends at 8, task 3 runs 8..12. Set 1:
    (1, 10, 10, 0): collective at 1..11, task 3 at 11..11."""
    dur = np.array([[5, 1], [3, 10], [3, 10], [4, 0]], dtype=np.int64)
    res = np.array([0, 0, 1, 1], dtype=np.int32)
    kind = np.zeros(4, dtype=np.int8)
    sync = np.array([-1, 0, 0, -1], dtype=np.int32)
    succ_ptr = np.zeros(5, dtype=np.int64)
    succ_idx = np.zeros(0, dtype=np.int32)
    n_pred = np.zeros(4, dtype=np.int32)
    order_ptr = np.array([0, 2, 4], dtype=np.int64)
    order_idx = np.array([0, 1, 2, 3], dtype=np.int32)
    args = (dur[:, 0].copy(), res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx)
    status, end = _replayed(args, dur)
    assert status == OK
    assert end[:, 0].tolist() == [5, 8, 8, 12]
    assert end[:, 1].tolist() == [1, 11, 11, 11]


# --------------------------------------------------------------------------- exposure per set


def _brute_exposed(comm: list[tuple[int, int, int]], compute: list[tuple[int, int]]) -> list[int]:
    """Per kind: each comm task's time [s, e) not covered by a compute task, by
    intersecting with every compute interval (they are disjoint)."""
    acc = [0] * N_KINDS
    for s, e, k in comm:
        covered = sum(max(0, min(e, ce) - max(s, cs)) for cs, ce in compute)
        acc[k] += (e - s) - covered
    return acc


def _stream(rng: np.random.Generator, n: int, horizon: int) -> list[tuple[int, int]]:
    """n disjoint intervals in time order (zero-length ones and touching ones included)."""
    cuts = np.sort(rng.integers(0, horizon, size=2 * n))
    return [(int(cuts[2 * i]), int(cuts[2 * i + 1])) for i in range(n)]


def _exposed_by_kernel(comm_sets, compute_sets, kinds) -> np.ndarray:
    """``exposed_ns`` over sets: the compute stream's tasks are 0..nc-1, the comm
    stream's nc..; one column per set of times."""
    nc = len(compute_sets[0])
    nm = len(comm_sets[0])
    n_sets = len(comm_sets)
    end = np.empty((nc + nm, n_sets), dtype=np.int64)
    dur = np.empty((nc + nm, n_sets), dtype=np.int64)
    for c in range(n_sets):
        for t, (s, e) in enumerate(compute_sets[c] + comm_sets[c]):
            end[t, c] = e
            dur[t, c] = e - s
    kind = np.array([0] * nc + kinds, dtype=np.int8)
    order_idx = np.arange(nc + nm, dtype=np.int32)
    b_end = np.empty((max(nc, 1), n_sets), dtype=np.int64)
    b_busy = np.empty((nc + 1, n_sets), dtype=np.int64)
    engine.busy_prefix(order_idx, 0, nc, dur, end, b_end, b_busy)
    acc = np.zeros((n_sets, N_KINDS), dtype=np.int64)
    engine.exposed_ns(order_idx, nc, nc + nm, nc, b_end, b_busy, kind, dur, end, n_sets, acc)
    return acc


def test_exposed_by_hand():
    """Compute busy [0, 10) and [20, 30); a PP send [5, 25) is exposed over [10, 20) = 10
    ns; a DP transfer [28, 40) over [30, 40) = 10 ns; a zero-length one adds 0."""
    comm = [(5, 25), (28, 40), (40, 40)]
    acc = _exposed_by_kernel([comm], [[(0, 10), (20, 30)]], [engine.K_PP, engine.K_DP, engine.K_DP])
    assert acc[0, engine.K_PP] == 10
    assert acc[0, engine.K_DP] == 10
    assert acc[0].sum() == 20


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), nc=st.integers(0, 12), nm=st.integers(0, 12), n_sets=st.integers(1, 5))
def test_exposed_matches_brute_force(seed, nc, nm, n_sets):
    rng = np.random.default_rng(seed)
    kinds = [int(k) for k in rng.integers(engine.K_FIRST_COMM, N_KINDS, size=nm)]
    compute_sets = [_stream(rng, nc, 200) for _ in range(n_sets)]
    comm_sets = [_stream(rng, nm, 200) for _ in range(n_sets)]
    acc = _exposed_by_kernel(comm_sets, compute_sets, kinds)
    for c in range(n_sets):
        assert acc[c].tolist() == _brute_exposed([(s, e, k) for (s, e), k in zip(comm_sets[c], kinds)],
                                                 compute_sets[c])
