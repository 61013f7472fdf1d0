"""Collective latency kernels (``kernels.collectives``): nccl-tests factors by
hand, hierarchical groups by hand, the naive reference (ranks counted by
coordinate) on seeded random groups, and hypothesis properties."""

from __future__ import annotations

import math

import naive
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import tier_stacks

from paraspace.kernels import collectives as coll
from paraspace.kernels.codes import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVES, REDUCE_SCATTER, SEND_RECV
from paraspace.kernels.params import tier_table

GIB = 2.0**30
MIB = 2.0**20
PROPS = settings(max_examples=80, deadline=None)


def _tiers(*levels):
    return tier_table(levels)


#: 8 devices per node on 400 GB/s (3 us), nodes on 50 GB/s (6 us)
NODE = _tiers((8.0, 400e9, 3e-6), (0.0, 50e9, 6e-6))
NODE_NO_LATENCY = _tiers((8.0, 400e9, 0.0), (0.0, 50e9, 0.0))


# --------------------------------------------------------------------------- hand-derived


def test_all_reduce_flat():
    """1 GiB over 8 ranks at 100 GB/s, no latency: 2 * 7/8 * 2^30 / 1e11 = 18.79 ms."""
    flat = _tiers((0.0, 100e9, 0.0))
    expected = 2 * 7 / 8 * GIB / 1e11
    assert expected == pytest.approx(0.01879048192, rel=1e-12)
    assert coll.collective_time_s(ALL_REDUCE, 8.0, 1.0, GIB, flat) == pytest.approx(expected, rel=1e-14)
    assert coll.flat_time_s(ALL_REDUCE, 8.0, GIB, 100e9, 0.0) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("op", [ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL])
def test_one_pass_collectives_flat(op):
    """All-gather, reduce-scatter, all-to-all: (n-1)/n of the buffer and n-1 steps:
    1 GiB, 8 ranks, 100 GB/s, 5 us: 7/8 * 2^30 / 1e11 + 7 * 5e-6."""
    flat = _tiers((0.0, 100e9, 5e-6))
    expected = 7 / 8 * GIB / 1e11 + 7 * 5e-6
    assert coll.flat_time_s(op, 8.0, GIB, 100e9, 5e-6) == pytest.approx(expected, rel=1e-14)
    assert coll.collective_time_s(op, 8.0, 1.0, GIB, flat) == pytest.approx(expected, rel=1e-14)


def test_all_reduce_latency_steps():
    """Ring all-reduce: 2(n-1) = 14 steps of alpha on 8 ranks."""
    assert coll.flat_time_s(ALL_REDUCE, 8.0, GIB, 100e9, 5e-6) == pytest.approx(
        2 * 7 / 8 * GIB / 1e11 + 14 * 5e-6, rel=1e-14)


def test_send_recv_seed_number():
    """The source documents' 112 MB over 12 GB/s = 9.11 ms (binary units:
    112 * 2^20 / (12 * 2^30) = 112 / 12288 s)."""
    link = _tiers((0.0, 12 * GIB, 0.0))
    got = coll.collective_time_s(SEND_RECV, 2.0, 1.0, 112 * MIB, link)
    assert got == pytest.approx(112 / 12288, rel=1e-14)
    assert round(got * 1e3, 2) == 9.11


def test_send_recv_latency():
    """One message: alpha + bytes / bandwidth, whatever the pipeline length."""
    link = _tiers((0.0, 1e9, 1e-5))
    for stages in (2.0, 4.0, 16.0):
        assert coll.collective_time_s(SEND_RECV, stages, 1.0, 1e6, link) == pytest.approx(1e-5 + 1e-3, rel=1e-14)


def test_all_reduce_two_tiers():
    """16 ranks, stride 1, 8 per node: intra-node all-reduce on 8 ranks (the
    reduce-scatter + all-gather pair) and inter-node all-reduce of 1/8 of the
    buffer between the 2 nodes. 1 GiB:
      tier 0: 2 * 7/8 * 2^30 / 400e9 + 14 * 3us = 4.69762048 ms + 42 us
      tier 1: 2 * 1/2 * 2^27 / 50e9  +  2 * 6us = 2.68435456 ms + 12 us"""
    tier0 = 2 * 7 / 8 * GIB / 400e9
    tier1 = 2 * 1 / 2 * (GIB / 8) / 50e9
    assert tier0 == pytest.approx(4.69762048e-3, rel=1e-12)
    assert tier1 == pytest.approx(2.68435456e-3, rel=1e-12)
    got = coll.collective_time_s(ALL_REDUCE, 16.0, 1.0, GIB, NODE_NO_LATENCY)
    assert got == pytest.approx(tier0 + tier1, rel=1e-14)
    assert coll.collective_time_s(ALL_REDUCE, 16.0, 1.0, GIB, NODE) == pytest.approx(
        tier0 + 42e-6 + tier1 + 12e-6, rel=1e-14)


