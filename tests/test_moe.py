"""MoE kernels (``kernels.moe``): routing fan-out against a seeded Monte Carlo
simulation and an exhaustive enumeration, the seed documents' numbers by hand,
every dispatch algorithm's seconds on a small hand-built topology, and
hypothesis properties. modeling.md section 4, seed-digest.md section 2."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import tier_stacks

from paraspace.kernels import moe
from paraspace.kernels.codes import (
    ALL_GATHER,
    ALL_TO_ALL,
    DISPATCH_ALLGATHER,
    DISPATCH_ALLTOALL,
    DISPATCH_HIERARCHICAL,
    DISPATCH_LOW_LATENCY,
    DISPATCH_SENDRECV_ALLGATHER,
    DISPATCH_SENDRECV_ALLGATHER_SPLIT,
    REDUCE_SCATTER,
    SEND_RECV,
)
from paraspace.kernels.ops import gemm_time_s
from paraspace.kernels.params import tier_table

GIB = 2.0**30
MIB = 2.0**20
PROPS = settings(max_examples=80, deadline=None)
ALGORITHMS = (DISPATCH_ALLGATHER, DISPATCH_ALLTOALL, DISPATCH_HIERARCHICAL, DISPATCH_SENDRECV_ALLGATHER,
              DISPATCH_SENDRECV_ALLGATHER_SPLIT, DISPATCH_LOW_LATENCY)


def _tiers(*levels):
    return tier_table(levels)


# --------------------------------------------------------------------------- fan-out: references


def _distinct(rng, n: int, pool: int, k: int) -> np.ndarray:
    """``n`` rows of ``k`` distinct integers drawn uniformly from [0, pool):
    rows with a repeat are redrawn whole (rejection), so every k-set is equally likely."""
    out = rng.integers(0, pool, size=(n, k))
    while True:
        s = np.sort(out, axis=1)
        bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if not bad.any():
            return out
        out[bad] = rng.integers(0, pool, size=(int(bad.sum()), k))


def _simulate(experts: int, top_k: int, e: int, r: int, max_nodes: int, n: int, seed: int):
    """Per token (from a uniformly drawn source rank): other ranks of its node
    hit, ranks on other nodes hit, other nodes hit. Rank j hosts experts
    [j E/e, (j+1) E/e), node = rank // r. Node-limited routing (0 < M < N):
    M distinct nodes uniformly, then top_k distinct experts uniformly among theirs."""
    rng = np.random.default_rng(seed)
    nodes = e // r
    per_node, per_rank = experts // nodes, experts // e
    rows = np.arange(n)
    src = rng.integers(0, e, size=n)
    src_node = src // r
    if 0 < max_nodes < nodes:
        chosen = _distinct(rng, n, nodes, max_nodes)
        local = _distinct(rng, n, max_nodes * per_node, top_k)
        expert = np.take_along_axis(chosen, local // per_node, axis=1) * per_node + local % per_node
    else:
        expert = _distinct(rng, n, experts, top_k)
    rank = expert // per_rank
    hit = np.zeros((n, e), dtype=bool)
    hit[rows[:, None], rank] = True
    node_hit = np.zeros((n, nodes), dtype=bool)
    node_hit[rows[:, None], rank // r] = True
    same = (np.arange(e) // r)[None, :] == src_node[:, None]
    intra = (hit & same).sum(axis=1) - hit[rows, src]
    inter = (hit & ~same).sum(axis=1)
    other_nodes = node_hit.sum(axis=1) - node_hit[rows, src_node]
    return intra, inter, other_nodes


def _enumerate(experts: int, top_k: int, e: int, r: int, max_nodes: int):
    """The exact expectation of the same three counts: every source rank, node
    set and expert set weighted equally (small cases only)."""
    nodes = e // r
    per_node, per_rank = experts // nodes, experts // e
    m = max_nodes if 0 < max_nodes < nodes else nodes
    total = np.zeros(3)
    count = 0
    for src in range(e):
        for node_set in itertools.combinations(range(nodes), m):
            pool = [node * per_node + j for node in node_set for j in range(per_node)]
            for picks in itertools.combinations(pool, top_k):
                ranks = {x // per_rank for x in picks} - {src}
                total += (sum(1 for q in ranks if q // r == src // r), sum(1 for q in ranks if q // r != src // r),
                          len({q // r for q in ranks} - {src // r}))
                count += 1
    return total / count


# --------------------------------------------------------------------------- fan-out vs Monte Carlo / enumeration

MC_TOKENS = 200_000


@pytest.mark.parametrize(("experts", "top_k", "e", "r", "max_nodes"), [
    (256, 8, 8, 8, 0),  # single node: the documents' EP8 comparison
    (256, 8, 32, 16, 0),  # two 16-die nodes (the EP32 plan)
    (256, 8, 64, 8, 4),  # DeepSeek-V3-like: 8 nodes, at most 4 per token
    (8, 2, 8, 8, 0),  # Mixtral-like
    (160, 6, 16, 8, 3),  # 2 nodes: max_nodes = 3 >= N does not limit anything
    (160, 6, 40, 8, 3),  # 5 nodes, 3 per token: a limit that binds, not a power of two
])
def test_fanout_matches_monte_carlo(experts, top_k, e, r, max_nodes):
    """Means of 200k simulated tokens within 3 standard errors of the kernel
    (a zero-variance count, e.g. inter-node on one node, must match exactly)."""
    got = moe.fanout(float(experts), float(top_k), float(e), float(r), float(max_nodes))
    sims = _simulate(experts, top_k, e, r, max_nodes, MC_TOKENS, seed=experts * 1000 + e * 10 + max_nodes)
    for name, value, sample in zip(("intra ranks", "inter ranks", "inter nodes"), got, sims):
        se = sample.std() / math.sqrt(MC_TOKENS)
        assert abs(sample.mean() - value) <= 3.0 * se + 1e-12, (name, value, sample.mean(), se)
    intra, inter, nodes = got
    assert 0.0 <= intra <= r - 1 and 0.0 <= inter <= e - r and 0.0 <= nodes <= e // r - 1


@pytest.mark.parametrize(("experts", "top_k", "e", "r", "max_nodes"), [
    (8, 2, 8, 4, 0),  # 2 nodes of 4 ranks, 1 expert each
    (16, 3, 8, 2, 2),  # 4 nodes, 2 per token, 2 experts per rank
    (12, 2, 6, 2, 1),  # 3 nodes, one per token: nothing crosses a node
    (24, 4, 8, 2, 3),  # 4 nodes, 3 per token
    (16, 4, 4, 4, 0),  # one node
])
def test_fanout_matches_enumeration(experts, top_k, e, r, max_nodes):
    """Exact expectation by enumerating every source rank, node set and expert set."""
    got = moe.fanout(float(experts), float(top_k), float(e), float(r), float(max_nodes))
    assert np.asarray(got) == pytest.approx(_enumerate(experts, top_k, e, r, max_nodes), rel=1e-12, abs=1e-15)


# --------------------------------------------------------------------------- hand-derived fan-out


def test_p_hit_half_of_the_experts():
    """The other node of two holds 128 of 256 experts; a token misses it only if
    all 8 picks land on this node (without replacement):
    miss = 128/256 * 127/255 * 126/254 * 125/253 * 124/252 * 123/251 * 122/250 * 121/249
         = 852841 / 244371090 = 0.0034899...
    so p = 0.99651, slightly above the digest's 1 - (1/2)^8 = 0.99609 (picks
    with replacement), since every later factor is below 1/2."""
    miss = 128 / 256 * 127 / 255 * 126 / 254 * 125 / 253 * 124 / 252 * 123 / 251 * 122 / 250 * 121 / 249
    assert miss == pytest.approx(852841 / 244371090, rel=1e-14)
    got = moe.p_hit(256.0, 128.0, 8.0)
    assert got == pytest.approx(1.0 - miss, rel=1e-14)
    assert got == pytest.approx(0.9965100577, abs=1e-10)
    assert got > 1.0 - 0.5**8 == 0.99609375


def test_p_hit_edges():
    """An empty unit is never hit; a unit leaving fewer than k experts outside always is."""
    assert moe.p_hit(256.0, 0.0, 8.0) == 0.0
    assert moe.p_hit(256.0, 250.0, 8.0) == 1.0  # 6 experts outside < 8 picks
    assert moe.p_hit(8.0, 1.0, 1.0) == pytest.approx(1 / 8, rel=1e-15)
    assert moe.p_hit(8.0, 1.0, 2.0) == pytest.approx(1 - 7 / 8 * 6 / 7, rel=1e-15)  # 2/8


def test_fanout_single_node_exact_vs_documents():
    """E = 256, top-8, 8 ranks of 32 experts on one node: each of the 7 other
    ranks is hit with 1 - C(224, 8) / C(256, 8), so 7 * (1 - C(224,8)/C(256,8))
    = 4.6328 forwards per token, not the documents' rough (0 + 7) / 2 = 3.5."""
    exact = 7 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert exact == pytest.approx(4.632820500334669, rel=1e-14)
    intra, inter, nodes = moe.fanout(256.0, 8.0, 8.0, 8.0, 0.0)
    assert intra == pytest.approx(exact, rel=1e-14)
    assert round(intra, 2) == 4.63
    assert inter == 0.0 and nodes == 0.0


