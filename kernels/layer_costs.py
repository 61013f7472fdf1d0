"""One layer's costs, computed once per distinct layer shape and shared by every
row that has it.

Most of a candidate's cost vector (``kernels.cost_vector``) is what one layer
costs on one device for one micro-batch: its attention, dense MLP or MoE layer,
their TP / CP / EP communication, recompute and host offload, and the
embedding, LM head and MTP modules of the end stages (``layer_costs``). Those
depend on a handful of a row's columns (its ``layer_key``), not on the
pipeline depth, virtual stages, micro-batch count, ZeRO stage or optimizer
that rows of a space mostly differ in: the 222,552 candidates of the Calculon
benchmark space hold 1,536 layer keys. ``kernels.training.evaluate_rows``
groups rows by ``layer_keys`` (``kernels.row_groups``), evaluates each group's
first row once (``layer_cost_table``) and copies its vector to every row of
the group; ``kernels.training.row_costs`` calls ``layer_costs`` on its one row,
so the event tier and the per-row path give the same bits. With the layer
costs once per group, the measured-GEMM-table lookup (``kernels.ops``) runs a
few hundred times per chunk, not for every row's every GEMM.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from paraspace.kernels.attention import attention_s
from paraspace.kernels.codes import PLACEMENT_OUTER, SCHEDULE_DUALPIPE
from paraspace.kernels.cost_vector import (
    C_CP_B, C_CP_F, C_DISPATCH, C_EEFF, C_EMB_B, C_EMB_COMM, C_EMB_F, C_EP_B, C_EP_COMB, C_EP_DISP, C_EP_F, C_EROWS,
    C_EXPERT_B, C_EXPERT_F, C_EXPERT_W, C_HEAD_B, C_HEAD_COMM, C_HEAD_F, C_HEAD_WGRAD, C_LAYER_BWD, C_LAYER_FWD,
    C_LAYER_WGRAD, C_LOGITS, C_MOE_BUFFER, C_MOE_BWD, C_MOE_FWD, C_MOE_WGRAD, C_MTP_B, C_MTP_F, C_MTP_W, C_RC_COMM,
    C_RC_COMPUTE, C_RC_EP, C_RC_MOE, C_TP_LAYER, C_TP_LAYER_B, N_COST,
)
from paraspace.kernels.gemm_passes import gemm_passes_16bit_s, gemm_passes_s
from paraspace.kernels.jit import jit
from paraspace.kernels.mlp import dense_mlp_s, gemm_cast_s
from paraspace.kernels.moe_layer import moe_layer_s
from paraspace.kernels.offload import offload_costs
from paraspace.kernels.ops import memory_bound_s
from paraspace.kernels.parameters import layer_params, moe_layer_params
from paraspace.kernels.parallel_comm import cp_ring_s, embedding_head_comm_s, ep_strides, tp_layer_comm_s
from paraspace.kernels.recompute import recompute_s
from paraspace.kernels.shape import shape_of


@jit(inline=True)
def end_stage_costs(costs, sh, layer_fwd: float, layer_bwd: float, tp_layer: float, tp_layer_b: float, att, mlp,
                    moe, model, dev, tiers, tiles) -> None:
    """Fill the end stages' slots of ``costs``: the embedding (first stage), the
    output head + loss with their TP traffic, the logits, and the
    multi-token-prediction modules (last stage: per depth one more layer, a
    2h -> h projection and the output head again)."""
    h = sh.h
    ab = sh.ab
    tokens = sh.tokens
    t = sh.t
    # the LM head stays in 16 bits under an 8-bit recipe (Transformer Engine's FP8 covers the
    # transformer layers' linears; torchtitan's Float8 filters out "output"; DeepSeek-V3 keeps
    # its output head in BF16, arXiv 2412.19437 section 3.3). Measured on whole steps
    # (docs/measurements, train_fp8.csv): priced at the 8-bit rate, a 4-6 layer model's FP8
    # step came out 26-33% fast where its layers alone were 11%
    hf, hb, hw = gemm_passes_16bit_s(tokens, model.vocab / t, h, dev, tiles, ab)
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
        mtp_b = model.mtp_depth * (lb + tp_layer_b + pb + hb)
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
def layer_costs(costs, sh, recompute: int, tp_overlap: int, schedule: int, placement: int, dispatch: int, tbo: int,
                off_act: int, off_w: int, model, dev, tiers, tiles, work) -> None:
    """Fill the slots of ``costs`` that one layer decides: its operators, their
    communication and recompute, the end stages' modules and its exposed host
    offload (all but the pipeline message, the DP sync, the optimizer step and
    the largest stage's parameters); ``sh``: the row's ``Shape``."""
    att = attention_s(sh, model, dev, tiles, work)
    mlp = dense_mlp_s(sh, model, dev, tiles)
    layer_fwd = att.part_f + mlp.up_f + mlp.down_f + mlp.act
    layer_bwd = att.part_b + mlp.up_b + mlp.down_b + 2.0 * mlp.act
    if work.gemm_cast_bytes > 0:  # 8-bit GEMMs: cast inputs and weights forward, output gradients backward
        cast_f, cast_b = gemm_cast_s(sh, model, att, dev, work)
        layer_fwd += cast_f
        layer_bwd += cast_b
    tp_layer = tp_layer_comm_s(sh, tp_overlap, att.qkv_f, att.out_f, mlp.up_f, mlp.down_f, False, tiers)
    tp_layer_b = tp_layer_comm_s(sh, tp_overlap, att.qkv_b - att.qkv_w, att.out_b - att.out_w, mlp.up_b - mlp.up_w,
                                 mlp.down_b - mlp.down_w, True, tiers)  # behind the input-gradient GEMMs
    cp_f, cp_b = cp_ring_s(sh, model, att.rope_width, att.core_f, att.core_b, tiers)
    rc_compute, rc_comm = recompute_s(recompute, sh, layer_fwd, tp_layer, cp_f, att, mlp, model, dev,
                                      work.checkpoint_early_stop)
    ep_stride, _, _ = ep_strides(sh.t, sh.c, sh.d, sh.e, sh.et, placement)
    moe = moe_layer_s(sh, att, ep_stride, recompute, rc_compute, dispatch, tbo, schedule, model, dev, tiers, tiles,
                      work)
    end_stage_costs(costs, sh, layer_fwd, layer_bwd, tp_layer, tp_layer_b, att, mlp, moe, model, dev, tiers, tiles)
    moe_dense, moe_expert = moe_layer_params(model, sh.t, sh.e, sh.et)
    offload_costs(costs, sh, recompute, off_act, off_w, layer_params(model, sh.t), moe_dense + moe_expert, layer_fwd,
                  layer_bwd, moe.fwd, moe.bwd, model, dev, work)
    costs[C_LAYER_FWD] = layer_fwd
    costs[C_LAYER_BWD] = layer_bwd
    costs[C_TP_LAYER] = tp_layer
    costs[C_TP_LAYER_B] = tp_layer_b
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


#: columns of a ``layer_key``
N_LAYER_KEY = 15


@jit(inline=True)
def layer_key(tp, dp, cp, mb, recompute, sp, tp_overlap, schedule, ep, etp, placement, dispatch, tbo, off_act, off_w,
              moe: bool):
    """A row's layer key (N_LAYER_KEY integers): the values ``layer_costs``
    reads, 0 where a value cannot change them. Every row: its tensor and context
    parallel sizes, micro-batch, recompute, sequence parallelism (only with
    tp > 1), TP overlap (only with sequence parallelism) and host offload of
    activations and weights; MoE rows also their expert parallel and expert TP
    sizes, dispatch, two-batch overlap, expert placement, whether the schedule
    is DualPipe (``kernels.moe_layer.ep_exposed_s``) and, with experts placed
    outer, the data parallel size (it sets the EP group's stride,
    ``kernels.parallel_comm.ep_strides``)."""
    sp_on = sp != 0 and tp > 1
    e, et, algo, two_batch, outer, dualpipe, d = 0, 0, 0, 0, 0, 0, 0
    if moe:
        e = ep
        et = etp
        algo = dispatch
        two_batch = tbo
        outer = placement
        dualpipe = 1 if schedule == SCHEDULE_DUALPIPE else 0
        d = dp if placement == PLACEMENT_OUTER else 0
    return (np.int32(tp), np.int32(cp), np.int32(mb), np.int32(recompute), np.int32(1 if sp_on else 0),
            np.int32(1 if sp_on and tp_overlap != 0 else 0), np.int32(off_act), np.int32(off_w), np.int32(e),
            np.int32(et), np.int32(algo), np.int32(two_batch), np.int32(outer), np.int32(dualpipe), np.int32(d))


#: columns of a ``layer_key``
N_LAYER_KEY = 15


@jit
def layer_keys(tp, dp, cp, mb, recompute, sp, tp_overlap, schedule, ep, etp, placement, dispatch, tbo, off_act, off_w,
               model):
    """(rows, N_LAYER_KEY) int32 array: each row's ``layer_key``."""
    n = tp.shape[0]
    keys = np.empty((n, N_LAYER_KEY), dtype=np.int32)
    moe = model[0].experts > 0
    for i in prange(n):
        key = layer_key(tp[i], dp[i], cp[i], mb[i], recompute[i], sp[i], tp_overlap[i], schedule[i], ep[i], etp[i],
                        placement[i], dispatch[i], tbo[i], off_act[i], off_w[i], moe)
        for j in range(N_LAYER_KEY):
            keys[i, j] = key[j]
    return keys


@jit(parallel=True)
def layer_cost_table(first, tp, pp, dp, cp, mb, recompute, sp, tp_overlap, schedule, ep, etp, placement, dispatch,
                     tbo, off_act, off_w, model, dev, tiers, tiles, work):
    """(groups, N_COST) array: ``layer_costs`` of each group's first row (the
    other slots 0)."""
    n_groups = first.shape[0]
    table = np.zeros((n_groups, N_COST), dtype=np.float64)
    for g in prange(n_groups):
        i = first[g]
        sh = shape_of(tp[i], pp[i], dp[i], cp[i], mb[i], ep[i], etp[i], sp[i], model[0], dev[0], work[0])
        layer_costs(table[g], sh, recompute[i], tp_overlap[i], schedule[i], placement[i], dispatch[i], tbo[i],
                    off_act[i], off_w[i], model[0], dev[0], tiers, tiles, work[0])
    return table
