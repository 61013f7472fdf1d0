"""The iteration-level simulation of disaggregated deployments (issue 15):
prefill replicas and decode engines as two stages joined by the KV transfer
(``kernels.serving_sim.simulate_disagg_one``), against closed forms derived by
hand, Little's law, the decode engines' KV capacity, determinism, and the
serve pipeline simulating disaggregated candidates.

The toy of ``test_serving`` on its 1 TB/s device (``test_prefill_and_decode_step_by_hand``):
  prefill of one 512-token prompt = 2.24006193741824e-4 s
  its 15 decode iterations        = 1.91614464e-3 s (reads 512 + j cached tokens, j = 1 .. 15)
  KV bytes a token = 2 layers x 2 (K, V) x 2 KV heads x 128 x 2 bytes = 2048
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from paraspace.explorer.serve import evaluate_space
from paraspace.kernels import serving_sim as ss
from paraspace.kernels.codes import SEND_RECV
from paraspace.spaces import serving as sp
from test_serving import GRID, space, tables, toy_srv  # noqa: F401 - fast is a fixture
from test_serving import fast  # noqa: F401

REL = 1e-12
#: test_serving's one-user prefill: rows_s(512) + head(1) + 8192e-18 x 512 x (256 + 225)
PREFILL_512 = 2.24007137460224e-4
DECODE_512_16 = 1.91614464e-3


def run_disagg(env, in_len, out_len, gaps=None, *, clients=0, rate=0.0, n_prefill=1, n_decode=1, max_batch=256,
               max_tokens=8192.0, host=0.0, hit=0.0, d_cap=None, p_cap=None, xfer=None, tiers=None, devices=2.0,
               draft=0, acceptance=0.0, seed=0, log_rows=0):
    """One disaggregated deployment of toy replicas (one device each, prefill and decode
    alike) simulated; returns (outputs, log, the transfer seconds of each request)."""
    srv = toy_srv(draft_tokens=float(draft))
    g, h, dp, ds, kv_coef, pair_coef, cap = tables(env, srv)
    in_len = np.asarray(in_len, float)
    out_len = np.asarray(out_len, float)
    if xfer is None:
        xfer = ss.transfer_times(env["model"], env["tiers"] if tiers is None else tiers, srv, in_len, devices)[0]
    gaps = np.ones(in_len.size) if gaps is None else gaps
    res = np.empty(ss.N_SIM)
    log = np.zeros((log_rows, ss.N_LOG))
    ss.simulate_disagg_one(in_len, out_len, gaps, clients, rate, n_prefill, n_decode, max_batch, max_tokens,
                           cap[0] if p_cap is None else p_cap, cap[0] if d_cap is None else d_cap, host, hit, GRID,
                           g[0], h[0], pair_coef[0], dp[0], g[0], h[0], kv_coef[0], ds[0], np.asarray(xfer, float),
                           draft, acceptance, seed, res, log, False)
    return dict(zip(ss.SIM_OUTPUTS, res)), log, xfer


def lognormal(n: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    in_len = np.maximum(np.rint(rng.lognormal(np.log(300), 0.6, n)), 1.0)
    out_len = np.maximum(np.rint(rng.lognormal(np.log(40), 0.5, n)), 1.0)
    return in_len, out_len, rng.exponential(1.0, n)


# --------------------------------------------------------------------------- the KV transfer by hand


def test_kv_transfer_by_hand_through_the_link_kernels(fast, make_tiers):
    """A 512-token prompt's cache is 512 x 2048 = 1048576 bytes. Over a 1 GB/s link with
    5 us latency: 1048576 / 1e9 + 5e-6 = 1.053576e-3 s. The time comes from the tier's
    send/recv figures (``link_bytes_per_s``): a measured send/recv bandwidth of half the
    link's (op_scale 0.5) doubles the bytes' share: 2.097152e-3 + 5e-6 = 2.102152e-3 s.
    Past the node (16 devices) the outer tier: 1048576 / 1e8 + 2e-5 = 1.0505760e-2 s."""
    tiers = make_tiers((8, 1e9, 5e-6), (0, 1e8, 2e-5))
    srv = toy_srv()
    assert ss.transfer_times(fast["model"], tiers, srv, np.array([512.0]), 2.0)[0, 0] == pytest.approx(
        1.053576e-3, rel=REL)
    assert ss.transfer_times(fast["model"], tiers, srv, np.array([512.0]), 16.0)[0, 0] == pytest.approx(
        1.050576e-2, rel=REL)
    slow = tiers.copy()
    slow[0]["op_scale"][SEND_RECV] = 0.5
    assert ss.transfer_times(fast["model"], slow, srv, np.array([512.0]), 2.0)[0, 0] == pytest.approx(
        2.102152e-3, rel=REL)


# --------------------------------------------------------------------------- closed forms


def kv_coef(env) -> float:
    """The toy's decode seconds per cached token read: 2048 bytes / 1e12 (to 1e-9: the kernel
    takes it as a slope between two KV lengths); the closed forms below use the kernel's value."""
    coef = tables(env, toy_srv())[4][0]
    assert coef == pytest.approx(2048e-12, rel=1e-9)
    return coef


