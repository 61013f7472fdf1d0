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
from paraspace.kernels.engine import (
    K_BACKWARD, K_DP, K_EP, K_FORWARD, K_PP, K_WEIGHT_GRAD, N_KINDS, OK, busy_prefix, exposed_ns, prepare,
    replay, replay_program, run, workspace,
)
from paraspace.kernels.jit import jit
from paraspace.kernels.pipeline import (
    N_RECIPE_SCALARS,
    R_DP_GRAD,
    R_DP_PARAM,
    R_OPTIMIZER,
    R_SEND,
    R_Z3_GATHER,
    R_Z3_SCATTER,
    build_step_recipe,
    recipe_durations,
    recipe_durations_sets,
    split_backward,
    steady_in_flight,
    steady_span_ns,
    streams_per_device,
)
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

#: rows of one graph replayed together (``kernels.engine.replay``): 16 measured fastest
#: (3.0 ns per task and row against 4.0 at 8 and 3.8 at 32; ``run`` takes 12)
REPLAY_SETS = 16
#: the groups' share-outs among threads (``simulate_rows``): each allocates its replay
#: arrays once, and more of them than threads balances the load (the thread count is
#: not read inside the kernel: that would make it uncacheable)
GROUP_WORKERS = 64
#: cap on tasks x rows of one replay's arrays (two of them, 8 bytes a cell: 32 MiB)
REPLAY_CELLS = 1 << 21
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
def row_inputs(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
               dispatch, tbo, rc_layers, off_act, off_w, model, dev, tiers, tiles, work):
    """What ``kernels.pipeline.build_step`` takes for one candidate besides its schedule,
    shape and buckets: (fwd_ns, bwd_ns, wgrad_ns, ep_ns, send_ns, pp_tier, dp_tier,
    ep_tier, dp_grad_ns, dp_param_ns, z3_gather_ns, z3_scatter_ns, optimizer_ns)."""
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
            f, b, w, _, _, _, _, _ = layers_pass_s(costs, nd, nm, recompute, float(rc_layers) / v)
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
    return (fwd_ns, bwd_ns, wgrad_ns, ep_ns, np.int64(round(costs[C_P2P] * NS)), pp_tier, dp_tier, ep_tier,
            np.int64(round(dp_grad * NS)), np.int64(round(dp_param * NS)), np.int64(z3_gather), np.int64(z3_scatter),
            np.int64(round(costs[C_OPT] * NS)))


@jit
def row_graph(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
              dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets):
    """The task graph of one candidate (``kernels.pipeline.build_step``'s tuple)."""
    graph, _ = row_graph_recipe(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp,
                                placement, dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles,
                                work, n_buckets)
    return graph


@jit
def row_graph_recipe(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                     dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets):
    """The task graph of one candidate and its durations' recipe
    (``kernels.pipeline.build_step_recipe``)."""
    fwd_ns, bwd_ns, wgrad_ns, ep_ns, send_ns, pp_tier, dp_tier, ep_tier, dp_grad_ns, dp_param_ns, z3g, z3s, opt_ns = \
        row_inputs(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                   dispatch, tbo, rc_layers, off_act, off_w, model, dev, tiers, tiles, work)
    v = vpp if schedule == SCHEDULE_INTERLEAVED else 1
    return build_step_recipe(schedule, pp, v, n_micro, fwd_ns, bwd_ns, wgrad_ns, send_ns, pp_tier, dp_tier,
                             tiers.shape[0], zero, dp_grad_ns, dp_param_ns, n_buckets, z3g, z3s, opt_ns, ep_ns, ep_tier,
                             tbo)


@jit
def step_metrics(dur, res, kind, micro, chunk, order_ptr, order_idx, start, end, p: int, v: int, n_tiers: int, out):
    """Step time, bubble, exposed PP/DP/EP communication and stage 0's peak in-flight
    micro-batches of a simulated graph, into ``out`` (SIM_OUTPUTS order). One set of
    times of ``timing_metrics``; ``start`` is read through ``dur`` and ``end``."""
    n = dur.shape[0]
    sets = np.empty((1, N_SIM), dtype=np.float64)
    timing_metrics(dur.reshape((n, 1)), kind, order_ptr, order_idx, end.reshape((n, 1)), p, n_tiers, 1, sets)
    out[:] = sets[0]
    out[S_INFLIGHT] = stage0_in_flight(kind, micro, chunk, order_ptr, order_idx) / v
    out[S_TASKS] = n


