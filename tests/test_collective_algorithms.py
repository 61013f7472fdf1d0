"""Collective algorithms beyond the ring (``kernels.collectives``): NCCL's double
binary tree all-reduce and the per-tier selector (ring / tree / auto), broadcast
and reduce (nccl-tests bus factor 1), by hand, against the plain-Python
reference (``tests/naive.py``) on seeded random inputs, as properties; the
``LinkTier.allreduce_algorithm`` schema field; and the shipped catalog's
all-reduce predictions pinned to their ring values.

Formulas (one level of n ranks, S bytes, link bandwidth B, per-step latency alpha):
    ring all-reduce   2(n-1) alpha + 2(n-1)/n S / B
    tree all-reduce   2 ceil(log2 n) alpha + 2 S / B
    auto              the smaller of the two
    broadcast/reduce  (n-1) alpha + S / B
Tree minus ring = 2 alpha (ceil(log2 n) - (n-1)) + 2 S / (n B), so the tree is
faster exactly when S < S* = n B alpha (n - 1 - ceil(log2 n)); S* <= 0 for
n <= 3 (ceil(log2 n) = n - 1 there), where the ring always wins.
"""

from __future__ import annotations

import math

import naive
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.explorer.evaluate import pack_hardware
from paraspace.kernels import collectives as coll
from paraspace.kernels.codes import (
    ALL_GATHER,
    ALL_REDUCE,
    ALLREDUCE_AUTO,
    ALLREDUCE_RING,
    ALLREDUCE_TREE,
    BROADCAST,
    COLLECTIVES,
    REDUCE,
)
from paraspace.kernels.params import N_COLLECTIVES, tier_table
from paraspace.spaces import catalog
from paraspace.spaces.catalog import load_hardware
from paraspace.spaces.errors import CatalogError

GIB = 2.0**30
MIB = 2.0**20
KIB = 2.0**10
PROPS = settings(max_examples=80, deadline=None)
ALGORITHMS = (ALLREDUCE_RING, ALLREDUCE_TREE, ALLREDUCE_AUTO)


def _tiers(*levels, algorithms=None):
    """Tier records from (domain, bytes/s, latency); ``algorithms`` one code per tier."""
    out = tier_table(levels)
    if algorithms is not None:
        out.allreduce_algorithm[:] = algorithms
    return out


#: 8 devices per node on 400 GB/s (3 us), nodes on 50 GB/s (6 us)
NODE = ((8.0, 400e9, 3e-6), (0.0, 50e9, 6e-6))


# --------------------------------------------------------------------------- tree all-reduce by hand


def test_tree_all_reduce_flat():
    """16 ranks, 1 GiB, 100 GB/s, 5 us: tree 2 * ceil(log2 16) = 8 steps:
    8 * 5e-6 + 2 * 2^30 / 1e11 = 40e-6 + 21.47483648e-3 = 21.51483648e-3 s;
    the ring 2 * 15 = 30 steps: 150e-6 + 2 * 15/16 * 2^30 / 1e11 = 150e-6 + 20.1326592e-3
    = 20.2826592e-3 s, faster (1 GiB is far above S* = 16 * 1e11 * 5e-6 * (15 - 4) = 88 MB)."""
    tree, ring = 21.51483648e-3, 20.2826592e-3
    assert 8 * 5e-6 + 2 * GIB / 1e11 == pytest.approx(tree, rel=1e-12)
    assert 30 * 5e-6 + 2 * 15 / 16 * GIB / 1e11 == pytest.approx(ring, rel=1e-12)
    assert coll.flat_time_s(ALL_REDUCE, 16.0, GIB, 100e9, 5e-6, ALLREDUCE_TREE) == pytest.approx(tree, rel=1e-14)
    assert coll.flat_time_s(ALL_REDUCE, 16.0, GIB, 100e9, 5e-6, ALLREDUCE_RING) == pytest.approx(ring, rel=1e-14)
    assert coll.flat_time_s(ALL_REDUCE, 16.0, GIB, 100e9, 5e-6, ALLREDUCE_AUTO) == pytest.approx(ring, rel=1e-14)
    # the selector travels in the tier record
    for algo, want in ((ALLREDUCE_RING, ring), (ALLREDUCE_TREE, tree), (ALLREDUCE_AUTO, ring)):
        tiers = _tiers((0.0, 100e9, 5e-6), algorithms=[algo])
        assert coll.collective_time_s(ALL_REDUCE, 16.0, 1.0, GIB, tiers) == pytest.approx(want, rel=1e-14)


