"""Pipeline schedules as task graphs for the event engine.

A training step on p devices (one per pipeline stage; every device of a stage
behaves alike, so one stands for all), v virtual chunks per device (virtual
stage vs = chunk * p + device, Megatron's interleaved layout) and m
micro-batches. Schedules only decide each device's compute order; the
dependencies are the same for all of them:

  F(vs, i) after send_f(vs-1, i), which follows F(vs-1, i);
  B(vs, i) after F(vs, i) and after send_b(vs+1, i), which follows B(vs+1, i).

Every device has a compute stream and, per link tier, a pipeline stream and a
data-parallel stream (``STREAM_CLASSES``), as NCCL runs pipeline and data-
parallel traffic on their own communicators: a critical pipeline send never
queues behind gradient buckets, but the two do not divide the link's bandwidth
either (a fair-share link model is future work). Data-parallel gathers and
reductions share their stream, so their bytes are serialised as on one link.
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

Tasks are created in each device's program order, so task ids follow every
stream's order. Preconditions (the encoder guarantees them): interleaving needs
m % p == 0.
"""

from __future__ import annotations

import numpy as np

from kernels.codes import SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_ZB_H1
from kernels.engine import (
    K_BACKWARD,
    K_DP,
    K_FORWARD,
    K_OPTIMIZER,
    K_PP,
    K_WEIGHT_GRAD,
    csr_from_edges,
    order_by_id,
)
from kernels.jit import jit

#: compute order entries: (pass, chunk, micro-batch); W only in zero-bubble schedules
F_PASS = 0
B_PASS = 1
W_PASS = 2


@jit
def passes_per_device(schedule: int, v: int, m: int) -> int:
    return (3 if schedule == SCHEDULE_ZB_H1 else 2) * v * m

#: communication streams per link tier, in this order
STREAM_PP = 0
STREAM_DP = 1
STREAM_CLASSES = ("pp", "dp")
N_STREAM_CLASSES = 2


@jit
def streams_per_device(n_tiers: int) -> int:
    """Compute stream + one stream per (tier, traffic class)."""
    return 1 + N_STREAM_CLASSES * n_tiers


