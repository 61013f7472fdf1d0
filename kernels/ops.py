"""Operator latency kernels: GEMM with tile search, FlashAttention, memory-bound ops.

All sizes are float64 (products of model sizes overflow 32-bit integers) and
all results are seconds. modeling.md section 2 is the reference.
"""

from __future__ import annotations

import math

from paraspace.kernels.jit import jit


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
def table_efficiency(m: float, n: float, k: float, dev) -> float:
    """GEMM efficiency from the device's measured points (``dev.n_gemm`` > 0).

    The points of the (n, k) nearest to the query in log distance are used;
    among them the efficiency is interpolated linearly in log2(m) and held flat
    beyond the smallest and largest measured m."""
    npts = int(dev.n_gemm)
    best = 1e300
    bn = 0.0
    bk = 0.0
    for i in range(npts):
        dist = (math.log2(dev.gemm_n[i] / n)) ** 2 + (math.log2(dev.gemm_k[i] / k)) ** 2
        if dist < best:
            best = dist
            bn = dev.gemm_n[i]
            bk = dev.gemm_k[i]
    lo_m = -1.0
    lo_e = 0.0
    hi_m = 1e300
    hi_e = 0.0
    small_m = 1e300
    small_e = 0.0
    large_m = -1.0
    large_e = 0.0
    for i in range(npts):
        if dev.gemm_n[i] != bn or dev.gemm_k[i] != bk:
            continue
        pm = dev.gemm_m[i]
        pe = dev.gemm_eff[i]
        if pm <= m and pm > lo_m:
            lo_m = pm
            lo_e = pe
        if pm >= m and pm < hi_m:
            hi_m = pm
            hi_e = pe
        if pm < small_m:
            small_m = pm
            small_e = pe
        if pm > large_m:
            large_m = pm
            large_e = pe
    if lo_m < 0.0:
        return small_e
    if hi_m >= 1e300:
        return large_e
    if hi_m == lo_m:
        return lo_e
    w = math.log2(m / lo_m) / math.log2(hi_m / lo_m)
    return lo_e + w * (hi_e - lo_e)


#: A GEMM's rate rises with its reduction length k as ``loop_fill(k, fill)``: each
#: output tile's main loop steps over k while its prologue and epilogue (loading the
#: first operand tiles, writing the output tile) are a fixed part. Measured on an H100
#: SXM5 and an H200 (docs/measurements/, cuBLAS, graph-replayed, m >= 1024): BF16
#: GEMMs reach 0.57 of their plateau rate at k = 512 and 0.95 at k = 2048, FP8 ones
#: (torch._scaled_mm) less at the same k, and both follow plateau x k / (k + fill)
#: best with a fill of 256 bytes of k: 128 BF16 elements, 256 FP8 ones (the BF16 fit's
#: MAPE over 715 shapes 3.7% -> 2.8% and its bias at k <= 1024 -7% -> 0%; FP8 over 96
#: shapes 4.8% -> 2.9%, -12% -> -2%). A profile states it (``Device.gemm_k_fill_bytes``:
#: Hopper's 256; a part not measured, 0); ``gemm_k_fill`` of a device record is it in
#: elements of the GEMM precision (``explorer.evaluate.pack_hardware``); 0: no fill.


@jit
def gemm_efficiency(m: float, n: float, k: float, dev, tiles) -> float:
    """Achieved / peak FLOP/s of an (m x k) @ (k x n) GEMM: the measured table
    where the device has one, else the best tile's wave and padding efficiency
    times the device's large-GEMM efficiency and the share of it its reduction
    length reaches (``loop_fill`` of k over the device's ``gemm_k_fill``)."""
    return gemm_efficiency_at(m, n, k, dev, tiles, dev.gemm_k_fill)


@jit
def gemm_efficiency_at(m: float, n: float, k: float, dev, tiles, fill: float) -> float:
    """``gemm_efficiency`` with the reduction's fill given, in k elements of the
    GEMM's operands (a 16-bit GEMM on an 8-bit device: ``fill_16bit``)."""
    if dev.n_gemm > 0:
        return table_efficiency(m, n, k, dev)
    return dev.gemm_max_efficiency * tile_efficiency(m, n, dev.compute_units, tiles) * loop_fill(k, fill)