def test_tree_small_message_many_ranks():
    """64 ranks, 64 KiB, 100 GB/s, 5 us: ring 126 * 5e-6 + 2 * 63/64 * 65536 / 1e11
    = 630e-6 + 1.29024e-6 = 631.29024e-6 s; tree 2 * 6 * 5e-6 + 2 * 65536 / 1e11
    = 60e-6 + 1.31072e-6 = 61.31072e-6 s: the tree is ~10x faster, and auto takes it."""
    ring = coll.flat_time_s(ALL_REDUCE, 64.0, 64 * KIB, 100e9, 5e-6, ALLREDUCE_RING)
    tree = coll.flat_time_s(ALL_REDUCE, 64.0, 64 * KIB, 100e9, 5e-6, ALLREDUCE_TREE)
    auto = coll.flat_time_s(ALL_REDUCE, 64.0, 64 * KIB, 100e9, 5e-6, ALLREDUCE_AUTO)
    assert ring == pytest.approx(631.29024e-6, rel=1e-12)
    assert tree == pytest.approx(61.31072e-6, rel=1e-12)
    assert auto == tree


def test_tree_depth_of_non_power_of_two():
    """5 ranks: NCCL's tree 0 -> 4 -> 2 -> 1 is ceil(log2 5) = 3 hops deep: 6 steps.
    1 MB at 1 GB/s, 10 us: 6 * 1e-5 + 2 * 1e6 / 1e9 = 2.06e-3 s."""
    assert coll.ceil_log2(5.0) == 3.0 == naive.btree_depth(5)
    assert coll.flat_time_s(ALL_REDUCE, 5.0, 1e6, 1e9, 1e-5, ALLREDUCE_TREE) == pytest.approx(2.06e-3, rel=1e-14)


def test_ceil_log2_is_the_depth_of_nccls_tree():
    """The kernel's doubling count equals the depth found by walking NCCL's
    ncclGetBtree parent pointers (the reference), for 1..1024 ranks."""
    for n in range(1, 1025):
        assert coll.ceil_log2(float(n)) == naive.btree_depth(n) == (math.ceil(math.log2(n)) if n > 1 else 0)


def test_crossover_size():
    """8 ranks, 100 GB/s, 5 us: S* = 8 * 1e11 * 5e-6 * (7 - 3) = 16e6 bytes, where both
    take 350 us: ring 14 * 5e-6 + 2 * 7/8 * 16e6 / 1e11 = 70e-6 + 280e-6; tree
    2 * 3 * 5e-6 + 2 * 16e6 / 1e11 = 30e-6 + 320e-6. Below it auto is the tree, above it the ring."""
    s_star = 8 * 1e11 * 5e-6 * (7 - 3)
    assert s_star == pytest.approx(16e6, rel=1e-12)
    ring = coll.flat_time_s(ALL_REDUCE, 8.0, s_star, 100e9, 5e-6, ALLREDUCE_RING)
    tree = coll.flat_time_s(ALL_REDUCE, 8.0, s_star, 100e9, 5e-6, ALLREDUCE_TREE)
    assert ring == pytest.approx(350e-6, rel=1e-12)
    assert tree == pytest.approx(350e-6, rel=1e-12)
    for size, winner in ((s_star / 2, ALLREDUCE_TREE), (2 * s_star, ALLREDUCE_RING)):
        auto = coll.flat_time_s(ALL_REDUCE, 8.0, size, 100e9, 5e-6, ALLREDUCE_AUTO)
        assert auto == coll.flat_time_s(ALL_REDUCE, 8.0, size, 100e9, 5e-6, winner)
        assert auto < coll.flat_time_s(ALL_REDUCE, 8.0, size, 100e9, 5e-6, ALLREDUCE_TREE + ALLREDUCE_RING - winner)


