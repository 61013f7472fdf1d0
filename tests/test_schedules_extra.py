"""DualPipe and PipeDream end to end: their task orders (against
``naive_engine``), the event engine on them (closed forms where they hold,
deadlock freedom, determinism, in-flight micro-batches), the analytic closed
forms and memory branches of ``kernels.training.evaluate_one``, and one
encoded row of each through the event tier."""

from __future__ import annotations

import naive_engine
import numpy as np
import pytest
from rows import cost_args
from test_pipeline import kernel_order, reference_times, step
from test_training_kernel import _model, _tiers, run

from paraspace.explorer.evaluate import evaluate, pack
from paraspace.kernels import pipeline
from paraspace.kernels.codes import (
    SCHEDULE_1F1B,
    SCHEDULE_DUALPIPE,
    SCHEDULE_PIPEDREAM,
    SCHEDULE_ZB_H1,
)
from paraspace.kernels.engine import K_BACKWARD, K_EP, K_FORWARD, K_OPTIMIZER, K_PP, K_WEIGHT_GRAD, OK
from paraspace.kernels.event_tier import N_SIM, S_INFLIGHT, step_metrics
from paraspace.spaces.catalog import space_from_raw
from paraspace.spaces.encode import Encoder

F, B, W = pipeline.F_PASS, pipeline.B_PASS, pipeline.W_PASS
GRID = [(p, m) for p in (2, 4, 8) for m in (2, 4, 8, 16)]


# --------------------------------------------------------------------------- helpers


def bubble(s) -> int:
    """Idle time of the busiest compute stream: makespan minus its busy time."""
    busy = max(int(s.dur[(s.stage == d) & (s.kind < K_OPTIMIZER)].sum()) for d in range(s.p))
    return s.makespan - busy


def span(s) -> int:
    """PipeDream's steady-state step: the longest device span (``steady_span_ns``)."""
    return int(pipeline.steady_span_ns(s.res, s.start, s.end, s.p, s.n_tiers))


def metrics(s) -> np.ndarray:
    out = np.zeros(N_SIM)
    step_metrics(s.dur, s.res, s.kind, s.micro, s.chunk, s.order_ptr, s.order_idx, s.start, s.end, s.p, 1,
                 s.n_tiers, out)
    return out


