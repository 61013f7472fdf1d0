"""Pipeline schedules as task graphs for the event engine.

A training step on p devices (one per pipeline stage; every device of a stage
behaves alike, so one stands for all), v virtual chunks per device (virtual
stage vs = chunk * p + device, Megatron's interleaved layout) and m
micro-batches. Schedules only decide each device's compute order; the
dependencies are the same for all of them:

  F(vs, i) after send_f(vs-1, i), which follows F(vs-1, i);
  B(vs, i) after F(vs, i) and after send_b(vs+1, i), which follows B(vs+1, i).

Every device has a compute stream and, per link tier, two communication
streams (``comm_stream``, ``bulk_stream``): the latency-critical traffic
(pipeline sends and EP dispatch/combine, first in, first out in the device's
program order) and the bulk data-parallel traffic (gradient reductions,
parameter gathers). They share the tier's NIC: NCCL runs the two on their own
communicators at once, each flow getting part of the link, so a short send is
not queued behind a long gradient bucket (head-of-line blocking would add a
whole bucket to every stage of the pipeline's cool-down) but the bytes it
moves still take the link's time. That time is charged to the data-parallel
transfer it shares the link with: critical traffic a device puts on a tier
while one of its data-parallel transfers there is open (created and not yet
consumed by a pass, nor followed by the next data-parallel transfer) lengthens
that transfer by the critical transfer's own duration, so the tier moves both
flows' bytes at its bandwidth. The critical transfer itself runs at the full
rate (a fair-share link would give it between half and all of it: at most its
own duration of optimism). Traffic of different tiers does not contend.
Deadlock-free: every stream runs its tasks in creation order, and every
dependency inside a device points from an earlier-created task to a later
one; a communication task waits only for tasks of its own pass or of passes
before it in the compute order (a backward's first EP transfer for the
pass's inputs, like the pass itself), so a stream's head never waits for a
task queued behind it on any of the device's streams (checked on random
steps against the plain-Python engine and for every schedule). In a DualPipe
EP pair the forward's tasks also wait behind the backward's first transfer,
and so for the backward's inputs, which never depend on that forward: its
output leaves only after the pair.
Sends run on the sender's pipeline stream of the tier between the stages;
data-parallel traffic on the DP group's tier. Gradient reduction is bucketed:
the device's last backward is split into ``n_buckets`` pieces and bucket k's
reduce-scatter / all-reduce follows piece k, overlapping the rest of that
backward; ZeRO-1/2 parameter all-gathers are bucketed against the device's
first forward the same way; ZeRO-3 gathers the parameters of every pass at most
one pass ahead (the gather for pass k is issued when pass k-2 ends, ahead of
that pass's gradient scatter, so two passes' parameters are held, as the
memory model assumes) and reduce-scatters gradients after every backward. The
optimizer step ends each device's step after its last reduction.

DualPipe (``_dualpipe_order``) puts two chunks on every device, stage d of the
downward direction and stage p - 1 - d of the upward one: a micro-batch's
pipeline positions are then stages, ``chain_position`` maps (device, chunk) to
them and a chunk's durations are its stage's. An overlapped F&B chunk and a
backward computed with its W send their outputs after both passes; in an F&B
chunk whose passes both have EP traffic, each pass's dispatch and combine run
beside the other pass's compute (``build_step``), so the overlap of one
micro-batch's EP traffic with another's compute comes out of the run.
PipeDream (``_pipedream_order``) is simulated in steady state: the graph is one
period of a pipeline that never drains, its micro-batches numbered from the
period's first backward; dependencies on passes outside the period are dropped
(done before it), and the step is each device's span (``steady_span_ns``).

Tasks are created in each device's program order, so task ids follow every
stream's order. Preconditions (the encoder guarantees them): interleaving needs
m % p == 0; DualPipe an even p and an even m; DualPipe, PipeDream and ZB-H1 v = 1.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from paraspace.kernels.codes import (
    SCHEDULE_DUALPIPE,
    SCHEDULE_GPIPE,
    SCHEDULE_INTERLEAVED,
    SCHEDULE_PIPEDREAM,
    SCHEDULE_ZB_H1,
    ZERO_3_DEFERRED,
)
from paraspace.kernels.engine import (
    K_BACKWARD,
    K_DP,
    K_EP,
    K_FORWARD,
    K_OPTIMIZER,
    K_PP,
    K_WEIGHT_GRAD,
    csr_from_edges,
    order_by_id,
)
from paraspace.kernels.jit import jit

#: compute order entries: (pass, chunk, micro-batch); W only in zero-bubble schedules
F_PASS = 0
B_PASS = 1
W_PASS = 2


@jit
def passes_per_device(schedule: int, v: int, m: int) -> int:
    return (3 if split_backward(schedule) else 2) * v * m


@jit(inline=True)
def split_backward(schedule: int) -> bool:
    """Whether the schedule runs the weight-gradient half of a backward (W) as a pass of its own."""
    return schedule == SCHEDULE_ZB_H1 or schedule == SCHEDULE_DUALPIPE


@jit(inline=True)
def chain_position(schedule: int, p: int, d: int, c: int) -> int:
    """Position along the micro-batch's pipeline (virtual stage) of device d's chunk c.

    Megatron's interleaved layout: c p + d. DualPipe: chunk 0 is stage d of the
    downward direction, chunk 1 stage p - 1 - d of the upward one (both
    directions run the same p stages, so a position is also the stage whose
    layers the chunk holds)."""
    if schedule == SCHEDULE_DUALPIPE:
        return d if c == 0 else p - 1 - d
    return c * p + d


@jit
def micro_ids(schedule: int, p: int, m: int) -> int:
    """Micro-batch ids a step's graph uses (PipeDream's window: the m + p - 1
    micro-batches j = -1 .. m + p - 2 that one period touches, as id j + 1)."""
    return m + p if schedule == SCHEDULE_PIPEDREAM else m


@jit(inline=True)
def streams_per_device(n_tiers: int) -> int:
    """Compute stream + per link tier a critical and a bulk communication stream."""
    return 1 + 2 * n_tiers


@jit(inline=True)
def comm_stream(device: int, n_tiers: int, tier: int) -> int:
    """The device's stream of latency-critical traffic (PP sends, EP) on link tier ``tier``."""
    return device * streams_per_device(n_tiers) + 1 + tier


@jit(inline=True)
def bulk_stream(device: int, n_tiers: int, tier: int) -> int:
    """The device's stream of data-parallel traffic on link tier ``tier``."""
    return device * streams_per_device(n_tiers) + 1 + n_tiers + tier


@jit
def compute_order(schedule: int, p: int, v: int, m: int, d: int, passes, chunks, micros) -> int:
    """Fill device ``d``'s compute order; returns its length (2 v m).

    GPipe: every forward (chunk by chunk), then every backward (last chunk
    first). 1F1B: min(p - d - 1, m) warm-up
    forwards, then one forward and one backward alternately, then the remaining
    backwards. Interleaved (Megatron-LM ``forward_backward_pipelining_with_
    interleaving``): virtual micro-batch k runs chunk (k mod p v) div p (backward:
    v - 1 minus that) of micro-batch (k div p v) p + k mod p; warm-up
    min(2 (p - d - 1) + (v - 1) p, m v), then 1F1B over virtual micro-batches.
    ZB-H1 (Qi et al. 2023, zero-bubble pipeline parallelism): the backward is
    split into B (input gradient, on the critical path) and W (weight gradient);
    1F1B's warm-up, then F, B and the oldest pending W once more than d are
    pending, so stage d runs its last d W's after its last B, while the final
    gradients travel upstream (the last stage defers most, the first none); bubble (p - 1)(t_F + t_B - t_W) instead of
    (p - 1)(t_F + t_B + t_W) for equal stages (v must be 1).
    DualPipe and PipeDream: ``_dualpipe_order`` and ``_pipedream_order`` (v must be 1).
    """
    if schedule == SCHEDULE_DUALPIPE:
        return _dualpipe_order(p, m, d, passes, chunks, micros)
    if schedule == SCHEDULE_PIPEDREAM:
        return _pipedream_order(p, m, d, passes, chunks, micros)
    n = 0
    if schedule == SCHEDULE_ZB_H1:
        warm = min(p - d - 1, m)
        keep = d
        f_next = 0
        b_next = 0
        w_next = 0
        for _ in range(warm):
            n = _put(passes, chunks, micros, n, F_PASS, f_next)
            f_next += 1
        while f_next < m:  # steady state: F, B, and a W once keep W's are pending
            n = _put(passes, chunks, micros, n, F_PASS, f_next)
            f_next += 1
            n = _put(passes, chunks, micros, n, B_PASS, b_next)
            b_next += 1
            if b_next - w_next > keep:
                n = _put(passes, chunks, micros, n, W_PASS, w_next)
                w_next += 1
        while b_next < m:  # cool-down: the same rule; the last keep W's run at the end
            n = _put(passes, chunks, micros, n, B_PASS, b_next)
            b_next += 1
            if b_next - w_next > keep:
                n = _put(passes, chunks, micros, n, W_PASS, w_next)
                w_next += 1
        while w_next < m:
            n = _put(passes, chunks, micros, n, W_PASS, w_next)
            w_next += 1
        return n
    if schedule == SCHEDULE_GPIPE:
        for c in range(v):
            for i in range(m):
                passes[n] = F_PASS
                chunks[n] = c
                micros[n] = i
                n += 1
        for c in range(v - 1, -1, -1):
            for i in range(m):
                passes[n] = B_PASS
                chunks[n] = c
                micros[n] = i
                n += 1
        return n
    total = m * v
    if schedule == SCHEDULE_INTERLEAVED:
        warm = min(2 * (p - d - 1) + (v - 1) * p, total)
    else:
        warm = min(p - d - 1, total)
    f_next = 0
    b_next = 0
    for _ in range(warm):
        n = _emit(passes, chunks, micros, n, F_PASS, f_next, p, v)
        f_next += 1
    while f_next < total:
        n = _emit(passes, chunks, micros, n, F_PASS, f_next, p, v)
        f_next += 1
        n = _emit(passes, chunks, micros, n, B_PASS, b_next, p, v)
        b_next += 1
    while b_next < total:
        n = _emit(passes, chunks, micros, n, B_PASS, b_next, p, v)
        b_next += 1
    return n


