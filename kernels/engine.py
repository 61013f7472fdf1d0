"""A compact array-based discrete-event engine.

A task graph is arrays: each task has an integer duration in nanoseconds, a
resource (a device's compute stream, or its stream on one link tier), a kind
(its traffic class: compute or which communication) and an optional
synchronisation group. Dependencies are CSR successor lists with a
predecessor count per task. Each resource runs its tasks one at a time in a
fixed order given by the schedule (``order_ptr``/``order_idx``): a task
starts when it is at the head of its resource's order, the resource is idle
and all its predecessors have ended. The members of a synchronisation group
(a collective) occupy their resources from their own arrival, and all start
together at the latest arrival.

With every order fixed, a task's start is the latest of its predecessors' ends
and the end of the task before it on its resource: the times are a max-plus
fixed point, so no event queue is needed and no tie between equal times can
change them. ``simulate`` computes them in one topological pass.

A schedule whose order contradicts its dependencies cannot finish: the
engine then returns ``DEADLOCK`` and leaves the unfinished tasks' ends at -1,
so the caller can name them; it never loops.
"""

from __future__ import annotations

import numpy as np

from paraspace.kernels.jit import jit

#: task kinds; the first are compute, the rest communication
K_FORWARD = 0
K_BACKWARD = 1  # backward, or its input-gradient half (B) when split
K_WEIGHT_GRAD = 2  # weight-gradient half (W) of a split backward
K_OPTIMIZER = 3
K_COMPUTE_OTHER = 4
K_PP = 5  # pipeline send/recv
K_DP = 6  # data-parallel gradient reduction / ZeRO parameter gathering
K_TP = 7
K_CP = 8
K_EP = 9
N_KINDS = 10
#: first communication kind
K_FIRST_COMM = K_PP
KIND_NAMES = ("forward", "backward", "weight_grad", "optimizer", "compute", "pp", "dp", "tp", "cp", "ep")

OK = 0
DEADLOCK = 1


@jit
def prepare(sync, n_pred, order_ptr, order_idx):
    """What a run of a graph needs besides its durations (``run``): each task's initial
    wait count (its predecessors, plus its resource unless it heads that resource's
    order), the next task on its resource, the tasks ready at time 0, and the members
    of each synchronisation group (CSR). Rows sharing a graph prepare it once."""
    n = n_pred.shape[0]
    n_res = order_ptr.shape[0] - 1
    # int64 throughout: narrower counters measured ~30% slower in ``run``
    pending0 = np.empty(n, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    n_groups = 0
    for i in range(n):
        pending0[i] = n_pred[i] + 1
        if sync[i] + 1 > n_groups:
            n_groups = sync[i] + 1
    ready0 = np.empty(n_res, dtype=np.int64)
    n_ready = 0
    for r in range(n_res - 1, -1, -1):
        lo = order_ptr[r]
        hi = order_ptr[r + 1]
        if hi == lo:
            continue
        for k in range(lo, hi - 1):
            nxt[order_idx[k]] = order_idx[k + 1]
        first = order_idx[lo]
        pending0[first] -= 1
        if pending0[first] == 0:
            ready0[n_ready] = first
            n_ready += 1
    group_ptr = np.zeros(n_groups + 1, dtype=np.int64)
    for i in range(n):
        if sync[i] >= 0:
            group_ptr[sync[i] + 1] += 1
    for g in range(n_groups):
        group_ptr[g + 1] += group_ptr[g]
    group_fill = group_ptr[:-1].copy()
    group_members = np.empty(group_ptr[n_groups], dtype=np.int64)
    for i in range(n):
        if sync[i] >= 0:
            group_members[group_fill[sync[i]]] = i
            group_fill[sync[i]] += 1
    return pending0, nxt, ready0[:n_ready], group_ptr, group_members


@jit
def workspace(n: int, n_groups: int):
    """Scratch arrays of ``run`` for graphs of ``n`` tasks and ``n_groups`` groups,
    reusable from one run to the next."""
    return (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.bool_),
            np.empty(n, dtype=np.int64), np.empty(n_groups, dtype=np.int64), np.empty(n_groups, dtype=np.int64))


@jit
def run(dur_ns, sync, succ_ptr, succ_idx, plan, work, start_ns, end_ns) -> int:
    """Run a prepared graph (``prepare``) with durations ``dur_ns``; fills ``start_ns``/
    ``end_ns`` (-1 where a task never ran). ``work``: ``workspace``'s arrays.
    Returns OK or DEADLOCK (see ``simulate``)."""
    return _kahn(dur_ns, sync, succ_ptr, succ_idx, plan, work, start_ns, end_ns, np.empty(0, dtype=np.int64))