def test_fanout_two_nodes_by_hand():
    """E = 8, top-2, 8 ranks (1 expert each), 4 per node: a rank is hit with
    1 - 7/8 * 6/7 = 1/4, a node (4 experts) with 1 - 4/8 * 3/7 = 11/14:
    intra 3 * 1/4, inter ranks 4 * 1/4, inter nodes 1 * 11/14."""
    got = moe.fanout(8.0, 2.0, 8.0, 4.0, 0.0)
    assert np.asarray(got) == pytest.approx([0.75, 1.0, 11 / 14], rel=1e-14)


def test_fanout_node_limited_by_hand():
    """E = 256, top-8, 64 ranks on 8 nodes, at most 4 nodes: a node is in the
    token's set with 4/8 and then its 32 experts are among a pool of 128;
    a rank (4 experts) of a chosen node is hit with 1 - prod_{i<8} (124-i)/(128-i)."""
    p_set = 4 / 8
    p_rank = 1 - math.prod((124 - i) / (128 - i) for i in range(8))
    p_node = 1 - math.prod((96 - i) / (128 - i) for i in range(8))
    got = moe.fanout(256.0, 8.0, 64.0, 8.0, 4.0)
    assert np.asarray(got) == pytest.approx([7 * p_set * p_rank, 56 * p_set * p_rank, 7 * p_set * p_node], rel=1e-13)
    # at most 4 nodes per token, so at most 4 other nodes (here 3.5 * p_node)
    assert got[2] <= 4.0


