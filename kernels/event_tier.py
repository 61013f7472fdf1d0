"""Event tier: simulate each candidate's training step with the event engine.

Each row's task graph is built from the same costs as the analytic tier
(``kernels.training.row_costs``): every device's chunk of layers per
micro-batch, forward and backward (TP traffic and exposed CP time inside the
pass, as in the analytic tier), the embedding on the first virtual stage, the
LM head and loss on the last, MoE dispatch/combine as tasks on the EP group's
tier between a pass's compute and its experts (two-batch overlap and
DualPipe's overlap of a forward's traffic with the paired backward's compute
and the other way round produced by the engine), pipeline
sends on the link tier between stages, bucketed data-parallel reduction and
ZeRO gathers on the DP tier, a device's traffic on one tier sharing its NIC
(a critical stream for sends and EP transfers, a data-parallel stream that
carries their time beside it), and the optimizer step
(``kernels.pipeline.build_step``). The simulation replaces the closed-form
pipeline and overlap formulas: unequal stages, send latency on the critical
path, the NIC shared by pipeline, EP and data-parallel traffic and the overlap
of reductions with the remaining backward come out of the run.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from paraspace.kernels.codes import SCHEDULE_DUALPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_PIPEDREAM, SCHEDULE_ZB_H1
from paraspace.kernels.collectives import group_tier
from paraspace.kernels.engine import K_BACKWARD, K_DP, K_EP, K_FORWARD, K_PP, K_WEIGHT_GRAD, OK, exposed_ns, simulate
from paraspace.kernels.jit import jit
from paraspace.kernels.pipeline import build_step, split_backward, steady_in_flight, steady_span_ns, streams_per_device
from paraspace.kernels.training import (
    C_DP_GRAD,
    C_DP_PARAM,
    C_EMB_B,
    C_EMB_COMM,
    C_EMB_F,
    C_EP_B,
    C_EP_COMB,
    C_EP_DISP,
    C_EP_F,
    C_EXPERT_B,
    C_EXPERT_F,
    C_EXPERT_W,
    C_HEAD_B,
    C_HEAD_COMM,
    C_HEAD_F,
    C_HEAD_WGRAD,
    C_MTP_B,
    C_MTP_F,
    C_MTP_W,
    C_OPT,
    C_P2P,
    N_COST,
    chunk_dense_layers,
    chunk_layers,
    ep_strides,
    layers_pass_s,
    row_costs,
)

#: Output columns of ``simulate_rows``, in order (units in ``results.schema``).
SIM_OUTPUTS = (
    "step_time_s",
    "simulated",
    "bubble_sim_s",
    "pp_exposed_sim_s",
    "dp_exposed_sim_s",
    "ep_exposed_sim_s",
    "inflight_peak_stage0",
    "n_tasks",
)
N_SIM = len(SIM_OUTPUTS)
S_STEP, S_SIMULATED, S_BUBBLE, S_PP, S_DP, S_EP, S_INFLIGHT, S_TASKS = range(N_SIM)

#: default number of gradient buckets (Megatron-LM's default bucket is 40M
#: parameters; a handful per device is typical)
DEFAULT_BUCKETS = 4
NS = 1e9


def task_bound(pp, vpp, schedule, n_micro, zero, n_buckets: int):
    """Upper bound on the tasks of each row's graph (numpy arrays or scalars),
    used to cap the simulation's cost per row."""
    pp = np.asarray(pp, dtype=np.int64)
    v = np.where(np.asarray(schedule) == SCHEDULE_INTERLEAVED, vpp, 1).astype(np.int64)
    split = (np.asarray(schedule) == SCHEDULE_ZB_H1) | (np.asarray(schedule) == SCHEDULE_DUALPIPE)
    passes = np.where(split, 3, 2)  # F, B (and W where the backward is split)
    per_dev = passes * v * np.asarray(n_micro, dtype=np.int64)
    dp = np.where(np.asarray(zero) >= 3, 3 * per_dev, 2 * n_buckets)
    return pp * (per_dev + 2 * n_buckets + 1 + dp) + pp * per_dev


