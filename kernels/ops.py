"""Operator latency kernels: GEMM with tile search, FlashAttention, memory-bound ops.

All sizes are float64 (products of model sizes overflow 32-bit integers) and
all results are seconds. modeling.md section 2 is the reference.
"""

from __future__ import annotations

import math

from kernels.jit import jit


@jit
def tile_efficiency(m: float, n: float, units: float, tiles) -> float:
    """Best useful/padded work over the candidate output tiles.

    For a tile (tm, tn): the output is padded to ceil(m/tm)*tm by ceil(n/tn)*tn,
    and its ceil(m/tm)*ceil(n/tn) tiles run in ceil(tiles/units) waves over the
    device's compute units. Efficiency = (m*n / padded area) * (tiles / (waves*units)).
    """
    best = 0.0
    for i in range(tiles.shape[0]):
        tm = tiles[i, 0]
        tn = tiles[i, 1]
        rows = math.ceil(m / tm)
        cols = math.ceil(n / tn)
        count = rows * cols
        waves = math.ceil(count / units)
        eff = (m * n) / (rows * tm * cols * tn) * count / (waves * units)
        if eff > best:
            best = eff
    return best


@jit
def gemm_time_s(m: float, n: float, k: float, dev, tiles, dtype_bytes: float) -> float:
    """(m x k) @ (k x n): max(2mnk / (peak * max_eff * tile_eff), bytes / achieved HBM) + launch."""
    if m <= 0.0 or n <= 0.0 or k <= 0.0:
        return 0.0
    eff = dev.gemm_max_efficiency * tile_efficiency(m, n, dev.compute_units, tiles)
    compute = 2.0 * m * n * k / (dev.peak_flops_per_s * eff)
    traffic = (m * k + k * n + m * n) * dtype_bytes / (dev.hbm_bytes_per_s * dev.memory_efficiency)
    return max(compute, traffic) + dev.launch_s


@jit
def gemm_fwd_bwd_s(m: float, n: float, k: float, dev, tiles, dtype_bytes: float):
    """Forward Y = X W and its backward: dX = dY W^T (m x n x k), dW = X^T dY (k x m x n).

    Returns (forward seconds, backward seconds, forward FLOP)."""
    fwd = gemm_time_s(m, n, k, dev, tiles, dtype_bytes)
    bwd = gemm_time_s(m, k, n, dev, tiles, dtype_bytes) + gemm_time_s(k, n, m, dev, tiles, dtype_bytes)
    return fwd, bwd, 2.0 * m * n * k


@jit
def attention_flops(b: float, s_q: float, s_kv: float, heads: float, head_dim: float, causal: bool) -> float:
    """Forward FLOP of softmax(Q K^T) V: 2 GEMMs of 2*b*s_q*s_kv*heads*head_dim; half when causal."""
    flops = 4.0 * b * s_q * s_kv * heads * head_dim
    return 0.5 * flops if causal else flops


@jit
def attention_fwd_bwd_s(b: float, s_q: float, s_kv: float, heads: float, kv_heads: float, head_dim: float,
                        causal: bool, flash: bool, dev, dtype_bytes: float):
    """FlashAttention-2 style core attention on one device (heads already split by TP).

    FLOP: forward per ``attention_flops``; backward 2.5x forward (it recomputes P).
    Traffic with flash: Q, K, V read and O written (O(s) not O(s^2)); backward
    about twice that. Without flash, the s_q x s_kv score matrix is written and
    read back four times (scores, softmax, probabilities for P V) in each direction.
    Returns (forward seconds, backward seconds, forward FLOP).
    """
    flops = attention_flops(b, s_q, s_kv, heads, head_dim, causal)
    qo = 2.0 * b * s_q * heads * head_dim * dtype_bytes
    kv = 2.0 * b * s_kv * kv_heads * head_dim * dtype_bytes
    traffic = qo + kv
    if not flash:
        traffic += 4.0 * b * heads * s_q * s_kv * dtype_bytes
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    peak = dev.peak_flops_per_s * dev.attention_efficiency
    fwd = max(flops / peak, traffic / bw) + dev.launch_s
    bwd = max(2.5 * flops / peak, 2.0 * traffic / bw) + 2.0 * dev.launch_s
    return fwd, bwd, flops


@jit
def memory_bound_s(bytes_moved: float, n_kernels: float, dev) -> float:
    """A memory-bound pass (norm, activation, residual, optimizer update):
    bytes / achieved HBM bandwidth + one launch per kernel."""
    return bytes_moved / (dev.hbm_bytes_per_s * dev.memory_efficiency) + n_kernels * dev.launch_s