# --------------------------------------------------------------------------- the documents' dispatch volumes

#: 2 x 4096 tokens per die per micro-batch, hidden 7168, bf16
TOKEN_BYTES = 2 * 4096 * 7168 * 2


def test_token_bytes_are_112_mib():
    assert TOKEN_BYTES == 117_440_512 == 112 * MIB


def test_dispatch_bytes_seed_document_volumes():
    """Single node of 8 ranks: all-gather 112 MiB x 8 = 896 MiB; all-to-all with
    the documents' 3.5 forwards 112 x 3.5 = 392 MiB; with the exact fan-out
    112 x 4.6328 = 518.9 MiB."""
    assert moe.dispatch_bytes(DISPATCH_ALLGATHER, TOKEN_BYTES, 8.0, 0.0) == 896 * MIB
    assert moe.dispatch_bytes(DISPATCH_ALLTOALL, TOKEN_BYTES, 8.0, 3.5) == 392 * MIB
    exact, _, _ = moe.fanout(256.0, 8.0, 8.0, 8.0, 0.0)
    got = moe.dispatch_bytes(DISPATCH_ALLTOALL, TOKEN_BYTES, 8.0, exact)
    assert got == pytest.approx(112 * MIB * 7 * (1 - math.comb(224, 8) / math.comb(256, 8)), rel=1e-14)
    assert got / MIB == pytest.approx(518.87589604, rel=1e-9)
    for algorithm in (DISPATCH_HIERARCHICAL, DISPATCH_SENDRECV_ALLGATHER, DISPATCH_SENDRECV_ALLGATHER_SPLIT):
        assert moe.dispatch_bytes(algorithm, TOKEN_BYTES, 8.0, 3.5) == 392 * MIB


