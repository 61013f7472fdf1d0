"""Die-level topology of a multi-die accelerator group, and routes over it.

A topology file (``spaces/catalog/topologies/NAME.toml``, or any path) lists
every rank (die) with its *peers*, the other dies of its virtual node, and its
*mates*, direct links to dies of other virtual nodes, grouped by link tier::

    peer_tier = "peer"
    [[tiers]]
    name = "peer"
    bandwidth_GB_per_s = 29.957
    latency_us = 2.0
    ...
    ranks = [
      { rank = 0, peers = [1, 2, 3], mates = { blink = [5], ib = [8] } },
      ...
    ]

A die that is neither a peer nor a mate is a *stranger*: it is reached by
forwarding. ``route`` picks, among all paths of the fewest hops, the one with
the highest bottleneck bandwidth, then the lexicographically smallest sequence
of ranks (deterministic). ``tier_loads`` pushes an (n x n) bytes matrix along
those routes and returns the bytes per directed link and per tier, and the
time bound max over links of bytes / bandwidth (links are full duplex: each
direction has the tier's bandwidth; latency and forwarding cost are ignored,
so this is a lower bound for a perfectly pipelined transfer).

Pure Python and numpy; validation errors are ``CatalogError`` naming the file,
the field, the value and what was expected.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, NamedTuple

import numpy as np
from pydantic import Field

from paraspace.spaces.catalog import CATALOG_DIR, read_toml
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.schema import MAX_COUNT, Link, Record, Text, validate

TOPOLOGY_DIR = CATALOG_DIR / "topologies"

#: a die's rank: a count of devices bounds it (spaces.schema)
RankId = Annotated[int, Field(ge=0, lt=MAX_COUNT)]


# --------------------------------------------------------------------------- records


#: one kind of die-to-die link (name, bandwidth, latency of one hop)
TopologyTier = Link


class RankLinks(Record):
    """One die's direct links: its peers (same virtual node) and its mates by tier."""

    rank: RankId
    #: the other dies of this die's virtual node, joined over ``peer_tier``
    peers: tuple[RankId, ...]
    #: tier name -> dies of other virtual nodes joined directly over that tier
    mates: dict[str, tuple[RankId, ...]] = Field(default_factory=dict)


class TopologySpec(Record):
    """A topology file as written."""

    name: Text
    description: Text
    #: the tier of every peer link
    peer_tier: Text
    tiers: tuple[TopologyTier, ...]
    ranks: tuple[RankLinks, ...]


class Hop(NamedTuple):
    """One link traversed by a route."""

    src: int
    dst: int
    tier: str


# --------------------------------------------------------------------------- the routable topology


