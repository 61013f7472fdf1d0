"""The event engine (``kernels.engine``): the kernel against the plain-Python
reference (``naive_engine.simulate``) on thousands of seeded random task
graphs, deadlock detection, determinism (also across processes), conservation
and monotonicity, and the CSR / interval helpers on hand-derived examples."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import naive_engine
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.kernels import engine
from paraspace.kernels.engine import DEADLOCK, OK

PROPS = settings(max_examples=150, deadline=None)
TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent


# --------------------------------------------------------------------------- random task graphs


class Graph(NamedTuple):
    """A task graph as plain lists (what ``naive_engine.simulate`` takes)."""

    durations: list[int]
    resources: list[int]
    kinds: list[int]
    syncs: list[int]
    edges: list[tuple[int, int]]
    orders: list[list[int]]

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The kernel's arguments (all but the outputs), CSR built here with numpy
        rather than with ``engine.csr_from_edges`` (tested on its own below)."""
        n = len(self.durations)
        e = np.array(self.edges, dtype=np.int64).reshape(-1, 2)
        by_src = np.argsort(e[:, 0], kind="stable")
        succ_ptr = np.concatenate([[0], np.cumsum(np.bincount(e[:, 0], minlength=n))]).astype(np.int64)
        succ_idx = e[by_src, 1].astype(np.int32)
        n_pred = np.bincount(e[:, 1], minlength=n).astype(np.int32)
        order_ptr = np.concatenate([[0], np.cumsum([len(o) for o in self.orders])]).astype(np.int64)
        order_idx = np.array([t for o in self.orders for t in o], dtype=np.int32)
        return (np.array(self.durations, dtype=np.int64), np.array(self.resources, dtype=np.int32),
                np.array(self.kinds, dtype=np.int8), np.array(self.syncs, dtype=np.int32),
                succ_ptr, succ_idx, n_pred, order_ptr, order_idx)

    def with_duration(self, task: int, duration: int) -> Graph:
        durations = list(self.durations)
        durations[task] = duration
        return self._replace(durations=durations)


def run_kernel(args: tuple[np.ndarray, ...]) -> tuple[int, list[int], list[int]]:
    n = args[0].shape[0]
    start_ns = np.full(n, 7, dtype=np.int64)  # garbage: the kernel must overwrite every entry
    end_ns = np.full(n, 7, dtype=np.int64)
    status = engine.simulate(*args, start_ns, end_ns)
    return int(status), start_ns.tolist(), end_ns.tolist()


def random_graph(rng: np.random.Generator, *, max_tasks: int = 24, max_res: int = 4, p_sync: float = 0.2,
                 scramble: bool = False) -> Graph:
    """A random task graph that cannot deadlock unless ``scramble``.

    Tasks are laid out in slots: a slot is one task, or a sync group of 2 or
    more tasks on distinct resources. Edges only go from an earlier slot to a
    later one and each resource runs its tasks in slot order, so contracting
    every slot to a node leaves a DAG: every slot can run once the ones before
    it have. Task ids are shuffled so that id order (the last tie-break) is
    unrelated to slot order. Durations are mostly tiny (0 included) so that
    ends tie often. ``scramble`` then shuffles some resource orders and adds
    a few edges in any direction, which often deadlocks.
    """
    n_res = int(rng.integers(1, max_res + 1))
    target = int(rng.integers(1, max_tasks + 1))
    slot_of: list[int] = []
    resources: list[int] = []
    syncs: list[int] = []
    n_groups = 0
    while len(resources) < target:
        slot = len(set(slot_of))
        if n_res >= 2 and rng.random() < p_sync:
            members = rng.choice(n_res, size=int(rng.integers(2, n_res + 1)), replace=False)
            for r in members:
                resources.append(int(r))
                syncs.append(n_groups)
                slot_of.append(slot)
            n_groups += 1
        else:
            resources.append(int(rng.integers(n_res)))
            syncs.append(-1)
            slot_of.append(slot)
    n = len(resources)
    new_id = rng.permutation(n)  # old id -> new id
    p_edge = float(rng.uniform(0.0, 0.4))
    edges = [(int(new_id[a]), int(new_id[b])) for a in range(n) for b in range(n)
             if slot_of[a] < slot_of[b] and rng.random() < p_edge]
    orders = [[int(new_id[t]) for t in sorted((t for t in range(n) if resources[t] == r), key=lambda t: slot_of[t])]
              for r in range(n_res)]
    small = rng.choice([0, 0, 1, 2, 3, 5], size=n)
    durations = np.where(rng.random(n) < 0.7, small, rng.integers(0, 1000, size=n))
    kinds = rng.integers(0, engine.N_KINDS, size=n)

    def relabel(values):
        out = [0] * n
        for old in range(n):
            out[int(new_id[old])] = int(values[old])
        return out

    if scramble:
        for order in orders:
            if rng.random() < 0.5:
                rng.shuffle(order)
        for _ in range(int(rng.integers(0, 3))):
            edges.append((int(rng.integers(n)), int(rng.integers(n))))
        edges = [(a, b) for a, b in edges if a != b]
    return Graph(relabel(durations), relabel(resources), relabel(kinds), relabel(syncs), edges, orders)