def test_all_gather_two_tiers():
    """64 ranks over 8 nodes: inter-node all-gather among 8 nodes of 1/8 of the
    output, then intra-node all-gather of the whole output:
    7/8 * 2^30 / 400e9 + 7/8 * 2^27 / 50e9."""
    expected = 7 / 8 * GIB / 400e9 + 7 / 8 * (GIB / 8) / 50e9
    assert coll.collective_time_s(ALL_GATHER, 64.0, 1.0, GIB, NODE_NO_LATENCY) == pytest.approx(expected, rel=1e-14)


def test_all_to_all_two_tiers():
    """16 ranks over 2 nodes, 1 GiB send buffer (1/16 to each rank): 7 peers in
    the node get 7/16 over 400 GB/s in 7 steps; the other node's 8 ranks get
    8/16 over 50 GB/s in r - 1 = 1 step:
    7/16 * 2^30 / 400e9 + 7 * 3us + 8/16 * 2^30 / 50e9 + 6us."""
    expected = 7 / 16 * GIB / 400e9 + 7 * 3e-6 + 8 / 16 * GIB / 50e9 + 6e-6
    assert coll.collective_time_s(ALL_TO_ALL, 16.0, 1.0, GIB, NODE) == pytest.approx(expected, rel=1e-14)


def test_strided_group_leaves_the_node():
    """A DP group of 8 with stride 8 (TP=8 inside the node) has one member per
    node: a flat all-reduce on the inter-node tier, 2 * 7/8 * 2^30 / 50e9 + 14 * 6us."""
    expected = 2 * 7 / 8 * GIB / 50e9 + 14 * 6e-6
    assert coll.collective_time_s(ALL_REDUCE, 8.0, 8.0, GIB, NODE) == pytest.approx(expected, rel=1e-14)


def test_strided_group_inside_the_node():
    """4 ranks with stride 2 span 8 devices: all inside the node, flat on tier 0."""
    expected = 2 * 3 / 4 * GIB / 400e9 + 6 * 3e-6
    assert coll.collective_time_s(ALL_REDUCE, 4.0, 2.0, GIB, NODE) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize(("stages", "stride", "tier"), [(4.0, 2.0, 0), (8.0, 1.0, 0), (4.0, 4.0, 1), (3.0, 3.0, 1),
                                                        (2.0, 8.0, 1)])
def test_send_recv_tier(stages, stride, tier):
    """Pipelines of ``stages`` stages ``stride`` apart: 4 x 2 and 8 x 1 fit in a
    node of 8; 4 x 4 does not; 3 x 3 does not either (the pipeline at offset 2
    uses devices 2, 5, 8 and 5 -> 8 crosses nodes); stride 8 always crosses."""
    bw, lat = NODE[tier]["bytes_per_s"], NODE[tier]["latency_s"]
    expected = lat + 1e8 / bw
    assert coll.collective_time_s(SEND_RECV, stages, stride, 1e8, NODE) == pytest.approx(expected, rel=1e-14)


def test_members_within():
    """k = clamp(floor(domain / stride), 1, size); domain 0 is the whole cluster."""
    assert coll.members_within(8.0, 1.0, 16.0) == 8.0
    assert coll.members_within(8.0, 2.0, 16.0) == 4.0
    assert coll.members_within(8.0, 16.0, 16.0) == 1.0
    assert coll.members_within(8.0, 1.0, 4.0) == 4.0
    assert coll.members_within(0.0, 4.0, 32.0) == 32.0


def test_group_tier():
    assert coll.group_tier(8.0, 1.0, NODE) == 0
    assert coll.group_tier(4.0, 2.0, NODE) == 0
    assert coll.group_tier(16.0, 1.0, NODE) == 1
    assert coll.group_tier(2.0, 8.0, NODE) == 1


