"""Redundant experts: where an expert-parallel load balancer puts the copies of
hot experts, and what that leaves on the busiest rank (issue 15).

A MoE layer's ``E`` routed experts sit in ``S = E + R`` *slots* over ``ep``
ranks, ``S / ep`` slots a rank; the ``R`` redundant slots hold second (third,
...) copies of the most loaded experts, and the router splits an expert's
tokens evenly over its copies. DeepSeek's decode deployment: 256 experts + 32
redundant = 288 slots over EP144, 2 a GPU; its prefill: the same 288 over EP32,
9 a GPU (DeepSeek-V3/R1 Inference System Overview, open-infra-index
``202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md``;
arXiv:2412.19437 section 3.4 sets 32 redundant experts for prefill).

The placement is DeepSeek's EPLB global policy (github.com/deepseek-ai/EPLB,
``eplb.py``: ``replicate_experts`` then ``balanced_packing``), written here in
numpy:

1. replicate: ``R`` times, give one more copy to the expert whose load per copy
   is the highest (the first such expert on a tie);
2. pack: the copies, heaviest first (a stable sort), each onto the rank with the
   least load among those with a free slot (the first such rank on a tie).

The *imbalance* is the busiest rank's load over the mean rank's: the factor by
which the busiest rank's routed rows exceed the even share
(``kernels.inference.moe_mlp_s`` sizes the expert GEMMs of the busiest rank
with it). It is exactly 1 when every expert is equally loaded and ``ep``
divides ``E`` with no redundancy; with equal loads, redundant copies make it
worse (a copy carries half an expert's load, so ranks can no longer be equal),
and with unequal loads they can make it better: that is what they are for.

The experts' loads are the workload's ``expert_popularity_sigma``: expert ``i``
of ``E`` takes a share proportional to the lognormal quantile at (i + 1/2) / E
of log-standard deviation sigma (deterministic: no draw). It describes the
traffic's steady preference for some experts (what a balancer sees in its
statistics window), not one batch's sampling noise, which is not modelled
(routing within a batch is taken as the expected loads).
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np


def expert_loads(experts: int, sigma: float) -> np.ndarray:
    """Each expert's share of the routed tokens (sums to 1), heaviest first:
    lognormal quantiles of log-sd ``sigma`` at (i + 1/2) / experts; equal shares at 0."""
    if experts < 1:
        raise ValueError(f"experts = {experts}: expected at least 1")
    if sigma == 0.0:
        return np.full(experts, 1.0 / experts)
    normal = NormalDist()
    z = np.array([normal.inv_cdf((i + 0.5) / experts) for i in range(experts)])
    w = np.exp(sigma * z)[::-1]
    return w / w.sum()


def replicate(loads: np.ndarray, slots: int) -> np.ndarray:
    """Copies of each expert after ``slots - len(loads)`` redundant ones are handed
    out, each to the expert with the highest load per copy (EPLB ``replicate_experts``)."""
    count = np.ones(loads.shape[0], np.int64)
    for _ in range(slots - loads.shape[0]):
        count[int(np.argmax(loads / count))] += 1
    return count


def pack(items: np.ndarray, ranks: int) -> np.ndarray:
    """Each rank's load when ``items`` (weights; a multiple of ``ranks`` of them)
    are packed heaviest first onto the least-loaded rank with a free slot
    (EPLB ``balanced_packing``)."""
    per = items.shape[0] // ranks
    load = np.zeros(ranks)
    filled = np.zeros(ranks, np.int64)
    for w in items[np.argsort(-items, kind="stable")]:
        open_load = np.where(filled < per, load, np.inf)
        r = int(np.argmin(open_load))
        load[r] += w
        filled[r] += 1
    return load


def imbalance(experts: int, redundant: int, ep: int, sigma: float = 0.0) -> float:
    """The busiest rank's routed load over the mean rank's, for ``experts`` routed
    experts plus ``redundant`` copies over ``ep`` ranks (module doc). 1.0 for ep
    = 1. ``ep`` must divide the slots."""
    slots = experts + redundant
    if ep < 1 or slots % ep != 0:
        raise ValueError(f"ep = {ep}: expected a divisor of the {slots} expert slots")
    if ep == 1:
        return 1.0
    if redundant == 0 and sigma == 0.0:
        return 1.0  # equal loads, equal counts a rank: exactly even
    loads = expert_loads(experts, sigma)
    count = replicate(loads, slots)
    items = np.repeat(loads / count, count)
    rank_load = pack(items, ep)
    return float(rank_load.max() * ep / rank_load.sum())


def imbalance_table(experts: int, pairs: set[tuple[int, int]], sigma: float) -> dict[tuple[int, int], float]:
    """``imbalance`` of each distinct (redundant, ep) pair (the encoder's rows share a few)."""
    return {(r, e): imbalance(experts, r, e, sigma) for r, e in sorted(pairs)}


__all__ = ["expert_loads", "imbalance", "imbalance_table", "pack", "replicate"]
