"""The BR166 16-die topologies: the shipped files match the design notes' table,
routes follow it (hand-derived pairs, and every pair against a brute-force
oracle), link loads conserve bytes, and malformed files give a CatalogError
naming the file, the field, the value and what was expected."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from paraspace.spaces.errors import CatalogError
from paraspace.spaces.topology import (
    TOPOLOGY_DIR,
    Hop,
    equal_routes,
    hop_counts,
    load_topology,
    route,
    route_table,
    tier_loads,
    topology_names,
    uniform_all_to_all,
)

# The notes' table (seed-digest.md section 2): rank -> (peers, (mate1, mate2, mate3)).
TABLE = {
    0: ((1, 2, 3), (5, 8, 12)), 8: ((9, 10, 11), (13, 0, 4)),
    1: ((0, 2, 3), (4, 9, 13)), 9: ((8, 10, 11), (12, 1, 5)),
    2: ((0, 1, 3), (7, 10, 14)), 10: ((8, 9, 11), (15, 2, 6)),
    3: ((0, 1, 2), (6, 11, 15)), 11: ((8, 9, 10), (14, 3, 7)),
    4: ((5, 6, 7), (1, 12, 8)), 12: ((13, 14, 15), (9, 4, 0)),
    5: ((4, 6, 7), (0, 13, 9)), 13: ((12, 14, 15), (8, 5, 1)),
    6: ((4, 5, 7), (3, 14, 10)), 14: ((12, 13, 15), (11, 6, 2)),
    7: ((4, 5, 6), (2, 15, 11)), 15: ((12, 13, 14), (10, 7, 3)),
}
VARIANTS = ["br166-ocs", "br166-ocs-port10", "br166-ubbv2"]
#: the documented worst path: OCS 3 hops (P2P + D2D + P2P), port-10 puts every
#: stranger behind one peer, UBBv2 "two fewer forwarding hops" than OCS
WORST_HOPS = {"br166-ocs": 3, "br166-ocs-port10": 2, "br166-ubbv2": 1}
# the notes' binary GB/s in decimal GB/s, as the files write them
PEER, BLINK, IB, PORT10 = 27.9 * 1.073741824, 50 * 1.073741824, 13 * 1.073741824, 25 * 1.073741824
S = 7 * 2**20  # bytes each die sends to each other die in the all-to-all checks


@pytest.fixture(scope="module")
def ocs():
    return load_topology("br166-ocs")


@pytest.fixture(scope="module")
def port10():
    return load_topology("br166-ocs-port10")


@pytest.fixture(scope="module")
def ubb():
    return load_topology("br166-ubbv2")


def links_as_written(topo) -> dict[tuple[int, int], str]:
    """(a, b) -> tier, read from the validated file records (not the router's arrays)."""
    out = {}
    for entry in topo.spec.ranks:
        for b in entry.peers:
            out[entry.rank, b] = topo.spec.peer_tier
        for tier, mates in entry.mates.items():
            for b in mates:
                out[entry.rank, b] = tier
    return out


def as_tuples(hops: list[Hop]) -> list[tuple[int, int, str]]:
    return [tuple(h) for h in hops]


# --------------------------------------------------------------------------- the files


def test_catalog_lists_the_three_variants():
    assert set(VARIANTS) <= set(topology_names())


@pytest.mark.parametrize("name", VARIANTS)
def test_peers_are_the_tables_virtual_nodes(name):
    topo = load_topology(name)
    assert topo.n == 16
    for entry in topo.spec.ranks:
        assert set(entry.peers) == set(TABLE[entry.rank][0])
        assert all(topo.link(entry.rank, p) == "peer" for p in entry.peers)


def test_ocs_is_the_table_without_mate3(ocs):
    for r, (peers, (m1, m2, m3)) in TABLE.items():
        assert dict(ocs.spec.ranks[r].mates) == {"blink": (m1,), "ib": (m2,)}
        assert ocs.link(r, m3) is None  # a stranger
        assert len(ocs.neighbors(r)) == 5


def test_port10_is_the_table(port10):
    for r, (peers, (m1, m2, m3)) in TABLE.items():
        assert dict(port10.spec.ranks[r].mates) == {"blink": (m1,), "ib": (m2,), "port10": (m3,)}
        assert port10.neighbors(r) == tuple(sorted((*peers, m1, m2, m3)))


def test_ubbv2_is_fully_connected_and_keeps_the_tables_mates(ubb):
    for r, (peers, (m1, m2, m3)) in TABLE.items():
        assert ubb.neighbors(r) == tuple(x for x in range(16) if x != r)
        assert (ubb.link(r, m1), ubb.link(r, m2), ubb.link(r, m3)) == ("blink", "ib", "ib")


def test_tier_numbers_cite_the_notes(port10):
    got = {t.name: t.bandwidth_GB_per_s for t in port10.tiers}
    assert got == pytest.approx({"peer": PEER, "blink": BLINK, "ib": IB, "port10": PORT10}, abs=1e-3)


def test_load_by_path_equals_load_by_name(ocs):
    by_path = load_topology(str(TOPOLOGY_DIR / "br166-ocs.toml"))
    assert by_path.spec == ocs.spec
    assert np.array_equal(by_path.link_tier, ocs.link_tier)


def test_unknown_name_lists_the_catalog():
    with pytest.raises(CatalogError) as err:
        load_topology("br999")
    assert "topology = 'br999'" in str(err.value) and "br166-ocs" in str(err.value)


# --------------------------------------------------------------------------- hand-derived routes


def test_ocs_direct_links(ocs):
    assert as_tuples(route(ocs, 0, 1)) == [(0, 1, "peer")]
    assert as_tuples(route(ocs, 0, 5)) == [(0, 5, "blink")]  # mate1
    assert as_tuples(route(ocs, 0, 8)) == [(0, 8, "ib")]  # mate2
    assert route(ocs, 3, 3) == []


def test_ocs_stranger_two_hops_via_a_mate(ocs):
    # 13 is the ib mate of 0's blink mate 5 and the blink mate of 0's ib mate 8:
    # both paths have bottleneck ib, so rank order picks 0 -> 5 -> 13
    assert as_tuples(route(ocs, 0, 13)) == [(0, 5, "blink"), (5, 13, "ib")]
    assert [[h.dst for h in p] for p in equal_routes(ocs, 0, 13)] == [[5, 13], [8, 13]]
    # 4 (the other VN of the node): via peer 1 (its blink mate) or mate 5 (its peer)
    assert as_tuples(route(ocs, 0, 4)) == [(0, 1, "peer"), (1, 4, "blink")]
    # 9: via peer 1 (its ib mate) or ib mate 8 (its peer)
    assert as_tuples(route(ocs, 0, 9)) == [(0, 1, "peer"), (1, 9, "ib")]


def test_ocs_stranger_mate3_takes_three_hops(ocs):
    # neighbours of 0: {1, 2, 3, 5, 8}; of 12: {13, 14, 15, 9, 4}: disjoint, so 3 hops.
    # Middle links between them: 1-4 blink, 1-9 ib, 5-4 peer, 5-13 ib, 8-9 peer,
    # 8-13 blink; each path crosses ib once, so rank order picks 0 -> 1 -> 4 -> 12.
    assert as_tuples(route(ocs, 0, 12)) == [(0, 1, "peer"), (1, 4, "blink"), (4, 12, "ib")]
    assert [tuple(h.dst for h in p) for p in equal_routes(ocs, 0, 12)] == [
        (1, 4, 12), (1, 9, 12), (5, 4, 12), (5, 13, 12), (8, 9, 12), (8, 13, 12)
    ]
    assert as_tuples(route(ocs, 0, 15)) == [(0, 2, "peer"), (2, 7, "blink"), (7, 15, "ib")]


def test_port10_direct_mate3_and_peer_then_mate(port10):
    assert as_tuples(route(port10, 0, 12)) == [(0, 12, "port10")]
    # 15's neighbours {12, 13, 14, 10, 7, 3} meet 0's at 3 and 12; both bottleneck port10
    assert as_tuples(route(port10, 0, 15)) == [(0, 3, "peer"), (3, 15, "port10")]


def test_port10_bandwidth_breaks_hop_ties(port10):
    # 0 -> 9 in 2 hops: via 1 (peer, ib), 5 (blink, port10), 8 (ib, peer), 12 (port10, blink):
    # the port10 bottleneck beats ib, and 5 < 12
    assert as_tuples(route(port10, 0, 9)) == [(0, 5, "blink"), (5, 9, "port10")]


def test_ubbv2_everything_direct(ubb):
    assert as_tuples(route(ubb, 0, 1)) == [(0, 1, "peer")]
    assert as_tuples(route(ubb, 0, 4)) == [(0, 4, "blink")]
    assert as_tuples(route(ubb, 0, 12)) == [(0, 12, "ib")]
    assert as_tuples(route(ubb, 0, 15)) == [(0, 15, "ib")]


def test_bad_ranks_are_refused(ocs):
    for src, dst in ((0, 16), (-1, 3), (True, 2)):
        with pytest.raises(ValueError, match="expected a rank in 0..15"):
            route(ocs, src, dst)


# --------------------------------------------------------------------------- every pair


def oracle(topo, links, a: int, b: int) -> tuple[int, ...]:
    """Brute force: fewest hops, then highest bottleneck, then smallest rank sequence."""
    bw = {t.name: t.bandwidth_GB_per_s for t in topo.tiers}
    others = [r for r in range(topo.n) if r not in (a, b)]
    for middle in range(topo.n - 1):
        best = None
        for mid in itertools.permutations(others, middle):  # lexicographic order
            path = (a, *mid, b)
            if all(pair in links for pair in itertools.pairwise(path)):
                neck = min(bw[links[p]] for p in itertools.pairwise(path))
                if best is None or neck > best[0]:
                    best = (neck, path)
        if best is not None:
            return best[1]
    raise AssertionError("disconnected")


@pytest.mark.parametrize("name", VARIANTS)
def test_every_pair(name):
    topo = load_topology(name)
    links = links_as_written(topo)
    table = route_table(topo)
    assert set(table) == {(a, b) for a in range(16) for b in range(16) if a != b}
    for (a, b), hops in table.items():
        assert hops == route(topo, a, b)
        assert hops[0].src == a and hops[-1].dst == b
        assert all(h.dst == nxt.src for h, nxt in itertools.pairwise(hops))
        assert all(links.get((h.src, h.dst)) == h.tier for h in hops)
        assert 1 <= len(hops) <= WORST_HOPS[name]
        assert len(hops) == len(table[b, a])
        assert (a, *(h.dst for h in hops)) == oracle(topo, links, a, b)
    counts = hop_counts(topo)
    assert counts.max() == WORST_HOPS[name]
    assert all(counts[a, b] == len(hops) for (a, b), hops in table.items())


def test_ubbv2_and_port10_never_longer_than_ocs(ocs, port10, ubb):
    assert np.all(hop_counts(ubb) <= hop_counts(ocs))
    assert np.all(hop_counts(port10) <= hop_counts(ocs))
    assert np.all(hop_counts(ubb) <= hop_counts(port10))
    # OCS's worst path is 3 hops; UBBv2 has "two fewer forwarding hops"
    assert hop_counts(ocs).max() - hop_counts(ubb).max() == 2


def test_ocs_hop_histogram(ocs):
    # per die: 5 direct links, 7 dies at 2 hops, and at 3 hops its absent mate3
    # with that die's VN, less the one die that is a mate of a mate (mate2 of mate1)
    counts = hop_counts(ocs)
    for r, (_, (m1, _, m3)) in TABLE.items():
        assert np.bincount(counts[r], minlength=4).tolist() == [1, 5, 7, 3]
        mate_of_mate = TABLE[m1][1][1]
        assert {x for x in range(16) if counts[r, x] == 3} == {m3, *TABLE[m3][0]} - {mate_of_mate}


# --------------------------------------------------------------------------- link loads


def test_single_pair_loads_each_hop(ocs):
    traffic = np.zeros((16, 16))
    traffic[0, 12] = 1e9
    loads = tier_loads(ocs, traffic)
    for h in route(ocs, 0, 12):
        assert loads.link_bytes[h.src, h.dst] == 1e9
    assert loads.link_bytes.sum() == 3e9
    assert loads.tier_bytes == {"peer": 1e9, "blink": 1e9, "ib": 1e9}
    assert loads.bottleneck == (4, 12)
    assert loads.time_s == pytest.approx(1e9 / (IB * 1e9), rel=1e-4)


def test_ocs_all_to_all_is_bound_by_the_ib_cut(ocs):
    # 8 x 8 pairs cross between the halves {0-7} and {8-15} each way, over 8 ib links
    # each way, each exactly once: 8 S per ib link at best, and the routes reach it
    for spread in (False, True):
        loads = uniform_all_to_all(ocs, S, spread=spread)
        assert loads.time_s == pytest.approx(8 * S / (IB * 1e9), rel=1e-4)
        assert loads.tier_bytes["ib"] == 128 * S
        # 16 dies: 5 pairs at 1 hop, 7 at 2, 3 at 3
        assert sum(loads.tier_bytes.values()) == 16 * (5 + 14 + 9) * S


def test_ubbv2_all_to_all_is_one_ib_message(ubb):
    loads = uniform_all_to_all(ubb, S)
    assert loads.time_s == pytest.approx(S / (IB * 1e9), rel=1e-4)
    assert loads.tier_bytes == {"peer": 16 * 3 * S, "blink": 16 * 4 * S, "ib": 16 * 8 * S}


def test_port10_all_to_all_between_the_cut_and_ocs(ocs, port10):
    loads = uniform_all_to_all(port10, S, spread=True)
    cut = 64 * S / (8 * (IB + PORT10) * 1e9)  # both inter-half tiers saturated together
    assert cut <= loads.time_s <= uniform_all_to_all(port10, S).time_s < uniform_all_to_all(ocs, S).time_s


def test_traffic_shape_is_checked(ocs):
    with pytest.raises(ValueError, match=r"\(16 x 16\)"):
        tier_loads(ocs, np.ones((4, 4)))
    with pytest.raises(ValueError, match="non-negative"):
        tier_loads(ocs, -np.ones((16, 16)))


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(VARIANTS),
    traffic=arrays(np.float64, (16, 16), elements=st.floats(0, 1e9, allow_nan=False)),
    spread=st.booleans(),
)
def test_loads_conserve_bytes(name, traffic, spread):
    topo = load_topology(name)
    loads = tier_loads(topo, traffic, spread=spread)
    off = traffic * (1 - np.eye(16))
    # every byte crosses as many links as its route has hops
    assert loads.link_bytes.sum() == pytest.approx((off * hop_counts(topo)).sum(), rel=1e-9, abs=1e-3)
    assert sum(loads.tier_bytes.values()) == pytest.approx(loads.link_bytes.sum(), rel=1e-12, abs=1e-3)
    # only real links carry bytes
    assert np.all(loads.link_bytes[topo.link_tier < 0] == 0)
    # per die: bytes leaving on links - bytes arriving on links = sent - received
    net = loads.link_bytes.sum(axis=1) - loads.link_bytes.sum(axis=0)
    assert net == pytest.approx(off.sum(axis=1) - off.sum(axis=0), rel=1e-9, abs=1e-3)
    assert loads.time_s == pytest.approx(loads.link_time_s.max())
    assert loads.time_s == 0 or loads.time_s * (1 + 1e-12) >= max(loads.tier_time_s.values())