def test_tree_on_the_outer_tier_only():
    """64 ranks on 8 nodes, stride 1, 1 GiB; NVLink tier ring, inter-node tier tree:
      tier 0 ring over 8: 14 * 3us + 2 * 7/8 * 2^30 / 400e9 = 42e-6 + 4.69762048e-3
      tier 1 tree over 8 nodes of 2^30 / 8: 2 * 3 * 6us + 2 * 2^27 / 50e9 = 36e-6 + 5.36870912e-3
    (ring there: 14 * 6us + 2 * 7/8 * 2^27 / 50e9 = 84e-6 + 4.69762048e-3)."""
    tiers = _tiers(*NODE, algorithms=[ALLREDUCE_RING, ALLREDUCE_TREE])
    expected = 42e-6 + 2 * 7 / 8 * GIB / 400e9 + 36e-6 + 2 * (GIB / 8) / 50e9
    assert expected == pytest.approx(42e-6 + 4.69762048e-3 + 36e-6 + 5.36870912e-3, rel=1e-12)
    assert coll.collective_time_s(ALL_REDUCE, 64.0, 1.0, GIB, tiers) == pytest.approx(expected, rel=1e-14)
    ring = coll.collective_time_s(ALL_REDUCE, 64.0, 1.0, GIB, _tiers(*NODE))
    assert ring == pytest.approx(42e-6 + 4.69762048e-3 + 84e-6 + 4.69762048e-3, rel=1e-12)


def test_auto_chooses_per_level():
    """Auto on both tiers, 64 ranks on 8 nodes, 1 MiB: each level takes its own faster one.
      tier 0 (8 ranks, 1 MiB, 400 GB/s, 3us): ring 42e-6 + 2 * 7/8 * 2^20 / 4e11 = 46.58752e-6,
          tree 18e-6 + 2 * 2^20 / 4e11 = 23.24288e-6 -> tree
      tier 1 (8 nodes, 128 KiB, 50 GB/s, 6us): ring 84e-6 + 2 * 7/8 * 2^17 / 5e10 = 88.58752e-6,
          tree 36e-6 + 2 * 2^17 / 5e10 = 41.24288e-6 -> tree
    and a 1 GiB message takes the ring on both (as in test_tree_on_the_outer_tier_only)."""
    auto = _tiers(*NODE, algorithms=[ALLREDUCE_AUTO, ALLREDUCE_AUTO])
    assert coll.collective_time_s(ALL_REDUCE, 64.0, 1.0, MIB, auto) == pytest.approx(
        23.24288e-6 + 41.24288e-6, rel=1e-12)
    assert coll.collective_time_s(ALL_REDUCE, 64.0, 1.0, GIB, auto) == pytest.approx(
        coll.collective_time_s(ALL_REDUCE, 64.0, 1.0, GIB, _tiers(*NODE)), rel=1e-14)


def test_algorithm_leaves_other_collectives_alone():
    """The selector is for all-reduce only."""
    for algo in ALGORITHMS:
        tiers = _tiers(*NODE, algorithms=[algo, algo])
        for _, op in COLLECTIVES:
            if op != ALL_REDUCE:
                assert coll.collective_time_s(op, 64.0, 1.0, MIB, tiers) == coll.collective_time_s(
                    op, 64.0, 1.0, MIB, _tiers(*NODE))


def test_flat_time_default_is_ring():
    """Callers that pass five arguments (the calibration fit) keep the ring."""
    assert coll.flat_time_s(ALL_REDUCE, 8.0, GIB, 1e11, 5e-6) == coll.flat_time_s(
        ALL_REDUCE, 8.0, GIB, 1e11, 5e-6, ALLREDUCE_RING)


# --------------------------------------------------------------------------- broadcast and reduce by hand


@pytest.mark.parametrize("op", [BROADCAST, REDUCE])
def test_broadcast_reduce_flat(op):
    """Bus factor 1, pipelined ring from (to) the root: 8 ranks, 1 GiB, 100 GB/s, 5 us:
    7 * 5e-6 + 2^30 / 1e11 = 35e-6 + 10.73741824e-3 = 10.77241824e-3 s."""
    expected = 10.77241824e-3
    assert 7 * 5e-6 + GIB / 1e11 == pytest.approx(expected, rel=1e-12)
    assert coll.flat_time_s(op, 8.0, GIB, 100e9, 5e-6) == pytest.approx(expected, rel=1e-14)
    assert coll.collective_time_s(op, 8.0, 1.0, GIB, _tiers((0.0, 100e9, 5e-6))) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("op", [BROADCAST, REDUCE])