def test_one_request_ttft_is_prefill_plus_transfer(fast, make_tiers):
    """One user, one request of 512 in / 16 out over a 1 GB/s, 5 us link:
      TTFT = prefill 2.24007137460224e-4 + transfer 1.053576e-3 = 1.277583137460224e-3 s
      TPOT = the 15 decode iterations 15 x 126678016e-12 + 2048e-12 x 7800 = 1.91614464e-3 s, / 15
      e2e  = TTFT + 1.91614464e-3 = 3.193727777460224e-3 s
    and the log holds one prefill iteration, one transfer and 15 decode iterations, in that order."""
    tiers = make_tiers((8, 1e9, 5e-6), (0, 1e8, 2e-5))
    sim, log, _ = run_disagg(fast, [512.0], [16.0], clients=1, tiers=tiers, log_rows=32)
    decode = 15 * 126678016e-12 + kv_coef(fast) * 7800
    assert decode == pytest.approx(DECODE_512_16, rel=1e-9)
    assert sim["ttft_s"] == pytest.approx(PREFILL_512 + 1.053576e-3, rel=REL)
    assert sim["ttft_s"] == pytest.approx(1.277583137460224e-3, rel=REL)
    assert sim["tpot_s"] == pytest.approx(decode / 15, rel=REL)
    assert sim["e2e_latency_s"] == pytest.approx(1.277583137460224e-3 + decode, rel=REL)
    assert sim["makespan_s"] == pytest.approx(3.193727777460224e-3, rel=1e-9)
    assert (sim["iterations"], sim["prefill_iterations"], sim["stuck"]) == (15, 1, 0)
    kinds = log[:17, ss.L_KIND].tolist()
    assert kinds == [ss.LOG_PREFILL, ss.LOG_TRANSFER] + [ss.LOG_DECODE] * 15
    assert log[1, ss.L_START] == pytest.approx(PREFILL_512, rel=REL)
    assert log[1, ss.L_END] == log[2, ss.L_START]  # the decode engine starts as the cache lands
    assert not log[17:].any()


