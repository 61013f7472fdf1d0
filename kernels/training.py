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

MoE layers (``kernels.moe``) re-use the tp * cp * dp ranks of a stage as
expert TP (innermost) x EP x expert DP: the EP group has stride etp (placement
inner) or etp * edp (outer), the expert-gradient group the other stride. Each
rank dispatches its 1/tp share of the micro-batch's tokens; an MoE layer is
the attention part of a dense layer plus router, dispatch, grouped expert
GEMMs, shared experts and combine. MLA attention replaces the Q/K/V
projections by its low-rank down/up projections (replicated down, TP-split up).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from paraspace.kernels.codes import (
    ALL_GATHER,
    ALL_REDUCE,
    FEASIBLE_OK,
    FEASIBLE_OUT_OF_HOST_MEMORY,
    FEASIBLE_OUT_OF_MEMORY,
    PLACEMENT_OUTER,
    RECOMPUTE_FULL,
    RECOMPUTE_MOE_DISPATCH,
    RECOMPUTE_NONE,
    RECOMPUTE_NORMS,
    RECOMPUTE_SELECTIVE,
    REDUCE_SCATTER,
    SCHEDULE_DUALPIPE,
    SCHEDULE_GPIPE,
    SCHEDULE_INTERLEAVED,
    SCHEDULE_PIPEDREAM,
    SCHEDULE_ZB_H1,
    SEND_RECV,
)
from paraspace.kernels.collectives import collective_time_s
from paraspace.kernels.jit import jit
from paraspace.kernels.moe import (
    combine_s,
    dispatch_s,
    grouped_gemm_fwd_bwd_s,
    local_pass_s,
    staging_bytes,
    two_batch_exposed_s,
)
from paraspace.kernels.ops import (
    attention_qkv_fwd_bwd_s,
    causal_kv_len,
    gemm_efficiency,
    gemm_fwd_bwd_s,
    gemm_time_peak_s,
    gemm_time_s,
    memory_bound_s,
    peak_16bit,
)

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

#: Cost components of one candidate (``row_costs``), seconds unless noted:
#: per layer per micro-batch forward/backward compute, one direction of its TP
#: collectives, exposed CP ring time, recompute added to the backward, the
#: embedding and the LM head + loss with their TP traffic, one pipeline
#: message, the device's whole gradient reduction and parameter gather (ZeRO-3:
#: one pass's), the optimizer step, logits per micro-batch (elements), the
#: largest stage's parameters (count), and the weight-gradient GEMMs inside the
#: layer's and the head's backward (the W half that zero-bubble schedules split off).
#: MoE layers: forward / backward compute, their weight-gradient GEMMs, exposed
#: EP communication forward / backward, and the MoE buffers' bytes. The
#: multi-token-prediction modules' forward / backward / W on the last stage. One
#: dispatch of one MoE layer's micro-batch with its local passes, and the routed
#: rows per expert of the busiest rank with the gate/up GEMM's efficiency at them.
#: Exposed host-link time per layer and micro-batch (dense D / MoE M, forward F /
#: backward B) with activations and weights offloaded (OFF) and with only the
#: weights (WOFF, the layers whose activations are recomputed instead). An MoE
#: layer's recompute added to the backward: compute, and EP communication.
#: One MoE layer's raw EP traffic per micro-batch (dispatch, combine; nothing
#: overlapped) and its expert compute (routed + shared experts) forward,
#: backward, and the weight-gradient GEMMs inside that backward: the event tier
#: runs the traffic as tasks between the compute (``kernels.event_tier``).
(
    C_LAYER_FWD, C_LAYER_BWD, C_TP_LAYER, C_CP_F, C_CP_B, C_RC_COMPUTE, C_RC_COMM, C_EMB_F, C_EMB_B, C_EMB_COMM,
    C_HEAD_F, C_HEAD_B, C_HEAD_COMM, C_P2P, C_DP_GRAD, C_DP_PARAM, C_OPT, C_LOGITS, C_PARAMS_MAX,
    C_LAYER_WGRAD, C_HEAD_WGRAD, C_MOE_FWD, C_MOE_BWD, C_MOE_WGRAD, C_EP_F, C_EP_B, C_MOE_BUFFER,
    C_MTP_F, C_MTP_B, C_MTP_W, C_DISPATCH, C_EROWS, C_EEFF,
    C_OFF_DF, C_OFF_DB, C_OFF_MF, C_OFF_MB, C_WOFF_DF, C_WOFF_DB, C_WOFF_MF, C_WOFF_MB,
    C_RC_MOE, C_RC_EP, C_EP_DISP, C_EP_COMB, C_EXPERT_F, C_EXPERT_B, C_EXPERT_W,
) = range(48)
N_COST = 48

#: bytes per parameter touched by one Adam step on its shard: read fp32 master,
#: m, v and gradient (16), write master, m, v (12), write the 16-bit weight (2),
#: one more gradient read for clipping (4)
ADAM_BYTES_PER_PARAM = 34.0
#: ZeRO-Offload's CPU Adam: host DRAM bytes per parameter (read and write fp32
#: master, m, v: 24; read the 16-bit gradient, write the 16-bit weight: 4) and
#: PCIe bytes per parameter (16-bit gradient down, 16-bit weight up: 2 + 2, one
#: after the other: the update waits for the gradients, the weights for the update)
CPU_ADAM_HOST_BYTES = 28.0
CPU_ADAM_LINK_BYTES = 4.0
#: Per optimizer (index = kernels.codes OPTIMIZER_*: adam, adam-8bit, cpu-adam,
#: adam-no-master, adam-8bit-paged). Optimizer states as fractions of the
#: workload's fp32 Adam states (master + m + v, optimizer_bytes = 12), on the
#: device and on the host:
#:   adam 12 of 12 on the device; adam-8bit m and v of one byte each beside the
#:   fp32 master, 6 of 12; cpu-adam all 12 on the host; adam-no-master fp32 m and
#:   v, 8 of 12 (the 16-bit weights are updated in place); adam-8bit-paged the
#:   8-bit m and v, 2 of 12, in host memory (bitsandbytes' paged optimizers; no
#:   fp32 master: the 16-bit weights are updated in place). The chunk being
#:   updated is transient and not counted.
#: (numpy arrays, which numba freezes as constants indexable at run time)
OPT_STATE_FRACTION = np.array([1.0, 0.5, 0.0, 8.0 / 12.0, 0.0])
OPT_HOST_STATE_FRACTION = np.array([0.0, 0.0, 1.0, 0.0, 2.0 / 12.0])
#: HBM bytes per parameter of the step on the device:
#:   adam 34 (ADAM_BYTES_PER_PARAM); adam-8bit: read master 4, m+v 2, grad 4;
#:   write master 4, m+v 2, weight 2; clip read 4 = 22; cpu-adam none;
#:   adam-no-master: read weight 2, m 4, v 4, grad 4 (14); write weight 2, m 4,
#:   v 4 (10); clip read 4 = 28; adam-8bit-paged: read weight 2, m+v 2 (paged
#:   in), grad 4 (8); write weight 2, m+v 2 (4); clip read 4 = 16 (the page
#:   copies' own HBM traffic runs at the host link's pace, counted there)
OPT_DEVICE_STEP_BYTES = np.array([ADAM_BYTES_PER_PARAM, 22.0, 0.0, 28.0, 16.0])
#: host-link bytes per parameter on the step's critical path: cpu-adam 2 + 2 in
#: sequence; adam-8bit-paged pages m and v (2 bytes) in and the updated ones out,
#: chunk by chunk: the write-back of one chunk overlaps the fetch of the next on
#: the full-duplex link, so 2 bytes each way cost the time of 2
OPT_LINK_BYTES = np.array([0.0, 0.0, CPU_ADAM_LINK_BYTES, 0.0, 2.0])
#: host DRAM bytes per parameter streamed by a step on the CPU (cpu-adam only)
OPT_HOST_STEP_BYTES = np.array([0.0, 0.0, CPU_ADAM_HOST_BYTES, 0.0, 0.0])