@pytest.mark.parametrize(("name", "op"), COLLECTIVES)
def test_single_rank_and_empty_buffer_are_free(name, op):
    assert coll.collective_time_s(op, 1.0, 1.0, GIB, NODE) == 0.0
    assert coll.collective_time_s(op, 8.0, 1.0, 0.0, NODE) == 0.0
    assert coll.flat_time_s(op, 1.0, GIB, 1e9, 1e-5) == 0.0


# --------------------------------------------------------------------------- against the naive reference


def _random_tiers(rng) -> np.ndarray:
    """1-3 tiers, domains growing by powers of two (as the catalog validator demands), slower outwards."""
    n = int(rng.integers(1, 4))
    levels = []
    domain, bw = 1, rng.uniform(1e11, 1e12)
    for i in range(n):
        last = i == n - 1
        domain *= int(2 ** rng.integers(1, 4))
        levels.append((0.0 if last else float(domain), bw, rng.uniform(0.0, 2e-5)))
        bw *= rng.uniform(0.05, 1.0)
    return _tiers(*levels)


@pytest.mark.parametrize(("name", "op"), COLLECTIVES)
def test_collective_matches_naive(name, op):
    rng = np.random.default_rng(20240610 + op)
    for _ in range(300):
        tiers = _random_tiers(rng)
        size = float(2 ** rng.integers(1, 7))
        stride = float(2 ** rng.integers(0, 6))
        nbytes = float(rng.uniform(1.0, 4 * GIB))
        got = coll.collective_time_s(op, size, stride, nbytes, tiers)
        ref = naive.collective_time_s(op, size, stride, nbytes, naive.tier_list(tiers))
        assert got == pytest.approx(ref, rel=1e-12), (size, stride, nbytes, tiers)
        assert got > 0.0


@pytest.mark.parametrize(("name", "op"), COLLECTIVES)
def test_flat_matches_naive(name, op):
    rng = np.random.default_rng(20240620 + op)
    for _ in range(300):
        n = float(rng.integers(1, 1025))
        nbytes, bw, lat = rng.uniform(0, 1e10), rng.uniform(1e9, 1e12), rng.uniform(0, 1e-4)
        assert coll.flat_time_s(op, n, nbytes, bw, lat) == pytest.approx(naive.flat_time_s(op, n, nbytes, bw, lat),
                                                                          rel=1e-12)


def test_single_tier_equals_flat():
    """On one tier the hierarchy collapses to the flat formula (send/recv: a pair)."""
    rng = np.random.default_rng(20240630)
    for _ in range(200):
        bw, lat = rng.uniform(1e9, 1e12), rng.uniform(0, 1e-4)
        tiers = _tiers((0.0, bw, lat))
        size, nbytes = float(rng.integers(2, 512)), rng.uniform(1, 1e10)
        for _, op in COLLECTIVES:
            n = 2.0 if op == SEND_RECV else size
            assert coll.collective_time_s(op, size, 1.0, nbytes, tiers) == pytest.approx(
                coll.flat_time_s(op, n, nbytes, bw, lat), rel=1e-13)


# --------------------------------------------------------------------------- properties

ops_ = st.sampled_from([op for _, op in COLLECTIVES])
pow2 = st.integers(0, 8).map(lambda e: float(2**e))
groups = st.integers(1, 8).map(lambda e: float(2**e))  # at least 2 ranks


@PROPS
@given(op=ops_, size=pow2, stride=pow2, nbytes=st.floats(1.0, 1e11), levels=tier_stacks(),
       ups=st.lists(st.floats(1.0, 1e3), min_size=3, max_size=3))
def test_more_bandwidth_never_slower(op, size, stride, nbytes, levels, ups):
    slow = coll.collective_time_s(op, size, stride, nbytes, _tiers(*levels))
    faster = [(dom, bw * up, lat) for (dom, bw, lat), up in zip(levels, ups)]
    fast = coll.collective_time_s(op, size, stride, nbytes, _tiers(*faster))
    assert 0.0 <= fast <= slow * (1 + 1e-12)
    assert math.isfinite(slow)
    assert (slow > 0.0) == (size > 1.0)


@PROPS
@given(op=ops_, size=pow2, stride=pow2, nbytes=st.floats(1.0, 1e11), levels=tier_stacks())
def test_more_bytes_never_faster(op, size, stride, nbytes, levels):
    tiers = _tiers(*levels)
    assert coll.collective_time_s(op, size, stride, nbytes, tiers) <= coll.collective_time_s(
        op, size, stride, 2 * nbytes, tiers)