@jit
def gemm_time_s(m: float, n: float, k: float, dev, tiles, dtype_bytes: float) -> float:
    """(m x k) @ (k x n) in the device's precision: max(2mnk (1 + scaling overhead) /
    (peak * efficiency), bytes / achieved HBM) + launch. The overhead is the precision's
    scaling recipe's rescaling work (``gemm_scaling_overhead``: FP8 in 128 x 128 blocks
    runs 19% longer than one scale a tensor on an H100 at 1K-8K tokens, measured), which
    adds to the main loop, not to the operand traffic."""
    return gemm_time_at_s(m, n, k, dev, tiles, dtype_bytes, dev.peak_flops_per_s / (1.0 + dev.gemm_scaling_overhead),
                          dev.gemm_k_fill)


@jit
def peak_16bit(dev) -> float:
    """The device's 16-bit GEMM peak (where a space's 8-bit GEMMs leave some in 16 bits)."""
    return dev.peak_16bit_flops_per_s if dev.peak_16bit_flops_per_s > 0.0 else dev.peak_flops_per_s


@jit
def fill_16bit(dev) -> float:
    """The reduction fill of a 16-bit GEMM in its k elements (``gemm_k_fill_16bit``; the
    profile's 256 bytes: 128), where the device's ``gemm_k_fill`` counts 8-bit ones."""
    return dev.gemm_k_fill_16bit if dev.gemm_k_fill_16bit > 0.0 else dev.gemm_k_fill


@jit
def gemm_time_16bit_s(m: float, n: float, k: float, dev, tiles, dtype_bytes: float) -> float:
    """``gemm_time_s`` of a GEMM an 8-bit recipe keeps in 16 bits: the 16-bit peak and
    fill, no scaling overhead (the same as ``gemm_time_s`` on a 16-bit device)."""
    return gemm_time_at_s(m, n, k, dev, tiles, dtype_bytes, peak_16bit(dev), fill_16bit(dev))


@jit
def gemm_time_at_s(m: float, n: float, k: float, dev, tiles, dtype_bytes: float, peak: float, fill: float) -> float:
    """``gemm_time_s`` at a given peak FLOP/s and reduction fill (``gemm_efficiency_at``)."""
    if m <= 0.0 or n <= 0.0 or k <= 0.0:
        return 0.0
    eff = gemm_efficiency_at(m, n, k, dev, tiles, fill)
    compute = 2.0 * m * n * k / (peak * eff)
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
    return attention_flops_qkv(b, s_q, s_kv, heads, head_dim, head_dim, causal)


@jit
def attention_flops_qkv(b: float, s_q: float, s_kv: float, heads: float, qk_dim: float, v_dim: float,
                        causal: bool) -> float:
    """Forward FLOP with separate query/key and value head dims (MLA: 192 and 128):
    Q K^T 2*b*s_q*s_kv*heads*qk_dim plus P V 2*b*s_q*s_kv*heads*v_dim; half when causal."""
    flops = 2.0 * b * s_q * s_kv * heads * (qk_dim + v_dim)
    return 0.5 * flops if causal else flops


@jit
def causal_kv_len(s: float, window: float) -> float:
    """The key length whose causal half is the mean number of keys a query attends
    to: s without a window; with a sliding window w < s, queries i < w see i keys
    and the rest w, a mean of w - w^2 / (2 s), so 2 w - w^2 / s."""
    if window <= 0.0 or window >= s:
        return s
    return 2.0 * window - window * window / s


@jit
def attention_peak(dev, dtype_bytes: float) -> float:
    """Peak FLOP/s of the attention core on ``dtype_bytes`` operands: 8-bit ones (an FP8
    KV cache under TensorRT-LLM's FP8 context FMHA / FlashAttention-3) run at the
    device's 8-bit peak; otherwise the 16-bit peak, as FlashAttention and cuDNN fused
    attention do inside FP8 training recipes (only their GEMMs are 8-bit)."""
    return dev.peak_flops_per_s if dtype_bytes <= 1.0 else peak_16bit(dev)