#: DualPipe generator state (one int64 array): passes written, next forward and
#: backward per phase, and the FIFO of deferred weight gradients (head, tail)
_DP_N, _DP_F0, _DP_F1, _DP_B0, _DP_B1, _DP_QH, _DP_QT = range(7)


@jit
def _dualpipe_order(p: int, m: int, d: int, passes, chunks, micros) -> int:
    """DualPipe (DeepSeek-V3, arXiv:2412.19437 sec. 3.2.1; deepseek-ai/DualPipe
    ``DualPipe.step``): device d's compute order, 3 m passes (F, B and W of
    each of its m chunk passes).

    Bidirectional: micro-batches 0 .. m/2 - 1 enter at device 0 and run stage s
    on device s (chunk 0), micro-batches m/2 .. m - 1 enter at device p - 1 and
    run stage s on device p - 1 - s (chunk 1), so every device holds two
    stages' parameters (d and p - 1 - d). With h = min(d, p - 1 - d), H = p / 2
    and M = m / 2, phase 0 is the direction in which the device is stage h
    (near its input), phase 1 the one in which it is stage p - 1 - h; the
    published order is eight runs:
      1. 2 (H - h - 1) F0          2. (h + 1) x [F0 F1]
      3. (H - h - 1) x [B1 W1 F1]  4. (M - p + h + 1) x [F0 B1 F1 B0]
      5. (H - h - 1) x [B1 F1 B0]  6. (h + 1) x [B1 B0], W deferred from the middle on
      7. (H - h - 1) x [W B0'], B0' deferring its W   8. (h + 1) x W
    where a backward whose W is not deferred is followed by its W at once (one
    autograd pass; ``build_step`` sends its gradient after the W) and deferred
    W's run first in, first out. Each phase's micro-batches run in order.

    Engine approximations. The overlapped F&B chunks of steps 4 and 5 (a
    forward followed by a backward of the other direction) run on one compute
    stream, F&B = F + B: their compute is not overlapped, their pipeline sends
    go on the pipeline stream (hidden unless late) and, as in the reference,
    leave after both passes. Their EP dispatch/combine does overlap: where
    both passes have EP traffic ``build_step`` interleaves the pair's compute
    and transfers so that each pass's traffic runs beside the other's compute
    (DeepSeek-V3 Figure 4; the unpaired warm-up and cool-down passes expose
    theirs as in the other schedules). A pass waits only for its own
    input, where the reference's batched send/recv makes a chunk wait for every
    receive posted before it, and its middle-rank special cases (unoverlapped
    first F0 B1, a held F1 send) are not reproduced. Measured effect, equal
    stages and no communication: with F = B_in = W the bubble is
    (p - 2) F + max(0, p/2 - 2) F, the published (p/2 - 1)(F&B + B - 3W)
    exactly for p <= 4 and (p/2 - 2) F longer beyond (tests/test_schedules_extra.py).
    The order needs M >= p (the reference asserts m >= 2 p); for fewer
    micro-batches it is the order of M = p with the micro-batches beyond m/2
    per direction removed, which keeps it deadlock-free (a sub-order of a
    feasible order is feasible).
    """
    half = p // 2
    h = min(d, p - 1 - d)
    flip = 1 if d >= half else 0
    mh = m // 2
    pad = max(mh, p)
    st = np.zeros(7, dtype=np.int64)
    q_chunk = np.zeros(2 * pad, dtype=np.int64)
    q_micro = np.zeros(2 * pad, dtype=np.int64)
    for _ in range(2 * (half - h - 1)):  # 1
        _dp_f(st, 0, flip, mh, passes, chunks, micros)
    for _ in range(h + 1):  # 2
        _dp_f(st, 0, flip, mh, passes, chunks, micros)
        _dp_f(st, 1, flip, mh, passes, chunks, micros)
    for _ in range(half - h - 1):  # 3
        _dp_b(st, 1, flip, mh, True, q_chunk, q_micro, passes, chunks, micros)
        _dp_w(st, mh, q_chunk, q_micro, passes, chunks, micros)
        _dp_f(st, 1, flip, mh, passes, chunks, micros)
    for _ in range(pad - p + h + 1):  # 4
        _dp_f(st, 0, flip, mh, passes, chunks, micros)
        _dp_b(st, 1, flip, mh, False, q_chunk, q_micro, passes, chunks, micros)
        _dp_f(st, 1, flip, mh, passes, chunks, micros)
        _dp_b(st, 0, flip, mh, False, q_chunk, q_micro, passes, chunks, micros)
    for _ in range(half - h - 1):  # 5
        _dp_b(st, 1, flip, mh, False, q_chunk, q_micro, passes, chunks, micros)
        _dp_f(st, 1, flip, mh, passes, chunks, micros)
        _dp_b(st, 0, flip, mh, False, q_chunk, q_micro, passes, chunks, micros)
    defer = False
    for i in range(h + 1):  # 6
        if i == (h + 1) // 2 and h % 2 == 1:
            defer = True
        _dp_b(st, 1, flip, mh, defer, q_chunk, q_micro, passes, chunks, micros)
        if i == (h + 1) // 2 and h % 2 == 0:
            defer = True
        _dp_b(st, 0, flip, mh, defer, q_chunk, q_micro, passes, chunks, micros)
    for _ in range(half - h - 1):  # 7
        _dp_w(st, mh, q_chunk, q_micro, passes, chunks, micros)
        _dp_b(st, 0, flip, mh, True, q_chunk, q_micro, passes, chunks, micros)
    for _ in range(h + 1):  # 8
        _dp_w(st, mh, q_chunk, q_micro, passes, chunks, micros)
    return st[_DP_N]


@jit
def _dp_f(st, phase: int, flip: int, mh: int, passes, chunks, micros) -> None:
    c = phase ^ flip
    k = st[_DP_F0 + phase]
    st[_DP_F0 + phase] += 1
    if k < mh:  # micro-batches past m/2 only pad the order (see _dualpipe_order)
        st[_DP_N] = _put_chunk(passes, chunks, micros, st[_DP_N], F_PASS, c, c * mh + k)


@jit
def _dp_b(st, phase: int, flip: int, mh: int, defer: bool, q_chunk, q_micro, passes, chunks, micros) -> None:
    c = phase ^ flip
    k = st[_DP_B0 + phase]
    st[_DP_B0 + phase] += 1
    if k < mh:
        st[_DP_N] = _put_chunk(passes, chunks, micros, st[_DP_N], B_PASS, c, c * mh + k)
    if defer:  # queued even when padding, so that later pops stay in the published order
        q_chunk[st[_DP_QT]] = c
        q_micro[st[_DP_QT]] = k
        st[_DP_QT] += 1
    elif k < mh:
        st[_DP_N] = _put_chunk(passes, chunks, micros, st[_DP_N], W_PASS, c, c * mh + k)


