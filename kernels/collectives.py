"""Collective latency on a hierarchy of link tiers (alpha-beta, nccl-tests factors).

A communication group is ``size`` ranks laid ``stride`` devices apart (the rank
layout puts TP innermost, then CP, DP, PP outermost). Tier i's domain holds
``domain_devices`` consecutive devices, so a group has
k_i = clamp(floor(domain_i / stride), 1, size) members inside one tier-i domain:
the fewest any run of domain_i devices holds, i.e. the worst-aligned domain,
which bounds the collective when the stride does not divide the domain
(tp = 3 on 8-GPU nodes: nodes hold 3, 3, 2, ... members; 2 counts). A group
whose size is not a multiple of k_i is treated as if every domain were full,
and groups whose span (stride x size) does not tile the domains as if they were
aligned to them: a group cut by a domain boundary (EP 64 on NVL72 racks of 72:
ranks 64-127 are 8 in one rack and 56 in the next) is not priced at its smallest
piece. Doing so needs the job's device count here (a group cut by no boundary
when the whole job fits one domain); until then the README says so.
A collective runs hierarchically: at tier i, r_i = k_i / k_(i-1) sub-groups
combine, each rank carrying 1/k_(i-1) of the data (two-level NCCL algorithms:
intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather). The
slowest tier crossed dominates, as it should. modeling.md section 3.

Each tier says how it runs an all-reduce (``TIER.allreduce_algorithm``): ring
(the default), NCCL's double binary tree, or auto (the faster of the two for
the message at that level, as NCCL's tuner picks). Broadcast and reduce
(nccl-tests bus factor 1) run as a pipelined ring on one tier and, across
tiers, as slices of the buffer crossing the outermost tier through every
member's link at once, with an all-gather (reduce-scatter) inside the domains.
"""

from __future__ import annotations

import math

from paraspace.kernels.codes import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    ALLREDUCE_RING,
    ALLREDUCE_TREE,
    BROADCAST,
    REDUCE,
    REDUCE_SCATTER,
    SEND_RECV,
)
from paraspace.kernels.jit import jit


@jit
def size_fraction(tier, size_bytes: float) -> float:
    """Fraction of the large-message bandwidth a ``size_bytes`` message achieves on
    ``tier``: its curve interpolated in log size, flat outside; 1 without a curve."""
    n = int(tier.n_curve)
    if n == 0 or size_bytes <= 0.0:
        return 1.0
    if size_bytes <= tier.curve_bytes[0]:
        return tier.curve_fraction[0]
    for i in range(1, n):
        if size_bytes <= tier.curve_bytes[i]:
            x0 = tier.curve_bytes[i - 1]
            x1 = tier.curve_bytes[i]
            w = math.log(size_bytes / x0) / math.log(x1 / x0)
            return tier.curve_fraction[i - 1] + w * (tier.curve_fraction[i] - tier.curve_fraction[i - 1])
    return tier.curve_fraction[n - 1]


@jit
def link_bytes_per_s(tier, op: int, size_bytes: float) -> float:
    """Achieved bandwidth of collective ``op`` moving ``size_bytes`` over ``tier``:
    its measured per-operation bandwidth (the tier's bandwidth when none was
    measured) times the bandwidth-vs-size curve."""
    return tier.bytes_per_s * tier.op_scale[op] * size_fraction(tier, size_bytes)


@jit
def members_within(domain: float, stride: float, size: float) -> float:
    """Members of a strided group inside one domain of a tier (domain 0 = whole cluster)."""
    if domain <= 0.0:
        return size
    k = domain // stride
    if k < 1.0:
        return 1.0
    return min(k, size)


@jit
def ceil_log2(n: float) -> float:
    """ceil(log2 n) for n >= 1, counted by doubling (exact, also for powers of two):
    the depth of NCCL's binary tree over n ranks (rank 0 above a complete tree)."""
    depth = 0.0
    reach = 1.0
    while reach < n:
        reach *= 2.0
        depth += 1.0
    return depth


