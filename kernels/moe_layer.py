"""One MoE layer on one device, one micro-batch: the attention part of a dense
layer plus router, dispatch, grouped expert GEMMs, shared experts and combine
(``kernels.moe`` for the dispatch algorithms). Each rank dispatches its 1/tp
share of the micro-batch's tokens; the EP group lies in the stage's ranks as
``kernels.parallel_comm.ep_strides`` lays it out. modeling.md section 5.
"""

from __future__ import annotations

from collections import namedtuple

from paraspace.kernels.codes import ALL_GATHER, RECOMPUTE_FULL, RECOMPUTE_MOE_DISPATCH, RECOMPUTE_SELECTIVE_OPS, \
    REDUCE_SCATTER, SCHEDULE_DUALPIPE
from paraspace.kernels.collectives import collective_time_s
from paraspace.kernels.elementwise import activation_s
from paraspace.kernels.gemm_passes import gemm_passes_s
from paraspace.kernels.jit import jit
from paraspace.kernels.moe import combine_s, dispatch_s, grouped_gemm_fwd_bwd_s, local_pass_s, staging_bytes, \
    two_batch_exposed_s
from paraspace.kernels.ops import gemm_efficiency, memory_bound_s
from paraspace.kernels.recompute import ops_attention_s
from paraspace.kernels.routing import layer_imbalance

#: One MoE layer's costs (seconds unless noted): forward, backward and the
#: weight-gradient GEMMs inside it; exposed EP communication forward /
#: backward; the dispatch buffers (bytes); one dispatch with its local passes;
#: routed rows per expert of the busiest rank and the gate/up GEMM's efficiency
#: at them; the raw dispatch and combine traffic; the expert compute (routed +
#: shared) forward, backward and W; what its recompute adds to the backward
#: (compute, and EP communication).
MoeLayer = namedtuple("MoeLayer", ("fwd", "bwd", "wgrad", "ep_f", "ep_b", "buffers", "one_dispatch", "rows",
                                   "efficiency", "disp", "comb", "experts_f", "experts_b", "experts_w", "rc", "rc_ep"))


@jit(inline=True)
def routed_experts_s(sh, model, dev, tiles, imb: float):
    """The router and the routed experts of this rank: (router GEMM forward,
    backward, W; softmax and top-k; rows per local expert on the busiest rank;
    grouped gate/up and down GEMMs' W; experts forward, backward). ``imb``: the
    busiest rank's rows over the mean (``kernels.routing``); its grouped GEMM
    shares them evenly over its local experts (a grouped GEMM's time is about
    the sum of its groups', so the rank's total is what counts)."""
    h = sh.h
    ab = sh.ab
    n_exp = model.experts
    fe = model.expert_ffn
    t_rank = sh.tokens / sh.t  # this rank's share of the micro-batch's tokens
    rf, rb, rw = gemm_passes_s(t_rank, n_exp, h, dev, tiles, ab)
    router = memory_bound_s(3.0 * 4.0 * t_rank * n_exp, 2.0, dev)  # softmax and top-k over fp32 logits
    groups = n_exp / sh.e
    m_e = sh.e * sh.et * t_rank * model.top_k * imb / n_exp  # rows per local expert, busiest rank
    g1f, g1b, g1w = grouped_gemm_fwd_bwd_s(groups, m_e, 2.0 * fe / sh.et, h, dev, tiles, ab)
    g2f, g2b, g2w = grouped_gemm_fwd_bwd_s(groups, m_e, h, fe / sh.et, dev, tiles, ab)
    g_act = activation_s(sh, groups * m_e * fe / sh.et, True, dev)
    return rf, rb, rw, router, m_e, g1w, g2w, g1f + g2f + g_act, g1b + g2b + 2.0 * g_act


@jit(inline=True)
def shared_experts_s(sh, model, dev, tiles):
    """(forward, backward, W) seconds of the shared experts, a dense gated MLP split by t."""
    if model.shared_experts <= 0:
        return 0.0, 0.0, 0.0
    width = model.shared_experts * model.expert_ffn / sh.t
    s1f, s1b, s1w = gemm_passes_s(sh.tokens, 2.0 * width, sh.h, dev, tiles, sh.ab)
    s2f, s2b, s2w = gemm_passes_s(sh.tokens, sh.h, width, dev, tiles, sh.ab)
    s_act = activation_s(sh, sh.tokens * width, True, dev)
    return s1f + s2f + s_act, s1b + s2b + 2.0 * s_act, s1w + s2w


