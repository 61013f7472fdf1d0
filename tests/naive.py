"""Slow, obviously correct references for the kernels (stumpy's ``tests/naive.py``).

Plain Python over plain values: hardware, model and workload are dicts keyed
by the field names of ``kernels.params`` (``fields`` turns a record into one),
tiers a list of ``(domain_devices, bytes_per_s, latency_s, allreduce_algorithm)``
(the last optional: ring when absent) and tiles a list
of ``(rows, cols)``. Each function is re-derived from the formula in the
kernel's docstring or in ``shared/design/modeling.md``, written the long way
round where there is one (counting ranks by coordinate, summing work per
stage), never by calling a kernel. The enum codes are spelt out here so that a
renumbering in ``kernels.codes`` shows up as a failure.
"""

from __future__ import annotations

import math

# kernels.codes / spaces.enums, spelt out on purpose
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV, BROADCAST, REDUCE = 0, 1, 2, 3, 4, 5, 6
RING, TREE, AUTO = 0, 1, 2  # spaces.enums.AllReduceAlgorithm
NONE, SELECTIVE, FULL, NORMS, MOE_DISPATCH, SELECTIVE_OPS = 0, 1, 2, 3, 4, 5  # MOE_DISPATCH: as NONE on a dense model
GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1 = 0, 1, 2, 3
ADAM_BYTES_PER_PARAM = 34.0  # read master, m, v, grad (16) + write master, m, v (12) + weight (2) + clip read (4)
ADAM, ADAM_8BIT, CPU_ADAM, ADAM_NO_MASTER, ADAM_8BIT_PAGED, ADAM_BF16 = 0, 1, 2, 3, 4, 5  # spaces.enums.Optimizer
# 8-bit Adam: m and v of one byte each beside the fp32 master (6 of Adam's 12 state bytes); its step reads
# master 4 + m, v 2 + grad 4 and writes master 4 + m, v 2 + weight 2, plus the clipping read 4 = 22.
# No master: fp32 m and v (8 of 12); reads weight 2 + m, v 8 + grad 4, writes weight 2 + m, v 8, clip 4 = 28.
# Paged 8-bit: m and v (2 of 12) on the host, paged in and out over the link (2 bytes each way, overlapped),
# the in-place update reads weight 2 + m, v 2 + grad 4, writes weight 2 + m, v 2, clip 4 = 16.
# Pure bf16: bf16 m and v (4 of 12) and bf16 gradients (2 of 4 bytes); reads weight, m, v, grad 2 each,
# writes weight, m, v 2 each, clip 2 = 16
OK, OUT_OF_MEMORY, OUT_OF_HOST_MEMORY = 0.0, 1.0, 2.0  # spaces.enums.Feasibility
STATE_SHARE = {ADAM: 1.0, ADAM_8BIT: 0.5, CPU_ADAM: 0.0, ADAM_NO_MASTER: 8 / 12, ADAM_8BIT_PAGED: 0.0,
               ADAM_BF16: 4 / 12}
HOST_SHARE = {ADAM: 0.0, ADAM_8BIT: 0.0, CPU_ADAM: 1.0, ADAM_NO_MASTER: 0.0, ADAM_8BIT_PAGED: 2 / 12, ADAM_BF16: 0.0}
STEP_BYTES = {ADAM: ADAM_BYTES_PER_PARAM, ADAM_8BIT: 22.0, ADAM_NO_MASTER: 28.0, ADAM_8BIT_PAGED: 16.0,
              ADAM_BF16: 16.0}
GRAD_SHARE = {ADAM_BF16: 0.5}  # stored gradients: bf16, half the workload's fp32 gradient bytes
LINK_BYTES = {ADAM_8BIT_PAGED: 2.0}


def fields(rec) -> dict[str, float]:
    """A one-element record array (or one record) as ``{field: float}`` (the scalar
    fields; tables such as a measured GEMM efficiency are not modelled here)."""
    row = rec[0] if getattr(rec, "shape", ()) else rec
    return {name: float(row[name]) for name in row.dtype.names if row.dtype[name].shape == ()}


def tier_list(tiers) -> list[tuple[float, float, float, int]]:
    return [(float(t["domain_devices"]), float(t["bytes_per_s"]), float(t["latency_s"]),
             int(t["allreduce_algorithm"])) for t in tiers]


def tile_list(tiles) -> list[tuple[float, float]]:
    return [(float(r[0]), float(r[1])) for r in tiles]


# --------------------------------------------------------------------------- ops


def tile_efficiency(m, n, units, tiles):
    """Useful output area over the area the device's tile slots sweep.

    With tile (tm, tn) the output needs ceil(m/tm) * ceil(n/tn) tiles, which
    run in ceil(count/units) waves; each wave occupies ``units`` slots of
    tm x tn, so the device sweeps waves * units * tm * tn elements for m * n
    useful ones. The best tile wins."""
    best = 0.0
    for tm, tn in tiles:
        count = math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(count / units)
        swept = waves * units * tm * tn
        best = max(best, m * n / swept)
    return best


