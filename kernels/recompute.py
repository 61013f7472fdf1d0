"""Activation recomputation: which layers a stage recomputes and what the
recompute adds to a layer's backward (full: the forward with its TP and CP
traffic; selective: the attention core; norms: the two norms)."""

from __future__ import annotations

from paraspace.kernels.codes import RECOMPUTE_FULL, RECOMPUTE_NORMS, RECOMPUTE_SELECTIVE
from paraspace.kernels.jit import jit
from paraspace.kernels.ops import memory_bound_s

@jit(inline=True)
def recomputed_layers(recompute: int, rc_layers: float, nd: float, nm: float):
    """(dense, MoE) layers fully recomputed out of ``nd`` + ``nm``: all with full
    recompute, or only the last ``rc_layers`` of them (MoE layers come last)."""
    if recompute != RECOMPUTE_FULL:
        return 0.0, 0.0
    k = nd + nm if rc_layers <= 0.0 else min(rc_layers, nd + nm)
    fr_m = min(k, nm)
    return min(k - fr_m, nd), fr_m


@jit(inline=True)
def recompute_s(recompute: int, sh, layer_fwd: float, tp_layer: float, cp_f: float, core_f: float, dev):
    """(compute, communication) seconds a dense layer's recompute adds to its backward."""
    rc_compute = 0.0
    rc_comm = 0.0
    if recompute == RECOMPUTE_FULL:
        rc_compute = layer_fwd
        rc_comm = tp_layer + cp_f
    elif recompute == RECOMPUTE_SELECTIVE:
        rc_compute = core_f
    elif recompute == RECOMPUTE_NORMS:  # the two norms again: read the kept input, write the output
        rc_compute = memory_bound_s(4.0 * sh.norm_tokens * sh.h * sh.ab, 2.0, dev)
    return rc_compute, rc_comm
