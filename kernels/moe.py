"""Mixture-of-experts kernels: routing fan-out, dispatch/combine, grouped GEMM.

Per MoE layer and micro-batch each expert-parallel rank holds T tokens of B =
T * h * bytes. Routing is uniform (every token picks top_k of E experts; with
node-limited routing it first picks ``max_nodes`` of the EP group's N nodes,
then its experts among theirs), so the expected fan-out comes from exact
combinatorics, not the source documents' rough "3.5x" (modeling.md section 4,
seed-digest.md section 2):

    P(a unit of u experts out of a pool of P gets >= 1 of k picks)
        = 1 - C(P - u, k) / C(P, k) = 1 - prod_{i<k} (P - u - i) / (P - i)

The EP group of ``e`` ranks lays ``r`` ranks in each node (the outermost tier
with a finite domain) over N = e / r nodes. Dispatch algorithms (kernels.codes
DISPATCH_*) move, per rank:

- allgather: the whole group's tokens, e * B gathered (a hierarchical all-gather
  over the tiers), then a local permutation of its routed rows;
- alltoall: B to each rank hosting one of a token's experts, intra- and inter-
  node parts concurrently over their own links;
- hierarchical (DeepEP): B once per destination node over the NIC, then intra-
  node forwarding, pipelined in chunks (max of the two plus one chunk's fill);
  its kernels write over the links directly, so the forwarding runs at the
  node tier's link bandwidth, not at a measured all-to-all collective's;
- low-latency (DeepEP's decode kernels): every copy straight over the NIC to
  each destination rank, inside the node too, all destinations at once (one
  latency, not one per peer);
- sendrecv-allgather: every token to each other node's same-index rank over
  the NIC, then an intra-node all-gather of N * B per rank; the split variant
  overlaps the intra part's first half with the inter part's second half.

Combine mirrors dispatch (reduce-scatter for the gather-based ones) over the
same volumes. All results are seconds or bytes.
"""

from __future__ import annotations

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
from paraspace.kernels.collectives import collective_time_s, link_bytes_per_s, members_within, size_fraction
from paraspace.kernels.jit import jit
from paraspace.kernels.ops import gemm_time_s, memory_bound_s

#: chunks a pipelined (hierarchical) dispatch is cut into: its fill is one chunk
#: of the faster stage (DeepEP's normal kernels stream chunks of tokens)
DISPATCH_CHUNKS = 4.0


@jit
def p_hit(pool: float, unit: float, k: float) -> float:
    """Probability that a given ``unit`` of experts among ``pool`` receives at
    least one of a token's ``k`` distinct uniformly chosen experts."""
    if unit <= 0.0:
        return 0.0
    if pool - unit < k:
        return 1.0
    miss = 1.0
    for i in range(int(k)):
        miss *= (pool - unit - i) / (pool - i)
    return 1.0 - miss


@jit
def fanout(experts: float, top_k: float, e: float, r: float, max_nodes: float):
    """Expected destinations of one token in an EP group of ``e`` ranks, ``r``
    per node: (other ranks in its node, ranks on other nodes, other nodes).

    With node-limited routing (0 < max_nodes < N) a node is in a token's node
    set with probability M / N and the token's experts are uniform among the
    M * E / N experts of its set."""
    nodes = e / r
    m = nodes
    if max_nodes > 0.0 and max_nodes < nodes:
        m = max_nodes
    pool = experts * m / nodes
    p_set = m / nodes
    p_rank = p_hit(pool, experts / e, top_k)
    p_node = p_hit(pool, experts / nodes, top_k)
    return (r - 1.0) * p_set * p_rank, (e - r) * p_set * p_rank, (nodes - 1.0) * p_set * p_node


@jit
def node_tier(tiers) -> int:
    """The tier inside a node: the outermost with a finite domain (0 if only one tier)."""
    return max(0, tiers.shape[0] - 2)


@jit
def ranks_per_node(e: float, stride: float, tiers) -> float:
    """Members of an EP group of ``e`` ranks ``stride`` apart inside one node."""
    if tiers.shape[0] < 2:
        return e
    return members_within(tiers[node_tier(tiers)].domain_devices, stride, e)