def test_broadcast_reduce_two_tiers(op):
    """16 ranks on 2 nodes, 1 GiB: each of a node's 8 members carries 1/8 of the
    buffer across the node boundary through its own link (bus factor 1), and the
    slices are all-gathered (reduce-scattered) inside the nodes:
      tier 0: 7 * 3us + 7/8 * 2^30 / 400e9 = 21e-6 + 2.34881024e-3
      tier 1: 1 * 6us + 2^27 / 50e9       =  6e-6 + 2.68435456e-3
    Without latency on uniform tiers the shares add up to the flat S / B: 7/8 + 1/8 = 1."""
    expected = 21e-6 + 7 / 8 * GIB / 400e9 + 6e-6 + (GIB / 8) / 50e9
    assert expected == pytest.approx(21e-6 + 2.34881024e-3 + 6e-6 + 2.68435456e-3, rel=1e-12)
    assert coll.collective_time_s(op, 16.0, 1.0, GIB, _tiers(*NODE)) == pytest.approx(expected, rel=1e-14)
    uniform = _tiers((8.0, 100e9, 0.0), (0.0, 100e9, 0.0))
    assert coll.collective_time_s(op, 16.0, 1.0, GIB, uniform) == pytest.approx(GIB / 100e9, rel=1e-14)


def test_broadcast_three_tiers():
    """128 ranks: 4 per board (1 TB/s), 16 per node (400 GB/s), 8 nodes (50 GB/s), no latency:
    all-gather on the board (3/4 S / 1e12), all-gather of S/4 among 4 boards
    (3/4 * S/4 / 4e11), broadcast of S/16 across the 8 nodes (S/16 / 5e10)."""
    tiers = _tiers((4.0, 1e12, 0.0), (16.0, 400e9, 0.0), (0.0, 50e9, 0.0))
    expected = 0.75 * GIB / 1e12 + 0.75 * (GIB / 4) / 400e9 + (GIB / 16) / 50e9
    assert coll.collective_time_s(BROADCAST, 128.0, 1.0, GIB, tiers) == pytest.approx(expected, rel=1e-14)


def test_broadcast_op_bandwidth_and_codes():
    """A measured broadcast bandwidth (op_scale, as pack_hardware writes for the
    'broadcast' key) scales broadcast only; every collective code has a slot."""
    assert N_COLLECTIVES == len(COLLECTIVES) == max(code for _, code in COLLECTIVES) + 1
    tiers = _tiers((0.0, 100e9, 0.0))
    tiers.op_scale[0, BROADCAST] = 0.5
    assert coll.collective_time_s(BROADCAST, 8.0, 1.0, GIB, tiers) == pytest.approx(GIB / 50e9, rel=1e-14)
    assert coll.collective_time_s(REDUCE, 8.0, 1.0, GIB, tiers) == pytest.approx(GIB / 100e9, rel=1e-14)
    assert coll.collective_time_s(ALL_GATHER, 8.0, 1.0, GIB, tiers) == pytest.approx(7 / 8 * GIB / 100e9, rel=1e-14)


# --------------------------------------------------------------------------- against the naive reference


def _random_tiers(rng) -> np.ndarray:
    """1-3 tiers, domains growing by powers of two, slower outwards, a random algorithm each."""
    n = int(rng.integers(1, 4))
    levels, domain, bw = [], 1, rng.uniform(1e11, 1e12)
    for i in range(n):
        domain *= int(2 ** rng.integers(1, 4))
        levels.append((0.0 if i == n - 1 else float(domain), bw, rng.uniform(0.0, 2e-5)))
        bw *= rng.uniform(0.05, 1.0)
    return _tiers(*levels, algorithms=rng.integers(0, 3, n))


@pytest.mark.parametrize(("name", "op"), COLLECTIVES)
def test_collective_with_algorithms_matches_naive(name, op):
    """Random tier stacks with random all-reduce algorithms, group sizes up to 128,
    strides up to 32 (also not dividing the domains), messages 1 B .. 4 GiB (log-uniform,
    so both sides of the tree/ring crossover)."""
    rng = np.random.default_rng(20250101 + op)
    for _ in range(300):
        tiers = _random_tiers(rng)
        size = float(rng.integers(2, 129)) if rng.random() < 0.3 else float(2 ** rng.integers(1, 8))
        stride = float(rng.integers(1, 33)) if rng.random() < 0.3 else float(2 ** rng.integers(0, 6))
        nbytes = float(np.exp(rng.uniform(0.0, math.log(4 * GIB))))
        got = coll.collective_time_s(op, size, stride, nbytes, tiers)
        ref = naive.collective_time_s(op, size, stride, nbytes, naive.tier_list(tiers))
        assert got == pytest.approx(ref, rel=1e-12), (size, stride, nbytes, tiers)
        assert got > 0.0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_flat_all_reduce_matches_naive(algorithm):
    rng = np.random.default_rng(20250201 + algorithm)
    for _ in range(500):
        n = float(rng.integers(1, 1025))
        nbytes = float(np.exp(rng.uniform(0.0, math.log(1e10))))
        bw, lat = rng.uniform(1e9, 1e12), rng.uniform(0, 1e-4)
        assert coll.flat_time_s(ALL_REDUCE, n, nbytes, bw, lat, algorithm) == pytest.approx(
            naive.flat_time_s(ALL_REDUCE, n, nbytes, bw, lat, algorithm), rel=1e-12)