# --------------------------------------------------------------------------- malformed files


def mutated(tmp_path: Path, old: str, new: str, name: str | None = "br166-ocs", text: str = "") -> str:
    """A copy of a shipped file (or of ``text``) with ``old`` replaced by ``new``."""
    text = (TOPOLOGY_DIR / f"{name}.toml").read_text() if name else text
    assert text.count(old) == 1, old
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new))
    return str(path)


def load_error(path: str) -> str:
    with pytest.raises(CatalogError) as err:
        load_topology(path)
    message = str(err.value)
    assert message.startswith(path + ": ")
    return message


def test_asymmetric_peer(tmp_path):
    path = mutated(tmp_path, "{ rank =  1, peers = [ 0,  2,  3]", "{ rank =  1, peers = [ 2,  3]")
    msg = load_error(path)
    assert "ranks.1.peers = [2, 3]: expected to include 0" in msg and "rank 0 lists 1 as a peer" in msg


#: one line of the shipped table changed (old, new) and the error that names it
BAD_TABLES = {
    "asymmetric_mate": ("{ rank =  8, peers = [ 9, 10, 11], mates = { blink = [13], ib = [ 0] }",
                        "{ rank =  8, peers = [ 9, 10, 11], mates = { blink = [13] }",
                        "ranks.8.mates.ib = []: expected to include 0"),
    "mate_tier_mismatch": ("mates = { blink = [13], ib = [ 0] }",
                           "mates = { blink = [13, 0] }",
                           "ranks.8.mates.blink = 0: expected the tier 'ib'"),
    "duplicate_rank": ("{ rank =  1, peers",
                       "{ rank =  0, peers",
                       "ranks.1.rank = 0: expected each rank 0..15 exactly once (rank 0 is also ranks.0)"),
    "rank_out_of_range": ("{ rank = 15, peers",
                          "{ rank = 16, peers",
                          "ranks.15.rank = 16: expected a rank in 0..15"),
    "self_link": ("{ rank =  0, peers = [ 1,  2,  3]",
                  "{ rank =  0, peers = [ 0,  1,  2,  3]",
                  "ranks.0.peers = 0: expected another rank than 0"),
    "repeated_link": ("mates = { blink = [ 5], ib = [ 8] }",
                      "mates = { blink = [ 5], ib = [ 8, 5] }",
                      "ranks.0.mates.ib = 5: expected a rank not already listed in ranks.0.mates.blink"),
    "unknown_tier": ("mates = { blink = [ 5], ib = [ 8] }",
                     "mates = { blink = [ 5], ib = [ 8], nvlink = [12] }",
                     "ranks.0.mates = 'nvlink': expected a tier named in tiers ['peer', 'blink', 'ib']"),
}


@pytest.mark.parametrize("case", BAD_TABLES)
def test_bad_table_is_named(tmp_path, case):
    old, new, message = BAD_TABLES[case]
    assert message in load_error(mutated(tmp_path, old, new))


def test_peers_not_a_virtual_node(tmp_path):
    # 3 and 4 list each other as peers (symmetric), but 3's other peers are VN0
    path = mutated(tmp_path, "{ rank =  3, peers = [ 0,  1,  2]", "{ rank =  3, peers = [ 0,  1,  2,  4]")
    path = mutated(Path(path).parent, "{ rank =  4, peers = [ 5,  6,  7]", "{ rank =  4, peers = [ 5,  6,  7,  3]",
                   name=None, text=Path(path).read_text())
    assert "ranks.3.peers = [0, 1, 2, 4]: expected the other dies of the virtual node [0, 1, 2, 3] of rank 0" in (
        load_error(path)
    )


def test_bad_bandwidth(tmp_path):
    path = mutated(tmp_path, "bandwidth_GB_per_s = 53.687", "bandwidth_GB_per_s = -53.687")
    assert "tiers.1.bandwidth_GB_per_s = -53.687: expected greater than or equal to 0.001" in load_error(path)