def check_dualpipe(s, wgrad):
    """Every chunk pass once with its stage's duration; micro-batch i < m/2 runs
    stage k on device k, i >= m/2 on device p - 1 - k; F(k+1, i) after F(k, i)
    and its send, B(k-1, i) after B(k, i) and its send, B after F, W after B."""
    assert s.status == OK and (s.end >= 0).all()
    p, m = s.p, s.m
    got = {}
    for t in np.flatnonzero(s.kind <= K_WEIGHT_GRAD):
        d, c, i = int(s.stage[t]), int(s.chunk[t]), int(s.micro[t])
        assert c == (0 if i < m // 2 else 1)
        k = d if c == 0 else p - 1 - d  # the stage this chunk runs
        key = (int(s.kind[t]), k, i)
        a, b, total = got.get(key, (1 << 62, -1, 0))
        got[key] = (min(a, int(s.start[t])), max(b, int(s.end[t])), total + int(s.dur[t]))
    assert len(got) == 3 * p * m
    for (kind, k, i), (first, last, total) in got.items():
        if kind == K_FORWARD:
            assert total == s.fwd_ns[k, 0]
            if k + 1 < p:
                assert got[(K_FORWARD, k + 1, i)][0] >= last + s.send_ns
        elif kind == K_BACKWARD:
            assert total == s.bwd_ns[k, 0] - wgrad[k]
            assert first >= got[(K_FORWARD, k, i)][1]
            if k > 0:
                assert got[(K_BACKWARD, k - 1, i)][0] >= last + s.send_ns
        else:
            assert total == wgrad[k]
            assert first >= got[(K_BACKWARD, k, i)][1]
    for d in range(p):  # the compute stream follows the generator
        order = [(int(s.kind[t] == K_BACKWARD) + 2 * int(s.kind[t] == K_WEIGHT_GRAD), int(s.chunk[t]),
                  int(s.micro[t])) for t in s.order_idx[s.order_ptr[d * pipeline.streams_per_device(s.n_tiers)]:
                                                          s.order_ptr[d * pipeline.streams_per_device(s.n_tiers) + 1]]
                 if s.kind[t] <= K_WEIGHT_GRAD]
        merged = [o for j, o in enumerate(order) if j == 0 or order[j - 1] != o]  # bucket pieces
        assert merged == naive_engine.dualpipe_order(p, m, d)


def peak_in_flight(order) -> int:
    """Most chunk passes between their forward and their last backward pass (W
    where there is one), along a compute order."""
    last = {}
    for j, (ps, c, i) in enumerate(order):
        if ps != F:
            last[(c, i)] = j
    live = peak = 0
    for j, (ps, c, i) in enumerate(order):
        if ps == F:
            live += 1
            peak = max(peak, live)
        elif last[(c, i)] == j:
            live -= 1
    return peak


# --------------------------------------------------------------------------- DualPipe: the order


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
def test_dualpipe_order_matches_reference(p):
    """The kernel's generator against the plain-Python transcription of
    ``DualPipe.step`` for every device and even m up to 4 p (m < 2 p: padded)."""
    for m in range(2, 4 * p + 1, 2):
        for d in range(p):
            assert kernel_order(SCHEDULE_DUALPIPE, p, 1, m, d) == naive_engine.dualpipe_order(p, m, d), (p, m, d)


def test_dualpipe_order_hand_example():
    """p = 2, m = 4 (M = 2 per direction; padded to M = p = 2, nothing dropped).
    Device 0 (h = 0, H = 1): step 1 none; step 2 F0 F1 -> F(0, 0) F(1, 2); step 3
    none; step 4 (M - p + 1 = 1) F(0, 1) B(1, 2) W F(1, 3) B(0, 0) W; step 5
    none; step 6 (h + 1 = 1): B(1, 3), then deferral starts: B(0, 1) deferred;
    step 8: its W. Device 1 is the mirror image (its near chunk is 1)."""
    assert kernel_order(SCHEDULE_DUALPIPE, 2, 1, 4, 0) == [
        (F, 0, 0), (F, 1, 2), (F, 0, 1), (B, 1, 2), (W, 1, 2), (F, 1, 3), (B, 0, 0), (W, 0, 0),
        (B, 1, 3), (W, 1, 3), (B, 0, 1), (W, 0, 1)]
    assert kernel_order(SCHEDULE_DUALPIPE, 2, 1, 4, 1) == [
        (F, 1, 2), (F, 0, 0), (F, 1, 3), (B, 0, 0), (W, 0, 0), (F, 0, 1), (B, 1, 2), (W, 1, 2),
        (B, 0, 1), (W, 0, 1), (B, 1, 3), (W, 1, 3)]


@pytest.mark.parametrize(("p", "m"), GRID + [(6, 12), (16, 32)])
def test_dualpipe_every_pass_once_in_order(p, m):
    """Each device runs F, B and W of its m chunk passes once each (chunk 0:
    micro-batches 0 .. m/2 - 1, chunk 1: the rest), F before B before W, and
    each chunk's micro-batches in order."""
    for d in range(p):
        order = kernel_order(SCHEDULE_DUALPIPE, p, 1, m, d)
        expected = [(ps, c, i) for ps in (F, B, W) for c in (0, 1) for i in range(c * m // 2, (c + 1) * m // 2)]
        assert sorted(order) == sorted(expected)
        for c in (0, 1):
            for ps in (F, B, W):
                mine = [i for q, cc, i in order if q == ps and cc == c]
                assert mine == sorted(mine)
            for i in range(c * m // 2, (c + 1) * m // 2):
                assert order.index((F, c, i)) < order.index((B, c, i)) < order.index((W, c, i))


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
def test_dualpipe_activation_memory_is_p_plus_one(p):
    """DeepSeek-V3 (Table 2): DualPipe holds PP + 1 micro-batches' activations
    (chunks of one stage, counted from F to W) on every device once m >= 2 p;
    fewer micro-batches hold at most m."""
    for m in (2 * p, 4 * p):
        assert [peak_in_flight(kernel_order(SCHEDULE_DUALPIPE, p, 1, m, d)) for d in range(p)] == [p + 1] * p
    for m in range(2, 2 * p, 2):
        assert all(peak_in_flight(kernel_order(SCHEDULE_DUALPIPE, p, 1, m, d)) <= min(p + 1, m) for d in range(p))


# --------------------------------------------------------------------------- DualPipe: the engine


@pytest.mark.parametrize(("p", "m"), GRID)
def test_dualpipe_deadlock_free_and_valid(p, m):
    """p in {2, 4, 8}, m in {2, 4, 8, 16} (m < 2 p included): the step finishes,
    with equal and with random uneven stages, with and without sends."""
    rng = np.random.default_rng(p * 100 + m)
    for fwd, bwd, w, send in ((10, 30, 10, 0), (10, 30, 10, 4), (rng.integers(1, 40, (p, 1)),
                                                                  rng.integers(41, 90, (p, 1)),
                                                                  rng.integers(0, 40, (p, 1)), 3)):
        s = step(SCHEDULE_DUALPIPE, p, 1, m, fwd, bwd, wgrad=w, send_ns=send)
        check_dualpipe(s, np.broadcast_to(np.asarray(w), (p, 1))[:, 0])


def test_dualpipe_random_steps_finish():
    """ZeRO 0-3, buckets, shared or separate tiers, sends, uneven stages, EP
    traffic as tasks (with or without two-batch overlap, on any tier): 150
    random DualPipe steps finish, run every chunk pass once and end each device
    with its optimizer step."""
    rng = np.random.default_rng(2025)
    for _ in range(150):
        p = int(rng.choice([2, 4, 6, 8]))
        m = 2 * int(rng.integers(1, 2 * p + 1))
        w = rng.integers(0, 30, size=(p, 1))
        s = step(SCHEDULE_DUALPIPE, p, 1, m, rng.integers(0, 60, size=(p, 1)), w + rng.integers(0, 90, size=(p, 1)),
                 wgrad=w, send_ns=int(rng.integers(0, 20)), pp_tier=int(rng.integers(0, 2)),
                 dp_tier=int(rng.integers(0, 2)), zero=int(rng.integers(0, 4)),
                 dp_grad_ns=int(rng.integers(0, 400)), dp_param_ns=int(rng.integers(0, 100)),
                 n_buckets=int(rng.integers(1, 6)), z3_gather_ns=int(rng.integers(0, 20)),
                 z3_scatter_ns=int(rng.integers(0, 20)), optimizer_ns=int(rng.integers(0, 50)),
                 ep=[int(x) for x in rng.integers(0, [20, 20, 20, 20])] if rng.random() < 0.5 else 0,
                 ep_tier=int(rng.integers(0, 2)), tbo=int(rng.integers(0, 2)))
        assert s.status == OK and (s.end >= 0).all()
        assert int((s.kind <= K_WEIGHT_GRAD).sum()) >= 3 * p * m
        for d in range(p):
            r = d * pipeline.streams_per_device(s.n_tiers)
            assert s.kind[s.order_idx[s.order_ptr[r + 1] - 1]] == K_OPTIMIZER


def dual_pass_totals(s) -> dict[tuple[int, int, int], int]:
    """(kind, stage run, micro) -> compute time over the pass's tasks (an EP
    pair's forward runs in two pieces around the backward's experts)."""
    got: dict[tuple[int, int, int], int] = {}
    for t in np.flatnonzero(s.kind <= K_WEIGHT_GRAD):
        d, c, i = int(s.stage[t]), int(s.chunk[t]), int(s.micro[t])
        key = (int(s.kind[t]), d if c == 0 else s.p - 1 - d, i)
        got[key] = got.get(key, 0) + int(s.dur[t])
    return got


def random_dualpipe_ep(rng: np.random.Generator) -> dict:
    """A random DualPipe step with EP traffic on uneven stages (expert compute
    forward / backward, dispatch, combine per stage), DP traffic of any ZeRO
    stage, tiers shared or not, with or without two-batch overlap and pairs."""
    p = int(rng.choice([2, 4, 6, 8]))
    m = 2 * int(rng.integers(1, 2 * p + 1))
    w = rng.integers(0, 30, size=(p, 1))
    ep = np.stack([rng.integers(0, 40, (p, 1)), rng.integers(0, 60, (p, 1)), rng.integers(0, 40, (p, 1)),
                   rng.integers(0, 40, (p, 1))], axis=-1)
    ep[rng.random(p) < 0.2] = 0  # some stages without MoE layers
    return dict(schedule=SCHEDULE_DUALPIPE, p=p, v=1, m=m, fwd=rng.integers(0, 60, size=(p, 1)) + ep[:, :, 0],
                bwd=w + rng.integers(0, 90, size=(p, 1)) + ep[:, :, 1], wgrad=w, send_ns=int(rng.integers(0, 20)),
                pp_tier=int(rng.integers(0, 2)), dp_tier=int(rng.integers(0, 2)), zero=int(rng.integers(0, 4)),
                dp_grad_ns=int(rng.integers(0, 400)), dp_param_ns=int(rng.integers(0, 100)),
                n_buckets=int(rng.integers(1, 6)), z3_gather_ns=int(rng.integers(0, 20)),
                z3_scatter_ns=int(rng.integers(0, 20)), optimizer_ns=int(rng.integers(0, 50)), ep=ep,
                ep_tier=int(rng.integers(0, 2)), tbo=int(rng.integers(0, 2)), ep_pairs=bool(rng.random() < 0.8))


def test_dualpipe_random_ep_steps_finish():
    """200 random DualPipe steps with uneven EP traffic (``random_dualpipe_ep``):
    no deadlock, every chunk pass's compute once at its stage's duration (the
    EP pair's forward in two pieces), all of the traffic on the EP streams,
    the optimizer last on every device."""
    rng = np.random.default_rng(2027)
    for _ in range(200):
        cfg = random_dualpipe_ep(rng)
        s = step(**cfg)
        p, m = cfg["p"], cfg["m"]
        assert s.status == OK and (s.end >= 0).all(), cfg
        got = dual_pass_totals(s)
        w = cfg["wgrad"][:, 0]
        assert len(got) == 3 * p * m
        for (kind, k, i), total in got.items():
            expected = {K_FORWARD: s.fwd_ns[k, 0], K_BACKWARD: s.bwd_ns[k, 0] - w[k], K_WEIGHT_GRAD: w[k]}[kind]
            assert total == expected, cfg
        ep = cfg["ep"][:, 0]
        traffic = sum(int(ep[k, 2] + ep[k, 3]) * 2 * m for k in range(p))  # F and B of m passes per stage
        assert int(s.dur[s.kind == K_EP].sum()) == traffic
        for d in range(p):
            r = d * pipeline.streams_per_device(s.n_tiers)
            assert s.kind[s.order_idx[s.order_ptr[r + 1] - 1]] == K_OPTIMIZER


def test_dualpipe_ep_matches_reference_engine():
    """Random DualPipe steps with EP traffic and pairs (``random_dualpipe_ep``),
    simulated by the plain-Python reference engine (``naive_engine.simulate``)
    from the same arrays: the same status, starts and ends."""
    rng = np.random.default_rng(31)
    for _ in range(60):
        cfg = random_dualpipe_ep(rng)
        p = cfg["p"]
        g = pipeline.build_step(SCHEDULE_DUALPIPE, p, 1, cfg["m"], cfg["fwd"].astype(np.int64),
                                cfg["bwd"].astype(np.int64), cfg["wgrad"].astype(np.int64), cfg["send_ns"],
                                cfg["pp_tier"], cfg["dp_tier"], 2, cfg["zero"], cfg["dp_grad_ns"], cfg["dp_param_ns"],
                                cfg["n_buckets"], cfg["z3_gather_ns"], cfg["z3_scatter_ns"], cfg["optimizer_ns"],
                                cfg["ep"].astype(np.int64), cfg["ep_tier"], cfg["tbo"], cfg["ep_pairs"])
        expected = reference_times(g)
        s = step(**cfg)
        assert (s.status, s.start.tolist(), s.end.tolist()) == expected


def test_dualpipe_ep_pairs_hand_example():
    """p = 2, m = 4, equal stages: F 10 (experts 4, so 6 before them), B_in 20
    (experts 8, the rest 12), W 10, no sends; device 0 runs F(0,0) F(1,2)
    [F(0,1) B(1,2)] W [F(1,3) B(0,0)] W B(1,3) W B(0,1) W (two EP pairs) and
    device 1 the mirror image at the same times. Unpaired passes run
    pre -> D -> experts -> C (backward C -> experts -> D -> rest).

    Dispatch = combine = 2, shorter than the paired compute: F(0,0) 0-6, D 6-8,
    x 8-12, C 12-14; F(1,2) (device 1's F(1,2) ends at 14) 14-20, D 20-22, x
    22-26, C 26-28. Pair 1: F_pre 26-32, C_B 28-30 (after F(1,2), the
    backward's input), B_exp 32-40, D_F 32-34, F_exp 40-44, D_B 40-42, B_rest
    44-56, C_F 44-46, W 56-66: compute never idles, all 8 of traffic hidden.
    Pair 2 (B(0,0)'s gradient leaves device 1 after its pair 1's W, at 66):
    F_pre 66-72, C_B 66-68, B_exp 72-80, F_exp 80-84, B_rest 84-96, W 96-106;
    B(1,3) (its C_B 86-88, after F(1,3)'s C_F 84-86) 106-114, D 114-116, rest
    116-128, W 128-138; B(0,1) (device 1's B(0,1) + W end at 138) C 138-140, x
    140-148, D 148-150, rest 150-162, W 162-172: 172. Sequentially each pair
    also exposes its 4 transfers: 172 + 2 x 8 = 188.

    Dispatch = combine = 6, longer: F(0,0) 0-6, D 6-12, x 12-16, C 16-22;
    F(1,2) 22-28, D 28-34, x 34-38, C 38-44. Pair 1: F_pre 38-44; C_B 44-50
    (queued behind F(1,2)'s combine), B_exp 50-58, D_F 50-56, F_exp 58-62,
    D_B 58-64, B_rest 64-76 (D_B outlasts F_exp by 2), C_F 64-70, W 76-86:
    8 exposed. Pair 2: F_pre 86-92, C_B 86-92, B_exp 92-100, D_F 92-98, F_exp
    100-104, D_B 100-106, B_rest 106-118, C_F 106-112, W 118-128: exposed
    max(0, 6 - 6) + max(0, 6 - 8) + max(0, 6 - 4) + max(0, 6 - 12) = 2
    (``build_step``). B(1,3): C_B 112-118, x 128-136, D 136-142, rest 142-154,
    W 154-164; B(0,1): C 164-170, x 170-178, D 178-184, rest 184-196, W
    196-206: 206. Sequentially the pairs expose 4 x 6 = 24 each instead of 8
    and 2: 206 + 16 + 22 = 244."""
    args = (SCHEDULE_DUALPIPE, 2, 1, 4, 10, 30)
    for d_c, paired, alone in ((2, 172, 188), (6, 206, 244)):
        ep = [4, 8, d_c, d_c]
        s = step(*args, wgrad=10, ep=ep)
        assert s.status == OK
        assert (s.makespan, step(*args, wgrad=10, ep=ep, ep_pairs=False).makespan) == (paired, alone)
    got = {}
    for t in np.flatnonzero((s.stage == 0) & (s.micro == 0) & (s.chunk == 0) & (s.kind == K_BACKWARD)):
        got.setdefault("B", []).append((int(s.start[t]), int(s.end[t])))
    assert got["B"] == [(92, 100), (106, 118)]  # pair 2's backward: experts, then the rest after D_B


def test_dualpipe_ep_pairs_mostly_shorten_the_step():
    """Pairing against each pass's EP part alone (the same random steps, same
    two-batch overlap setting): never longer on a pair in isolation, but not
    on every step. The pair's forward runs its experts only after the
    backward's input and experts (as the reference's overlapped chunk waits
    for both receives), where on its own it would have run while waiting for
    that input; e.g. equal stages, p = 6, m = 8, F 58 (experts 50), B 149
    (experts 85, W 13), dispatch 1, combine 10, sends 26 on their own tier:
    2988 paired, 2921 alone. Over 300 random steps (some without pairs: m
    small, stages without EP) pairing is shorter in 191, longer in 1, and a
    loss is below each device's paired forwards' MoE parts (experts +
    dispatch + combine) summed."""
    args = (SCHEDULE_DUALPIPE, 6, 1, 8, 58, 149)
    kw = dict(wgrad=13, send_ns=26, ep=[50, 85, 1, 10], ep_tier=1)
    assert (step(*args, **kw).makespan, step(*args, **kw, ep_pairs=False).makespan) == (2988, 2921)
    rng = np.random.default_rng(77)
    shorter = longer = 0
    for _ in range(300):
        cfg = random_dualpipe_ep(rng)
        cfg["ep_pairs"] = True
        a = step(**cfg)
        b = step(**{**cfg, "ep_pairs": False})
        shorter += a.makespan < b.makespan
        if a.makespan > b.makespan:
            longer += 1
            p, m, ep = cfg["p"], cfg["m"], cfg["ep"][:, 0]
            bound = 0
            for d in range(p):
                order = kernel_order(SCHEDULE_DUALPIPE, p, 1, m, d)
                mine = 0
                for o in range(len(order) - 1):
                    (ps, c, _), (nxt, c2, _) = order[o], order[o + 1]
                    if ps == F and nxt == B and c2 != c:
                        k = d if c == 0 else p - 1 - d
                        mine += int(ep[k, 0] + ep[k, 2] + ep[k, 3])
                bound = max(bound, mine)
            assert a.makespan - b.makespan <= bound, cfg
    assert shorter >= 150 and longer <= 5, (shorter, longer)


def test_zb_h1_and_pipedream_random_steps_with_ep_finish():
    """ZB-H1 and PipeDream with EP traffic as tasks on the tier of the sends
    and of DP (one shared NIC stream) or apart, two-batch overlap or not: 100
    random steps each finish and run every pass."""
    rng = np.random.default_rng(2026)
    for schedule in (SCHEDULE_ZB_H1, SCHEDULE_PIPEDREAM):
        for _ in range(100):
            p = int(rng.integers(1, 6))
            m = int(rng.integers(1, 10))
            w = rng.integers(0, 30, size=(p, 1))
            s = step(schedule, p, 1, m, rng.integers(0, 60, size=(p, 1)), w + rng.integers(0, 90, size=(p, 1)),
                     wgrad=w, send_ns=int(rng.integers(0, 20)), pp_tier=0, dp_tier=int(rng.integers(0, 2)),
                     zero=int(rng.integers(0, 4)), dp_grad_ns=int(rng.integers(0, 400)),
                     dp_param_ns=int(rng.integers(0, 100)), n_buckets=int(rng.integers(1, 6)),
                     z3_gather_ns=int(rng.integers(0, 20)), z3_scatter_ns=int(rng.integers(0, 20)),
                     ep=[int(x) for x in rng.integers(0, [20, 20, 20, 20])], ep_tier=int(rng.integers(0, 2)),
                     tbo=int(rng.integers(0, 2)))
            assert s.status == OK and (s.end >= 0).all(), (schedule, p, m)
            assert int(((s.kind == K_FORWARD) | (s.kind == K_BACKWARD)).sum()) >= 2 * p * m


def test_dualpipe_closed_form_p2_and_p4():
    """Equal stages, no communication. DeepSeek-V3's bubble (p/2 - 1)(F&B + B - 3W)
    with B the full backward and F&B = F + B (run back to back here):
    p = 2 has none, so the step is m (F + B): m = 8, F = 10, B = 30 -> 320.
    p = 4, F = 10, B = 20 of which W = 10: (1)(30 + 20 - 30) = 20 -> 8 * 30 + 20 = 260."""
    assert step(SCHEDULE_DUALPIPE, 2, 1, 8, 10, 30, wgrad=10).makespan == 320
    assert step(SCHEDULE_DUALPIPE, 4, 1, 8, 10, 20, wgrad=10).makespan == 260
    for m in (8, 12, 16, 32):  # independent of m once m >= 2 p
        assert bubble(step(SCHEDULE_DUALPIPE, 4, 1, m, 10, 20, wgrad=10)) == 20


@pytest.mark.parametrize("p", [2, 4, 6, 8, 10, 12, 16])
@pytest.mark.parametrize("u", [7, 10])
def test_dualpipe_bubble_against_published(p, u):
    """The documented approximation (``kernels.pipeline._dualpipe_order``): with
    F = B_in = W = u the published bubble is (p/2 - 1)(3u + 2u - 3u) = (p - 2) u;
    the engine, which runs F&B back to back and lets a pass wait only for its own
    input, measures (p - 2) u + max(0, p/2 - 2) u, the same for every m >= 2 p."""
    for m in (2 * p, 2 * p + 2, 4 * p):
        s = step(SCHEDULE_DUALPIPE, p, 1, m, u, 2 * u, wgrad=u)
        assert bubble(s) == (p - 2) * u + max(0, p // 2 - 2) * u


def test_dualpipe_beats_1f1b_p8_m16():
    """Same stage times (F = 10, B = 20 of which W = 10), p = 8, m = 16, no
    communication: 1F1B idles (p - 1)(F + B) = 210, ZB-H1 (p - 1)(F + B - 2W) = 70,
    DualPipe 80 (published 60; see above). Also with B_in = 2 W."""
    one = step(SCHEDULE_1F1B, 8, 1, 16, 10, 20, wgrad=10)
    zb = step(SCHEDULE_ZB_H1, 8, 1, 16, 10, 20, wgrad=10)
    dual = step(SCHEDULE_DUALPIPE, 8, 1, 16, 10, 20, wgrad=10)
    assert (bubble(one), bubble(zb), bubble(dual)) == (210, 70, 80)
    for fwd, bwd, w in ((10, 30, 10), (10, 20, 5), (20, 30, 10)):
        one = step(SCHEDULE_1F1B, 8, 1, 16, fwd, bwd, wgrad=w)
        dual = step(SCHEDULE_DUALPIPE, 8, 1, 16, fwd, bwd, wgrad=w)
        assert bubble(dual) < bubble(one) == 7 * (fwd + bwd)
        assert dual.makespan < one.makespan


def test_dualpipe_in_flight_metric():
    """The event tier's stage-0 peak (forwards begun minus W's begun): p + 1."""
    for p in (2, 4, 8):
        s = step(SCHEDULE_DUALPIPE, p, 1, 2 * p, 10, 20, wgrad=10)
        assert metrics(s)[S_INFLIGHT] == p + 1


def test_dualpipe_sends_follow_the_pair():
    """An F&B chunk's forward output leaves after its backward (and that
    backward's W): p = 2, m = 4, F = 10, B_in = 20, W = 10, send 1. Device 0 runs
    F(0,0) [0, 10) F(1,2) ... and its step-4 pair F(0,1) B(1,2) W: the send of
    F(0,1) starts when the W ends, not when F(0,1) does."""
    s = step(SCHEDULE_DUALPIPE, 2, 1, 4, 10, 30, wgrad=10, send_ns=1)
    assert s.status == OK
    tasks = {(int(s.kind[t]), int(s.stage[t]), int(s.chunk[t]), int(s.micro[t])): t
             for t in range(s.dur.shape[0]) if s.kind[t] <= K_WEIGHT_GRAD}
    f01 = tasks[(K_FORWARD, 0, 0, 1)]
    w12 = tasks[(K_WEIGHT_GRAD, 0, 1, 2)]
    (send,) = [t for t in np.flatnonzero(s.kind == K_PP) if s.stage[t] == 0 and s.micro[t] == 1 and s.chunk[t] == 0]
    assert s.end[f01] < s.end[w12] == s.start[send]


# --------------------------------------------------------------------------- PipeDream


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_pipedream_order(p):
    """One steady-state period: B(j - 1), F(j + p - 1 - d) for j < m."""
    for m in (1, 2, 5, 16):
        for d in range(p):
            assert kernel_order(SCHEDULE_PIPEDREAM, p, 1, m, d) == naive_engine.pipedream_order(p, m, d)


@pytest.mark.parametrize(("p", "m"), GRID + [(1, 4), (8, 1)])
def test_pipedream_steady_state_equals_closed_form(p, m):
    """Equal stages, no communication: the period is m (F + B) exactly, no
    bubble (the fill and drain happen once per run); every device busy all of it."""
    s = step(SCHEDULE_PIPEDREAM, p, 1, m, 10, 20)
    assert s.status == OK and (s.end >= 0).all()
    assert span(s) == m * 30
    assert int((s.kind == K_FORWARD).sum()) == int((s.kind == K_BACKWARD).sum()) == p * m


def test_pipedream_uneven_stages_run_at_the_slowest():
    """Uneven stages, no communication: the period is m t_max (the closed form)."""
    rng = np.random.default_rng(11)
    for _ in range(60):
        p = int(rng.integers(1, 9))
        m = int(rng.integers(1, 33))
        fwd, bwd = rng.integers(1, 40, size=(p, 1)), rng.integers(1, 80, size=(p, 1))
        s = step(SCHEDULE_PIPEDREAM, p, 1, m, fwd, bwd)
        assert span(s) == m * int((fwd + bwd).max()), (p, m)


def test_pipedream_sends_and_reductions():
    """With sends the period only grows (p = 4, m = 8, send 3: 276 > 240), never
    past the makespan of the staggered window; a gradient reduction after the
    last backward and the optimizer stay inside each device's span."""
    s = step(SCHEDULE_PIPEDREAM, 4, 1, 8, 10, 20, send_ns=3)
    assert span(s) == 276 and span(s) <= s.makespan
    rng = np.random.default_rng(12)
    for _ in range(80):
        p, m = int(rng.integers(1, 9)), int(rng.integers(1, 17))
        s = step(SCHEDULE_PIPEDREAM, p, 1, m, rng.integers(1, 40, (p, 1)), rng.integers(1, 80, (p, 1)),
                 send_ns=int(rng.integers(0, 10)), zero=int(rng.integers(0, 4)), dp_grad_ns=int(rng.integers(0, 300)),
                 dp_param_ns=int(rng.integers(0, 50)), n_buckets=int(rng.integers(1, 5)),
                 z3_gather_ns=int(rng.integers(0, 10)), z3_scatter_ns=int(rng.integers(0, 10)),
                 optimizer_ns=int(rng.integers(0, 30)))
        assert s.status == OK and (s.end >= 0).all()
        per_dev = pipeline.streams_per_device(s.n_tiers)
        busiest = max(int(s.dur[s.res == d * per_dev].sum()) for d in range(p))
        assert busiest <= span(s) <= s.makespan


def test_pipedream_in_flight_metric():
    """Stage 0 keeps p micro-batches in flight whatever m (the earlier periods' included)."""
    for p in (1, 2, 4, 8):
        for m in (1, 3, 16):
            s = step(SCHEDULE_PIPEDREAM, p, 1, m, 10, 20)
            assert pipeline.steady_in_flight(s.kind, s.micro, s.order_ptr, s.order_idx) == p


# --------------------------------------------------------------------------- both: determinism


@pytest.mark.parametrize("schedule", [SCHEDULE_DUALPIPE, SCHEDULE_PIPEDREAM])
def test_deterministic(schedule):
    rng = np.random.default_rng(5)
    for _ in range(10):
        p = int(rng.choice([2, 4, 8]))
        m = 2 * int(rng.integers(1, 9))
        cfg = {"fwd": rng.integers(1, 50, (p, 1)), "bwd": rng.integers(50, 99, (p, 1)),
               "wgrad": rng.integers(0, 40, (p, 1)), "send_ns": int(rng.integers(0, 9)),
               "zero": int(rng.integers(0, 4)), "dp_grad_ns": int(rng.integers(0, 99)),
               "n_buckets": int(rng.integers(1, 4))}
        a, b = step(schedule, p, 1, m, **cfg), step(schedule, p, 1, m, **cfg)
        for name in ("dur", "res", "kind", "micro", "chunk", "order_idx", "start", "end"):
            assert getattr(a, name).tolist() == getattr(b, name).tolist()


# --------------------------------------------------------------------------- the analytic closed forms


@pytest.fixture(scope="module")
def even_stages(make_device, toy_tiles, make_workload):
    """Near-equal stages (vocab 8: embedding and head negligible), communication free."""
    return _model(vocab=8.0), make_device(), _tiers((0.0, 1e30, 0.0)), toy_tiles, make_workload(global_batch=64.0)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_dualpipe_closed_form(even_stages, p, m):
    """bubble = (p/2 - 1)(F + 2B - 3W), B the full backward; W read off ZB-H1's
    (p - 1)(F + B - 2W) on the same stages (both closed forms in one kernel)."""
    dual = run(*even_stages, pp=p, n_micro=m, schedule=SCHEDULE_DUALPIPE)
    zb = run(*even_stages, pp=p, n_micro=m, schedule=SCHEDULE_ZB_H1)
    one = run(*even_stages, pp=p, n_micro=m, schedule=SCHEDULE_1F1B)
    f, b = dual["stage_fwd_s"], dual["stage_bwd_s"]
    w = (f + b - zb["bubble_s"] / (p - 1)) / 2
    assert dual["bubble_s"] == pytest.approx((p / 2 - 1) * (f + 2 * b - 3 * w), rel=2e-3)
    assert one["bubble_s"] == pytest.approx((p - 1) * (f + b), rel=2e-3)
    assert dual["bubble_s"] < one["bubble_s"]
    assert dual["step_time_analytic_s"] < one["step_time_analytic_s"]


@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 1), (4, 2), (4, 3), (8, 5)])
def test_zb_h1_few_micro_batches(even_stages, p, m):
    """Below m = p ZB-H1 has only m + p - 2 W passes to move into the fill and
    drain, not 2 (p - 1): compute + bubble = (m + p - 1)(F + B) - (m + p - 2) W,
    B the full backward (the event tier's closed form, tests/test_pipeline.py).
    W is read off the same stages at m = 2 p, where the bubble is (p - 1)(F + B - 2W).
    E.g. p = 2, m = 1: 2 (F + B) - 0 W = both stages' passes and the last W."""
    full = run(*even_stages, pp=p, n_micro=2 * p, schedule=SCHEDULE_ZB_H1)
    few = run(*even_stages, pp=p, n_micro=m, schedule=SCHEDULE_ZB_H1)
    one = run(*even_stages, pp=p, n_micro=m, schedule=SCHEDULE_1F1B)
    t = few["stage_fwd_s"] + few["stage_bwd_s"]
    w = (t - full["bubble_s"] / (p - 1)) / 2
    assert 0 < w < few["stage_bwd_s"]
    assert few["compute_s"] + few["bubble_s"] == pytest.approx((m + p - 1) * t - (m + p - 2) * w, rel=2e-3)
    assert few["step_time_analytic_s"] < one["step_time_analytic_s"]


def test_dualpipe_closed_form_few_micro_batches(even_stages):
    """Below m = 2 p the published bubble does not hold: a step is never shorter
    than one micro-batch's way through every stage and back (p (F + B))."""
    out = run(*even_stages, pp=8, n_micro=2, schedule=SCHEDULE_DUALPIPE)
    t = out["stage_fwd_s"] + out["stage_bwd_s"]
    assert out["compute_s"] + out["bubble_s"] == pytest.approx(8 * t, rel=2e-3)


@pytest.mark.parametrize("m", [1, 4, 16])
def test_pipedream_closed_form(even_stages, m):
    """No flush: step = m t_max + p2p + dp + optimizer, no bubble, whatever m."""
    out = run(*even_stages, pp=4, n_micro=m, schedule=SCHEDULE_PIPEDREAM)
    assert out["bubble_s"] == 0.0
    assert out["step_time_analytic_s"] == pytest.approx(
        out["compute_s"] + out["tp_comm_s"] + out["cp_comm_s"] + out["pp_comm_s"] + out["dp_comm_s"]
        + out["optimizer_s"], rel=1e-12)


def test_memory_branches(even_stages):
    """p = 4, m = 16, the first stage at the peak (vocab 8). PipeDream stashes
    p - stage weight versions (stage 0: p = 4 copies), keeps one gradient and one
    optimizer state and 1F1B's activations (p - stage). DualPipe holds two
    copies of weights, gradients and states (stages 0 and 3 on device 0) and
    p + 1 = 5 stages' activations where 1F1B holds 4."""
    one = run(*even_stages, pp=4, n_micro=16, schedule=SCHEDULE_1F1B)
    pd = run(*even_stages, pp=4, n_micro=16, schedule=SCHEDULE_PIPEDREAM)
    dual = run(*even_stages, pp=4, n_micro=16, schedule=SCHEDULE_DUALPIPE)
    assert one["mem_peak_stage"] == pd["mem_peak_stage"] == 0
    assert pd["mem_weights_bytes"] == pytest.approx(4 * one["mem_weights_bytes"], rel=1e-12)
    for key in ("mem_grads_bytes", "mem_optimizer_bytes", "mem_activations_bytes"):
        assert pd[key] == pytest.approx(one[key], rel=1e-12), key
    for key in ("mem_weights_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        assert dual[key] == pytest.approx(2 * one[key], rel=1e-3), key
    assert dual["mem_activations_bytes"] == pytest.approx(5 / 4 * one["mem_activations_bytes"], rel=1e-3)


def test_pipedream_weight_versions_by_stage(even_stages):
    """Stage s holds p - s versions: the peak weights fall from stage 0 down,
    and in-flight activations do not depend on m (no flush)."""
    few = run(*even_stages, pp=4, n_micro=1, schedule=SCHEDULE_PIPEDREAM)
    many = run(*even_stages, pp=4, n_micro=16, schedule=SCHEDULE_PIPEDREAM)
    assert few["mem_weights_bytes"] == many["mem_weights_bytes"]
    assert few["mem_activations_bytes"] == pytest.approx(many["mem_activations_bytes"], rel=1e-12)


# --------------------------------------------------------------------------- the event tier on encoded rows


def _row(tmp_path, schedule: str):
    raw = {"name": "t", "description": "t", "model": "llama3-8b", "hardware": "h100-sxm5-80gb", "devices": 64,
           "global_batch": 64, "seq_len": 4096, "dimensions": {"tp": [2], "pp": [4], "schedule": [schedule]}}
    space = space_from_raw(raw, "test", tmp_path)
    enc = Encoder(space).encode_all()
    assert enc.n_rows == 1
    return enc.columns, evaluate(pack(space), enc.columns)


def test_event_tier_dualpipe_and_pipedream(tmp_path):
    """Llama 3 8B, tp = 2, pp = 4, dp = 8, m = 8: both schedules simulate; DualPipe holds
    p + 1 chunks on stage 0 and beats 1F1B; PipeDream's simulated period stays
    within the exposed pipeline traffic of its closed form m t_max."""
    _, one = _row(tmp_path, "1f1b")
    cols, dual = _row(tmp_path, "dualpipe")
    _, pd = _row(tmp_path, "pipedream")
    assert cols["n_microbatches"][0] == 8
    for out in (dual, pd):
        assert out["simulated"][0] == 1.0
        assert 0.0 < out["step_time_s"][0] < np.inf
    assert dual["inflight_peak_stage0"][0] == 5
    assert pd["inflight_peak_stage0"][0] == 4
    assert dual["step_time_s"][0] < one["step_time_s"][0]
    assert pd["bubble_s"][0] == 0.0
    assert abs(pd["step_time_s"][0] - pd["step_time_analytic_s"][0]) <= 8 * 2 * pd["pp_comm_s"][0] + 1e-6


def test_dualpipe_analytic_pairs_the_stages_of_a_device(tmp_path):
    """Llama 3 8B, tp = 2, pp = 4, m = 8: the LM head (128,256 x 4096) makes stage 3
    the slowest (F + B = 65.9 ms). DualPipe's device 0 runs stages 0 and 3, each
    for half the micro-batches, so the analytic steady work is m (t_0 + t_3) / 2
    (59.3 ms per micro-batch), not m t_3: the analytic step, 0.594 s, is within 2%
    of the simulated 0.605 s. Charging m t_3 gave 0.647 s (+7%)."""
    _, dual = _row(tmp_path, "dualpipe")
    analytic, simulated = dual["step_time_analytic_s"][0], dual["step_time_s"][0]
    assert abs(analytic - simulated) <= 0.04 * simulated, (analytic, simulated)


def test_dualpipe_reduces_and_updates_both_stage_copies(make_device, toy_tiles, make_workload):
    """DualPipe's device d holds stages d and p - 1 - d, so its gradient
    reduction, parameter gather and optimizer step cover both (as its memory
    does). Toy model, 4 layers of L = 41,088 parameters (h 64, 4 heads of 16,
    GLU MLP 128: 64 (64 + 2 64) + 64^2 + 3 64 128 + 2 64), vocabulary 1000
    untied, p = 2, dp = 2, one tier of 100 GB/s with no latency, fp32
    gradients (4 B), bf16 weights (2 B):
      1F1B: the larger stage, 2 L + V h + h = 82,176 + 64,000 + 64 = 146,240;
      DualPipe: both stages = the whole model, 4 L + 2 V h + h = 292,416.
    ZeRO-0 all-reduce over 2 ranks, 2 (n - 1)/n S / bw = S / bw:
      1F1B 146,240 x 4 / 1e11 = 5.8496 us; DualPipe 292,416 x 4 / 1e11 = 11.69664 us.
    ZeRO-1 reduce-scatter (n - 1)/n S / bw: 5.84832 us, all-gather of the bf16
    weights 292,416 x 2 / 2 / 1e11 = 2.92416 us; the optimizer step (34 B per
    parameter of the shard, no launch cost on the toy device) 292,416 / 146,240
    times 1F1B's, halved by ZeRO-1's shard over dp = 2."""
    from paraspace.kernels.training import C_DP_GRAD, C_DP_PARAM, C_OPT, N_COST, layer_params, row_costs

    model = _model(layers=4.0, hidden=64.0, heads=4.0, kv_heads=4.0, head_dim=16.0, ffn=128.0, vocab=1000.0)
    assert layer_params(model[0], 1.0) == 41_088
    dev, tiers, work = make_device(), _tiers((8.0, 100e9, 0.0)), make_workload(global_batch=8.0)

    def costs(schedule, zero):
        c = np.empty(N_COST)
        row_costs(*cost_args(pp=2, dp=2, zero=zero, schedule=schedule), model[0], dev[0], tiers, toy_tiles, work[0], c)
        return c

    one, dual = costs(SCHEDULE_1F1B, 0), costs(SCHEDULE_DUALPIPE, 0)
    assert one[C_DP_GRAD] == pytest.approx(146_240 * 4 / 1e11, rel=1e-12)
    assert dual[C_DP_GRAD] == pytest.approx(292_416 * 4 / 1e11, rel=1e-12)
    assert dual[C_OPT] == pytest.approx(one[C_OPT] * 292_416 / 146_240, rel=1e-12)
    one1, dual1 = costs(SCHEDULE_1F1B, 1), costs(SCHEDULE_DUALPIPE, 1)
    assert dual1[C_DP_GRAD] == pytest.approx(5.84832e-6, rel=1e-12)
    assert dual1[C_DP_PARAM] == pytest.approx(2.92416e-6, rel=1e-12)
    assert dual1[C_OPT] == pytest.approx(dual[C_OPT] / 2, rel=1e-12)
    assert one1[C_OPT] == pytest.approx(one[C_OPT] / 2, rel=1e-12)