@jit
def timing_metrics(dur, kind, order_ptr, order_idx, end, p: int, n_tiers: int, n_used: int, out) -> None:
    """Step time, bubble and exposed PP/DP/EP communication of the first ``n_used``
    sets of times of one graph (columns of ``dur`` and ``end``, tasks x sets) into
    ``out[c]`` (SIM_OUTPUTS order; ``simulated`` 1, the rest left as they are)."""
    n_sets = dur.shape[1]
    step = np.zeros(n_sets, dtype=np.int64)
    for r in range(order_ptr.shape[0] - 1):  # a stream's last task ends last
        if order_ptr[r + 1] > order_ptr[r]:
            last = order_idx[order_ptr[r + 1] - 1]
            for c in range(n_sets):
                step[c] = max(step[c], end[last, c])
    worst_busy = np.zeros(n_sets, dtype=np.int64)
    worst = np.zeros((n_sets, N_KINDS), dtype=np.int64)  # per set and kind, the worst device
    exposed = np.zeros((n_sets, N_KINDS), dtype=np.int64)  # per set and kind, one device's streams
    per_dev = streams_per_device(n_tiers)
    most = 0
    for d in range(p):
        most = max(most, order_ptr[d * per_dev + 1] - order_ptr[d * per_dev])
    b_end = np.empty((most, n_sets), dtype=np.int64)
    b_busy = np.empty((most + 1, n_sets), dtype=np.int64)
    for d in range(p):
        r = d * per_dev
        lo = order_ptr[r]
        hi = order_ptr[r + 1]
        busy_prefix(order_idx, lo, hi, dur, end, b_end, b_busy)
        for c in range(n_sets):
            worst_busy[c] = max(worst_busy[c], b_busy[hi - lo, c])
        # every communication stream is in time order like the compute stream; a
        # device's exposed time per class sums its streams (they rarely overlap idly)
        exposed[:] = 0
        for rr in range(r + 1, r + per_dev):
            if order_ptr[rr + 1] > order_ptr[rr]:
                exposed_ns(order_idx, order_ptr[rr], order_ptr[rr + 1], hi - lo, b_end, b_busy, kind, dur, end,
                           n_used, exposed)
        for c in range(n_sets):
            for k in range(N_KINDS):
                worst[c, k] = max(worst[c, k], exposed[c, k])
    for c in range(n_used):
        out[c, S_STEP] = step[c] / NS
        out[c, S_SIMULATED] = 1.0
        out[c, S_BUBBLE] = (step[c] - worst_busy[c]) / NS
        out[c, S_PP] = worst[c, K_PP] / NS
        out[c, S_DP] = worst[c, K_DP] / NS
        out[c, S_EP] = worst[c, K_EP] / NS


@jit
def stage0_in_flight(kind, micro, chunk, order_ptr, order_idx) -> int:
    """Stage 0's peak micro-batches in flight (chunks counted apart): forward passes
    begun minus backward passes begun (weight-gradient passes where the backward is
    split: they still need the activations). The order alone decides it."""
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
    return peak


@jit
def run_graph(graph, dur, plan, work, start, end, pp: int, v: int, schedule: int, n_tiers: int, out) -> int:
    """Simulate a step graph (``build_step``'s tuple, prepared as ``plan``) with durations
    ``dur`` and write its ``SIM_OUTPUTS`` into ``out``; returns the engine's status.
    ``work``, ``start`` and ``end`` are scratch arrays reused across runs."""
    status = run(dur, graph[6], graph[7], graph[8], plan, work, start, end)
    if status == OK:
        graph_outputs(graph, dur, start, end, pp, v, schedule, n_tiers, out)
    return status


@jit
def graph_outputs(graph, dur, start, end, pp: int, v: int, schedule: int, n_tiers: int, out) -> None:
    """``SIM_OUTPUTS`` of a step graph run with durations ``dur`` (its tasks' times
    ``start``/``end``), into ``out``."""
    _, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = graph
    step_metrics(dur, res, kind, micro, chunk, order_ptr, order_idx, start, end, pp, v, n_tiers, out)
    if schedule == SCHEDULE_PIPEDREAM:  # one steady-state period: each device's span, not the staggered makespan
        span = steady_span_ns(res, start, end, pp, n_tiers) / NS
        out[S_BUBBLE] = max(0.0, out[S_BUBBLE] + span - out[S_STEP])  # the span covers the busiest device
        out[S_STEP] = span
        out[S_INFLIGHT] = steady_in_flight(kind, micro, order_ptr, order_idx)