@jit(inline=True)
def _kahn(dur_ns, sync, succ_ptr, succ_idx, plan, work, start_ns, end_ns, seq) -> int:
    """``run``'s pass; where ``seq`` is not empty it also records the order the pass
    resolves the tasks in (``replay_program``): a task outside any synchronisation
    group as its id, a group's release as -(group + 1)."""
    record = seq.shape[0] > 0
    n_seq = 0
    pending0, nxt, ready0, group_ptr, group_members = plan
    pending, ready, released, stack, group_arrived, group_latest = work
    n = dur_ns.shape[0]
    for i in range(n):
        pending[i] = pending0[i]
        ready[i] = 0
        released[i] = False
        start_ns[i] = -1
        end_ns[i] = -1
    group_arrived[:] = 0
    group_latest[:] = 0
    n_stack = ready0.shape[0]
    for k in range(n_stack):
        stack[k] = ready0[k]
    done = 0
    while n_stack > 0:
        n_stack -= 1
        task = stack[n_stack]
        g = sync[task]
        if g >= 0 and not released[task]:
            # a collective's member arrives, holding its resource; the last arrival
            # starts them all (each member comes back off the stack to run)
            group_arrived[g] += 1
            if ready[task] > group_latest[g]:
                group_latest[g] = ready[task]
            if group_arrived[g] == group_ptr[g + 1] - group_ptr[g]:
                if record:
                    seq[n_seq] = -(g + 1)
                    n_seq += 1
                for k in range(group_ptr[g], group_ptr[g + 1]):
                    j = group_members[k]
                    ready[j] = group_latest[g]
                    released[j] = True
                    stack[n_stack] = j
                    n_stack += 1
            continue
        t_start = ready[task]
        t_end = t_start + dur_ns[task]
        start_ns[task] = t_start
        end_ns[task] = t_end
        done += 1
        if record and g < 0:
            seq[n_seq] = task
            n_seq += 1
        for e in range(succ_ptr[task], succ_ptr[task + 1]):
            s = succ_idx[e]
            if t_end > ready[s]:
                ready[s] = t_end
            pending[s] -= 1
            if pending[s] == 0:
                stack[n_stack] = s
                n_stack += 1
        s = nxt[task]
        if s >= 0:
            if t_end > ready[s]:
                ready[s] = t_end
            pending[s] -= 1
            if pending[s] == 0:
                stack[n_stack] = s
                n_stack += 1
    return OK if done == n else DEADLOCK


@jit
def replay_program(sync, succ_ptr, succ_idx, plan, work):
    """What ``replay`` needs to run a prepared graph (``prepare``) for many sets of
    durations at once: (status, seq, pred_ptr, pred_idx).

    With every resource's order fixed, the order in which ``run``'s pass resolves the
    tasks depends on the graph alone, not on the durations: ``seq`` is that order
    (``_kahn``), and each task's predecessors, its resource's previous task included,
    are listed (CSR) so that its start can be pulled from their ends. A graph that
    deadlocks does so for any durations: status DEADLOCK."""
    n = sync.shape[0]
    pending0, nxt, ready0, group_ptr, group_members = plan
    n_groups = group_ptr.shape[0] - 1
    seq = np.empty(n + n_groups + 1, dtype=np.int64)  # one spare: ``_kahn`` records when not empty
    scratch = np.empty(n, dtype=np.int64)
    status = _kahn(np.zeros(n, dtype=np.int64), sync, succ_ptr, succ_idx, plan, work, scratch, scratch, seq)
    n_seq = 0
    for i in range(n):
        if sync[i] < 0:
            n_seq += 1
    n_seq += n_groups
    # predecessor lists: every dependency and resource-order edge, reversed
    n_links = 0
    for i in range(n):
        if nxt[i] >= 0:
            n_links += 1
    n_edges = succ_ptr[n] + n_links
    to_task = np.empty(n_edges, dtype=np.int64)
    from_task = np.empty(n_edges, dtype=np.int64)
    k = 0
    for i in range(n):
        for e in range(succ_ptr[i], succ_ptr[i + 1]):
            to_task[k] = succ_idx[e]
            from_task[k] = i
            k += 1
        if nxt[i] >= 0:
            to_task[k] = nxt[i]
            from_task[k] = i
            k += 1
    pred_ptr, pred_idx, _ = csr_from_edges(n, to_task, from_task)
    return status, seq[:n_seq], pred_ptr, pred_idx


