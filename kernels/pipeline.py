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

import numpy as np

from paraspace.kernels.codes import (
    SCHEDULE_DUALPIPE,
    SCHEDULE_GPIPE,
    SCHEDULE_INTERLEAVED,
    SCHEDULE_PIPEDREAM,
    SCHEDULE_ZB_H1,
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


@jit
def build_step(schedule: int, p: int, v: int, m: int, fwd_ns, bwd_ns, wgrad_ns, send_ns: int, pp_tier: int,
               dp_tier: int,
               n_tiers: int, zero: int, dp_grad_ns: int, dp_param_ns: int, n_buckets: int,
               z3_gather_ns: int, z3_scatter_ns: int, optimizer_ns: int, ep_ns, ep_tier: int, tbo: int,
               ep_pairs: bool = True):
    """Arrays of one training step's task graph (``build_step_recipe``'s graph)."""
    graph, _ = build_step_recipe(schedule, p, v, m, fwd_ns, bwd_ns, wgrad_ns, send_ns, pp_tier, dp_tier, n_tiers, zero,
                                 dp_grad_ns, dp_param_ns, n_buckets, z3_gather_ns, z3_scatter_ns, optimizer_ns, ep_ns,
                                 ep_tier, tbo, ep_pairs)
    return graph


#: a task's duration recipe (``build_step_recipe``): which input it is a share of
R_FORWARD, R_BACKWARD, R_WGRAD, R_DP_PARAM, R_DP_GRAD, R_Z3_GATHER, R_Z3_SCATTER, R_SEND, R_OPTIMIZER, R_NONE = range(10)
#: recipe columns: the input, its (device, chunk) indices, and the share (parts, k)
N_RECIPE = 5


@jit(inline=True)
def _rec(rec, t: int, op: int, a: int, b: int, parts: int, k: int) -> None:
    rec[t, 0] = op
    rec[t, 1] = a
    rec[t, 2] = b
    rec[t, 3] = parts
    rec[t, 4] = k


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
    (on tier ``ep_tier``). Where dispatch + combine > 0 a forward runs as
    pre-expert compute -> dispatch -> experts -> combine and a backward as
    combine's gradient -> experts -> dispatch's gradient -> the rest of its
    compute (the layer's order backwards), the traffic
    on the device's stream of ``ep_tier`` (shared with PP / DP traffic of that
    tier); with ``tbo`` the expert part is split in two halves whose traffic
    overlaps the other half's expert compute (two-batch overlap): dispatch
    [D1 D2], experts [E1 after D1, E2 after D2], combine [C1 after E1, C2 after
    E2] (backward: the same with combine and dispatch swapped), which exposes d + max(0, d - x) + max(0, c - x) + c of the halves'
    d, c, x (``kernels.moe.two_batch_exposed_s``). A chunk's MoE layers enter
    as one super-layer (their parts summed): for identical layers this is
    exact for the traffic and compute of a pass, and with TBO too (the exposed
    time is homogeneous in d, c, x, so L layers expose L times one layer's);
    it gives up only the interleaving of the layers' traffic with the pass's
    other compute, which runs before (forward) or after (backward) it.
    DualPipe with ``ep_pairs``: an overlapped F&B chunk (``_dualpipe_holds``)
    whose two passes both have EP traffic runs jointly, as DeepSeek-V3's
    Figure 4 pairs a layer's forward with another's backward: compute F_pre
    (the forward's compute before its experts), B_exp, F_exp, B_rest; EP
    stream C_B (combine's gradient, on the backward's inputs), D_F (after
    F_pre), D_B (after B_exp), C_F (after F_exp); B_exp after C_B, F_exp after
    D_F, B_rest after D_B. One pass's traffic so hides behind the other's
    compute: the pair exposes max(0, c_B - pre_F) + max(0, d_F - x_B) +
    max(0, d_B - x_F) (+ max(0, c_F - rest_B) where nothing follows) instead
    of all four transfers, and the forward's experts wait for the backward's
    inputs (the reference's overlapped chunk waits for both receives before
    it starts), which can make a pair end later than the two passes run one
    after the other where the backward's input comes late (uneven stages;
    tests/test_schedules_extra.py). With ``tbo`` a pair runs so only where
    ``_ep_pair_next`` finds it exposes no more than the passes' halves.
    Without ``ep_pairs``, and for unpaired passes (warm-up, cool-down), each
    pass runs its EP part alone, as in the other schedules.
    Returns ((dur_ns, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx,
    n_pred, order_ptr, order_idx, n_resources), (recipe, links)): recipe[t] says
    which input task t's duration is a share of (``R_*``, its device and chunk, the
    share's parts and index; R_NONE for MoE tasks), links the (data-parallel
    transfer, critical transfer) pairs whose durations add (``_share_link``), so
    that ``recipe_durations`` rebuilds ``dur_ns`` from other inputs of the same
    structure (``kernels.event_tier``: rows sharing a graph).
    """
    P = p * v  # positions along a micro-batch's pipeline
    per_dev = passes_per_device(schedule, v, m)
    dual = schedule == SCHEDULE_DUALPIPE
    steady = schedule == SCHEDULE_PIPEDREAM
    n_ids = micro_ids(schedule, p, m)
    nb = max(n_buckets, 1)
    reduce_grads = zero < 3 and dp_grad_ns > 0
    gather_params = 1 <= zero < 3 and dp_param_ns > 0
    z3 = zero >= 3 and (z3_gather_ns > 0 or z3_scatter_ns > 0)
    has_ep = False
    for d in range(p):
        for c in range(v):
            if ep_ns[d, c, 2] + ep_ns[d, c, 3] > 0:
                has_ep = True
    halves = 2 if tbo != 0 else 1
    # per device: passes, + nb gathers and nb reductions, + (nb - 1) extra pieces of
    # the first forward and of the last backward, + the optimizer; sends; ZeRO-3
    # gathers (every pass) and scatters (every backward)
    # EP: up to 3 halves' extra tasks per F / B pass (experts, dispatch, combine)
    cap = p * (per_dev + 4 * nb + 1) + 2 * P * m + (p * 2 * per_dev if z3 else 0) + (
        p * per_dev * 3 * halves if has_ep else 0)
    dur = np.empty(cap, dtype=np.int64)
    res = np.empty(cap, dtype=np.int32)
    kind = np.empty(cap, dtype=np.int8)
    stage = np.empty(cap, dtype=np.int32)
    micro = np.empty(cap, dtype=np.int32)
    chunk = np.empty(cap, dtype=np.int32)
    e_cap = 4 * cap
    src = np.empty(e_cap, dtype=np.int32)
    dst = np.empty(e_cap, dtype=np.int32)
    rec = np.full((cap, N_RECIPE), R_NONE, dtype=np.int32)
    links = np.empty((cap, 2), dtype=np.int32)
    n_links = 0
    # per (position, micro-batch id) the pass's first task and its output; -1 where the
    # pass is outside the step (PipeDream's window: done in the previous period or later)
    f_first = np.full((P, n_ids), -1, dtype=np.int64)
    f_out = np.full((P, n_ids), -1, dtype=np.int64)  # the forward's last piece, or its send
    b_first = np.full((P, n_ids), -1, dtype=np.int64)
    b_out = np.full((P, n_ids), -1, dtype=np.int64)
    f_last = np.full((P, n_ids), -1, dtype=np.int64)
    z3_gathers = np.full(per_dev, -1, dtype=np.int64)  # ZeRO-3: the gather task of each pass
    held = np.zeros((4, 5), dtype=np.int64)  # sends to create: (position, micro-batch id, is forward, label, chunk)
    passes = np.zeros(per_dev, dtype=np.int32)
    chunks = np.zeros(per_dev, dtype=np.int32)
    micros = np.zeros(per_dev, dtype=np.int32)
    # DualPipe's EP pair (see above): the forward's pre-expert compute (its last task), experts,
    # dispatch, combine, position, id, label and chunk, kept from the forward to the backward
    pend = np.full(8, -1, dtype=np.int64)
    n_res = p * streams_per_device(n_tiers)
    n = 0
    n_e = 0
    for d in range(p):
        compute = d * streams_per_device(n_tiers)
        dp_res = bulk_stream(d, n_tiers, dp_tier)
        send_res = comm_stream(d, n_tiers, pp_tier)
        ep_res = comm_stream(d, n_tiers, ep_tier)
        shared_res = comm_stream(d, n_tiers, dp_tier)  # critical traffic that shares the DP tier's NIC
        open_dp = -1  # the data-parallel transfer whose window is open (see the module docstring)
        length = compute_order(schedule, p, v, m, d, passes, chunks, micros)
        reductions_from = n  # dp tasks of this device are ids >= this (the optimizer waits on them)
        gathers = n
        first_forward = _first_forward(passes, length)
        last_backward = _last_backward(passes, length)
        n_held = 0  # sends waiting for the end of a later pass (DualPipe)
        tail = -1  # a held send also waits for this task (a paired forward's combine, DualPipe)
        pend[0] = -1
        if gather_params:  # ZeRO-1/2: bucketed parameter all-gather ahead of the first forward
            for k in range(nb):
                open_dp = n
                _rec(rec, n, R_DP_PARAM, 0, 0, nb, k)
                n = _task(dur, res, kind, stage, micro, chunk, n, _share(dp_param_ns, nb, k), dp_res, K_DP, d, -1, -1)
        if z3:  # ZeRO-3: the first two passes' gathers start the step
            for o in range(min(2, length)):
                if passes[o] == W_PASS:
                    continue
                z3_gathers[o] = open_dp = n
                _rec(rec, n, R_Z3_GATHER, 0, 0, 1, 0)
                n = _task(dur, res, kind, stage, micro, chunk, n, z3_gather_ns, dp_res, K_DP, d, micros[o], chunks[o])
        split = split_backward(schedule)
        for o in range(length):
            is_f = passes[o] == F_PASS
            is_b = passes[o] == B_PASS
            is_w = passes[o] == W_PASS
            c = chunks[o]
            vs = chain_position(schedule, p, d, c)
            sd = vs if dual else d  # the durations' row and column: DualPipe's chunk runs stage vs
            sc = 0 if dual else c
            key = micros[o] + 1 if steady else micros[o]  # id of the micro-batch in the arrays above
            i = key  # the task's micro-batch label (PipeDream: the window's first backward's micro-batch is 0)
            gather_here = gather_params and o == first_forward
            reduce_here = reduce_grads and o == last_backward
            pieces = nb if (gather_here or reduce_here) else 1
            if is_f:
                total = fwd_ns[sd, sc]
                task_kind = K_FORWARD
            elif is_b:
                total = bwd_ns[sd, sc] - wgrad_ns[sd, sc] if split else bwd_ns[sd, sc]
                task_kind = K_BACKWARD
            else:
                total = wgrad_ns[sd, sc]
                task_kind = K_WEIGHT_GRAD
            ep_here = has_ep and not is_w and ep_ns[sd, sc, 2] + ep_ns[sd, sc, 3] > 0
            experts = 0
            if ep_here:  # the pass's compute before its EP traffic; the experts run between the transfers
                experts = min(ep_ns[sd, sc, 0 if is_f else 1], total)
                total -= experts
            # a forward opening a DualPipe EP pair leaves its MoE part to the backward after it
            pair_f = (ep_pairs and dual and ep_here and is_f and pieces == 1
                      and _ep_pair_next(passes, chunks, o, length, p, d, fwd_ns, bwd_ns, wgrad_ns, ep_ns, tbo,
                                        reduce_grads, last_backward))
            first = n
            prev = -1
            if ep_here and is_b and pend[0] >= 0:  # the pair's MoE parts, interleaved (see the docstring)
                made = n
                cb = n
                n = _task(dur, res, kind, stage, micro, chunk, n, ep_ns[sd, sc, 3], ep_res, K_EP, d, i, c)
                bx = n
                n = _task(dur, res, kind, stage, micro, chunk, n, experts, compute, task_kind, d, i, c)
                n_e = _edge(src, dst, n_e, cb, bx)
                df = n
                n = _task(dur, res, kind, stage, micro, chunk, n, pend[3], ep_res, K_EP, d, pend[6], pend[7])
                n_e = _edge(src, dst, n_e, pend[0], df)
                fx = n
                n = _task(dur, res, kind, stage, micro, chunk, n, pend[1], compute, K_FORWARD, d, pend[6], pend[7])
                n_e = _edge(src, dst, n_e, df, fx)
                db = n
                n = _task(dur, res, kind, stage, micro, chunk, n, ep_ns[sd, sc, 2], ep_res, K_EP, d, i, c)
                n_e = _edge(src, dst, n_e, bx, db)
                tail = n  # C_F: the forward's output; its held send waits for it too
                n = _task(dur, res, kind, stage, micro, chunk, n, pend[2], ep_res, K_EP, d, pend[6], pend[7])
                n_e = _edge(src, dst, n_e, fx, tail)
                n_links = _share_link(dur, res, made, n, shared_res, open_dp, links, n_links)
                f_out[pend[4], pend[5]] = tail
                f_last[pend[4], pend[5]] = tail
                pend[0] = -1
                prev = db
            elif ep_here and is_b:  # the MoE part first: combine's gradient -> experts -> dispatch's gradient
                made = n
                n, n_e = _ep_tasks(dur, res, kind, stage, micro, chunk, src, dst, n, n_e, -1, ep_ns[sd, sc, 3],
                                   experts, ep_ns[sd, sc, 2], halves, ep_res, compute, task_kind, d, i, c)
                n_links = _share_link(dur, res, made, n, shared_res, open_dp, links, n_links)
                prev = n - 1
            for k in range(pieces):
                piece = n
                _rec(rec, n, R_FORWARD if is_f else (R_BACKWARD if is_b else R_WGRAD), sd, sc, pieces, k)
                n = _task(dur, res, kind, stage, micro, chunk, n, _share(total, pieces, k), compute, task_kind, d, i, c)
                if prev >= 0:
                    n_e = _edge(src, dst, n_e, prev, piece)
                if gather_here:
                    n_e = _edge(src, dst, n_e, gathers + k, piece)
                    if open_dp == gathers + k:  # consumed
                        open_dp = -1
                if z3 and k == 0 and z3_gathers[o] >= 0:
                    n_e = _edge(src, dst, n_e, z3_gathers[o], piece)
                    if open_dp == z3_gathers[o]:
                        open_dp = -1
                if reduce_here and k < pieces - 1:  # bucket k of the gradients is final: reduce it
                    rid = open_dp = n
                    _rec(rec, n, R_DP_GRAD, 0, 0, nb, k)
                    n = _task(dur, res, kind, stage, micro, chunk, n, _share(dp_grad_ns, nb, k), dp_res, K_DP, d, -1, -1)
                    n_e = _edge(src, dst, n_e, piece, rid)
                prev = piece
            if pair_f:  # the MoE part runs with the backward's (above, next pass)
                pend[0] = prev
                pend[1] = experts
                pend[2] = ep_ns[sd, sc, 3]
                pend[3] = ep_ns[sd, sc, 2]
                pend[4] = vs
                pend[5] = key
                pend[6] = i
                pend[7] = c
            elif ep_here and is_f:  # then dispatch -> experts -> combine
                made = n
                n, n_e = _ep_tasks(dur, res, kind, stage, micro, chunk, src, dst, n, n_e, prev, ep_ns[sd, sc, 2],
                                   experts, ep_ns[sd, sc, 3], halves, ep_res, compute, task_kind, d, i, c)
                n_links = _share_link(dur, res, made, n, shared_res, open_dp, links, n_links)
                prev = n - 1
            out = prev
            if is_b:
                b_first[vs, key] = first
                b_out[vs, key] = out
            elif is_f:
                f_first[vs, key] = first
                f_out[vs, key] = out
                f_last[vs, key] = prev
            if (is_f and vs < P - 1) or (is_b and vs > 0):  # this pass's output goes to the next position
                n_held = _hold(held, n_held, vs, key, is_f, i, c)
            # DualPipe's F&B chunks and a B with its W send their outputs after the next pass
            if not (dual and _dualpipe_holds(passes, chunks, micros, o, length)):
                for h in range(n_held):  # the outputs held so far leave after this pass, in pass order
                    sid = prev
                    if send_ns > 0 or tail >= 0:  # (a send of 0 ns joins the pair's two ends)
                        sid = n
                        _rec(rec, n, R_SEND, 0, 0, 1, 0)
                        n = _task(dur, res, kind, stage, micro, chunk, n, send_ns, send_res, K_PP, d, held[h, 3],
                                  held[h, 4])
                        n_e = _edge(src, dst, n_e, prev, sid)
                        if tail >= 0:
                            n_e = _edge(src, dst, n_e, tail, sid)
                        n_links = _share_link(dur, res, sid, n, shared_res, open_dp, links, n_links)
                    if held[h, 2] == 1:
                        f_out[held[h, 0], held[h, 1]] = sid
                    else:
                        b_out[held[h, 0], held[h, 1]] = sid
                n_held = 0
                tail = -1
            # the data-parallel traffic this pass releases
            if reduce_here:  # the last bucket
                rid = open_dp = n
                _rec(rec, n, R_DP_GRAD, 0, 0, nb, nb - 1)
                n = _task(dur, res, kind, stage, micro, chunk, n, _share(dp_grad_ns, nb, nb - 1), dp_res, K_DP, d, -1,
                          -1)
                n_e = _edge(src, dst, n_e, prev, rid)
            if z3 and o + 2 < length and passes[o + 2] != W_PASS:  # gather the pass after next, ahead of a scatter
                gid = open_dp = n
                z3_gathers[o + 2] = gid
                _rec(rec, n, R_Z3_GATHER, 0, 0, 1, 0)
                n = _task(dur, res, kind, stage, micro, chunk, n, z3_gather_ns, dp_res, K_DP, d, micros[o + 2],
                          chunks[o + 2])
                n_e = _edge(src, dst, n_e, prev, gid)
            if z3 and ((is_b and not split) or is_w):  # this pass's weight gradients are final
                rid = open_dp = n
                _rec(rec, n, R_Z3_SCATTER, 0, 0, 1, 0)
                n = _task(dur, res, kind, stage, micro, chunk, n, z3_scatter_ns, dp_res, K_DP, d, i, c)
                n_e = _edge(src, dst, n_e, prev, rid)
        # the optimizer step closes the device's step, after all of its reductions
        opt = n
        _rec(rec, n, R_OPTIMIZER, 0, 0, 1, 0)
        n = _task(dur, res, kind, stage, micro, chunk, n, optimizer_ns, compute, K_OPTIMIZER, d, -1, -1)
        for j in range(reductions_from, opt):
            if kind[j] == K_DP and (j < gathers or j >= gathers + (nb if gather_params else 0)):
                n_e = _edge(src, dst, n_e, j, opt)
    for vs in range(P):
        for i in range(n_ids):  # dependencies between passes of the step (all of them but PipeDream's)
            if vs < P - 1 and f_out[vs, i] >= 0 and f_first[vs + 1, i] >= 0:
                n_e = _edge(src, dst, n_e, f_out[vs, i], f_first[vs + 1, i])
            if vs > 0 and b_out[vs, i] >= 0 and b_first[vs - 1, i] >= 0:
                n_e = _edge(src, dst, n_e, b_out[vs, i], b_first[vs - 1, i])
            if f_last[vs, i] >= 0 and b_first[vs, i] >= 0:
                n_e = _edge(src, dst, n_e, f_last[vs, i], b_first[vs, i])
    succ_ptr, succ_idx, n_pred = csr_from_edges(n, src[:n_e], dst[:n_e])
    # tasks are created in each device's program order, so ids already follow
    # every stream's order
    order_ptr, order_idx = order_by_id(n_res, res[:n])
    sync = np.full(n, -1, dtype=np.int32)
    return ((dur[:n], res[:n], kind[:n], stage[:n], micro[:n], chunk[:n], sync, succ_ptr, succ_idx, n_pred,
             order_ptr, order_idx, n_res), (rec[:n], links[:n_links]))


@jit
def recipe_durations(rec, links, split: bool, fwd_ns, bwd_ns, wgrad_ns, send_ns: int, dp_grad_ns: int,
                     dp_param_ns: int, z3_gather_ns: int, z3_scatter_ns: int, optimizer_ns: int, dur) -> bool:
    """A graph's durations from its recipe (``build_step_recipe``) and new inputs of
    the same structure, into ``dur``: each task the same share of the same input,
    then the critical transfers' time added to the data-parallel transfers they
    share a link with. Returns False (``dur`` unusable) where a task has no recipe
    (MoE traffic: its graph depends on the durations)."""
    for t in range(rec.shape[0]):
        op = rec[t, 0]
        a = rec[t, 1]
        b = rec[t, 2]
        if op == R_FORWARD:
            total = fwd_ns[a, b]
        elif op == R_BACKWARD:
            total = bwd_ns[a, b] - wgrad_ns[a, b] if split else bwd_ns[a, b]
        elif op == R_WGRAD:
            total = wgrad_ns[a, b]
        elif op == R_DP_PARAM:
            total = dp_param_ns
        elif op == R_DP_GRAD:
            total = dp_grad_ns
        elif op == R_Z3_GATHER:
            total = z3_gather_ns
        elif op == R_Z3_SCATTER:
            total = z3_scatter_ns
        elif op == R_SEND:
            total = send_ns
        elif op == R_OPTIMIZER:
            total = optimizer_ns
        else:
            return False
        dur[t] = _share(total, rec[t, 3], rec[t, 4])
    for j in range(links.shape[0]):
        dur[links[j, 0]] += dur[links[j, 1]]
    return True


@jit(inline=True)
def _share_link(dur, res, lo: int, hi: int, shared_res: int, open_dp: int, links, n_links: int) -> int:
    """Tasks lo..hi-1 just created: those on ``shared_res`` (critical traffic on
    the data-parallel tier) lengthen the open data-parallel transfer by their
    own duration (the link moves both flows' bytes; module docstring). Each
    such pair goes into ``links``; returns their new count."""
    if open_dp < 0:
        return n_links
    for t in range(lo, hi):
        if res[t] == shared_res:
            dur[open_dp] += dur[t]
            links[n_links, 0] = open_dp
            links[n_links, 1] = t
            n_links += 1
    return n_links


@jit
def _ep_tasks(dur, res, kind, stage, micro, chunk, src, dst, n: int, n_e: int, after: int, before_ns: int,
              experts_ns: int, after_ns: int, halves: int, ep_res: int, compute: int, task_kind: int, d: int, i: int,
              c: int):
    """One pass's MoE part: the halves' first transfers back to back on the EP
    stream (after task ``after``, if any), then per half its expert compute
    (after its transfer) and its second transfer (after its experts). Returns
    (n, n_e); the last task created is the last half's second transfer."""
    ahead = n
    for hv in range(halves):
        n = _task(dur, res, kind, stage, micro, chunk, n, _share(before_ns, halves, hv), ep_res, K_EP, d, i, c)
        if after >= 0:
            n_e = _edge(src, dst, n_e, after, n - 1)
    for hv in range(halves):
        xid = n
        n = _task(dur, res, kind, stage, micro, chunk, n, _share(experts_ns, halves, hv), compute, task_kind, d, i, c)
        n_e = _edge(src, dst, n_e, ahead + hv, xid)
        n = _task(dur, res, kind, stage, micro, chunk, n, _share(after_ns, halves, hv), ep_res, K_EP, d, i, c)
        n_e = _edge(src, dst, n_e, xid, n - 1)
    return n, n_e


@jit
def _ep_pair_next(passes, chunks, o: int, length: int, p: int, d: int, fwd_ns, bwd_ns, wgrad_ns, ep_ns, tbo: int,
                  reduce_grads: bool, last_backward: int) -> bool:
    """Whether DualPipe's forward o (with EP traffic) and the backward after it
    run as an EP pair (``build_step``): an overlapped F&B chunk
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
    if o + 1 >= length or passes[o + 1] != B_PASS or chunks[o + 1] == chunks[o]:
        return False
    if reduce_grads and o + 1 == last_backward:
        return False
    sf = chain_position(SCHEDULE_DUALPIPE, p, d, chunks[o])
    sb = chain_position(SCHEDULE_DUALPIPE, p, d, chunks[o + 1])
    d_b = ep_ns[sb, 0, 2]
    c_b = ep_ns[sb, 0, 3]
    if d_b + c_b <= 0:
        return False
    if tbo == 0:
        return True
    x_f = min(ep_ns[sf, 0, 0], fwd_ns[sf, 0])
    a_f = fwd_ns[sf, 0] - x_f
    d_f = ep_ns[sf, 0, 2]
    c_f = ep_ns[sf, 0, 3]
    b_in = bwd_ns[sb, 0] - wgrad_ns[sb, 0]
    y_b = min(ep_ns[sb, 0, 1], b_in)
    r_b = b_in - y_b
    pair = max(0, c_b - a_f) + max(0, d_f - y_b) + max(0, d_b - x_f) + max(0, c_f - r_b)
    halves = (d_f + max(0, d_f - x_f) + max(0, c_f - x_f) + c_f) + (c_b + max(0, c_b - y_b) + max(0, d_b - y_b) + d_b)
    return 2 * pair <= halves


@jit(inline=True)
def _hold(held, n_held: int, vs: int, key: int, is_f: bool, label: int, c: int) -> int:
    held[n_held, 0] = vs
    held[n_held, 1] = key
    held[n_held, 2] = 1 if is_f else 0
    held[n_held, 3] = label
    held[n_held, 4] = c
    return n_held + 1


@jit
def _dualpipe_holds(passes, chunks, micros, o: int, length: int) -> bool:
    """Whether DualPipe's pass o sends its output only after the next pass: a
    forward followed by a backward of the other direction (the two form one
    overlapped F&B chunk, whose sends follow both), and a backward followed by
    its own W (not deferred: one autograd pass computes both)."""
    if o + 1 >= length:
        return False
    nxt = passes[o + 1]
    if passes[o] == F_PASS:
        return nxt == B_PASS and chunks[o + 1] != chunks[o]
    if passes[o] == B_PASS:
        return nxt == W_PASS and chunks[o + 1] == chunks[o] and micros[o + 1] == micros[o]
    return False


@jit(inline=True)
def _task(dur, res, kind, stage, micro, chunk, n, duration, resource, task_kind, d, i, c) -> int:
    dur[n] = duration
    res[n] = resource
    kind[n] = task_kind
    stage[n] = d
    micro[n] = i
    chunk[n] = c
    return n + 1


@jit(inline=True)
def _share(total: int, parts: int, k: int) -> int:
    """Part k of ``total`` split in ``parts``; the last part takes the remainder."""
    return total // parts + (total % parts if k == parts - 1 else 0)


@jit(inline=True)
def _edge(src, dst, n_e, a, b) -> int:
    src[n_e] = a
    dst[n_e] = b
    return n_e + 1


@jit
def _first_forward(passes, length) -> int:
    for o in range(length):
        if passes[o] == F_PASS:
            return o
    return -1


@jit
def _last_backward(passes, length) -> int:
    """The device's last backward or weight-gradient pass: its gradients are final after it."""
    for o in range(length - 1, -1, -1):
        if passes[o] != F_PASS:
            return o
    return -1


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
