"""One micro-batch through one pipeline stage: its dense and MoE layers (with
recompute, TP / CP / EP communication and host offload), the embedding on the
first stage, the LM head, loss and MTP modules on the last; and the bottleneck
device over all stages."""

from __future__ import annotations

from collections import namedtuple

from paraspace.kernels.codes import RECOMPUTE_FULL
from paraspace.kernels.cost_vector import (
    C_CP_B,
    C_CP_F,
    C_EMB_B,
    C_EMB_COMM,
    C_EMB_F,
    C_EP_B,
    C_EP_F,
    C_HEAD_B,
    C_HEAD_COMM,
    C_HEAD_F,
    C_HEAD_WGRAD,
    C_LAYER_BWD,
    C_LAYER_FWD,
    C_LAYER_WGRAD,
    C_MOE_BWD,
    C_MOE_FWD,
    C_MOE_WGRAD,
    C_MTP_B,
    C_MTP_F,
    C_MTP_W,
    C_OFF_DB,
    C_OFF_DF,
    C_OFF_MB,
    C_OFF_MF,
    C_RC_COMM,
    C_RC_COMPUTE,
    C_RC_EP,
    C_RC_MOE,
    C_TP_LAYER,
    C_TP_LAYER_B,
    C_WOFF_DB,
    C_WOFF_DF,
    C_WOFF_MB,
    C_WOFF_MF,
)
from paraspace.kernels.jit import jit
from paraspace.kernels.parameters import device_dense_layers, device_layers
from paraspace.kernels.recompute import recomputed_layers

#: The device with the longest forward + backward of one micro-batch: that time
#: (t_max) and the sum over all stages (t_sum); its compute, TP, CP, EP and
#: offload parts, forward, backward, recompute and weight-gradient seconds; and
#: the weight-gradient seconds summed over all stages (w_sum).
Bottleneck = namedtuple("Bottleneck", ("t_max", "t_sum", "compute", "tp", "cp", "ep", "off", "fwd", "bwd", "rc",
                                       "wgrad", "w_sum"))


@jit(inline=True)
def layers_pass_s(costs, nd: float, nm: float, recompute: int, rc_layers: float):
    """Seconds of ``nd`` dense and ``nm`` MoE layers of one micro-batch:
    (forward with its communication, backward with recompute and communication,
    weight-gradient GEMMs inside that backward, recompute, TP, EP communication,
    exposed host offload, CP communication). A full recompute's communication
    (``C_RC_COMM``) reruns the forward's TP and CP traffic: its CP part counts as
    CP. With full recompute and ``rc_layers`` > 0 only the last ``rc_layers``
    layers recompute; the others keep their activations (and
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
    rc_cp = rc_n * costs[C_CP_F] if recompute == RECOMPUTE_FULL else 0.0  # inside rc_n * C_RC_COMM
    tp = n * (costs[C_TP_LAYER] + costs[C_TP_LAYER_B]) + rc_n * costs[C_RC_COMM] - rc_cp
    cp = n * (costs[C_CP_F] + costs[C_CP_B]) + rc_cp
    ep = nm * (costs[C_EP_F] + costs[C_EP_B]) + rc_m * rc_ep
    fwd = (nd * costs[C_LAYER_FWD] + nm * costs[C_MOE_FWD] + n * (costs[C_TP_LAYER] + costs[C_CP_F])
           + nm * costs[C_EP_F] + off_f)
    rc = rc_d * costs[C_RC_COMPUTE] + rc_m * (rc_moe + rc_ep) + rc_n * costs[C_RC_COMM]
    bwd = (nd * costs[C_LAYER_BWD] + nm * (costs[C_MOE_BWD] + costs[C_EP_B]) + rc
           + n * (costs[C_TP_LAYER_B] + costs[C_CP_B]) + off_b)
    wgrad = nd * costs[C_LAYER_WGRAD] + nm * costs[C_MOE_WGRAD]
    return fwd, bwd, wgrad, rc, tp, ep, off_f + off_b, cp


@jit(inline=True)
def stage_pass_s(stage, pp, model, costs, recompute, rc_layers):
    """One micro-batch through pipeline stage ``stage`` of ``pp`` (its layers, the
    embedding on the first, LM head, loss and MTP on the last): (forward, backward,
    weight-gradient part, recompute, TP, EP, offload, CP seconds)."""
    n = device_layers(stage, pp, model.layers)
    nd = device_dense_layers(stage, pp, model)
    fwd, bwd, wgrad, rc, tp_time, ep_time, off_time, cp_time = layers_pass_s(costs, nd, n - nd, recompute,
                                                                            float(rc_layers))
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


@jit(inline=True)
def bottleneck_s(pp: int, model, costs, recompute: int, rc_layers):
    """The ``Bottleneck`` over the ``pp`` stages (the first slowest one); a middle
    stage with the previous one's layers is not passed again (a pipeline of 32
    stages has at most 4 different ones)."""
    t_max = -1.0
    t_sum = 0.0
    w_sum = 0.0
    best_compute = 0.0
    best_tp = 0.0
    best_cp = 0.0
    best_ep = 0.0
    best_off = 0.0
    best_f = 0.0
    best_b = 0.0
    best_rc = 0.0
    best_w = 0.0
    fwd, bwd, wgrad, rc, tp_time, ep_time, off_time, cp_time = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    last_n = -1.0
    last_nd = -1.0
    for stage in range(pp):
        # stage_pass_s reads the stage only through its layers, dense layers and whether it is
        # the first or the last: a middle stage like the one before passes in the same time
        n = device_layers(stage, pp, model.layers)
        nd = device_dense_layers(stage, pp, model)
        if stage <= 1 or stage == pp - 1 or n != last_n or nd != last_nd:
            fwd, bwd, wgrad, rc, tp_time, ep_time, off_time, cp_time = stage_pass_s(stage, pp, model, costs,
                                                                                   recompute, rc_layers)
        last_n = n
        last_nd = nd
        total = fwd + bwd
        t_sum += total
        w_sum += wgrad
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
    return Bottleneck(t_max, t_sum, best_compute, best_tp, best_cp, best_ep, best_off, best_f, best_b, best_rc, best_w,
                      w_sum)
