"""A GEMM's three passes (forward, backward, weight gradient), the unit every
layer's compute is assembled from (``kernels.attention``, ``kernels.mlp``,
``kernels.moe_layer``)."""

from __future__ import annotations

from paraspace.kernels.jit import jit
from paraspace.kernels.ops import gemm_fwd_bwd_s, gemm_time_16bit_s, gemm_time_s


@jit
def gemm_passes_s(m: float, n: float, k: float, dev, tiles, ab: float):
    """(forward, backward, weight-gradient) seconds of a GEMM Y = X W (m x k @ k x n)."""
    f, b, _ = gemm_fwd_bwd_s(m, n, k, dev, tiles, ab)
    return f, b, gemm_time_s(k, n, m, dev, tiles, ab)


@jit
def gemm_passes_16bit_s(m: float, n: float, k: float, dev, tiles, ab: float):
    """``gemm_passes_s`` of a GEMM an 8-bit recipe keeps in 16 bits, at the device's
    16-bit peak and reduction fill (``ops.gemm_time_16bit_s``; the same as ``gemm_passes_s``
    on a 16-bit device): the attention projections where a space quantizes only the MLP,
    and the LM head under every 8-bit recipe."""
    w = gemm_time_16bit_s(k, n, m, dev, tiles, ab)
    return gemm_time_16bit_s(m, n, k, dev, tiles, ab), gemm_time_16bit_s(m, k, n, dev, tiles, ab) + w, w