def makespan(ends: list[int]) -> int:
    return max(ends, default=0)


# --------------------------------------------------------------------------- kernel == reference


def test_matches_reference_on_random_graphs():
    """3000 deadlock-free graphs (up to ~27 tasks, 4 resources, sync groups,
    zero durations, ties): status OK and bit-identical starts and ends."""
    rng = np.random.default_rng(20240611)
    n_sync = 0
    for _ in range(3000):
        g = random_graph(rng)
        n_sync += any(s >= 0 for s in g.syncs)
        expected = naive_engine.simulate(*g)
        assert expected[0] == OK, g
        assert run_kernel(g.arrays()) == expected, g
    assert n_sync > 1000  # the sync-group path is well exercised


def test_matches_reference_on_scrambled_graphs():
    """1500 graphs with shuffled resource orders and stray edges (many
    deadlock): same status, and the same starts/ends (-1 where a task never ran)."""
    rng = np.random.default_rng(7)
    n_deadlocks = 0
    for _ in range(1500):
        g = random_graph(rng, scramble=True)
        expected = naive_engine.simulate(*g)
        n_deadlocks += expected[0] == DEADLOCK
        assert run_kernel(g.arrays()) == expected, g
    assert 200 < n_deadlocks < 1300  # both outcomes are well represented


def test_larger_graphs_match_reference():
    """A few bigger graphs (up to 300 tasks on 8 resources) for heap depth."""
    rng = np.random.default_rng(99)
    for _ in range(15):
        g = random_graph(rng, max_tasks=300, max_res=8, p_sync=0.1)
        assert run_kernel(g.arrays()) == naive_engine.simulate(*g)


def test_times_are_the_max_plus_fixed_point():
    """Independent of either simulator's mechanics: a plain task starts at the
    latest of its predecessors' ends and its resource predecessor's end (0 if
    none); a sync member "arrives" at that time and every member starts at the
    group's latest arrival; every task ends at start + duration."""
    rng = np.random.default_rng(3)
    for _ in range(500):
        g = random_graph(rng)
        status, starts, ends = run_kernel(g.arrays())
        assert status == OK
        ready = [0] * len(g.durations)
        for a, b in g.edges:
            ready[b] = max(ready[b], ends[a])
        for order in g.orders:
            for prev, task in zip(order, order[1:]):
                ready[task] = max(ready[task], ends[prev])
        groups: dict[int, list[int]] = {}
        for t, s in enumerate(g.syncs):
            if s >= 0:
                groups.setdefault(s, []).append(t)
        for t, d in enumerate(g.durations):
            assert ends[t] == starts[t] + d
            if g.syncs[t] < 0:
                assert starts[t] == ready[t]
            else:
                assert starts[t] == max(ready[u] for u in groups[g.syncs[t]])


# --------------------------------------------------------------------------- hand-derived


def test_chain_on_two_resources():
    """0 (r0, 5) -> 1 (r1, 3); 2 (r0, 4) runs after 0 on r0, independent of 1:
    0 = [0, 5), 1 = [5, 8), 2 = [5, 9)."""
    g = Graph([5, 3, 4], [0, 1, 0], [0, 5, 0], [-1, -1, -1], [(0, 1)], [[0, 2], [1]])
    assert naive_engine.simulate(*g) == (OK, [0, 5, 5], [5, 8, 9])
    assert run_kernel(g.arrays()) == (OK, [0, 5, 5], [5, 8, 9])