@jit
def dispatch_bytes(algorithm: int, token_bytes: float, e: float, ranks: float) -> float:
    """Bytes a rank receives in one dispatch on one node (the documents' single-
    node comparison): all-gather e * B (every token of the group), otherwise B
    times the expected number of ranks a token is sent to (``ranks``)."""
    if algorithm == DISPATCH_ALLGATHER:
        return e * token_bytes
    return ranks * token_bytes


@jit
def dispatch_s(algorithm: int, token_bytes: float, e: float, stride: float, experts: float, top_k: float,
               max_nodes: float, tiers):
    """(dispatch seconds, bytes over the node tier, bytes over the inter-node tier)
    of one dispatch of ``token_bytes`` per rank; combine costs the same."""
    if e <= 1.0 or token_bytes <= 0.0:
        return 0.0, 0.0, 0.0
    r = ranks_per_node(e, stride, tiers)
    nodes = e / r
    intra_ranks, inter_ranks, inter_nodes = fanout(experts, top_k, e, r, max_nodes)
    inner = tiers[node_tier(tiers)]
    outer = tiers[tiers.shape[0] - 1]
    if algorithm == DISPATCH_ALLGATHER:
        t = collective_time_s(ALL_GATHER, e, stride, e * token_bytes, tiers)
        return t, (r - 1.0) * nodes * token_bytes, (nodes - 1.0) * token_bytes
    if algorithm == DISPATCH_ALLTOALL:
        intra = intra_ranks * token_bytes
        inter = inter_ranks * token_bytes
        t_intra = intra / link_bytes_per_s(inner, ALL_TO_ALL, token_bytes) + (r - 1.0) * inner.latency_s
        t_inter = 0.0
        if inter > 0.0:
            t_inter = inter / link_bytes_per_s(outer, ALL_TO_ALL, token_bytes) + (e - r) * outer.latency_s
        return max(t_intra, t_inter), intra, inter
    if algorithm == DISPATCH_HIERARCHICAL:
        inter = inter_nodes * token_bytes
        intra = nodes * intra_ranks * token_bytes  # its own tokens and those it forwards for other nodes
        t_intra = intra / (inner.bytes_per_s * size_fraction(inner, token_bytes)) + (r - 1.0) * inner.latency_s
        t_inter = 0.0
        if inter > 0.0:
            t_inter = inter / link_bytes_per_s(outer, SEND_RECV, token_bytes) + (nodes - 1.0) * outer.latency_s
        return max(t_intra, t_inter) + min(t_intra, t_inter) / DISPATCH_CHUNKS, intra, inter
    if algorithm == DISPATCH_LOW_LATENCY:
        inter = (intra_ranks + inter_ranks) * token_bytes
        return inter / link_bytes_per_s(outer, SEND_RECV, token_bytes) + outer.latency_s, 0.0, inter
    # send/recv to every other node, then an intra-node all-gather of what each rank holds
    inter = (nodes - 1.0) * token_bytes
    t_inter = 0.0
    if inter > 0.0:
        t_inter = (nodes - 1.0) * (token_bytes / link_bytes_per_s(outer, SEND_RECV, token_bytes) + outer.latency_s)
    t_ag = collective_time_s(ALL_GATHER, r, stride, r * nodes * token_bytes, tiers)
    intra = (r - 1.0) * nodes * token_bytes
    if algorithm == DISPATCH_SENDRECV_ALLGATHER_SPLIT:
        return 0.5 * t_inter + max(0.5 * t_inter, 0.5 * t_ag) + 0.5 * t_ag, intra, inter
    return t_inter + t_ag, intra, inter


@jit
def combine_s(algorithm: int, token_bytes: float, e: float, stride: float, experts: float, top_k: float,
              max_nodes: float, tiers) -> float:
    """One combine: the dispatch's traffic in reverse (gather-based algorithms
    reduce-scatter the e * B buffer instead of gathering it)."""
    if algorithm == DISPATCH_ALLGATHER:
        if e <= 1.0 or token_bytes <= 0.0:
            return 0.0
        return collective_time_s(REDUCE_SCATTER, e, stride, e * token_bytes, tiers)
    t, _, _ = dispatch_s(algorithm, token_bytes, e, stride, experts, top_k, max_nodes, tiers)
    return t