@jit
def _dp_w(st, mh: int, q_chunk, q_micro, passes, chunks, micros) -> None:
    head = st[_DP_QH]
    st[_DP_QH] += 1
    c = q_chunk[head]
    k = q_micro[head]
    if k < mh:
        st[_DP_N] = _put_chunk(passes, chunks, micros, st[_DP_N], W_PASS, c, c * mh + k)


@jit
def _pipedream_order(p: int, m: int, d: int, passes, chunks, micros) -> int:
    """PipeDream asynchronous 1F1B (Narayanan et al. 2019), one period of its
    steady state: 2 m passes, micro-batch numbers absolute (may be -1 or >= m).

    Without a flush the pipeline never drains: stage d keeps p - d micro-batches
    in flight, running B(j - 1) and then F(j + p - 1 - d) for j = 0 .. m - 1 (the
    steady 1F1B pairs, backward first). The window's first backward belongs to a
    micro-batch whose forward ran in the previous period (likewise the first
    forward's input and the gradients of the oldest backward on the next
    stage): ``build_step`` drops the dependencies on tasks outside the window,
    which are done in steady state. So every device starts its period when its
    first backward's gradient arrives, after the downstream stages' first
    backwards: the devices' periods are staggered as in a running pipeline,
    and each device's span (``steady_span_ns``), not the graph's makespan, is
    the steady-state step; the fill and drain happen once per training run.
    """
    n = 0
    for k in range(m):
        n = _put_chunk(passes, chunks, micros, n, B_PASS, 0, k - 1)
        n = _put_chunk(passes, chunks, micros, n, F_PASS, 0, k + p - 1 - d)
    return n


@jit(inline=True)
def _put_chunk(passes, chunks, micros, n: int, kind: int, c: int, i: int) -> int:
    passes[n] = kind
    chunks[n] = c
    micros[n] = i
    return n + 1


@jit(inline=True)
def _put(passes, chunks, micros, n: int, kind: int, i: int) -> int:
    passes[n] = kind
    chunks[n] = 0
    micros[n] = i
    return n + 1


