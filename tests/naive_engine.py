"""Slow, obviously correct references for the event engine and the pipeline
schedules (``kernels.engine.simulate``, ``kernels.pipeline.compute_order``).

Plain Python over plain lists, written from the descriptions in the kernels'
docstrings and ``shared/design/modeling.md`` section 6, never by calling a
kernel. The kind and schedule codes are spelt out here so that a renumbering in
``kernels.engine`` or ``kernels.codes`` shows up as a failure.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

# kernels.engine, spelt out on purpose
K_FIRST_COMM = 5  # kinds below it are compute (event priority 0), the rest communication (1)
OK, DEADLOCK = 0, 1
# kernels.codes / spaces.enums.Schedule
GPIPE, ONE_F_ONE_B, INTERLEAVED = 0, 1, 2
F, B = 0, 1  # kernels.pipeline.F_PASS / B_PASS


def simulate(durations, resources, kinds, syncs, edges, orders):
    """Run a task graph; returns ``(status, starts, ends)`` with -1 for tasks that never ran.

    durations, resources, kinds, syncs: one entry per task (sync group or -1);
    edges: ``(src, dst)`` pairs, dst waits for src to end; orders: one list of
    task ids per resource, the order in which that resource runs them.

    A task starts when it is the head of its resource's order, the resource is
    idle and every predecessor has ended. A member of a sync group takes its
    resource when it gets there ("arrives") and keeps it; when the last member
    arrives, all members start at that (latest) arrival time. Events are task
    ends, taken one at a time in the order (time, 0 for compute / 1 for
    communication, task id); after each one, everything that can start, starts.
    When no event is left and some task never ran, the status is DEADLOCK.
    """
    n = len(durations)
    succs = [[] for _ in range(n)]
    waiting_on = [0] * n  # predecessors not yet ended
    for src, dst in edges:
        succs[src].append(dst)
        waiting_on[dst] += 1
    group_size = defaultdict(int)
    for g in syncs:
        if g >= 0:
            group_size[g] += 1
    arrivals = defaultdict(list)  # group -> [(time, task)] of the members that arrived
    head = [0] * len(orders)  # index of the next task in each resource's order
    busy = [False] * len(orders)
    starts = [-1] * n
    ends = [-1] * n
    events = []
    now = 0
    n_ended = 0

    def launch(task, at):
        starts[task] = at
        ends[task] = at + durations[task]
        heapq.heappush(events, (ends[task], 0 if kinds[task] < K_FIRST_COMM else 1, task))

    while True:
        # start (or, for sync members, arrive) wherever possible, until nothing changes
        changed = True
        while changed:
            changed = False
            for r, order in enumerate(orders):
                if busy[r] or head[r] == len(order):
                    continue
                task = order[head[r]]
                if waiting_on[task] > 0:
                    continue
                busy[r] = True
                changed = True
                g = syncs[task]
                if g < 0:
                    launch(task, now)
                    continue
                arrivals[g].append((now, task))
                if len(arrivals[g]) == group_size[g]:
                    latest = max(t for t, _ in arrivals[g])
                    for _, member in arrivals[g]:
                        launch(member, latest)
        if not events:
            break
        now, _, task = heapq.heappop(events)
        n_ended += 1
        r = resources[task]
        busy[r] = False
        head[r] += 1
        for s in succs[task]:
            waiting_on[s] -= 1
    return (OK if n_ended == n else DEADLOCK), starts, ends


def compute_order(schedule, p, v, m, d):
    """One device's compute order as ``[(pass, chunk, micro), ...]``, pass F=0 / B=1.

    GPipe (Huang et al. 2019): every forward, then every backward, micro-batch
    order. 1F1B (PipeDream-flush, Narayanan et al. 2021): ``min(p - d - 1, m)``
    warm-up forwards, then a forward and a backward alternately until the
    forwards run out, then the remaining backwards. Interleaved (Megatron-LM
    ``forward_backward_pipelining_with_interleaving``): micro-batches go in
    groups of p; within a group the forwards run chunk 0 for its p micro-batches,
    then chunk 1, ..., then chunk v-1, and the backwards run the chunks the
    other way round (v-1 first); warm-up ``2 (p - d - 1) + (v - 1) p`` forwards
    (at most all ``m v``), then 1F1B over these two sequences. 1F1B is the
    interleaved schedule with v = 1 and warm-up ``p - d - 1``.
    """
    if schedule == GPIPE:
        return [(F, 0, i) for i in range(m)] + [(B, 0, i) for i in range(m)]
    forwards = []
    backwards = []
    for first in range(0, m, p):
        group = range(first, min(first + p, m))
        for c in range(v):
            forwards += [(F, c, i) for i in group]
        for c in reversed(range(v)):
            backwards += [(B, c, i) for i in group]
    if schedule == INTERLEAVED:
        warm_up = min(2 * (p - d - 1) + (v - 1) * p, m * v)
    else:
        warm_up = min(p - d - 1, m * v)
    order = forwards[:warm_up]
    rest_f = forwards[warm_up:]
    for k, fwd in enumerate(rest_f):
        order += [fwd, backwards[k]]
    order += backwards[len(rest_f):]
    return order


def in_flight_peak(order):
    """Most forwards whose backward has not run yet, along a compute order."""
    live = peak = 0
    for pass_, _, _ in order:
        live += 1 if pass_ == F else -1
        peak = max(peak, live)
    return peak


W = 2  # kernels.pipeline.W_PASS


def dualpipe_order(p, m, d):
    """DualPipe's compute order on device d as ``[(pass, chunk, micro), ...]``, pass F=0 / B=1 / W=2.

    Written from DeepSeek's ``DualPipe.step`` (deepseek-ai/DualPipe): micro-batches
    0 .. m/2 - 1 run downwards through chunk 0 (stage d on device d), m/2 .. m - 1
    upwards through chunk 1 (stage p - 1 - d on device d). With H = p / 2, h =
    min(d, p - 1 - d) and M = m / 2, "near" is the direction in which the device
    is stage h, "far" the other one; the eight steps are
    2 (H - h - 1) near F | (h + 1) x (near F, far F) | (H - h - 1) x (far B with
    its W, far F) | (M - p + h + 1) x (near F, far B, far F, near B) | (H - h - 1)
    x (far B, far F, near B) | (h + 1) x (far B, near B), from the middle on the
    W's deferred to a queue | (H - h - 1) x (queued W, near B deferred) | (h + 1)
    queued W's. A backward not deferred is followed by its W. For M < p the order
    of M = p with the surplus micro-batches left out.
    """
    half, h, mh = p // 2, min(d, p - 1 - d), m // 2
    pad = max(mh, p)
    near, far = (1, 0) if d >= half else (0, 1)  # chunk of each direction on this device
    nxt = {("F", near): 0, ("F", far): 0, ("B", near): 0, ("B", far): 0}
    queue = []
    out = []

    def take(kind, c):
        k = nxt[(kind, c)]
        nxt[(kind, c)] = k + 1
        return k, c * mh + k

    def fwd(c):
        k, i = take("F", c)
        if k < mh:
            out.append((F, c, i))

    def bwd(c, defer):
        k, i = take("B", c)
        if k < mh:
            out.append((B, c, i))
        if defer:
            queue.append((k, c, i))
        elif k < mh:
            out.append((W, c, i))

    def weight():
        k, c, i = queue.pop(0)
        if k < mh:
            out.append((W, c, i))

    for _ in range(2 * (half - h - 1)):
        fwd(near)
    for _ in range(h + 1):
        fwd(near)
        fwd(far)
    for _ in range(half - h - 1):
        bwd(far, True)
        weight()
        fwd(far)
    for _ in range(pad - p + h + 1):
        fwd(near)
        bwd(far, False)
        fwd(far)
        bwd(near, False)
    for _ in range(half - h - 1):
        bwd(far, False)
        fwd(far)
        bwd(near, False)
    first_deferred = (h + 1) // 2
    for i in range(h + 1):
        bwd(far, i > first_deferred or (i == first_deferred and h % 2 == 1))
        bwd(near, i >= first_deferred)
    for _ in range(half - h - 1):
        weight()
        bwd(near, True)
    for _ in range(h + 1):
        weight()
    return out


def pipedream_order(p, m, d):
    """One steady-state period of PipeDream's asynchronous 1F1B on device d:
    B(j - 1) then F(j + p - 1 - d) for j = 0 .. m - 1 (absolute micro-batch
    numbers: -1 is the previous period's; the task graph labels micro-batch j as j + 1)."""
    out = []
    for j in range(m):
        out.append((B, 0, j - 1))
        out.append((F, 0, j + p - 1 - d))
    return out
