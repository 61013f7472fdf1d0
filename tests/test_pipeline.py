"""Pipeline task graphs (``kernels.pipeline``) run through the event engine:
closed forms from modeling.md section 6 where they hold, hand-derived small
cases, schedule orders against ``naive_engine.compute_order``, the pipeline
dependencies in the simulated times, and the data-parallel / ZeRO tasks."""

from __future__ import annotations

from types import SimpleNamespace

import naive_engine
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.kernels import engine, pipeline
from paraspace.kernels.codes import SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_ZB_H1
from paraspace.kernels.engine import K_WEIGHT_GRAD, K_BACKWARD, K_DP, K_FORWARD, K_OPTIMIZER, K_PP, OK

PROPS = settings(max_examples=60, deadline=None)
SCHEDULES = (SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED)


# --------------------------------------------------------------------------- helpers


def step(schedule, p, v, m, fwd, bwd, *, wgrad=0, send_ns=0, pp_tier=0, dp_tier=1, n_tiers=2, zero=0, dp_grad_ns=0,
         dp_param_ns=0, n_buckets=1, z3_gather_ns=0, z3_scatter_ns=0, optimizer_ns=0, zero_comm=False, ep=0,
         ep_tier=0, tbo=0, ep_pairs=True):
    """Build one step with ``build_step`` and simulate it.

    fwd, bwd: one micro-batch of a device's chunk, a scalar for equal stages or
    an int64 [p, v] array; ep: ``build_step``'s ep_ns (expert compute forward,
    backward, dispatch, combine), a 4-sequence for every chunk or [p, v, 4]; ``ep_pairs``: DualPipe's
    F&B pairs overlap their EP traffic (``build_step``). ``zero_comm`` sets every communication task's
    duration to 0 after building (infinite bandwidth, same graph).
    """
    fwd_ns = np.broadcast_to(np.asarray(fwd, dtype=np.int64), (p, v)).copy()
    bwd_ns = np.broadcast_to(np.asarray(bwd, dtype=np.int64), (p, v)).copy()
    wgrad_ns = np.broadcast_to(np.asarray(wgrad, dtype=np.int64), (p, v)).copy()
    ep_ns = np.broadcast_to(np.asarray(ep, dtype=np.int64), (p, v, 4)).copy()
    (dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx,
     n_res) = pipeline.build_step(schedule, p, v, m, fwd_ns, bwd_ns, wgrad_ns, send_ns, pp_tier, dp_tier, n_tiers,
                                  zero,
                                  dp_grad_ns, dp_param_ns, n_buckets, z3_gather_ns, z3_scatter_ns, optimizer_ns,
                                  ep_ns, ep_tier, tbo, ep_pairs)
    if zero_comm:
        dur = np.where(kind >= engine.K_FIRST_COMM, 0, dur)
    start = np.empty(dur.shape[0], dtype=np.int64)
    end = np.empty(dur.shape[0], dtype=np.int64)
    status = engine.simulate(dur, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, start, end)
    return SimpleNamespace(status=int(status), makespan=int(end.max()) if end.size else 0, start=start, end=end,
                           dur=dur, res=res, kind=kind, stage=stage, micro=micro, chunk=chunk, order_ptr=order_ptr,
                           order_idx=order_idx, n_res=int(n_res), p=p, v=v, m=m, n_tiers=n_tiers, fwd_ns=fwd_ns,
                           bwd_ns=bwd_ns, send_ns=send_ns, schedule=schedule)


def order_on(s, r) -> list[int]:
    return s.order_idx[s.order_ptr[r]:s.order_ptr[r + 1]].tolist()


def compute_resource(s, d) -> int:
    return d * pipeline.streams_per_device(s.n_tiers)


def passes(s) -> dict[tuple[int, int, int], tuple[int, int, int]]:
    """(pass F=0/B=1, virtual stage, micro) -> (first start, last end, total duration) over its pieces."""
    out: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    for t in range(s.dur.shape[0]):
        if s.kind[t] not in (K_FORWARD, K_BACKWARD):
            continue
        key = (int(s.kind[t] == K_BACKWARD), int(s.chunk[t]) * s.p + int(s.stage[t]), int(s.micro[t]))
        a, b, total = out.get(key, (1 << 62, -1, 0))
        out[key] = (min(a, int(s.start[t])), max(b, int(s.end[t])), total + int(s.dur[t]))
    return out


def device_pass_order(s, d) -> list[tuple[int, int, int]]:
    """The device's compute-stream order as (pass, chunk, micro), pieces merged."""
    seen: list[tuple[int, int, int]] = []
    for t in order_on(s, compute_resource(s, d)):
        if s.kind[t] in (K_FORWARD, K_BACKWARD):
            key = (int(s.kind[t] == K_BACKWARD), int(s.chunk[t]), int(s.micro[t]))
            if not seen or seen[-1] != key:
                seen.append(key)
    return seen


def kernel_order(schedule, p, v, m, d) -> list[tuple[int, int, int]]:
    size = 3 * v * m + 8
    arrays = [np.full(size, -7, dtype=np.int32) for _ in range(3)]
    n = pipeline.compute_order(schedule, p, v, m, d, *arrays)
    return list(zip(*(a[:n].tolist() for a in arrays)))