@jit
def optimizer_step_s(optimizer: int, shard: float, dev) -> float:
    """One optimizer step over ``shard`` parameters of this device: its host-link
    transfers, its host-memory stream on the CPU, then its pass on the device
    (one launch even when the device does no update, as for CPU Adam)."""
    return (OPT_LINK_BYTES[optimizer] * shard / dev.host_link_bytes_per_s
            + OPT_HOST_STEP_BYTES[optimizer] * shard / (dev.host_memory_bytes_per_s * dev.memory_efficiency)
            + memory_bound_s(OPT_DEVICE_STEP_BYTES[optimizer] * shard, 1.0, dev))


#: chunks a TP collective is split into when overlapped with its GEMM
TP_OVERLAP_CHUNKS = 4.0


@jit
def overlapped_s(comm: float, compute: float) -> float:
    """Exposed time of a collective chunked into TP_OVERLAP_CHUNKS and pipelined
    with a GEMM: its first chunk cannot hide, the rest hides behind the GEMM."""
    first = comm / TP_OVERLAP_CHUNKS
    return first + max(0.0, comm - first - compute)


@jit
def attention_weights(model):
    """Matrix elements of one layer's attention as (TP-split, replicated).

    MHA/GQA: Q, K, V (kv_heads for K and V) and the output projection, all split.
    MLA (DeepSeek-V2/V3): the down-projections h x q_lora and h x (kv_lora + rope)
    are replicated; the up-projections q_lora x heads (nope + rope) (or h x that
    without a query rank), kv_lora x heads (nope + v) and the output heads v x h
    are split by heads."""
    h = model.hidden
    if model.mla > 0:
        heads = model.heads
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        split = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim) + heads * model.v_head_dim * h
        rep = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        if model.q_lora_rank > 0:
            split += model.q_lora_rank * heads * qk
            rep += h * model.q_lora_rank
        else:
            split += h * heads * qk
        return split, rep
    q = model.heads * model.head_dim
    kv = model.kv_heads * model.head_dim
    return h * (q + 2.0 * kv) + q * h, 0.0


@jit
def layer_vectors(model, width: float):
    """Vector parameters of one layer as (TP-split, replicated): biases of the
    column-parallel matrices (QKV, MLP up of ``width``) are split; norm weights
    (2h; with biases 4h, plus the out-proj and down-proj biases added after the
    TP reduction: 6h) and MLA's latent norms are replicated (Megatron-LM)."""
    h = model.hidden
    split = 0.0
    rep = 2.0 * h
    if model.bias > 0:
        q = model.heads * model.head_dim
        kv = model.kv_heads * model.head_dim
        split = (q + 2.0 * kv) + (2.0 if model.glu > 0 else 1.0) * width
        rep = 6.0 * h
    if model.mla > 0:
        rep += model.kv_lora_rank + model.q_lora_rank
    return split, rep


@jit
def mlp_matrices(model, width: float) -> float:
    """Matrix elements of a (gated) MLP of intermediate ``width``."""
    return (3.0 if model.glu > 0 else 2.0) * model.hidden * width


@jit
def layer_params(model, t: float) -> float:
    """Parameters of one dense transformer layer held by one of t tensor-parallel ranks.

    Attention (``attention_weights``) and the MLP (3 h f gated, 2 h f otherwise)
    are sharded by t, as are the column-parallel biases; norms and the
    row-parallel biases are replicated (``layer_vectors``)."""
    split, rep = attention_weights(model)
    vsplit, vrep = layer_vectors(model, model.ffn)
    return (split + mlp_matrices(model, model.ffn) + vsplit) / t + rep + vrep


@jit
def moe_layer_params(model, t: float, ep: float, etp: float):
    """Parameters of one MoE layer on one device as (non-expert, expert): the
    attention and norms as in a dense layer, the router (experts x h, replicated),
    the shared experts split by t like a dense MLP, and E / ep routed experts
    (3 h f_e each, gated) split by the expert TP size."""
    split, rep = attention_weights(model)
    shared = model.shared_experts * model.expert_ffn
    vsplit, vrep = layer_vectors(model, shared)
    router = model.experts * model.hidden
    dense = (split + mlp_matrices(model, shared) + vsplit) / t + rep + vrep + router
    expert = model.experts / ep * 3.0 * model.hidden * model.expert_ffn / etp
    return dense, expert


@jit
def mtp_params(model, t: float, ep: float, etp: float):
    """Parameters of the multi-token-prediction modules as (non-expert, expert):
    per depth one more layer (MoE when the model is), its 2h x h projection
    (split by t) and two norms; embedding and head are shared with the model."""
    if model.mtp_depth <= 0:
        return 0.0, 0.0
    h = model.hidden
    if model.experts > 0:
        dense, expert = moe_layer_params(model, t, ep, etp)
    else:
        dense = layer_params(model, t)
        expert = 0.0
    return model.mtp_depth * (dense + 2.0 * h * h / t + 2.0 * h), model.mtp_depth * expert


@jit
def model_params(model):
    """(total, active per token) parameters of the whole model, MTP modules excluded.

    Active counts what one token's forward multiplies by: every layer's attention
    and norms, the dense MLPs, the router, shared experts and top_k routed
    experts of each MoE layer, embedding and output head."""
    dense_layers = model.layers
    moe_layers = 0.0
    if model.experts > 0:
        dense_layers = model.dense_layers
        moe_layers = model.layers - model.dense_layers
    emb = model.vocab * model.hidden * (1.0 if model.tied_embeddings > 0 else 2.0)
    final_norm = model.hidden * (2.0 if model.bias > 0 else 1.0)
    base = dense_layers * layer_params(model, 1.0) + emb + final_norm
    if moe_layers == 0.0:
        return base, base
    dense, expert = moe_layer_params(model, 1.0, 1.0, 1.0)
    one_expert = 3.0 * model.hidden * model.expert_ffn
    total = base + moe_layers * (dense + expert)
    active = base + moe_layers * (dense + model.top_k * one_expert)
    return total, active


#: Per recompute mode (index = kernels.codes RECOMPUTE_*: none, selective, full,
#: norms, moe-dispatch), what a layer that is not fully recomputed keeps (full
#: recompute keeps only the layer input; its entries are unused):
#: Korthikanti's replicated ab x tokens x h tensors: the two norm inputs and the
#: two norm outputs (the QKV and MLP inputs); "norms" recomputes the outputs in
#: the backward (Megatron-Core's recompute module "layernorm") and keeps 2.
RC_REPLICATED = np.array([4.0, 4.0, 0.0, 2.0, 4.0])
#: 1 where the s x s attention scores are kept without FlashAttention (selective drops them)
RC_SCORES = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
#: h-wide tensors kept per routed row of an MoE layer: the expert input (the
#: dispatched row) and output; "moe-dispatch" drops the input and dispatches again
#: in the backward
RC_ROUTED_H = np.array([2.0, 2.0, 0.0, 2.0, 1.0])


