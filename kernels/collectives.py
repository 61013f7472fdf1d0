"""Collective latency on a hierarchy of link tiers (alpha-beta, nccl-tests factors).

A communication group is ``size`` ranks laid ``stride`` devices apart (the rank
layout puts TP innermost, then CP, DP, PP outermost). Tier i's domain holds
``domain_devices`` consecutive devices, so a group has
k_i = clamp(floor(domain_i / stride), 1, size) members inside one tier-i domain:
the fewest any run of domain_i devices holds, i.e. the worst-aligned domain,
which bounds the collective when the stride does not divide the domain
(tp = 3 on 8-GPU nodes: nodes hold 3, 3, 2, ... members; 2 counts). A group
whose size is not a multiple of k_i is treated as if every domain were full.
A collective runs hierarchically: at tier i, r_i = k_i / k_(i-1) sub-groups
combine, each rank carrying 1/k_(i-1) of the data (two-level NCCL algorithms:
intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather). The
slowest tier crossed dominates, as it should. modeling.md section 3.
"""

from __future__ import annotations

import math

from kernels.codes import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SEND_RECV
from kernels.jit import jit


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
def flat_time_s(op: int, n: float, size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """One level: steps * alpha + bytes * bus factor / bandwidth.

    ``size_bytes`` is the buffer as nccl-tests counts it: the all-reduce input,
    the all-gather output, the reduce-scatter input, the all-to-all send buffer,
    the message of a send/recv. Bus factors: all-reduce 2(n-1)/n; all-gather,
    reduce-scatter, all-to-all (n-1)/n; send/recv 1.
    """
    if n <= 1.0 or size_bytes <= 0.0:
        return 0.0
    if op == ALL_REDUCE:
        return 2.0 * (n - 1.0) * latency_s + 2.0 * (n - 1.0) / n * size_bytes / bytes_per_s
    if op == SEND_RECV:
        return latency_s + size_bytes / bytes_per_s
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
            else:
                part = size_bytes / inner
                total += flat_time_s(op, r, part, link_bytes_per_s(tiers[i], op, part), tiers[i].latency_s)
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


ALL_OPS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV)


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