@jit(inline=True)
def ep_traffic_s(sh, ep_stride: float, dispatch: int, model, dev, tiers, imb: float, dispatch_bytes: float):
    """(local permute pass, dispatch, combine) seconds of one MoE layer's
    micro-batch; with expert TP the dispatched rows are gathered among its ranks
    and the outputs scattered back. ``imb``: the busiest rank's rows over the
    mean (its permute and expert-TP passes move that many). A dispatch moves
    ``dispatch_bytes`` per element (``kernels.params.DISPATCH_BYTES``), a combine
    the activations' width: the backward's dispatch-shaped transfer (the
    gradients before the down projections) and combine-shaped one are the
    forward's, so the two sums match."""
    k = model.top_k
    t_rank = sh.tokens / sh.t
    tok_bytes = t_rank * sh.h * sh.ab
    sent_bytes = t_rank * sh.h * dispatch_bytes
    local = local_pass_s(dispatch, tok_bytes, sh.e, k, imb, dev)  # permute before, unpermute after
    disp, _, _ = dispatch_s(dispatch, sent_bytes, sh.e, ep_stride, model.experts, k, model.max_nodes, tiers)
    comb = combine_s(dispatch, tok_bytes, sh.e, ep_stride, model.experts, k, model.max_nodes, tiers)
    if sh.et > 1.0:  # expert TP: the dispatched rows gathered among its ranks, the outputs scattered back
        rows = sh.et * t_rank * k * imb * sh.h
        disp += collective_time_s(ALL_GATHER, sh.et, 1.0, rows * dispatch_bytes, tiers)
        comb += collective_time_s(REDUCE_SCATTER, sh.et, 1.0, rows * sh.ab, tiers)
    return local, disp, comb


@jit(inline=True)
def ep_exposed_s(disp: float, comb: float, compute_f: float, compute_b: float, tbo: int, schedule: int):
    """(forward, backward) EP seconds not hidden: all of dispatch + combine, or with
    two-batch overlap what outlasts the other half-batch's expert compute."""
    if tbo != 0:
        ep_f = two_batch_exposed_s(disp, comb, compute_f)
        ep_b = two_batch_exposed_s(comb, disp, compute_b)
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
        ep_f = min(ep_f, max(0.0, disp + comb - compute_b))
        ep_b = min(ep_b, max(0.0, comb + disp - compute_f))
    return ep_f, ep_b


@jit(inline=True)
def moe_layer_s(sh, att, ep_stride: float, recompute: int, rc_dense: float, dispatch: int, tbo: int, schedule: int,
                model, dev, tiers, tiles, work):
    """The ``MoeLayer`` of one MoE layer (all zeros on a dense model, whose
    recompute is ``rc_dense``); ``att``: its attention part (``Attention``). It
    recomputes what a dense layer does, or its whole forward with full
    recompute, or only the dispatch with moe-dispatch, or with selective-ops
    only what the policy redoes of its attention part."""
    if model.experts <= 0:
        return MoeLayer(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, rc_dense, 0.0)
    imb = layer_imbalance(sh, model, work)  # busiest EP rank's routed rows over the mean
    rf, rb, rw, router, m_e, g1w, g2w, expert_f, expert_b = routed_experts_s(sh, model, dev, tiles, imb)
    sh_f, sh_b, sh_w = shared_experts_s(sh, model, dev, tiles)
    local, disp, comb = ep_traffic_s(sh, ep_stride, dispatch, model, dev, tiers, imb, work.dispatch_bytes)
    ep_f, ep_b = ep_exposed_s(disp, comb, expert_f + sh_f, expert_b + sh_b, tbo, schedule)
    moe_f = att.part_f + rf + router + 2.0 * local + expert_f + sh_f
    moe_b = att.part_b + rb + 2.0 * router + 2.0 * local + expert_b + sh_b
    moe_w = att.qkv_w + att.out_w + rw + g1w + g2w + sh_w
    buffers = staging_bytes(dispatch, sh.tokens / sh.t * sh.h, sh.ab, work.dispatch_bytes, sh.e, model.top_k, imb)
    e_eff = gemm_efficiency(m_e, 2.0 * model.expert_ffn / sh.et, sh.h, dev, tiles)
    rc_moe = rc_dense
    rc_ep = 0.0
    if recompute == RECOMPUTE_FULL:  # the forward again, dispatch and combine included
        rc_moe = moe_f
        rc_ep = ep_f
    elif recompute == RECOMPUTE_MOE_DISPATCH:  # the dispatched rows again: permute and dispatch
        rc_moe = local
        rc_ep = disp
    elif recompute == RECOMPUTE_SELECTIVE_OPS:  # the attention part's share; the experts keep their rows
        rc_moe = ops_attention_s(sh, att, model)
    return MoeLayer(moe_f, moe_b, moe_w, ep_f, ep_b, buffers, disp + local, m_e, e_eff, disp, comb, expert_f + sh_f,
                    expert_b + sh_b, g1w + g2w + sh_w, rc_moe, rc_ep)