@jit
def ring_all_reduce_s(n: float, size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Ring all-reduce (reduce-scatter then all-gather): 2(n-1) alpha + 2(n-1)/n S / bw."""
    return 2.0 * (n - 1.0) * latency_s + 2.0 * (n - 1.0) / n * size_bytes / bytes_per_s


@jit
def tree_all_reduce_s(n: float, size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """NCCL's double binary tree all-reduce, pipelined: 2 ceil(log2 n) alpha + 2 S / bw.

    Two binary trees over the n ranks, each reducing half of the buffer up to its
    root and broadcasting it back down; a rank that is interior in one tree is a
    leaf in the other, so every rank sends (and receives) S in the reduce and S in
    the broadcast (2 S), and the pipeline fills in the depth of a tree, up and
    down. Sources: NVIDIA blog "Massively Scale Your Deep Learning Training with
    NCCL 2.4" (developer.nvidia.com/blog/massively-scale-deep-learning-training-nccl-2-4/,
    double binary trees: full bandwidth, logarithmic latency); NVIDIA/nccl
    src/graph/tuning.cc, ncclTopoTuneModel: tree algorithm bandwidth = busBw * 0.5
    (so t = S / (B / 2) = 2 S / B; ring: busBw * n / (2(n-1))), tree latency
    2 * ((ranks per node - 1) * intra-node hop + log2i(nodes) * network hop), i.e.
    the depth up and down; ncclTopoGetAlgoTime: time = latency + bytes / bandwidth,
    the algorithm with the least time chosen;
    src/graph/trees.cc, ncclGetBtree: the tree over n ranks is ceil(log2 n) hops deep.
    """
    return 2.0 * ceil_log2(n) * latency_s + 2.0 * size_bytes / bytes_per_s


@jit
def flat_time_s(op: int, n: float, size_bytes: float, bytes_per_s: float, latency_s: float,
                algorithm: float = 0.0) -> float:
    """One level: steps * alpha + bytes * bus factor / bandwidth.

    ``size_bytes`` is the buffer as nccl-tests counts it: the all-reduce input,
    the all-gather output, the reduce-scatter input, the all-to-all send buffer,
    the message of a send/recv, the broadcast / reduce buffer. Bus factors:
    all-reduce 2(n-1)/n (ring); all-gather, reduce-scatter, all-to-all (n-1)/n;
    send/recv, broadcast, reduce 1 (nccl-tests doc/PERFORMANCE.md: all of a
    broadcast leaves the root through its one link; pipelined around a ring it
    takes n-1 hops to fill: (n-1) alpha + S / bw). ``algorithm`` (all-reduce only,
    kernels.codes ALLREDUCE_*): ring (the default), tree, or auto, the faster of
    the two.
    """
    if n <= 1.0 or size_bytes <= 0.0:
        return 0.0
    if op == ALL_REDUCE:
        if algorithm == ALLREDUCE_RING:
            return ring_all_reduce_s(n, size_bytes, bytes_per_s, latency_s)
        if algorithm == ALLREDUCE_TREE:
            return tree_all_reduce_s(n, size_bytes, bytes_per_s, latency_s)
        # ALLREDUCE_AUTO: the faster for this message, as NCCL's tuner picks
        return min(ring_all_reduce_s(n, size_bytes, bytes_per_s, latency_s),
                   tree_all_reduce_s(n, size_bytes, bytes_per_s, latency_s))
    if op == SEND_RECV:
        return latency_s + size_bytes / bytes_per_s
    if op == BROADCAST or op == REDUCE:
        return (n - 1.0) * latency_s + size_bytes / bytes_per_s
    return (n - 1.0) * latency_s + (n - 1.0) / n * size_bytes / bytes_per_s


@jit
def collective_time_s(op: int, size: float, stride: float, size_bytes: float, tiers) -> float:
    """Seconds for one collective of a strided group over the tier hierarchy.

    For SEND_RECV, ``size`` is the number of pipeline stages and the result is
    the time of one message between neighbouring stages."""
    if size <= 1.0 or size_bytes <= 0.0:
        return 0.0
    if op == SEND_RECV:
        # a pipeline of ``size`` stages ``stride`` apart: the innermost tier whose
        # domain holds all of it (else some neighbour pair crosses a slower tier)
        for i in range(tiers.shape[0]):
            dom = tiers[i].domain_devices
            if dom <= 0.0 or stride * size <= dom:
                return flat_time_s(op, 2.0, size_bytes, link_bytes_per_s(tiers[i], op, size_bytes),
                                   tiers[i].latency_s)
    total = 0.0
    inner = 1.0  # members combined by the tiers below
    for i in range(tiers.shape[0]):
        k = members_within(tiers[i].domain_devices, stride, size)
        r = k / inner
        if r > 1.0:
            if op == ALL_TO_ALL:
                # data for ranks inside this domain but outside the inner one
                share = (k - inner) / size
                bw = link_bytes_per_s(tiers[i], op, size_bytes / size)
                total += (r - 1.0) * tiers[i].latency_s + size_bytes * share / bw
            elif (op == BROADCAST or op == REDUCE) and k < size:
                # below the outermost level crossed: each of the inner members holds 1/inner
                # of the buffer; an all-gather (broadcast) / reduce-scatter (reduce) of the
                # part among the r sub-groups. Summed over the levels the shares telescope:
                # (1 - 1/k0) + (1/k0 - 1/k1) + ... + 1/k_last (the outermost level's slice,
                # broadcast whole with bus factor 1) = 1 buffer, the flat S / bw.
                part = size_bytes / inner
                total += (r - 1.0) * tiers[i].latency_s + (r - 1.0) / r * part / link_bytes_per_s(tiers[i], op, part)
            else:
                part = size_bytes / inner
                total += flat_time_s(op, r, part, link_bytes_per_s(tiers[i], op, part), tiers[i].latency_s,
                                     tiers[i].allreduce_algorithm)
        inner = k
        if inner >= size:
            break
    return total


@jit
def group_tier(size: float, stride: float, tiers) -> int:
    """Index of the outermost tier a group's traffic crosses."""
    for i in range(tiers.shape[0]):
        if members_within(tiers[i].domain_devices, stride, size) >= size:
            return i
    return tiers.shape[0] - 1