@jit
def replay(dur_ns, seq, pred_ptr, pred_idx, group_ptr, group_members, end_ns) -> None:
    """``run`` for several sets of durations of one graph at once: column ``c`` of
    ``dur_ns`` (tasks x sets, int64) gives column ``c`` of ``end_ns``, the tasks'
    ends (a task starts at its end less its duration). Each task (a
    synchronisation group: all its members) is resolved in ``replay_program``'s
    order, its start the latest end of its predecessors (0 for none; a group's
    members at the latest over them all), the same max-plus recurrence ``run``
    solves, so the times equal ``run``'s bit for bit. The inner loops run over the
    sets, contiguous in memory."""
    n_sets = dur_ns.shape[1]
    latest = np.empty(n_sets, dtype=np.int64)
    for k in range(seq.shape[0]):
        u = seq[k]
        lo = u
        hi = u + 1
        if u < 0:  # a group: its members' predecessors, then its members
            lo = group_ptr[-u - 1]
            hi = group_ptr[-u]
        latest[:] = 0
        for m in range(lo, hi):
            j = u if u >= 0 else group_members[m]
            for e in range(pred_ptr[j], pred_ptr[j + 1]):
                p = pred_idx[e]
                for c in range(n_sets):
                    latest[c] = max(latest[c], end_ns[p, c])
        for m in range(lo, hi):
            j = u if u >= 0 else group_members[m]
            for c in range(n_sets):
                end_ns[j, c] = latest[c] + dur_ns[j, c]


@jit
def simulate(dur_ns, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, start_ns, end_ns) -> int:
    """Run the task graph; fills ``start_ns``/``end_ns`` (-1 where a task never ran).

    dur_ns: int64[n]; res: int32[n] resource of each task; kind: int8/int32[n];
    sync: int32[n] synchronisation group or -1; succ_ptr: int64[n+1] and
    succ_idx: int32[...] successors; n_pred: int32[n] predecessor counts;
    order_ptr: int64[R+1] and order_idx: int32[...] each resource's task order.
    Returns OK or DEADLOCK.

    With every resource's order fixed, a task starts at the latest of its
    predecessors' ends and the end of the task before it on its resource (a
    synchronisation group's members at the latest of their own such times): the
    times are the max-plus fixed point, whatever order equal-time events are seen
    in. So the run is one topological pass over the dependencies plus each
    resource's order (Kahn's algorithm with a stack, no event queue): O(tasks +
    edges). A task no order lists, or one caught in a cycle of dependencies and
    orders, never becomes ready: the run then ends with ``DEADLOCK``.
    (``prepare`` + ``run``: rows sharing a graph prepare it once.)
    """
    plan = prepare(sync, n_pred, order_ptr, order_idx)
    work = workspace(dur_ns.shape[0], plan[3].shape[0] - 1)
    return run(dur_ns, sync, succ_ptr, succ_idx, plan, work, start_ns, end_ns)


@jit
def csr_from_edges(n: int, src, dst):
    """Successor lists (CSR) and predecessor counts from an edge list."""
    n_edges = src.shape[0]
    ptr = np.zeros(n + 1, dtype=np.int64)
    n_pred = np.zeros(n, dtype=np.int32)
    for e in range(n_edges):
        ptr[src[e] + 1] += 1
        n_pred[dst[e]] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    idx = np.empty(n_edges, dtype=np.int32)
    for e in range(n_edges):
        idx[fill[src[e]]] = dst[e]
        fill[src[e]] += 1
    return ptr, idx, n_pred


@jit
def order_from_lists(n_res: int, res, seq):
    """Each resource's task order (CSR) from the tasks' resources and a global
    sequence number giving their order on their resource."""
    n = res.shape[0]
    ptr = np.zeros(n_res + 1, dtype=np.int64)
    for i in range(n):
        ptr[res[i] + 1] += 1
    for r in range(n_res):
        ptr[r + 1] += ptr[r]
    by_seq = np.argsort(seq, kind="mergesort")
    fill = ptr[:-1].copy()
    idx = np.empty(n, dtype=np.int32)
    for k in range(n):
        i = by_seq[k]
        idx[fill[res[i]]] = i
        fill[res[i]] += 1
    return ptr, idx