def test_sync_group_starts_at_latest_arrival():
    """Group {2 on r0, 3 on r1}: 2 arrives when 0 (r0, 4) ends at 4, 3 when 1
    (r1, 10) ends at 10; both start at 10 and run 2 and 6 ns. Task 4 (r0, after
    2 in order) waits for r0, held by 2 from 4 to 12: [12, 13)."""
    g = Graph([4, 10, 2, 6, 1], [0, 1, 0, 1, 0], [0, 0, 6, 6, 0], [-1, -1, 0, 0, -1], [],
              [[0, 2, 4], [1, 3]])
    expected = (OK, [0, 0, 10, 10, 12], [4, 10, 12, 16, 13])
    assert naive_engine.simulate(*g) == expected
    assert run_kernel(g.arrays()) == expected


def test_zero_duration_tasks_chain_at_one_instant():
    """Three 0 ns tasks in a chain across resources, then a 2 ns one: all of
    the first three start and end at 0; the last runs [0, 2)."""
    g = Graph([0, 0, 0, 2], [0, 1, 2, 0], [0, 9, 5, 1], [-1] * 4, [(0, 1), (1, 2), (2, 3)], [[0, 3], [1], [2]])
    assert run_kernel(g.arrays()) == (OK, [0, 0, 0, 0], [0, 0, 0, 2])


def test_empty_graph_and_idle_resource():
    """No tasks: OK. A resource with an empty order is simply never used."""
    empty = Graph([], [], [], [], [], [[]])
    assert run_kernel(empty.arrays()) == (OK, [], [])
    g = Graph([3], [1], [0], [-1], [], [[], [0], []])
    assert run_kernel(g.arrays()) == (OK, [0], [3])


def test_kinds_compute_then_communication():
    """Kinds below K_PP are compute, the rest communication, in both engines."""
    assert naive_engine.K_FIRST_COMM == engine.K_FIRST_COMM == engine.K_PP == 5
    assert len(engine.KIND_NAMES) == engine.N_KINDS == 10


# --------------------------------------------------------------------------- deadlock


def test_deadlock_order_contradicts_dependency():
    """r0 runs 1 before 0 but 1 waits on 0: neither can run. Task 2 (r1, 7 ns)
    is independent and finishes; the other two keep start = end = -1."""
    g = Graph([5, 5, 7], [0, 0, 1], [0, 0, 0], [-1, -1, -1], [(0, 1)], [[1, 0], [2]])
    expected = (DEADLOCK, [-1, -1, 0], [-1, -1, 7])
    assert naive_engine.simulate(*g) == expected
    assert run_kernel(g.arrays()) == expected


def test_deadlock_crossed_collectives():
    """Two collectives issued in opposite orders on two resources: A = {0 on
    r0, 3 on r1}, B = {1 on r0, 2 on r1}; r0 runs 0 then 1, r1 runs 2 then 3.
    0 holds r0 waiting for 3, which is behind 2 on r1; 2 holds r1 waiting for
    1, which is behind 0 on r0. Nothing ever starts."""
    g = Graph([1, 1, 1, 1], [0, 0, 1, 1], [6, 6, 6, 6], [0, 1, 1, 0], [], [[0, 1], [2, 3]])
    expected = (DEADLOCK, [-1] * 4, [-1] * 4)
    assert naive_engine.simulate(*g) == expected
    assert run_kernel(g.arrays()) == expected


def test_deadlock_sync_member_waits_on_its_group():
    """Group {0 on r0, 1 on r1} with an edge 0 -> 1: 1 cannot arrive before 0
    ends, 0 cannot start before 1 arrives. Task 2 after 0 on r0 never runs either."""
    g = Graph([2, 2, 2], [0, 1, 0], [7, 7, 0], [0, 0, -1], [(0, 1)], [[0, 2], [1]])
    assert run_kernel(g.arrays()) == (DEADLOCK, [-1] * 3, [-1] * 3)
    assert naive_engine.simulate(*g) == (DEADLOCK, [-1] * 3, [-1] * 3)


def test_deadlock_sync_group_on_one_resource():
    """Both members of a group on r0: the first holds r0 from its arrival, so
    the second never reaches the head of r0's order."""
    g = Graph([1, 1], [0, 0], [6, 6], [0, 0], [], [[0, 1]])
    assert run_kernel(g.arrays()) == (DEADLOCK, [-1, -1], [-1, -1])


