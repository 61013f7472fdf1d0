"""Communication of the parallel dimensions around one layer and one step: TP
collectives (overlapped with their GEMMs or not), the CP ring, the vocab-parallel
embedding's and loss's TP traffic, pipeline messages, and the gradient reduction
and parameter gathers of DP / ZeRO (dense over DP x CP, experts over expert DP).

Rank layout: TP innermost, then CP, DP, PP outermost (Megatron's default
order), so TP groups have stride 1, CP stride tp, the DP x CP gradient group
stride tp, and neighbouring pipeline stages are tp*cp*dp devices apart. MoE
layers re-use the tp * cp * dp ranks of a stage as expert TP (innermost) x EP x
expert DP (``ep_strides``).
"""

from __future__ import annotations

from paraspace.kernels.codes import ALL_GATHER, ALL_REDUCE, PLACEMENT_OUTER, REDUCE_SCATTER, SEND_RECV, ZERO_3_DEFERRED
from paraspace.kernels.collectives import collective_time_s
from paraspace.kernels.jit import jit

#: chunks a TP collective is split into when overlapped with its GEMM
TP_OVERLAP_CHUNKS = 4.0


@jit
def overlapped_s(comm: float, compute: float) -> float:
    """Exposed time of a collective chunked into TP_OVERLAP_CHUNKS and pipelined
    with a GEMM: its first chunk cannot hide, the rest hides behind the GEMM."""
    first = comm / TP_OVERLAP_CHUNKS
    return first + max(0.0, comm - first - compute)


@jit
def ep_strides(t: float, c: float, d: float, ep: float, etp: float, placement: int):
    """(EP group stride, expert-DP size, expert-DP stride) in a stage's t * c * d ranks,
    laid out expert TP innermost, then EP and expert DP (swapped when outer)."""
    edp = max(1.0, t * c * d / (ep * etp))
    if placement == PLACEMENT_OUTER:
        return etp * edp, edp, etp
    return etp, edp, etp * ep


@jit  # not inlined: layer_costs calls it for both directions
def tp_layer_comm_s(sh, tp_overlap: int, qkv: float, out: float, up: float, down: float, backward: bool,
                    tiers) -> float:
    """One direction of a layer's TP collectives: all-reduce after attention and
    MLP, or with sequence parallelism all-gather before and reduce-scatter after
    each; with ``tp_overlap`` each chunked behind its GEMM of that direction
    (``qkv`` ... ``down``: forward GEMMs, or in the ``backward`` the input-gradient
    ones). Forward, the all-gather feeds QKV and MLP up and the reduce-scatter
    leaves out-proj and MLP down; backward, the roles swap: the reduce-scatter
    leaves the QKV and MLP-up input gradients and the all-gather feeds out-proj's
    and MLP down's."""
    t = sh.t
    msg = sh.tokens * sh.h * sh.ab
    if sh.sp and tp_overlap != 0:
        # chunked overlap: each all-gather hides behind the GEMM it feeds (QKV, MLP up),
        # each reduce-scatter behind the GEMM that produces it (out-proj, MLP down),
        # except its first chunk and whatever outlasts the GEMM
        ag = collective_time_s(ALL_GATHER, t, 1.0, msg, tiers)
        rs = collective_time_s(REDUCE_SCATTER, t, 1.0, msg, tiers)
        if backward:
            ag, rs = rs, ag
        return overlapped_s(ag, qkv) + overlapped_s(rs, out) + overlapped_s(ag, up) + overlapped_s(rs, down)
    if sh.sp:
        return 2.0 * collective_time_s(ALL_GATHER, t, 1.0, msg, tiers) + 2.0 * collective_time_s(
            REDUCE_SCATTER, t, 1.0, msg, tiers)
    return 2.0 * collective_time_s(ALL_REDUCE, t, 1.0, msg, tiers)


@jit(inline=True)
def cp_ring_s(sh, model, rope_width: float, core_f: float, core_b: float, tiers):
    """(forward, backward) exposed seconds of ring attention: K and V chunks pass
    c - 1 times, overlapped with the attention core (``core_f``, ``core_b``)."""
    cp_f = 0.0
    cp_b = 0.0
    if sh.c > 1.0:
        b = sh.b
        s = sh.s
        c = sh.c
        kv_chunk = b * (s / c) * 2.0 * (rope_width - sh.heads * (model.qk_rope_head_dim if model.mla > 0 else 0.0)) \
            * sh.ab
        if model.mla <= 0:
            kv_chunk = b * (s / c) * 2.0 * (model.kv_heads / sh.t * model.head_dim) * sh.ab
        ring = (c - 1.0) * collective_time_s(SEND_RECV, c, sh.t, kv_chunk, tiers)
        cp_f = max(0.0, ring - core_f)
        cp_b = max(0.0, 2.0 * ring - core_b)
    return cp_f, cp_b