@PROPS
@given(op=ops_, stride=pow2, nbytes=st.floats(0.0, 1e11), levels=tier_stacks())
def test_single_rank_is_free(op, stride, nbytes, levels):
    assert coll.collective_time_s(op, 1.0, stride, nbytes, _tiers(*levels)) == 0.0


@PROPS
@given(op=ops_, size=groups, stride=pow2, nbytes=st.floats(1.0, 1e11), levels=tier_stacks())
def test_hierarchy_between_fastest_and_slowest_flat(op, size, stride, nbytes, levels):
    """Without latency, a hierarchical collective is no faster than the flat
    one at the fastest tier's bandwidth and no slower than at the slowest's."""
    no_lat = [(dom, bw, 0.0) for dom, bw, _ in levels]
    got = coll.collective_time_s(op, size, stride, nbytes, _tiers(*no_lat))
    n = 2.0 if op == SEND_RECV else size
    fastest = max(bw for _, bw, _ in levels)
    slowest = min(bw for _, bw, _ in levels)
    assert got <= coll.flat_time_s(op, n, nbytes, slowest, 0.0) * (1 + 1e-12)
    assert got >= coll.flat_time_s(op, n, nbytes, fastest, 0.0) * (1 - 1e-12)


@PROPS
@given(op=ops_, size=groups, stride=pow2, nbytes=st.floats(1.0, 1e11), bw=st.floats(1e8, 1e13),
       levels=tier_stacks())
def test_uniform_bandwidth_hierarchy_equals_flat(op, size, stride, nbytes, bw, levels):
    """The per-tier shares telescope: with every tier at one bandwidth (no
    latency), the hierarchical time is the flat one,
    e.g. all-reduce 2(1 - 1/k0) + 2(1 - 1/r1)/k0 = 2(1 - 1/n)."""
    uniform = [(dom, bw, 0.0) for dom, _, _ in levels]
    n = 2.0 if op == SEND_RECV else size
    got = coll.collective_time_s(op, size, stride, nbytes, _tiers(*uniform))
    assert got == pytest.approx(coll.flat_time_s(op, n, nbytes, bw, 0.0), rel=1e-12)


def test_stride_not_dividing_the_node_is_bound_by_the_worst_node():
    """A data-parallel group of 8 ranks 3 devices apart (tp = 3) on 8-device
    nodes: nodes hold 3, 3, 2, ... members; the worst, floor(8/3) = 2, bounds it.
    All-reduce of 1 GiB, NVLink 400 GB/s and IB 50 GB/s, no latency:
    intra 2 * (2-1)/2 * 2^30 / 400e9 + inter 2 * (4-1)/4 * 2^30/2 / 50e9
    = 2.684354560e-3 + 16.10612736e-3 = 18.79048192e-3 s."""
    tiers = _tiers((8.0, 400e9, 0.0), (0.0, 50e9, 0.0))
    expected = 2 * 0.5 * GIB / 400e9 + 2 * 0.75 * (GIB / 2) / 50e9
    assert expected == pytest.approx(18.79048192e-3, rel=1e-12)
    assert coll.collective_time_s(ALL_REDUCE, 8.0, 3.0, GIB, tiers) == pytest.approx(expected, rel=1e-14)


# --------------------------------------------------------------------------- the seed documents' worked numbers


def test_two_step_all_to_all_seed_numbers():
    """seed-digest.md section 2: 8 GPUs over PCIe x16 (B = 64 GB/s). Step 1 sends
    S/2 to the four direct neighbours, step 2 forwards S/8 through one of them:
    t = (1/2 + 1/8) S / B = 5 S / (8 B), effective S / t = 8 B / 5 = 102.4 GB/s;
    forwarding last overlaps step 2: t = S / (2 B), effective 2 B = 128 GB/s."""
    from paraspace.kernels.collectives import two_step_all_to_all_s

    size, link = 1e9, 64e9
    assert size / two_step_all_to_all_s(size, link, 0.5, 0.125, False) == pytest.approx(102.4e9, rel=1e-12)
    assert size / two_step_all_to_all_s(size, link, 0.5, 0.125, True) == pytest.approx(128e9, rel=1e-12)