# --------------------------------------------------------------------------- dispatch seconds by hand

B = 1e8  # token bytes per rank


def _toy_tiers(inner_ag: float = 80e9):
    """Node domain 4 at 100 GB/s, inter-node 10 GB/s, no latency; per-op
    bandwidths all distinct: in the node AG inner_ag, RS 90, A2A 50, SR 40 GB/s;
    between nodes AG 8, RS 9, A2A 5, SR 4 GB/s."""
    tiers = _tiers((4.0, 100e9, 0.0), (0.0, 10e9, 0.0))
    for i, (ag, rs, a2a, sr) in enumerate(((inner_ag, 90e9, 50e9, 40e9), (8e9, 9e9, 5e9, 4e9))):
        for op, bw in ((ALL_GATHER, ag), (REDUCE_SCATTER, rs), (ALL_TO_ALL, a2a), (SEND_RECV, sr)):
            tiers.op_scale[i, op] = bw / tiers.bytes_per_s[i]  # an op's bandwidth / the tier's
    return tiers


def _dispatch(algorithm, tiers, e=8.0, experts=8.0, top_k=2.0, max_nodes=0.0, token_bytes=B):
    return moe.dispatch_s(algorithm, token_bytes, e, 1.0, experts, top_k, max_nodes, tiers)


# E = 8, top-2, e = 8, stride 1 on 4-rank nodes: r = 4, N = 2 and (test_fanout_two_nodes_by_hand)
# per token 3/4 other ranks in the node, 1 rank on the other node, 11/14 other nodes.


def test_ranks_per_node():
    tiers = _toy_tiers()
    assert moe.ranks_per_node(8.0, 1.0, tiers) == 4.0
    assert moe.ranks_per_node(8.0, 2.0, tiers) == 2.0
    assert moe.ranks_per_node(2.0, 1.0, tiers) == 2.0
    assert moe.ranks_per_node(8.0, 1.0, _tiers((0.0, 1e9, 0.0))) == 8.0  # one tier: all in one "node"


def test_dispatch_allgather_by_hand():
    """Hierarchical all-gather of the 8B output: inside the node 4 members,
    3/4 * 8B at 80 GB/s = 7.5 ms; between the 2 nodes the 2B each node-rank
    carries, 1/2 * 2B at 8 GB/s = 12.5 ms: 20 ms. Combine reduce-scatters the
    same buffer: 6B / 90 GB/s + B / 9 GB/s = 6.667 + 11.111 ms.
    Bytes over the node tier: (r-1) N B = 6B."""
    tiers = _toy_tiers()
    t, intra, _ = _dispatch(DISPATCH_ALLGATHER, tiers)
    assert 3 / 4 * 8 * B / 80e9 == pytest.approx(7.5e-3, rel=1e-14)
    assert 1 / 2 * 2 * B / 8e9 == pytest.approx(12.5e-3, rel=1e-14)
    assert t == pytest.approx(20e-3, rel=1e-14)
    assert intra == pytest.approx(6 * B, rel=1e-14)
    combine = moe.combine_s(DISPATCH_ALLGATHER, B, 8.0, 1.0, 8.0, 2.0, 0.0, tiers)
    assert combine == pytest.approx(6 * B / 90e9 + B / 9e9, rel=1e-14)


def test_dispatch_allgather_bytes_match_its_time_model():
    """The hierarchical all-gather the time is charged for moves (N-1) B = 1B per
    rank between nodes (as sendrecv-allgather reports for the same exchange), so
    node and inter-node bytes add up to the (e-1) B = 7B a rank receives;
    (e - r) B = 4B (a flat all-gather's NIC bytes) gives 10B."""
    _, intra, inter = _dispatch(DISPATCH_ALLGATHER, _toy_tiers())
    _, _, sr_inter = _dispatch(DISPATCH_SENDRECV_ALLGATHER, _toy_tiers())
    assert inter == pytest.approx(sr_inter, rel=1e-14)
    assert intra + inter == pytest.approx(7 * B, rel=1e-14)