@dataclass(frozen=True, eq=False)
class Topology:
    """A validated topology: link tiers as (n x n) arrays, routes computed on first use."""

    spec: TopologySpec
    source: str
    #: tier index of the link a -> b, -1 where a and b are not linked (and on the diagonal)
    link_tier: np.ndarray
    #: bytes/s of the link a -> b, 0 where there is none
    bandwidth_bytes_per_s: np.ndarray

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def n(self) -> int:
        return len(self.spec.ranks)

    @property
    def tiers(self) -> tuple[TopologyTier, ...]:
        return self.spec.tiers

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.spec.tiers)

    def tier(self, name: str) -> TopologyTier:
        return self.spec.tiers[self.tier_names.index(name)]

    def neighbors(self, rank: int) -> tuple[int, ...]:
        """Directly linked ranks, ascending."""
        return tuple(int(r) for r in np.flatnonzero(self.link_tier[rank] >= 0))

    def link(self, a: int, b: int) -> str | None:
        """The tier name of the link a -> b, or None."""
        t = int(self.link_tier[a, b])
        return None if t < 0 else self.spec.tiers[t].name

    @cached_property
    def hops(self) -> np.ndarray:
        """(n x n) int: fewest hops from a to b (0 on the diagonal)."""
        n = self.n
        dist = np.full((n, n), -1, dtype=np.int64)
        adj = [self.neighbors(r) for r in range(n)]
        for s in range(n):
            dist[s, s] = 0
            frontier = [s]
            while frontier:
                nxt = []
                for u in frontier:
                    for v in adj[u]:
                        if dist[s, v] < 0:
                            dist[s, v] = dist[s, u] + 1
                            nxt.append(v)
                frontier = nxt
        return dist

    @cached_property
    def _candidates(self) -> dict[tuple[int, int], tuple[tuple[int, ...], ...]]:
        """(a, b) -> the equally good paths (fewest hops, then highest bottleneck), ascending by ranks."""
        n = self.n
        adj = [self.neighbors(r) for r in range(n)]
        out: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {}
        for a in range(n):
            for b in range(n):
                if a == b:
                    continue
                paths = _shortest_paths(a, b, adj, self.hops)
                best = max(self._bottleneck(p) for p in paths)
                out[a, b] = tuple(sorted(p for p in paths if self._bottleneck(p) == best))
        return out

    def _bottleneck(self, path: tuple[int, ...]) -> float:
        return float(min(self.bandwidth_bytes_per_s[u, v] for u, v in itertools.pairwise(path)))

    def _hops_of(self, path: tuple[int, ...]) -> list[Hop]:
        return [Hop(u, v, self.spec.tiers[int(self.link_tier[u, v])].name) for u, v in itertools.pairwise(path)]

    @cached_property
    def _incidence_single(self) -> np.ndarray:
        return self._incidence(spread=False)

    @cached_property
    def _incidence_spread(self) -> np.ndarray:
        return self._incidence(spread=True)

    def _incidence(self, *, spread: bool) -> np.ndarray:
        """(n*n pairs x n*n links): the fraction of pair (a, b)'s bytes on link (u, v)."""
        n = self.n
        inc = np.zeros((n * n, n * n))
        for (a, b), paths in self._candidates.items():
            used = paths if spread else paths[:1]
            for p in used:
                for u, v in itertools.pairwise(p):
                    inc[a * n + b, u * n + v] += 1.0 / len(used)
        return inc


def _shortest_paths(a: int, b: int, adj: list[tuple[int, ...]], dist: np.ndarray) -> list[tuple[int, ...]]:
    """Every path from a to b of ``dist[a, b]`` hops (each step moves one hop closer to b)."""
    out: list[tuple[int, ...]] = []

    def walk(path: tuple[int, ...]) -> None:
        u = path[-1]
        if u == b:
            out.append(path)
            return
        for v in adj[u]:
            if dist[v, b] == dist[u, b] - 1:
                walk((*path, v))

    walk((a,))
    return out


# --------------------------------------------------------------------------- loading and validation