@jit
def prepared(graph):
    """A graph's engine plan, scratch arrays and start/end buffers (``run_graph``)."""
    dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = graph
    plan = prepare(sync, n_pred, order_ptr, order_idx)
    work = workspace(dur.shape[0], plan[3].shape[0] - 1)
    return plan, work, np.empty(dur.shape[0], dtype=np.int64), np.empty(dur.shape[0], dtype=np.int64)


@jit
def simulate_one(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                 dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets,
                 out) -> int:
    g = row_graph(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                  dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets)
    v = vpp if schedule == SCHEDULE_INTERLEAVED else 1
    plan, scratch, start, end = prepared(g)
    return run_graph(g, g[0], plan, scratch, start, end, pp, v, schedule, tiers.shape[0], out)


#: what a row's graph structure depends on besides its durations (``graph_key``)
N_KEY = 14


@jit
def graph_key(i: int, schedule: int, pp: int, v: int, n_micro: int, zero: int, tbo: int, inputs, key) -> None:
    """Row ``i``'s graph-structure key into ``key``: rows with equal keys have graphs that
    differ only in their durations (``kernels.pipeline.build_step_recipe``). A row with
    MoE traffic gets its own key (its graph depends on the durations)."""
    fwd_ns, bwd_ns, wgrad_ns, ep_ns, send_ns, pp_tier, dp_tier, ep_tier, dp_grad_ns, dp_param_ns, z3g, z3s, opt_ns = \
        inputs
    has_ep = 0
    for d in range(ep_ns.shape[0]):
        for c in range(ep_ns.shape[1]):
            if ep_ns[d, c, 2] + ep_ns[d, c, 3] > 0:
                has_ep = 1
    key[0] = schedule
    key[1] = pp
    key[2] = v
    key[3] = n_micro
    key[4] = 0 if zero == 0 else (1 if zero < 3 else zero)  # ZeRO-3 and ZeRO-3 deferred: different scatters
    key[5] = pp_tier
    key[6] = dp_tier
    key[7] = 1 if send_ns > 0 else 0
    key[8] = 1 if dp_grad_ns > 0 else 0
    key[9] = 1 if dp_param_ns > 0 else 0
    key[10] = 1 if z3g > 0 or z3s > 0 else 0
    key[11] = has_ep
    key[12] = ep_tier * 2 + tbo if has_ep else 0
    key[13] = i if has_ep else -1


@jit
def _same_key(keys, a: int, b: int) -> bool:
    for k in range(keys.shape[1]):
        if keys[a, k] != keys[b, k]:
            return False
    return True


@jit
def graph_groups(keys):
    """Rows (indices into ``keys``) ordered so that rows of one graph structure are
    adjacent, and the groups' bounds (CSR): sorted by a hash of the key, a group
    starts wherever the exact key changes (a hash collision only splits a group)."""
    n = keys.shape[0]
    h = np.empty(n, dtype=np.int64)
    for r in range(n):
        x = np.int64(1469598103934665603)
        for k in range(keys.shape[1]):
            x = (x ^ keys[r, k]) * np.int64(1099511628211)  # FNV-1a over the fields, wrapping
        h[r] = x
    order = np.argsort(h, kind="mergesort")
    ptr = np.empty(n + 1, dtype=np.int64)
    n_groups = 0
    for t in range(n):
        if t == 0 or not _same_key(keys, order[t], order[t - 1]):
            ptr[n_groups] = t
            n_groups += 1
    ptr[n_groups] = n
    return order, ptr[:n_groups + 1]