def test_dispatch_alltoall_by_hand():
    """Intra 3/4 B at 50 GB/s = 1.5 ms beside inter 1 B at 5 GB/s = 20 ms: max = 20 ms."""
    t, intra, inter = _dispatch(DISPATCH_ALLTOALL, _toy_tiers())
    assert t == pytest.approx(max(0.75 * B / 50e9, 1.0 * B / 5e9), rel=1e-14)
    assert t == pytest.approx(20e-3, rel=1e-14)
    assert (intra, inter) == pytest.approx((0.75 * B, 1.0 * B), rel=1e-14)


def test_dispatch_alltoall_latency_steps():
    """With latency: (r - 1) = 3 intra steps, (e - r) = 4 inter steps:
    max(1.5 ms + 3 * 2 us, 20 ms + 4 * 10 us)."""
    tiers = _toy_tiers()
    tiers.latency_s[:] = (2e-6, 10e-6)
    t, _, _ = _dispatch(DISPATCH_ALLTOALL, tiers)
    assert t == pytest.approx(max(1.5e-3 + 3 * 2e-6, 20e-3 + 4 * 10e-6), rel=1e-14)


def test_dispatch_hierarchical_by_hand():
    """One NIC send per (token, other node): 11/14 B at SR 4 GB/s = 19.643 ms;
    intra forwarding of its own and the other node's tokens, N * 3/4 B = 1.5B
    at the node's link bandwidth 100 GB/s (DeepEP-style kernels drive the links,
    not the measured A2A collective) = 1.5 ms; pipelined: max + min / 4 =
    19.643 + 0.375 ms."""
    t, intra, inter = _dispatch(DISPATCH_HIERARCHICAL, _toy_tiers())
    t_inter = 11 / 14 * B / 4e9
    t_intra = 2 * 0.75 * B / 100e9
    assert t_inter == pytest.approx(19.642857142857e-3, rel=1e-12)
    assert t_intra == pytest.approx(1.5e-3, rel=1e-14)
    assert t == pytest.approx(max(t_inter, t_intra) + min(t_inter, t_intra) / 4, rel=1e-14)
    assert (intra, inter) == pytest.approx((1.5 * B, 11 / 14 * B), rel=1e-14)
    assert moe.combine_s(DISPATCH_HIERARCHICAL, B, 8.0, 1.0, 8.0, 2.0, 0.0, _toy_tiers()) == t


@pytest.mark.parametrize(("inner_ag", "t_ag"), [(80e9, 6 * B / 80e9), (10e9, 6 * B / 10e9)])
def test_dispatch_sendrecv_allgather_by_hand(inner_ag, t_ag):
    """Send every token to the other node's same-index rank: (N-1) B at SR
    4 GB/s = 25 ms; then an intra-node all-gather of N B per rank over the 4
    ranks: 3/4 * 4 * 2B = 6B at the node's AG bandwidth (80 GB/s: 7.5 ms;
    10 GB/s: 60 ms). Plain: inter + ag (32.5 / 85 ms). Split: inter/2 +
    max(inter/2, ag/2) + ag/2 (12.5 + 12.5 + 3.75 = 28.75 ms / 12.5 + 30 + 30 = 72.5 ms)."""
    tiers = _toy_tiers(inner_ag)
    t_inter = B / 4e9
    assert t_inter == pytest.approx(25e-3, rel=1e-14)
    t, intra, inter = _dispatch(DISPATCH_SENDRECV_ALLGATHER, tiers)
    assert t == pytest.approx(t_inter + t_ag, rel=1e-14)
    assert (intra, inter) == pytest.approx((6 * B, B), rel=1e-14)
    split, intra_s, inter_s = _dispatch(DISPATCH_SENDRECV_ALLGATHER_SPLIT, tiers)
    assert split == pytest.approx(t_inter / 2 + max(t_inter / 2, t_ag / 2) + t_ag / 2, rel=1e-14)
    assert split == pytest.approx({80e9: 28.75e-3, 10e9: 72.5e-3}[inner_ag], rel=1e-14)
    assert (intra_s, inter_s) == (intra, inter)
    assert split <= t