@jit
def gathers(algorithm: int) -> bool:
    """The algorithm hands every rank the whole group's (or node's) tokens."""
    return (algorithm == DISPATCH_ALLGATHER or algorithm == DISPATCH_SENDRECV_ALLGATHER
            or algorithm == DISPATCH_SENDRECV_ALLGATHER_SPLIT)


@jit
def permute_bytes(algorithm: int, token_bytes: float, e: float, top_k: float, imbalance: float) -> float:
    """HBM bytes of the local passes around one dispatch (or its combine):
    the routed rows read and written once (k * imbalance * B each way), plus,
    after a gather, the scan of the whole gathered buffer (e * B)."""
    rows = top_k * imbalance * token_bytes
    if gathers(algorithm):
        return e * token_bytes + 2.0 * rows
    return token_bytes + 2.0 * rows


@jit
def staging_bytes(algorithm: int, token_elems: float, act_bytes: float, dispatch_bytes: float, e: float,
                  top_k: float, imbalance: float) -> float:
    """Device bytes of the dispatch buffers of one MoE layer in flight, for
    ``token_elems`` elements of the rank's tokens (tokens x hidden): the gathered
    e * B buffer (gather-based) or the rank's tokens, the per-destination send rows and
    the received expert rows (all-to-all based). What the dispatch moves is held at
    its own width, ``dispatch_bytes`` an element (FP8 rows and their scales under an
    FP8 dispatch, ``kernels.params.DISPATCH_BYTES``); the rank's own tokens at the
    activations' ``act_bytes``."""
    rows = top_k * imbalance * token_elems * dispatch_bytes
    if gathers(algorithm):
        return e * token_elems * dispatch_bytes + rows
    return token_elems * act_bytes + 2.0 * rows


@jit
def grouped_gemm_s(groups: float, m: float, n: float, k: float, dev, tiles, dtype_bytes: float) -> float:
    """``groups`` GEMMs of (m x k) @ (k x n) in one grouped kernel: one launch,
    each group at the efficiency of its own shape (so small m per expert pays)."""
    if groups <= 0.0 or m <= 0.0:
        return 0.0
    return groups * (gemm_time_s(m, n, k, dev, tiles, dtype_bytes) - dev.launch_s) + dev.launch_s


@jit
def grouped_gemm_fwd_bwd_s(groups: float, m: float, n: float, k: float, dev, tiles, dtype_bytes: float):
    """Forward, backward (input and weight gradients) and weight-gradient seconds
    of a grouped GEMM (as ``kernels.ops.gemm_fwd_bwd_s`` for one GEMM)."""
    fwd = grouped_gemm_s(groups, m, n, k, dev, tiles, dtype_bytes)
    wgrad = grouped_gemm_s(groups, k, n, m, dev, tiles, dtype_bytes)
    bwd = grouped_gemm_s(groups, m, k, n, dev, tiles, dtype_bytes) + wgrad
    return fwd, bwd, wgrad


@jit
def two_batch_exposed_s(dispatch: float, combine: float, compute: float) -> float:
    """Communication left exposed when a micro-batch is split in two halves and
    one half's dispatch/combine runs beside the other half's expert compute:
    dispatch(A); dispatch(B) | experts(A); combine(A) | experts(B); combine(B)."""
    d = 0.5 * dispatch
    c = 0.5 * combine
    x = 0.5 * compute
    return d + max(0.0, d - x) + max(0.0, c - x) + c


@jit
def local_pass_s(algorithm: int, token_bytes: float, e: float, top_k: float, imbalance: float, dev) -> float:
    """Permutation (or unpermutation) passes of one dispatch (or combine)."""
    return memory_bound_s(permute_bytes(algorithm, token_bytes, e, top_k, imbalance), 2.0, dev)