def check_valid(s):
    """Everything a correct step graph must show in its simulated times."""
    assert s.status == OK
    assert (s.end >= 0).all()
    P = s.p * s.v
    got = passes(s)
    assert len(got) == 2 * P * s.m  # every (pass, virtual stage, micro) exactly once
    for (b, vs, i), (first, last, total) in got.items():
        d, c = vs % s.p, vs // s.p
        assert total == (s.bwd_ns if b else s.fwd_ns)[d, c]
        if not b and vs + 1 < P:  # F(vs+1, i) after F(vs, i) and its send
            assert got[(0, vs + 1, i)][0] >= last + s.send_ns
        if b and vs > 0:  # B(vs-1, i) after B(vs, i) and its send
            assert got[(1, vs - 1, i)][0] >= last + s.send_ns
        if b:  # B(vs, i) after F(vs, i)
            assert first >= got[(0, vs, i)][1]
    for d in range(s.p):
        assert device_pass_order(s, d) == kernel_order(s.schedule, s.p, s.v, s.m, d)
        mine = np.flatnonzero(s.stage == d)
        first_compute = min(t for t in mine if s.kind[t] in (K_FORWARD, K_BACKWARD))
        (opt,) = [t for t in mine if s.kind[t] == K_OPTIMIZER]
        assert order_on(s, compute_resource(s, d))[-1] == opt  # the optimizer closes the device's step
        for t in mine:  # after every reduction (any dp task but the ZeRO-1/2 gathers ahead of the step)
            if s.kind[t] == K_DP and t > first_compute:
                assert s.start[opt] >= s.end[t]
    for r in range(s.n_res):  # each stream: one task at a time, in its order; busy + idle == makespan
        tasks = order_on(s, r)
        starts = [int(s.start[t]) for t in tasks]
        assert starts == sorted(starts)
        assert all(s.start[b] >= s.end[a] for a, b in zip(tasks, tasks[1:]))
        idle = engine.uncovered_ns(np.array([0], dtype=np.int64), np.array([s.makespan], dtype=np.int64),
                                   s.start[tasks].astype(np.int64), s.end[tasks].astype(np.int64))
        assert int(s.dur[tasks].sum()) + idle == s.makespan


def reference_times(g) -> tuple:
    """The plain-Python reference engine (``naive_engine.simulate``) on a ``build_step``
    tuple: (status, starts, ends), as ``step`` reports them."""
    dur, res, kind, _, _, _, sync, succ_ptr, succ_idx, _, order_ptr, order_idx, n_res = g
    edges = [(a, int(succ_idx[e])) for a in range(dur.shape[0]) for e in range(succ_ptr[a], succ_ptr[a + 1])]
    orders = [order_idx[order_ptr[r]:order_ptr[r + 1]].tolist() for r in range(n_res)]
    return naive_engine.simulate(dur.tolist(), res.tolist(), kind.tolist(), sync.tolist(), edges, orders)


def random_config(rng: np.random.Generator) -> dict:
    """A valid random step: uneven stages, sends, tiers shared or not, any ZeRO stage,
    MoE traffic (expert compute forward / backward, dispatch, combine) on a tier
    of its own or shared, with or without two-batch overlap."""
    schedule = int(rng.choice(SCHEDULES))
    p = int(rng.integers(1, 5))
    v = int(rng.integers(1, 4)) if schedule == SCHEDULE_INTERLEAVED else 1
    m = int(rng.integers(1, 4)) * p if schedule == SCHEDULE_INTERLEAVED else int(rng.integers(1, 9))
    return dict(schedule=schedule, p=p, v=v, m=m, fwd=rng.integers(0, 60, size=(p, v)),
                bwd=rng.integers(0, 120, size=(p, v)), send_ns=int(rng.choice([0, rng.integers(1, 30)])),
                pp_tier=int(rng.integers(0, 2)), dp_tier=int(rng.integers(0, 2)), zero=int(rng.integers(0, 4)),
                dp_grad_ns=int(rng.choice([0, rng.integers(1, 400)])), dp_param_ns=int(rng.integers(0, 100)),
                n_buckets=int(rng.integers(1, 6)), z3_gather_ns=int(rng.integers(0, 20)),
                z3_scatter_ns=int(rng.integers(0, 20)), optimizer_ns=int(rng.integers(0, 50)),
                ep=[int(x) for x in rng.integers(0, [30, 60, 20, 20])] if rng.random() < 0.5 else 0,
                ep_tier=int(rng.integers(0, 2)), tbo=int(rng.integers(0, 2)))


# --------------------------------------------------------------------------- closed forms


def test_gpipe_and_1f1b_hand_example():
    """p = 4, m = 8, t_f = 10, t_b = 20, no communication:
    (m + p - 1)(t_f + t_b) = 11 * 30 = 330 for both; bubble 3/11 of it."""
    for schedule in (SCHEDULE_GPIPE, SCHEDULE_1F1B):
        assert step(schedule, 4, 1, 8, 10, 20).makespan == 330


def test_gpipe_and_1f1b_closed_form_sweep():
    """Equal stages, no comm, no DP: (m + p - 1)(t_f + t_b) for p <= 5, m <= 9
    (also m < p) and assorted t_f, t_b (including 0)."""
    for p in range(1, 6):
        for m in range(1, 10):
            for t_f, t_b in ((10, 20), (7, 7), (13, 5), (0, 9), (4, 0)):
                for schedule in (SCHEDULE_GPIPE, SCHEDULE_1F1B):
                    assert step(schedule, p, 1, m, t_f, t_b).makespan == (m + p - 1) * (t_f + t_b), (schedule, p, m)


def test_interleaved_hand_example():
    """p = 4, v = 2, m = 8; a device's whole stage is t_f = 10, t_b = 20, so a
    chunk takes 5 and 10. Narayanan et al. 2021 (sec. 2.2.2): bubble
    (p - 1)(t_f + t_b) / v = 3 * 30 / 2 = 45; step = m (t_f + t_b) + 45 = 285
    (1F1B on the same device: 330)."""
    assert step(SCHEDULE_INTERLEAVED, 4, 2, 8, 5, 10).makespan == 285