def test_dispatch_single_node_has_no_inter_part():
    """e = 4 fits the node: all-to-all is 3 * p_hit(8, 2, 2) B = 3 * 13/28 B at 50 GB/s."""
    t, intra, inter = _dispatch(DISPATCH_ALLTOALL, _toy_tiers(), e=4.0)
    assert inter == 0.0
    assert intra == pytest.approx(3 * 13 / 28 * B, rel=1e-14)
    assert t == pytest.approx(3 * (1 - 6 / 8 * 5 / 7) * B / 50e9, rel=1e-14)
    t, _, inter = _dispatch(DISPATCH_SENDRECV_ALLGATHER, _toy_tiers(), e=4.0)
    assert inter == 0.0 and t == pytest.approx(3 / 4 * 4 * B / 80e9, rel=1e-14)


def test_two_node_plan_seed_numbers():
    """The documents' EP32 plan on two 16-die nodes: each die sends its 112 MiB
    to the other node at 12 GiB/s: 112 / 12288 s = 9.11 ms. The intra part
    all-gathers N B = 224 MiB per die over 16 dies: 15/16 * 3.5 GiB at
    128.6 GiB/s (the SPC fused all-gather) = 25.5 ms. (The documents' "1.75 GiB,
    13.6 ms" is 32 x 56 MiB, the micro-batch-1 volume, without the (n-1)/n factor.)"""
    tiers = _tiers((16.0, 128.6 * GIB, 0.0), (0.0, 12 * GIB, 0.0))
    t, intra, inter = moe.dispatch_s(DISPATCH_SENDRECV_ALLGATHER, float(TOKEN_BYTES), 32.0, 1.0, 256.0, 8.0, 0.0, tiers)
    t_ag = 15 / 16 * 32 * 112 * MIB / (128.6 * GIB)
    assert t_ag == pytest.approx(0.0255151632970451, rel=1e-12)
    assert inter == 112 * MIB
    assert intra == 15 * 2 * 112 * MIB  # (r - 1) N B
    t_inter = t - t_ag
    assert t_inter == pytest.approx(112 / 12288, rel=1e-12)
    assert round(t_inter * 1e3, 2) == 9.11
    split, _, _ = moe.dispatch_s(DISPATCH_SENDRECV_ALLGATHER_SPLIT, float(TOKEN_BYTES), 32.0, 1.0, 256.0, 8.0, 0.0, tiers)
    assert split == pytest.approx(112 / 12288 / 2 + t_ag, rel=1e-12)  # the gather's halves dominate


def test_two_batch_overlap_by_hand():
    """dispatch 4, combine 6, compute 2 (halves 2, 3, 1):
    2 + max(0, 2 - 1) + max(0, 3 - 1) + 3 = 8."""
    assert moe.two_batch_exposed_s(4.0, 6.0, 2.0) == 8.0
    assert moe.two_batch_exposed_s(4.0, 6.0, 100.0) == 5.0
    assert moe.two_batch_exposed_s(4.0, 6.0, 0.0) == 10.0


def test_grouped_gemm_by_hand(make_device, toy_tiles):
    """8 groups of 1024 x 2048 x 7168 on the toy device (100 TFLOP/s, tiles
    128 x 128: 8 x 16 = 128 tiles in 2 waves of 100 units, efficiency 0.64),
    5 us launch paid once: 8 * 2 * 1024 * 2048 * 7168 / (100e12 * 0.64) + 5 us."""
    dev = make_device(launch_s=5e-6)[0]
    expected = 8 * 2 * 1024 * 2048 * 7168 / (100e12 * 128 / 200) + 5e-6
    assert moe.grouped_gemm_s(8.0, 1024.0, 2048.0, 7168.0, dev, toy_tiles, 2.0) == pytest.approx(expected, rel=1e-13)
    assert moe.grouped_gemm_s(0.0, 1024.0, 2048.0, 7168.0, dev, toy_tiles, 2.0) == 0.0