@jit
def _layer_activation_bytes(b: float, s: float, t: float, c: float, sp: bool, recompute: int, flash: bool, model,
                            ab: float, moe_layer: bool, imbalance: float) -> float:
    tokens = b * s / c
    h = model.hidden
    if recompute == RECOMPUTE_FULL:
        full_input = ab * tokens * h
        return full_input / t if sp else full_input
    dropout = model.dropout > 0
    replicated = RC_REPLICATED[recompute] * ab * tokens * h
    if dropout:
        replicated += 2.0 * tokens * h
    if sp:
        replicated /= t
    heads = model.heads / t
    if model.mla > 0:  # Q, K (nope + rope), V and O per head; the replicated latents
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        split = ab * tokens * heads * (2.0 * qk + 2.0 * model.v_head_dim)
        split += ab * tokens * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
    else:
        kv = model.kv_heads / t
        split = ab * tokens * model.head_dim * (2.0 * heads + 2.0 * kv)
    if moe_layer:
        # router logits and probabilities (fp32) of this rank's 1/t of the tokens; per
        # routed row: the expert input and output (h each) and gate, up, activation (3 f_e);
        # the shared experts as a dense MLP split by t
        rows = tokens / t * model.top_k * imbalance
        split += 8.0 * tokens / t * model.experts
        split += ab * rows * (RC_ROUTED_H[recompute] * h + 3.0 * model.expert_ffn)
        split += 3.0 * ab * tokens * model.shared_experts * model.expert_ffn / t
    else:
        split += (3.0 if model.glu > 0 else 2.0) * ab * tokens * model.ffn / t
    scores = 0.0
    if flash:
        scores = 4.0 * b * heads * (s / c)
    elif RC_SCORES[recompute] > 0:
        per_elem = ab + (1.0 + ab if dropout else 0.0)
        scores = per_elem * b * heads * (s / c) * s
    return replicated + split + scores


@jit
def activation_bytes_per_layer(b: float, s: float, t: float, c: float, sp: bool, recompute: int,
                               flash: bool, model, ab: float) -> float:
    """Activation bytes one dense layer keeps for backward, per micro-batch per device.

    Korthikanti et al. 2022 (section 4.1, eq. 1-2), generalised to GQA and gated
    MLPs and to any element width ab (their coefficients assume ab = 2):
    replicated (split by t only with sequence parallelism): two norm inputs,
    QKV and MLP inputs (ab each per token x h), dropout masks (1 byte, x2);
    split by t: Q, K, V, attention output, MLP intermediates (3f gated: gate
    and up outputs and the down-projection input; 2f for GeLU); the s x s
    softmax output (+ dropout mask and output) unless FlashAttention or
    selective recompute removes it (flash keeps the fp32 log-sum-exp instead).
    Full recompute keeps only the layer input; norms recompute drops the two
    norm outputs (``RC_REPLICATED``). MLA keeps its per-head Q, K, V, O and the
    replicated latents.
    For GPT (ab = 2, f = 4h, dropout, no flash):
    s b h (10 + 24/t + 5 a s / (h t)) without SP, s b h / t (34 + 5 a s / h) with SP;
    with norms recompute 4 s b h fewer replicated bytes: s b h (6 + 24/t + 5 a s / (h t)),
    s b h / t (30 + 5 a s / h).
    """
    return _layer_activation_bytes(b, s, t, c, sp, recompute, flash, model, ab, False, 1.0)


@jit
def moe_activation_bytes_per_layer(b: float, s: float, t: float, c: float, sp: bool, recompute: int,
                                   flash: bool, model, ab: float, imbalance: float) -> float:
    """``activation_bytes_per_layer`` of an MoE layer: the MLP's intermediates
    replaced by the router's fp32 logits and probabilities, the routed rows
    (k x imbalance per token: expert input, output and three f_e-wide
    intermediates; moe-dispatch recompute drops the input, ``RC_ROUTED_H``) and
    the shared experts' intermediates."""
    return _layer_activation_bytes(b, s, t, c, sp, recompute, flash, model, ab, True, imbalance)