def test_deadlock_is_prompt_on_a_long_chain():
    """200,000 tasks of 1 ns in a chain, alternating between 2 resources; on
    r1 the last task (n-1) is put before n-3, which it depends on through n-2.
    The first n-3 = 199,997 run (ends 1 .. 199,997), the last three stay -1,
    and the call returns at once (it never loops)."""
    n = 200_000
    dur = np.ones(n, dtype=np.int64)
    res = (np.arange(n) % 2).astype(np.int32)
    src = np.arange(n - 1, dtype=np.int32)
    succ_ptr, succ_idx, n_pred = engine.csr_from_edges(n, src, src + 1)
    seq = np.arange(n, dtype=np.int64)
    seq[n - 3], seq[n - 1] = seq[n - 1], seq[n - 3]  # both odd, on r1: n-1 now runs before n-3
    order_ptr, order_idx = engine.order_from_lists(2, res, seq)
    args = (dur, res, np.zeros(n, dtype=np.int8), np.full(n, -1, dtype=np.int32), succ_ptr, succ_idx, n_pred,
            order_ptr, order_idx)
    began = time.perf_counter()
    status, starts, ends = run_kernel(args)
    assert time.perf_counter() - began < 5.0
    assert status == DEADLOCK
    assert ends[: n - 3] == list(range(1, n - 2))
    assert ends[n - 3:] == [-1, -1, -1] and starts[n - 3:] == [-1, -1, -1]


# --------------------------------------------------------------------------- determinism


def test_same_arrays_same_output():
    """Repeated calls on the same arrays (and on copies) are bit-identical."""
    rng = np.random.default_rng(11)
    for _ in range(50):
        args = random_graph(rng, max_tasks=60, scramble=bool(rng.random() < 0.3)).arrays()
        first = run_kernel(args)
        assert run_kernel(args) == first
        assert run_kernel(tuple(a.copy() for a in args)) == first


def _digest(seed: int) -> str:
    """Hash of the kernel's output on 200 graphs drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    h = hashlib.sha256()
    for _ in range(200):
        status, starts, ends = run_kernel(random_graph(rng, max_tasks=40, scramble=bool(rng.random() < 0.3)).arrays())
        h.update(json.dumps([status, starts, ends]).encode())
    return h.hexdigest()


def test_deterministic_across_processes():
    """Two fresh interpreters compute the same digest as this one."""
    code = "import sys; sys.path[:0] = sys.argv[1:3]; import test_engine; print(test_engine._digest(5))"
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    digests = {
        subprocess.run([sys.executable, "-c", code, str(TESTS_DIR), str(REPO_DIR)], cwd=REPO_DIR, env=env,
                       capture_output=True, text=True, check=True, timeout=120).stdout.strip()
        for _ in range(2)
    }
    assert digests == {_digest(5)}


# --------------------------------------------------------------------------- conservation, monotonicity


def test_busy_plus_idle_is_makespan():
    """Per resource: sum of its tasks' durations (busy) + the part of
    [0, makespan) none of them covers (idle, by ``uncovered_ns``) == makespan.
    It would exceed it if two tasks of a resource overlapped."""
    rng = np.random.default_rng(12)
    for _ in range(400):
        g = random_graph(rng)
        status, starts, ends = run_kernel(g.arrays())
        assert status == OK
        span = makespan(ends)
        for r, order in enumerate(g.orders):
            by_start = sorted(order, key=lambda t: starts[t])
            busy = sum(g.durations[t] for t in order)
            idle = engine.uncovered_ns(np.array([0], dtype=np.int64), np.array([span], dtype=np.int64),
                                       np.array([starts[t] for t in by_start], dtype=np.int64),
                                       np.array([ends[t] for t in by_start], dtype=np.int64))
            assert busy + idle == span, (r, g)
            assert [starts[t] for t in order] == sorted(starts[t] for t in order)  # runs in its order


@PROPS
@given(seed=st.integers(0, 2**32 - 1), pick=st.integers(0, 10**6), extra=st.integers(1, 2000))
def test_longer_task_never_shortens(seed, pick, extra):
    """Lengthening one task never makes any task start or end earlier, so the
    makespan never shrinks (times are max-plus in the durations)."""
    g = random_graph(np.random.default_rng(seed))
    task = pick % len(g.durations)
    _, starts, ends = run_kernel(g.arrays())
    status, starts2, ends2 = run_kernel(g.with_duration(task, g.durations[task] + extra).arrays())
    assert status == OK
    assert all(a <= b for a, b in zip(starts, starts2))
    assert all(a <= b for a, b in zip(ends, ends2))
    assert makespan(ends2) >= makespan(ends)


# --------------------------------------------------------------------------- uncovered_ns


def _brute_uncovered(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Unit cells [t, t+1) inside some A interval and inside no B interval."""
    horizon = max([e for _, e in a + b], default=0)
    return sum(1 for t in range(horizon)
               if any(s <= t < e for s, e in a) and not any(s <= t < e for s, e in b))