@pytest.mark.parametrize("n_prefill, n_decode", [(1, 1), (2, 2)])
def test_constant_lengths_run_in_waves(fast, n_prefill, n_decode):
    """8 users per prefill replica, 64-token prompts, 16 output tokens, max_tokens 512 and
    max_batch 8: each replica prefills its 8 prompts in one iteration, every cache lands at
    the same instant (equal prompts, equal transfers), the least-loaded routing gives each
    decode engine 8, which decode together and finish together: the deployment runs waves of
      prefill  t_p = rows_s(512) + head(8) + 8192e-18 x 8 x 64 x (32 + 225) pair-equivalents
                     (causal pairs and the attention kernel's fill of 225 keys a prompt row)
                   = (190464 x 512 + 60817408 + 134144 x 8 + 65536000) e-12 + 1.077936128e-9
                   = 224944128e-12 + 1.077936128e-9 = 2.24945205936128e-4 s
      transfer x   = 64 x 2048 / 1e11 = 1.31072e-6 s (the fast fixture's NVLink, no latency)
      decode       = sum_j=1..15 [rows_s(8) + head(8) + 2048e-12 x 8 x (64 + j)]
    so TTFT = t_p + x and TPOT = decode / 15 for every request, and the deployment makes
    8 x 16 tokens per replica pair per period."""
    users = 8 * n_prefill
    n = 8 * users
    sim, _, _ = run_disagg(fast, [64.0] * n, [16.0] * n, clients=users, n_prefill=n_prefill, n_decode=n_decode,
                           max_batch=8, max_tokens=512.0)
    t_p = (190464 * 512 + 60817408 + 134144 * 8 + 65536000) * 1e-12 + 8192e-18 * 8 * 64 * (32 + 225)
    x = 64 * 2048 / 1e11
    assert t_p == pytest.approx(2.24945205936128e-4, rel=REL)
    kv = kv_coef(fast)
    decode = sum((190464 * 8 + 60817408 + 134144 * 8 + 65536000) * 1e-12 + kv * 8 * (64 + j) for j in range(1, 16))
    period = t_p + x + decode
    assert sim["ttft_s"] == pytest.approx(t_p + x, rel=REL)
    assert sim["ttft_p90_s"] == pytest.approx(t_p + x, rel=REL)
    assert sim["tpot_s"] == pytest.approx(decode / 15, rel=REL)
    assert sim["makespan_s"] == pytest.approx(8 * period, rel=REL)
    assert sim["output_tokens_per_s"] == pytest.approx(users * 16 / period, rel=REL)
    assert sim["iterations"] == 8 * 15 * n_decode and sim["prefill_iterations"] == 8 * n_prefill


def test_drafts_at_full_acceptance_follow_the_closed_form(fast):
    """k = 2 drafts all accepted: 15 tokens after the first in 5 steps of 3; the simulation's
    tokens per step is 3 and TPOT = 5 decode iterations / 15."""
    sim, log, _ = run_disagg(fast, [512.0], [16.0], clients=1, draft=2, acceptance=1.0, log_rows=16)
    assert sim["iterations"] == 5 and sim["tokens_per_step"] == 3.0
    decode = log[log[:, ss.L_KIND] == ss.LOG_DECODE]
    assert sim["tpot_s"] == pytest.approx((decode[:, ss.L_END] - decode[:, ss.L_START]).sum() / 15, rel=REL)


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("clients, rate, n_prefill, n_decode", [(0, 300.0, 1, 2), (32, 0.0, 2, 3), (0, 900.0, 3, 1)])
def test_littles_law(fast, clients, rate, n_prefill, n_decode):
    """The time-average number of requests in the deployment (integrated event by event)
    equals the completion rate times the mean latency, on Poisson and closed-loop runs of
    lognormal lengths over several replicas."""
    in_len, out_len, gaps = lognormal(400)
    sim, _, _ = run_disagg(fast, in_len, out_len, gaps, clients=clients, rate=rate, n_prefill=n_prefill,
                           n_decode=n_decode, max_batch=32, max_tokens=1024.0)
    assert sim["stuck"] == 0
    assert sim["concurrency"] == pytest.approx(sim["requests_per_s"] * sim["e2e_latency_s"], rel=1e-9)
    if clients:
        assert sim["concurrency"] <= clients
    assert sim["ttft_s"] > 0 and sim["tpot_s"] > 0


