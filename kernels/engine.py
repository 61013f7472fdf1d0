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
def exposed_ns(order_idx, a_lo: int, a_hi: int, b_lo: int, b_hi: int, kind, start, end, acc) -> None:
    """Time each task of ``order_idx[a_lo:a_hi]`` runs while none of
    ``order_idx[b_lo:b_hi]`` runs, added to ``acc`` at the task's kind (one pass for
    every kind). Both runs are one stream's tasks, so each is in time order and free
    of overlaps."""
    j = b_lo
    for k in range(a_lo, a_hi):
        task = order_idx[k]
        s = start[task]
        e = end[task]
        if e <= s:
            continue
        while j < b_hi and end[order_idx[j]] <= s:
            j += 1
        covered = 0
        jj = j
        while jj < b_hi and start[order_idx[jj]] < e:
            lo = max(start[order_idx[jj]], s)
            hi = min(end[order_idx[jj]], e)
            if hi > lo:
                covered += hi - lo
            jj += 1
        acc[kind[task]] += (e - s) - covered


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
