"""Host offload of activations and weights over the full-duplex host link,
hidden behind each layer's compute (ZeRO-Offload / activation offload)."""

from __future__ import annotations

from paraspace.kernels.codes import RECOMPUTE_FULL, RECOMPUTE_NONE
from paraspace.kernels.cost_vector import (
    C_OFF_DB,
    C_OFF_DF,
    C_OFF_MB,
    C_OFF_MF,
    C_WOFF_DB,
    C_WOFF_DF,
    C_WOFF_MB,
    C_WOFF_MF,
)
from paraspace.kernels.jit import jit
from paraspace.kernels.memory import kept_bytes_per_layer, layer_input_bytes
from paraspace.kernels.routing import layer_imbalance

@jit
def host_exposed_s(to_host: float, to_device: float, compute: float, dev) -> float:
    """Seconds of host-link transfers (bytes each way, the link is full duplex)
    not hidden behind ``compute`` seconds of the same pass."""
    return max(0.0, max(to_host, to_device) / dev.host_link_bytes_per_s - compute)


@jit(inline=True)
def offload_costs(costs, sh, recompute: int, off_act: int, off_w: int, lp: float, moe_params: float,
                  layer_fwd: float, layer_bwd: float, moe_f: float, moe_b: float, model, dev, work) -> None:
    """Fill the exposed host-link slots of ``costs`` (C_OFF_* with activations and
    weights offloaded, C_WOFF_* with only the weights) per dense / MoE layer,
    forward / backward; ``lp``, ``moe_params``: a dense and an MoE layer's
    parameters on the device."""
    for i in range(C_OFF_DF, C_WOFF_MB + 1):
        costs[i] = 0.0
    if off_act == 0 and off_w == 0:
        return
    b, s, t, c, sp, ab = sh.b, sh.s, sh.t, sh.c, sh.sp, sh.ab
    kept = RECOMPUTE_NONE if recompute == RECOMPUTE_FULL else recompute  # a layer not recomputed keeps this
    act_d = 0.0
    act_m = 0.0
    if off_act != 0:  # all but the layer input goes to the host and comes back for the backward
        inp = layer_input_bytes(b, s, t, c, sp, model, ab)
        act_d = kept_bytes_per_layer(sh, kept, model, work, False, 1.0) - inp
        act_m = kept_bytes_per_layer(sh, kept, model, work, True, layer_imbalance(sh, model, work)) - inp
    w_d = lp if off_w != 0 else 0.0
    w_m = moe_params if off_w != 0 else 0.0
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