#: the largest all-reduce an inference engine's custom kernel takes; above it, NCCL (vLLM
#: ``vllm/distributed/device_communicators/custom_all_reduce.py``: ``max_size = 8192 * 1024``)
CUSTOM_ALL_REDUCE_MAX_BYTES = 8.0 * 1024.0 * 1024.0
#: the share of the innermost link's achieved all-reduce rate an engine's custom kernel
#: moves its bytes at: measured on H100s (NVLink 450 GB/s a direction, 360 achieved at the
#: profile's 0.80) with vLLM's kernel at 2, 4 and 8 GPUs (sgl-project/sglang pull request
#: 2904, "unit test performance in H100"): 8.7-11.8 us up to 32 KiB, then 0.51 MiB more
#: takes 8.9 us at 2 GPUs (one-shot, S / bw: 59 GB/s) and, two-shot, 13.3 and 14.6 us for
#: 0.77 and 0.88 MiB at 4 and 8 GPUs (2 (n - 1) / n S / bw: 58 and 61 GB/s); SGLang's own
#: kernel in the same table 70-72 GB/s. About 60 of 360: the kernels run on a few dozen
#: thread blocks and stay latency bound far below the link's rate up to a MiB
CUSTOM_ALL_REDUCE_LINK_SHARE = 60.0 / 360.0


@jit
def one_shot_all_reduce_s(n: float, size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """A one-shot all-reduce over directly connected peers: after a barrier every rank
    reads the whole buffer from each of the n - 1 others through its own link and sums
    it locally, then a barrier: 2 alpha + (n - 1) S / bw."""
    return 2.0 * latency_s + (n - 1.0) * size_bytes / bytes_per_s


@jit
def two_shot_all_reduce_s(n: float, size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """A two-shot all-reduce over directly connected peers: each rank reduces its 1/n of
    the buffer read from the n - 1 others, then reads the n - 1 reduced parts back, a
    barrier before, between and after: 3 alpha + 2 (n - 1) / n S / bw (the ring's
    bandwidth term, with 3 latencies instead of 2 (n - 1))."""
    return 3.0 * latency_s + 2.0 * (n - 1.0) / n * size_bytes / bytes_per_s


@jit
def engine_all_reduce_s(size: float, stride: float, size_bytes: float, tiers) -> float:
    """The tensor-parallel all-reduce of an inference engine (vLLM, SGLang, TensorRT-LLM).

    A group inside one domain of the innermost tier (GPUs all connected through
    NVLink / NVSwitch) reduces a buffer of at most ``CUSTOM_ALL_REDUCE_MAX_BYTES``
    with the engines' own peer-to-peer kernel, one-shot or two-shot, whichever is
    faster for the message (vLLM ``csrc/custom_all_reduce.cuh``: one stage below
    256 KiB on 8 GPUs, 512 KiB on up to 4, two stages above; TensorRT-LLM
    ``AllReduceStrategy`` ONESHOT / TWOSHOT). Decode's all-reduces are tens of
    kilobytes, where NCCL's ring pays 2 (n - 1) latencies and these kernels 2 or 3;
    the kernels move their bytes at ``CUSTOM_ALL_REDUCE_LINK_SHARE`` of the link's
    rate, as measured, and NCCL is taken where it is faster (TensorRT-LLM's automatic
    strategy: NCCL for large messages). Larger buffers, and groups that leave the
    innermost tier, go through NCCL (``collective_time_s``)."""
    if size <= 1.0 or size_bytes <= 0.0:
        return 0.0
    if size_bytes > CUSTOM_ALL_REDUCE_MAX_BYTES or members_within(tiers[0].domain_devices, stride, size) < size:
        return collective_time_s(ALL_REDUCE, size, stride, size_bytes, tiers)
    bw = CUSTOM_ALL_REDUCE_LINK_SHARE * link_bytes_per_s(tiers[0], ALL_REDUCE, size_bytes)
    alpha = tiers[0].latency_s
    custom = min(one_shot_all_reduce_s(size, size_bytes, bw, alpha), two_shot_all_reduce_s(size, size_bytes, bw, alpha))
    return min(custom, collective_time_s(ALL_REDUCE, size, stride, size_bytes, tiers))


ALL_OPS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV, BROADCAST, REDUCE)


@jit
def two_step_all_to_all_s(size_bytes: float, link_bytes_per_s: float, direct_share: float, forward_share: float,
                          overlapped: bool) -> float:
    """All-to-all of ``size_bytes`` per rank through one shared uplink of
    ``link_bytes_per_s`` in two steps (seed-digest.md section 2, 8 GPUs behind
    PCIe switches): step 1 sends the ``direct_share`` of the buffer to the
    directly reachable ranks, step 2 forwards the ``forward_share`` relayed
    through one of them. Sequential: (direct + forward) S / B; sending the
    forwarded part last overlaps step 2 with step 1's tail: direct S / B."""
    step1 = direct_share * size_bytes / link_bytes_per_s
    if overlapped:
        return step1
    return step1 + forward_share * size_bytes / link_bytes_per_s