def test_inter_node_send_of_a_micro_batch_seed_numbers():
    """112 MiB (2 x 4096 tokens x 7168 x 2 bytes) over a 12 GiB/s inter-node link:
    117,440,512 / 12,884,901,888 s = 9.115 ms (the documents' 9.11 ms, binary units)."""
    tiers = tier_table([(8.0, 100e9, 0.0), (0.0, 12 * 2**30, 0.0)])
    message = 2 * 4096 * 7168 * 2
    assert message == 112 * 2**20
    t = coll.collective_time_s(SEND_RECV, 2.0, 8.0, float(message), tiers)  # two stages 8 devices apart: the NIC
    assert t == pytest.approx(117_440_512 / 12_884_901_888, rel=1e-12)
    assert round(t * 1e3, 2) == 9.11


def test_size_curve_and_op_bandwidth():
    """A tier's measured all-gather bandwidth replaces its link bandwidth for that
    operation only, and the size curve scales it by message size: with points
    (1 MiB, 0.25) and (4 MiB, 1.0), a 2 MiB message runs at 0.25 + (log 2 / log 4)
    * 0.75 = 0.625 of it; below 1 MiB at 0.25, above 4 MiB at 1."""
    from paraspace.kernels.collectives import link_bytes_per_s

    tiers = tier_table([(0.0, 100e9, 0.0)])
    tiers.op_scale[0, ALL_GATHER] = 0.5
    tiers.n_curve[0] = 2
    tiers.curve_bytes[0, :2] = (2**20, 4 * 2**20)
    tiers.curve_fraction[0, :2] = (0.25, 1.0)
    assert link_bytes_per_s(tiers[0], ALL_GATHER, 2 * 2**20) == pytest.approx(50e9 * 0.625, rel=1e-12)
    assert link_bytes_per_s(tiers[0], ALL_REDUCE, 2 * 2**20) == pytest.approx(100e9 * 0.625, rel=1e-12)
    assert link_bytes_per_s(tiers[0], ALL_GATHER, 1000.0) == pytest.approx(50e9 * 0.25, rel=1e-12)
    assert link_bytes_per_s(tiers[0], ALL_GATHER, 2**30) == pytest.approx(50e9, rel=1e-12)


# --------------------------------------------------------------------------- serving engines' custom all-reduce


def test_engine_all_reduce_one_shot_by_hand():
    """A small TP all-reduce, 4,096 B over 8 ranks of one 400 GB/s, 3 us node. The engines'
    kernel moves its bytes at 60/360 of the link's rate (``CUSTOM_ALL_REDUCE_LINK_SHARE``,
    measured on H100s): 6.6667e10 B/s. One-shot 2 * 3 us + 7 * 4,096 / 6.6667e10 = 6.43008
    us; two-shot 3 * 3 us + 1.75 * 4,096 / 6.6667e10 = 9.10752 us; NCCL's ring pays 14
    latencies: 42.0179 us. One-shot."""
    bw = 4e11 * 60 / 360
    one = 2 * 3e-6 + 7 * 4096 / bw
    assert one == pytest.approx(6.43008e-6, rel=1e-12)
    assert coll.engine_all_reduce_s(8.0, 1.0, 4096.0, NODE) == pytest.approx(one, rel=1e-14)


def test_engine_all_reduce_two_shot_by_hand():
    """A decode step's, 4 tokens x 8,192 x 2 bytes = 65,536 B over 8 ranks: one-shot 6 us +
    7 * 65,536 / 6.6667e10 = 12.88128 us, two-shot 9 us + 1.75 * 65,536 / 6.6667e10 =
    10.72032 us; NCCL's ring 14 * 3 us + 1.75 * 65,536 / 4e11 = 42.28672 us. Two-shot."""
    size = 65_536.0
    two = 3 * 3e-6 + 1.75 * size / (4e11 * 60 / 360)
    assert two == pytest.approx(10.72032e-6, rel=1e-12)
    assert coll.engine_all_reduce_s(8.0, 1.0, size, NODE) == pytest.approx(two, rel=1e-14)
    assert coll.collective_time_s(ALL_REDUCE, 8.0, 1.0, size, NODE) == pytest.approx(14 * 3e-6 + 1.75 * size / 4e11,
                                                                                      rel=1e-14)