@jit(parallel=True)
def simulate_rows(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                  dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, select,
                  analytic_step, tokens, mfu, n_buckets):
    """Simulate the rows where ``select`` is true; returns (n, N_SIM) float64.

    Rows whose graphs differ only in their durations (``graph_key``: the same schedule,
    shape, link tiers and kinds of traffic) share one graph: it is built once per group,
    with the recipe of its durations, and its rows are run together (``simulate_group``).
    Rows not simulated
    get the analytic step time, ``simulated`` 0 and NaN elsewhere; a row whose schedule
    deadlocked gets ``simulated`` -1. ``tokens`` and ``mfu`` (the analytic tier's
    columns) are rewritten in place from the simulated step time."""
    n = tp.shape[0]
    out = np.full((n, N_SIM), np.nan)
    for i in range(n):
        if not select[i]:
            out[i, S_STEP] = analytic_step[i]
            out[i, S_SIMULATED] = 0.0
    chosen = np.flatnonzero(select)
    keys = np.empty((chosen.shape[0], N_KEY), dtype=np.int64)
    for j in prange(chosen.shape[0]):
        i = chosen[j]
        inputs = row_inputs(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i], zero[i],
                            optimizer[i], schedule[i], ep[i], etp[i], placement[i], dispatch[i], tbo[i], rc_layers[i],
                            off_act[i], off_w[i], model[0], dev[0], tiers, tiles, work[0])
        v = vpp[i] if schedule[i] == SCHEDULE_INTERLEAVED else 1
        graph_key(i, schedule[i], pp[i], v, n_micro[i], zero[i], tbo[i], inputs, keys[j])
    order, ptr = graph_groups(keys)
    n_groups = ptr.shape[0] - 1
    n_workers = min(GROUP_WORKERS, n_groups)
    for w in prange(n_workers):  # groups dealt round-robin; each worker reuses its replay buffer
        buf = np.empty(0, dtype=np.int64)
        for g in range(w, n_groups, n_workers):
            buf = simulate_group(chosen[order[ptr[g]:ptr[g + 1]]], buf, tp, pp, dp, cp, vpp, mb, recompute, sp,
                                 tp_overlap, zero, optimizer, schedule, ep, etp, placement, dispatch, tbo, rc_layers,
                                 off_act, off_w, n_micro, model, dev, tiers, tiles, work, n_buckets, analytic_step,
                                 tokens, mfu, out)
    return out


