"""Pipeline schedules as task graphs for the event engine.

A training step on p devices (one per pipeline stage; every device of a stage
behaves alike, so one stands for all), v virtual chunks per device (virtual
stage vs = chunk * p + device, Megatron's interleaved layout) and m
micro-batches. Schedules only decide each device's compute order; the
dependencies are the same for all of them:

  F(vs, i) after send_f(vs-1, i), which follows F(vs-1, i);
  B(vs, i) after F(vs, i) and after send_b(vs+1, i), which follows B(vs+1, i).

Sends run on the sender's stream of the link tier between the stages; data-
parallel traffic runs on the device's stream of its own tier (the same stream
when both cross the same tier, so they queue behind each other on the NIC).
Gradient reduction is bucketed: the device's last backward is split into
``n_buckets`` pieces and bucket k's reduce-scatter / all-reduce follows piece k,
overlapping the rest of that backward; ZeRO-1/2 parameter all-gathers are
bucketed against the device's first forward the same way; ZeRO-3 gathers the
parameters before every forward and backward and reduce-scatters gradients
after every backward, prefetched one task ahead. The optimizer step ends the
step on each device after its last reduction.
"""

from __future__ import annotations

import numpy as np

from kernels.codes import SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED
from kernels.engine import (
    K_BACKWARD,
    K_DP,
    K_FORWARD,
    K_OPTIMIZER,
    K_PP,
    csr_from_edges,
    order_from_lists,
)
from kernels.jit import jit

#: compute order entries: (is_backward, chunk, micro-batch)
F_PASS = 0
B_PASS = 1