@jit
def row_graph(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
              dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets):
    """The task graph of one candidate (``kernels.pipeline.build_step``'s tuple)."""
    costs = np.empty(N_COST, dtype=np.float64)
    row_costs(tp, pp, dp, cp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement, dispatch,
              tbo, off_act, off_w, model, dev, tiers, tiles, work, costs)
    p = pp
    v = vpp if schedule == SCHEDULE_INTERLEAVED else 1
    fwd_ns = np.empty((p, v), dtype=np.int64)
    bwd_ns = np.empty((p, v), dtype=np.int64)
    wgrad_ns = np.empty((p, v), dtype=np.int64)
    ep_ns = np.zeros((p, v, 4), dtype=np.int64)
    # MoE traffic as EP tasks (kernels.pipeline.build_step): the pass durations lose the
    # exposed EP time row_costs put in them (TBO's overlap and DualPipe's pairing credit
    # included; the engine makes its own, DualPipe's from its F&B pairs) and the EP tasks
    # carry the whole dispatch and combine. Recompute's EP traffic and the MTP modules'
    # layer stay inside the backward / last-stage passes, as exposed time (row_costs').
    engine_ep = model.experts > 0 and costs[C_EP_DISP] + costs[C_EP_COMB] > 0
    expert_b = costs[C_EXPERT_B] - (costs[C_EXPERT_W] if split_backward(schedule) else 0.0)
    for d in range(p):
        for c in range(v):
            layers_chunk = chunk_layers(d, c, p, v, model.layers)
            nd = chunk_dense_layers(d, c, p, v, model)
            # the device's last rc_layers recompute; with interleaving, rc_layers / v per chunk
            nm = layers_chunk - nd
            f, b, w, _, _, _, _ = layers_pass_s(costs, nd, nm, recompute, float(rc_layers) / v)
            if engine_ep and nm > 0:
                f -= nm * costs[C_EP_F]
                b -= nm * costs[C_EP_B]
                ep_ns[d, c, 0] = np.int64(round(nm * costs[C_EXPERT_F] * NS))
                ep_ns[d, c, 1] = np.int64(round(nm * expert_b * NS))
                ep_ns[d, c, 2] = np.int64(round(nm * costs[C_EP_DISP] * NS))
                ep_ns[d, c, 3] = np.int64(round(nm * costs[C_EP_COMB] * NS))
            vs = c * p + d
            if vs == 0:
                f += costs[C_EMB_F] + costs[C_EMB_COMM]
                b += costs[C_EMB_B]
            if vs == p * v - 1:
                f += costs[C_HEAD_F] + costs[C_HEAD_COMM] + costs[C_MTP_F]
                b += costs[C_HEAD_B] + costs[C_MTP_B]
                w += costs[C_HEAD_WGRAD] + costs[C_MTP_W]
            fwd_ns[d, c] = np.int64(round(f * NS))
            bwd_ns[d, c] = np.int64(round(b * NS))
            wgrad_ns[d, c] = min(np.int64(round(w * NS)), bwd_ns[d, c])
    n_tiers = tiers.shape[0]
    pp_tier = group_tier(float(pp), float(tp * cp * dp), tiers)
    dp_tier = group_tier(float(dp * cp), float(tp), tiers)
    ep_stride, _, _ = ep_strides(float(tp), float(cp), float(dp), float(ep), float(etp), placement)
    ep_tier = group_tier(float(ep), ep_stride, tiers)
    dp_grad = costs[C_DP_GRAD]
    dp_param = costs[C_DP_PARAM]
    z3_gather = 0
    z3_scatter = 0
    if zero >= 3:  # per pass over one chunk: its share of the gather and the scatter
        z3_gather = np.int64(round(dp_param / v * NS))
        z3_scatter = np.int64(round(dp_grad / v * NS))
        dp_grad = 0.0
        dp_param = 0.0
    return build_step(schedule, p, v, n_micro, fwd_ns, bwd_ns, wgrad_ns, np.int64(round(costs[C_P2P] * NS)), pp_tier,
                      dp_tier,
                      n_tiers, zero, np.int64(round(dp_grad * NS)), np.int64(round(dp_param * NS)), n_buckets,
                      z3_gather, z3_scatter, np.int64(round(costs[C_OPT] * NS)), ep_ns, ep_tier, tbo)


