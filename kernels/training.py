"""Analytic tier for transformer training, the row driver: step time and memory per device.

For each candidate row, ``row_costs`` assembles the latencies one candidate is
built from out of the concept kernels: one layer's operators, communication,
recompute, host offload and the end stages' modules (``kernels.layer_costs``:
attention, dense MLP or MoE layer, TP / CP / EP traffic), one pipeline
message, and the step's data-parallel sync and optimizer step
(``step_sync_costs``, here). ``evaluate_one`` turns them into per-stage passes
(``kernels.stage_pass``), the pipeline time of the schedule from its closed
form generalised to unequal stages (``kernels.schedules``), exposed pipeline
and data-parallel communication, and memory per device (``kernels.memory``:
Korthikanti et al. 2022 activations; Megatron distributed-optimizer bytes per
parameter). modeling.md sections 5-7.

``evaluate_rows`` gives every row what ``evaluate_one`` gives it, bit for bit,
but computes the layer costs once per distinct ``layer_key`` and the step's
sync once per distinct ``step_key`` (``kernels.row_groups``): a space of a few
hundred thousand candidates has a few hundred of each, and what is left per
row is the stages, the schedule and the memory.

The names the concept modules define stay importable from here (``__all__``).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from paraspace.kernels.codes import FEASIBLE_OK, FEASIBLE_OUT_OF_HOST_MEMORY, FEASIBLE_OUT_OF_MEMORY, SCHEDULE_DUALPIPE
from paraspace.kernels.attention import attention_gemm_s
from paraspace.kernels.cost_vector import (
    C_CP_B, C_CP_F, C_DISPATCH, C_DP_GRAD, C_DP_PARAM, C_EEFF, C_EMB_B, C_EMB_COMM, C_EMB_F, C_EP_B, C_EP_COMB,
    C_EP_DISP, C_EP_F, C_EROWS, C_EXPERT_B, C_EXPERT_F, C_EXPERT_W, C_HEAD_B, C_HEAD_COMM, C_HEAD_F, C_HEAD_WGRAD,
    C_LAYER_BWD, C_LAYER_FWD, C_LAYER_WGRAD, C_LOGITS, C_MOE_BUFFER, C_MOE_BWD, C_MOE_FWD, C_MOE_WGRAD, C_MTP_B,
    C_MTP_F, C_MTP_W, C_OFF_DB, C_OFF_DF, C_OFF_MB, C_OFF_MF, C_OPT, C_P2P, C_PARAMS_MAX, C_RC_COMM, C_RC_COMPUTE,
    C_RC_EP, C_RC_MOE, C_TP_LAYER, C_TP_LAYER_B, C_WOFF_DB, C_WOFF_DF, C_WOFF_MB, C_WOFF_MF, N_COST,
)
from paraspace.kernels.gemm_passes import gemm_passes_s
from paraspace.kernels.jit import jit
from paraspace.kernels.layer_costs import end_stage_costs, layer_cost_table, layer_costs, layer_keys
from paraspace.kernels.memory import (
    RC_REPLICATED, RC_ROUTED_H, RC_SCORES, activation_bytes_per_layer, comm_groups, device_memory,
    fixed_overhead_bytes, layer_input_bytes, moe_activation_bytes_per_layer,
)
from paraspace.kernels.offload import host_exposed_s
from paraspace.kernels.optimizer import (
    ADAM_BYTES_PER_PARAM, CPU_ADAM_HOST_BYTES, CPU_ADAM_LINK_BYTES, OPT_DEVICE_STEP_BYTES, OPT_HOST_STATE_FRACTION,
    OPT_HOST_STEP_BYTES, OPT_LINK_BYTES, OPT_STATE_FRACTION, optimizer_step_s,
)
from paraspace.kernels.parallel_comm import (
    TP_OVERLAP_CHUNKS, dp_sync_s, ep_strides, exposed_dp_s, overlapped_s, p2p_s,
)
from paraspace.kernels.parameters import (
    attention_weights, chunk_dense_layers, chunk_layers, device_dense_layers, device_layers, largest_stage_params,
    layer_params, layer_vectors, mlp_matrices, model_flop_per_sequence, model_params, moe_layer_params, mtp_params,
    param_parts, stage_params, stage_params_from,
)
from paraspace.kernels.recompute import recomputed_layers
from paraspace.kernels.row_groups import group_rows
from paraspace.kernels.schedules import busy_s, in_flight_chunks, pipeline_s, pp_comm_s
from paraspace.kernels.shape import Knobs, shape_of
from paraspace.kernels.stage_pass import bottleneck_s, layers_pass_s, stage_pass_s

__all__ = [
    "OUTPUTS", "N_OUT", "N_COST", "evaluate_rows", "evaluate_one", "row_costs", "end_stage_costs", "step_sync_costs",
    # re-exported from the concept modules
    "ADAM_BYTES_PER_PARAM", "CPU_ADAM_HOST_BYTES", "CPU_ADAM_LINK_BYTES", "OPT_DEVICE_STEP_BYTES",
    "OPT_HOST_STATE_FRACTION", "OPT_HOST_STEP_BYTES", "OPT_LINK_BYTES", "OPT_STATE_FRACTION", "optimizer_step_s",
    "TP_OVERLAP_CHUNKS", "overlapped_s", "ep_strides", "attention_gemm_s", "gemm_passes_s",
    "RC_REPLICATED", "RC_ROUTED_H", "RC_SCORES", "activation_bytes_per_layer", "moe_activation_bytes_per_layer",
    "comm_groups", "fixed_overhead_bytes", "layer_input_bytes", "host_exposed_s", "recomputed_layers",
    "in_flight_chunks", "attention_weights", "chunk_dense_layers", "chunk_layers", "device_dense_layers",
    "device_layers", "layer_params", "layer_vectors", "mlp_matrices", "model_flop_per_sequence", "model_params",
    "moe_layer_params", "mtp_params", "param_parts", "stage_params", "stage_params_from", "layers_pass_s",
    "stage_pass_s",
    "C_CP_B", "C_CP_F", "C_DISPATCH", "C_DP_GRAD", "C_DP_PARAM", "C_EEFF", "C_EMB_B", "C_EMB_COMM", "C_EMB_F",
    "C_EP_B", "C_EP_COMB", "C_EP_DISP", "C_EP_F", "C_EROWS", "C_EXPERT_B", "C_EXPERT_F", "C_EXPERT_W", "C_HEAD_B",
    "C_HEAD_COMM", "C_HEAD_F", "C_HEAD_WGRAD", "C_LAYER_BWD", "C_LAYER_FWD", "C_LAYER_WGRAD", "C_LOGITS",
    "C_MOE_BUFFER", "C_MOE_BWD", "C_MOE_FWD", "C_MOE_WGRAD", "C_MTP_B", "C_MTP_F", "C_MTP_W", "C_OFF_DB", "C_OFF_DF",
    "C_OFF_MB", "C_OFF_MF", "C_OPT", "C_P2P", "C_PARAMS_MAX", "C_RC_COMM", "C_RC_COMPUTE", "C_RC_EP", "C_RC_MOE",
    "C_TP_LAYER", "C_TP_LAYER_B", "C_WOFF_DB", "C_WOFF_DF", "C_WOFF_MB", "C_WOFF_MF",
]

#: Output columns of ``evaluate_rows``, in column order. The Parquet schema in
#: ``results.schema`` gives each its unit and meaning (pinned by a test).
OUTPUTS = (
    "step_time_analytic_s",
    "compute_s",
    "tp_comm_s",
    "cp_comm_s",
    "pp_comm_s",
    "dp_comm_s",
    "ep_comm_s",
    "moe_dispatch_s",
    "expert_gemm_rows",
    "expert_gemm_efficiency",
    "bubble_s",
    "dualpipe_credit_s",
    "optimizer_s",
    "recompute_s",
    "offload_s",
    "stage_fwd_s",
    "stage_bwd_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "model_flop_per_step",
    "mem_weights_bytes",
    "mem_grads_bytes",
    "mem_optimizer_bytes",
    "mem_activations_bytes",
    "mem_moe_buffers_bytes",
    "mem_host_bytes",
    "mem_overhead_bytes",
    "mem_peak_bytes",
    "mem_peak_stage",
    "feasible",
    "infeasible_reason",
)
N_OUT = len(OUTPUTS)
(
    O_STEP, O_COMPUTE, O_TP, O_CP, O_PP, O_DP, O_EP, O_DISPATCH, O_EROWS, O_EEFF, O_BUBBLE, O_CREDIT, O_OPT, O_RECOMPUTE,
    O_OFFLOAD,
    O_FWD, O_BWD, O_TOKENS, O_MFU, O_FLOP, O_MW, O_MG, O_MO, O_MA, O_MMOE, O_MHOST, O_MOV, O_MPEAK, O_MSTAGE, O_FEAS,
    O_REASON,
) = range(N_OUT)


@jit(inline=True)
def step_sync_costs(costs, sh, zero: int, optimizer: int, schedule: int, placement: int, model, dev, tiers,
                    work) -> None:
    """Fill the once-per-step slots of ``costs``: the device with the most
    parameters (count), its whole gradient reduction and parameter gather
    (ZeRO-3: one pass's, layer by layer) and its optimizer step on its shard."""
    pp = int(sh.p)
    t = sh.t
    parts = param_parts(model, t, sh.e, sh.et)
    params_max, dense_max, expert_max, pass_dense = largest_stage_params(pp, schedule, parts, model)
    layers_max = device_layers(0, pp, model.layers)  # the first stages hold the most layers
    moe_dense, moe_expert = moe_layer_params(model, t, sh.e, sh.et)
    layer_dense = layer_params(model, t)
    layer_expert = 0.0
    if model.experts > 0 and model.dense_layers < model.layers:
        layer_dense = moe_dense
        layer_expert = moe_expert
    grad, param = dp_sync_s(zero, sh, placement, layers_max, layer_dense, layer_expert, pass_dense, dense_max,
                            expert_max, tiers, work)
    _, edp, _ = ep_strides(t, sh.c, sh.d, sh.e, sh.et, placement)
    opt_shard = dense_max / (sh.d * sh.c) + expert_max / edp if zero >= 1 else params_max
    costs[C_DP_GRAD] = grad
    costs[C_DP_PARAM] = param
    costs[C_OPT] = optimizer_step_s(optimizer, opt_shard, dev)
    costs[C_PARAMS_MAX] = params_max


@jit
def row_costs(tp, pp, dp, cp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
              dispatch, tbo, off_act, off_w, model, dev, tiers, tiles, work, costs):
    """Fill ``costs`` (length N_COST, seconds; ``kernels.cost_vector``) with the latencies one candidate is built from.

    Shared by the analytic tier (``evaluate_one``; ``evaluate_rows`` computes the
    ``layer_costs`` and ``step_sync_costs`` once per distinct key and copies them)
    and the event tier (``kernels.event_tier``), so both rank the same operator
    and collective costs."""
    sh = shape_of(tp, pp, dp, cp, mb, ep, etp, sp_flag, model, dev, work)
    layer_costs(costs, sh, recompute, tp_overlap, schedule, placement, dispatch, tbo, off_act, off_w, model, dev, tiers,
                tiles, work)
    costs[C_P2P] = p2p_s(sh, tiers)
    step_sync_costs(costs, sh, zero, optimizer, schedule, placement, model, dev, tiers, work)


@jit
def step_flop(model, work) -> float:
    """Model FLOP of one step: forward and backward (3x) of the global batch."""
    return 3.0 * work.global_batch * model_flop_per_sequence(model, work.seq_len)


@jit(inline=True)
def row_outputs(costs, tp, pp, dp, cp, vpp, mb, recompute, sp_flag, zero, optimizer, schedule, ep, etp, placement,
                rc_layers, off_act, off_w, n_micro, flop: float, model, dev, work, out) -> None:
    """Fill ``out`` (length N_OUT) for one candidate from its ``costs`` and the
    model FLOP of a step (``step_flop``): the stages' passes, the schedule's
    pipeline time, exposed communication, memory."""
    sh = shape_of(tp, pp, dp, cp, mb, ep, etp, sp_flag, model, dev, work)
    v = float(vpp)
    m = float(n_micro)

    # ---- per device: forward and backward of one micro-batch; the pipeline (closed form over unequal stages)
    bn = bottleneck_s(pp, model, costs, recompute, rc_layers)
    pipe, t_steady = pipeline_s(schedule, pp, v, m, bn, model, costs, recompute, rc_layers)
    pp_comm = pp_comm_s(schedule, sh.p, v, costs[C_P2P])
    # ---- data parallel (gradients over the DP x CP group, stride tp; experts over expert DP)
    _, edp, _ = ep_strides(sh.t, sh.c, sh.d, sh.e, sh.et, placement)
    dp_comm = exposed_dp_s(zero, sh.d * sh.c, edp, m, busy_s(schedule, pp, m, bn), bn.fwd, bn.bwd, costs[C_DP_GRAD],
                           costs[C_DP_PARAM])
    optimizer_s = costs[C_OPT]

    step = pipe + pp_comm + dp_comm + optimizer_s
    out[O_STEP] = step
    out[O_COMPUTE] = m * bn.compute
    out[O_TP] = m * bn.tp
    out[O_CP] = m * bn.cp
    out[O_EP] = m * bn.ep
    out[O_DISPATCH] = costs[C_DISPATCH]
    out[O_EROWS] = costs[C_EROWS]
    out[O_EEFF] = costs[C_EEFF]
    out[O_PP] = pp_comm
    out[O_DP] = dp_comm
    out[O_BUBBLE] = pipe - m * t_steady
    # the per-stage parts above count m passes of the slowest stage; a DualPipe device runs
    # two stages, m / 2 passes each, so its steady work is m * t_steady <= m * t_max
    out[O_CREDIT] = m * (t_steady - bn.t_max)
    out[O_OPT] = optimizer_s
    out[O_RECOMPUTE] = m * bn.rc
    out[O_OFFLOAD] = m * bn.off
    out[O_FWD] = bn.fwd
    out[O_BWD] = bn.bwd
    devices = sh.t * sh.p * sh.d * sh.c  # the row's cluster (a space may sweep several sizes)
    out[O_TOKENS] = work.global_batch * sh.s / (step * devices)
    out[O_FLOP] = flop
    out[O_MFU] = flop / (step * devices * dev.peak_flops_per_s)

    # ---- memory per device; the peak over stages
    kn = Knobs(recompute, zero, optimizer, schedule, float(rc_layers), off_act, off_w, v, m)
    mem = device_memory(sh, kn, edp, costs[C_LOGITS], costs[C_MOE_BUFFER], model, dev, work)
    out[O_MOV] = mem.overhead
    out[O_MW] = mem.weights
    out[O_MG] = mem.grads
    out[O_MO] = mem.optim
    out[O_MA] = mem.acts
    out[O_MMOE] = mem.buffers
    out[O_MHOST] = mem.host
    out[O_MSTAGE] = mem.stage
    out[O_MPEAK] = mem.peak
    host_fits = mem.host_peak <= dev.host_capacity_bytes  # every device's host share must fit
    fits = mem.peak <= dev.hbm_capacity_bytes and host_fits
    out[O_FEAS] = 1.0 if fits else 0.0
    out[O_REASON] = FEASIBLE_OK if fits else (FEASIBLE_OUT_OF_MEMORY if mem.peak > dev.hbm_capacity_bytes
                                              else FEASIBLE_OUT_OF_HOST_MEMORY)


@jit
def evaluate_one(tp, pp, dp, cp, vpp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp,
                 placement, dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, out):
    """Fill ``out`` (length N_OUT) for one candidate."""
    costs = np.empty(N_COST, dtype=np.float64)
    row_costs(tp, pp, dp, cp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
              dispatch, tbo, off_act, off_w, model, dev, tiers, tiles, work, costs)
    row_outputs(costs, tp, pp, dp, cp, vpp, mb, recompute, sp_flag, zero, optimizer, schedule, ep, etp, placement,
                rc_layers, off_act, off_w, n_micro, step_flop(model, work), model, dev, work, out)


#: columns of a ``step_key``
N_STEP_KEY = 10


@jit(inline=True)
def step_key(tp, pp, dp, cp, zero, optimizer, schedule, ep, etp, placement):
    """A row's step key (N_STEP_KEY integers): the values ``step_sync_costs``
    reads (the schedule only as DualPipe or not: ``largest_stage_params``)."""
    return (np.int32(tp), np.int32(pp), np.int32(dp), np.int32(cp), np.int32(zero), np.int32(optimizer),
            np.int32(1 if schedule == SCHEDULE_DUALPIPE else 0), np.int32(ep), np.int32(etp), np.int32(placement))


@jit
def step_keys(tp, pp, dp, cp, zero, optimizer, schedule, ep, etp, placement):
    """(rows, N_STEP_KEY) int32 array: each row's ``step_key``."""
    n = tp.shape[0]
    keys = np.empty((n, N_STEP_KEY), dtype=np.int32)
    for i in prange(n):
        key = step_key(tp[i], pp[i], dp[i], cp[i], zero[i], optimizer[i], schedule[i], ep[i], etp[i], placement[i])
        for j in range(N_STEP_KEY):
            keys[i, j] = key[j]
    return keys


@jit
def step_sync_table(first, tp, pp, dp, cp, mb, sp, zero, optimizer, schedule, ep, etp, placement, model, dev, tiers,
                    work):
    """(groups, N_COST) array: ``step_sync_costs`` of each group's first row (the other slots 0)."""
    n_groups = first.shape[0]
    table = np.zeros((n_groups, N_COST), dtype=np.float64)
    for g in prange(n_groups):
        i = first[g]
        sh = shape_of(tp[i], pp[i], dp[i], cp[i], mb[i], ep[i], etp[i], sp[i], model[0], dev[0], work[0])
        step_sync_costs(table[g], sh, zero[i], optimizer[i], schedule[i], placement[i], model[0], dev[0], tiers,
                        work[0])
    return table


#: rows a thread evaluates at a time, into its own block of output rows
BLOCK_ROWS = 256


@jit(parallel=True)
def grouped_rows(out, layer_group, layer_table, step_group, step_table, tp, pp, dp, cp, vpp, mb, recompute, sp, zero,
                 optimizer, schedule, ep, etp, placement, rc_layers, off_act, off_w, n_micro, model, dev, tiers, work):
    """Fill ``out`` (N_OUT, rows) from each row's layer and step group and the
    groups' ``layer_cost_table`` and ``step_sync_table``: a row's cost vector is
    its layer group's with its step group's slots and its own pipeline message.
    Each thread takes blocks of BLOCK_ROWS rows with its own cost vector and
    output rows; only scalars of the shared arrays are read and written in the
    loop (a view of one counts references to it, from every thread)."""
    n = tp.shape[0]
    flop = step_flop(model[0], work[0])
    for b in prange((n + BLOCK_ROWS - 1) // BLOCK_ROWS):
        start = b * BLOCK_ROWS
        stop = min(n, start + BLOCK_ROWS)
        costs = np.empty(N_COST, dtype=np.float64)
        rows = np.empty((BLOCK_ROWS, N_OUT), dtype=np.float64)
        for i in range(start, stop):
            g = layer_group[i]
            for j in range(N_COST):
                costs[j] = layer_table[g, j]
            s = step_group[i]
            costs[C_DP_GRAD] = step_table[s, C_DP_GRAD]
            costs[C_DP_PARAM] = step_table[s, C_DP_PARAM]
            costs[C_OPT] = step_table[s, C_OPT]
            costs[C_PARAMS_MAX] = step_table[s, C_PARAMS_MAX]
            sh = shape_of(tp[i], pp[i], dp[i], cp[i], mb[i], ep[i], etp[i], sp[i], model[0], dev[0], work[0])
            costs[C_P2P] = p2p_s(sh, tiers)
            row_outputs(costs, tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], zero[i], optimizer[i],
                        schedule[i], ep[i], etp[i], placement[i], rc_layers[i], off_act[i], off_w[i], n_micro[i],
                        flop, model[0], dev[0], work[0], rows[i - start])
        for j in range(N_OUT):  # the block's outputs column by column: N_OUT runs of contiguous writes
            for i in range(start, stop):
                out[j, i] = rows[i - start, j]


def evaluate_rows(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                  dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work) -> np.ndarray:
    """Evaluate every row; returns an (n_rows, N_OUT) float64 array in OUTPUTS
    order, column-major (each output's column contiguous).

    The ``layer_costs`` of each distinct ``layer_key`` and the ``step_sync_costs``
    of each distinct ``step_key`` are computed once (``kernels.row_groups``); the
    result equals ``evaluate_one`` on every row, bit for bit. The kernels are
    called from here, not from a jitted driver: numba segfaults calling a
    parallel kernel from another cached kernel loaded from its cache (numba
    issue 8578). The output is allocated by numpy, which asks for huge pages:
    a million rows' outputs are 250 MB, and faulting them in 4 KiB pages inside
    the kernel took longer than computing them."""
    layer_group, layer_first = group_rows(layer_keys(tp, dp, cp, mb, recompute, sp, tp_overlap, schedule, ep, etp,
                                                     placement, dispatch, tbo, off_act, off_w, model))
    layer_table = layer_cost_table(layer_first, tp, pp, dp, cp, mb, recompute, sp, tp_overlap, schedule, ep, etp,
                                   placement, dispatch, tbo, off_act, off_w, model, dev, tiers, tiles, work)
    step_group, step_first = group_rows(step_keys(tp, pp, dp, cp, zero, optimizer, schedule, ep, etp, placement))
    step_table = step_sync_table(step_first, tp, pp, dp, cp, mb, sp, zero, optimizer, schedule, ep, etp, placement,
                                 model, dev, tiers, work)
    out = np.empty((N_OUT, len(tp)), dtype=np.float64)
    grouped_rows(out, layer_group, layer_table, step_group, step_table, tp, pp, dp, cp, vpp, mb, recompute, sp, zero,
                 optimizer, schedule, ep, etp, placement, rc_layers, off_act, off_w, n_micro, model, dev, tiers, work)
    return out.T