def topology_names() -> list[str]:
    """Catalog names of the shipped topologies, sorted."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))


def resolve_topology(ref: str, *, relative_to: Path | None = None, source: str = "command line") -> Path:
    """The file behind a topology catalog name or path (same rules as ``spaces.catalog.resolve``)."""
    as_path = Path(ref)
    if relative_to is not None and not as_path.is_absolute():
        as_path = relative_to / as_path
    if ref.endswith(".toml") or as_path.exists():
        if not as_path.is_file():
            raise CatalogError(source, "topology", ref, "an existing TOML file")
        return as_path
    candidate = TOPOLOGY_DIR / f"{ref}.toml"
    if not candidate.is_file():
        raise CatalogError(source, "topology", ref, f"a topology TOML path or one of {topology_names()}")
    return candidate


def load_topology(ref: str, *, relative_to: Path | None = None, source: str = "command line") -> Topology:
    """Load and validate a topology by catalog name or path."""
    path = resolve_topology(ref, relative_to=relative_to, source=source)
    spec = validate(TopologySpec, read_toml(path), str(path))
    return build_topology(spec, str(path))


def build_topology(spec: TopologySpec, source: str) -> Topology:
    """Check a topology's links (ranks 0..n-1 once each, known tiers, no self or
    repeated links, symmetric links of one tier, peers forming virtual nodes,
    every rank reachable) and build its arrays; ``CatalogError`` otherwise."""
    tier_names = [t.name for t in spec.tiers]
    if not spec.tiers:
        raise CatalogError(source, "tiers", [], "at least one link tier")
    for i, name in enumerate(tier_names):
        if name in tier_names[:i]:
            raise CatalogError(source, f"tiers.{i}.name", name, f"a tier name not used by tiers.{tier_names.index(name)}")
    if spec.peer_tier not in tier_names:
        raise CatalogError(source, "peer_tier", spec.peer_tier, f"one of the tiers {tier_names}")

    n = len(spec.ranks)
    if n == 0:
        raise CatalogError(source, "ranks", [], "at least one rank")
    index: dict[int, int] = {}  # rank -> its position in the file
    for i, entry in enumerate(spec.ranks):
        if entry.rank >= n:
            raise CatalogError(source, f"ranks.{i}.rank", entry.rank, f"a rank in 0..{n - 1} (the file lists {n} ranks)")
        if entry.rank in index:
            raise CatalogError(
                source, f"ranks.{i}.rank", entry.rank,
                f"each rank 0..{n - 1} exactly once (rank {entry.rank} is also ranks.{index[entry.rank]})",
            )
        index[entry.rank] = i

    link_tier = np.full((n, n), -1, dtype=np.int64)
    where: dict[tuple[int, int], str] = {}  # (a, b) -> the field of a's entry that lists b
    for i, entry in enumerate(spec.ranks):
        a = entry.rank
        lists = [(f"ranks.{i}.peers", spec.peer_tier, entry.peers)]
        for tier, mates in entry.mates.items():
            if tier not in tier_names:
                raise CatalogError(source, f"ranks.{i}.mates", tier, f"a tier named in tiers {tier_names}")
            lists.append((f"ranks.{i}.mates.{tier}", tier, mates))
        for field, tier, others in lists:
            for b in others:
                if b >= n:
                    raise CatalogError(source, field, b, f"a rank in 0..{n - 1}")
                if b == a:
                    raise CatalogError(source, field, b, f"another rank than {a} (no link from a rank to itself)")
                if (a, b) in where:
                    raise CatalogError(source, field, b, f"a rank not already listed in {where[a, b]}")
                where[a, b] = field
                link_tier[a, b] = tier_names.index(tier)

    for (a, b), field in sorted(where.items()):
        tier = tier_names[link_tier[a, b]]
        kind = "peer" if field.endswith(".peers") else f"{tier} mate"
        if (b, a) not in where:
            j = index[b]
            back = f"ranks.{j}.peers" if kind == "peer" else f"ranks.{j}.mates.{tier}"
            listed = spec.ranks[j].peers if kind == "peer" else spec.ranks[j].mates.get(tier, ())
            raise CatalogError(
                source, back, list(listed), f"to include {a}: links are symmetric and rank {a} lists {b} as a {kind}"
            )
        if link_tier[b, a] != link_tier[a, b]:
            raise CatalogError(
                source, where[b, a], a, f"the tier {tier!r}: links are symmetric and rank {a} lists {b} in {field}"
            )

    for entry in spec.ranks:
        group = {entry.rank, *entry.peers}
        for b in entry.peers:
            other = spec.ranks[index[b]]
            if {b, *other.peers} != group:
                raise CatalogError(
                    source, f"ranks.{index[b]}.peers", list(other.peers),
                    f"the other dies of the virtual node {sorted(group)} of rank {entry.rank}",
                )

    tiers = spec.tiers
    bandwidth = np.where(link_tier >= 0, np.array([t.bandwidth_bytes_per_s for t in tiers] + [0.0])[link_tier], 0.0)
    topo = Topology(spec=spec, source=source, link_tier=link_tier, bandwidth_bytes_per_s=bandwidth)
    unreachable = np.flatnonzero(topo.hops[0] < 0)
    if unreachable.size:
        r = int(unreachable[0])
        raise CatalogError(source, f"ranks.{index[r]}", r, "a rank reachable from rank 0 over the listed links")
    return topo


# --------------------------------------------------------------------------- routes and loads


def route(topo: Topology, src: int, dst: int) -> list[Hop]:
    """The hops from ``src`` to ``dst`` (empty when they are equal): fewest hops,
    then the highest bottleneck bandwidth, then the smallest sequence of ranks."""
    _check_rank(topo, "src", src)
    _check_rank(topo, "dst", dst)
    if src == dst:
        return []
    return topo._hops_of(topo._candidates[src, dst][0])


def equal_routes(topo: Topology, src: int, dst: int) -> list[list[Hop]]:
    """Every path as good as ``route``'s (same hops and bottleneck), ``route``'s first."""
    _check_rank(topo, "src", src)
    _check_rank(topo, "dst", dst)
    if src == dst:
        return [[]]
    return [topo._hops_of(p) for p in topo._candidates[src, dst]]


def route_table(topo: Topology) -> dict[tuple[int, int], list[Hop]]:
    """``route`` for every ordered pair of distinct ranks."""
    return {pair: topo._hops_of(paths[0]) for pair, paths in topo._candidates.items()}


def hop_counts(topo: Topology) -> np.ndarray:
    """(n x n) int: hops of each pair's route (0 on the diagonal)."""
    return topo.hops.copy()