@jit
def order_by_id(n_res: int, res):
    """Each resource's task order (CSR) when task ids already follow each
    resource's order: a stable counting sort by resource, O(n)."""
    n = res.shape[0]
    ptr = np.zeros(n_res + 1, dtype=np.int64)
    for i in range(n):
        ptr[res[i] + 1] += 1
    for r in range(n_res):
        ptr[r + 1] += ptr[r]
    fill = ptr[:-1].copy()
    idx = np.empty(n, dtype=np.int32)
    for i in range(n):
        idx[fill[res[i]]] = i
        fill[res[i]] += 1
    return ptr, idx


@jit
def busy_prefix(order_idx, lo: int, hi: int, dur, end, b_end, b_busy) -> None:
    """A stream's tasks ``order_idx[lo:hi]`` (in time order, free of overlaps) as what
    ``exposed_ns`` reads, per set of times (columns of ``dur`` and ``end``, tasks x
    sets): ``b_end[k, c]``, the k-th task's end, and ``b_busy[k, c]``, the time the
    stream is busy before its k-th task starts (``b_busy[hi - lo, c]``: all of it)."""
    n_sets = dur.shape[1]
    b_busy[0, :] = 0
    for k in range(hi - lo):
        task = order_idx[lo + k]
        for c in range(n_sets):
            b_end[k, c] = end[task, c]
            b_busy[k + 1, c] = b_busy[k, c] + dur[task, c]


@jit(inline=True)
def _busy_before(t: int, j: int, c: int, n_b: int, b_end, b_busy) -> int:
    """Busy time of the ``busy_prefix`` stream before ``t`` in set ``c``, where its
    task ``j`` is the first to end after ``t``."""
    if j == n_b:
        return b_busy[n_b, c]
    return b_busy[j, c] + max(0, t - (b_end[j, c] - (b_busy[j + 1, c] - b_busy[j, c])))


@jit
def exposed_ns(order_idx, a_lo: int, a_hi: int, n_b: int, b_end, b_busy, kind, dur, end, n_used: int, acc) -> None:
    """Time each task of ``order_idx[a_lo:a_hi]`` runs while the stream of ``n_b`` tasks
    described by ``busy_prefix`` is idle, added to ``acc[c]`` at the task's kind, for
    the first ``n_used`` sets of times (columns of ``dur`` and ``end``). Both streams
    are in time order and free of overlaps, so the other stream's busy time inside a
    task [s, e) is its busy time before e less that before s, found by pointers that
    only move forward."""
    js = np.zeros(n_used, dtype=np.int64)
    je = np.zeros(n_used, dtype=np.int64)
    for k in range(a_lo, a_hi):
        task = order_idx[k]
        kd = kind[task]
        for c in range(n_used):
            e = end[task, c]
            s = e - dur[task, c]
            j = js[c]
            while j < n_b and b_end[j, c] <= s:
                j += 1
            js[c] = j
            jj = max(je[c], j)
            while jj < n_b and b_end[jj, c] <= e:
                jj += 1
            je[c] = jj
            covered = _busy_before(e, jj, c, n_b, b_end, b_busy) - _busy_before(s, j, c, n_b, b_end, b_busy)
            acc[c, kd] += (e - s) - covered


@jit
def uncovered_ns(a_start, a_end, b_start, b_end) -> int:
    """Length of (union of intervals A) minus (union of intervals B).

    Both lists must be sorted by start; A and B may overlap themselves."""
    total = 0
    j = 0
    n_b = b_start.shape[0]
    cur_s = -1
    cur_e = -1
    i = 0
    n_a = a_start.shape[0]
    while i <= n_a:
        # merge A into disjoint runs [cur_s, cur_e)
        if i < n_a and cur_e >= 0 and a_start[i] <= cur_e:
            if a_end[i] > cur_e:
                cur_e = a_end[i]
            i += 1
            continue
        if cur_e > cur_s >= 0:
            # subtract B's cover of [cur_s, cur_e)
            covered = 0
            k = j
            reach = cur_s
            while k < n_b and b_start[k] < cur_e:
                lo = max(b_start[k], reach)
                hi = min(b_end[k], cur_e)
                if hi > lo:
                    covered += hi - lo
                    reach = hi
                k += 1
            while j < n_b and b_end[j] <= cur_s:
                j += 1
            total += (cur_e - cur_s) - covered
        if i == n_a:
            break
        cur_s = a_start[i]
        cur_e = a_end[i]
        i += 1
    return total