# --------------------------------------------------------------------------- properties


@st.composite
def routings(draw):
    """(experts, top_k, e, r, max_nodes) with e = N r, E a multiple of e and
    top_k no more than the experts a token may choose from."""
    nodes = draw(st.integers(1, 8))
    r = draw(st.sampled_from([1, 2, 4, 8]))
    e = nodes * r
    experts = e * draw(st.integers(1, 8))
    max_nodes = draw(st.integers(0, nodes))
    m = max_nodes if 0 < max_nodes < nodes else nodes
    top_k = draw(st.integers(1, min(16, experts * m // nodes)))
    return float(experts), float(top_k), float(e), float(r), float(max_nodes)


@PROPS
@given(routing=routings())
def test_fanout_bounded(routing):
    experts, top_k, e, r, max_nodes = routing
    intra, inter, nodes = moe.fanout(experts, top_k, e, r, max_nodes)
    tol = 1e-12
    assert -tol <= intra <= r - 1 + tol
    assert -tol <= inter <= e - r + tol
    assert -tol <= nodes <= e / r - 1 + tol
    assert intra + inter <= top_k + tol  # k experts reach at most k ranks
    assert nodes <= inter + tol  # every other node hit holds a rank hit
    if 0 < max_nodes < e / r:
        assert nodes <= max_nodes + tol


@PROPS
@given(routing=routings())
def test_more_top_k_never_lowers_fanout(routing):
    experts, top_k, e, r, max_nodes = routing
    nodes = e / r
    m = max_nodes if 0 < max_nodes < nodes else nodes
    assume(top_k + 1 <= experts * m / nodes)
    less = moe.fanout(experts, top_k, e, r, max_nodes)
    more = moe.fanout(experts, top_k + 1, e, r, max_nodes)
    for a, b in zip(less, more):
        assert b >= a * (1 - 1e-12)


@PROPS
@given(routing=routings())
def test_node_limit_never_raises_inter_node_fanout(routing):
    experts, top_k, e, r, max_nodes = routing
    free = moe.fanout(experts, top_k, e, r, 0.0)
    limited = moe.fanout(experts, top_k, e, r, max_nodes)
    assert limited[1] <= free[1] * (1 + 1e-12) + 1e-15
    assert limited[2] <= free[2] * (1 + 1e-12) + 1e-15


@st.composite
def dispatch_cases(draw):
    """(algorithm, token bytes, e, stride, experts, top_k, max_nodes, levels), power-of-two
    groups and domains so that the node count N = e / r is whole."""
    levels = draw(tier_stacks())
    e = float(2 ** draw(st.integers(0, 7)))
    stride = float(2 ** draw(st.integers(0, 4)))
    experts = e * draw(st.integers(1, 8))
    r = moe.ranks_per_node(e, stride, _tiers(*levels))
    nodes = e / r
    max_nodes = float(draw(st.integers(0, int(nodes))))
    m = max_nodes if 0 < max_nodes < nodes else nodes
    top_k = float(draw(st.integers(1, int(min(16, experts * m / nodes)))))
    return (draw(st.sampled_from(ALGORITHMS)), draw(st.floats(1.0, 1e10)), e, stride, experts, top_k, max_nodes,
            levels)


@PROPS
@given(case=dispatch_cases())
def test_dispatch_finite_and_non_negative(case):
    algorithm, nbytes, e, stride, experts, top_k, max_nodes, levels = case
    tiers = _tiers(*levels)
    t, intra, inter = moe.dispatch_s(algorithm, nbytes, e, stride, experts, top_k, max_nodes, tiers)
    c = moe.combine_s(algorithm, nbytes, e, stride, experts, top_k, max_nodes, tiers)
    for x in (t, intra, inter, c):
        assert math.isfinite(x) and x >= 0.0
    if e == 1.0:
        assert (t, intra, inter, c) == (0.0, 0.0, 0.0, 0.0)
    else:
        assert t > 0.0 and c > 0.0


@PROPS
@given(algorithm=st.sampled_from(ALGORITHMS), nbytes=st.floats(0.0, 1e10), levels=tier_stacks(),
       stride=st.integers(0, 4).map(lambda x: float(2**x)))
def test_single_rank_dispatch_is_free(algorithm, nbytes, levels, stride):
    tiers = _tiers(*levels)
    assert moe.dispatch_s(algorithm, nbytes, 1.0, stride, 16.0, 4.0, 0.0, tiers) == (0.0, 0.0, 0.0)
    assert moe.combine_s(algorithm, nbytes, 1.0, stride, 16.0, 4.0, 0.0, tiers) == 0.0


@PROPS
@given(case=dispatch_cases(), ups=st.lists(st.floats(1.0, 1e3), min_size=3, max_size=3))
def test_more_bandwidth_never_slower(case, ups):
    """Doubling every tier's bandwidth (and, more generally, raising each by
    any factor >= 1) never increases a dispatch or combine."""
    algorithm, nbytes, e, stride, experts, top_k, max_nodes, levels = case
    args = (algorithm, nbytes, e, stride, experts, top_k, max_nodes)
    slow = _tiers(*levels)
    for faster in ([(d, 2 * bw, lat) for d, bw, lat in levels],
                   [(d, bw * up, lat) for (d, bw, lat), up in zip(levels, ups)]):
        fast = _tiers(*faster)
        assert moe.dispatch_s(*args, fast)[0] <= moe.dispatch_s(*args, slow)[0] * (1 + 1e-12)
        assert moe.combine_s(*args, fast) <= moe.combine_s(*args, slow) * (1 + 1e-12)


@PROPS
@given(dispatch=st.floats(0.0, 1.0, allow_subnormal=False), combine=st.floats(0.0, 1.0, allow_subnormal=False),
       compute=st.floats(0.0, 2.0, allow_subnormal=False))
def test_two_batch_exposed_bounds(dispatch, combine, compute):
    """Overlap hides at most the second half of the dispatch and the first half
    of the combine; with no compute nothing is hidden."""
    total = dispatch + combine
    got = moe.two_batch_exposed_s(dispatch, combine, compute)
    assert total / 2 * (1 - 1e-12) <= got <= total * (1 + 1e-12)
    assert moe.two_batch_exposed_s(dispatch, combine, 0.0) == pytest.approx(total, rel=1e-14, abs=0.0)
    assert moe.two_batch_exposed_s(dispatch, combine, compute * 2) <= got * (1 + 1e-12)


@PROPS
@given(m=st.floats(1.0, 1e5), n=st.floats(1.0, 1e5), k=st.floats(1.0, 1e5), launch=st.floats(0.0, 1e-4),
       groups=st.integers(1, 64))
def test_grouped_gemm_one_group_is_a_gemm(make_device, toy_tiles, m, n, k, launch, groups):
    dev = make_device(launch_s=launch)[0]
    one = gemm_time_s(m, n, k, dev, toy_tiles, 2.0)
    assert moe.grouped_gemm_s(1.0, m, n, k, dev, toy_tiles, 2.0) == pytest.approx(one, rel=1e-12)
    # one launch however many groups
    grouped = moe.grouped_gemm_s(float(groups), m, n, k, dev, toy_tiles, 2.0)
    assert grouped == pytest.approx(groups * (one - launch) + launch, rel=1e-12)
    assert grouped <= groups * one * (1 + 1e-12)


def test_dispatch_low_latency_by_hand():
    """Every copy over the NIC, inside the node too: (3/4 + 1) B = 1.75 B at SR
    4 GB/s = 43.75 ms, plus one latency (all destinations at once): 10 us."""
    tiers = _toy_tiers()
    tiers.latency_s[:] = (2e-6, 10e-6)
    t, intra, inter = _dispatch(DISPATCH_LOW_LATENCY, tiers)
    assert t == pytest.approx(1.75 * B / 4e9 + 10e-6, rel=1e-14)
    assert (intra, inter) == pytest.approx((0.0, 1.75 * B), rel=1e-14)