def _uncovered(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    def cols(iv):
        return (np.array([s for s, _ in iv], dtype=np.int64), np.array([e for _, e in iv], dtype=np.int64))

    return int(engine.uncovered_ns(*cols(a), *cols(b)))


def test_uncovered_hand_examples():
    """A = [0, 10), B = [2, 4) + [3, 6): B covers [2, 6), 10 - 4 = 6.
    A = [0, 4) + [2, 8) + [10, 12) (union 8), B = [5, 11): uncovered
    [0, 5) + [11, 12) = 6. Empty A: 0. Empty B: the union of A."""
    assert _uncovered([(0, 10)], [(2, 4), (3, 6)]) == 6
    assert _uncovered([(0, 4), (2, 8), (10, 12)], [(5, 11)]) == 6
    assert _uncovered([], [(0, 5)]) == 0
    assert _uncovered([(1, 3), (3, 7), (9, 9)], []) == 6


intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), max_size=8).map(
    lambda xs: sorted((s, s + w) for s, w in xs))


@settings(max_examples=400, deadline=None)
@given(a=intervals, b=intervals)
def test_uncovered_matches_brute_force(a, b):
    """Random intervals on a 52-cell grid (sorted by start, overlapping, empty,
    touching): the kernel equals counting the unit cells one by one."""
    assert _uncovered(a, b) == _brute_uncovered(a, b)


# --------------------------------------------------------------------------- CSR helpers


def test_csr_from_edges_hand_example():
    """Edges 0->1, 0->2, 2->3, 1->3 on 4 tasks: successors [1, 2 | 3 | 3 | -],
    ptr [0, 2, 3, 4, 4]; predecessor counts [0, 1, 1, 2]. Edge order within a
    source is kept."""
    src = np.array([0, 0, 2, 1], dtype=np.int32)
    dst = np.array([1, 2, 3, 3], dtype=np.int32)
    ptr, idx, n_pred = engine.csr_from_edges(4, src, dst)
    assert ptr.tolist() == [0, 2, 3, 4, 4]
    assert idx.tolist() == [1, 2, 3, 3]
    assert n_pred.tolist() == [0, 1, 1, 2]
    ptr, idx, n_pred = engine.csr_from_edges(3, src[:0], dst[:0])
    assert ptr.tolist() == [0, 0, 0, 0] and idx.tolist() == [] and n_pred.tolist() == [0, 0, 0]


def test_order_from_lists_hand_example():
    """res [1, 0, 1, 0, 1], seq [5, 2, 1, 2, 9]: r0 holds tasks 1 and 3, both
    seq 2, kept in id order (stable); r1 holds 2 (seq 1), 0 (5), 4 (9).
    ptr [0, 2, 5], idx [1, 3, 2, 0, 4]. A third resource with no task: ptr ends [.., 5, 5]."""
    res = np.array([1, 0, 1, 0, 1], dtype=np.int32)
    seq = np.array([5, 2, 1, 2, 9], dtype=np.int64)
    ptr, idx = engine.order_from_lists(2, res, seq)
    assert ptr.tolist() == [0, 2, 5]
    assert idx.tolist() == [1, 3, 2, 0, 4]
    ptr, idx = engine.order_from_lists(3, res, seq)
    assert ptr.tolist() == [0, 2, 5, 5]


def test_csr_helpers_feed_the_engine():
    """The kernel's CSR helpers build the same arrays as ``Graph.arrays`` (numpy)."""
    rng = np.random.default_rng(21)
    for _ in range(200):
        g = random_graph(rng)
        dur, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx = g.arrays()
        e = np.array(g.edges, dtype=np.int32).reshape(-1, 2)
        ptr, idx, npred = engine.csr_from_edges(len(g.durations), e[:, 0].copy(), e[:, 1].copy())
        assert ptr.tolist() == succ_ptr.tolist() and idx.tolist() == succ_idx.tolist()
        assert npred.tolist() == n_pred.tolist()
        seq = np.zeros(len(g.durations), dtype=np.int64)
        for order in g.orders:
            for position, t in enumerate(order):
                seq[t] = position
        optr, oidx = engine.order_from_lists(len(g.orders), res, seq)
        assert optr.tolist() == order_ptr.tolist() and oidx.tolist() == order_idx.tolist()