@jit
def comm_stream(device: int, n_tiers: int, tier: int, stream_class: int) -> int:
    return device * streams_per_device(n_tiers) + 1 + N_STREAM_CLASSES * tier + stream_class


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
    """
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


@jit
def _put(passes, chunks, micros, n: int, kind: int, i: int) -> int:
    passes[n] = kind
    chunks[n] = 0
    micros[n] = i
    return n + 1


@jit
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
               z3_gather_ns: int, z3_scatter_ns: int, optimizer_ns: int):
    """Arrays of one training step's task graph (see the module docstring).

    fwd_ns, bwd_ns: int64[p, v], one micro-batch of each device's chunk;
    wgrad_ns: the weight-gradient part of bwd_ns, run as a separate W pass by
    zero-bubble schedules (ignored by the others).
    send_ns: one pipeline message over tier ``pp_tier``; data-parallel traffic
    runs on tier ``dp_tier``. dp_grad_ns: a device's whole gradient reduction
    (all-reduce for ZeRO-0, reduce-scatter for ZeRO-1/2), 0 for none;
    dp_param_ns: the ZeRO-1/2 parameter all-gather; z3_*: ZeRO-3 per pass.
    Returns (dur_ns, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx,
    n_pred, order_ptr, order_idx, n_resources).
    """
    P = p * v
    per_dev = passes_per_device(schedule, v, m)
    nb = max(n_buckets, 1)
    reduce_grads = zero < 3 and dp_grad_ns > 0
    gather_params = 1 <= zero < 3 and dp_param_ns > 0
    z3 = zero >= 3 and (z3_gather_ns > 0 or z3_scatter_ns > 0)
    # per device: passes, + nb gathers and nb reductions, + (nb - 1) extra pieces of
    # the first forward and of the last backward, + the optimizer; sends; ZeRO-3
    # gathers (every pass) and scatters (every backward)
    cap = p * (per_dev + 4 * nb + 1) + 2 * P * m + (p * 2 * per_dev if z3 else 0)
    dur = np.empty(cap, dtype=np.int64)
    res = np.empty(cap, dtype=np.int32)
    kind = np.empty(cap, dtype=np.int8)
    stage = np.empty(cap, dtype=np.int32)
    micro = np.empty(cap, dtype=np.int32)
    chunk = np.empty(cap, dtype=np.int32)
    e_cap = 4 * cap
    src = np.empty(e_cap, dtype=np.int32)
    dst = np.empty(e_cap, dtype=np.int32)
    f_first = np.zeros((P, m), dtype=np.int64)
    f_out = np.zeros((P, m), dtype=np.int64)  # the forward's last piece, or its send
    b_first = np.zeros((P, m), dtype=np.int64)
    b_out = np.zeros((P, m), dtype=np.int64)
    f_last = np.zeros((P, m), dtype=np.int64)
    z3_gathers = np.full(per_dev, -1, dtype=np.int64)  # ZeRO-3: the gather task of each pass
    passes = np.zeros(per_dev, dtype=np.int32)
    chunks = np.zeros(per_dev, dtype=np.int32)
    micros = np.zeros(per_dev, dtype=np.int32)
    n_res = p * streams_per_device(n_tiers)
    n = 0
    n_e = 0
    for d in range(p):
        compute = d * streams_per_device(n_tiers)
        dp_res = comm_stream(d, n_tiers, dp_tier, STREAM_DP)
        send_res = comm_stream(d, n_tiers, pp_tier, STREAM_PP)
        length = compute_order(schedule, p, v, m, d, passes, chunks, micros)
        reductions_from = n  # dp tasks of this device are ids >= this (the optimizer waits on them)
        gathers = n
        first_forward = _first_forward(passes, length)
        if gather_params:  # ZeRO-1/2: bucketed parameter all-gather ahead of the first forward
            for k in range(nb):
                n = _task(dur, res, kind, stage, micro, chunk, n, _share(dp_param_ns, nb, k), dp_res, K_DP, d, -1, -1)
        if z3:  # ZeRO-3: the first two passes' gathers start the step
            for o in range(min(2, length)):
                if passes[o] == W_PASS:
                    continue
                z3_gathers[o] = n
                n = _task(dur, res, kind, stage, micro, chunk, n, z3_gather_ns, dp_res, K_DP, d, micros[o], chunks[o])
        split = schedule == SCHEDULE_ZB_H1
        for o in range(length):
            is_f = passes[o] == F_PASS
            is_b = passes[o] == B_PASS
            is_w = passes[o] == W_PASS
            c = chunks[o]
            i = micros[o]
            vs = c * p + d
            gather_here = gather_params and o == first_forward
            reduce_here = reduce_grads and not is_f and o == length - 1
            pieces = nb if (gather_here or reduce_here) else 1
            if is_f:
                total = fwd_ns[d, c]
                task_kind = K_FORWARD
            elif is_b:
                total = bwd_ns[d, c] - wgrad_ns[d, c] if split else bwd_ns[d, c]
                task_kind = K_BACKWARD
            else:
                total = wgrad_ns[d, c]
                task_kind = K_WEIGHT_GRAD
            first = n
            prev = -1
            for k in range(pieces):
                piece = n
                n = _task(dur, res, kind, stage, micro, chunk, n, _share(total, pieces, k), compute, task_kind, d, i, c)
                if prev >= 0:
                    n_e = _edge(src, dst, n_e, prev, piece)
                if gather_here:
                    n_e = _edge(src, dst, n_e, gathers + k, piece)
                if z3 and k == 0 and z3_gathers[o] >= 0:
                    n_e = _edge(src, dst, n_e, z3_gathers[o], piece)
                if reduce_here:  # bucket k of the gradients is final: reduce it
                    rid = n
                    n = _task(dur, res, kind, stage, micro, chunk, n, _share(dp_grad_ns, nb, k), dp_res, K_DP, d, -1, -1)
                    n_e = _edge(src, dst, n_e, piece, rid)
                prev = piece
            out = prev
            if z3 and o + 2 < length and passes[o + 2] != W_PASS:  # gather the pass after next, ahead of a scatter
                gid = n
                z3_gathers[o + 2] = gid
                n = _task(dur, res, kind, stage, micro, chunk, n, z3_gather_ns, dp_res, K_DP, d, micros[o + 2],
                          chunks[o + 2])
                n_e = _edge(src, dst, n_e, prev, gid)
            if z3 and ((is_b and not split) or is_w):  # this pass's weight gradients are final
                rid = n
                n = _task(dur, res, kind, stage, micro, chunk, n, z3_scatter_ns, dp_res, K_DP, d, i, c)
                n_e = _edge(src, dst, n_e, prev, rid)
            if ((is_f and vs < P - 1) or (is_b and vs > 0)) and send_ns > 0:
                sid = n
                n = _task(dur, res, kind, stage, micro, chunk, n, send_ns, send_res, K_PP, d, i, c)
                n_e = _edge(src, dst, n_e, prev, sid)
                out = sid
            if is_b:
                b_first[vs, i] = first
                b_out[vs, i] = out
            elif is_f:
                f_first[vs, i] = first
                f_out[vs, i] = out
                f_last[vs, i] = prev
        # the optimizer step closes the device's step, after all of its reductions
        opt = n
        n = _task(dur, res, kind, stage, micro, chunk, n, optimizer_ns, compute, K_OPTIMIZER, d, -1, -1)
        for j in range(reductions_from, opt):
            if kind[j] == K_DP and (j < gathers or j >= gathers + (nb if gather_params else 0)):
                n_e = _edge(src, dst, n_e, j, opt)
    for vs in range(P):
        for i in range(m):
            if vs < P - 1:
                n_e = _edge(src, dst, n_e, f_out[vs, i], f_first[vs + 1, i])
            if vs > 0:
                n_e = _edge(src, dst, n_e, b_out[vs, i], b_first[vs - 1, i])
            n_e = _edge(src, dst, n_e, f_last[vs, i], b_first[vs, i])
    succ_ptr, succ_idx, n_pred = csr_from_edges(n, src[:n_e], dst[:n_e])
    # tasks are created in each device's program order, so ids already follow
    # every stream's order
    order_ptr, order_idx = order_by_id(n_res, res[:n])
    sync = np.full(n, -1, dtype=np.int32)
    return (dur[:n], res[:n], kind[:n], stage[:n], micro[:n], chunk[:n], sync, succ_ptr, succ_idx, n_pred,
            order_ptr, order_idx, n_res)


@jit
def _task(dur, res, kind, stage, micro, chunk, n, duration, resource, task_kind, d, i, c) -> int:
    dur[n] = duration
    res[n] = resource
    kind[n] = task_kind
    stage[n] = d
    micro[n] = i
    chunk[n] = c
    return n + 1


@jit
def _share(total: int, parts: int, k: int) -> int:
    """Part k of ``total`` split in ``parts``; the last part takes the remainder."""
    return total // parts + (total % parts if k == parts - 1 else 0)


@jit
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