@jit
def simulate_group(members, buf, tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep,
                   etp, placement, dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work,
                   n_buckets, analytic_step, tokens, mfu, out):
    """Simulate the rows ``members`` of one graph structure (``graph_key``) into ``out``.

    The graph is built once, from the first member, with the recipe of its durations,
    and the order the engine resolves its tasks in is found once
    (``kernels.engine.replay_program``). The members then go ``REPLAY_SETS`` at a time,
    one column each of a tasks x sets array: their durations from the recipe
    (``kernels.pipeline.recipe_durations_sets``), their times (``kernels.engine.replay``)
    and their metrics (``timing_metrics``; stage 0's in-flight peak depends on the
    order alone), every inner loop over the sets. PipeDream's groups run row by row
    (``run_graph``: its steady-state span). Returns ``buf``, the replay's scratch,
    grown where this group needs more (the caller keeps it for the next group)."""
    first = members[0]
    graph, recipe = row_graph_recipe(tp[first], pp[first], dp[first], cp[first], vpp[first], mb[first],
                                     recompute[first], sp[first], tp_overlap[first], zero[first], optimizer[first],
                                     schedule[first], ep[first], etp[first], placement[first], dispatch[first],
                                     tbo[first], rc_layers[first], off_act[first], off_w[first], n_micro[first],
                                     model[0], dev[0], tiers, tiles, work[0], n_buckets)
    rec, links = recipe
    v = vpp[first] if schedule[first] == SCHEDULE_INTERLEAVED else 1
    n_tiers = tiers.shape[0]
    plan, scratch, start, end = prepared(graph)
    if members.shape[0] == 1:
        row = out[first]
        _finish_row(run_graph(graph, graph[0], plan, scratch, start, end, pp[first], v, schedule[first], n_tiers, row),
                    first, analytic_step, tokens, mfu, row)
        return buf
    split = split_backward(schedule[first])
    if schedule[first] == SCHEDULE_PIPEDREAM:  # its steady-state span is measured row by row
        dur = np.empty(graph[0].shape[0], dtype=np.int64)
        for t in range(members.shape[0]):
            i = members[t]
            row = out[i]
            inputs = row_inputs(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i], zero[i],
                                optimizer[i], schedule[i], ep[i], etp[i], placement[i], dispatch[i], tbo[i],
                                rc_layers[i], off_act[i], off_w[i], model[0], dev[0], tiers, tiles, work[0])
            if recipe_durations(rec, links, split, inputs[0], inputs[1], inputs[2], inputs[4], inputs[8], inputs[9],
                                inputs[10], inputs[11], inputs[12], dur):
                status_i = run_graph(graph, dur, plan, scratch, start, end, pp[i], v, schedule[i], n_tiers, row)
            else:
                status_i = simulate_one(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i],
                                        zero[i], optimizer[i], schedule[i], ep[i], etp[i], placement[i], dispatch[i],
                                        tbo[i], rc_layers[i], off_act[i], off_w[i], n_micro[i], model[0], dev[0],
                                        tiers, tiles, work[0], n_buckets, row)
            _finish_row(status_i, i, analytic_step, tokens, mfu, row)
        return buf
    status, seq, pred_ptr, pred_idx = replay_program(graph[6], graph[7], graph[8], plan, scratch)
    _, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = graph
    in_flight = stage0_in_flight(kind, micro, chunk, order_ptr, order_idx) / v
    n_task = graph[0].shape[0]
    n_sets = min(REPLAY_SETS, members.shape[0], max(1, REPLAY_CELLS // n_task))
    cells = n_sets * n_task
    if buf.shape[0] < 2 * cells:
        buf = np.empty(2 * cells, dtype=np.int64)
    dur_sets = buf[:cells].reshape((n_task, n_sets))
    end_sets = buf[cells:2 * cells].reshape((n_task, n_sets))
    p = pp[first]
    fwd = np.zeros((n_sets, p, v), dtype=np.int64)
    bwd = np.zeros((n_sets, p, v), dtype=np.int64)
    wgrad = np.zeros((n_sets, p, v), dtype=np.int64)
    scalars = np.zeros((n_sets, N_RECIPE_SCALARS), dtype=np.int64)
    metrics = np.empty((n_sets, N_SIM), dtype=np.float64)
    rows = np.empty(n_sets, dtype=np.int64)
    for t0 in range(0, members.shape[0], n_sets):
        used = min(n_sets, members.shape[0] - t0)
        for c in range(used):
            i = members[t0 + c]
            rows[c] = i
            fwd[c], bwd[c], wgrad[c], _, send_ns, _, _, _, dp_grad_ns, dp_param_ns, z3g, z3s, opt_ns = \
                row_inputs(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i], zero[i],
                           optimizer[i], schedule[i], ep[i], etp[i], placement[i], dispatch[i], tbo[i], rc_layers[i],
                           off_act[i], off_w[i], model[0], dev[0], tiers, tiles, work[0])
            scalars[c, R_DP_PARAM - R_DP_PARAM] = dp_param_ns
            scalars[c, R_DP_GRAD - R_DP_PARAM] = dp_grad_ns
            scalars[c, R_Z3_GATHER - R_DP_PARAM] = z3g
            scalars[c, R_Z3_SCATTER - R_DP_PARAM] = z3s
            scalars[c, R_SEND - R_DP_PARAM] = send_ns
            scalars[c, R_OPTIMIZER - R_DP_PARAM] = opt_ns
        if status == OK and recipe_durations_sets(rec, links, split, fwd, bwd, wgrad, scalars, dur_sets):
            replay(dur_sets, seq, pred_ptr, pred_idx, plan[3], plan[4], end_sets)
            timing_metrics(dur_sets, kind, order_ptr, order_idx, end_sets, p, n_tiers, used, metrics)
            for c in range(used):
                row = out[rows[c]]
                row[:] = metrics[c]
                row[S_INFLIGHT] = in_flight
                row[S_TASKS] = n_task
                _finish_row(OK, rows[c], analytic_step, tokens, mfu, row)
            continue
        for c in range(used):  # deadlocked, or a task without recipe (MoE rows have keys of their own)
            i = rows[c]
            row = out[i]
            if status == OK:
                status_i = simulate_one(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i],
                                        zero[i], optimizer[i], schedule[i], ep[i], etp[i], placement[i], dispatch[i],
                                        tbo[i], rc_layers[i], off_act[i], off_w[i], n_micro[i], model[0], dev[0],
                                        tiers, tiles, work[0], n_buckets, row)
            else:
                status_i = status
            _finish_row(status_i, i, analytic_step, tokens, mfu, row)
    return buf


@jit(inline=True)
def _finish_row(status: int, i: int, analytic_step, tokens, mfu, row) -> None:
    """A simulated row: its analytic tokens/s and MFU rescaled to the simulated step,
    or ``simulated`` -1 where its schedule deadlocked (a bug the caller must report)."""
    if status == OK:
        scale = analytic_step[i] / row[S_STEP]
        tokens[i] *= scale
        mfu[i] *= scale
    else:
        row[S_SIMULATED] = -1.0