def test_decode_admission_respects_the_kv_capacity(fast):
    """Decode engines of 3000 tokens under 16 users of ~300 + 40 tokens: admission reserves a
    request's whole sequence, so the cache's high-water never passes 3000 and nobody is
    preempted, every request completes; in the log every decode iteration's cached tokens sit
    within its reservation and the capacity."""
    in_len, out_len, gaps = lognormal(200)
    cap = 3000.0
    sim, log, _ = run_disagg(fast, in_len, out_len, gaps, clients=16, n_decode=2, max_batch=16, max_tokens=2048.0,
                             d_cap=cap, log_rows=20000)
    assert sim["stuck"] == 0 and sim["preemptions"] == 0
    assert 0 < sim["kv_peak_tokens"] <= cap
    decode = log[log[:, ss.L_KIND] == ss.LOG_DECODE]
    assert len(decode) == sim["iterations"]
    assert (decode[:, ss.L_KV] <= decode[:, ss.L_KV_RESERVED]).all() and (decode[:, ss.L_KV_RESERVED] <= cap).all()
    # a decode batch is limited by the cache, not by max_batch: 3000 / ~340 tokens
    assert decode[:, ss.L_REQUESTS].max() < 16


def test_requests_the_caches_cannot_hold_are_stuck_not_a_hang(fast):
    """A 512 + 16-token request on a decode engine of 500 tokens, or a 512-token prompt on a
    prefill replica of 400: stuck, latencies NaN."""
    for kwargs in (dict(d_cap=500.0), dict(p_cap=400.0)):
        sim, _, _ = run_disagg(fast, [512.0], [16.0], clients=1, **kwargs)
        assert sim["stuck"] == 1 and math.isnan(sim["ttft_s"])


def test_routing_spreads_requests_over_the_decode_engines(fast):
    """Least-loaded routing: with 4 decode engines and 32 users the transfers land on every
    engine, and each engine's iterations are serial (no two overlap)."""
    in_len, out_len, gaps = lognormal(300, seed=11)
    sim, log, _ = run_disagg(fast, in_len, out_len, gaps, clients=32, n_prefill=2, n_decode=4, max_batch=16,
                             max_tokens=2048.0, log_rows=40000)
    used = log[:int(sim["iterations"] + sim["prefill_iterations"]) + len(in_len)]
    transfers = used[used[:, ss.L_KIND] == ss.LOG_TRANSFER]
    assert sorted(set(transfers[:, ss.L_PEER].astype(int))) == [2, 3, 4, 5]
    for engine in range(6):
        mine = used[(used[:, ss.L_ENGINE] == engine) & (used[:, ss.L_KIND] != ss.LOG_TRANSFER)]
        assert (mine[1:, ss.L_START] >= mine[:-1, ss.L_END]).all()


def test_deterministic_for_a_seed(fast):
    """Two runs with the same inputs and seed agree bit for bit (drafts drawn by the
    counter-based hash); another seed changes the draws and so the result."""
    in_len, out_len, gaps = lognormal(300, seed=7)
    runs = [run_disagg(fast, in_len, out_len, gaps, rate=300.0, n_prefill=2, n_decode=2, max_batch=32,
                       max_tokens=512.0, draft=2, acceptance=0.6, seed=s)[0] for s in (5, 5, 6)]
    same = lambda a, b: all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a.values(), b.values()))  # noqa: E731
    assert same(runs[0], runs[1])
    assert not same(runs[0], runs[2])


# --------------------------------------------------------------------------- through serve


def test_serve_simulates_disaggregated_candidates():
    """A space with only disaggregated candidates: the best ones are simulated (``simulated``
    = 1), with TTFT above the KV transfer and p90 latencies filled in."""
    raw = space(dimensions={"tp": [1, 2], "mode": ["disagg"], "prefill_tp": [2], "prefill_instances": [1, 2]},
                workload={"input_len": 512, "output_len": 32, "concurrency": 16, "n_requests": 200})
    loaded = sp.serving_from_raw(raw, "toy.toml", Path("."))
    ranked, summary = evaluate_space(loaded, simulate_top=8)
    simulated = ranked["simulated"] == 1
    assert summary.n_simulated == simulated.sum() > 0
    assert (ranked["mode"][simulated] == sp.Mode.DISAGG).all()
    assert (ranked["ttft_s"][simulated] > ranked["kv_transfer_s"][simulated]).all()
    assert np.isfinite(ranked["ttft_p90_s"][simulated]).all() and np.isfinite(ranked["tpot_p90_s"][simulated]).all()
