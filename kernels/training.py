"""Analytic tier for dense transformer training: step time and memory per device.

For each candidate row: per-layer operator latencies (``kernels.ops``) and TP /
CP communication (``kernels.collectives``), per-device forward and backward
time of one micro-batch (embedding on the first stage, LM head and loss on the
last), the pipeline time of the schedule from its closed form generalised to
unequal stages, exposed pipeline and data-parallel communication, the
optimizer step, and memory per device (Korthikanti et al. 2022 activations;
Megatron distributed-optimizer bytes per parameter). modeling.md sections 5-7.

Rank layout: TP innermost, then CP, DP, PP outermost (Megatron's default
order), so TP groups have stride 1, CP stride tp, the DP x CP gradient group
stride tp, and neighbouring pipeline stages are tp*cp*dp devices apart.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.codes import (
    ALL_GATHER,
    ALL_REDUCE,
    FEASIBLE_OK,
    FEASIBLE_OUT_OF_MEMORY,
    OPTIMIZER_CPU_ADAM,
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
    REDUCE_SCATTER,
    SCHEDULE_GPIPE,
    SCHEDULE_INTERLEAVED,
    SCHEDULE_ZB_H1,
    SEND_RECV,
)
from kernels.collectives import collective_time_s
from kernels.jit import jit
from kernels.ops import attention_fwd_bwd_s, gemm_fwd_bwd_s, gemm_time_s, memory_bound_s

#: Output columns of ``evaluate_rows``, in column order. The Parquet schema in
#: ``results.schema`` gives each its unit and meaning (pinned by a test).
OUTPUTS = (
    "step_time_analytic_s",
    "compute_s",
    "tp_comm_s",
    "cp_comm_s",
    "pp_comm_s",
    "dp_comm_s",
    "bubble_s",
    "optimizer_s",
    "recompute_s",
    "stage_fwd_s",
    "stage_bwd_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "model_flop_per_step",
    "mem_weights_bytes",
    "mem_grads_bytes",
    "mem_optimizer_bytes",
    "mem_activations_bytes",
    "mem_overhead_bytes",
    "mem_peak_bytes",
    "mem_peak_stage",
    "feasible",
    "infeasible_reason",
)
N_OUT = len(OUTPUTS)
(
    O_STEP, O_COMPUTE, O_TP, O_CP, O_PP, O_DP, O_BUBBLE, O_OPT, O_RECOMPUTE, O_FWD, O_BWD,
    O_TOKENS, O_MFU, O_FLOP, O_MW, O_MG, O_MO, O_MA, O_MOV, O_MPEAK, O_MSTAGE, O_FEAS, O_REASON,
) = range(N_OUT)

#: Cost components of one candidate (``row_costs``), seconds unless noted:
#: per layer per micro-batch forward/backward compute, one direction of its TP
#: collectives, exposed CP ring time, recompute added to the backward, the
#: embedding and the LM head + loss with their TP traffic, one pipeline
#: message, the device's whole gradient reduction and parameter gather (ZeRO-3:
#: one pass's), the optimizer step, logits per micro-batch (elements), the
#: largest stage's parameters (count), and the weight-gradient GEMMs inside the
#: layer's and the head's backward (the W half that zero-bubble schedules split off).
(
    C_LAYER_FWD, C_LAYER_BWD, C_TP_LAYER, C_CP_F, C_CP_B, C_RC_COMPUTE, C_RC_COMM, C_EMB_F, C_EMB_B, C_EMB_COMM,
    C_HEAD_F, C_HEAD_B, C_HEAD_COMM, C_P2P, C_DP_GRAD, C_DP_PARAM, C_OPT, C_LOGITS, C_PARAMS_MAX,
    C_LAYER_WGRAD, C_HEAD_WGRAD,
) = range(21)
N_COST = 21

#: bytes per parameter touched by one Adam step on its shard: read fp32 master,
#: m, v and gradient (16), write master, m, v (12), write the 16-bit weight (2),
#: one more gradient read for clipping (4)
ADAM_BYTES_PER_PARAM = 34.0
#: per optimizer (index = kernels.codes OPTIMIZER_*): device optimizer-state bytes
#: as a fraction of the workload's fp32 Adam states (8-bit Adam keeps m and v in
#: one byte each beside the fp32 master: 6 of 12), and device bytes per parameter
#: of its step (8-bit: read master 4, m+v 2, grad 4; write master 4, m+v 2,
#: weight 2; clip read 4 = 22). CPU Adam keeps neither on the device.
#: (numpy arrays, which numba freezes as constants indexable at run time)
OPT_STATE_FRACTION = np.array([1.0, 0.5, 0.0])
OPT_DEVICE_STEP_BYTES = np.array([ADAM_BYTES_PER_PARAM, 22.0, 0.0])
#: ZeRO-Offload's CPU Adam: host DRAM bytes per parameter (read and write fp32
#: master, m, v: 24; read the 16-bit gradient, write the 16-bit weight: 4) and
#: PCIe bytes per parameter (16-bit gradient down, 16-bit weight up: 2 + 2)
CPU_ADAM_HOST_BYTES = 28.0
CPU_ADAM_LINK_BYTES = 4.0


@jit
def optimizer_step_s(optimizer: int, shard: float, dev) -> float:
    """One optimizer step over ``shard`` parameters of this device."""
    if optimizer == OPTIMIZER_CPU_ADAM:  # transfers over PCIe, then the host streams the states
        return (CPU_ADAM_LINK_BYTES * shard / dev.host_link_bytes_per_s
                + CPU_ADAM_HOST_BYTES * shard / (dev.host_memory_bytes_per_s * dev.memory_efficiency)
                + dev.launch_s)
    return memory_bound_s(OPT_DEVICE_STEP_BYTES[optimizer] * shard, 1.0, dev)


#: chunks a TP collective is split into when overlapped with its GEMM
TP_OVERLAP_CHUNKS = 4.0


@jit
def overlapped_s(comm: float, compute: float) -> float:
    """Exposed time of a collective chunked into TP_OVERLAP_CHUNKS and pipelined
    with a GEMM: its first chunk cannot hide, the rest hides behind the GEMM."""
    first = comm / TP_OVERLAP_CHUNKS
    return first + max(0.0, comm - first - compute)


@jit
def layer_params(model, t: float) -> float:
    """Parameters of one transformer layer held by one of t tensor-parallel ranks.

    Attention: Q, K, V (GQA: K and V have kv_heads), output projection; MLP:
    3 h f (gated) or 2 h f; sharded by t. Norm weights (2h; 4h with biases)
    are replicated. Biases of column-parallel matrices (QKV, MLP up) are
    sharded; those of row-parallel ones (output projection, MLP down) are
    added after the TP reduction and replicated (Megatron-LM).
    """
    h = model.hidden
    dh = model.head_dim
    q = model.heads * dh
    kv = model.kv_heads * dh
    mats = h * (q + 2.0 * kv) + q * h
    mats += (3.0 if model.glu > 0 else 2.0) * h * model.ffn
    sharded_bias = 0.0
    norms = 2.0 * h
    if model.bias > 0:
        sharded_bias = (q + 2.0 * kv) + (2.0 if model.glu > 0 else 1.0) * model.ffn
        norms = 4.0 * h + 2.0 * h  # norm weights and biases, plus out-proj and down-proj biases
    return (mats + sharded_bias) / t + norms


@jit
def activation_bytes_per_layer(b: float, s: float, t: float, c: float, sp: bool, recompute: int,
                               flash: bool, model, ab: float) -> float:
    """Activation bytes one layer keeps for backward, per micro-batch per device.

    Korthikanti et al. 2022 (section 4.1, eq. 1-2), generalised to GQA and gated
    MLPs and to any element width ab (their coefficients assume ab = 2):
    replicated (split by t only with sequence parallelism): two norm inputs,
    QKV and MLP inputs (ab each per token x h), dropout masks (1 byte, x2);
    split by t: Q, K, V, attention output, MLP intermediates (3f gated: gate
    and up outputs and the down-projection input; 2f for GeLU); the s x s
    softmax output (+ dropout mask and output) unless FlashAttention or
    selective recompute removes it (flash keeps the fp32 log-sum-exp instead).
    Full recompute keeps only the layer input.
    For GPT (ab = 2, f = 4h, dropout, no flash):
    s b h (10 + 24/t + 5 a s / (h t)) without SP, s b h / t (34 + 5 a s / h) with SP.
    """
    tokens = b * s / c
    h = model.hidden
    dh = model.head_dim
    if recompute == RECOMPUTE_FULL:
        full_input = ab * tokens * h
        return full_input / t if sp else full_input
    dropout = model.dropout > 0
    replicated = 4.0 * ab * tokens * h
    if dropout:
        replicated += 2.0 * tokens * h
    if sp:
        replicated /= t
    heads = model.heads / t
    kv = model.kv_heads / t
    split = ab * tokens * dh * (2.0 * heads + 2.0 * kv)
    split += (3.0 if model.glu > 0 else 2.0) * ab * tokens * model.ffn / t
    scores = 0.0
    if flash:
        scores = 4.0 * b * heads * (s / c)
    elif recompute == RECOMPUTE_NONE:
        per_elem = ab + (1.0 + ab if dropout else 0.0)
        scores = per_elem * b * heads * (s / c) * s
    return replicated + split + scores


@jit
def in_flight_chunks(schedule: int, p: float, v: float, m: float, stage: float) -> float:
    """Micro-batch chunks whose activations a device holds at its peak.

    GPipe: all m. 1F1B: p - stage (at most m). ZB-H1: p on every stage (the
    p - stage of 1F1B plus the stage micro-batches whose W it defers; Qi et al.
    2023: ZB-H1's peak memory equals 1F1B's), counting a micro-batch until its W,
    conservatively with all its activations. Interleaved (Megatron-LM's
    warm-up count + 1): 2 (p - stage - 1) + (v - 1) p + 1 chunks of 1/v of the
    device's layers (at most m v), i.e. p (1 + (p-1)/(p v)) stage-equivalents
    on the first stage (Narayanan et al. 2021, section 2.2).
    Returned in chunks; divide by v for stage-equivalents.
    """
    if schedule == SCHEDULE_GPIPE:
        return m
    if schedule == SCHEDULE_INTERLEAVED:
        return min(2.0 * (p - stage - 1.0) + (v - 1.0) * p + 1.0, m * v)
    if schedule == SCHEDULE_ZB_H1:  # stage d also holds the d micro-batches whose W it defers
        return min(p, m)
    return min(p - stage, m)


@jit
def device_layers(stage: int, pp: int, layers: float) -> float:
    """Layers on the device of pipeline stage ``stage``: L // p each, and one more
    on the first L mod p stages (uneven splits; an even split when p divides L)."""
    n = int(layers)
    return float(n // pp + (1 if stage < n % pp else 0))


@jit
def chunk_layers(stage: int, chunk: int, pp: int, v: int, layers: float) -> float:
    """Layers of virtual chunk ``chunk`` on that device: its layers split over v
    chunks the same way (the earlier chunks take the remainder)."""
    n = int(device_layers(stage, pp, layers))
    return float(n // v + (1 if chunk < n % v else 0))


@jit
def stage_params(stage: int, pp: int, layers_dev: float, lp: float, emb_params: float, model) -> float:
    """Parameters on the device of pipeline stage ``stage``: its layers, the
    embedding on the first stage, the final norm and output head on the last
    (tied embeddings share one matrix only when both ends are on one device)."""
    params = layers_dev * lp
    if stage == 0:
        params += emb_params
    if stage == pp - 1:
        params += model.hidden * (2.0 if model.bias > 0 else 1.0)  # final norm (LayerNorm has a bias)
        if model.tied_embeddings == 0 or pp > 1:
            params += emb_params
    return params


@jit
def model_flop_per_sequence(model, s: float) -> float:
    """Forward FLOP of the whole model for one sequence (causal attention)."""
    h = model.hidden
    q = model.heads * model.head_dim
    kv = model.kv_heads * model.head_dim
    per_layer = 2.0 * s * h * (q + 2.0 * kv) + 2.0 * s * q * h
    per_layer += 2.0 * s * h * model.ffn * (3.0 if model.glu > 0 else 2.0)
    per_layer += 2.0 * s * s * q  # causal: half of 4 s^2 heads head_dim
    return model.layers * per_layer + 2.0 * s * h * model.vocab


@jit
def row_costs(tp, pp, dp, cp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, model, dev, tiers, tiles, work,
              costs):
    """Fill ``costs`` (length N_COST, seconds) with the latencies one candidate is built from.

    Shared by the analytic tier (``evaluate_one``) and the event tier
    (``kernels.event_tier``), so both rank the same operator and collective costs."""
    t = float(tp)
    p = float(pp)
    d = float(dp)
    c = float(cp)
    b = float(mb)
    sp = sp_flag != 0 and tp > 1
    s = work.seq_len
    ab = work.act_bytes
    flash = work.flash_attention > 0
    h = model.hidden
    dh = model.head_dim
    tokens = b * s / c
    heads = model.heads / t
    kv = model.kv_heads / t
    f = model.ffn / t
    q_out = heads * dh
    kv_out = kv * dh

    # ---- one layer, one micro-batch, one device
    f1, b1, _ = gemm_fwd_bwd_s(tokens, q_out + 2.0 * kv_out, h, dev, tiles, ab)
    f2, b2, _ = gemm_fwd_bwd_s(tokens, h, q_out, dev, tiles, ab)
    f3, b3, _ = gemm_fwd_bwd_s(tokens, (2.0 if model.glu > 0 else 1.0) * f, h, dev, tiles, ab)
    f4, b4, _ = gemm_fwd_bwd_s(tokens, h, f, dev, tiles, ab)
    attn_f, attn_b, _ = attention_fwd_bwd_s(b, s / c, s, heads, kv, dh, True, flash, dev, ab)
    norm_tokens = tokens / t if sp else tokens
    mem_bytes = 10.0 * norm_tokens * h * ab  # 2 norms (read+write), 2 residual adds (2 reads+write)
    n_kernels = 4.0
    if model.dropout > 0:
        mem_bytes += 5.0 * norm_tokens * h * ab
        n_kernels += 2.0
    mem_bytes += 2.0 * tokens * (q_out + kv_out) * ab  # rotary embedding on Q and K
    mem_bytes += (3.0 if model.glu > 0 else 2.0) * tokens * f * ab  # activation function
    n_kernels += 2.0
    mb_f = memory_bound_s(mem_bytes, n_kernels, dev)
    layer_fwd = f1 + f2 + f3 + f4 + attn_f + mb_f
    layer_bwd = b1 + b2 + b3 + b4 + attn_b + 2.0 * mb_f
    if work.gemm_cast_bytes > 0:  # 8-bit GEMMs: cast inputs and weights forward, output gradients backward
        up = (2.0 if model.glu > 0 else 1.0) * f
        inputs = tokens * (h + q_out + h + f)
        weights = h * (q_out + 2.0 * kv_out) + q_out * h + h * up + f * h
        grads = tokens * (q_out + 2.0 * kv_out + h + up + h)
        layer_fwd += memory_bound_s(work.gemm_cast_bytes * (inputs + weights), 8.0, dev)
        layer_bwd += memory_bound_s(work.gemm_cast_bytes * grads, 4.0, dev)

    msg = tokens * h * ab
    if sp and tp_overlap != 0:
        # chunked overlap: each all-gather hides behind the GEMM it feeds (QKV, MLP up),
        # each reduce-scatter behind the GEMM that produces it (out-proj, MLP down),
        # except its first chunk and whatever outlasts the GEMM
        ag = collective_time_s(ALL_GATHER, t, 1.0, msg, tiers)
        rs = collective_time_s(REDUCE_SCATTER, t, 1.0, msg, tiers)
        tp_layer = (overlapped_s(ag, f1) + overlapped_s(rs, f2) + overlapped_s(ag, f3) + overlapped_s(rs, f4))
    elif sp:
        tp_layer = 2.0 * collective_time_s(ALL_GATHER, t, 1.0, msg, tiers) + 2.0 * collective_time_s(
            REDUCE_SCATTER, t, 1.0, msg, tiers)
    else:
        tp_layer = 2.0 * collective_time_s(ALL_REDUCE, t, 1.0, msg, tiers)

    cp_f = 0.0
    cp_b = 0.0
    if cp > 1:  # ring attention: K and V chunks pass c - 1 times, overlapped with the attention core
        kv_chunk = b * (s / c) * 2.0 * kv_out * ab
        ring = (c - 1.0) * collective_time_s(SEND_RECV, c, t, kv_chunk, tiers)
        cp_f = max(0.0, ring - attn_f)
        cp_b = max(0.0, 2.0 * ring - attn_b)

    rc_compute = 0.0
    rc_comm = 0.0
    if recompute == RECOMPUTE_FULL:
        rc_compute = layer_fwd
        rc_comm = tp_layer + cp_f
    elif recompute == RECOMPUTE_SELECTIVE:
        rc_compute = attn_f

    # ---- embedding (first device) and output head + loss (last device)
    emb_f = memory_bound_s(2.0 * tokens * h * ab, 1.0, dev)
    emb_b = memory_bound_s(3.0 * tokens * h * ab, 1.0, dev)
    emb_comm = collective_time_s(REDUCE_SCATTER if sp else ALL_REDUCE, t, 1.0, msg, tiers)
    if sp:
        emb_comm += collective_time_s(ALL_GATHER, t, 1.0, msg, tiers)
    hf, hb, _ = gemm_fwd_bwd_s(tokens, model.vocab / t, h, dev, tiles, ab)
    logits = tokens * model.vocab / t
    head_f = hf + memory_bound_s(2.0 * norm_tokens * h * ab + 12.0 * logits, 4.0, dev)
    head_b = hb + memory_bound_s(2.0 * norm_tokens * h * ab + 8.0 * logits, 3.0, dev)
    head_comm = 2.0 * collective_time_s(ALL_REDUCE, t, 1.0, 4.0 * tokens, tiers)  # max and sum of the loss
    if sp:
        head_comm += collective_time_s(ALL_GATHER, t, 1.0, msg, tiers) + collective_time_s(
            REDUCE_SCATTER, t, 1.0, msg, tiers)

    # ---- pipeline and data-parallel traffic
    p2p_msg = msg / t if sp else msg
    costs[C_P2P] = collective_time_s(SEND_RECV, p, t * c * d, p2p_msg, tiers)
    lp = layer_params(model, t)
    emb_params = model.vocab * h / t
    params_max = 0.0
    layers_max = device_layers(0, pp, model.layers)  # the first stages hold the most layers
    for stage in range(pp):
        params_max = max(params_max, stage_params(stage, pp, device_layers(stage, pp, model.layers), lp, emb_params,
                                                  model))
    dc = d * c
    grad_total = params_max * work.grad_bytes
    param_total = params_max * work.weight_bytes
    if zero >= 3:  # ZeRO-3 / FSDP gathers and scatters layer by layer: one collective per layer
        rest = max(0.0, params_max - layers_max * lp)  # embedding / head / final norm, gathered as one unit
        costs[C_DP_GRAD] = layers_max * collective_time_s(REDUCE_SCATTER, dc, t, lp * work.grad_bytes, tiers) + \
            collective_time_s(REDUCE_SCATTER, dc, t, rest * work.grad_bytes, tiers)
        costs[C_DP_PARAM] = layers_max * collective_time_s(ALL_GATHER, dc, t, lp * work.weight_bytes, tiers) + \
            collective_time_s(ALL_GATHER, dc, t, rest * work.weight_bytes, tiers)
    elif zero >= 1:
        costs[C_DP_GRAD] = collective_time_s(REDUCE_SCATTER, dc, t, grad_total, tiers)
        costs[C_DP_PARAM] = collective_time_s(ALL_GATHER, dc, t, param_total, tiers)
    else:
        costs[C_DP_GRAD] = collective_time_s(ALL_REDUCE, dc, t, grad_total, tiers)
        costs[C_DP_PARAM] = 0.0
    opt_shard = params_max / dc if zero >= 1 else params_max
    costs[C_OPT] = optimizer_step_s(optimizer, opt_shard, dev)
    costs[C_LAYER_FWD] = layer_fwd
    costs[C_LAYER_BWD] = layer_bwd
    costs[C_TP_LAYER] = tp_layer
    costs[C_CP_F] = cp_f
    costs[C_CP_B] = cp_b
    costs[C_RC_COMPUTE] = rc_compute
    costs[C_RC_COMM] = rc_comm
    costs[C_EMB_F] = emb_f
    costs[C_EMB_B] = emb_b
    costs[C_EMB_COMM] = emb_comm
    costs[C_HEAD_F] = head_f
    costs[C_HEAD_B] = head_b
    costs[C_HEAD_COMM] = head_comm
    costs[C_LOGITS] = logits
    costs[C_PARAMS_MAX] = params_max
    # weight gradients dW = X^T dY of each GEMM (m x n x k forward -> k x n x m)
    up = (2.0 if model.glu > 0 else 1.0) * f
    costs[C_LAYER_WGRAD] = (gemm_time_s(h, q_out + 2.0 * kv_out, tokens, dev, tiles, ab)
                            + gemm_time_s(q_out, h, tokens, dev, tiles, ab)
                            + gemm_time_s(h, up, tokens, dev, tiles, ab)
                            + gemm_time_s(f, h, tokens, dev, tiles, ab))
    costs[C_HEAD_WGRAD] = gemm_time_s(h, model.vocab / t, tokens, dev, tiles, ab)


@jit
def evaluate_one(tp, pp, dp, cp, vpp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, n_micro,
                 model, dev, tiers, tiles, work, out):
    """Fill ``out`` (length N_OUT) for one candidate."""
    costs = np.empty(N_COST, dtype=np.float64)
    row_costs(tp, pp, dp, cp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, model, dev, tiers, tiles, work,
              costs)
    t = float(tp)
    p = float(pp)
    d = float(dp)
    c = float(cp)
    v = float(vpp)
    b = float(mb)
    m = float(n_micro)
    sp = sp_flag != 0 and tp > 1
    s = work.seq_len
    ab = work.act_bytes
    flash = work.flash_attention > 0
    h = model.hidden
    layer_fwd = costs[C_LAYER_FWD]
    layer_bwd = costs[C_LAYER_BWD]
    tp_layer = costs[C_TP_LAYER]
    cp_f = costs[C_CP_F]
    cp_b = costs[C_CP_B]
    rc_compute = costs[C_RC_COMPUTE]
    rc_comm = costs[C_RC_COMM]
    emb_f = costs[C_EMB_F]
    emb_b = costs[C_EMB_B]
    emb_comm = costs[C_EMB_COMM]
    head_f = costs[C_HEAD_F]
    head_b = costs[C_HEAD_B]
    head_comm = costs[C_HEAD_COMM]
    logits = costs[C_LOGITS]

    # ---- per device: forward and backward of one micro-batch
    lp = layer_params(model, t)
    emb_params = model.vocab * h / t
    t_max = -1.0
    t_sum = 0.0
    best_compute = 0.0
    best_tp = 0.0
    best_cp = 0.0
    best_f = 0.0
    best_b = 0.0
    best_rc = 0.0
    best_w = 0.0
    for stage in range(pp):
        layers_dev = device_layers(stage, pp, model.layers)
        fwd_compute = layers_dev * layer_fwd
        bwd_compute = layers_dev * (layer_bwd + rc_compute)
        tp_time = layers_dev * (2.0 * tp_layer + rc_comm)
        cp_time = layers_dev * (cp_f + cp_b)
        if stage == 0:
            fwd_compute += emb_f
            bwd_compute += emb_b
            tp_time += emb_comm
        if stage == pp - 1:
            fwd_compute += head_f
            bwd_compute += head_b
            tp_time += head_comm
        total = fwd_compute + bwd_compute + tp_time + cp_time
        t_sum += total
        if total > t_max:
            t_max = total
            best_compute = fwd_compute + bwd_compute
            best_tp = tp_time
            best_cp = cp_time
            best_f = fwd_compute + layers_dev * (tp_layer + cp_f)
            best_b = total - best_f
            best_rc = layers_dev * (rc_compute + rc_comm)
            best_w = layers_dev * costs[C_LAYER_WGRAD] + (costs[C_HEAD_WGRAD] if stage == pp - 1 else 0.0)

    # ---- pipeline schedule (closed form over unequal stages)
    if schedule == SCHEDULE_INTERLEAVED:
        pipe = m * t_max + (t_sum - t_max) / v
    elif schedule == SCHEDULE_ZB_H1:  # W passes fill the cool-down: (p-1)(F+B-W) instead of (p-1)(F+B+W)
        pipe = m * t_max + (t_sum - t_max) * max(0.0, t_max - 2.0 * best_w) / t_max
    else:
        pipe = m * t_max + (t_sum - t_max)
    bubble = pipe - m * t_max
    t_p2p = costs[C_P2P]
    pp_comm = 2.0 * (p - 1.0) * t_p2p * (v if schedule == SCHEDULE_INTERLEAVED else 1.0)

    # ---- data parallel (gradients over the DP x CP group, stride tp)
    dc = d * c
    dp_comm = 0.0
    if dc > 1:
        if zero >= 3:  # per micro-batch: gather for forward and backward, scatter gradients
            per_micro = 2.0 * costs[C_DP_PARAM] + costs[C_DP_GRAD]
            dp_comm = max(0.0, m * per_micro - m * t_max)
        else:  # reduce overlapped with the last backward, gather with the first forward
            dp_comm = max(0.0, costs[C_DP_GRAD] - best_b) + max(0.0, costs[C_DP_PARAM] - best_f)
    optimizer_s = costs[C_OPT]

    step = pipe + pp_comm + dp_comm + optimizer_s
    out[O_STEP] = step
    out[O_COMPUTE] = m * best_compute
    out[O_TP] = m * best_tp
    out[O_CP] = m * best_cp
    out[O_PP] = pp_comm
    out[O_DP] = dp_comm
    out[O_BUBBLE] = bubble
    out[O_OPT] = optimizer_s
    out[O_RECOMPUTE] = m * best_rc
    out[O_FWD] = best_f
    out[O_BWD] = best_b
    out[O_TOKENS] = work.global_batch * s / (step * work.devices)
    flop = 3.0 * work.global_batch * model_flop_per_sequence(model, s)
    out[O_FLOP] = flop
    out[O_MFU] = flop / (step * work.devices * dev.peak_flops_per_s)

    # ---- memory per device; the peak over stages
    act_layer = activation_bytes_per_layer(b, s, t, c, sp, recompute, flash, model, ab)
    # while a layer's backward recomputes, what it did not keep lives again for that one layer:
    # (all of it) - (what is kept), so more recompute never needs more memory
    work_layer = activation_bytes_per_layer(b, s, t, c, sp, RECOMPUTE_NONE, flash, model, ab) - act_layer
    peak = -1.0
    for stage in range(pp):
        layers_dev = device_layers(stage, pp, model.layers)
        params = stage_params(stage, pp, layers_dev, lp, emb_params, model)
        if zero >= 3:  # own shard + the gathered current and prefetched layers, at most all of them
            weights = min(params, params / dc + 2.0 * lp) * work.weight_bytes
        else:
            weights = params * work.weight_bytes
        grads = params * work.grad_bytes / (dc if zero >= 2 else 1.0)
        optim = params * work.optimizer_bytes * OPT_STATE_FRACTION[optimizer] / (dc if zero >= 1 else 1.0)
        chunks = in_flight_chunks(schedule, p, v, m, float(stage))
        layers_chunk = layers_dev / v if schedule == SCHEDULE_INTERLEAVED else layers_dev
        acts = chunks * layers_chunk * act_layer + work_layer
        if stage == pp - 1:
            acts += 4.0 * logits  # fp32 logits of the loss, one micro-batch
        total = weights + grads + optim + acts + dev.memory_overhead_bytes
        if total > peak:
            peak = total
            out[O_MW] = weights
            out[O_MG] = grads
            out[O_MO] = optim
            out[O_MA] = acts
            out[O_MSTAGE] = stage
    out[O_MOV] = dev.memory_overhead_bytes
    out[O_MPEAK] = peak
    fits = peak <= dev.hbm_capacity_bytes
    out[O_FEAS] = 1.0 if fits else 0.0
    out[O_REASON] = FEASIBLE_OK if fits else FEASIBLE_OUT_OF_MEMORY


@jit(parallel=True)
def evaluate_rows(tp, pp, dp, cp, vpp, mb, recompute, sp, tp_overlap, zero, optimizer, schedule, n_micro,
                  model, dev, tiers, tiles, work):
    """Evaluate every row; returns an (n_rows, N_OUT) float64 array in OUTPUTS order."""
    n = tp.shape[0]
    out = np.empty((n, N_OUT), dtype=np.float64)
    for i in prange(n):
        # records are indexed inside the loop: numba's parfor lowering cannot
        # pass a record hoisted out of it (llvm type mismatch, numba 0.68)
        evaluate_one(tp[i], pp[i], dp[i], cp[i], vpp[i], mb[i], recompute[i], sp[i], tp_overlap[i], zero[i],
                     optimizer[i], schedule[i],
                     n_micro[i], model[0], dev[0], tiers, tiles, work[0], out[i])
    return out
