"""Activation recomputation: which layers a stage recomputes and what the
recompute adds to a layer's backward (full: the forward with its TP and CP
traffic; selective: the attention core; norms: the two norms; selective-ops:
the GEMMs and elementwise work torchtitan's per-op policy does not keep)."""

from __future__ import annotations

from paraspace.kernels.codes import RECOMPUTE_FULL, RECOMPUTE_NORMS, RECOMPUTE_SELECTIVE, RECOMPUTE_SELECTIVE_OPS
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
def ops_attention_s(sh, att, model) -> float:
    """Seconds selective-ops recomputes of a layer's attention part (``kernels.memory``
    names what it keeps): the K projection (its share of the fused QKV GEMM; MLA:
    half its projections), the output projection (its output feeds the residual
    add under the second norm; with sequence parallelism the policy keeps the
    reduce-scatter's output instead) and the norms, residual adds and rotary
    embedding."""
    k_share = 0.5
    if model.mla <= 0:  # proj_out = q + 2 kv columns, v_out = q
        k_share = 0.5 * (att.proj_out - att.v_out) / att.proj_out
    elementwise = att.part_f - att.qkv_f - att.out_f - att.core_f
    return k_share * att.qkv_f + (0.0 if sh.sp else att.out_f) + elementwise


@jit(inline=True)
def recompute_s(recompute: int, sh, layer_fwd: float, tp_layer: float, cp_f: float, att, mlp, model, dev,
                early_stop: float):
    """(compute, communication) seconds a dense layer's recompute adds to its
    backward (``att``, ``mlp``: its ``Attention`` and ``Mlp``). Full recompute
    reruns the forward with its TP and CP traffic; with ``early_stop`` (1: PyTorch's
    non-reentrant checkpoint) it stops once the down projection's input is rebuilt,
    the last tensor the backward reads, so the down projection is not rerun
    (measured on an H100 and an H200, ``docs/measurements`` ``layer.csv``: 0.68-0.94
    of a forward on MPT-7B blocks, whose down projection is a third of the GEMMs).
    Selective-ops redoes ``ops_attention_s``, the activation function and a gated
    MLP's up projection (half the fused gate + up GEMM)."""
    rc_compute = 0.0
    rc_comm = 0.0
    if recompute == RECOMPUTE_FULL:
        rc_compute = layer_fwd - early_stop * mlp.down_f
        rc_comm = tp_layer + cp_f
    elif recompute == RECOMPUTE_SELECTIVE:
        rc_compute = att.core_f
    elif recompute == RECOMPUTE_SELECTIVE_OPS:
        rc_compute = ops_attention_s(sh, att, model) + mlp.act + (0.5 * mlp.up_f if model.glu > 0 else 0.0)
    elif recompute == RECOMPUTE_NORMS:  # the two norms again: read the kept input, write the output
        rc_compute = memory_bound_s(4.0 * sh.norm_tokens * sh.h * sh.ab, 2.0, dev)
    return rc_compute, rc_comm