@jit(inline=True)
def _emit(passes, chunks, micros, n: int, kind: int, k: int, p: int, v: int) -> int:
    group = p * v
    chunk = (k % group) // p
    if kind == B_PASS:
        chunk = v - 1 - chunk
    passes[n] = kind
    chunks[n] = chunk
    micros[n] = (k // group) * p + k % p
    return n + 1


def build_step(schedule: int, p: int, v: int, m: int, fwd_ns, bwd_ns, wgrad_ns, send_ns: int, pp_tier: int,
               dp_tier: int,
               n_tiers: int, zero: int, dp_grad_ns: int, dp_param_ns: int, n_buckets: int,
               z3_gather_ns: int, z3_scatter_ns: int, optimizer_ns: int, ep_ns, ep_tier: int, tbo: int,
               ep_pairs: bool = True):
    """Arrays of one training step's task graph (``build_step_recipe``'s graph).

    Plain Python, called from Python (the tests and the schedule reference): with
    integers and int64 arrays and ``ep_pairs`` left at its default, it calls
    ``build_step_recipe`` with the argument types ``paraspace trace`` does
    (``kernels.event_tier.row_graph``), so the two share one compiled signature
    (about 45 s of compiling on a cold cache)."""
    args = (int(schedule), int(p), int(v), int(m), fwd_ns, bwd_ns, wgrad_ns, int(send_ns), int(pp_tier), int(dp_tier),
            int(n_tiers), int(zero), int(dp_grad_ns), int(dp_param_ns), int(n_buckets), int(z3_gather_ns),
            int(z3_scatter_ns), int(optimizer_ns), ep_ns, int(ep_tier), int(tbo))
    graph, _ = build_step_recipe(*args) if ep_pairs else build_step_recipe(*args, False)
    return graph


#: a task's duration recipe (``build_step_recipe``): which input it is a share of
R_FORWARD, R_BACKWARD, R_WGRAD, R_DP_PARAM, R_DP_GRAD, R_Z3_GATHER, R_Z3_SCATTER, R_SEND, R_OPTIMIZER, R_NONE = range(10)
#: recipe columns: the input, its (device, chunk) indices, and the share (parts, k)
N_RECIPE = 5

# --------------------------------------------------------------------------- the build's records
# ``build_step_recipe``'s pieces are spliced into it at IR level
# (``jit(inline=True)``) and take numba named tuples: ``Build``, every array the
# build touches, and records of scalars (``StepShape``, ``StepCosts``, ``Device``,
# ``Pass``). A spliced piece binds its arguments as new references, an atomic
# incref and decref of every array in them, which LLVM's reference-count pruning
# removes only where each pair is plain to see. Left in, they made the build
# 5-10x slower per pass without changing a number, so the pieces keep to these
# rules (tests/test_pipeline_refcounts.py fails when the build's loops keep any):
#   - only ``Build`` holds arrays, so every binding releases them in one order;
#   - a piece that takes ``Build`` uses it after its last branch on every path,
#     and returns only at its end: it reads what it needs before branching on
#     scalars, or loads the counters of ``Build.st`` at its start, works on
#     locals (``_add_task`` / ``_add_edge`` take and return the next id) and
#     stores them at its end;
#   - no binding spans a loop body: the per-device and per-pass steps are
#     written out in ``build_step_recipe``'s loops, and a piece's loops run
#     inside it.

#: What shapes a step's graph besides its durations: the schedule, p devices, v
#: chunks, m micro-batches; n_positions = p v pipeline positions, n_ids micro-batch
#: ids (``micro_ids``); the link tiers of the pipeline, data-parallel and EP
#: traffic; n_buckets (>= 1) gradient / parameter buckets; tbo and halves (2 with
#: two-batch overlap, else 1); ep_pairs; and the flags derived from the inputs:
#: dual (DualPipe), steady (PipeDream), split (W passes of their own),
#: reduce_grads (ZeRO-0/1/2 gradient reduction), gather_params (ZeRO-1/2
#: parameter all-gather), z3 (ZeRO-3 traffic), deferred (ZeRO-3 scatters each
#: chunk's gradients once, after its last gradient pass: ``ZERO_3_DEFERRED``),
#: has_ep (some chunk has EP traffic).
StepShape = namedtuple("StepShape", ("schedule", "p", "v", "m", "n_positions", "n_ids", "n_tiers", "pp_tier",
                                     "dp_tier", "ep_tier", "n_buckets", "tbo", "halves", "ep_pairs", "dual", "steady",
                                     "split", "reduce_grads", "gather_params", "z3", "deferred", "has_ep"))

#: The step's scalar durations (``build_step_recipe``'s arguments): a pipeline
#: send, a device's gradient reduction and ZeRO-1/2 parameter gather, ZeRO-3's
#: gather and scatter per pass, the optimizer step.
StepCosts = namedtuple("StepCosts", ("send_ns", "dp_grad_ns", "dp_param_ns", "z3_gather_ns", "z3_scatter_ns",
                                     "optimizer_ns"))

#: Every array of the build. Inputs: the per-chunk durations fwd_ns, bwd_ns,
#: wgrad_ns, ep_ns (``build_step_recipe``). The graph under construction: the task
#: columns, the edges (src -> dst), the duration recipe and links; ``st``, the
#: build's counters and open state (``S_*``); ``ends``, per (``E_*``, position,
#: micro-batch id) a pass's first task and its output. Per device, reused by each:
#: its compute order (passes, chunks, micros), ZeRO-3's gather task of each pass,
#: whether each pass is its chunk's last gradient pass (``final``; ``seen``: per
#: chunk, while marking them), the held sends (``_HELD_*`` columns) and a DualPipe
#: EP pair's pending forward (``_PEND_*``).
Build = namedtuple("Build", ("fwd_ns", "bwd_ns", "wgrad_ns", "ep_ns",
                             "dur", "res", "kind", "stage", "micro", "chunk", "src", "dst", "rec", "links", "st",
                             "ends",
                             "passes", "chunks", "micros", "z3_gathers", "final", "seen", "held", "pend"))

#: Build.st: tasks, edges and links created; the device's open data-parallel
#: transfer (module docstring; -1: none); its sends held for a later pass; the
#: task a held send also waits for (-1: none; a DualPipe EP pair's forward combine)
S_TASKS, S_EDGES, S_LINKS, S_OPEN_DP, S_N_HELD, S_TAIL = range(6)
N_STATE = 6

#: Build.ends: a forward's first task, its output (its last piece, or its send) and
#: its last piece; a backward's first task and output. -1 where the pass is outside
#: the step (PipeDream's window: done in the previous period or later).
E_F_FIRST, E_F_OUT, E_F_LAST, E_B_FIRST, E_B_OUT = range(5)
N_ENDS = 5

#: One device while its tasks are built: its index, streams (compute, bulk DP,
#: pipeline sends, EP, and the critical stream of the DP tier, whose traffic shares
#: the DP link), its compute order's length, first forward and last backward or
#: W pass, and its first task id (its ZeRO-1/2 gathers start there; its
#: data-parallel tasks are ids >= it).
Device = namedtuple("Device", ("d", "compute", "dp_res", "send_res", "ep_res", "shared_res", "length",
                               "first_forward", "last_backward", "first_task"))

#: One pass of a device's compute order: its index o, pass kind (``F_PASS`` ...),
#: chunk c, pipeline position vs, the durations' row and column (sd, sc: DualPipe's
#: chunk runs stage vs), micro-batch id key (also the tasks' label; PipeDream: the
#: window's first backward's micro-batch is 0), task kind, recipe op, compute
#: time (total, without the experts) and expert compute, whether it has EP
#: traffic, whether the device's parameter gather / gradient reduction is
#: bucketed against it, and its number of compute pieces.
Pass = namedtuple("Pass", ("o", "pass_kind", "c", "vs", "sd", "sc", "key", "task_kind", "op", "total", "experts",
                           "ep_here", "gather_here", "reduce_here", "pieces"))

#: Build.held columns: position, micro-batch id, 1 for a forward's output, chunk
_HELD_VS, _HELD_KEY, _HELD_IS_F, _HELD_CHUNK = range(4)
#: Build.pend (DualPipe's EP pair, kept from the forward to the backward after it):
#: the forward's pre-expert compute (its last task; -1: no pair pending), experts,
#: combine and dispatch durations, position, micro-batch id and chunk
_PEND_PRE, _PEND_EXPERTS, _PEND_COMBINE, _PEND_DISPATCH, _PEND_VS, _PEND_KEY, _PEND_CHUNK = range(7)
_N_PEND = 7


@jit
def build_step_recipe(schedule: int, p: int, v: int, m: int, fwd_ns, bwd_ns, wgrad_ns, send_ns: int, pp_tier: int,
                      dp_tier: int, n_tiers: int, zero: int, dp_grad_ns: int, dp_param_ns: int, n_buckets: int,
                      z3_gather_ns: int, z3_scatter_ns: int, optimizer_ns: int, ep_ns, ep_tier: int, tbo: int,
                      ep_pairs: bool = True):
    """Arrays of one training step's task graph (see the module docstring), and the
    recipe of its durations.

    fwd_ns, bwd_ns: int64[p, v], one micro-batch of each device's chunk;
    wgrad_ns: the weight-gradient part of bwd_ns, run as a separate W pass by
    zero-bubble schedules (ignored by the others).
    send_ns: one pipeline message over tier ``pp_tier``; data-parallel traffic
    runs on tier ``dp_tier``. dp_grad_ns: a device's whole gradient reduction
    (all-reduce for ZeRO-0, reduce-scatter for ZeRO-1/2), 0 for none;
    dp_param_ns: the ZeRO-1/2 parameter all-gather; z3_*: ZeRO-3 per pass.
    ep_ns: int64[p, v, 4], per chunk pass of one micro-batch: the expert compute
    inside fwd_ns, the expert compute inside the backward pass (B: without its
    W where the backward is split), the EP dispatch and the EP combine traffic
    (on tier ``ep_tier``); where dispatch + combine > 0 a pass runs its MoE
    part as ``_moe_part`` describes, with ``tbo`` in two overlapped halves.
    DualPipe with ``ep_pairs``: an overlapped F&B chunk whose two passes both
    have EP traffic runs jointly (``_ep_pair_tasks``); without ``ep_pairs``,
    and for unpaired passes (warm-up, cool-down), each pass runs its MoE part
    alone, as in the other schedules.
    Returns ((dur_ns, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx,
    n_pred, order_ptr, order_idx, n_resources), (recipe, links)): recipe[t] says
    which input task t's duration is a share of (``R_*``, its device and chunk, the
    share's parts and index; R_NONE for MoE tasks), links the (data-parallel
    transfer, critical transfer) pairs whose durations add (``_share_link``), so
    that ``recipe_durations`` rebuilds ``dur_ns`` from other inputs of the same
    structure (``kernels.event_tier``: rows sharing a graph).

    Per device, in its program order: the data-parallel gathers that start its
    step; per pass of its compute order, its MoE part where it comes first (a
    backward's, or a DualPipe pair's), its compute pieces, its MoE part where
    it comes last (a forward's, unless left to a pair), the sends it holds or
    releases and the data-parallel traffic it releases; its optimizer step.
    Then the dependencies between passes, and the graph's arrays.
    """
    costs = StepCosts(send_ns, dp_grad_ns, dp_param_ns, z3_gather_ns, z3_scatter_ns, optimizer_ns)
    shape = _step_shape(schedule, p, v, m, n_tiers, pp_tier, dp_tier, ep_tier, zero, n_buckets, tbo, ep_pairs, costs,
                        ep_ns)
    b = _alloc_build(shape, fwd_ns, bwd_ns, wgrad_ns, ep_ns)
    ends = b.ends
    for d in range(p):
        length = compute_order(schedule, p, v, m, d, b.passes, b.chunks, b.micros)
        dev = _start_device(shape, b, d, length)
        _device_gathers(shape, costs, b, dev)
        for o in range(length):
            ps = _pass_of(shape, b, dev, o)
            is_f = ps.pass_kind == F_PASS
            is_b = ps.pass_kind == B_PASS
            # a forward opening a DualPipe EP pair leaves its MoE part to the backward after it
            pair_f = False
            if shape.ep_pairs and shape.dual and ps.ep_here and is_f and ps.pieces == 1:
                pair_f = _ep_pair_next(shape, b, dev, o)
            first = b.st[S_TASKS]
            prev = -1
            if ps.ep_here and is_b:
                if b.pend[_PEND_PRE] >= 0:
                    prev = _ep_pair_tasks(b, dev, ps)
                else:  # the MoE part first: combine's gradient -> experts -> dispatch's gradient
                    prev = _moe_part(shape, b, dev, ps, -1)
            prev = _compute_pieces(shape, costs, b, dev, ps, prev)
            if pair_f:
                _defer_moe_part(b, ps, prev)
            elif ps.ep_here and is_f:  # then dispatch -> experts -> combine
                prev = _moe_part(shape, b, dev, ps, prev)
            if is_b:
                ends[E_B_FIRST, ps.vs, ps.key] = first
                ends[E_B_OUT, ps.vs, ps.key] = prev
            elif is_f:
                ends[E_F_FIRST, ps.vs, ps.key] = first
                ends[E_F_OUT, ps.vs, ps.key] = prev
                ends[E_F_LAST, ps.vs, ps.key] = prev
            _pass_sends(shape, costs, b, dev, ps, prev)
            _release_dp(shape, costs, b, dev, ps, prev)
        _optimizer_step(shape, costs, b, dev)
    _pass_chain_edges(shape, b)
    return _finish_graph(shape, b)


@jit(inline=True)
def _step_shape(schedule: int, p: int, v: int, m: int, n_tiers: int, pp_tier: int, dp_tier: int, ep_tier: int,
                zero: int, n_buckets: int, tbo: int, ep_pairs: bool, costs, ep_ns) -> StepShape:
    """The ``StepShape`` of a step's inputs."""
    has_ep = False
    for d in range(p):
        for c in range(v):
            if ep_ns[d, c, 2] + ep_ns[d, c, 3] > 0:
                has_ep = True
    reduce_grads = zero < 3 and costs.dp_grad_ns > 0
    gather_params = 1 <= zero < 3 and costs.dp_param_ns > 0
    z3 = zero >= 3 and (costs.z3_gather_ns > 0 or costs.z3_scatter_ns > 0)
    return StepShape(schedule, p, v, m, p * v, micro_ids(schedule, p, m), n_tiers, pp_tier, dp_tier, ep_tier,
                     max(n_buckets, 1), tbo, 2 if tbo != 0 else 1, ep_pairs, schedule == SCHEDULE_DUALPIPE,
                     schedule == SCHEDULE_PIPEDREAM, split_backward(schedule), reduce_grads, gather_params, z3,
                     z3 and zero == ZERO_3_DEFERRED, has_ep)


@jit(inline=True)
def _alloc_build(shape, fwd_ns, bwd_ns, wgrad_ns, ep_ns) -> Build:
    """A ``Build`` of the inputs with room for every task, edge and link of the
    step, nothing created, no pass built."""
    per_dev = passes_per_device(shape.schedule, shape.v, shape.m)
    nb = shape.n_buckets
    # per device: passes, + nb gathers and nb reductions, + (nb - 1) extra pieces of
    # the first forward and of the last backward, + the optimizer; sends; ZeRO-3
    # gathers (every pass) and scatters (every backward)
    # EP: up to 3 halves' extra tasks per F / B pass (experts, dispatch, combine)
    cap = shape.p * (per_dev + 4 * nb + 1) + 2 * shape.n_positions * shape.m + (
        shape.p * 2 * per_dev if shape.z3 else 0) + (shape.p * per_dev * 3 * shape.halves if shape.has_ep else 0)
    e_cap = 4 * cap
    st = np.zeros(N_STATE, dtype=np.int64)
    st[S_OPEN_DP] = -1
    st[S_TAIL] = -1
    return Build(fwd_ns, bwd_ns, wgrad_ns, ep_ns,
                 np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int8),
                 np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int32),
                 np.empty(e_cap, dtype=np.int32), np.empty(e_cap, dtype=np.int32),
                 np.full((cap, N_RECIPE), R_NONE, dtype=np.int32), np.empty((cap, 2), dtype=np.int32), st,
                 np.full((N_ENDS, shape.n_positions, shape.n_ids), -1, dtype=np.int64),
                 np.zeros(per_dev, dtype=np.int32), np.zeros(per_dev, dtype=np.int32),
                 np.zeros(per_dev, dtype=np.int32), np.full(per_dev, -1, dtype=np.int64),
                 np.zeros(per_dev, dtype=np.int8), np.zeros(max(shape.v, 2), dtype=np.int8),  # DualPipe: chunks 0 and 1
                 np.zeros((4, 4), dtype=np.int64), np.full(_N_PEND, -1, dtype=np.int64))