# --------------------------------------------------------------------------- properties

ranks = st.integers(2, 4096).map(float)
sizes = st.floats(1.0, 1e11)
bandwidths = st.floats(1e8, 1e13)
latencies = st.floats(0.0, 1e-4)


def _flat(algorithm, n, size, bw, lat):
    return coll.flat_time_s(ALL_REDUCE, n, size, bw, lat, algorithm)


@PROPS
@given(n=ranks, size=sizes, bw=bandwidths, lat=latencies)
def test_auto_is_never_slower_than_ring_or_tree(n, size, bw, lat):
    auto = _flat(ALLREDUCE_AUTO, n, size, bw, lat)
    ring, tree = _flat(ALLREDUCE_RING, n, size, bw, lat), _flat(ALLREDUCE_TREE, n, size, bw, lat)
    assert auto <= ring and auto <= tree
    assert auto in (ring, tree)


@st.composite
def tier_stacks(draw):
    n = draw(st.integers(1, 3))
    levels, domain = [], 1
    for i in range(n):
        domain *= 2 ** draw(st.integers(1, 3))
        levels.append((0.0 if i == n - 1 else float(domain), draw(bandwidths), draw(latencies)))
    return levels


pow2 = st.integers(0, 8).map(lambda e: float(2**e))


@PROPS
@given(size=pow2, stride=pow2, nbytes=sizes, levels=tier_stacks(), algos=st.lists(st.sampled_from(ALGORITHMS),
                                                                                 min_size=3, max_size=3))
def test_auto_hierarchy_is_never_slower(size, stride, nbytes, levels, algos):
    """Auto on every tier is no slower than any fixed choice of ring / tree per tier."""
    auto = coll.collective_time_s(ALL_REDUCE, size, stride, nbytes, _tiers(*levels, algorithms=[ALLREDUCE_AUTO] * len(levels)))
    fixed_algos = [ALLREDUCE_RING if a == ALLREDUCE_AUTO else a for a in algos[: len(levels)]]
    fixed = coll.collective_time_s(ALL_REDUCE, size, stride, nbytes, _tiers(*levels, algorithms=fixed_algos))
    assert auto <= fixed * (1 + 1e-12)


@PROPS
@given(n=ranks, size=sizes, bw=bandwidths, lat=latencies)
def test_when_the_tree_beats_the_ring(n, size, bw, lat):
    """Tree < ring exactly when S < S* = n B alpha (n - 1 - ceil(log2 n)) (up to rounding
    at the crossover): small messages on many ranks. S* <= 0 for n <= 3, so on 2 or 3
    ranks the ring is never worse, whatever the size."""
    ring, tree = _flat(ALLREDUCE_RING, n, size, bw, lat), _flat(ALLREDUCE_TREE, n, size, bw, lat)
    s_star = n * bw * lat * (n - 1.0 - math.ceil(math.log2(n)))
    if n <= 3.0:
        assert s_star <= 0.0
        assert ring < tree
    if abs(size - s_star) > 1e-9 * max(size, s_star):
        assert (tree < ring) == (size < s_star)


@PROPS
@given(n=ranks, size=sizes, bw=bandwidths)
def test_ring_never_worse_when_bandwidth_bound(n, size, bw):
    """Bandwidth-bound (no latency): the tree moves 2 S per rank, the ring 2(n-1)/n S,
    so the ring is never worse on any number of ranks: tree / ring = n / (n - 1)."""
    ring, tree = _flat(ALLREDUCE_RING, n, size, bw, 0.0), _flat(ALLREDUCE_TREE, n, size, bw, 0.0)
    assert ring < tree
    assert tree / ring == pytest.approx(n / (n - 1.0), rel=1e-12)