def gemm_time_s(m, n, k, dev, tiles, dtype_bytes):
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k
    achieved = dev["peak_flops_per_s"] * dev["gemm_max_efficiency"] * tile_efficiency(m, n, dev["compute_units"], tiles)
    # each output tile's loop over k pays a fixed part worth gemm_k_fill steps of it
    achieved *= k / (k + dev["gemm_k_fill"])
    # the precision's scaling recipe lengthens the main loop (FP8 in 128 x 128 blocks)
    achieved /= 1.0 + dev["gemm_scaling_overhead"]
    operands = m * k + k * n + m * n
    bandwidth = dev["hbm_bytes_per_s"] * dev["memory_efficiency"]
    return max(flops / achieved, operands * dtype_bytes / bandwidth) + dev["launch_s"]


def gemm_fwd_bwd_s(m, n, k, dev, tiles, dtype_bytes):
    """Forward (m,k)@(k,n); backward dX (m,n)@(n,k) and dW (k,m)@(m,n)."""
    fwd = gemm_time_s(m, n, k, dev, tiles, dtype_bytes)
    d_x = gemm_time_s(m, k, n, dev, tiles, dtype_bytes)
    d_w = gemm_time_s(k, n, m, dev, tiles, dtype_bytes)
    return fwd, d_x + d_w


def attention_fwd_bwd_s(b, s_q, s_kv, heads, kv_heads, head_dim, causal, flash, dev, dtype_bytes, call_keys):
    """FlashAttention-2: QK^T and PV are two GEMMs of 2*b*s_q*s_kv*heads*head_dim
    FLOP each (half of it causal); backward 2.5x the FLOP and 2x the traffic.
    Traffic: Q and O (heads), K and V (kv_heads); without flash also the score
    matrix 4 times."""
    flops = 2 * (2.0 * b * s_q * s_kv * heads * head_dim)
    if causal:
        flops /= 2
    q_bytes = b * s_q * heads * head_dim * dtype_bytes
    o_bytes = q_bytes
    k_bytes = b * s_kv * kv_heads * head_dim * dtype_bytes
    v_bytes = k_bytes
    traffic = q_bytes + k_bytes + v_bytes + o_bytes
    if not flash:
        traffic += 4 * (b * heads * s_q * s_kv * dtype_bytes)
    flop_rate = dev["peak_flops_per_s"] * dev["attention_efficiency"]
    byte_rate = dev["hbm_bytes_per_s"] * dev["memory_efficiency"]
    # a fused kernel reaches its plateau rate over long key ranges: keys / (keys + 450)
    # forward, keys / (keys + 1000) backward, keys being those one call spans (measured
    # on an H100, docs/measurements/); the backward's plateau is 0.90 of the forward's
    fill_f = call_keys / (call_keys + 450) if flash else 1.0
    fill_b = call_keys / (call_keys + 1000) if flash else 1.0
    fwd = max(flops / (flop_rate * fill_f), traffic / byte_rate) + dev["launch_s"]
    bwd = max(2.5 * flops / (0.90 * flop_rate * fill_b), 2 * traffic / byte_rate) + 2 * dev["launch_s"]
    return fwd, bwd


def memory_bound_s(bytes_moved, n_kernels, dev):
    return bytes_moved / (dev["hbm_bytes_per_s"] * dev["memory_efficiency"]) + n_kernels * dev["launch_s"]


# --------------------------------------------------------------------------- collectives


def btree_depth(n):
    """Hops from the deepest rank to the root of NCCL's binary tree over ``n`` ranks
    (src/graph/trees.cc, ncclGetBtree), by walking every rank's parent pointers:
    rank 0 is the root with the single child 2^ceil(log2 n) / 2; another rank
    with lowest set bit b has the parent (rank ^ b) | 2b, or rank ^ b when that
    is out of range. The mirrored / shifted second tree of the double binary
    tree has the same shape, hence the same depth. Non-integer n (a level of a
    hierarchy whose groups do not divide evenly) counts as ceil(n) ranks."""
    n = math.ceil(n)
    deepest = 0
    for rank in range(1, n):
        hops, r = 0, rank
        while r != 0:
            bit = r & -r
            up = (r ^ bit) | (bit << 1)
            r = up if up < n else r ^ bit
            hops += 1
        deepest = max(deepest, hops)
    return deepest