@jit(inline=True)
def _start_device(shape, b, d: int, length: int) -> Device:
    """Device d about to be built, its compute order (``length`` passes) in ``b``:
    its streams, first forward and last backward, and first task id; no
    data-parallel transfer open, no send held, no pair pending, no ZeRO-3 gather
    issued yet (without that reset a W pass, which gathers nothing, waited for an
    earlier device's gather of the same pass index: a spurious cross-device edge of
    ZeRO-3 with ZB-H1 or DualPipe, tests/test_pipeline.py)."""
    b.z3_gathers[:] = -1
    first_forward = -1
    last_backward = -1  # the last backward or W pass: its gradients are final after it
    for o in range(length):
        if b.passes[o] == F_PASS and first_forward < 0:
            first_forward = o
        if b.passes[o] != F_PASS:
            last_backward = o
    if shape.deferred:  # each chunk's last gradient pass (B, or W where the backward is split), from the end
        b.seen[:] = 0
        grad_pass = W_PASS if shape.split else B_PASS
        for o in range(length - 1, -1, -1):
            c = b.chunks[o]
            b.final[o] = 1 if b.passes[o] == grad_pass and b.seen[c] == 0 else 0
            if b.passes[o] == grad_pass:
                b.seen[c] = 1
    b.st[S_OPEN_DP] = -1
    b.st[S_N_HELD] = 0
    b.st[S_TAIL] = -1
    b.pend[_PEND_PRE] = -1
    first_task = b.st[S_TASKS]
    nt = shape.n_tiers
    return Device(d, d * streams_per_device(nt), bulk_stream(d, nt, shape.dp_tier), comm_stream(d, nt, shape.pp_tier),
                  comm_stream(d, nt, shape.ep_tier), comm_stream(d, nt, shape.dp_tier), length, first_forward,
                  last_backward, first_task)


@jit(inline=True)
def _device_gathers(shape, costs, b, dev) -> None:
    """ZeRO-1/2: the bucketed parameter all-gather ahead of the first forward (its
    buckets are the device's first tasks); ZeRO-3: the first two passes' gathers."""
    n = b.st[S_TASKS]
    if shape.gather_params:
        nb = shape.n_buckets
        for k in range(nb):
            n = _dp_task(b, dev, n, _share(costs.dp_param_ns, nb, k), R_DP_PARAM, nb, k, -1, -1)
    if shape.z3:
        for o in range(min(2, dev.length)):
            if b.passes[o] != W_PASS:
                b.z3_gathers[o] = n
                n = _dp_task(b, dev, n, costs.z3_gather_ns, R_Z3_GATHER, 1, 0, b.micros[o], b.chunks[o])
    b.st[S_TASKS] = n


@jit(inline=True)
def _pass_of(shape, b, dev, o: int) -> Pass:
    """The ``Pass`` at index o of the device's compute order (every read of ``b``
    before the branches: the records' rules)."""
    pass_kind = b.passes[o]
    c = b.chunks[o]
    micro = b.micros[o]
    vs = chain_position(shape.schedule, shape.p, dev.d, c)
    sd = vs if shape.dual else dev.d  # the durations' row and column: DualPipe's chunk runs stage vs
    sc = 0 if shape.dual else c
    fwd = b.fwd_ns[sd, sc]
    bwd = b.bwd_ns[sd, sc]
    wgrad = b.wgrad_ns[sd, sc]
    experts_f = b.ep_ns[sd, sc, 0]
    experts_b = b.ep_ns[sd, sc, 1]
    traffic = b.ep_ns[sd, sc, 2] + b.ep_ns[sd, sc, 3]
    key = micro + 1 if shape.steady else micro
    gather_here = shape.gather_params and o == dev.first_forward
    reduce_here = shape.reduce_grads and o == dev.last_backward
    pieces = shape.n_buckets if (gather_here or reduce_here) else 1
    if pass_kind == F_PASS:
        total = fwd
        task_kind = K_FORWARD
        op = R_FORWARD
    elif pass_kind == B_PASS:
        total = bwd - wgrad if shape.split else bwd
        task_kind = K_BACKWARD
        op = R_BACKWARD
    else:
        total = wgrad
        task_kind = K_WEIGHT_GRAD
        op = R_WGRAD
    ep_here = shape.has_ep and pass_kind != W_PASS and traffic > 0
    experts = 0
    if ep_here:  # the pass's compute before its EP traffic; the experts run between the transfers
        experts = min(experts_f if pass_kind == F_PASS else experts_b, total)
        total -= experts
    return Pass(o, pass_kind, c, vs, sd, sc, key, task_kind, op, total, experts, ep_here, gather_here, reduce_here,
                pieces)


@jit(inline=True)
def _compute_pieces(shape, costs, b, dev, ps, prev: int) -> int:
    """The pass's compute, after task ``prev`` (if any): one task, or ``n_buckets``
    pieces where the device's parameter gather or gradient reduction is bucketed
    against it (piece k waits for gather bucket k; reduction bucket k follows
    piece k, the last one left to ``_release_dp``); the first piece waits for
    the pass's ZeRO-3 gather. Returns the last piece."""
    nb = shape.n_buckets
    z3_gather = b.z3_gathers[ps.o] if shape.z3 else -1
    n = b.st[S_TASKS]
    n_e = b.st[S_EDGES]
    for k in range(ps.pieces):
        piece = n
        n = _add_task(b, n, _share(ps.total, ps.pieces, k), dev.compute, ps.task_kind, dev.d, ps.key, ps.c)
        _rec(b.rec, piece, ps.op, ps.sd, ps.sc, ps.pieces, k)
        if prev >= 0:
            n_e = _add_edge(b, n_e, prev, piece)
        if ps.gather_here:
            n_e = _consume_dp(b, n_e, dev.first_task + k, piece)
        if k == 0 and z3_gather >= 0:
            n_e = _consume_dp(b, n_e, z3_gather, piece)
        if ps.reduce_here and k < ps.pieces - 1:  # bucket k of the gradients is final: reduce it
            rid = n
            n = _dp_task(b, dev, n, _share(costs.dp_grad_ns, nb, k), R_DP_GRAD, nb, k, -1, -1)
            n_e = _add_edge(b, n_e, piece, rid)
        prev = piece
    b.st[S_TASKS] = n
    b.st[S_EDGES] = n_e
    return prev


