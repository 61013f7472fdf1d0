"""One transformer layer's dense MLP on one device, one micro-batch: the
(gated) up-projection, the activation function and the down-projection, split
by TP; and the casts of 8-bit GEMMs' operands. modeling.md section 5."""

from __future__ import annotations

from collections import namedtuple

from paraspace.kernels.elementwise import activation_s
from paraspace.kernels.gemm_passes import gemm_passes_s
from paraspace.kernels.jit import jit
from paraspace.kernels.ops import memory_bound_s
from paraspace.kernels.parameters import attention_weights

#: Seconds of the MLP's up- and down-projection (forward, backward, the
#: weight-gradient GEMMs inside the backward) and of its activation function
#: forward (0 when fused into the up-projection's epilogue).
Mlp = namedtuple("Mlp", ("up_f", "up_b", "up_w", "down_f", "down_b", "down_w", "act"))


@jit(inline=True)
def dense_mlp_s(sh, model, dev, tiles):
    """The ``Mlp`` of one dense layer of ``sh``'s shape (ffn / t wide per rank)."""
    f = model.ffn / sh.t
    up = (2.0 if model.glu > 0 else 1.0) * f
    f3, b3, w3 = gemm_passes_s(sh.tokens, up, sh.h, dev, tiles, sh.ab)
    f4, b4, w4 = gemm_passes_s(sh.tokens, sh.h, f, dev, tiles, sh.ab)
    return Mlp(f3, b3, w3, f4, b4, w4, activation_s(sh, sh.tokens * f, model.glu > 0, dev))


@jit(inline=True)
def gemm_cast_s(sh, model, att, dev, work):
    """(forward, backward) seconds of casting 8-bit GEMMs' operands: inputs and
    weights forward, output gradients backward; the MLP's, and the attention
    projections' too where the space quantises them (``att``: ``Attention``)."""
    h = sh.h
    tokens = sh.tokens
    f = model.ffn / sh.t
    up = (2.0 if model.glu > 0 else 1.0) * f
    inputs = tokens * (h + f)  # the MLP's (MLP-only quantisation leaves attention in 16 bits)
    weights = h * up + f * h
    grads = tokens * (up + h)
    if work.quantize_attention > 0:
        split, rep = attention_weights(model)
        inputs += tokens * (h + att.v_out)
        weights += split / sh.t + rep
        grads += tokens * (att.proj_out + h)
    return (memory_bound_s(work.gemm_cast_bytes * (inputs + weights), 8.0, dev),
            memory_bound_s(work.gemm_cast_bytes * grads, 4.0, dev))
