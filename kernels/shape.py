"""The shape of one candidate's layer as the kernels see it: parallel sizes as
floats, the micro-batch's tokens on one device, the workload's element width
and switches. A numba named tuple (built once per row, passed by value: no
allocation per row, unlike a one-element structured array), so that the
per-concept kernels (``kernels.attention``, ``kernels.mlp``, ...) take one
argument instead of a dozen."""

from __future__ import annotations

from collections import namedtuple

from paraspace.kernels.jit import jit

#: t, p, d, c, e, et: tensor, pipeline, data, context, expert and expert-tensor
#: parallel sizes; b: micro-batch (sequences); s: sequence length; ab: bytes per
#: activation element; h: hidden size; tokens: b s / c, the tokens of one
#: micro-batch on one device; heads: attention heads per TP rank; sp: sequence
#: parallelism in effect; flash: FlashAttention; fused: fused elementwise
#: kernels; eager: elementwise work as eager PyTorch ops (``kernels.elementwise``;
#: never fused); norm_tokens: the tokens a norm runs on (tokens / t with SP)
Shape = namedtuple("Shape", ("t", "p", "d", "c", "e", "et", "b", "s", "ab", "h", "tokens", "heads", "sp", "flash",
                             "fused", "eager", "norm_tokens"))


@jit(inline=True)
def shape_of(tp, pp, dp, cp, mb, ep, etp, sp_flag, model, dev, work):
    """The ``Shape`` of a row from its strategy columns and parameter records."""
    t = float(tp)
    c = float(cp)
    b = float(mb)
    s = work.seq_len
    sp = sp_flag != 0 and tp > 1
    tokens = b * s / c
    eager = work.eager_elementwise > 0
    return Shape(t, float(pp), float(dp), c, float(ep), float(etp), b, s, work.act_bytes, model.hidden, tokens,
                 model.heads / t, sp, work.flash_attention > 0, dev.kernel_fusion > 0 and not eager, eager,
                 tokens / t if sp else tokens)


#: A row's integer switches the memory model reads: recompute mode, ZeRO stage,
#: optimizer, schedule (kernels.codes), layers recomputed (0: all), activation
#: and weight offload (0/1), virtual stages v and micro-batches m as floats.
Knobs = namedtuple("Knobs", ("recompute", "zero", "optimizer", "schedule", "rc_layers", "off_act", "off_w", "v", "m"))