def test_interleaved_closed_form_sweep():
    """m (t_f + t_b) + (p - 1)(t_f + t_b) / v for p <= 4, v <= 4, m = p, 2p, 3p,
    chunk times t_f / v, t_b / v (t_f, t_b multiples of v)."""
    for p in range(1, 5):
        for v in range(1, 5):
            for m in (p, 2 * p, 3 * p):
                for t_f, t_b in ((12, 24), (12, 12), (36, 12)):
                    t_f, t_b = t_f * v, t_b * v
                    expected = m * (t_f + t_b) + (p - 1) * (t_f + t_b) // v
                    got = step(SCHEDULE_INTERLEAVED, p, v, m, t_f // v, t_b // v).makespan
                    assert got == expected, (p, v, m, t_f, t_b)


def test_one_stage_has_no_bubble():
    """p = 1: step = m (t_f + t_b) whatever the schedule (m = 5, 10 + 30 = 40
    -> 200; interleaved v = 2 with chunks of 5 and 15 gives the same)."""
    assert step(SCHEDULE_GPIPE, 1, 1, 5, 10, 30).makespan == 200
    assert step(SCHEDULE_1F1B, 1, 1, 5, 10, 30).makespan == 200
    assert step(SCHEDULE_INTERLEAVED, 1, 2, 5, 5, 15).makespan == 200


def test_one_microbatch_1f1b_equals_gpipe():
    """m = 1: both orders are F then B on every device, so the whole graph and
    every simulated time agree, also with uneven stages, sends and DP."""
    rng = np.random.default_rng(4)
    for _ in range(30):
        cfg = random_config(rng)
        cfg.update(v=1, m=1, fwd=cfg["fwd"][:, :1], bwd=cfg["bwd"][:, :1])
        a = step(**{**cfg, "schedule": SCHEDULE_GPIPE})
        b = step(**{**cfg, "schedule": SCHEDULE_1F1B})
        assert a.status == b.status == OK
        assert a.start.tolist() == b.start.tolist() and a.end.tolist() == b.end.tolist()


def test_1f1b_with_sends_hand_example():
    """1F1B, p = 2, m = 2, t_f = 10, t_b = 20, send s = 3 (own stream, sender side).
    Device 0 runs F0 F1 B0 B1 (one warm-up forward), device 1 F0 B0 F1 B1.
      d0: F0 [0, 10), send [10, 13); F1 [10, 20), send [20, 23)
      d1: F0 [13, 23), B0 [23, 43), send [43, 46); F1 (needs 23 and B0) [43, 53),
          B1 [53, 73), send [73, 76)
      d0: B0 (needs 46) [46, 66); B1 (needs 76) [76, 96).
    The critical path F0(d0) s F0(d1) B0(d1) F1(d1) B1(d1) s B1(d0) is
    3 t_f + 3 t_b + 2 s = 96 (without sends: 90)."""
    s = step(SCHEDULE_1F1B, 2, 1, 2, 10, 20, send_ns=3)
    got = passes(s)
    assert s.makespan == 96
    assert got[(0, 1, 1)][:2] == (43, 53) and got[(1, 1, 1)][:2] == (53, 73)
    assert got[(1, 0, 0)][:2] == (46, 66) and got[(1, 0, 1)][:2] == (76, 96)
    sends = sorted((int(s.start[t]), int(s.end[t])) for t in np.flatnonzero(s.kind == K_PP))
    assert sends == [(10, 13), (20, 23), (43, 46), (73, 76)]


# --------------------------------------------------------------------------- schedules


def test_compute_order_matches_reference():
    """Every device's order for p <= 6, m <= 12 (interleaved: v <= 4, m % p == 0)."""
    for schedule in SCHEDULES:
        for p in range(1, 7):
            for v in (range(1, 5) if schedule == SCHEDULE_INTERLEAVED else (1,)):
                for m in range(1, 13):
                    if schedule == SCHEDULE_INTERLEAVED and m % p:
                        continue
                    for d in range(p):
                        assert kernel_order(schedule, p, v, m, d) == naive_engine.compute_order(schedule, p, v, m, d)


def test_interleaved_order_hand_example():
    """p = 2, v = 2, m = 2, device 1: warm-up 2 (2 - 1 - 1) + (2 - 1) 2 = 2.
    Virtual micro-batches k = 0..3 run (chunk, micro) (0,0) (0,1) (1,0) (1,1)
    forward; backward the chunks reversed: (1,0) (1,1) (0,0) (0,1).
    Order: F(0,0) F(0,1) | F(1,0) B(1,0) F(1,1) B(1,1) | B(0,0) B(0,1)."""
    F, B = pipeline.F_PASS, pipeline.B_PASS
    assert kernel_order(SCHEDULE_INTERLEAVED, 2, 2, 2, 1) == [
        (F, 0, 0), (F, 0, 1), (F, 1, 0), (B, 1, 0), (F, 1, 1), (B, 1, 1), (B, 0, 0), (B, 0, 1)]


def test_gpipe_with_chunks_covers_every_chunk():
    """compute_order's docstring: it returns 2 v m. GPipe, p = 2, v = 2, m = 2
    should order 8 passes (every chunk of every micro-batch) and the step run."""
    assert len(kernel_order(SCHEDULE_GPIPE, 2, 2, 2, 0)) == 8
    assert step(SCHEDULE_GPIPE, 2, 2, 2, 5, 10).status == OK


def test_in_flight_peak():
    """Most forwards whose backward has not run, along each device's compute
    stream: 1F1B holds min(p - d, m) (modeling.md sec. 6), GPipe m, interleaved
    (in chunk passes) Megatron's warm-up + 1 = 2 (p - d - 1) + (v - 1) p + 1,
    at most all m v. E.g. p = 4, m = 8, 1F1B: 4, 3, 2, 1; GPipe: 8 everywhere;
    interleaved v = 2: device 0 holds 2*3 + 4 + 1 = 11 of 16."""
    for p in range(1, 6):
        for m in (1, 2, 3, 4, 8):
            for d in range(p):
                assert naive_engine.in_flight_peak(device_pass_order(step(SCHEDULE_1F1B, p, 1, m, 1, 1), d)) \
                    == min(p - d, m)
                assert naive_engine.in_flight_peak(device_pass_order(step(SCHEDULE_GPIPE, p, 1, m, 1, 1), d)) == m
            for v in (2, 3):
                mi = m * p
                s = step(SCHEDULE_INTERLEAVED, p, v, mi, 1, 1)
                for d in range(p):
                    expected = min(2 * (p - d - 1) + (v - 1) * p + 1, mi * v)
                    assert naive_engine.in_flight_peak(device_pass_order(s, d)) == expected
    s = step(SCHEDULE_INTERLEAVED, 4, 2, 8, 1, 1)
    assert naive_engine.in_flight_peak(device_pass_order(s, 0)) == 11


# --------------------------------------------------------------------------- every graph is valid


def test_random_steps_are_valid():
    """300 random steps (all schedules, uneven stages, sends, shared or separate
    tiers, ZeRO 0-3, buckets, optimizer): no deadlock, every pass once with its
    full duration, F(vs+1, i) >= F(vs, i) + send, B(vs-1, i) >= B(vs, i) + send,
    B after F, the compute stream follows compute_order, the optimizer last and
    after every reduction, and busy + idle == makespan on every stream."""
    rng = np.random.default_rng(2024)
    for _ in range(300):
        cfg = random_config(rng)
        check_valid(step(**cfg))


def test_many_buckets_fit():
    """Bucketing splits the first forward and the last backward into n pieces
    each and adds n gathers and n reductions: per device 2 v m + 4 n - 1 tasks
    before sends. ZeRO-1/2 with up to 8 buckets and one micro-batch (the fewest
    passes to absorb them) still builds a valid step."""
    for zero in (1, 2):
        for n_buckets in range(1, 9):
            for p in (1, 2, 3):
                for schedule in (SCHEDULE_GPIPE, SCHEDULE_1F1B):
                    check_valid(step(schedule, p, 1, 1, 40, 80, zero=zero, dp_grad_ns=80, dp_param_ns=16,
                                     n_buckets=n_buckets, optimizer_ns=7))


def test_deterministic():
    """The same arguments twice give bit-identical graphs and times."""
    rng = np.random.default_rng(8)
    for _ in range(20):
        cfg = random_config(rng)
        a, b = step(**cfg), step(**cfg)
        for name in ("dur", "res", "kind", "order_idx", "start", "end"):
            assert getattr(a, name).tolist() == getattr(b, name).tolist()


@PROPS
@given(seed=st.integers(0, 2**32 - 1), factor=st.integers(2, 10))
def test_more_bandwidth_never_slows(seed, factor):
    """Dividing every communication time by ``factor`` (faster links, at least
    1 ns so that no task disappears) never lengthens the step."""
    cfg = random_config(np.random.default_rng(seed))
    fast = dict(cfg)
    for key in ("send_ns", "dp_grad_ns", "dp_param_ns", "z3_gather_ns", "z3_scatter_ns"):
        if cfg[key] > 0:
            fast[key] = max(cfg[key] // factor, 1)
    assert step(**fast).makespan <= step(**cfg).makespan


def test_a_split_is_even_and_no_part_grows_when_the_total_shrinks():
    """``pipeline._share`` (compute pieces, gradient and parameter buckets, TBO halves):
    the parts of every total up to 60 in 1..6 parts add up to it, differ by at most
    1, and each part is non-decreasing in the total. With the remainder on the last
    part, 4 in 4 was 1, 1, 1, 1 but 2 in 4 was 0, 0, 0, 2: a halved reduction got a
    longer last bucket."""
    for parts in range(1, 7):
        previous = [0] * parts
        for total in range(61):
            split = [pipeline._share(total, parts, k) for k in range(parts)]
            assert sum(split) == total and max(split) - min(split) <= 1
            assert all(a >= b for a, b in zip(split, previous)), (total, parts, split, previous)
            previous = split
    assert [pipeline._share(2, 4, k) for k in range(4)] == [1, 1, 0, 0]


def test_a_faster_gradient_reduction_never_lengthens_the_last_bucket():
    """p = 1, GPipe, m = 1, t_f = 10, t_b = 40, 4 gradient buckets: the backward runs
    in pieces [10, 20) [20, 30) [30, 40) [40, 50), bucket k after piece k, the last
    one exposed after the backward. A 4 ns reduction: buckets of 1, the last [50, 51),
    makespan 51. At 2 ns (twice the bandwidth): 1, 1, 0, 0, makespan 50 (the remainder
    on the last bucket made it 0, 0, 0, 2 and 52: found by
    ``test_more_bandwidth_never_slows``, seed 8706954, factor 2)."""
    assert step(SCHEDULE_GPIPE, 1, 1, 1, 10, 40, dp_grad_ns=4, n_buckets=4).makespan == 51
    assert step(SCHEDULE_GPIPE, 1, 1, 1, 10, 40, dp_grad_ns=2, n_buckets=4).makespan == 50
    cfg = random_config(np.random.default_rng(8706954))
    fast = {**cfg, **{k: max(cfg[k] // 2, 1) for k in ("dp_grad_ns", "dp_param_ns", "z3_gather_ns", "z3_scatter_ns")
                      if cfg[k] > 0}}
    assert step(**fast).makespan <= step(**cfg).makespan


# --------------------------------------------------------------------------- communication and data parallelism


def test_infinite_bandwidth_removes_comm():
    """All communication durations 0 (same graph, same streams): the makespan
    equals that of the step built without any communication."""
    rng = np.random.default_rng(5)
    for _ in range(100):
        cfg = random_config(rng)
        bare = {**cfg, "send_ns": 0, "zero": 0, "dp_grad_ns": 0, "dp_param_ns": 0, "ep": 0}
        assert step(**cfg, zero_comm=True).makespan == step(**bare).makespan


def test_gradient_buckets_hand_example():
    """p = 1, GPipe, m = 2, t_f = 10, t_b = 40: F0 [0, 10) F1 [10, 20) B0 [20, 60)
    B1 [60, 100). Reduction G = 100 in 4 buckets of 25 after B1's 10 ns pieces
    (ending 70, 80, 90, 100): buckets back to back [70, 95) ... [145, 170), step
    170 = 100 + (G - 3 * 10). With G = 20 (buckets of 5): each bucket ends
    before the next piece does, only the last is exposed: 100 + 5 = 105."""
    assert step(SCHEDULE_GPIPE, 1, 1, 2, 10, 40).makespan == 100
    s = step(SCHEDULE_GPIPE, 1, 1, 2, 10, 40, dp_grad_ns=100, n_buckets=4)
    assert s.makespan == 170
    assert sorted((int(s.start[t]), int(s.end[t])) for t in np.flatnonzero(s.kind == K_DP)) == [
        (70, 95), (95, 120), (120, 145), (145, 170)]
    assert step(SCHEDULE_GPIPE, 1, 1, 2, 10, 40, dp_grad_ns=20, n_buckets=4).makespan == 105


def test_gradient_buckets_closed_form_one_stage():
    """p = 1: the last backward (t_b) is cut into n pieces, bucket k (G / n)
    follows piece k on its own stream; the reduction chain ends at
    max(T + G / n, T - t_b + t_b / n + G), T the compute end. So the step grows
    by max(G / n, G - (n - 1) t_b / n), which never increases with n."""
    for schedule in (SCHEDULE_GPIPE, SCHEDULE_1F1B):
        for m in (1, 3):
            for grad in (60, 600, 6000):
                base = step(schedule, 1, 1, m, 24, 120).makespan
                growth = [step(schedule, 1, 1, m, 24, 120, dp_grad_ns=grad, n_buckets=n).makespan - base
                          for n in (1, 2, 3, 4, 6, 12)]
                assert growth == [max(grad // n, grad - (n - 1) * 120 // n) for n in (1, 2, 3, 4, 6, 12)]
                assert growth == sorted(growth, reverse=True)


def test_more_buckets_never_longer():
    """200 random pipelines with sends and a reduction on the same or on a
    separate tier (divisible sizes): n = 1, 2, 3, 4, 6, 12 buckets give
    non-increasing makespans (a send never queues behind a bucket; on a shared
    tier the send's time lengthens the open bucket, and a bucket of 1/n of the
    reduction is no longer on the path of the device's last transfer than a
    bigger one would be)."""
    rng = np.random.default_rng(6)
    for _ in range(200):
        cfg = random_config(rng)
        cfg.update(zero=0, fwd=cfg["fwd"] * 12, bwd=cfg["bwd"] * 12, dp_grad_ns=int(rng.integers(1, 300)) * 12,
                   ep=0)
        spans = [step(**{**cfg, "n_buckets": n}).makespan for n in (1, 2, 3, 4, 6, 12)]
        assert spans == sorted(spans, reverse=True), (cfg, spans)


def test_shared_tier_send_is_not_queued_behind_a_bucket():
    """Pipeline sends and gradient buckets on one tier share the device's NIC:
    the send runs on the critical stream at once, and its time is added to the
    bucket open beside it. p = 2, 1F1B, m = 1, t_f = 10, t_b = 20, s = 2,
    G = 100 in two buckets of 50. d0 F [0, 10), send [10, 12); d1 F [12, 22),
    B pieces [22, 32) [32, 42). d1: bucket 0 [32, 84) = 50 + the send's 2 (it is
    open when the send [42, 44) is issued), bucket 1 [84, 134). d0 B pieces
    [44, 54) [54, 64), buckets [54, 104) [104, 154): 154, as on separate tiers
    (there d1's buckets are [32, 82) [82, 132)). A first-in-first-out NIC would
    hold the send behind bucket 0 until 82 and end the step at 194."""
    shared = dict(pp_tier=0, dp_tier=0)
    separate = dict(pp_tier=0, dp_tier=1)
    for tiers in (shared, separate):
        assert step(SCHEDULE_1F1B, 2, 1, 1, 10, 20, send_ns=2, dp_grad_ns=100, **tiers).makespan == 164
    s = step(SCHEDULE_1F1B, 2, 1, 1, 10, 20, send_ns=2, dp_grad_ns=100, n_buckets=2, **shared)
    check_valid(s)
    assert s.makespan == 154
    d1 = sorted((int(s.start[t]), int(s.end[t]), int(s.kind[t])) for t in range(len(s.res))
                if s.stage[t] == 1 and s.kind[t] in (K_DP, K_PP))
    assert d1 == [(32, 84, K_DP), (42, 44, K_PP), (84, 134, K_DP)]
    s = step(SCHEDULE_1F1B, 2, 1, 1, 10, 20, send_ns=2, dp_grad_ns=100, n_buckets=2, **separate)
    assert s.makespan == 154
    d1 = sorted((int(s.start[t]), int(s.end[t]), int(s.kind[t])) for t in range(len(s.res))
                if s.stage[t] == 1 and s.kind[t] in (K_DP, K_PP))
    assert d1 == [(32, 82, K_DP), (42, 44, K_PP), (82, 132, K_DP)]


def test_shared_tier_never_faster_than_separate():
    """Putting PP (and EP) traffic on the DP tier only lengthens data-parallel
    transfers (the same tasks and streams otherwise), so over 150 random steps
    the shared layout is never faster, at least once slower, and with infinite
    bandwidth (every transfer 0 ns) the two agree."""
    rng = np.random.default_rng(12)
    slower = 0
    for _ in range(150):
        cfg = random_config(rng)
        cfg.update(send_ns=int(rng.integers(1, 30)), pp_tier=0, ep_tier=0)
        a = step(**{**cfg, "dp_tier": 0})
        b = step(**{**cfg, "dp_tier": 1})
        check_valid(a)
        assert a.makespan >= b.makespan, cfg
        slower += a.makespan > b.makespan
        assert step(**{**cfg, "dp_tier": 0}, zero_comm=True).makespan == step(**{**cfg, "dp_tier": 1},
                                                                                 zero_comm=True).makespan
    assert slower > 0


def test_shared_tier_matches_reference_engine():
    """Random steps with PP and DP on one tier, simulated by the plain-Python
    reference engine (``naive_engine.simulate``) from the same arrays: the same
    status, starts and ends."""
    rng = np.random.default_rng(13)
    for _ in range(60):
        cfg = random_config(rng)
        cfg.update(send_ns=int(rng.integers(1, 30)), pp_tier=0, dp_tier=0)
        fwd_ns = np.broadcast_to(np.asarray(cfg["fwd"], dtype=np.int64), (cfg["p"], cfg["v"])).copy()
        bwd_ns = np.broadcast_to(np.asarray(cfg["bwd"], dtype=np.int64), (cfg["p"], cfg["v"])).copy()
        g = pipeline.build_step(cfg["schedule"], cfg["p"], cfg["v"], cfg["m"], fwd_ns, bwd_ns, np.zeros_like(fwd_ns),
                                cfg["send_ns"], 0, 0, 2, cfg["zero"], cfg["dp_grad_ns"], cfg["dp_param_ns"],
                                cfg["n_buckets"], cfg["z3_gather_ns"], cfg["z3_scatter_ns"], cfg["optimizer_ns"],
                                np.broadcast_to(np.asarray(cfg.get("ep", 0), dtype=np.int64), (cfg["p"], cfg["v"], 4)).copy(),
                                cfg.get("ep_tier", 0), cfg.get("tbo", 0), True)
        expected = reference_times(g)
        s = step(**cfg)
        assert (s.status, s.start.tolist(), s.end.tolist()) == expected


def _growth_cases(shared: bool):
    rng = np.random.default_rng(10 + shared)
    for _ in range(150):
        cfg = random_config(rng)
        cfg.update(zero=0, send_ns=int(rng.integers(1, 30)), pp_tier=0, dp_tier=0 if shared else 1,
                   fwd=cfg["fwd"] * 12, bwd=cfg["bwd"] * 12, dp_grad_ns=int(rng.integers(1, 300)) * 12)
        yield cfg


@pytest.mark.parametrize("shared", [
    False,
    True,
])
def test_reduction_delays_step_by_at_most_itself(shared):
    """Nothing but the optimizer waits on the gradient reduction, so adding it
    (G in n buckets) grows the step by at least one bucket (the last, after
    the last piece of the last backward to end). On its own tier it grows the
    step by at most G (the reductions only delay each other and the
    optimizer); on the pipeline's tier the open bucket also carries the sends
    issued beside it (never delaying them), so at most G plus those sends.
    Hand case, p = 2, m = 1, t_f = 10, t_b = 20, s = 2, G = 100 in one bucket:
    64 without the reduction, 164 with it on either layout (the send is issued
    before the bucket its pass releases, so no bucket is open beside it;
    ``test_shared_tier_send_is_not_queued_behind_a_bucket``)."""
    tiers = dict(pp_tier=0, dp_tier=0 if shared else 1)
    assert step(SCHEDULE_1F1B, 2, 1, 1, 10, 20, send_ns=2, **tiers).makespan == 64
    assert step(SCHEDULE_1F1B, 2, 1, 1, 10, 20, send_ns=2, dp_grad_ns=100, **tiers).makespan == 164
    for cfg in _growth_cases(shared):
        base = step(**{**cfg, "dp_grad_ns": 0}).makespan
        growth = step(**cfg).makespan - base
        # on the pipeline's tier the reduction also carries the sends issued while a
        # bucket is open (at most each device's 2 v m sends after its last backward's first piece)
        bound = cfg["dp_grad_ns"] + (2 * cfg["v"] * cfg["m"] * cfg["send_ns"] if shared else 0)
        assert cfg["dp_grad_ns"] // cfg["n_buckets"] <= growth <= bound, cfg


def test_zero12_gathers_bucketed_into_first_forward():
    """p = 1, 1F1B, m = 2, t_f = 10, t_b = 20, ZeRO-1, parameter all-gather 8 ns
    in 2 buckets [0, 4) [4, 8), reduce-scatter 40 in 2 of 20. F0's first piece
    needs only bucket 0: [4, 9); its second [9, 14) (bucket 1 ended at 8); B0
    [14, 34), F1 [34, 44), B1 pieces [44, 54) [54, 64); reductions [54, 74)
    [74, 94); optimizer (0 ns) at 94."""
    s = step(SCHEDULE_1F1B, 1, 1, 2, 10, 20, zero=1, dp_grad_ns=40, dp_param_ns=8, n_buckets=2)
    assert s.makespan == 94
    dp = sorted((int(s.start[t]), int(s.end[t])) for t in np.flatnonzero(s.kind == K_DP))
    assert dp == [(0, 4), (4, 8), (54, 74), (74, 94)]
    assert passes(s)[(0, 0, 0)][:2] == (4, 14)
    (opt,) = np.flatnonzero(s.kind == K_OPTIMIZER)
    assert s.start[opt] == 94


@pytest.mark.xfail(strict=True, reason="the event tier gathers and scatters ZeRO-3 per pass, so the step's first "
                   "forward waits for its whole gather and its last backward's whole scatter is exposed; FSDP "
                   "works unit by unit. Bucketing both ends like ZeRO-1/2 gives this makespan, but makes the "
                   "published FSDP rows of KempnerForge, torchtitan and Narayanan too fast (LOSO 11.53 -> 11.67%): "
                   "the exposure stands in for a cost the model lacks (issue 14, stop 25)")
def test_zero3_first_gather_and_last_scatter_exposed_one_bucket_only():
    """p = 1, 1F1B, m = 1, t_f = 40, t_b = 80, ZeRO-3 gather 40 and scatter 40 per
    pass, 4 buckets. FSDP gathers unit by unit, so only the first bucket waits in
    front of the forward: gathers [0, 10) [10, 20) [20, 30) [30, 40), the
    backward's gather [40, 80); F pieces [10, 20) ... [40, 50); B, after its
    gather, in pieces [80, 100) ... [140, 160), each followed by its scatter
    bucket: the last [160, 170); makespan 170. Per pass, as built now: G [0, 40),
    F [40, 80), B [80, 160), S [160, 200): 200."""
    s = step(SCHEDULE_1F1B, 1, 1, 1, 40, 80, n_buckets=4, zero=3, z3_gather_ns=40, z3_scatter_ns=40)
    assert s.makespan == 170


def test_buckets_conserve_traffic():
    """G = 10 in 3 buckets must still move 10 ns of traffic (3 + 3 + 4), not 9;
    the same for a 10 ns ZeRO-1 parameter gather."""
    s = step(SCHEDULE_1F1B, 1, 1, 2, 10, 20, zero=1, dp_grad_ns=10, dp_param_ns=10, n_buckets=3)
    assert int(s.dur[s.kind == K_DP].sum()) == 20


def test_zero3_hand_example():
    """p = 1, GPipe, m = 4, t_f = 100, t_b = 200, ZeRO-3 gather 5 and scatter 5
    per pass; gathers and scatters on their own streams, the gather of pass k
    after pass k - 2 ends. G(F0) [0, 5), F0 [5, 105); G(F1) [5, 10) hidden;
    G(F2) after F0 [105, 110), ... every later gather hidden behind the pass
    before; F 4 * 100 from 5 to 405, B0 [405, 605), B1 [605, 805), B2 [805,
    1005), B3 [1005, 1205), each scatter hidden but the last [1205, 1210):
    makespan = 5 + 400 + 800 + 5 = 1210."""
    s = step(SCHEDULE_GPIPE, 1, 1, 4, 100, 200, zero=3, z3_gather_ns=5, z3_scatter_ns=5)
    check_valid(s)
    assert s.makespan == 1210
    got = passes(s)
    assert [got[(1, 0, i)][:2] for i in range(4)] == [(405, 605), (605, 805), (805, 1005), (1005, 1205)]


def test_zero3_prefetch_is_one_pass_ahead():
    """The module docstring: ZeRO-3 gathers each pass's parameters "prefetched
    one task ahead", so pass o's gather cannot start before pass o - 1 starts.
    In the hand case above the gathers of F2, F3 and B0 all run before F1 starts."""
    s = step(SCHEDULE_GPIPE, 1, 1, 4, 100, 200, zero=3, z3_gather_ns=5, z3_scatter_ns=5)
    order = [t for t in order_on(s, compute_resource(s, 0)) if s.kind[t] in (K_FORWARD, K_BACKWARD)]
    gathers = [t - 1 for t in order]  # a pass's gather is the task created just before it
    assert len(order) == 8 and all(s.kind[g] == K_DP for g in gathers)
    for o in range(1, len(order)):
        assert s.start[gathers[o]] >= s.start[order[o - 1]]


def test_zero3_short_transfers_are_hidden():
    """Prefetched one pass ahead, with gather + scatter (10) shorter than any
    pass (100), only the first gather and the last scatter are exposed:
    5 + 4 * (100 + 200) + 5 = 1210 (the builder gives 1240, see the hand example)."""
    assert step(SCHEDULE_GPIPE, 1, 1, 4, 100, 200, zero=3, z3_gather_ns=5, z3_scatter_ns=5).makespan == 1210


# --------------------------------------------------------------------------- expert-parallel traffic


def test_ep_tasks_hand_example():
    """p = 1, m = 1, a MoE chunk: forward 10 (experts 4 of it), backward 20
    (experts 8), dispatch 4, combine 2 on the EP tier. Without overlap the step
    is the sum of the parts: F 6 + 4 + 4 + 2 = 16, B 2 + 8 + 4 + 12 = 26, 42 =
    10 + 20 + 2 (4 + 2). Two-batch overlap (halves d = 2, c = 1, x = 2 forward,
    c = 1, x = 4, d = 2 backward): F: A [0, 6), D1 [6, 8), D2 [8, 10), E1 [8, 10),
    E2 [10, 12), C1 [10, 11), C2 [12, 13) = 6 + d + max(d, x) + max(x, c) + c = 13;
    B: C1 [13, 14), C2 [14, 15), E1 [14, 18), D1 [18, 20), E2 [18, 22), D2
    [22, 24), the rest [24, 36): 36."""
    s = step(SCHEDULE_1F1B, 1, 1, 1, 10, 20, ep=[4, 8, 4, 2])
    check_valid(s)
    assert s.makespan == 42
    assert int(s.dur[s.kind == engine.K_EP].sum()) == 12
    t = step(SCHEDULE_1F1B, 1, 1, 1, 10, 20, ep=[4, 8, 4, 2], tbo=1)
    check_valid(t)
    assert t.makespan == 36
    ep = sorted((int(t.start[k]), int(t.end[k])) for k in np.flatnonzero(t.kind == engine.K_EP))
    assert ep == [(6, 8), (8, 10), (10, 11), (12, 13), (13, 14), (14, 15), (18, 20), (22, 24)]


def test_ep_traffic_shares_the_pipeline_tier():
    """p = 2, 1F1B, m = 1, t_f = 10 (experts 4), t_b = 20 (experts 8), send 3,
    dispatch 4, combine 2. EP on its own tier: d0 F [0, 16) with its combine
    ending at 16, send [16, 19); d1 F [19, 35), B [35, 61) (its first
    transfer at 35, the experts [37, 45), the rest [49, 61)), send [61, 64);
    d0 B [64, 90): 90. On the pipeline's tier the sends queue behind the EP
    traffic created before them, which here has always ended (the send follows
    its own pass's last transfer), so the step is 90 too; with ZeRO-0
    reduction G = 30 on that tier as well, d1's bucket (released with the
    pass, queued behind the send) and then d0's: 90 + 30 = 120 both ways."""
    for tier in (0, 1):
        s = step(SCHEDULE_1F1B, 2, 1, 1, 10, 20, send_ns=3, ep=[4, 8, 4, 2], ep_tier=tier)
        check_valid(s)
        assert s.makespan == 90
        g = step(SCHEDULE_1F1B, 2, 1, 1, 10, 20, send_ns=3, ep=[4, 8, 4, 2], ep_tier=tier, dp_grad_ns=30,
                 dp_tier=0)
        assert g.makespan == 120
    # interleaving makes EP traffic of one chunk queue ahead of another chunk's send
    a = step(SCHEDULE_INTERLEAVED, 2, 2, 4, 10, 20, send_ns=3, ep=[4, 8, 30, 30], ep_tier=0, tbo=1)
    b = step(SCHEDULE_INTERLEAVED, 2, 2, 4, 10, 20, send_ns=3, ep=[4, 8, 30, 30], ep_tier=1, tbo=1)
    check_valid(a)
    check_valid(b)
    assert a.makespan > b.makespan


# --------------------------------------------------------------------------- zero bubble (ZB-H1)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (4, 3), (4, 4), (4, 8), (4, 16),
                                    (8, 3), (8, 7), (8, 8), (8, 32)])
@pytest.mark.parametrize(("t_f", "t_b", "t_w"), [(100, 100, 100), (100, 120, 80), (100, 150, 50), (90, 100, 0)])
def test_zb_h1_closed_form(p, m, t_f, t_b, t_w):
    """Qi et al. 2023: splitting the backward into B and W and filling the
    cool-down with W passes shrinks the bubble from (p - 1)(t_F + t_B + t_W) to
    (p - 1)(t_F + t_B - t_W) for m >= p, equal stages and no communication. E.g.
    p = 4, m = 8, all 100: 8 * 300 + 3 * 100 = 2700 (1F1B: 11 * 300 = 3300).
    In all, (m + p - 1)(t_F + t_B) + (m - p + 1) t_W; below m = p there are
    fewer W passes to move, and the first stage's last W still ends the step:
    (m + p - 1)(t_F + t_B) + t_W. E.g. p = 4, m = 2, all 100:
    F0 F1 F2 F3 | F3' B3 | B3' B2 B2' ... the first stage's B ends at 5 * 200 = 1000
    and its last W at 1100 (the published form would give 2 * 300 + 3 * 100 = 900)."""
    zb = step(SCHEDULE_ZB_H1, p, 1, m, t_f, t_b + t_w, wgrad=t_w)
    one = step(SCHEDULE_1F1B, p, 1, m, t_f, t_b + t_w, wgrad=t_w)
    assert zb.status == OK and (zb.end >= 0).all()
    kinds = zb.kind[zb.kind <= K_WEIGHT_GRAD]  # forward, backward, weight-gradient passes, m of each per stage
    assert [int((kinds == k).sum()) for k in (K_FORWARD, K_BACKWARD, K_WEIGHT_GRAD)] == [p * m] * 3
    assert zb.makespan == (m + p - 1) * (t_f + t_b) + max(1, m - p + 1) * t_w
    if m >= p:
        assert zb.makespan == m * (t_f + t_b + t_w) + (p - 1) * (t_f + t_b - t_w)
    assert one.makespan == (m + p - 1) * (t_f + t_b + t_w)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (6, 12), (3, 3)])
def test_zb_h1_order_and_memory(p, m):
    """Every stage runs each F, B and W once, W after its B, and holds at most p
    micro-batches between F and W (1F1B's peak, now on every stage)."""
    for d in range(p):
        order = kernel_order(SCHEDULE_ZB_H1, p, 1, m, d)
        assert sorted(order) == sorted((ps, 0, i) for ps in (0, 1, 2) for i in range(m))
        for i in range(m):
            assert order.index((1, 0, i)) < order.index((2, 0, i)) and order.index((0, 0, i)) < order.index((1, 0, i))
        held = peak = 0
        for ps, _, _ in order:
            held += ps == 0
            held -= ps == 2
            peak = max(peak, held)
        assert peak == min(p, m)


@pytest.mark.parametrize("schedule", [SCHEDULE_ZB_H1, 4])  # 4: DualPipe (kernels.codes.SCHEDULE_DUALPIPE)
def test_zero3_edges_stay_on_their_device(schedule):
    """A ZeRO-3 gather feeds only its own device's passes: every dependency between two
    devices is a pipeline send to the next stage's pass. (A W pass, which gathers nothing,
    used to wait for an earlier device's gather of the same pass index: 21 such edges
    at p = 4, m = 8 with ZB-H1, 9 with DualPipe.)"""
    p, m = 4, 8
    fwd = np.full((p, 1), 100, dtype=np.int64)
    bwd = np.full((p, 1), 200, dtype=np.int64)
    wgrad = np.full((p, 1), 80, dtype=np.int64)
    ep_ns = np.zeros((p, 1, 4), dtype=np.int64)
    (dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx,
     n_res) = pipeline.build_step(schedule, p, 1, m, fwd, bwd, wgrad, 7, 0, 1, 2, 3, 0, 0, 1, 5, 5, 0, ep_ns, 0, 0, True)
    crossing = [(int(a), int(succ_idx[e])) for a in range(dur.shape[0]) for e in range(succ_ptr[a], succ_ptr[a + 1])
                if stage[a] != stage[succ_idx[e]]]
    assert crossing  # the pipeline's sends do cross devices
    assert all(kind[a] == K_PP for a, _ in crossing)
    assert not any(kind[a] == K_DP for a, _ in crossing)