@jit
def in_flight_chunks(schedule: int, p: float, v: float, m: float, stage: float) -> float:
    """Micro-batch chunks whose activations a device holds at its peak.

    GPipe: all m. 1F1B: p - stage (at most m). ZB-H1: p on every stage (the
    p - stage of 1F1B plus the stage micro-batches whose W it defers; Qi et al.
    2023: ZB-H1's peak memory equals 1F1B's), counting a micro-batch until its W,
    conservatively with all its activations. Interleaved (Megatron-LM's
    warm-up count + 1): 2 (p - stage - 1) + (v - 1) p + 1 chunks of 1/v of the
    device's layers (at most m v), i.e. p (1 + (p-1)/(p v)) stage-equivalents
    on the first stage (Narayanan et al. 2021, section 2.2). DualPipe: p + 1
    one-stage chunks on every device (DeepSeek-V3, Table 2; at most m).
    PipeDream (asynchronous 1F1B): p - stage whatever m, as no flush drains the
    pipeline between steps. Returned in chunks; divide by v for stage-equivalents.
    """
    if schedule == SCHEDULE_GPIPE:
        return m
    if schedule == SCHEDULE_INTERLEAVED:
        return min(2.0 * (p - stage - 1.0) + (v - 1.0) * p + 1.0, m * v)
    if schedule == SCHEDULE_DUALPIPE:  # DeepSeek-V3 Table 2: p + 1 chunks of one stage on every device
        return min(p + 1.0, m)
    if schedule == SCHEDULE_PIPEDREAM:  # no flush: the next step's micro-batches keep the pipeline full
        return p - stage
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
def device_dense_layers(stage: int, pp: int, model) -> float:
    """Layers with a dense MLP on that device: all of them in a dense model; in an
    MoE model those of its layers among the first ``dense_layers``."""
    n = device_layers(stage, pp, model.layers)
    if model.experts <= 0:
        return n
    total = int(model.layers)
    first = stage * (total // pp) + min(stage, total % pp)
    return float(max(0.0, min(model.dense_layers - first, n)))


@jit
def chunk_dense_layers(stage: int, chunk: int, pp: int, v: int, model) -> float:
    """Dense layers of virtual chunk ``chunk`` on that device (its dense layers
    fill its chunks in order)."""
    before = 0.0
    for c in range(chunk):
        before += chunk_layers(stage, c, pp, v, model.layers)
    return max(0.0, min(device_dense_layers(stage, pp, model) - before, chunk_layers(stage, chunk, pp, v,
                                                                                     model.layers)))


@jit
def param_parts(model, t: float, ep: float, etp: float):
    """Per-device parameter counts the stages are assembled from, computed once per
    candidate: (dense layer, MoE layer non-expert, MoE layer expert, MTP modules
    non-expert, MTP modules expert, embedding)."""
    md = 0.0
    me = 0.0
    if model.experts > 0:
        md, me = moe_layer_params(model, t, ep, etp)
    td, te = mtp_params(model, t, ep, etp)
    return layer_params(model, t), md, me, td, te, model.vocab * model.hidden / t


@jit
def stage_params(stage: int, pp: int, t: float, ep: float, etp: float, model):
    """Parameters on the device of pipeline stage ``stage`` as (non-expert, expert):
    its dense and MoE layers, the embedding on the first stage, the final norm
    and output head (and the MTP modules, with a copy of the embedding) on the
    last (tied embeddings share one matrix only when both ends are on one device)."""
    return stage_params_from(stage, pp, param_parts(model, t, ep, etp), model)


@jit
def stage_params_from(stage: int, pp: int, parts, model):
    """``stage_params`` from the candidate's ``param_parts``."""
    lp, md, me, td, te, emb = parts
    n = device_layers(stage, pp, model.layers)
    nd = device_dense_layers(stage, pp, model)
    dense = nd * lp + (n - nd) * md
    expert = (n - nd) * me
    if stage == 0:
        dense += emb
    if stage == pp - 1:
        dense += model.hidden * (2.0 if model.bias > 0 else 1.0)  # final norm (LayerNorm has a bias)
        if model.tied_embeddings == 0 or pp > 1:
            dense += emb
        dense += td
        expert += te
        if model.mtp_depth > 0 and pp > 1:
            dense += emb
    return dense, expert


@jit
def model_flop_per_sequence(model, s: float) -> float:
    """Forward FLOP of the whole model for one sequence (causal attention): two
    per active matrix element per token, plus the attention core."""
    split, rep = attention_weights(model)
    h = model.hidden
    keys = causal_kv_len(s, model.sliding_window)
    if model.mla > 0:
        core = s * keys * model.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    else:
        core = 2.0 * s * keys * model.heads * model.head_dim  # causal: half of 4 s^2 heads head_dim
    attn = 2.0 * s * (split + rep) + core
    dense_layers = model.layers
    flop = 0.0
    if model.experts > 0:
        dense_layers = model.dense_layers
        experts = model.top_k + model.shared_experts
        moe_mlp = 2.0 * s * (experts * 3.0 * h * model.expert_ffn + model.experts * h)
        flop += (model.layers - model.dense_layers) * (attn + moe_mlp)
    flop += dense_layers * (attn + 2.0 * s * mlp_matrices(model, model.ffn))
    return flop + 2.0 * s * h * model.vocab


@jit
def gemm_passes_s(m: float, n: float, k: float, dev, tiles, ab: float):
    """(forward, backward, weight-gradient) seconds of a GEMM Y = X W (m x k @ k x n)."""
    f, b, _ = gemm_fwd_bwd_s(m, n, k, dev, tiles, ab)
    return f, b, gemm_time_s(k, n, m, dev, tiles, ab)


@jit
def attention_gemm_s(m: float, n: float, k: float, dev, tiles, ab: float, work):
    """``gemm_passes_s`` of an attention projection: in the space's GEMM precision, or
    at the 16-bit peak where the space quantises only the MLP GEMMs."""
    if work.quantize_attention > 0:
        return gemm_passes_s(m, n, k, dev, tiles, ab)
    peak = peak_16bit(dev)
    w = gemm_time_peak_s(k, n, m, dev, tiles, ab, peak)
    return gemm_time_peak_s(m, n, k, dev, tiles, ab, peak), gemm_time_peak_s(m, k, n, dev, tiles, ab, peak) + w, w


@jit
def layer_input_bytes(b: float, s: float, t: float, c: float, sp: bool, model, ab: float) -> float:
    """A layer's input (what full recompute keeps): tokens x h, split by t with SP."""
    full_input = ab * b * s / c * model.hidden
    return full_input / t if sp else full_input


@jit
def host_exposed_s(to_host: float, to_device: float, compute: float, dev) -> float:
    """Seconds of host-link transfers (bytes each way, the link is full duplex)
    not hidden behind ``compute`` seconds of the same pass."""
    return max(0.0, max(to_host, to_device) / dev.host_link_bytes_per_s - compute)


@jit
def recomputed_layers(recompute: int, rc_layers: float, nd: float, nm: float):
    """(dense, MoE) layers fully recomputed out of ``nd`` + ``nm``: all with full
    recompute, or only the last ``rc_layers`` of them (MoE layers come last)."""
    if recompute != RECOMPUTE_FULL:
        return 0.0, 0.0
    k = nd + nm if rc_layers <= 0.0 else min(rc_layers, nd + nm)
    fr_m = min(k, nm)
    return min(k - fr_m, nd), fr_m


@jit
def comm_groups(t: float, c: float, d: float, p: float, ep: float, etp: float, edp: float, moe: bool) -> float:
    """Process groups of more than one rank a device belongs to, each a communicator
    with its own buffers: TP, CP, the DP x CP gradient group, PP and, with experts,
    EP, expert TP and expert DP."""
    n = 0.0
    for size in (t, c, d * c, p):
        if size > 1.0:
            n += 1.0
    if moe:
        for size in (ep, etp, edp):
            if size > 1.0:
                n += 1.0
    return n


@jit
def fixed_overhead_bytes(t: float, c: float, d: float, p: float, ep: float, etp: float, edp: float, moe: bool,
                         dev) -> float:
    """Device memory beside the tensors that does not scale with them: the
    profile's fixed overhead (context, workspace) and the communication buffers
    of each process group (``comm_groups``); the allocator's fragmentation,
    a fraction of the tensors' bytes, comes on top (``evaluate_one``)."""
    return dev.memory_overhead_bytes + comm_groups(t, c, d, p, ep, etp, edp, moe) * dev.comm_buffer_bytes


@jit
def ep_strides(t: float, c: float, d: float, ep: float, etp: float, placement: int):
    """(EP group stride, expert-DP size, expert-DP stride) in a stage's t * c * d ranks,
    laid out expert TP innermost, then EP and expert DP (swapped when outer)."""
    edp = max(1.0, t * c * d / (ep * etp))
    if placement == PLACEMENT_OUTER:
        return etp * edp, edp, etp
    return etp, edp, etp * ep


@jit
def row_costs(tp, pp, dp, cp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
              dispatch, tbo, off_act, off_w, model, dev, tiers, tiles, work, costs):
    """Fill ``costs`` (length N_COST, seconds) with the latencies one candidate is built from.

    Shared by the analytic tier (``evaluate_one``) and the event tier
    (``kernels.event_tier``), so both rank the same operator and collective costs."""
    t = float(tp)
    p = float(pp)
    d = float(dp)
    c = float(cp)
    b = float(mb)
    e = float(ep)
    et = float(etp)
    sp = sp_flag != 0 and tp > 1
    s = work.seq_len
    ab = work.act_bytes
    flash = work.flash_attention > 0
    h = model.hidden
    tokens = b * s / c
    heads = model.heads / t
    f = model.ffn / t

    # ---- attention, one layer, one micro-batch, one device
    wg = 0.0  # weight-gradient GEMMs dW = X^T dY (m x n x k forward -> k x n x m)
    if model.mla > 0:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        kv_lat = model.kv_lora_rank + model.qk_rope_head_dim
        f1, b1, w1 = attention_gemm_s(tokens, kv_lat, h, dev, tiles, ab, work)  # KV down (replicated)
        fx, bx, wx = attention_gemm_s(tokens, heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank,
                                   dev, tiles, ab, work)
        f1 += fx
        b1 += bx
        w1 += wx
        if model.q_lora_rank > 0:
            fx, bx, wx = attention_gemm_s(tokens, model.q_lora_rank, h, dev, tiles, ab, work)
            fy, by, wy = attention_gemm_s(tokens, heads * qk, model.q_lora_rank, dev, tiles, ab, work)
            fx += fy
            bx += by
            wx += wy
        else:
            fx, bx, wx = attention_gemm_s(tokens, heads * qk, h, dev, tiles, ab, work)
        f1 += fx
        b1 += bx
        w1 += wx
        v_out = heads * model.v_head_dim
        rope_width = heads * model.qk_rope_head_dim + model.qk_rope_head_dim
        attn_f, attn_b, _ = attention_qkv_fwd_bwd_s(b, s / c, causal_kv_len(s, model.sliding_window), heads, heads,
                                                    qk, model.v_head_dim, True, flash, dev, ab)
        # the latent norms, read and written
        latent_norm_bytes = 2.0 * tokens * (model.kv_lora_rank + model.q_lora_rank) * ab
        proj_out = kv_lat + heads * (model.qk_nope_head_dim + model.v_head_dim) + heads * qk + model.q_lora_rank
    else:
        dh = model.head_dim
        q_out = heads * dh
        kv_out = model.kv_heads / t * dh
        f1, b1, w1 = attention_gemm_s(tokens, q_out + 2.0 * kv_out, h, dev, tiles, ab, work)
        v_out = q_out
        rope_width = q_out + kv_out
        attn_f, attn_b, _ = attention_qkv_fwd_bwd_s(b, s / c, causal_kv_len(s, model.sliding_window), heads,
                                                    model.kv_heads / t, dh, dh, True, flash, dev, ab)
        latent_norm_bytes = 0.0
        proj_out = q_out + 2.0 * kv_out
    f2, b2, w2 = attention_gemm_s(tokens, h, v_out, dev, tiles, ab, work)
    wg += w1 + w2
    norm_tokens = tokens / t if sp else tokens
    fused = dev.kernel_fusion > 0
    if fused:  # each residual add + norm one kernel (read x and the residual, write both), rope inside attention
        mem_bytes = 8.0 * norm_tokens * h * ab
        n_kernels = 2.0
    else:
        mem_bytes = 10.0 * norm_tokens * h * ab  # 2 norms (read+write), 2 residual adds (2 reads+write)
        n_kernels = 5.0  # two norms, two residual adds, rotary embedding
    if model.dropout > 0:
        mem_bytes += 5.0 * norm_tokens * h * ab
        n_kernels += 2.0
    mem_bytes += latent_norm_bytes
    if not fused:
        mem_bytes += 2.0 * tokens * rope_width * ab  # rotary embedding on Q and K
    common = memory_bound_s(mem_bytes, n_kernels, dev)
    attn_part_f = f1 + f2 + attn_f + common
    attn_part_b = b1 + b2 + attn_b + 2.0 * common

    # ---- dense MLP
    up = (2.0 if model.glu > 0 else 1.0) * f
    f3, b3, w3 = gemm_passes_s(tokens, up, h, dev, tiles, ab)
    f4, b4, w4 = gemm_passes_s(tokens, h, f, dev, tiles, ab)
    act = 0.0  # the activation function, or nothing when fused into the up-projection's epilogue
    if not fused:
        act = memory_bound_s((3.0 if model.glu > 0 else 2.0) * tokens * f * ab, 1.0, dev)
    layer_fwd = attn_part_f + f3 + f4 + act
    layer_bwd = attn_part_b + b3 + b4 + 2.0 * act
    if work.gemm_cast_bytes > 0:  # 8-bit GEMMs: cast inputs and weights forward, output gradients backward
        inputs = tokens * (h + f)  # the MLP's (MLP-only quantisation leaves attention in 16 bits)
        weights = h * up + f * h
        grads = tokens * (up + h)
        if work.quantize_attention > 0:
            split, rep = attention_weights(model)
            inputs += tokens * (h + v_out)
            weights += split / t + rep
            grads += tokens * (proj_out + h)
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
        kv_chunk = b * (s / c) * 2.0 * (rope_width - heads * (model.qk_rope_head_dim if model.mla > 0 else 0.0)) * ab
        if model.mla <= 0:
            kv_chunk = b * (s / c) * 2.0 * (model.kv_heads / t * model.head_dim) * ab
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
    elif recompute == RECOMPUTE_NORMS:  # the two norms again: read the kept input, write the output
        rc_compute = memory_bound_s(4.0 * norm_tokens * h * ab, 2.0, dev)
    # an MoE layer recomputes what a dense one does (its attention part and norms are
    # the same), or its whole forward with full recompute, or only the dispatch
    rc_moe = rc_compute
    rc_ep = 0.0

    # ---- MoE layer: the attention part, router, dispatch, experts, shared experts, combine
    ep_stride, edp, _ = ep_strides(t, c, d, e, et, placement)
    moe_f = 0.0
    moe_b = 0.0
    moe_w = 0.0
    ep_f = 0.0
    ep_b = 0.0
    buffers = 0.0
    one_dispatch = 0.0
    m_e = 0.0
    e_eff = 0.0
    disp = 0.0
    comb = 0.0
    experts_f = 0.0
    experts_b = 0.0
    experts_w = 0.0
    if model.experts > 0:
        n_exp = model.experts
        k = model.top_k
        fe = model.expert_ffn
        imb = work.moe_imbalance
        t_rank = tokens / t  # this rank's share of the micro-batch's tokens
        tok_bytes = t_rank * h * ab
        rf, rb, rw = gemm_passes_s(t_rank, n_exp, h, dev, tiles, ab)
        router = memory_bound_s(3.0 * 4.0 * t_rank * n_exp, 2.0, dev)  # softmax and top-k over fp32 logits
        groups = n_exp / e
        m_e = e * et * t_rank * k * imb / n_exp  # rows per local expert on the busiest rank
        g1f, g1b, g1w = grouped_gemm_fwd_bwd_s(groups, m_e, 2.0 * fe / et, h, dev, tiles, ab)
        g2f, g2b, g2w = grouped_gemm_fwd_bwd_s(groups, m_e, h, fe / et, dev, tiles, ab)
        g_act = 0.0 if fused else memory_bound_s(3.0 * groups * m_e * fe / et * ab, 1.0, dev)
        expert_f = g1f + g2f + g_act
        expert_b = g1b + g2b + 2.0 * g_act
        sh_f = 0.0
        sh_b = 0.0
        sh_w = 0.0
        if model.shared_experts > 0:
            width = model.shared_experts * fe / t
            s1f, s1b, s1w = gemm_passes_s(tokens, 2.0 * width, h, dev, tiles, ab)
            s2f, s2b, s2w = gemm_passes_s(tokens, h, width, dev, tiles, ab)
            s_act = 0.0 if fused else memory_bound_s(3.0 * tokens * width * ab, 1.0, dev)
            sh_f = s1f + s2f + s_act
            sh_b = s1b + s2b + 2.0 * s_act
            sh_w = s1w + s2w
        local = local_pass_s(dispatch, tok_bytes, e, k, imb, dev)  # permute before, unpermute after
        disp, _, _ = dispatch_s(dispatch, tok_bytes, e, ep_stride, n_exp, k, model.max_nodes, tiers)
        comb = combine_s(dispatch, tok_bytes, e, ep_stride, n_exp, k, model.max_nodes, tiers)
        if et > 1.0:  # expert TP: the dispatched rows gathered among its ranks, the outputs scattered back
            rows_bytes = et * t_rank * k * imb * h * ab
            disp += collective_time_s(ALL_GATHER, et, 1.0, rows_bytes, tiers)
            comb += collective_time_s(REDUCE_SCATTER, et, 1.0, rows_bytes, tiers)
        if tbo != 0:
            ep_f = two_batch_exposed_s(disp, comb, expert_f + sh_f)
            ep_b = two_batch_exposed_s(comb, disp, expert_b + sh_b)
        else:
            ep_f = disp + comb
            ep_b = comb + disp
        if schedule == SCHEDULE_DUALPIPE:
            # DualPipe pairs one micro-batch's forward chunk with another's backward chunk
            # and overlaps each one's dispatch/combine with the other's compute (DeepSeek-V3,
            # section 3.2.1): the forward's traffic hides behind the paired backward's expert
            # and shared-expert compute, and the other way round. This credit is the analytic
            # tier's (the unpaired warm-up and cool-down passes are credited the same); the
            # event tier receives the raw traffic instead and pairs the passes itself
            # (kernels.pipeline: an F&B pair's EP transfers against the other pass's compute)
            ep_f = min(ep_f, max(0.0, disp + comb - (expert_b + sh_b)))
            ep_b = min(ep_b, max(0.0, comb + disp - (expert_f + sh_f)))
        moe_f = attn_part_f + rf + router + 2.0 * local + expert_f + sh_f
        moe_b = attn_part_b + rb + 2.0 * router + 2.0 * local + expert_b + sh_b
        moe_w = w1 + w2 + rw + g1w + g2w + sh_w
        experts_f = expert_f + sh_f
        experts_b = expert_b + sh_b
        experts_w = g1w + g2w + sh_w
        buffers = staging_bytes(dispatch, tok_bytes, e, k, imb)
        one_dispatch = disp + local
        e_eff = gemm_efficiency(m_e, 2.0 * fe / et, h, dev, tiles)
        if recompute == RECOMPUTE_FULL:  # the forward again, dispatch and combine included
            rc_moe = moe_f
            rc_ep = ep_f
        elif recompute == RECOMPUTE_MOE_DISPATCH:  # the dispatched rows again: permute and dispatch
            rc_moe = local
            rc_ep = disp

    # ---- multi-token prediction modules (last stage): one more layer, a 2h -> h projection
    # and the output head again, each per depth
    hf, hb, hw = gemm_passes_s(tokens, model.vocab / t, h, dev, tiles, ab)
    mtp_f = 0.0
    mtp_b = 0.0
    mtp_w = 0.0
    if model.mtp_depth > 0:
        pf, pb, pw = gemm_passes_s(tokens, h / t, 2.0 * h, dev, tiles, ab)
        if model.experts > 0:
            lf = moe_f + ep_f
            lb = moe_b + ep_b
            lw = moe_w
        else:
            lf = layer_fwd
            lb = layer_bwd
            lw = w1 + w2 + w3 + w4
        mtp_f = model.mtp_depth * (lf + tp_layer + pf + hf)
        mtp_b = model.mtp_depth * (lb + tp_layer + pb + hb)
        mtp_w = model.mtp_depth * (lw + pw + hw)

    # ---- embedding (first device) and output head + loss (last device)
    emb_f = memory_bound_s(2.0 * tokens * h * ab, 1.0, dev)
    emb_b = memory_bound_s(3.0 * tokens * h * ab, 1.0, dev)
    emb_comm = collective_time_s(REDUCE_SCATTER if sp else ALL_REDUCE, t, 1.0, msg, tiers)
    if sp:
        emb_comm += collective_time_s(ALL_GATHER, t, 1.0, msg, tiers)
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
    params_max = -1.0
    dense_max = 0.0
    expert_max = 0.0
    one_max = -1.0
    pass_dense = 0.0  # ZeRO-3 gathers per pass: one stage's parameters (DualPipe's chunk runs one stage)
    parts = param_parts(model, t, e, et)
    for stage in range(pp):
        sd, se = stage_params_from(stage, pp, parts, model)
        if sd + se > one_max:
            one_max = sd + se
            pass_dense = sd
        if schedule == SCHEDULE_DUALPIPE:  # the device also holds stage p - 1 - stage (the other direction's):
            td, te = stage_params_from(pp - 1 - stage, pp, parts, model)  # its gradients are reduced and
            sd += td  # updated too (the memory model's two copies, evaluate_one)
            se += te
        if sd + se > params_max:
            params_max = sd + se
            dense_max = sd
            expert_max = se
    layers_max = device_layers(0, pp, model.layers)  # the first stages hold the most layers
    moe_dense, moe_expert = moe_layer_params(model, t, e, et)
    layer_dense = lp
    layer_expert = 0.0
    if model.experts > 0 and model.dense_layers < model.layers:
        layer_dense = moe_dense
        layer_expert = moe_expert
    dc = d * c
    _, _, edp_stride = ep_strides(t, c, d, e, et, placement)
    if zero >= 3:  # ZeRO-3 / FSDP gathers and scatters layer by layer: one collective per layer
        rest = max(0.0, pass_dense - layers_max * layer_dense)  # embedding / head / final norm, as one unit
        costs[C_DP_GRAD] = layers_max * (
            collective_time_s(REDUCE_SCATTER, dc, t, layer_dense * work.grad_bytes, tiers)
            + collective_time_s(REDUCE_SCATTER, edp, edp_stride, layer_expert * work.grad_bytes, tiers)) + \
            collective_time_s(REDUCE_SCATTER, dc, t, rest * work.grad_bytes, tiers)
        costs[C_DP_PARAM] = layers_max * (
            collective_time_s(ALL_GATHER, dc, t, layer_dense * work.weight_bytes, tiers)
            + collective_time_s(ALL_GATHER, edp, edp_stride, layer_expert * work.weight_bytes, tiers)) + \
            collective_time_s(ALL_GATHER, dc, t, rest * work.weight_bytes, tiers)
    elif zero >= 1:
        costs[C_DP_GRAD] = collective_time_s(REDUCE_SCATTER, dc, t, dense_max * work.grad_bytes, tiers) + \
            collective_time_s(REDUCE_SCATTER, edp, edp_stride, expert_max * work.grad_bytes, tiers)
        costs[C_DP_PARAM] = collective_time_s(ALL_GATHER, dc, t, dense_max * work.weight_bytes, tiers) + \
            collective_time_s(ALL_GATHER, edp, edp_stride, expert_max * work.weight_bytes, tiers)
    else:
        costs[C_DP_GRAD] = collective_time_s(ALL_REDUCE, dc, t, dense_max * work.grad_bytes, tiers) + \
            collective_time_s(ALL_REDUCE, edp, edp_stride, expert_max * work.grad_bytes, tiers)
        costs[C_DP_PARAM] = 0.0
    opt_shard = dense_max / dc + expert_max / edp if zero >= 1 else params_max
    costs[C_OPT] = optimizer_step_s(optimizer, opt_shard, dev)

    # ---- host offload over the full-duplex host link, hidden behind each layer's compute
    for i in range(C_OFF_DF, C_WOFF_MB + 1):
        costs[i] = 0.0
    if off_act != 0 or off_w != 0:
        kept = RECOMPUTE_NONE if recompute == RECOMPUTE_FULL else recompute  # a layer not recomputed keeps this
        act_d = 0.0
        act_m = 0.0
        if off_act != 0:  # all but the layer input goes to the host and comes back for the backward
            inp = layer_input_bytes(b, s, t, c, sp, model, ab)
            act_d = activation_bytes_per_layer(b, s, t, c, sp, kept, flash, model, ab) - inp
            act_m = moe_activation_bytes_per_layer(b, s, t, c, sp, kept, flash, model, ab, work.moe_imbalance) - inp
        w_d = lp if off_w != 0 else 0.0
        w_m = moe_dense + moe_expert if off_w != 0 else 0.0
        wb = work.weight_bytes
        gb = work.grad_bytes
        # forward: activations out, weights in; backward: activations and weights in, gradients out
        costs[C_OFF_DF] = host_exposed_s(act_d, w_d * wb, layer_fwd, dev)
        costs[C_OFF_DB] = host_exposed_s(w_d * gb, act_d + w_d * wb, layer_bwd, dev)
        costs[C_WOFF_DF] = host_exposed_s(0.0, w_d * wb, layer_fwd, dev)
        costs[C_WOFF_DB] = host_exposed_s(w_d * gb, w_d * wb, layer_bwd, dev)
        if model.experts > 0:
            costs[C_OFF_MF] = host_exposed_s(act_m, w_m * wb, moe_f, dev)
            costs[C_OFF_MB] = host_exposed_s(w_m * gb, act_m + w_m * wb, moe_b, dev)
            costs[C_WOFF_MF] = host_exposed_s(0.0, w_m * wb, moe_f, dev)
            costs[C_WOFF_MB] = host_exposed_s(w_m * gb, w_m * wb, moe_b, dev)
    costs[C_LAYER_FWD] = layer_fwd
    costs[C_LAYER_BWD] = layer_bwd
    costs[C_TP_LAYER] = tp_layer
    costs[C_CP_F] = cp_f
    costs[C_CP_B] = cp_b
    costs[C_RC_COMPUTE] = rc_compute
    costs[C_RC_COMM] = rc_comm
    costs[C_RC_MOE] = rc_moe
    costs[C_RC_EP] = rc_ep
    costs[C_EMB_F] = emb_f
    costs[C_EMB_B] = emb_b
    costs[C_EMB_COMM] = emb_comm
    costs[C_HEAD_F] = head_f
    costs[C_HEAD_B] = head_b
    costs[C_HEAD_COMM] = head_comm
    costs[C_LOGITS] = logits
    costs[C_PARAMS_MAX] = params_max
    costs[C_LAYER_WGRAD] = w1 + w2 + w3 + w4
    costs[C_HEAD_WGRAD] = hw
    costs[C_MOE_FWD] = moe_f
    costs[C_MOE_BWD] = moe_b
    costs[C_MOE_WGRAD] = moe_w
    costs[C_EP_F] = ep_f
    costs[C_EP_B] = ep_b
    costs[C_MOE_BUFFER] = buffers
    costs[C_MTP_F] = mtp_f
    costs[C_MTP_B] = mtp_b
    costs[C_MTP_W] = mtp_w
    costs[C_DISPATCH] = one_dispatch
    costs[C_EROWS] = m_e
    costs[C_EEFF] = e_eff
    costs[C_EP_DISP] = disp
    costs[C_EP_COMB] = comb
    costs[C_EXPERT_F] = experts_f
    costs[C_EXPERT_B] = experts_b
    costs[C_EXPERT_W] = experts_w


@jit
def layers_pass_s(costs, nd: float, nm: float, recompute: int, rc_layers: float):
    """Seconds of ``nd`` dense and ``nm`` MoE layers of one micro-batch:
    (forward with its communication, backward with recompute and communication,
    weight-gradient GEMMs inside that backward, recompute, TP, EP communication,
    exposed host offload). With full recompute and ``rc_layers`` > 0 only the
    last ``rc_layers`` layers recompute; the others keep their activations (and
    offload them, where activations are offloaded). An MoE layer's recompute
    (``C_RC_MOE``, ``C_RC_EP``) is its forward with full recompute, the dispatch
    with moe-dispatch, and a dense layer's otherwise."""
    rc_moe = costs[C_RC_MOE]
    rc_ep = costs[C_RC_EP]
    fr_d, fr_m = recomputed_layers(recompute, rc_layers, nd, nm)
    rc_d = nd
    rc_m = nm
    if recompute == RECOMPUTE_FULL:  # only the recomputed layers (all, or the last rc_layers)
        rc_d = fr_d
        rc_m = fr_m
    n = nd + nm
    rc_n = rc_d + rc_m
    off_f = (nd - fr_d) * costs[C_OFF_DF] + fr_d * costs[C_WOFF_DF] + (nm - fr_m) * costs[C_OFF_MF] + \
        fr_m * costs[C_WOFF_MF]
    off_b = (nd - fr_d) * costs[C_OFF_DB] + fr_d * costs[C_WOFF_DB] + (nm - fr_m) * costs[C_OFF_MB] + \
        fr_m * costs[C_WOFF_MB]
    tp = 2.0 * n * costs[C_TP_LAYER] + rc_n * costs[C_RC_COMM]
    ep = nm * (costs[C_EP_F] + costs[C_EP_B]) + rc_m * rc_ep
    fwd = (nd * costs[C_LAYER_FWD] + nm * costs[C_MOE_FWD] + n * (costs[C_TP_LAYER] + costs[C_CP_F])
           + nm * costs[C_EP_F] + off_f)
    rc = rc_d * costs[C_RC_COMPUTE] + rc_m * (rc_moe + rc_ep) + rc_n * costs[C_RC_COMM]
    bwd = (nd * costs[C_LAYER_BWD] + nm * (costs[C_MOE_BWD] + costs[C_EP_B]) + rc
           + n * (costs[C_TP_LAYER] + costs[C_CP_B]) + off_b)
    wgrad = nd * costs[C_LAYER_WGRAD] + nm * costs[C_MOE_WGRAD]
    return fwd, bwd, wgrad, rc, tp, ep, off_f + off_b


@jit
def stage_pass_s(stage, pp, model, costs, recompute, rc_layers):
    """One micro-batch through pipeline stage ``stage`` of ``pp`` (its layers, the
    embedding on the first, LM head, loss and MTP on the last): (forward, backward,
    weight-gradient part, recompute, TP, EP, offload, CP seconds)."""
    n = device_layers(stage, pp, model.layers)
    nd = device_dense_layers(stage, pp, model)
    fwd, bwd, wgrad, rc, tp_time, ep_time, off_time = layers_pass_s(costs, nd, n - nd, recompute, float(rc_layers))
    cp_time = n * (costs[C_CP_F] + costs[C_CP_B])
    if stage == 0:
        fwd += costs[C_EMB_F] + costs[C_EMB_COMM]
        bwd += costs[C_EMB_B]
        tp_time += costs[C_EMB_COMM]
    if stage == pp - 1:
        fwd += costs[C_HEAD_F] + costs[C_HEAD_COMM] + costs[C_MTP_F]
        bwd += costs[C_HEAD_B] + costs[C_MTP_B]
        tp_time += costs[C_HEAD_COMM]
        wgrad += costs[C_HEAD_WGRAD] + costs[C_MTP_W]
    return fwd, bwd, wgrad, rc, tp_time, ep_time, off_time, cp_time


@jit
def evaluate_one(tp, pp, dp, cp, vpp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp,
                 placement, dispatch, tbo, rc_layers, off_act, off_w, n_micro, model, dev, tiers, tiles, work, out):
    """Fill ``out`` (length N_OUT) for one candidate."""
    costs = np.empty(N_COST, dtype=np.float64)
    row_costs(tp, pp, dp, cp, mb, recompute, sp_flag, tp_overlap, zero, optimizer, schedule, ep, etp, placement,
              dispatch, tbo, off_act, off_w, model, dev, tiers, tiles, work, costs)
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

    # ---- per device: forward and backward of one micro-batch
    t_max = -1.0
    t_sum = 0.0
    best_compute = 0.0
    best_tp = 0.0
    best_cp = 0.0
    best_ep = 0.0
    best_off = 0.0
    best_f = 0.0
    best_b = 0.0
    best_rc = 0.0
    best_w = 0.0
    for stage in range(pp):
        fwd, bwd, wgrad, rc, tp_time, ep_time, off_time, cp_time = stage_pass_s(stage, pp, model, costs, recompute,
                                                                               rc_layers)
        total = fwd + bwd
        t_sum += total
        if total > t_max:
            t_max = total
            best_tp = tp_time
            best_cp = cp_time
            best_ep = ep_time
            best_compute = total - tp_time - cp_time - ep_time - off_time
            best_off = off_time
            best_f = fwd
            best_b = bwd
            best_rc = rc
            best_w = wgrad

    # ---- pipeline schedule (closed form over unequal stages)
    t_steady = t_max  # the busiest device's work per micro-batch
    if schedule == SCHEDULE_INTERLEAVED:
        pipe = m * t_max + (t_sum - t_max) / v
    elif schedule == SCHEDULE_ZB_H1:  # W passes fill the cool-down: (p-1)(F+B-W) instead of (p-1)(F+B+W)
        pipe = m * t_max + (t_sum - t_max) * max(0.0, t_max - 2.0 * best_w) / t_max
    elif schedule == SCHEDULE_DUALPIPE:  # DeepSeek-V3 Table 2: (p/2-1)(F&B + B - 3W), B the full backward, here
        # F&B = F + B (not overlapped); (p/2-1) t generalised as (t_sum - 2 t_max)/2. Published for m >= 2p:
        # never below one micro-batch's round trip through every stage (t_sum)
        # Every device runs m/2 micro-batches through each of its two stages, so its steady work is
        # m (t_d + t_(p-1-d)) / 2: the heavy first and last stages share device 0, not m t_max each
        t_steady = 0.0
        for dd in range(pp // 2):
            f0, b0, _, _, _, _, _, _ = stage_pass_s(dd, pp, model, costs, recompute, rc_layers)
            f1, b1, _, _, _, _, _, _ = stage_pass_s(pp - 1 - dd, pp, model, costs, recompute, rc_layers)
            t_steady = max(t_steady, 0.5 * (f0 + b0 + f1 + b1))
        pipe = m * t_steady + max(0.0, t_sum - 2.0 * t_max) / 2.0 * max(0.0, t_max + best_b - 3.0 * best_w) / t_max
        pipe = max(pipe, t_sum)
    elif schedule == SCHEDULE_PIPEDREAM:  # asynchronous, no flush: the fill and drain happen once per run
        pipe = m * t_max
    else:
        pipe = m * t_max + (t_sum - t_max)
    bubble = pipe - m * t_steady
    t_p2p = costs[C_P2P]
    pp_comm = 2.0 * (p - 1.0) * t_p2p * (v if schedule == SCHEDULE_INTERLEAVED else 1.0)

    # ---- data parallel (gradients over the DP x CP group, stride tp; experts over expert DP)
    dc = d * c
    _, edp, _ = ep_strides(t, c, d, float(ep), float(etp), placement)
    dp_comm = 0.0
    if dc > 1 or edp > 1:
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
    out[O_EP] = m * best_ep
    out[O_DISPATCH] = costs[C_DISPATCH]
    out[O_EROWS] = costs[C_EROWS]
    out[O_EEFF] = costs[C_EEFF]
    out[O_PP] = pp_comm
    out[O_DP] = dp_comm
    out[O_BUBBLE] = bubble
    # the per-stage parts above count m passes of the slowest stage; a DualPipe device runs
    # two stages, m / 2 passes each, so its steady work is m * t_steady <= m * t_max
    out[O_CREDIT] = m * (t_steady - t_max)
    out[O_OPT] = optimizer_s
    out[O_RECOMPUTE] = m * best_rc
    out[O_OFFLOAD] = m * best_off
    out[O_FWD] = best_f
    out[O_BWD] = best_b
    devices = t * p * d * c  # the row's cluster (a space may sweep several sizes)
    out[O_TOKENS] = work.global_batch * s / (step * devices)
    flop = 3.0 * work.global_batch * model_flop_per_sequence(model, s)
    out[O_FLOP] = flop
    out[O_MFU] = flop / (step * devices * dev.peak_flops_per_s)

    # ---- memory per device; the peak over stages
    # a layer that is not recomputed keeps keep_*; a fully recomputed one only its input
    # (act_*: what the row's recompute setting keeps, none_*: everything)
    is_moe = model.experts > 0 and model.dense_layers < model.layers
    kept = RECOMPUTE_NONE if recompute == RECOMPUTE_FULL else recompute
    none_dense = activation_bytes_per_layer(b, s, t, c, sp, RECOMPUTE_NONE, flash, model, ab)
    act_dense = activation_bytes_per_layer(b, s, t, c, sp, recompute, flash, model, ab)
    keep_dense = none_dense if kept == RECOMPUTE_NONE else act_dense
    act_moe = 0.0
    keep_moe = 0.0
    none_moe = 0.0
    if is_moe:
        imb = work.moe_imbalance
        none_moe = moe_activation_bytes_per_layer(b, s, t, c, sp, RECOMPUTE_NONE, flash, model, ab, imb)
        act_moe = moe_activation_bytes_per_layer(b, s, t, c, sp, recompute, flash, model, ab, imb)
        keep_moe = none_moe if kept == RECOMPUTE_NONE else act_moe
    # while a layer's backward recomputes, what it did not keep lives again for that one layer:
    # (all of it) - (what is kept), so more recompute never needs more memory
    work_layer = none_dense - act_dense
    if is_moe:
        work_layer = max(work_layer, none_moe - act_moe)
    lp = layer_params(model, t)
    inp = layer_input_bytes(b, s, t, c, sp, model, ab)
    # the largest unit streamed with weight offload: a layer, or the embedding / head
    unit = max(lp, model.vocab * model.hidden / t)
    if is_moe:
        moe_d, moe_e = moe_layer_params(model, t, float(ep), float(etp))
        unit = max(unit, moe_d + moe_e)
    parts = param_parts(model, t, float(ep), float(etp))
    fixed_overhead = fixed_overhead_bytes(t, c, d, p, float(ep), float(etp), edp, is_moe, dev)
    peak = -1.0
    host_peak = 0.0
    for stage in range(pp):
        n = device_layers(stage, pp, model.layers)
        nd = device_dense_layers(stage, pp, model)
        dense, expert = stage_params_from(stage, pp, parts, model)
        params = dense + expert
        host = 0.0
        grads = 0.0
        host_state = work.optimizer_bytes * OPT_HOST_STATE_FRACTION[optimizer]
        if host_state > 0:  # CPU Adam's fp32 master and moments, paged 8-bit Adam's moments: on the host
            host += (dense / dc + expert / edp) * host_state if zero >= 1 else params * host_state
        if off_w != 0:  # weights and gradients on the host, the current and the prefetched unit on the device
            host += params * (work.weight_bytes + work.grad_bytes)
            params_dev = min(params, 2.0 * unit)
            weights = params_dev * work.weight_bytes
            grads = params_dev * work.grad_bytes
        elif zero >= 3:  # own shard + the gathered current and prefetched layers, at most all of them
            weights = min(params, dense / dc + expert / edp + 2.0 * lp) * work.weight_bytes
        else:
            weights = params * work.weight_bytes
        if off_w == 0:
            grads = (dense / dc + expert / edp) * work.grad_bytes if zero >= 2 else params * work.grad_bytes
        state = work.optimizer_bytes * OPT_STATE_FRACTION[optimizer]
        optim = (dense / dc + expert / edp) * state if zero >= 1 else params * state
        chunks = in_flight_chunks(schedule, p, v, m, float(stage))
        fr_d, fr_m = recomputed_layers(recompute, float(rc_layers), nd, n - nd)
        per_chunk = (nd - fr_d) * keep_dense + (n - nd - fr_m) * keep_moe + (fr_d + fr_m) * inp
        host_chunk = 0.0
        if off_act != 0:  # only layer inputs stay; the rest waits on the host, two layers' worth in flight
            host_chunk = per_chunk - n * inp
            per_chunk = n * inp
        if schedule == SCHEDULE_INTERLEAVED:
            per_chunk /= v
            if off_act != 0:
                host_chunk /= v
        acts = chunks * per_chunk + work_layer
        off_layers = n - fr_d - fr_m  # layers whose activations go to the host
        if off_act != 0 and off_layers > 0:
            # the layer in its backward and the one being fetched are back on the device
            # (never more layers than were offloaded, so offloading never adds memory)
            keep_off = keep_dense if nd - fr_d > 0 else 0.0
            if n - nd - fr_m > 0:
                keep_off = max(keep_off, keep_moe)
            back = min(2.0, chunks * off_layers)
            host += chunks * host_chunk - back * (keep_off - inp)
            acts += back * (keep_off - inp)
        if stage == pp - 1:
            acts += 4.0 * costs[C_LOGITS]  # fp32 logits of the loss, one micro-batch
            acts += chunks * model.mtp_depth * (act_moe if model.experts > 0 else act_dense)
        # ---- parameter copies of DualPipe and PipeDream (modeling.md section 6)
        if schedule == SCHEDULE_DUALPIPE:  # stage `stage` and stage p-1-stage: two copies of the parameters
            twin_dense, twin_expert = stage_params_from(pp - 1 - stage, pp, parts, model)
            dual_copies = (params + twin_dense + twin_expert) / params
            weights *= dual_copies
            grads *= dual_copies
            optim *= dual_copies
            if stage == 0 and pp > 1:  # device 0 also runs the upward direction's last stage and its loss
                acts += 4.0 * costs[C_LOGITS]
                acts += chunks * model.mtp_depth * (act_moe if model.experts > 0 else act_dense)
        elif schedule == SCHEDULE_PIPEDREAM:  # weight stashing: p - stage versions, one gradient and optimizer state
            weights += (p - stage - 1.0) * params * work.weight_bytes
        buffers = costs[C_MOE_BUFFER] if n > nd else 0.0
        host_peak = max(host_peak, host)
        tensors = weights + grads + optim + acts + buffers
        overhead = fixed_overhead + dev.memory_fragmentation * tensors
        total = tensors + overhead
        if total > peak:
            peak = total
            out[O_MOV] = overhead
            out[O_MW] = weights
            out[O_MG] = grads
            out[O_MO] = optim
            out[O_MA] = acts
            out[O_MMOE] = buffers
            out[O_MHOST] = host
            out[O_MSTAGE] = stage
    out[O_MPEAK] = peak
    host_fits = host_peak <= dev.host_capacity_bytes  # every device's host share must fit
    fits = peak <= dev.hbm_capacity_bytes and host_fits
    out[O_FEAS] = 1.0 if fits else 0.0
    out[O_REASON] = FEASIBLE_OK if fits else (FEASIBLE_OUT_OF_MEMORY if peak > dev.hbm_capacity_bytes
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