@dataclass(frozen=True)
class LinkLoads:
    """Bytes on every directed link when each pair's traffic follows its route."""

    #: (n x n) bytes carried by the link a -> b (0 where there is no link)
    link_bytes: np.ndarray
    #: (n x n) seconds the link a -> b is busy: bytes / bandwidth
    link_time_s: np.ndarray
    #: tier name -> bytes summed over that tier's links (a forwarded byte counts once per hop)
    tier_bytes: dict[str, float]
    #: tier name -> the busiest link of that tier, in seconds
    tier_time_s: dict[str, float]
    #: max over links of bytes / bandwidth: no schedule finishes sooner
    time_s: float
    #: the link (a, b) that sets ``time_s`` (None when nothing moves)
    bottleneck: tuple[int, int] | None


def tier_loads(topo: Topology, traffic: np.ndarray, *, spread: bool = False) -> LinkLoads:
    """Push ``traffic[a, b]`` bytes from every a to every b along the routes.

    With ``spread``, each pair's bytes are split evenly over all its equally good
    paths (``equal_routes``) instead of all taking ``route``'s path. The diagonal
    (a die to itself) moves nothing.
    """
    n = topo.n
    traffic = np.asarray(traffic, dtype=np.float64)
    if traffic.shape != (n, n):
        raise ValueError(f"traffic: an ({n} x {n}) bytes matrix for {topo.name}, got shape {traffic.shape}")
    if not np.all(np.isfinite(traffic)) or np.any(traffic < 0):
        raise ValueError("traffic: finite, non-negative bytes")
    inc = topo._incidence_spread if spread else topo._incidence_single
    link_bytes = (traffic.reshape(-1) @ inc).reshape(n, n)
    bw = topo.bandwidth_bytes_per_s
    link_time = np.divide(link_bytes, bw, out=np.zeros_like(link_bytes), where=bw > 0)
    tier_bytes: dict[str, float] = {}
    tier_time: dict[str, float] = {}
    for t, name in enumerate(topo.tier_names):
        mask = topo.link_tier == t
        tier_bytes[name] = float(link_bytes[mask].sum())
        tier_time[name] = float(link_time[mask].max()) if mask.any() else 0.0
    busiest = int(np.argmax(link_time))
    time_s = float(link_time.reshape(-1)[busiest])
    bottleneck = divmod(busiest, n) if time_s > 0 else None
    return LinkLoads(link_bytes, link_time, tier_bytes, tier_time, time_s, bottleneck)


def uniform_all_to_all(topo: Topology, bytes_per_pair: float, *, spread: bool = False) -> LinkLoads:
    """Every die sends ``bytes_per_pair`` to every other die."""
    traffic = np.full((topo.n, topo.n), float(bytes_per_pair))
    np.fill_diagonal(traffic, 0.0)
    return tier_loads(topo, traffic, spread=spread)


def _check_rank(topo: Topology, field: str, rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < topo.n:
        raise ValueError(f"{field} = {rank!r}: expected a rank in 0..{topo.n - 1} of {topo.name}")