@jit
def step_metrics(dur, res, kind, micro, chunk, order_ptr, order_idx, start, end, p: int, v: int, n_tiers: int, out):
    """Step time, bubble, exposed PP/DP/EP communication and stage 0's peak in-flight
    micro-batches of a simulated graph, into ``out`` (SIM_OUTPUTS order)."""
    step = 0
    for i in range(end.shape[0]):
        if end[i] > step:
            step = end[i]
    worst_busy = -1
    pp_exposed = 0
    dp_exposed = 0
    ep_exposed = 0
    per_dev = streams_per_device(n_tiers)
    for d in range(p):
        r = d * per_dev
        lo = order_ptr[r]
        hi = order_ptr[r + 1]
        busy = 0
        for k in range(lo, hi):
            busy += dur[order_idx[k]]
        if busy > worst_busy:
            worst_busy = busy
        # every communication stream is in time order like the compute stream; a
        # device's exposed time per class sums its streams (they rarely overlap idly)
        dev_pp = 0
        dev_dp = 0
        dev_ep = 0
        for rr in range(r + 1, r + per_dev):
            if order_ptr[rr + 1] == order_ptr[rr]:
                continue
            dev_pp += exposed_ns(order_idx, order_ptr[rr], order_ptr[rr + 1], K_PP, lo, hi, kind, start, end)
            dev_dp += exposed_ns(order_idx, order_ptr[rr], order_ptr[rr + 1], K_DP, lo, hi, kind, start, end)
            dev_ep += exposed_ns(order_idx, order_ptr[rr], order_ptr[rr + 1], K_EP, lo, hi, kind, start, end)
        pp_exposed = max(pp_exposed, dev_pp)
        dp_exposed = max(dp_exposed, dev_dp)
        ep_exposed = max(ep_exposed, dev_ep)
    # stage 0: forward passes begun minus backward passes begun (weight-gradient
    # passes where the backward is split: they still need the activations)
    release = K_BACKWARD
    for k in range(order_ptr[0], order_ptr[1]):
        if kind[order_idx[k]] == K_WEIGHT_GRAD:
            release = K_WEIGHT_GRAD
            break
    inflight = 0
    peak = 0
    last_f = -1
    last_b = -1
    for k in range(order_ptr[0], order_ptr[1]):
        task = order_idx[k]
        key = chunk[task] * 1_000_000 + micro[task]
        if kind[task] == K_FORWARD and key != last_f:
            inflight += 1
            last_f = key
            if inflight > peak:
                peak = inflight
        elif kind[task] == release and key != last_b:
            inflight -= 1
            last_b = key
    out[S_STEP] = step / NS
    out[S_SIMULATED] = 1.0
    out[S_BUBBLE] = (step - worst_busy) / NS
    out[S_PP] = pp_exposed / NS
    out[S_DP] = dp_exposed / NS
    out[S_EP] = ep_exposed / NS
    out[S_INFLIGHT] = peak / v
    out[S_TASKS] = dur.shape[0]


@jit
def simulate_one(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                 dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets,
                 out) -> int:
    g = row_graph(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                  dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets)
    dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = g
    start = np.empty(dur.shape[0], dtype=np.int64)
    end = np.empty(dur.shape[0], dtype=np.int64)
    status = simulate(dur, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, start, end)
    if status != OK:
        return status
    v = vpp if schedule == SCHEDULE_INTERLEAVED else 1
    step_metrics(dur, res, kind, micro, chunk, order_ptr, order_idx, start, end, pp, v, tiers.shape[0], out)
    if schedule == SCHEDULE_PIPEDREAM:  # one steady-state period: each device's span, not the staggered makespan
        span = steady_span_ns(res, start, end, pp, tiers.shape[0]) / NS
        out[S_BUBBLE] = max(0.0, out[S_BUBBLE] + span - out[S_STEP])  # the span covers the busiest device
        out[S_STEP] = span
        out[S_INFLIGHT] = steady_in_flight(kind, micro, order_ptr, order_idx)
    return OK


@jit(parallel=True)
def simulate_rows(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                  dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, select, analytic_step, tokens, mfu, n_buckets):
    """Simulate the rows where ``select`` is true; returns (n, N_SIM) float64.

    Rows not simulated get the analytic step time, ``simulated`` 0 and NaN
    elsewhere; a row whose schedule deadlocked gets ``simulated`` -1. ``tokens`` and ``mfu`` (the analytic tier's columns) are
    rewritten in place from the simulated step time."""
    n = tp.shape[0]
    out = np.full((n, N_SIM), np.nan)
    for i in prange(n):
        row = out[i]
        if select[i]:
            status = simulate_one(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i], zero[i],
                                  optimizer[i], schedule[i], ep[i], etp[i], placement[i], dispatch[i], tbo[i],
                                  rc_layers[i], off_act[i], off_w[i], n_micro[i], model[0], dev[0], tiers, tiles, work[0], n_buckets, row)
            if status == OK:
                scale = analytic_step[i] / row[S_STEP]
                tokens[i] *= scale
                mfu[i] *= scale
                continue
            row[S_SIMULATED] = -1.0  # the schedule deadlocked: a bug the caller must report
            continue
        row[S_STEP] = analytic_step[i]
        row[S_SIMULATED] = 0.0
    return out