@jit(inline=True)
def embedding_head_comm_s(sh, tiers):
    """TP seconds of the vocab-parallel embedding (its output reduced, with SP
    scattered and gathered again) and of the LM head's loss (max and sum, with SP
    the head's input gathered and its gradient scattered)."""
    t = sh.t
    msg = sh.tokens * sh.h * sh.ab
    emb = collective_time_s(REDUCE_SCATTER if sh.sp else ALL_REDUCE, t, 1.0, msg, tiers)
    if sh.sp:
        emb += collective_time_s(ALL_GATHER, t, 1.0, msg, tiers)
    head = 2.0 * collective_time_s(ALL_REDUCE, t, 1.0, 4.0 * sh.tokens, tiers)  # max and sum of the loss
    if sh.sp:
        head += collective_time_s(ALL_GATHER, t, 1.0, msg, tiers) + collective_time_s(REDUCE_SCATTER, t, 1.0, msg, tiers)
    return emb, head


@jit(inline=True)
def p2p_s(sh, tiers) -> float:
    """One pipeline message: a micro-batch's activations (split by t with SP) to the next stage."""
    msg = sh.tokens * sh.h * sh.ab
    return collective_time_s(SEND_RECV, sh.p, sh.t * sh.c * sh.d, msg / sh.t if sh.sp else msg, tiers)


@jit(inline=True)
def dp_sync_s(zero: int, sh, placement: int, layers_max: float, layer_dense: float, layer_expert: float,
              pass_dense: float, dense_max: float, expert_max: float, tiers, work):
    """(gradient reduction, parameter gather) seconds of the device with the most
    parameters: all-reduce without ZeRO; reduce-scatter and all-gather with
    ZeRO-1/2; with ZeRO-3 / FSDP one collective per layer of one pass, the
    embedding / head / final norm as one more unit."""
    t = sh.t
    dc = sh.d * sh.c
    _, edp, edp_stride = ep_strides(t, sh.c, sh.d, sh.e, sh.et, placement)
    if zero >= 3:  # ZeRO-3 / FSDP gathers and scatters layer by layer: one collective per layer
        rest = max(0.0, pass_dense - layers_max * layer_dense)  # embedding / head / final norm, as one unit
        grad = layers_max * (
            collective_time_s(REDUCE_SCATTER, dc, t, layer_dense * work.grad_bytes, tiers)
            + collective_time_s(REDUCE_SCATTER, edp, edp_stride, layer_expert * work.grad_bytes, tiers)) + \
            collective_time_s(REDUCE_SCATTER, dc, t, rest * work.grad_bytes, tiers)
        param = layers_max * (
            collective_time_s(ALL_GATHER, dc, t, layer_dense * work.weight_bytes, tiers)
            + collective_time_s(ALL_GATHER, edp, edp_stride, layer_expert * work.weight_bytes, tiers)) + \
            collective_time_s(ALL_GATHER, dc, t, rest * work.weight_bytes, tiers)
    elif zero >= 1:
        grad = collective_time_s(REDUCE_SCATTER, dc, t, dense_max * work.grad_bytes, tiers) + \
            collective_time_s(REDUCE_SCATTER, edp, edp_stride, expert_max * work.grad_bytes, tiers)
        param = collective_time_s(ALL_GATHER, dc, t, dense_max * work.weight_bytes, tiers) + \
            collective_time_s(ALL_GATHER, edp, edp_stride, expert_max * work.weight_bytes, tiers)
    else:
        grad = collective_time_s(ALL_REDUCE, dc, t, dense_max * work.grad_bytes, tiers) + \
            collective_time_s(ALL_REDUCE, edp, edp_stride, expert_max * work.grad_bytes, tiers)
        param = 0.0
    return grad, param


@jit(inline=True)
def exposed_dp_s(zero: int, dc: float, edp: float, m: float, busy: float, fwd: float, bwd: float, grad: float,
                 param: float) -> float:
    """Data-parallel seconds not hidden: ZeRO-3 gathers for forward and backward
    and scatters gradients every micro-batch (hidden behind the ``busy`` seconds
    of the m passes, ``kernels.schedules.busy_s``); with
    deferred reduction (``ZERO_3_DEFERRED``) it gathers every micro-batch and
    scatters the accumulated gradients once (m = 1: the same as without);
    otherwise the reduction overlaps the last backward and the gather the
    first forward."""
    if dc > 1 or edp > 1:
        if zero == ZERO_3_DEFERRED:
            return max(0.0, m * 2.0 * param + grad - busy)
        if zero >= 3:  # per micro-batch: gather for forward and backward, scatter gradients
            per_micro = 2.0 * param + grad
            return max(0.0, m * per_micro - busy)
        return max(0.0, grad - bwd) + max(0.0, param - fwd)  # reduce with the last backward, gather with the first forward
    return 0.0
