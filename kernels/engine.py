"""A compact array-based discrete-event engine.

A task graph is arrays: each task has an integer duration in nanoseconds, a
resource (a device's compute stream, or its stream on one link tier), a kind
(which decides its event priority and its traffic class) and an optional
synchronisation group. Dependencies are CSR successor lists with a
predecessor count per task. Each resource runs its tasks one at a time in a
fixed order given by the schedule (``order_ptr``/``order_idx``): a task
starts when it is at the head of its resource's order, the resource is idle
and all its predecessors have ended. The members of a synchronisation group
(a collective) occupy their resources from their own arrival, and all start
together at the latest arrival.

Events are the ends of tasks, processed in one deterministic order defined
here and nowhere else: (time in integer nanoseconds, kind priority, task id).
Compute ends come before communication ends (``PRIORITY``), so a resource
freed and a message delivered at the same instant are seen in a fixed order.

A schedule whose order contradicts its dependencies cannot finish: the
engine then returns ``DEADLOCK`` and leaves the unfinished tasks' ends at -1,
so the caller can name them; it never loops.
"""

from __future__ import annotations

import numpy as np

from paraspace.kernels.jit import jit

#: task kinds; the first are compute (priority 0), the rest communication (priority 1)
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
def priority(kind: int) -> int:
    """Event priority of a task's end: compute (0) before communication (1)."""
    return 0 if kind < K_FIRST_COMM else 1


@jit
def event_key(end_ns, kind) -> int:
    """Sort key of a task's end event: time first, then compute before communication
    (the task id breaks the remaining ties)."""
    return end_ns * 2 + priority(kind)


@jit
def _earlier(k_a, i_a, k_b, i_b) -> bool:
    """The event order: key (time, priority), then task id."""
    return k_a < k_b or (k_a == k_b and i_a < i_b)


@jit
def _heap_push(heap_k, heap_i, size, k, i) -> int:
    pos = size
    while pos > 0:
        parent = (pos - 1) // 2
        if _earlier(k, i, heap_k[parent], heap_i[parent]):
            heap_k[pos] = heap_k[parent]
            heap_i[pos] = heap_i[parent]
            pos = parent
        else:
            break
    heap_k[pos] = k
    heap_i[pos] = i
    return size + 1


@jit
def _heap_pop(heap_k, heap_i, size) -> int:
    """Remove the root; returns the new size (the root is read by the caller first)."""
    size -= 1
    k = heap_k[size]
    i = heap_i[size]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _earlier(heap_k[right], heap_i[right], heap_k[child], heap_i[child]):
            child = right
        if _earlier(heap_k[child], heap_i[child], k, i):
            heap_k[pos] = heap_k[child]
            heap_i[pos] = heap_i[child]
            pos = child
        else:
            break
    heap_k[pos] = k
    heap_i[pos] = i
    return size


@jit
def simulate(dur_ns, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, start_ns, end_ns) -> int:
    """Run the task graph; fills ``start_ns``/``end_ns`` (-1 where a task never ran).

    dur_ns: int64[n]; res: int32[n] resource of each task; kind: int8/int32[n];
    sync: int32[n] synchronisation group or -1; succ_ptr: int64[n+1] and
    succ_idx: int32[...] successors; n_pred: int32[n] predecessor counts;
    order_ptr: int64[R+1] and order_idx: int32[...] each resource's task order.
    Returns OK or DEADLOCK.
    """
    n = dur_ns.shape[0]
    n_res = order_ptr.shape[0] - 1
    pending = n_pred.copy()
    head = np.empty(n_res, dtype=np.int64)  # position of the next task in each resource's order
    busy = np.zeros(n_res, dtype=np.bool_)
    for r in range(n_res):
        head[r] = order_ptr[r]
    n_groups = 0
    for i in range(n):
        start_ns[i] = -1
        end_ns[i] = -1
        if sync[i] + 1 > n_groups:
            n_groups = sync[i] + 1
    group_ptr = np.zeros(n_groups + 1, dtype=np.int64)  # members of each group (CSR)
    group_arrived = np.zeros(n_groups, dtype=np.int64)
    group_latest = np.zeros(n_groups, dtype=np.int64)
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
    heap_k = np.empty(n + 1, dtype=np.int64)
    heap_i = np.empty(n + 1, dtype=np.int64)
    size = 0
    done = 0
    now = np.int64(0)
    # resources whose head may start: checked at time 0 and after every event
    stack = np.empty(n_res + n + 1, dtype=np.int64)
    n_stack = 0
    for r in range(n_res):
        stack[n_stack] = r
        n_stack += 1
    while True:
        # start whatever can start now
        while n_stack > 0:
            n_stack -= 1
            r = stack[n_stack]
            if busy[r] or head[r] >= order_ptr[r + 1]:
                continue
            task = order_idx[head[r]]
            if pending[task] > 0:
                continue
            busy[r] = True
            g = sync[task]
            if g < 0:
                start_ns[task] = now
                end_ns[task] = now + dur_ns[task]
                size = _heap_push(heap_k, heap_i, size, event_key(end_ns[task], kind[task]), task)
                continue
            group_arrived[g] += 1
            if now > group_latest[g]:
                group_latest[g] = now
            if group_arrived[g] == group_ptr[g + 1] - group_ptr[g]:  # the last member arrived: all start
                for k in range(group_ptr[g], group_ptr[g + 1]):
                    j = group_members[k]
                    start_ns[j] = group_latest[g]
                    end_ns[j] = group_latest[g] + dur_ns[j]
                    size = _heap_push(heap_k, heap_i, size, event_key(end_ns[j], kind[j]), j)
        if size == 0:
            break
        # the next end event
        task = heap_i[0]
        now = end_ns[task]
        size = _heap_pop(heap_k, heap_i, size)
        done += 1
        r = res[task]
        busy[r] = False
        head[r] += 1
        stack[n_stack] = r
        n_stack += 1
        for e in range(succ_ptr[task], succ_ptr[task + 1]):
            s = succ_idx[e]
            pending[s] -= 1
            if pending[s] == 0:
                stack[n_stack] = res[s]
                n_stack += 1
    return OK if done == n else DEADLOCK


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
def exposed_ns(order_idx, a_lo: int, a_hi: int, want: int, b_lo: int, b_hi: int, kind, start, end) -> int:
    """Time the tasks of kind ``want`` in ``order_idx[a_lo:a_hi]`` run while none
    of ``order_idx[b_lo:b_hi]`` runs. Both runs are one stream's tasks, so each
    is in time order and free of overlaps."""
    total = 0
    j = b_lo
    for k in range(a_lo, a_hi):
        task = order_idx[k]
        if kind[task] != want:
            continue
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
        total += (e - s) - covered
    return total


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