def flat_time_s(op, n, size_bytes, bytes_per_s, latency_s, algorithm=RING):
    """nccl-tests: algorithm steps x alpha + buffer x bus factor / bandwidth.
    All-reduce by double binary tree (NCCL): each tree carries half the buffer up
    (reduce) and down (broadcast); a rank interior in one tree is a leaf in the
    other, so it sends S/2 up each tree (S) and S/2 to each of its two children
    in one tree (S): 2 S in all, the pipeline filling in the tree's depth each
    way; auto takes the faster of tree and ring."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    if op == ALL_REDUCE and algorithm != RING:
        tree = 2 * btree_depth(n) * latency_s + 2 * size_bytes / bytes_per_s
        if algorithm == TREE:
            return tree
        return min(tree, flat_time_s(op, n, size_bytes, bytes_per_s, latency_s, RING))
    if op == SEND_RECV:
        steps, factor = 1, 1.0
    elif op in (BROADCAST, REDUCE):  # pipelined ring from / to the root: n-1 hops to fill, S through each link
        steps, factor = n - 1, 1.0
    elif op == ALL_REDUCE:  # reduce-scatter then all-gather
        steps, factor = 2 * (n - 1), 2 * (n - 1) / n
    elif op in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        steps, factor = n - 1, (n - 1) / n
    else:
        raise ValueError(f"unknown collective {op}")
    return steps * latency_s + size_bytes * factor / bytes_per_s


def _algorithm(tier):
    return int(tier[3]) if len(tier) > 3 else RING


def _same_domain(pos_a, pos_b, domain):
    """Aligned blocks of ``domain`` devices; domain 0 is the whole cluster."""
    return domain <= 0 or pos_a // domain == pos_b // domain


def _members_by_tier(size, stride, tiers):
    """Members of a strided group inside one tier-i domain, by counting
    coordinates: the layout repeats groups at every offset, so count the
    multiples of ``stride`` in each window of ``domain`` consecutive devices
    and take the fewest (the worst-aligned domain bounds the collective),
    clamped to [1, size]. Domain 0 is the whole cluster."""
    size, stride = int(size), int(stride)
    counts = []
    for domain, *_ in tiers:
        domain = int(domain)
        if domain <= 0:
            counts.append(size)
            continue
        fewest = min(sum(1 for x in range(start, start + domain) if x % stride == 0) for start in range(stride))
        counts.append(min(size, max(1, fewest)))
    return counts


def collective_time_s(op, size, stride, size_bytes, tiers):
    """The hierarchical algorithm of ``kernels.collectives``.

    SEND_RECV: the outermost tier that a neighbour hop of any of the
    ``stride`` interleaved pipelines (offset o: devices o + j*stride) crosses
    sets the message time (tiers are taken to slow down outwards).
    Others: walk the tiers innermost first; at tier i the k_(i-1) members
    already combined by faster tiers form one sub-group, r_i = k_i / k_(i-1)
    sub-groups combine over tier i, each rank carrying 1/k_(i-1) of the
    buffer. All-to-all instead sends to each of the k_i - k_(i-1) members that
    are first reached at tier i its 1/size share of the buffer, with r_i - 1
    message steps. Broadcast / reduce: the level that joins the whole group
    moves the 1/k_(i-1) slice each member holds with bus factor 1 (every
    member's link at once); the levels below it all-gather (reduce-scatter)
    the slices among their r_i sub-groups. All-reduce follows each tier's
    algorithm (ring, tree or auto).
    """
    if size <= 1 or size_bytes <= 0:
        return 0.0
    if op == SEND_RECV:
        outermost = 0
        for offset in range(int(stride)):
            for j in range(int(size) - 1):
                a, b = offset + j * stride, offset + (j + 1) * stride
                hop = next(i for i, (dom, *_) in enumerate(tiers) if _same_domain(a, b, dom))
                outermost = max(outermost, hop)
        _, bw, lat, *_ = tiers[outermost]
        return flat_time_s(SEND_RECV, 2, size_bytes, bw, lat)
    counts = _members_by_tier(size, stride, tiers)
    total = 0.0
    combined = 1
    for tier, k in zip(tiers, counts):
        _, bw, lat, *_ = tier
        if k > combined:
            r = k / combined
            if op == ALL_TO_ALL:
                new_peers = k - combined
                total += (r - 1) * lat + new_peers * (size_bytes / size) / bw
            elif op in (BROADCAST, REDUCE) and k < size:
                # not yet the whole group: the slices the members of a sub-group hold
                # are gathered (scattered) among the r sub-groups, an all-gather's cost
                total += flat_time_s(ALL_GATHER, r, size_bytes / combined, bw, lat)
            else:
                total += flat_time_s(op, r, size_bytes / combined, bw, lat, _algorithm(tier))
        combined = k
    return total


# --------------------------------------------------------------------------- training


def layer_params(model, t):
    """Per TP rank: column-parallel QKV and up/gate (weights and biases split
    by t), row-parallel out-proj and down (weights split, biases replicated),
    two norms (weight, + bias) replicated."""
    h, dh, f = model["hidden"], model["head_dim"], model["ffn"]
    q, kv = model["heads"] * dh, model["kv_heads"] * dh
    glu = model["glu"] > 0
    bias = model["bias"] > 0
    up_cols = 2 * f if glu else f
    split = h * (q + 2 * kv)  # W_qkv
    split += q * h  # W_o
    split += h * up_cols  # W_up (and W_gate)
    split += f * h  # W_down
    replicated = 2 * h  # two norm weights
    if bias:
        split += (q + 2 * kv) + up_cols  # b_qkv, b_up (b_gate)
        replicated += 2 * h  # norm biases
        replicated += h + h  # b_o, b_down (added after the TP reduction)
    return split / t + replicated


def activation_bytes_per_layer(b, s, t, c, sp, recompute, flash, model, ab, eager=0.0):
    """Korthikanti et al. 2022, eq. 1-2, term by term for one layer (tokens
    b*s/c on this CP rank; 'rep' terms split by t only with SP); ``eager``: 1 when
    the layer runs as eager PyTorch ops, which also keep the rotated Q and K, the
    attention output's transposed copy and a gated MLP's SiLU output."""
    tokens = b * s / c
    h, dh = model["hidden"], model["head_dim"]
    if recompute == FULL:
        return ab * tokens * h / (t if sp else 1)
    heads, kv = model["heads"] / t, model["kv_heads"] / t
    eager_kept = 0.0
    if eager and recompute != SELECTIVE_OPS:
        eager_kept += ab * tokens * heads * dh  # rotated Q
        eager_kept += ab * tokens * kv * dh  # rotated K
        eager_kept += ab * tokens * heads * dh  # the attention output, transposed for the output projection
        if model["glu"] > 0:
            eager_kept += ab * tokens * model["ffn"] / t  # SiLU(gate), beside gate, up and the product
    dropout = model["dropout"] > 0
    ops = recompute == SELECTIVE_OPS  # GEMMs q, k, v, o, gate, up, down: the 1st, 3rd, 5th, 7th kept
    rep = 0.0
    rep += ab * tokens * h  # input of norm 1
    if recompute not in (NORMS, SELECTIVE_OPS):  # recomputed from the norm input in the backward
        rep += ab * tokens * h  # input of QKV (norm 1 output)
    if not ops:  # selective-ops: a residual add of the (recomputed) output projection
        rep += ab * tokens * h  # input of norm 2
    if recompute not in (NORMS, SELECTIVE_OPS):
        rep += ab * tokens * h  # input of the MLP (norm 2 output)
    if ops and sp:  # the per-op policy keeps reduce-scatter outputs
        rep += ab * tokens * h  # the attention's, after the output projection
        rep += ab * tokens * h  # the MLP's, after the down projection
    if dropout:
        rep += 1 * tokens * h  # attention dropout mask
        rep += 1 * tokens * h  # MLP dropout mask
    if sp:
        rep /= t
    if ops and model["glu"] > 0:
        rep += ab * tokens * h  # output of the down projection (the 7th GEMM; under TP its partial sums, whole)
    split = 0.0
    split += ab * tokens * heads * dh  # Q
    if not ops:
        split += ab * tokens * kv * dh  # K
    split += ab * tokens * kv * dh  # V
    split += ab * tokens * heads * dh  # attention output (out-proj input)
    mlp_tensors = 3 if model["glu"] > 0 else 2  # gate, up, down input | GeLU input, down input
    if ops:
        mlp_tensors = 1  # the gate (fc1) output
    split += mlp_tensors * ab * tokens * model["ffn"] / t
    scores = 0.0
    elems = b * heads * (s / c) * s
    if flash:
        scores = 4.0 * b * heads * (s / c)  # fp32 log-sum-exp per query row
    elif recompute not in (SELECTIVE, SELECTIVE_OPS):  # both recompute the attention core
        scores = ab * elems  # softmax output
        if dropout:
            scores += 1 * elems + ab * elems  # dropout mask and dropout output
    return rep + split + scores + eager_kept


def in_flight_chunks(schedule, p, v, m, stage):
    if schedule == GPIPE:
        return m
    if schedule == INTERLEAVED:
        warmup = 2 * (p - stage - 1) + (v - 1) * p  # Megatron-LM's warm-up forwards
        return min(warmup + 1, m * v)
    if schedule == ZB_H1:  # 1F1B's p - stage plus the stage deferred W's
        return min((p - stage) + stage, m)
    return min(p - stage, m)


def model_flop_per_sequence(model, s):
    h, f, dh = model["hidden"], model["ffn"], model["head_dim"]
    q, kv = model["heads"] * dh, model["kv_heads"] * dh
    mats = h * (q + 2 * kv) + q * h + (3 if model["glu"] > 0 else 2) * h * f
    per_layer = 2 * s * mats + 0.5 * 4 * s * s * q
    return model["layers"] * per_layer + 2 * s * h * model["vocab"]


def recomputes(recompute, rc_layers, n, j):
    """Whether layer ``j`` of a device's ``n`` is fully recomputed: every one with
    full recompute, or with ``rc_layers`` > 0 only the device's last ``rc_layers``."""
    if recompute != FULL:
        return False
    return rc_layers <= 0 or j >= n - rc_layers


def host_exposed_s(to_host_bytes, to_device_bytes, compute_s, dev):
    """Host-link transfers of one pass, hidden behind its compute: the link is
    full duplex, so the larger direction sets the transfer time."""
    return max(0.0, max(to_host_bytes, to_device_bytes) / dev["host_link_bytes_per_s"] - compute_s)


def evaluate_one(strategy, model, dev, tiers, tiles, work):
    """One candidate, the long way round. ``strategy`` keys: tp pp dp cp vpp
    mb recompute sp zero schedule n_micro, and optionally tpo opt rc_layers
    off_act off_w defer (0 when absent). Returns {OUTPUTS name: value}.

    ZeRO-3 with ``defer`` (defer_grad_sync) gathers every micro-batch but
    reduce-scatters the accumulated gradients once per step, and holds the
    stage's whole gradient unsharded.

    Host offload (ZeRO-Offload / activation offload, ``kernels.offload``): a
    layer whose activations are offloaded sends all it keeps but its input to
    the host in its forward and fetches it back in its backward; with weight
    offload it fetches its weights in both passes and sends its gradients down
    in the backward. A fully recomputed layer keeps only its input, so it
    offloads no activations. What the link cannot hide behind the pass's own
    compute is exposed. Last-k recompute (``recompute_layers``): with full
    recompute only the device's last k layers recompute; the others keep their
    activations (and offload them)."""
    t, p, d, c = (float(strategy[k]) for k in ("tp", "pp", "dp", "cp"))
    v, b, m = float(strategy["vpp"]), float(strategy["mb"]), float(strategy["n_micro"])
    recompute, zero, schedule = strategy["recompute"], strategy["zero"], strategy["schedule"]
    rc_layers = int(strategy.get("rc_layers", 0))
    off_act, off_w = bool(strategy.get("off_act", 0)), bool(strategy.get("off_w", 0))
    defer = bool(strategy.get("defer", 0)) and zero >= 3
    sp = bool(strategy["sp"]) and t > 1
    pp = int(p)
    s, ab = work["seq_len"], work["act_bytes"]
    flash = work["flash_attention"] > 0
    h, dh, V = model["hidden"], model["head_dim"], model["vocab"]
    glu, dropout = model["glu"] > 0, model["dropout"] > 0
    tokens = b * s / c  # per CP rank
    q_cols = model["heads"] / t * dh
    kv_cols = model["kv_heads"] / t * dh
    f_cols = model["ffn"] / t

    def coll(op, size, stride, nbytes):
        return collective_time_s(op, size, stride, nbytes, tiers)

    # -- one transformer layer, one micro-batch
    gemms = [
        gemm_fwd_bwd_s(tokens, q_cols + 2 * kv_cols, h, dev, tiles, ab),  # QKV
        gemm_fwd_bwd_s(tokens, h, q_cols, dev, tiles, ab),  # out-proj
        gemm_fwd_bwd_s(tokens, (2 if glu else 1) * f_cols, h, dev, tiles, ab),  # up (+gate)
        gemm_fwd_bwd_s(tokens, h, f_cols, dev, tiles, ab),  # down
    ]
    attn_f, attn_b = attention_fwd_bwd_s(b, s / c, s, model["heads"] / t, model["kv_heads"] / t, dh, True,
                                         flash, dev, ab, s / c)
    seq_tokens = tokens / t if sp else tokens  # norms/residuals run on the SP shard
    elementwise = [
        (2 * 2 * seq_tokens * h * ab, 2),  # two norms: read + write
        (2 * 3 * seq_tokens * h * ab, 2),  # two residual adds: 2 reads + write
        (2 * tokens * (q_cols + kv_cols) * ab, 1),  # rotary on Q and K
        ((3 if glu else 2) * tokens * f_cols * ab, 1),  # activation function
    ]
    if work.get("eager_elementwise", 0.0):  # torchtitan's Llama layer, op by op (kernels.elementwise)
        cast = ab + 4 if ab < 4 else 0  # x.float() / .type_as(x): read one width, write the other
        rms = cast + 8 + 4 + 8 + cast + 2 * ab  # float, pow, mean, * rsqrt, type_as, * weight
        elementwise = [
            (2 * rms * seq_tokens * h, 16),  # two fp32 RMSNorms, eight launches each
            (2 * 3 * seq_tokens * h * ab, 2),  # two residual adds
            (tokens * (q_cols + kv_cols) * (cast + 8 + cast), 6),  # complex rotary on Q and on K
            (2 * tokens * q_cols * ab, 1),  # the attention output's contiguous transpose
            ((5 if glu else 2) * tokens * f_cols * ab, 2 if glu else 1),  # silu, then the product
        ]
        if kv_cols < q_cols:  # repeat_kv: K and V materialised at the query heads
            elementwise.append((2 * tokens * (kv_cols + q_cols) * ab, 2))
    if dropout:
        elementwise.append((5 * seq_tokens * h * ab, 2))
    layer_mem_f = memory_bound_s(sum(x for x, _ in elementwise), sum(n for _, n in elementwise), dev)
    layer_f = sum(g[0] for g in gemms) + attn_f + layer_mem_f
    layer_b = sum(g[1] for g in gemms) + attn_b + 2 * layer_mem_f
    if work["gemm_cast_bytes"] > 0:
        # 8-bit GEMMs: each GEMM's 16-bit input (m x k) and weight (k x n) is cast
        # forward, its output gradient (m x n) backward; 4 GEMMs, one kernel per cast
        shapes_mnk = [(tokens, q_cols + 2 * kv_cols, h), (tokens, h, q_cols),
                      (tokens, (2 if glu else 1) * f_cols, h), (tokens, h, f_cols)]
        cast = work["gemm_cast_bytes"]
        layer_f += memory_bound_s(cast * sum(mm * k + k * n for mm, n, k in shapes_mnk), 8, dev)
        layer_b += memory_bound_s(cast * sum(mm * n for mm, n, k in shapes_mnk), 4, dev)
    # weight-gradient GEMMs dW = X^T dY, the W pass of zero-bubble schedules
    shapes = [(tokens, q_cols + 2 * kv_cols, h), (tokens, h, q_cols), (tokens, (2 if glu else 1) * f_cols, h),
              (tokens, h, f_cols)]
    layer_w = sum(gemm_time_s(k, n, mm, dev, tiles, ab) for mm, n, k in shapes)
    head_w = gemm_time_s(h, V / t, tokens, dev, tiles, ab)

    act_msg = tokens * h * ab
    if sp and strategy.get("tpo", 0):
        # chunked TP overlap (4 chunks): a collective's first chunk is exposed, the rest
        # hides behind its GEMM; AG before QKV and MLP-up, RS after out-proj and MLP-down
        ag, rs = coll(ALL_GATHER, t, 1, act_msg), coll(REDUCE_SCATTER, t, 1, act_msg)
        paired = [(ag, gemms[0][0]), (rs, gemms[1][0]), (ag, gemms[2][0]), (rs, gemms[3][0])]
        tp_fwd = sum(comm / 4 + max(0.0, comm * 3 / 4 - gemm) for comm, gemm in paired)
        # backward: each collective's transpose, behind the input-gradient GEMM (dX = dY W^T, m x k x n)
        # that produces it (RS after QKV's and MLP up's) or that it feeds (AG before out-proj's and MLP down's)
        dgrads = [gemm_time_s(mm, k, n, dev, tiles, ab) for mm, n, k in shapes]
        paired_b = [(rs, dgrads[0]), (ag, dgrads[1]), (rs, dgrads[2]), (ag, dgrads[3])]
        tp_bwd = sum(comm / 4 + max(0.0, comm * 3 / 4 - gemm) for comm, gemm in paired_b)
    elif sp:
        tp_fwd = tp_bwd = 2 * coll(ALL_GATHER, t, 1, act_msg) + 2 * coll(REDUCE_SCATTER, t, 1, act_msg)
    else:
        tp_fwd = tp_bwd = 2 * coll(ALL_REDUCE, t, 1, act_msg)

    cp_fwd = cp_bwd = 0.0
    if c > 1:
        chunk = b * (s / c) * 2 * kv_cols * ab
        ring_pass = (c - 1) * coll(SEND_RECV, c, t, chunk)
        cp_fwd = max(0.0, ring_pass - attn_f)
        cp_bwd = max(0.0, 2 * ring_pass - attn_b)

    rc_work, rc_comm = 0.0, 0.0
    if recompute == FULL:  # early stop (PyTorch's non-reentrant checkpoint): not the down projection again
        rc_work, rc_comm = layer_f - work.get("checkpoint_early_stop", 0.0) * gemms[3][0], tp_fwd + cp_fwd
    elif recompute == SELECTIVE:
        rc_work = attn_f
    elif recompute == NORMS:  # both norms again on the (SP) shard: read the input, write the output
        rc_work = memory_bound_s(2 * 2 * seq_tokens * h * ab, 2, dev)
    elif recompute == SELECTIVE_OPS:  # K (its columns of the QKV GEMM), out-proj, the up half of gate+up,
        # the norms, residual adds, rotary embedding and the activation function
        k_share = kv_cols / (q_cols + 2 * kv_cols)
        out_proj = 0.0 if sp else gemms[1][0]  # with SP the reduce-scatter's output is kept instead
        rc_work = k_share * gemms[0][0] + out_proj + layer_mem_f + (gemms[2][0] / 2 if glu else 0.0)

    # -- host offload per layer: (forward, backward) seconds the host link exposes, for a
    #    layer that keeps its activations and for one fully recomputed (it keeps its input)
    layer_input = ab * tokens * h / (t if sp else 1)
    kept_mode = NONE if recompute == FULL else recompute  # what a layer not recomputed keeps
    eager = work.get("eager_elementwise", 0.0)
    act_out = activation_bytes_per_layer(b, s, t, c, sp, kept_mode, flash, model, ab, eager) - layer_input \
        if off_act else 0.0
    w_in = layer_params(model, t) * work["weight_bytes"] if off_w else 0.0
    g_out = layer_params(model, t) * work["grad_bytes"] if off_w else 0.0
    off_kept = (host_exposed_s(act_out, w_in, layer_f, dev), host_exposed_s(g_out, act_out + w_in, layer_b, dev))
    off_recomputed = (host_exposed_s(0.0, w_in, layer_f, dev), host_exposed_s(g_out, w_in, layer_b, dev))

    # -- embedding, output head and loss
    embed_f = memory_bound_s(2 * tokens * h * ab, 1, dev)
    embed_b = memory_bound_s(3 * tokens * h * ab, 1, dev)
    if sp:
        embed_comm = coll(REDUCE_SCATTER, t, 1, act_msg) + coll(ALL_GATHER, t, 1, act_msg)
    else:
        embed_comm = coll(ALL_REDUCE, t, 1, act_msg)
    logits = tokens * V / t
    head_gemm_f, head_gemm_b = gemm_fwd_bwd_s(tokens, V / t, h, dev, tiles, ab)
    head_f = head_gemm_f + memory_bound_s(2 * seq_tokens * h * ab + 12 * logits, 4, dev)
    head_b = head_gemm_b + memory_bound_s(2 * seq_tokens * h * ab + 8 * logits, 3, dev)
    head_comm = coll(ALL_REDUCE, t, 1, 4 * tokens) * 2
    if sp:
        head_comm += coll(ALL_GATHER, t, 1, act_msg) + coll(REDUCE_SCATTER, t, 1, act_msg)

    # -- every stage
    def layers_on(i):  # L // p on each stage, one more on the first L mod p stages
        n = int(model["layers"])
        return n // pp + (1 if i < n % pp else 0)

    embedding = V * h / t

    def stage_params(i):
        total = layers_on(i) * layer_params(model, t)
        if i == 0:
            total += embedding
        if i == pp - 1:
            total += 2 * h if model["bias"] > 0 else h  # final norm (weight, and bias for LayerNorm)
            if model["tied_embeddings"] == 0 or pp > 1:
                total += embedding  # output matrix (a copy on the last stage when tied)
        return total

    stages = []
    for i in range(pp):
        n_layers = layers_on(i)
        st = dict.fromkeys(("compute", "tp", "cp", "fwd", "rc", "off"), 0.0)
        for j in range(n_layers):  # layer by layer: which recompute, which offload
            full = recomputes(recompute, rc_layers, n_layers, j)
            # full recompute: only the layers recomputed; other modes: every layer (none: nothing)
            rc_w, rc_c = (rc_work, rc_comm) if full or recompute != FULL else (0.0, 0.0)
            off_f, off_b = off_recomputed if full else off_kept
            st["compute"] += layer_f + layer_b + rc_w
            rc_cp = cp_fwd if rc_c else 0.0  # a full recompute's rerun of the forward's CP traffic
            st["tp"] += tp_fwd + tp_bwd + rc_c - rc_cp
            st["cp"] += cp_fwd + cp_bwd + rc_cp
            st["fwd"] += layer_f + tp_fwd + cp_fwd + off_f
            st["rc"] += rc_w + rc_c
            st["off"] += off_f + off_b
        st["w"] = n_layers * layer_w + (head_w if i == pp - 1 else 0.0)
        if i == 0:
            st["compute"] += embed_f + embed_b
            st["tp"] += embed_comm
            st["fwd"] += embed_f + embed_comm  # the embedding's TP collective belongs to the forward
        if i == pp - 1:
            st["compute"] += head_f + head_b
            st["tp"] += head_comm
            st["fwd"] += head_f + head_comm
        st["total"] = st["compute"] + st["tp"] + st["cp"] + st["off"]
        st["bwd"] = st["total"] - st["fwd"]
        stages.append(st)
    slowest = stages[0]
    for st in stages[1:]:
        if st["total"] > slowest["total"]:
            slowest = st
    t_max = slowest["total"]
    others = sum(st["total"] for st in stages) - t_max

    # -- pipeline: m micro-batches at the slowest stage's pace, plus the fill
    #    and drain of the other stages (1/v of them when interleaved)
    busy = m * t_max
    dp_window = busy  # the pass seconds data-parallel traffic hides behind
    fill_drain = others / v if schedule == INTERLEAVED else others
    if schedule == ZB_H1:  # the fill and drain shrink from F + B + W to F + B - W per stage: the other
        # stages defer their W passes, and the slowest one fills its wait with as many of its own, which
        # it has m - 1 of to spare below m = p (its last W ends the step)
        others_w = sum(st["w"] for st in stages) - slowest["w"]
        own_share = min(m - 1, pp - 1) / (pp - 1) if pp > 1 else 0.0
        fill_drain = max(0.0, others - others_w * (1 + own_share))
        dp_window -= others_w * own_share  # those W passes hide no data-parallel traffic
    p2p_bytes = act_msg / t if sp else act_msg
    hop = coll(SEND_RECV, p, t * c * d, p2p_bytes)
    pp_comm = 2 * (p - 1) * hop * (v if schedule == INTERLEAVED else 1)

    # -- data parallel over DP x CP
    group = d * c
    max_params = max(stage_params(i) for i in range(pp))
    grads_b = max_params * work["grad_bytes"]
    weights_b = max_params * work["weight_bytes"]
    dp_comm = 0.0
    if group > 1:
        if zero >= 3:  # one gather / scatter per layer, plus one for the rest (embedding, head, norm)
            layer = layer_params(model, t)
            units = [(layer, layers_on(0)), (max(0.0, max_params - layers_on(0) * layer), 1)]
            gather = sum(k * coll(ALL_GATHER, group, t, size * work["weight_bytes"]) for size, k in units)
            scatter = sum(k * coll(REDUCE_SCATTER, group, t, size * work["grad_bytes"]) for size, k in units)
            # deferred: the scatter once per step, after the micro-batches' gathers
            dp_comm = max(0.0, m * 2 * gather + scatter - dp_window) if defer else \
                max(0.0, m * (2 * gather + scatter) - dp_window)
        elif zero >= 1:
            dp_comm = max(0.0, coll(REDUCE_SCATTER, group, t, grads_b) - slowest["bwd"])
            dp_comm += max(0.0, coll(ALL_GATHER, group, t, weights_b) - slowest["fwd"])
        else:
            dp_comm = max(0.0, coll(ALL_REDUCE, group, t, grads_b) - slowest["bwd"])
    shard = max_params / (group if zero >= 1 else 1)
    opt_kind = strategy.get("opt", ADAM)
    if opt_kind == CPU_ADAM:  # gradients down, weights up (2 + 2 bytes); the host streams 28 bytes/param
        optimizer = (4 * shard / dev["host_link_bytes_per_s"]
                     + 28 * shard / (dev["host_memory_bytes_per_s"] * dev["memory_efficiency"]) + dev["launch_s"])
    else:  # paged 8-bit Adam: its moments over the host link first, then the update on the device
        optimizer = LINK_BYTES.get(opt_kind, 0.0) * shard / dev["host_link_bytes_per_s"] + \
            memory_bound_s(STEP_BYTES[opt_kind] * shard, 1, dev)

    step = busy + fill_drain + pp_comm + dp_comm + optimizer
    flop = 3 * work["global_batch"] * model_flop_per_sequence(model, s)
    out = {
        "step_time_analytic_s": step,
        "compute_s": m * slowest["compute"],
        "tp_comm_s": m * slowest["tp"],
        "cp_comm_s": m * slowest["cp"],
        "pp_comm_s": pp_comm,
        "dp_comm_s": dp_comm,
        "ep_comm_s": 0.0,  # dense models only: no expert parallelism
        "offload_s": m * slowest["off"],
        "moe_dispatch_s": 0.0,
        "expert_gemm_rows": 0.0,
        "expert_gemm_efficiency": 0.0,
        "bubble_s": fill_drain,
        "dualpipe_credit_s": 0.0,  # no DualPipe here: the device runs one stage
        "optimizer_s": optimizer,
        "recompute_s": m * slowest["rc"],
        "stage_fwd_s": slowest["fwd"],
        "stage_bwd_s": slowest["bwd"],
        "tokens_per_s_per_gpu": work["global_batch"] * s / step / (t * p * d * c),  # devices = t p d c
        "mfu": flop / step / (t * p * d * c) / dev["peak_flops_per_s"],
        "model_flop_per_step": flop,
    }

    # -- memory, per stage; report the stage with the highest total
    # a layer not recomputed keeps what its recompute mode keeps (all of it under full
    # recompute with last-k), a fully recomputed one its input
    kept = activation_bytes_per_layer(b, s, t, c, sp, kept_mode, flash, model, ab, eager)
    # the layer being recomputed holds again what it did not keep (nothing without recompute)
    recompute_buffer = activation_bytes_per_layer(b, s, t, c, sp, NONE, flash, model, ab, eager) - \
        activation_bytes_per_layer(b, s, t, c, sp, recompute, flash, model, ab, eager)
    # one set of communication buffers per process group of more than one rank (TP, CP, DP x CP, PP)
    groups = sum(1 for size in (t, c, d * c, p) if size > 1)
    fixed_overhead = dev["memory_overhead_bytes"] + groups * dev.get("comm_buffer_bytes", 0.0)
    # weight offload streams one unit at a time, the current and the prefetched one on the
    # device: a layer, or the embedding / output matrix, whichever is larger
    unit = max(layer_params(model, t), V * h / t)
    best = None
    host_peak = 0.0
    for i in range(pp):
        params = stage_params(i)
        host = 0.0
        if off_w:  # weights and gradients on the host, two units of them on the device (ZeRO or not)
            host += params * (work["weight_bytes"] + work["grad_bytes"])
            weights = min(params, 2 * unit) * work["weight_bytes"]
            grads = min(params, 2 * unit) * work["grad_bytes"]
        else:
            if zero >= 3:  # own shard + two gathered layers (current and prefetched), never more than all
                sharded = params / group + 2 * layer_params(model, t)
                weights = (params if sharded > params else sharded) * work["weight_bytes"]
            else:
                weights = params * work["weight_bytes"]
            # a deferred reduction accumulates in fp32; otherwise gradients are stored in the optimizer's precision
            stored = work["grad_bytes"] * (1.0 if defer else GRAD_SHARE.get(opt_kind, 1.0))
            grads = params * stored / (group if zero >= 2 and not defer else 1)
        optim = params * work["optimizer_bytes"] * STATE_SHARE[opt_kind] / (group if zero >= 1 else 1)
        # CPU Adam's fp32 master and moments, paged Adam's moments: in host memory, sharded like on a device
        host += params * work["optimizer_bytes"] * HOST_SHARE[opt_kind] / (group if zero >= 1 else 1)

        chunks = in_flight_chunks(schedule, p, v, m, i)
        n_layers = layers_on(i)
        # one micro-batch's activations on this device, layer by layer (interleaved: a chunk
        # holds 1/v of the device's layers), and what of them waits on the host
        on_device = on_host = 0.0
        offloaded_layers = 0
        for j in range(n_layers):
            recomputed = recomputes(recompute, rc_layers, n_layers, j)
            held = layer_input if recomputed else kept
            if off_act:  # only the input stays; a recomputed layer keeps nothing else to send
                on_device += layer_input
                on_host += held - layer_input
                offloaded_layers += 0 if recomputed else 1
            else:
                on_device += held
        per_chunk = 1 / v if schedule == INTERLEAVED else 1.0
        acts = chunks * on_device * per_chunk + recompute_buffer
        host_acts = chunks * on_host * per_chunk
        if offloaded_layers > 0:
            # the layer in its backward and the one being fetched are back on the device
            # (at most as many layers as went to the host)
            back = min(2.0, chunks * offloaded_layers) * (kept - layer_input)
            acts += back
            host_acts -= back
        host += host_acts
        if i == pp - 1:
            acts += work["loss_bytes"] * logits  # the loss at its peak (fused: one fp32 copy of the logits)
        tensors = weights + grads + optim + acts
        overhead = fixed_overhead + dev.get("memory_fragmentation", 0.0) * tensors
        total = tensors + overhead
        host_peak = max(host_peak, host)  # every device's host share must fit
        if best is None or total > best[0]:
            best = (total, weights, grads, optim, acts, i, host, overhead)
    total, weights, grads, optim, acts, i, host_bytes, overhead = best
    fits_device = total <= dev["hbm_capacity_bytes"]
    fits_host = host_peak <= dev["host_capacity_bytes"]
    out.update({
        "mem_weights_bytes": weights,
        "mem_grads_bytes": grads,
        "mem_optimizer_bytes": optim,
        "mem_activations_bytes": acts,
        "mem_moe_buffers_bytes": 0.0,
        "mem_host_bytes": host_bytes,
        "mem_overhead_bytes": overhead,
        "mem_peak_bytes": total,
        "mem_peak_stage": float(i),
        "feasible": 1.0 if fits_device and fits_host else 0.0,
        "infeasible_reason": OK if fits_device and fits_host else (OUT_OF_MEMORY if not fits_device
                                                                   else OUT_OF_HOST_MEMORY),
    })
    return out