@jit(inline=True)
def _moe_part(shape, b, dev, ps, after: int) -> int:
    """One pass's MoE part on its own, after task ``after`` if any. A forward runs
    pre-expert compute -> dispatch -> experts -> combine, a backward combine's
    gradient -> experts -> dispatch's gradient -> the rest of its compute (the
    layer's order backwards), the traffic on the device's stream of the EP tier
    (shared with PP / DP traffic of that tier). With two-batch overlap the part
    is split in two halves whose traffic overlaps the other half's expert
    compute: first transfers [D1 D2] back to back, experts [E1 after D1, E2
    after D2], second transfers [C1 after E1, C2 after E2] (backward: combine
    and dispatch swapped), which exposes d + max(0, d - x) + max(0, c - x) + c
    of the halves' d, c, x (``kernels.moe.two_batch_exposed_s``). A chunk's MoE
    layers enter as one super-layer (their parts summed): for identical layers
    this is exact for the traffic and compute of a pass, and with TBO too (the
    exposed time is homogeneous in d, c, x, so L layers expose L times one
    layer's); it gives up only the interleaving of the layers' traffic with the
    pass's other compute, which runs before (forward) or after (backward) it.
    Returns the last task, the last half's second transfer."""
    is_f = ps.pass_kind == F_PASS
    first_ns = b.ep_ns[ps.sd, ps.sc, 2 if is_f else 3]
    second_ns = b.ep_ns[ps.sd, ps.sc, 3 if is_f else 2]
    halves = shape.halves
    n = b.st[S_TASKS]
    made = n
    n_e = b.st[S_EDGES]
    for hv in range(halves):
        n = _add_task(b, n, _share(first_ns, halves, hv), dev.ep_res, K_EP, dev.d, ps.key, ps.c)
        if after >= 0:
            n_e = _add_edge(b, n_e, after, n - 1)
    for hv in range(halves):
        xid = n
        n = _add_task(b, n, _share(ps.experts, halves, hv), dev.compute, ps.task_kind, dev.d, ps.key, ps.c)
        n_e = _add_edge(b, n_e, made + hv, xid)
        n = _add_task(b, n, _share(second_ns, halves, hv), dev.ep_res, K_EP, dev.d, ps.key, ps.c)
        n_e = _add_edge(b, n_e, xid, n - 1)
    b.st[S_TASKS] = n
    b.st[S_EDGES] = n_e
    _share_link(b, made, n, dev.shared_res)
    return n - 1


@jit(inline=True)
def _defer_moe_part(b, ps, prev: int) -> None:
    """Keep a pair's forward MoE part (``Build.pend``) for the backward after it."""
    b.pend[_PEND_PRE] = prev
    b.pend[_PEND_EXPERTS] = ps.experts
    b.pend[_PEND_COMBINE] = b.ep_ns[ps.sd, ps.sc, 3]
    b.pend[_PEND_DISPATCH] = b.ep_ns[ps.sd, ps.sc, 2]
    b.pend[_PEND_VS] = ps.vs
    b.pend[_PEND_KEY] = ps.key
    b.pend[_PEND_CHUNK] = ps.c


@jit(inline=True)
def _ep_pair_tasks(b, dev, ps) -> int:
    """A DualPipe EP pair's MoE parts, at the start of the pair's backward ``ps``.
    An overlapped F&B chunk (``_dualpipe_holds``) whose two passes both have EP
    traffic runs jointly, as DeepSeek-V3's Figure 4 pairs a layer's forward with
    another's backward: compute F_pre (the forward's compute before its
    experts, already built), B_exp, F_exp, B_rest; EP stream C_B (combine's
    gradient, on the backward's inputs), D_F (after F_pre), D_B (after B_exp),
    C_F (after F_exp); B_exp after C_B, F_exp after D_F, B_rest after D_B. One
    pass's traffic so hides behind the other's compute: the pair exposes
    max(0, c_B - pre_F) + max(0, d_F - x_B) + max(0, d_B - x_F) (+ max(0, c_F -
    rest_B) where nothing follows) instead of all four transfers, and the
    forward's experts wait for the backward's inputs (the reference's
    overlapped chunk waits for both receives before it starts), which can make
    a pair end later than the two passes run one after the other where the
    backward's input comes late (uneven stages; tests/test_schedules_extra.py).
    With two-batch overlap a pair runs so only where ``_ep_pair_next`` finds it
    exposes no more than the passes' halves. C_F is the forward's output (its
    held send waits for it too). Returns D_B, which B_rest follows."""
    f_key = b.pend[_PEND_KEY]
    f_chunk = b.pend[_PEND_CHUNK]
    cb = b.st[S_TASKS]
    made = cb
    n_e = b.st[S_EDGES]
    n = _add_task(b, cb, b.ep_ns[ps.sd, ps.sc, 3], dev.ep_res, K_EP, dev.d, ps.key, ps.c)
    bx = n
    n = _add_task(b, n, ps.experts, dev.compute, ps.task_kind, dev.d, ps.key, ps.c)
    n_e = _add_edge(b, n_e, cb, bx)
    df = n
    n = _add_task(b, n, b.pend[_PEND_DISPATCH], dev.ep_res, K_EP, dev.d, f_key, f_chunk)
    n_e = _add_edge(b, n_e, b.pend[_PEND_PRE], df)
    fx = n
    n = _add_task(b, n, b.pend[_PEND_EXPERTS], dev.compute, K_FORWARD, dev.d, f_key, f_chunk)
    n_e = _add_edge(b, n_e, df, fx)
    db = n
    n = _add_task(b, n, b.ep_ns[ps.sd, ps.sc, 2], dev.ep_res, K_EP, dev.d, ps.key, ps.c)
    n_e = _add_edge(b, n_e, bx, db)
    cf = n
    n = _add_task(b, n, b.pend[_PEND_COMBINE], dev.ep_res, K_EP, dev.d, f_key, f_chunk)
    n_e = _add_edge(b, n_e, fx, cf)
    b.st[S_TASKS] = n
    b.st[S_EDGES] = n_e
    b.st[S_TAIL] = cf
    _share_link(b, made, n, dev.shared_res)
    b.ends[E_F_OUT, b.pend[_PEND_VS], f_key] = cf
    b.ends[E_F_LAST, b.pend[_PEND_VS], f_key] = cf
    b.pend[_PEND_PRE] = -1
    return db


@jit(inline=True)
def _pass_sends(shape, costs, b, dev, ps, prev: int) -> None:
    """The pipeline sends around pass ``ps`` (last task ``prev``): its output is held
    for a send to the next position, if it has one; then the outputs held so far
    leave after ``prev``, in pass order, unless DualPipe holds them over the next
    pass (an F&B chunk, a B with its W). Each send runs on the pipeline stream
    (also after the held tail, if any) and becomes its pass's output; a send of
    0 ns is left out unless it must join a tail to ``prev``."""
    is_f = ps.pass_kind == F_PASS
    is_b = ps.pass_kind == B_PASS
    n_held = b.st[S_N_HELD]
    if (is_f and ps.vs < shape.n_positions - 1) or (is_b and ps.vs > 0):
        b.held[n_held, _HELD_VS] = ps.vs
        b.held[n_held, _HELD_KEY] = ps.key
        b.held[n_held, _HELD_IS_F] = 1 if is_f else 0
        b.held[n_held, _HELD_CHUNK] = ps.c
        n_held += 1
    holds = False
    if shape.dual:
        holds = _dualpipe_holds(b, ps.o, dev.length)
    tail = b.st[S_TAIL]
    n = b.st[S_TASKS]
    n_e = b.st[S_EDGES]
    if not holds:
        for h in range(n_held):
            sid = prev
            if costs.send_ns > 0 or tail >= 0:
                sid = n
                n = _add_task(b, n, costs.send_ns, dev.send_res, K_PP, dev.d, b.held[h, _HELD_KEY],
                              b.held[h, _HELD_CHUNK])
                _rec(b.rec, sid, R_SEND, 0, 0, 1, 0)
                n_e = _add_edge(b, n_e, prev, sid)
                if tail >= 0:
                    n_e = _add_edge(b, n_e, tail, sid)
                _share_link(b, sid, n, dev.shared_res)
            out = E_F_OUT if b.held[h, _HELD_IS_F] == 1 else E_B_OUT
            b.ends[out, b.held[h, _HELD_VS], b.held[h, _HELD_KEY]] = sid
        n_held = 0
        tail = -1
    b.st[S_TASKS] = n
    b.st[S_EDGES] = n_e
    b.st[S_N_HELD] = n_held
    b.st[S_TAIL] = tail