@PROPS
@given(n=st.integers(4, 4096).map(float), bw=bandwidths, lat=st.floats(1e-7, 1e-4))
def test_tree_beats_ring_for_small_messages_on_many_ranks(n, bw, lat):
    """From 4 ranks on, a message well below S* (here 1/4 of it) is faster by tree."""
    s_star = n * bw * lat * (n - 1.0 - math.ceil(math.log2(n)))
    assert s_star > 0.0
    size = s_star / 4.0
    assert _flat(ALLREDUCE_TREE, n, size, bw, lat) < _flat(ALLREDUCE_RING, n, size, bw, lat)


@PROPS
@given(op=st.sampled_from([ALL_REDUCE, BROADCAST, REDUCE]), size=pow2, stride=pow2, nbytes=sizes,
       levels=tier_stacks(), algo=st.sampled_from(ALGORITHMS), ups=st.lists(st.floats(1.0, 1e3), min_size=3, max_size=3))
def test_more_bandwidth_or_fewer_bytes_never_slower(op, size, stride, nbytes, levels, algo, ups):
    algos = [algo] * len(levels)
    slow = coll.collective_time_s(op, size, stride, nbytes, _tiers(*levels, algorithms=algos))
    faster = [(dom, bw * up, lat) for (dom, bw, lat), up in zip(levels, ups)]
    fast = coll.collective_time_s(op, size, stride, nbytes, _tiers(*faster, algorithms=algos))
    assert 0.0 <= fast <= slow * (1 + 1e-12)
    assert math.isfinite(slow) and (slow > 0.0) == (size > 1.0)
    assert slow <= coll.collective_time_s(op, size, stride, 2 * nbytes, _tiers(*levels, algorithms=algos))


# --------------------------------------------------------------------------- schema and catalog


H100 = catalog.CATALOG_DIR / "hardware" / "h100-sxm5-80gb.toml"


def _hardware_file(tmp_path, algorithm_line: str) -> str:
    path = tmp_path / "hw.toml"
    path.write_text(
        'extends = "h100-sxm5-80gb"\nname = "x"\n'
        '[[links]]\nname = "nvlink"\nbandwidth_GB_per_s = 450.0\nlatency_us = 3.0\ndomain_devices = 8\n'
        '[[links]]\nname = "ib"\nbandwidth_GB_per_s = 50.0\nlatency_us = 6.0\n' + algorithm_line + "\n")
    return str(path)


def test_unknown_algorithm_is_a_catalog_error(tmp_path):
    path = _hardware_file(tmp_path, 'allreduce_algorithm = "butterfly"')
    with pytest.raises(CatalogError) as info:
        load_hardware(path)
    err = info.value
    assert err.field == "links.1.allreduce_algorithm"
    assert err.value == "butterfly"
    msg = str(err)
    for part in (path, "links.1.allreduce_algorithm = 'butterfly'", "one of ['ring', 'tree', 'auto']"):
        assert part in msg, (part, msg)


def test_algorithm_of_the_wrong_type_is_a_catalog_error(tmp_path):
    path = _hardware_file(tmp_path, "allreduce_algorithm = 1")
    with pytest.raises(CatalogError) as info:
        load_hardware(path)
    assert info.value.field == "links.1.allreduce_algorithm"
    assert info.value.value == 1
    assert "string" in str(info.value)


@pytest.mark.parametrize(("label", "code"), [("ring", ALLREDUCE_RING), ("tree", ALLREDUCE_TREE),
                                             ("auto", ALLREDUCE_AUTO)])
def test_pack_hardware_carries_the_algorithm(tmp_path, label, code):
    """The label reaches the TIER record as its code; the inner tier keeps the default ring.
    16 ranks over 2 nodes, 1 MiB: only the inter-node level (2 nodes, 128 KiB) changes."""
    hw = load_hardware(_hardware_file(tmp_path, f'allreduce_algorithm = "{label}"'))
    assert [link.allreduce_algorithm for link in hw.links] == ["ring", label]
    _, tiers, _ = pack_hardware(hw, "bf16")
    assert tiers.allreduce_algorithm.tolist() == [ALLREDUCE_RING, code]
    got = coll.collective_time_s(ALL_REDUCE, 16.0, 1.0, MIB, tiers)
    ring_tiers = tiers.copy()
    ring_tiers.allreduce_algorithm[:] = ALLREDUCE_RING
    ring = coll.collective_time_s(ALL_REDUCE, 16.0, 1.0, MIB, ring_tiers)
    # on 2 nodes the tree never wins (ceil(log2 2) = 1 = n - 1): tree is slower, auto = ring
    assert (got > ring) if code == ALLREDUCE_TREE else (got == ring)