#: Fused attention kernels reach their plateau rate only over long key ranges: each
#: thread block loads its query tile, runs its key loop and writes its output, so a
#: fixed cost per block is spread over the keys it visits. Measured on an H100 SXM5
#: and an H200 (``docs/measurements/``, torch 2.11 SDPA, bf16, causal, head dim 128
#: and 64, 1K-32K tokens), the forward rate of both FlashAttention-2 and cuDNN's fused
#: kernel follows plateau x L / (L + FILL) within a few per cent, L the keys a kernel
#: call spans, with FILL about 450 keys forward and 1,000 backward (the backward's
#: dK/dV blocks loop over the queries and also accumulate dQ, a longer fixed part).
ATTENTION_FWD_FILL_KEYS = 450.0
ATTENTION_BWD_FILL_KEYS = 1000.0
#: Backward FLOP rate at the plateau as a fraction of the forward's. Measured (as
#: above) 0.90 for FlashAttention-2 and 0.89 for cuDNN at 16K-32K keys; with the fill
#: terms this gives the FlashAttention-3 paper's 0.87 at 16K (Shah et al. 2024,
#: arXiv:2407.08608, Figs. 5-6: FA2 370 / 322, cuDNN 595 / 516 TFLOP/s on an H100).
#: ``attention_efficiency`` is the forward's plateau fraction of peak.
ATTENTION_BWD_RATE = 0.90


@jit
def loop_fill(steps: float, fill: float) -> float:
    """The share of a kernel's plateau rate reached when each thread block's main loop
    runs over ``steps`` (a fused attention call's keys, a GEMM's reduction length k)
    and the block also pays a fixed part worth ``fill`` of them (loading its tile,
    writing its output): steps / (steps + fill). 1 for ``steps`` <= 0: no work to slow,
    or a kernel the fill does not describe (decode attention kernels, which split the
    keys of a few queries over the blocks, say 0)."""
    if steps <= 0.0:
        return 1.0
    return steps / (steps + fill)


@jit
def attention_fwd_bwd_s(b: float, s_q: float, s_kv: float, heads: float, kv_heads: float, head_dim: float,
                        causal: bool, flash: bool, dev, dtype_bytes: float):
    """FlashAttention-2 style core attention on one device (heads already split by TP),
    one kernel call over all ``s_kv`` keys.

    FLOP: forward per ``attention_flops``; backward 2.5x forward (it recomputes P), at
    ``ATTENTION_BWD_RATE`` of the forward's FLOP rate; both rates scaled by
    ``loop_fill`` of the keys per call.
    Traffic with flash: Q, K, V read and O written (O(s) not O(s^2)); backward
    about twice that. Without flash, the s_q x s_kv score matrix is written and
    read back four times (scores, softmax, probabilities for P V) in each direction.
    Returns (forward seconds, backward seconds, forward FLOP).
    """
    return attention_qkv_fwd_bwd_s(b, s_q, s_kv, heads, kv_heads, head_dim, head_dim, causal, flash, dev,
                                   dtype_bytes, s_kv)


@jit
def attention_qkv_fwd_bwd_s(b: float, s_q: float, s_kv: float, heads: float, kv_heads: float, qk_dim: float,
                            v_dim: float, causal: bool, flash: bool, dev, dtype_bytes: float, call_keys: float):
    """``attention_fwd_bwd_s`` with query/key and value head dims apart (MLA
    after its up-projections: every head has its own K and V, kv_heads = heads) and
    the keys one kernel call spans (``s_kv``, or one ring step's share under context
    parallelism). Without flash (the unfused path: GEMMs and a softmax) the rate
    does not depend on it."""
    flops = attention_flops_qkv(b, s_q, s_kv, heads, qk_dim, v_dim, causal)
    qo = b * s_q * heads * (qk_dim + v_dim) * dtype_bytes
    kv = b * s_kv * kv_heads * (qk_dim + v_dim) * dtype_bytes
    traffic = qo + kv
    fill_f = 1.0
    fill_b = 1.0
    if flash:
        fill_f = loop_fill(call_keys, ATTENTION_FWD_FILL_KEYS)
        fill_b = loop_fill(call_keys, ATTENTION_BWD_FILL_KEYS)
    else:
        traffic += 4.0 * b * heads * s_q * s_kv * dtype_bytes
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    peak = attention_peak(dev, dtype_bytes) * dev.attention_efficiency
    fwd = max(flops / (peak * fill_f), traffic / bw) + dev.launch_s
    bwd = max(2.5 * flops / (peak * ATTENTION_BWD_RATE * fill_b), 2.0 * traffic / bw) + 2.0 * dev.launch_s
    return fwd, bwd, flops


@jit
def memory_bound_s(bytes_moved: float, n_kernels: float, dev) -> float:
    """A memory-bound pass (norm, activation, residual, optimizer update):
    bytes / achieved HBM bandwidth + one launch per kernel."""
    return bytes_moved / (dev.hbm_bytes_per_s * dev.memory_efficiency) + n_kernels * dev.launch_s
