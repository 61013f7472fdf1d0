"""Analytic tier for transformer training, the row driver: step time and memory per device.

For each candidate row, ``row_costs`` assembles the latencies one candidate is
built from out of the concept kernels: a layer's attention
(``kernels.attention``), dense MLP (``kernels.mlp``) or MoE layer
(``kernels.moe_layer``), the TP / CP / pipeline / DP communication around them
(``kernels.parallel_comm``), recompute (``kernels.recompute``), host offload
(``kernels.offload``), the optimizer step (``kernels.optimizer``), the
embedding, LM head and MTP modules of the end stages (here). ``evaluate_one``
turns them into per-stage passes (``kernels.stage_pass``), the pipeline time of
the schedule from its closed form generalised to unequal stages
(``kernels.schedules``), exposed pipeline and data-parallel communication, and
memory per device (``kernels.memory``: Korthikanti et al. 2022 activations;
Megatron distributed-optimizer bytes per parameter). modeling.md sections 5-7.

The names the concept modules define stay importable from here (``__all__``).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from paraspace.kernels.codes import FEASIBLE_OK, FEASIBLE_OUT_OF_HOST_MEMORY, FEASIBLE_OUT_OF_MEMORY
from paraspace.kernels.attention import attention_gemm_s, attention_s
from paraspace.kernels.cost_vector import (
    C_CP_B, C_CP_F, C_DISPATCH, C_DP_GRAD, C_DP_PARAM, C_EEFF, C_EMB_B, C_EMB_COMM, C_EMB_F, C_EP_B, C_EP_COMB,
    C_EP_DISP, C_EP_F, C_EROWS, C_EXPERT_B, C_EXPERT_F, C_EXPERT_W, C_HEAD_B, C_HEAD_COMM, C_HEAD_F, C_HEAD_WGRAD,
    C_LAYER_BWD, C_LAYER_FWD, C_LAYER_WGRAD, C_LOGITS, C_MOE_BUFFER, C_MOE_BWD, C_MOE_FWD, C_MOE_WGRAD, C_MTP_B,
    C_MTP_F, C_MTP_W, C_OFF_DB, C_OFF_DF, C_OFF_MB, C_OFF_MF, C_OPT, C_P2P, C_PARAMS_MAX, C_RC_COMM, C_RC_COMPUTE,
    C_RC_EP, C_RC_MOE, C_TP_LAYER, C_WOFF_DB, C_WOFF_DF, C_WOFF_MB, C_WOFF_MF, N_COST,
)
from paraspace.kernels.gemm_passes import gemm_passes_s
from paraspace.kernels.jit import jit
from paraspace.kernels.memory import (
    RC_REPLICATED, RC_ROUTED_H, RC_SCORES, activation_bytes_per_layer, comm_groups, device_memory,
    fixed_overhead_bytes, layer_input_bytes, moe_activation_bytes_per_layer,
)
from paraspace.kernels.mlp import dense_mlp_s, gemm_cast_s
from paraspace.kernels.moe_layer import moe_layer_s
from paraspace.kernels.offload import host_exposed_s, offload_costs
from paraspace.kernels.ops import memory_bound_s
from paraspace.kernels.optimizer import (
    ADAM_BYTES_PER_PARAM, CPU_ADAM_HOST_BYTES, CPU_ADAM_LINK_BYTES, OPT_DEVICE_STEP_BYTES, OPT_HOST_STATE_FRACTION,
    OPT_HOST_STEP_BYTES, OPT_LINK_BYTES, OPT_STATE_FRACTION, optimizer_step_s,
)
from paraspace.kernels.parallel_comm import (
    TP_OVERLAP_CHUNKS, cp_ring_s, dp_sync_s, embedding_head_comm_s, ep_strides, exposed_dp_s, overlapped_s, p2p_s,
    tp_layer_comm_s,
)
from paraspace.kernels.parameters import (
    attention_weights, chunk_dense_layers, chunk_layers, device_dense_layers, device_layers, largest_stage_params,
    layer_params, layer_vectors, mlp_matrices, model_flop_per_sequence, model_params, moe_layer_params, mtp_params,
    param_parts, stage_params, stage_params_from,
)
from paraspace.kernels.recompute import recompute_s, recomputed_layers
from paraspace.kernels.schedules import in_flight_chunks, pipeline_s, pp_comm_s
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
    "C_TP_LAYER", "C_WOFF_DB", "C_WOFF_DF", "C_WOFF_MB", "C_WOFF_MF",
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
def end_stage_costs(costs, sh, layer_fwd: float, layer_bwd: float, tp_layer: float, att, mlp, moe, model, dev,
                    tiers, tiles) -> None:
    """Fill the end stages' slots of ``costs``: the embedding (first stage), the
    output head + loss with their TP traffic, the logits, and the
    multi-token-prediction modules (last stage: per depth one more layer, a
    2h -> h projection and the output head again)."""
    h = sh.h
    ab = sh.ab
    tokens = sh.tokens
    t = sh.t
    hf, hb, hw = gemm_passes_s(tokens, model.vocab / t, h, dev, tiles, ab)
    mtp_f = 0.0
    mtp_b = 0.0
    mtp_w = 0.0
    if model.mtp_depth > 0:
        pf, pb, pw = gemm_passes_s(tokens, h / t, 2.0 * h, dev, tiles, ab)
        if model.experts > 0:
            lf = moe.fwd + moe.ep_f
            lb = moe.bwd + moe.ep_b
            lw = moe.wgrad
        else:
            lf = layer_fwd
            lb = layer_bwd
            lw = att.qkv_w + att.out_w + mlp.up_w + mlp.down_w
        mtp_f = model.mtp_depth * (lf + tp_layer + pf + hf)
        mtp_b = model.mtp_depth * (lb + tp_layer + pb + hb)
        mtp_w = model.mtp_depth * (lw + pw + hw)
    emb_comm, head_comm = embedding_head_comm_s(sh, tiers)
    logits = tokens * model.vocab / t
    costs[C_EMB_F] = memory_bound_s(2.0 * tokens * h * ab, 1.0, dev)
    costs[C_EMB_B] = memory_bound_s(3.0 * tokens * h * ab, 1.0, dev)
    costs[C_EMB_COMM] = emb_comm
    costs[C_HEAD_F] = hf + memory_bound_s(2.0 * sh.norm_tokens * h * ab + 12.0 * logits, 4.0, dev)
    costs[C_HEAD_B] = hb + memory_bound_s(2.0 * sh.norm_tokens * h * ab + 8.0 * logits, 3.0, dev)
    costs[C_HEAD_COMM] = head_comm
    costs[C_HEAD_WGRAD] = hw
    costs[C_LOGITS] = logits
    costs[C_MTP_F] = mtp_f
    costs[C_MTP_B] = mtp_b
    costs[C_MTP_W] = mtp_w


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

    Shared by the analytic tier (``evaluate_one``) and the event tier
    (``kernels.event_tier``), so both rank the same operator and collective costs."""
    sh = shape_of(tp, pp, dp, cp, mb, ep, etp, sp_flag, model, dev, work)
    att = attention_s(sh, model, dev, tiles, work)
    mlp = dense_mlp_s(sh, model, dev, tiles)
    layer_fwd = att.part_f + mlp.up_f + mlp.down_f + mlp.act
    layer_bwd = att.part_b + mlp.up_b + mlp.down_b + 2.0 * mlp.act
    if work.gemm_cast_bytes > 0:  # 8-bit GEMMs: cast inputs and weights forward, output gradients backward
        cast_f, cast_b = gemm_cast_s(sh, model, att, dev, work)
        layer_fwd += cast_f
        layer_bwd += cast_b
    tp_layer = tp_layer_comm_s(sh, tp_overlap, att.qkv_f, att.out_f, mlp.up_f, mlp.down_f, tiers)
    cp_f, cp_b = cp_ring_s(sh, model, att.rope_width, att.core_f, att.core_b, tiers)
    rc_compute, rc_comm = recompute_s(recompute, sh, layer_fwd, tp_layer, cp_f, att.core_f, dev)
    ep_stride, _, _ = ep_strides(sh.t, sh.c, sh.d, sh.e, sh.et, placement)
    moe = moe_layer_s(sh, att, ep_stride, recompute, rc_compute, dispatch, tbo, schedule, model, dev, tiers, tiles,
                      work)
    end_stage_costs(costs, sh, layer_fwd, layer_bwd, tp_layer, att, mlp, moe, model, dev, tiers, tiles)
    costs[C_P2P] = p2p_s(sh, tiers)
    step_sync_costs(costs, sh, zero, optimizer, schedule, placement, model, dev, tiers, work)
    moe_dense, moe_expert = moe_layer_params(model, sh.t, sh.e, sh.et)
    offload_costs(costs, sh, recompute, off_act, off_w, layer_params(model, sh.t), moe_dense + moe_expert, layer_fwd,
                  layer_bwd, moe.fwd, moe.bwd, model, dev, work)
    costs[C_LAYER_FWD] = layer_fwd
    costs[C_LAYER_BWD] = layer_bwd
    costs[C_TP_LAYER] = tp_layer
    costs[C_CP_F] = cp_f
    costs[C_CP_B] = cp_b
    costs[C_RC_COMPUTE] = rc_compute
    costs[C_RC_COMM] = rc_comm
    costs[C_RC_MOE] = moe.rc
    costs[C_RC_EP] = moe.rc_ep
    costs[C_LAYER_WGRAD] = att.qkv_w + att.out_w + mlp.up_w + mlp.down_w
    costs[C_MOE_FWD] = moe.fwd
    costs[C_MOE_BWD] = moe.bwd
    costs[C_MOE_WGRAD] = moe.wgrad
    costs[C_EP_F] = moe.ep_f
    costs[C_EP_B] = moe.ep_b
    costs[C_MOE_BUFFER] = moe.buffers
    costs[C_DISPATCH] = moe.one_dispatch
    costs[C_EROWS] = moe.rows
    costs[C_EEFF] = moe.efficiency
    costs[C_EP_DISP] = moe.disp
    costs[C_EP_COMB] = moe.comb
    costs[C_EXPERT_F] = moe.experts_f
    costs[C_EXPERT_B] = moe.experts_b
    costs[C_EXPERT_W] = moe.experts_w