def test_engine_all_reduce_takes_nccl_where_faster_by_hand():
    """4 MiB over 8 ranks: the kernel's two-shot 9 us + 1.75 * 4,194,304 / 6.6667e10 =
    119.10048 us (these kernels stay latency bound to a MiB, as measured), NCCL's ring
    42 us + 1.75 * 4,194,304 / 4e11 = 60.35008 us: the engine's all-reduce is never slower
    than NCCL's, which the engines fall back to."""
    size = 4 * MIB
    assert 3 * 3e-6 + 1.75 * size / (4e11 * 60 / 360) == pytest.approx(119.10048e-6, rel=1e-12)
    ring = 14 * 3e-6 + 1.75 * size / 4e11
    assert ring == pytest.approx(60.35008e-6, rel=1e-12)
    assert coll.engine_all_reduce_s(8.0, 1.0, size, NODE) == pytest.approx(ring, rel=1e-14)


def test_custom_all_reduce_share_against_the_measured_kernel():
    """The share's source, vLLM's kernel on H100s (sglang pull request 2904): from 32 KiB to
    1 MiB its time grows by 17.9, 31.0 and 33.2 us at 2, 4 and 8 GPUs (8.7 -> 26.6, 9.2 ->
    40.2, 11.8 -> 45.0 us; launches included, as the growth cancels them). The kernel as
    priced on the H100 profile (one- or two-shot at the share of the link's achieved 360
    GB/s) grows within 12% of each: 16.9, 27.6 and 29.8 us; at the link's full rate it
    grew a sixth to a third of that. The engine's all-reduce takes NCCL where the model
    finds it faster (at 4 GPUs and a MiB)."""
    from paraspace.explorer.evaluate import pack_hardware
    from paraspace.spaces.catalog import load_hardware

    _, tiers, _ = pack_hardware(load_hardware("h100-sxm5-80gb"), "bf16")
    tier = tiers[0]

    def kernel(n, nbytes):
        bw = coll.CUSTOM_ALL_REDUCE_LINK_SHARE * coll.link_bytes_per_s(tier, ALL_REDUCE, nbytes)
        return min(coll.one_shot_all_reduce_s(n, nbytes, bw, tier.latency_s),
                   coll.two_shot_all_reduce_s(n, nbytes, bw, tier.latency_s))

    measured = {2.0: 26.6 - 8.7, 4.0: 40.2 - 9.2, 8.0: 45.0 - 11.8}
    for n, grew in measured.items():
        model = (kernel(n, float(MIB)) - kernel(n, 32768.0)) * 1e6
        assert abs(model / grew - 1.0) < 0.12, (n, model, grew)
        nccl = coll.collective_time_s(ALL_REDUCE, n, 1.0, float(MIB), tiers)
        assert coll.engine_all_reduce_s(n, 1.0, float(MIB), tiers) == min(kernel(n, float(MIB)), nccl)


@pytest.mark.parametrize(("size", "bytes_", "stride"), [
    (8.0, 8 * MIB + 1, 1.0),  # above the custom kernel's 8 MiB buffer
    (16.0, 65_536.0, 1.0),  # leaves the node
    (4.0, 65_536.0, 4.0),  # 4 ranks 4 apart: only 2 per node
])
def test_engine_all_reduce_falls_back_to_nccl(size, bytes_, stride):
    """Where the engines' kernel does not apply, the all-reduce is NCCL's."""
    assert coll.engine_all_reduce_s(size, stride, bytes_, NODE) == coll.collective_time_s(
        ALL_REDUCE, size, stride, bytes_, NODE)


@PROPS
@given(levels=tier_stacks(), size=st.sampled_from([1.0, 2.0, 4.0, 8.0, 16.0, 64.0]),
       nbytes=st.floats(0.0, 64 * MIB))
def test_engine_all_reduce_never_slower_than_nccl_inside_a_domain(levels, size, nbytes):
    """Inside one innermost domain (a fully connected NVLink group) the engines' all-reduce
    is never slower than NCCL's ring there (n >= 2): the kernel where it is faster, NCCL
    where not; it is 0 for one rank or no bytes and never negative."""
    tiers = _tiers(*levels)
    t = coll.engine_all_reduce_s(size, 1.0, nbytes, tiers)
    assert t >= 0.0
    if size <= 1.0 or nbytes <= 0.0:
        assert t == 0.0
    ring_inside = coll.members_within(tiers[0].domain_devices, 1.0, size) >= size
    if ring_inside and size >= 2.0:
        assert t <= coll.collective_time_s(ALL_REDUCE, size, 1.0, nbytes, tiers) * (1 + 1e-12)