@jit(inline=True)
def _release_dp(shape, costs, b, dev, ps, prev: int) -> None:
    """The data-parallel traffic pass ``ps`` releases, after its task ``prev``: the
    last gradient bucket (the device's last backward), ZeRO-3's gather of the
    pass after next (ahead of this pass's scatter) and, where this pass's weight
    gradients are final, ZeRO-3's gradient reduce-scatter (deferred: only after
    the chunk's last gradient pass, its accumulated gradients)."""
    n = b.st[S_TASKS]
    n_e = b.st[S_EDGES]
    if ps.reduce_here:
        nb = shape.n_buckets
        n = _dp_task(b, dev, n, _share(costs.dp_grad_ns, nb, nb - 1), R_DP_GRAD, nb, nb - 1, -1, -1)
        n_e = _add_edge(b, n_e, prev, n - 1)
    ahead = ps.o + 2
    if shape.z3 and ahead < dev.length and b.passes[ahead] != W_PASS:
        b.z3_gathers[ahead] = n
        n = _dp_task(b, dev, n, costs.z3_gather_ns, R_Z3_GATHER, 1, 0, b.micros[ahead], b.chunks[ahead])
        n_e = _add_edge(b, n_e, prev, n - 1)
    grads_done = (ps.pass_kind == B_PASS and not shape.split) or ps.pass_kind == W_PASS
    if shape.z3 and grads_done and (not shape.deferred or b.final[ps.o] != 0):
        n = _dp_task(b, dev, n, costs.z3_scatter_ns, R_Z3_SCATTER, 1, 0, ps.key, ps.c)
        n_e = _add_edge(b, n_e, prev, n - 1)
    b.st[S_TASKS] = n
    b.st[S_EDGES] = n_e


@jit(inline=True)
def _optimizer_step(shape, costs, b, dev) -> None:
    """The optimizer step closes the device's step, after all of its data-parallel
    tasks but the ZeRO-1/2 parameter gathers (which its first forward consumed)."""
    opt = b.st[S_TASKS]
    b.st[S_TASKS] = _add_task(b, opt, costs.optimizer_ns, dev.compute, K_OPTIMIZER, dev.d, -1, -1)
    _rec(b.rec, opt, R_OPTIMIZER, 0, 0, 1, 0)
    after_gathers = dev.first_task + (shape.n_buckets if shape.gather_params else 0)
    n_e = b.st[S_EDGES]
    for j in range(after_gathers, opt):
        if b.kind[j] == K_DP:
            n_e = _add_edge(b, n_e, j, opt)
    b.st[S_EDGES] = n_e


@jit(inline=True)
def _pass_chain_edges(shape, b) -> None:
    """The dependencies between passes of the step (all of them but PipeDream's
    outside its window): a forward's output before the next position's forward,
    a backward's before the previous position's backward, a position's forward
    before its backward."""
    ends = b.ends
    n_e = b.st[S_EDGES]
    for vs in range(shape.n_positions):
        for i in range(shape.n_ids):
            f_out = ends[E_F_OUT, vs, i]
            if vs < shape.n_positions - 1 and f_out >= 0 and ends[E_F_FIRST, vs + 1, i] >= 0:
                n_e = _add_edge(b, n_e, f_out, ends[E_F_FIRST, vs + 1, i])
            b_out = ends[E_B_OUT, vs, i]
            if vs > 0 and b_out >= 0 and ends[E_B_FIRST, vs - 1, i] >= 0:
                n_e = _add_edge(b, n_e, b_out, ends[E_B_FIRST, vs - 1, i])
            f_last = ends[E_F_LAST, vs, i]
            b_first = ends[E_B_FIRST, vs, i]
            if f_last >= 0 and b_first >= 0:
                n_e = _add_edge(b, n_e, f_last, b_first)
    b.st[S_EDGES] = n_e


@jit(inline=True)
def _finish_graph(shape, b):
    """``build_step_recipe``'s return value: the graph's task columns cut to the
    tasks created, successors in CSR form and every stream's order (tasks are
    created in each device's program order, so ids already follow every
    stream's order), and the recipe."""
    n = b.st[S_TASKS]
    n_e = b.st[S_EDGES]
    n_res = shape.p * streams_per_device(shape.n_tiers)
    succ_ptr, succ_idx, n_pred = csr_from_edges(n, b.src[:n_e], b.dst[:n_e])
    order_ptr, order_idx = order_by_id(n_res, b.res[:n])
    sync = np.full(n, -1, dtype=np.int32)
    return ((b.dur[:n], b.res[:n], b.kind[:n], b.stage[:n], b.micro[:n], b.chunk[:n], sync, succ_ptr, succ_idx,
             n_pred, order_ptr, order_idx, n_res), (b.rec[:n], b.links[:b.st[S_LINKS]]))


@jit(inline=True)
def _rec(rec, t: int, op: int, sd: int, sc: int, parts: int, k: int) -> None:
    """Task t's duration recipe: share k of ``parts`` of input ``op`` (row sd, column sc)."""
    rec[t, 0] = op
    rec[t, 1] = sd
    rec[t, 2] = sc
    rec[t, 3] = parts
    rec[t, 4] = k


@jit(inline=True)
def _add_task(b, n: int, duration, resource, task_kind, d, i, c) -> int:
    """Task n (device d, micro-batch label i, chunk c); returns the next task id."""
    b.dur[n] = duration
    b.res[n] = resource
    b.kind[n] = task_kind
    b.stage[n] = d
    b.micro[n] = i
    b.chunk[n] = c
    return n + 1


@jit(inline=True)
def _add_edge(b, n_e: int, src: int, dst: int) -> int:
    """Edge n_e, src -> dst; returns the next edge id."""
    b.src[n_e] = src
    b.dst[n_e] = dst
    return n_e + 1


@jit(inline=True)
def _dp_task(b, dev, n: int, duration, op: int, parts: int, k: int, i, c) -> int:
    """Task n, a data-parallel transfer on the device's bulk stream (share k of
    ``parts`` of input ``op``); it opens the link window (module docstring).
    Returns the next task id."""
    _rec(b.rec, n, op, 0, 0, parts, k)
    b.st[S_OPEN_DP] = n
    return _add_task(b, n, duration, dev.dp_res, K_DP, dev.d, i, c)


@jit(inline=True)
def _consume_dp(b, n_e: int, transfer: int, task: int) -> int:
    """Edge n_e: ``task`` waits for data-parallel ``transfer``, which closes its
    window if open. Returns the next edge id."""
    open_dp = b.st[S_OPEN_DP]
    b.st[S_OPEN_DP] = -1 if open_dp == transfer else open_dp
    return _add_edge(b, n_e, transfer, task)


#: a recipe's scalar inputs, ``recipe_durations_sets``' columns: R_DP_PARAM .. R_OPTIMIZER
N_RECIPE_SCALARS = R_OPTIMIZER - R_DP_PARAM + 1


@jit
def recipe_durations(rec, links, split: bool, fwd_ns, bwd_ns, wgrad_ns, send_ns: int, dp_grad_ns: int,
                     dp_param_ns: int, z3_gather_ns: int, z3_scatter_ns: int, optimizer_ns: int, dur) -> bool:
    """A graph's durations from its recipe (``build_step_recipe``) and new inputs of
    the same structure, into ``dur``: each task the same share of the same input,
    then the critical transfers' time added to the data-parallel transfers they
    share a link with. Returns False (``dur`` unusable) where a task has no recipe
    (MoE traffic: its graph depends on the durations). One set of inputs of
    ``recipe_durations_sets``."""
    scalars = np.empty((1, N_RECIPE_SCALARS), dtype=np.int64)
    scalars[0, R_DP_PARAM - R_DP_PARAM] = dp_param_ns
    scalars[0, R_DP_GRAD - R_DP_PARAM] = dp_grad_ns
    scalars[0, R_Z3_GATHER - R_DP_PARAM] = z3_gather_ns
    scalars[0, R_Z3_SCATTER - R_DP_PARAM] = z3_scatter_ns
    scalars[0, R_SEND - R_DP_PARAM] = send_ns
    scalars[0, R_OPTIMIZER - R_DP_PARAM] = optimizer_ns
    p, v = fwd_ns.shape
    return recipe_durations_sets(rec, links, split, fwd_ns.reshape((1, p, v)), bwd_ns.reshape((1, p, v)),
                                 wgrad_ns.reshape((1, p, v)), scalars, dur.reshape((dur.shape[0], 1)))