@jit
def compute_order(schedule: int, p: int, v: int, m: int, d: int, passes, chunks, micros) -> int:
    """Fill device ``d``'s compute order; returns its length (2 v m).

    GPipe: every forward, then every backward. 1F1B: min(p - d - 1, m) warm-up
    forwards, then one forward and one backward alternately, then the remaining
    backwards. Interleaved (Megatron-LM ``forward_backward_pipelining_with_
    interleaving``): virtual micro-batch k runs chunk (k mod p v) div p (backward:
    v - 1 minus that) of micro-batch (k div p v) p + k mod p; warm-up
    min(2 (p - d - 1) + (v - 1) p, m v), then 1F1B over virtual micro-batches.
    """
    n = 0
    if schedule == SCHEDULE_GPIPE:
        for i in range(m):
            passes[n] = F_PASS
            chunks[n] = 0
            micros[n] = i
            n += 1
        for i in range(m):
            passes[n] = B_PASS
            chunks[n] = 0
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
def build_step(schedule: int, p: int, v: int, m: int, fwd_ns, bwd_ns, send_ns: int, pp_tier: int, dp_tier: int,
               n_tiers: int, zero: int, dp_grad_ns: int, dp_param_ns: int, n_buckets: int,
               z3_gather_ns: int, z3_scatter_ns: int, optimizer_ns: int):
    """Arrays of one training step's task graph (see the module docstring).

    fwd_ns, bwd_ns: int64[p, v], one micro-batch of each device's chunk.
    send_ns: one pipeline message over tier ``pp_tier``; data-parallel traffic
    runs on tier ``dp_tier``. dp_grad_ns: a device's whole gradient reduction
    (all-reduce for ZeRO-0, reduce-scatter for ZeRO-1/2), 0 for none;
    dp_param_ns: the ZeRO-1/2 parameter all-gather; z3_*: ZeRO-3 per pass.
    Returns (dur_ns, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx,
    n_pred, order_ptr, order_idx, n_resources).
    """
    P = p * v
    per_dev = 2 * v * m
    nb = max(n_buckets, 1)
    reduce_grads = zero < 3 and dp_grad_ns > 0
    gather_params = 1 <= zero < 3 and dp_param_ns > 0
    z3 = zero >= 3 and (z3_gather_ns > 0 or z3_scatter_ns > 0)
    cap = p * (per_dev + 3 * nb + 1) + 2 * P * m + p * 3 * per_dev
    dur = np.zeros(cap, dtype=np.int64)
    res = np.zeros(cap, dtype=np.int32)
    kind = np.zeros(cap, dtype=np.int8)
    stage = np.zeros(cap, dtype=np.int32)
    micro = np.full(cap, -1, dtype=np.int32)
    chunk = np.full(cap, -1, dtype=np.int32)
    sync = np.full(cap, -1, dtype=np.int32)
    seq = np.zeros(cap, dtype=np.int64)
    e_cap = 4 * cap
    src = np.zeros(e_cap, dtype=np.int32)
    dst = np.zeros(e_cap, dtype=np.int32)
    f_first = np.zeros((P, m), dtype=np.int64)
    f_out = np.zeros((P, m), dtype=np.int64)  # the forward's last piece, or its send
    b_first = np.zeros((P, m), dtype=np.int64)
    b_out = np.zeros((P, m), dtype=np.int64)
    f_last = np.zeros((P, m), dtype=np.int64)
    passes = np.zeros(per_dev, dtype=np.int32)
    chunks = np.zeros(per_dev, dtype=np.int32)
    micros = np.zeros(per_dev, dtype=np.int32)
    n_res = p * (1 + n_tiers)
    n = 0
    n_e = 0
    for d in range(p):
        compute = d * (1 + n_tiers)
        dp_res = compute + 1 + dp_tier
        length = compute_order(schedule, p, v, m, d, passes, chunks, micros)
        pos = 0  # program position: orders the tasks on every stream of this device
        reductions_from = n  # dp tasks of this device are ids >= this (the optimizer waits on them)
        gathers = n
        first_forward = _first_forward(passes, length)
        if gather_params:  # ZeRO-1/2: bucketed parameter all-gather ahead of the first forward
            for k in range(nb):
                n = _task(dur, res, kind, stage, micro, chunk, seq, n, dp_param_ns // nb, dp_res, K_DP, d, -1, -1, pos)
        for o in range(length):
            is_b = passes[o] == B_PASS
            c = chunks[o]
            i = micros[o]
            vs = c * p + d
            gather_here = gather_params and o == first_forward
            reduce_here = reduce_grads and is_b and o == length - 1
            pieces = nb if (gather_here or reduce_here) else 1
            total = bwd_ns[d, c] if is_b else fwd_ns[d, c]
            task_kind = K_BACKWARD if is_b else K_FORWARD
            z3_gather = -1
            if z3:  # gather this pass's parameters, one pass ahead on the dp stream
                z3_gather = n
                n = _task(dur, res, kind, stage, micro, chunk, seq, n, z3_gather_ns, dp_res, K_DP, d, i, c, 4 * pos + 3)
            first = n
            prev = -1
            for k in range(pieces):
                pos += 1
                piece = n
                share = total // pieces + (total % pieces if k == pieces - 1 else 0)
                n = _task(dur, res, kind, stage, micro, chunk, seq, n, share, compute, task_kind, d, i, c, 4 * pos)
                if prev >= 0:
                    n_e = _edge(src, dst, n_e, prev, piece)
                if gather_here:
                    n_e = _edge(src, dst, n_e, gathers + k, piece)
                if z3_gather >= 0 and k == 0:
                    n_e = _edge(src, dst, n_e, z3_gather, piece)
                if reduce_here:  # bucket k of the gradients is final: reduce it
                    rid = n
                    n = _task(dur, res, kind, stage, micro, chunk, seq, n, dp_grad_ns // nb, dp_res, K_DP, d, -1, -1,
                              4 * pos + 1)
                    n_e = _edge(src, dst, n_e, piece, rid)
                prev = piece
            out = prev
            if z3 and is_b:
                rid = n
                n = _task(dur, res, kind, stage, micro, chunk, seq, n, z3_scatter_ns, dp_res, K_DP, d, i, c,
                          4 * pos + 1)
                n_e = _edge(src, dst, n_e, prev, rid)
            if ((not is_b and vs < P - 1) or (is_b and vs > 0)) and send_ns > 0:
                sid = n
                n = _task(dur, res, kind, stage, micro, chunk, seq, n, send_ns, compute + 1 + pp_tier, K_PP, d, i, c,
                          4 * pos + 2)
                n_e = _edge(src, dst, n_e, prev, sid)
                out = sid
            if is_b:
                b_first[vs, i] = first
                b_out[vs, i] = out
            else:
                f_first[vs, i] = first
                f_out[vs, i] = out
                f_last[vs, i] = prev
        # the optimizer step closes the device's step, after all of its reductions
        pos += 1
        opt = n
        n = _task(dur, res, kind, stage, micro, chunk, seq, n, optimizer_ns, compute, K_OPTIMIZER, d, -1, -1, 4 * pos)
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
    order_ptr, order_idx = order_from_lists(n_res, res[:n], seq[:n])
    return (dur[:n], res[:n], kind[:n], stage[:n], micro[:n], chunk[:n], sync[:n], succ_ptr, succ_idx, n_pred,
            order_ptr, order_idx, n_res)


@jit
def _task(dur, res, kind, stage, micro, chunk, seq, n, duration, resource, task_kind, d, i, c, position) -> int:
    dur[n] = duration
    res[n] = resource
    kind[n] = task_kind
    stage[n] = d
    micro[n] = i
    chunk[n] = c
    seq[n] = position
    return n + 1


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