@jit
def evaluate_one(tp, pp, dp, cp, vpp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp,
                 placement, dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, out):
    """Fill ``out`` (length N_OUT) for one candidate."""
    costs = np.empty(N_COST, dtype=np.float64)
    row_costs(tp, pp, dp, cp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
              dispatch, tbo, off_act, off_w, model, dev, tiers, tiles, work, costs)
    sh = shape_of(tp, pp, dp, cp, mb, ep, etp, sp_flag, model, dev, work)
    v = float(vpp)
    m = float(n_micro)

    # ---- per device: forward and backward of one micro-batch; the pipeline (closed form over unequal stages)
    bn = bottleneck_s(pp, model, costs, recompute, rc_layers)
    pipe, t_steady = pipeline_s(schedule, pp, v, m, bn, model, costs, recompute, rc_layers)
    pp_comm = pp_comm_s(schedule, sh.p, v, costs[C_P2P])
    # ---- data parallel (gradients over the DP x CP group, stride tp; experts over expert DP)
    _, edp, _ = ep_strides(sh.t, sh.c, sh.d, sh.e, sh.et, placement)
    dp_comm = exposed_dp_s(zero, sh.d * sh.c, edp, m, bn.t_max, bn.fwd, bn.bwd, costs[C_DP_GRAD], costs[C_DP_PARAM])
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
    flop = 3.0 * work.global_batch * model_flop_per_sequence(model, sh.s)
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


@jit(parallel=True)
def evaluate_rows(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
                  dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work):
    """Evaluate every row; returns an (n_rows, N_OUT) float64 array in OUTPUTS order."""
    n = tp.shape[0]
    out = np.empty((n, N_OUT), dtype=np.float64)
    for i in prange(n):
        # records are indexed inside the loop: numba's parfor lowering cannot
        # pass a record hoisted out of it (llvm type mismatch, numba 0.68)
        evaluate_one(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i], zero[i],
                     optimizer[i], schedule[i], ep[i], etp[i], placement[i], dispatch[i], tbo[i], rc_layers[i],
                     off_act[i], off_w[i], n_micro[i], model[0], dev[0], tiers, tiles, work[0], out[i])
    return out
