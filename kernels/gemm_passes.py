"""A GEMM's three passes (forward, backward, weight gradient), the unit every
layer's compute is assembled from (``kernels.attention``, ``kernels.mlp``,
``kernels.moe_layer``)."""

from __future__ import annotations

from paraspace.kernels.jit import jit
from paraspace.kernels.ops import gemm_fwd_bwd_s, gemm_time_s

@jit
def gemm_passes_s(m: float, n: float, k: float, dev, tiles, ab: float):
    """(forward, backward, weight-gradient) seconds of a GEMM Y = X W (m x k @ k x n)."""
    f, b, _ = gemm_fwd_bwd_s(m, n, k, dev, tiles, ab)
    return f, b, gemm_time_s(k, n, m, dev, tiles, ab)