#: collective_time_s(ALL_REDUCE, size, stride, bytes) of every shipped hardware
#: (its first precision), recorded before the tree algorithm existed: the default
#: ring must reproduce them bit for bit
CASES = ((8.0, 1.0, 2.0**20), (8.0, 1.0, 2.0**30), (16.0, 1.0, 2.0**24), (64.0, 8.0, 2.0**28), (4.0, 2.0, 4096.0),
         (256.0, 1.0, 2.0**27))
RECORDED = {
    "a100-sxm4-40gb": (4.984191452991454e-05, 0.00807212047863248, 0.00027267738803418804, 0.0242441024,
                       1.802625641025641e-05, 0.002862469770940171),
    "a100-sxm4-80gb": (4.984191452991454e-05, 0.00807212047863248, 0.00027267738803418804, 0.0242441024,
                       1.802625641025641e-05, 0.002862469770940171),
    "br166-dma": (5.0331248680498634e-05, 0.0167571986488306, 0.00036582620887342206, 0.042567077867678264,
                  3.008943231441048e-05, 0.013693490430377153),
    "br166-port10": (5.0331248680498634e-05, 0.0167571986488306, 0.00036582620887342206, 0.013504490127791997,
                     3.008943231441048e-05, 0.003250976567539101),
    "br166-spc": (5.0331248680498634e-05, 0.0167571986488306, 0.00036582620887342206, 0.03663116901475749,
                  3.008943231441048e-05, 0.008816665670199512),
    "h100-sxm5-80gb": (4.709724444444445e-05, 0.005261578311111111, 0.00018215928888888887, 0.012500051199999999,
                       1.8017066666666667e-05, 0.0017887996444444444),
    "h200-sxm-141gb": (4.709724444444445e-05, 0.005261578311111111, 0.00018215928888888887, 0.012500051199999999,
                       1.8017066666666667e-05, 0.0017887996444444444),
    "h800-sxm5-80gb": (5.3468800000000006e-05, 0.0117860512, 0.00028410417777777777, 0.012500051199999999,
                       1.80384e-05, 0.0026043587555555554),
    # recorded when these profiles were added (issue 14); the 96 GB H100 has the H100's links
    "b200-sxm-180gb": (4.454862222222223e-05, 0.0026517891555555553, 0.00014138133333333331, 0.012500051199999999, 1.8008533333333332e-05, 0.001462576),
    "b300-sxm-288gb": (4.454862222222223e-05, 0.0026517891555555553, 0.00011807964444444444, 0.006628025599999999, 1.8008533333333332e-05, 0.0011013998222222222),
    "gb200-nvl72": (4.454862222222223e-05, 0.0026517891555555553, 0.00013369066666666667, 0.0019233306074074074, 1.8008533333333332e-05, 0.0008838642962962964),
    "h100-sxm5-96gb-500w": (4.709724444444445e-05, 0.005261578311111111, 0.00018215928888888887, 0.012500051199999999, 1.8017066666666667e-05, 0.0017887996444444444),
}


@pytest.mark.parametrize("name", catalog.names("hardware"))
def test_shipped_hardware_keeps_its_all_reduce_times(name):
    """Every shipped profile leaves allreduce_algorithm at its default (ring), packs
    the ring code, and predicts the all-reduce times recorded before this change."""
    hw = load_hardware(name)
    assert all(link.allreduce_algorithm == "ring" for link in hw.links)
    _, tiers, _ = pack_hardware(hw, next(iter(hw.device.peak_TFLOP_per_s)))
    assert (tiers.allreduce_algorithm == ALLREDUCE_RING).all()
    assert name in RECORDED, f"{name}: a new catalog profile; add its recorded all-reduce times"
    got = tuple(coll.collective_time_s(ALL_REDUCE, s, st_, b, tiers) for s, st_, b in CASES)
    assert got == RECORDED[name]