@jit
def recipe_durations_sets(rec, links, split: bool, fwd_ns, bwd_ns, wgrad_ns, scalars, dur) -> bool:
    """``recipe_durations`` for several sets of inputs at once: set ``c``'s pass
    durations ``fwd_ns[c]``, ``bwd_ns[c]``, ``wgrad_ns[c]`` (device x chunk) and its
    scalar inputs ``scalars[c]`` (``R_DP_PARAM`` .. ``R_OPTIMIZER``, in that order)
    give column ``c`` of ``dur`` (tasks x sets)."""
    n_sets = dur.shape[1]
    for t in range(rec.shape[0]):
        op = rec[t, 0]
        a = rec[t, 1]
        b = rec[t, 2]
        parts = rec[t, 3]
        k = rec[t, 4]
        if op == R_FORWARD:
            for c in range(n_sets):
                dur[t, c] = _share(fwd_ns[c, a, b], parts, k)
        elif op == R_BACKWARD and split:
            for c in range(n_sets):
                dur[t, c] = _share(bwd_ns[c, a, b] - wgrad_ns[c, a, b], parts, k)
        elif op == R_BACKWARD:
            for c in range(n_sets):
                dur[t, c] = _share(bwd_ns[c, a, b], parts, k)
        elif op == R_WGRAD:
            for c in range(n_sets):
                dur[t, c] = _share(wgrad_ns[c, a, b], parts, k)
        elif R_DP_PARAM <= op <= R_OPTIMIZER:
            for c in range(n_sets):
                dur[t, c] = _share(scalars[c, op - R_DP_PARAM], parts, k)
        else:
            return False
    for j in range(links.shape[0]):
        for c in range(n_sets):
            dur[links[j, 0], c] += dur[links[j, 1], c]
    return True


@jit(inline=True)
def _share_link(b, lo: int, hi: int, shared_res: int) -> None:
    """Tasks lo..hi-1 just created: those on ``shared_res`` (critical traffic on
    the data-parallel tier) lengthen the open data-parallel transfer by their
    own duration (the link moves both flows' bytes; module docstring). Each
    such pair goes into ``b.links``."""
    open_dp = b.st[S_OPEN_DP]
    n_links = b.st[S_LINKS]
    if open_dp >= 0:
        for t in range(lo, hi):
            if b.res[t] == shared_res:
                b.dur[open_dp] += b.dur[t]
                b.links[n_links, 0] = open_dp
                b.links[n_links, 1] = t
                n_links += 1
    b.st[S_LINKS] = n_links


@jit(inline=True)
def _ep_pair_next(shape, b, dev, o: int) -> bool:
    """Whether DualPipe's forward o (with EP traffic) and the backward after it
    run as an EP pair (``_ep_pair_tasks``): an overlapped F&B chunk
    (``_dualpipe_holds``) whose backward has EP traffic too and runs in one
    piece (not the device's last backward, whose gradient reduction is
    bucketed). With two-batch overlap, only where the pair would expose no more
    than the two passes' halves on their own, inputs ready and nothing else
    running (the analytic tier's min of the two credits): with the forward's
    pre-expert compute a, experts x, dispatch d and combine c, and the
    backward's experts y, rest r, combine's gradient c' and dispatch's d', the
    pair exposes max(0, c' - a) + max(0, d - y) + max(0, d' - x) + max(0, c - r),
    the halves (d + max(0, d - x) + max(0, c - x) + c) / 2 and the same of the
    backward's (c', d', y)."""
    nxt = min(o + 1, dev.length - 1)
    sf = chain_position(SCHEDULE_DUALPIPE, shape.p, dev.d, b.chunks[o])
    sb = chain_position(SCHEDULE_DUALPIPE, shape.p, dev.d, b.chunks[nxt])
    opens_chunk = o + 1 < dev.length and b.passes[nxt] == B_PASS and b.chunks[nxt] != b.chunks[o]
    whole = not (shape.reduce_grads and o + 1 == dev.last_backward)
    x_f = min(b.ep_ns[sf, 0, 0], b.fwd_ns[sf, 0])
    a_f = b.fwd_ns[sf, 0] - x_f
    d_f = b.ep_ns[sf, 0, 2]
    c_f = b.ep_ns[sf, 0, 3]
    b_in = b.bwd_ns[sb, 0] - b.wgrad_ns[sb, 0]
    y_b = min(b.ep_ns[sb, 0, 1], b_in)
    r_b = b_in - y_b
    d_b = b.ep_ns[sb, 0, 2]
    c_b = b.ep_ns[sb, 0, 3]
    pair = max(0, c_b - a_f) + max(0, d_f - y_b) + max(0, d_b - x_f) + max(0, c_f - r_b)
    halves = (d_f + max(0, d_f - x_f) + max(0, c_f - x_f) + c_f) + (c_b + max(0, c_b - y_b) + max(0, d_b - y_b) + d_b)
    return opens_chunk and whole and d_b + c_b > 0 and (shape.tbo == 0 or 2 * pair <= halves)


@jit(inline=True)
def _dualpipe_holds(b, o: int, length: int) -> bool:
    """Whether DualPipe's pass o (of ``length`` in ``b``'s compute order) sends its
    output only after the next pass: a forward followed by a backward of the
    other direction (the two form one overlapped F&B chunk, whose sends follow
    both), and a backward followed by its own W (not deferred: one autograd
    pass computes both)."""
    nxt = min(o + 1, length - 1)  # (read at a clamped index, used only where it exists)
    kind = b.passes[o]
    next_kind = b.passes[nxt]
    same_chunk = b.chunks[nxt] == b.chunks[o]
    same_micro = b.micros[nxt] == b.micros[o]
    f_and_b = kind == F_PASS and next_kind == B_PASS and not same_chunk
    b_and_w = kind == B_PASS and next_kind == W_PASS and same_chunk and same_micro
    return o + 1 < length and (f_and_b or b_and_w)


@jit(inline=True)
def _share(total: int, parts: int, k: int) -> int:
    """Part k of ``total`` split in ``parts`` as evenly as integers allow: the first
    total % parts parts take one more. Every part is then non-decreasing in
    ``total``, so shorter work never makes a piece longer (with the remainder on the
    last part, 4 ns in 4 buckets ran 1 ns each but 2 ns as 0, 0, 0, 2: halving a
    gradient reduction lengthened its exposed last bucket)."""
    if parts == 1:  # most tasks: no division
        return total
    return total // parts + (1 if k < total % parts else 0)


@jit
def steady_in_flight(kind, micro, order_ptr, order_idx) -> int:
    """PipeDream's peak in-flight micro-batches on stage 0 (its compute stream is
    resource 0): at the start of the period the micro-batches numbered from its
    first backward up to its first forward are in flight (forwarded in earlier
    periods); then +1 per forward, -1 per backward."""
    first_f = -1
    first_b = -1
    for k in range(order_ptr[0], order_ptr[1]):
        t = order_idx[k]
        if kind[t] == K_FORWARD and first_f < 0:
            first_f = micro[t]
        elif kind[t] == K_BACKWARD and first_b < 0:
            first_b = micro[t]
    live = max(0, first_f - first_b) if first_f >= 0 and first_b >= 0 else 0
    peak = live
    last = -1
    for k in range(order_ptr[0], order_ptr[1]):
        t = order_idx[k]
        if kind[t] != K_FORWARD and kind[t] != K_BACKWARD:
            continue
        key = micro[t] * 2 + (1 if kind[t] == K_BACKWARD else 0)
        if key == last:  # a further piece of the same pass
            continue
        last = key
        live += 1 if kind[t] == K_FORWARD else -1
        peak = max(peak, live)
    return peak


@jit
def steady_span_ns(res, start, end, p: int, n_tiers: int) -> int:
    """PipeDream's steady-state step: the longest device span, from the start of
    the device's first compute task to the end of its last task on any stream
    (its periods are staggered, so the graph's makespan would count the stagger)."""
    per_dev = streams_per_device(n_tiers)
    first = np.full(p, -1, dtype=np.int64)
    last = np.zeros(p, dtype=np.int64)
    for t in range(res.shape[0]):
        d = res[t] // per_dev
        if res[t] % per_dev == 0 and (first[d] < 0 or start[t] < first[d]):
            first[d] = start[t]
        last[d] = max(last[d], end[t])
    span = 0
    for d in range(p):
        if first[d] >= 0 and last[d] - first[d] > span:
            span = last[d] - first[d]
    return span
