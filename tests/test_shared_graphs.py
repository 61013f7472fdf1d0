"""Rows that share a step graph (``kernels.event_tier.simulate_rows``).

Rows whose graphs differ only in their durations are simulated on one graph built
for the first of them, each filling in its own durations from the graph's recipe
(``kernels.pipeline.build_step_recipe`` / ``recipe_durations``). Checked here: for
rows of one key, the shared graph is the row's own graph array for array, and the
recipe gives exactly the durations the row's own build does; the grouped tier gives
bit-identical results to simulating each row on its own graph; a hand example of
the recipe's shares and link sharing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paraspace.explorer.evaluate import kernel_strategy, pack
from paraspace.kernels.event_tier import (
    N_KEY,
    N_SIM,
    graph_groups,
    graph_key,
    row_graph,
    row_graph_recipe,
    row_inputs,
    simulate_one,
    simulate_rows,
)
from paraspace.kernels.codes import SCHEDULE_INTERLEAVED
from paraspace.kernels.pipeline import R_DP_GRAD, R_FORWARD, R_SEND, build_step_recipe, recipe_durations, split_backward
from paraspace.spaces.catalog import load_space
from paraspace.spaces.encode import Encoder

ROOT = Path(__file__).resolve().parents[1]
CALCULON = ROOT / "bench" / "spaces" / "gpt3-175b-a100-512-calculon.toml"


def sample(space_ref, n: int, seed: int = 0):
    space = load_space(space_ref)
    packed = pack(space)
    cols = Encoder(space).encode_all().columns
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(cols["tp"].shape[0], size=min(n, cols["tp"].shape[0]), replace=False))
    return packed, {k: v[pick] for k, v in cols.items()}


def row_args(cols, i):
    """Row i's strategy as Python ints, as ``explorer.timeline`` passes it to ``row_graph`` (numpy
    int32 scalars would compile it, and everything it calls, a second time)."""
    return tuple(int(a[i]) for a in kernel_strategy(cols))


def keys_of(packed, cols):
    n = cols["tp"].shape[0]
    keys = np.empty((n, N_KEY), dtype=np.int64)
    rec = (packed.model[0], packed.device[0], packed.tiers, packed.tiles, packed.workload[0])
    for i in range(n):
        a = row_args(cols, i)
        inputs = row_inputs(*a[:20], *rec)
        v = a[4] if a[11] == SCHEDULE_INTERLEAVED else 1
        graph_key(i, a[11], a[1], v, a[20], a[9], a[16], inputs, keys[i])
    return keys


@pytest.mark.parametrize("space_ref", [str(CALCULON), "llama3-70b-h100-1024", "gpt3-175b-a100-1024"])
def test_rows_of_one_key_share_their_graph_and_the_recipe_gives_their_durations(space_ref):
    packed, cols = sample(space_ref, 400)
    keys = keys_of(packed, cols)
    order, ptr = graph_groups(keys)
    rec = (packed.model[0], packed.device[0], packed.tiers, packed.tiles, packed.workload[0])
    shared_rows = 0
    for g in range(ptr.shape[0] - 1):
        members = order[ptr[g]:ptr[g + 1]]
        assert all((keys[m] == keys[members[0]]).all() for m in members)  # a group is one exact key
        if members.shape[0] < 2:
            continue
        first = members[0]
        graph, (recipe, links) = row_graph_recipe(*row_args(cols, first), *rec, 4)
        schedule = row_args(cols, first)[11]
        for m in members[1:]:
            own = row_graph(*row_args(cols, m), *rec, 4)
            for k in range(1, 13):  # everything but the durations is the shared graph's
                assert np.array_equal(np.asarray(own[k]), np.asarray(graph[k])), (m, k)
            fwd, bwd, wgrad, ep_ns, send, _, _, _, dp_grad, dp_param, z3g, z3s, opt = row_inputs(
                *row_args(cols, m)[:20], *rec)
            dur = np.empty_like(graph[0])
            assert recipe_durations(recipe, links, split_backward(schedule), fwd, bwd, wgrad, send, dp_grad, dp_param,
                                    z3g, z3s, opt, dur)
            assert np.array_equal(dur, own[0])
            shared_rows += 1
    assert shared_rows > 20  # the sample has rows that share graphs (else this tested nothing)


@pytest.mark.parametrize("space_ref", [str(CALCULON), "deepseek-v3-h800", "llama3-70b-h100-1024"])
def test_grouped_tier_equals_each_row_on_its_own_graph(space_ref):
    packed, cols = sample(space_ref, 120, seed=1)
    n = cols["tp"].shape[0]
    ones = np.ones(n)
    got = simulate_rows(*kernel_strategy(cols), packed.model, packed.device, packed.tiers, packed.tiles, packed.workload,
                        np.ones(n, bool), ones.copy(), ones.copy(), ones.copy(), 4)
    for i in range(n):
        out = np.full(N_SIM, np.nan)
        simulate_one(*row_args(cols, i), packed.model[0], packed.device[0], packed.tiers, packed.tiles,
                     packed.workload[0], 4, out)
        assert np.array_equal(out, got[i], equal_nan=True), i


def test_recipe_by_hand():
    """p = 2, v = 1, m = 2 micro-batches of 1F1B, 2 gradient buckets, pipeline and DP
    traffic on one tier (tier 0), so each send of a device lengthens its open DP
    transfer. Inputs: F = 101 / 103 ns (stage 0 / 1), B = 200 / 202, send 7,
    gradient reduction 31 (two buckets: 15 + 1 and 15), optimizer 5.
    Rebuilt from the recipe with new inputs F = 11 / 13, B = 20 / 22, send 3, reduction 9
    (buckets 5 and 4), the durations equal a fresh build's."""
    def build(f, b, send, grad, opt):
        fwd = np.array([[f[0]], [f[1]]], dtype=np.int64)
        bwd = np.array([[b[0]], [b[1]]], dtype=np.int64)
        wgrad = np.zeros((2, 1), dtype=np.int64)
        ep = np.zeros((2, 1, 4), dtype=np.int64)
        return build_step_recipe(1, 2, 1, 2, fwd, bwd, wgrad, send, 0, 0, 1, 1, grad, 0, 2, 0, 0, opt, ep, 0, 0)

    (g1, (recipe, links)) = build((101, 103), (200, 202), 7, 31, 5)
    (g2, _) = build((11, 13), (20, 22), 3, 9, 5)
    # the stage-0 first forward is one piece of F = 101; bucket shares are 31 // 2 + 1 = 16 and 31 // 2 = 15
    # (the remainder, 31 % 2 = 1, on the first: kernels.pipeline._share)
    kinds = {int(op) for op in recipe[:, 0]}
    assert {R_FORWARD, R_SEND, R_DP_GRAD} <= kinds
    grads = [t for t in range(recipe.shape[0]) if recipe[t, 0] == R_DP_GRAD]
    assert [int(recipe[t, 4]) for t in grads] == [0, 1, 0, 1]  # share index k of each device's 2 buckets
    dur = np.empty_like(g2[0])
    fwd = np.array([[11], [13]], dtype=np.int64)
    bwd = np.array([[20], [22]], dtype=np.int64)
    assert recipe_durations(recipe, links, False, fwd, bwd, np.zeros((2, 1), np.int64), 3, 9, 0, 0, 0, 5, dur)
    assert np.array_equal(dur, g2[0])
    # without links the reductions would be 5 and 4 (9 // 2 + 1, 9 // 2); each link adds a send's 3 ns
    base = [5, 4, 5, 4]
    added = [int(dur[t]) - b for t, b in zip(grads, base)]
    assert all(a % 3 == 0 for a in added) and sum(added) == 3 * sum(1 for t, _ in links if t in grads)
