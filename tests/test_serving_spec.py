"""Speculative decoding / multi-token prediction as a serving dimension (issue 15):
``dimensions.draft_tokens`` and ``workload.acceptance_rate`` through the space,
the analytic tier by hand, the simulation against the closed form and the
plain-Python reference, and the k = 0 rows bit for bit as before.

The toy of ``test_serving`` (2 layers, h 1024, 8 heads / 2 KV heads of 128,
SwiGLU 4096, vocab 32000; 1 TB/s and 1e18 FLOP/s, so a kernel costs its bytes
/ 1e12) gives, in bytes (``test_iteration_parts_by_hand`` derives the first three):
  rows_s(T)  = 190464 T + 60817408      head_rows_s(r) = 134144 r + 65536000
  one layer  =  93184 T + 30408704      decode attention: 1024 bytes a cached token a layer
A draft module's pass over T rows (``kernels.serving.draft_rows_s``): one layer,
the 2h -> h projection (T x 2048) @ (2048 x 1024), 2 (2048 T + 2097152 + 1024 T)
= 6144 T + 4194304, the embedding lookup and two norms, 6 x 1024 x 2 T = 12288 T:
  draft_rows_s(T) = 111616 T + 34603008
and a draft step on b rows adds the head: 245760 b + 100139008.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from naive_serving import expected_tokens as naive_expected, simulate as naive_simulate, steady_state
from paraspace.explorer.serve import evaluate_space
from paraspace.kernels import inference, serving_sim
from paraspace.kernels import serving as ks
from paraspace.spaces import serving as sp
from paraspace.spaces.errors import CatalogError
from test_serving import (  # noqa: F401 - fast is a fixture
    GRID, REFERENCE_CASES, analytic, fast, in_step, lognormal_requests, run_sim, space, toy_model, toy_srv, workload)

REL = 1e-12
E12 = 1e-12


def spec_srv(k: float, **overrides: float) -> np.ndarray:
    return toy_srv(draft_tokens=k, **overrides)


# --------------------------------------------------------------------------- expected tokens


@pytest.mark.parametrize("a, k, expected", [
    (0.5, 2, 1.75),  # 1 + 0.5 + 0.25
    (0.85, 1, 1.85),  # DeepSeek-V3's MTP: 85% acceptance of the second token
    (0.7, 3, 2.533),  # 1 + 0.7 + 0.49 + 0.343
    (1.0, 3, 4.0),  # every draft accepted: k + 1
    (0.0, 3, 1.0),  # none: the target's own token only
    (0.9, 0, 1.0),  # no drafts
])
def test_expected_tokens_by_hand(a, k, expected):
    assert ks.expected_tokens(a, float(k)) == pytest.approx(expected, rel=1e-15)
    if 0.0 < a < 1.0:
        assert ks.expected_tokens(a, float(k)) == pytest.approx((1 - a ** (k + 1)) / (1 - a), rel=1e-14)


# --------------------------------------------------------------------------- the cost parts by hand


def test_draft_parts_by_hand(fast):
    """The draft module's pass, its k steps, its prompt pass, the KV coefficient
    (2 layers x 1024 bytes for the verification, which reads the cache once for
    its q queries, plus k x 1024 for the drafts' own one-layer cache), the
    prefill pairs of 3 layers (2 x 8 x 256 FLOP each), the draft's weights
    (a layer 15206400 + 2h^2 2097152 + 3 norms 3072 = 17306624 parameters x 2
    bytes = 34613248) and its KV (a third layer: 3072 bytes a token)."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = spec_srv(2.0)[0]
    for t in (1.0, 512.0):
        assert ks.draft_rows_s(m, d, tiers, tiles, srv, t) == pytest.approx((111616 * t + 34603008) * E12, rel=REL)
    assert ks.draft_steps_s(m, d, tiers, tiles, srv, 3.0) == pytest.approx(2 * (245760 * 3 + 100139008) * E12, rel=REL)
    assert ks.draft_prompt_s(m, d, tiers, tiles, srv, 512.0) == pytest.approx(91750400 * E12, rel=REL)
    assert ks.kv_s_per_token(m, d, tiers, tiles, srv) == pytest.approx((2048 + 2 * 1024) * E12, rel=1e-9)
    assert ks.pair_s(m, d, srv) == pytest.approx(3 * 2 * 8 * 256 / 1e18, rel=REL)
    assert ks.draft_weight_bytes(m, srv) == 34613248
    assert ks.replica_weight_bytes(m, srv) == 191899648 + 34613248
    assert ks.replica_kv_bytes_per_token(m, srv) == 3072
    # without drafts every part is 0 and the memory is kernels.inference's
    off = toy_srv()[0]
    assert ks.draft_rows_s(m, d, tiers, tiles, off, 512.0) == 0.0 == ks.draft_steps_s(m, d, tiers, tiles, off, 3.0)
    assert ks.replica_weight_bytes(m, off) == inference.device_weight_bytes(m, off)
    assert ks.replica_kv_bytes_per_token(m, off) == inference.kv_bytes_per_token(m, off)


def test_mtp_modules_are_the_models_own():
    """A model with mtp_depth D runs min(k, D) of its modules; one without, one draft head;
    with pp = 2 the module lands on the last stage (1 layer + 1 module), not above the first's 1."""
    plain, mtp2 = toy_model()[0], toy_model(mtp_depth=2.0)[0]
    assert ks.draft_modules(plain, spec_srv(3.0)[0]) == 1.0
    assert ks.draft_modules(mtp2, spec_srv(1.0)[0]) == 1.0
    assert ks.draft_modules(mtp2, spec_srv(3.0)[0]) == 2.0
    assert ks.draft_modules(mtp2, toy_srv()[0]) == 0.0
    assert ks.draft_weight_bytes(mtp2, spec_srv(3.0)[0]) == 2 * 34613248
    # pp = 2: one layer a stage (1024 bytes a token); the module's layer joins the last: 2048
    assert ks.replica_kv_bytes_per_token(plain, spec_srv(1.0, pp=2.0)[0]) == 2048


def test_verification_reads_the_cache_once_and_multiplies_the_flop(make_device, make_tiers, toy_tiles):
    """At 1e12 FLOP/s the toy's decode attention is compute-bound: per cached token and layer
    2 x 8 heads x 256 = 4096 FLOP a query (QK^T and PV) against 1024 bytes at 1 TB/s. The
    slope is taken between s = 0, where the step moves only Q and O (4096 q bytes: 4.096e-9 q
    s), and s = 4096 (4096 q x 4096 FLOP): (4096 q x 4096 - 4096 q) / 4096 = 4095 q e-12 s a
    token a layer. q = 1: 2 layers x 4095e-12. k = 2: the verification's q = 3 queries,
    2 x 12285e-12, plus 2 draft steps over a one-layer cache, 2 x 4095e-12. (The toy at
    1e18 FLOP/s stays memory-bound: 1024 bytes whatever q, ``test_draft_parts_by_hand``.)"""
    dev = make_device(peak_flops_per_s=1e12)[0]
    tiers = make_tiers((8, 1e11, 0.0), (0, 1e10, 0.0))
    m = toy_model()[0]
    assert ks.kv_s_per_token(m, dev, tiers, toy_tiles, toy_srv()[0]) == pytest.approx(2 * 4095e-12, rel=1e-9)
    assert ks.kv_s_per_token(m, dev, tiers, toy_tiles, spec_srv(2.0)[0]) == pytest.approx(
        2 * 12285e-12 + 2 * 4095e-12, rel=1e-9)


# --------------------------------------------------------------------------- the analytic tier by hand


def one_user(k: float, a: float) -> tuple[float, float]:
    """Hand figures for one user, 512-token prompt, 16 output tokens (15 decoded), k drafts at rate a:
      prefill = rows_s(512) + head(1) + draft_prompt_s(512) + 3 layers' pairs 12288e-18 x 512 x (256 + 225)
                (the causal pairs and the attention kernel's fill, 225 keys a prompt row)
              = (97517568 + 60817408 + 134144 + 65536000 + 91750400) e-12 + 3.026190336e-9
      a step  = rows_s(3 x 1) + head(3) + 2 (draft_rows_s(1) + head(1))
              = (324608 x 3 + 126353408 + 2 x 100384768) e-12 = 328096768e-12 s (k = 2)
      n = 15 / E steps reading 512 + 3 + (j - 1) E tokens, j = 1 .. n:
              n 515 + E n (n - 1) / 2, at (2048 + 2 x 1024) e-12 s a token
    Returns (prefill, decode) of the request."""
    assert k == 2.0
    e = naive_expected(a, 2)
    n = 15 / e
    prefill = 315755520 * E12 + 12288 * 512 * (256 + 225) / 1e18
    decode = n * 328096768 * E12 + 4096 * E12 * (n * 515 + e * n * (n - 1) / 2)
    return prefill, decode


@pytest.mark.parametrize("a", [0.0, 0.5, 1.0])
def test_one_user_with_drafts_by_hand(fast, a):
    """a = 1: 3 tokens a step, 5 steps reading 515, 518, ..., 527 = 2605 tokens: decode
    5 x 328096768e-12 + 4096e-12 x 2605 = 1.65115392e-3 s. a = 0: 15 steps reading 515 .. 529,
    7830 tokens: 15 x 328096768e-12 + 4096e-12 x 7830 = 4.9535232e-3 s. a = 0.5: E = 1.75,
    n = 60/7 steps (``one_user``)."""
    out = analytic(fast, spec_srv(2.0), workload(acceptance_rate=a))
    prefill, decode = one_user(2.0, a)
    if a == 1.0:
        assert decode == pytest.approx(5 * 328096768e-12 + 4096e-12 * 2605, rel=1e-12)
    if a == 0.0:
        assert decode == pytest.approx(15 * 328096768e-12 + 4096e-12 * 7830, rel=1e-12)
    assert out["ttft_s"] == pytest.approx(prefill, rel=1e-9)
    assert out["tpot_s"] == pytest.approx(decode / 15, rel=1e-9)
    assert out["tokens_per_step"] == naive_expected(a, 2)
    assert out["decode_step_s"] == pytest.approx(decode / (15 / naive_expected(a, 2)), rel=1e-9)
    assert out["output_tokens_per_s_per_gpu"] == pytest.approx(16 / (prefill + decode), rel=1e-9)


def test_drafts_cost_more_when_rejected_and_gain_when_accepted(fast):
    """Against k = 0 (TPOT 1.91614464e-3 / 15 = 1.2774e-4 s, test_prefill_and_decode_step_by_hand):
    a = 0 pays the verification and drafts for nothing (4.9535e-3 / 15 = 3.302e-4 s, 1 token a
    step); a = 1 emits 3 tokens a step and wins (1.651e-3 / 15 = 1.1008e-4 s). The toy's draft
    module is half its size (2 layers), so even a = 0.5 loses here: 2.830e-3 / 15."""
    base = analytic(fast, toy_srv(), workload())
    never = analytic(fast, spec_srv(2.0), workload(acceptance_rate=0.0))
    always = analytic(fast, spec_srv(2.0), workload(acceptance_rate=1.0))
    assert base["tpot_s"] == pytest.approx(1.91614464e-3 / 15, rel=1e-9)
    assert never["tpot_s"] > base["tpot_s"] and never["tokens_per_step"] == 1.0
    assert never["output_tokens_per_s_per_gpu"] < base["output_tokens_per_s_per_gpu"]
    assert always["tpot_s"] < base["tpot_s"] and always["tokens_per_step"] == 3.0
    assert always["output_tokens_per_s_per_gpu"] > base["output_tokens_per_s_per_gpu"]


def test_no_drafts_is_bit_for_bit_the_tier_without_them(fast):
    """k = 0 with any acceptance rate: every output equals the k = 0 row of today, bit for bit."""
    for wl in (workload(), workload(concurrency=0.0, rate_per_s=300.0, host_s=1e-4)):
        before = analytic(fast, toy_srv(), wl, max_batch=32.0, max_tokens=2048.0)
        wl_a = wl.copy()
        wl_a["acceptance_rate"] = 0.8
        after = analytic(fast, spec_srv(0.0), wl_a, max_batch=32.0, max_tokens=2048.0)
        for key in ks.OUTPUTS:
            assert after[key] == before[key] or (math.isnan(after[key]) and math.isnan(before[key])), key


@pytest.mark.parametrize("wl_change, scheduler", REFERENCE_CASES)
def test_analytic_tier_with_drafts_agrees_with_the_reference(fast, wl_change, scheduler):
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = spec_srv(3.0)
    wl_change = dict(wl_change)
    overlap = wl_change.pop("overlap", False)
    wl = workload(host_s=1e-4, acceptance_rate=0.7, **wl_change)
    out = analytic(fast, srv, wl, max_batch=32.0, max_tokens=2048.0, scheduler=scheduler, overlap=overlap,
                   instances=2.0)
    s = srv[0]
    ref = steady_state(lambda t: ks.rows_s(m, d, tiers, tiles, s, float(t)),
                       lambda r: ks.head_rows_s(m, d, tiers, tiles, s, float(r)),
                       ks.kv_s_per_token(m, d, tiers, tiles, s), ks.pair_s(m, d, s), ks.kv_capacity_tokens(m, d, s),
                       input_len=wl.input_len[0], output_len=wl.output_len[0], hit=wl.prefix_hit_rate[0],
                       concurrency=wl.concurrency[0], rate=wl.rate_per_s[0], host=1e-4, max_batch=32.0,
                       max_tokens=2048.0, scheduler=scheduler, engines=2.0, devices=1.0, draft=3,
                       acceptance=0.7, draft_prompt=lambda t: ks.draft_prompt_s(m, d, tiers, tiles, s, float(t)),
                       draft_steps=lambda b: ks.draft_steps_s(m, d, tiers, tiles, s, float(b)), overlap=overlap,
                       in_step=in_step(wl))
    assert ref["stable"] == (out["reason"] != ks.OVERLOADED)
    for key in ("batch", "ttft_s", "tpot_s", "e2e_latency_s", "requests_per_s", "output_tokens_per_s_per_gpu"):
        assert out[key] == pytest.approx(ref[key], rel=1e-10), key


def test_disaggregated_decode_with_drafts(fast):
    """Poisson 20 requests/s, 512 in / 16 out: the decode batch B makes B / (n t_d(B)) = 20
    with n = 15 / E steps a request, t_d verifying 3 positions a sequence and drafting 2;
    TPOT = n t_d / 15; the transfer (in TTFT) carries the draft's third layer of KV
    (512 x 3072 bytes over 1e11 B/s)."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = spec_srv(2.0, n_gpus=2.0)
    out = analytic(fast, srv, workload(concurrency=0.0, rate_per_s=20.0, devices=2.0, acceptance_rate=0.5),
                   max_tokens=4096.0, prefill=spec_srv(2.0, n_gpus=2.0))
    n = 15 / 1.75
    b = out["batch"]
    t_d = ks.decode_only_s(m, d, tiers, tiles, srv[0], 0.0, ks.kv_s_per_token(m, d, tiers, tiles, srv[0]), b, 520.0)
    assert t_d == pytest.approx((324608 * 3 * b + 126353408 + 2 * (245760 * b + 100139008)) * E12
                                + 4096 * E12 * b * 522.0, rel=1e-9)
    assert b / (n * t_d) == pytest.approx(20.0, rel=1e-9)
    assert out["kv_transfer_s"] == pytest.approx(512 * 3072 / 1e11, rel=REL)
    assert out["tpot_s"] == pytest.approx(n * t_d / 15, rel=1e-9)
    assert out["tokens_per_step"] == 1.75 and out["reason"] == ks.OK


def test_deepseek_v3_mtp_speedup_is_near_its_report():
    """DeepSeek-V3 (arXiv:2412.19437, section 5.4.3): its MTP module's second token is accepted
    85-90% of the time, giving 1.8x the tokens per second, on its decode deployment (the
    prefill runs on other nodes, section 3.4). Modelled as 8 H200 decoding in FP8 beside 8
    prefilling, attention DP, 256 users: k = 1 at a = 0.85 emits 1.85 tokens a step for a
    step about 9% longer (the MTP layer and head, the doubled GEMM rows and absorbed-MLA
    attention FLOP), so TPOT falls about 1.7x; below 1.85x, above 1.6x. At 8 users the gain
    is smaller (a small batch's 16 verified tokens hit nearly twice the experts its 8 tokens
    do), and so it is on one aggregated engine, whose iterations also carry the prompts of
    the requests that finish sooner (1.47x at 256 users)."""
    raw = {"name": "ds", "description": "d", "model": "deepseek-v3", "hardware": "h200-sxm-141gb", "devices": 16,
           "workload": {"input_len": 1024, "output_len": 256, "concurrency": 256, "acceptance_rate": 0.85},
           "dimensions": {"mode": ["disagg"], "tp": [8], "ep": [8], "attention_dp": [True], "dtype": ["fp8"],
                          "kv_dtype": ["fp8"], "max_batch": [256], "draft_tokens": [0, 1], "prefill_tp": [8],
                          "prefill_ep": [8], "prefill_instances": [1], "prefill_attention_dp": [True]},
           "simulate_top": 0}

    def speedup(raw: dict) -> float:
        ranked, _ = evaluate_space(sp.serving_from_raw(raw, "ds.toml", Path(".")))
        assert (ranked["infeasible_reason"] == ks.OK).all()
        tpot = dict(zip(ranked["draft_tokens"], ranked["tpot_s"]))
        return tpot[0] / tpot[1]

    decode = speedup(raw)
    assert 1.6 < decode < 1.85
    assert 1.0 < speedup({**raw, "workload": {**raw["workload"], "concurrency": 8}}) < decode
    aggregated = {**raw, "devices": 8, "dimensions": {k: v for k, v in raw["dimensions"].items()
                                                      if k != "mode" and not k.startswith("prefill")}}
    assert 1.0 < speedup(aggregated) < decode


# --------------------------------------------------------------------------- the simulation


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 1.0])
def test_simulated_tokens_per_step_match_the_closed_form(fast, a):
    """8 users, 32 requests of 64 + 2001 tokens, k = 3: about 25,000 (request, step) draws of
    1 + a geometric count truncated at 3, mean E = (1 - a^4) / (1 - a), standard deviation at
    most 1.3 tokens, so the mean is within 4 x 1.3 / sqrt(25000) = 0.033 of E (and the last
    step of each request, cut at the tokens it has left, moves it by under 0.001). a = 0 and
    a = 1 are exact: 1 token a step; 4 a step over 2000 / 4 = 500 steps a request."""
    e = naive_expected(a, 3)
    sim, _ = run_sim(fast, spec_srv(3.0), [64.0] * 32, [2001.0] * 32, clients=8, max_batch=8.0, max_tokens=512.0,
                     acceptance=a, seed=11)
    assert sim["stuck"] == 0
    if a in (0.0, 1.0):
        assert sim["tokens_per_step"] == e
        assert sim["iterations"] == 4 * (1 + 2000 / e)  # 4 waves of a prefill and the decode steps
    else:
        assert abs(sim["tokens_per_step"] - e) < 0.033


def test_one_request_with_every_draft_accepted_equals_the_closed_form(fast):
    """a = 1, k = 2, one user, 512 + 16 tokens: a prefill iteration and 5 steps of 3 tokens
    (the grid holds 1, 3 and 512, so the tables are exact): the closed form's figures."""
    wl = workload(acceptance_rate=1.0)
    closed = analytic(fast, spec_srv(2.0), wl)
    sim, _ = run_sim(fast, spec_srv(2.0), [512.0], [16.0], clients=1, acceptance=1.0)
    assert sim["iterations"] == 6 and sim["tokens_per_step"] == 3.0
    for key in ("ttft_s", "tpot_s", "e2e_latency_s"):
        assert sim[key] == pytest.approx(closed[key], rel=REL), key


@pytest.mark.parametrize("case", [
    dict(clients=16, rate=0.0, cap=None, scheduler=ks.CONTINUOUS, max_tokens=700.0),
    dict(clients=0, rate=350.0, cap=None, scheduler=ks.CONTINUOUS, max_tokens=512.0),
    dict(clients=0, rate=350.0, cap=None, scheduler=ks.STATIC, max_tokens=512.0),
    dict(clients=12, rate=0.0, cap=2500.0, scheduler=ks.CONTINUOUS, max_tokens=1024.0),
])
def test_simulation_with_drafts_agrees_with_the_reference(fast, case):
    """The kernel against tests/naive_serving.py with k = 2 at a = 0.6: the same draws, the
    same preemptions (the verification reserves 3 slots a sequence), the same times."""
    in_len, out_len, gaps = lognormal_requests(150, seed=3)
    sim, (g, h, kv_coef, pair_coef, cap, dp, ds) = run_sim(
        fast, spec_srv(2.0), in_len, out_len, gaps, clients=case["clients"], rate=case["rate"], max_batch=16.0,
        max_tokens=case["max_tokens"], scheduler=case["scheduler"], host=2e-5, hit=0.25, cap=case["cap"],
        acceptance=0.6, seed=5)
    ref = naive_simulate(list(in_len), list(out_len), list(gaps), clients=case["clients"], rate=case["rate"],
                         max_batch=16, max_tokens=case["max_tokens"], scheduler=case["scheduler"],
                         cap=float(cap), host=2e-5, kv_coef=float(kv_coef), pair_coef=float(pair_coef), hit=0.25,
                         grid=list(GRID), g=list(g), h=list(h), draft=2, acceptance=0.6, seed=5, dp=list(dp),
                         ds=list(ds))
    assert sim["stuck"] == 0
    for key in ("ttft_s", "ttft_p50_s", "ttft_p90_s", "tpot_s", "tpot_p90_s", "e2e_latency_s", "makespan_s",
                "concurrency", "preemptions", "tokens_per_step"):
        assert sim[key] == pytest.approx(ref[key], rel=REL), key
    if case["cap"] is not None:
        assert sim["preemptions"] > 0 and sim["kv_peak_tokens"] <= case["cap"]


def test_draws_are_deterministic_and_follow_the_seed(fast):
    in_len, out_len, gaps = lognormal_requests(200, seed=7)
    args = dict(rate=300.0, max_batch=32.0, max_tokens=1024.0, acceptance=0.6)
    one = run_sim(fast, spec_srv(2.0), in_len, out_len, gaps, seed=1, **args)[0]
    again = run_sim(fast, spec_srv(2.0), in_len, out_len, gaps, seed=1, **args)[0]
    other = run_sim(fast, spec_srv(2.0), in_len, out_len, gaps, seed=2, **args)[0]
    assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(one.values(), again.values()))
    assert one["tokens_per_step"] != other["tokens_per_step"]
    draws = [serving_sim.unit_draw(1, r, g, j) for r in range(40) for g in range(40) for j in range(3)]
    assert 0.0 <= min(draws) and max(draws) < 1.0 and abs(np.mean(draws) - 0.5) < 0.02


def test_no_drafts_simulates_bit_for_bit_as_before(fast):
    """k = 0 whatever the acceptance rate and seed: the same run (fast-forwarded decode
    included), 1 token a step."""
    in_len, out_len, gaps = lognormal_requests(200, seed=9)
    args = dict(clients=16, max_batch=16.0, max_tokens=1024.0, cap=4000.0)
    before = run_sim(fast, toy_srv(), in_len, out_len, gaps, **args)[0]
    after = run_sim(fast, spec_srv(0.0), in_len, out_len, gaps, acceptance=0.9, seed=3, **args)[0]
    assert after == before or all(a == b or (math.isnan(a) and math.isnan(b))
                                  for a, b in zip(after.values(), before.values()))
    assert after["tokens_per_step"] == 1.0


# --------------------------------------------------------------------------- the space and paraspace serve


def test_space_drafts_need_an_acceptance_rate_and_bounds():
    raw = space(dimensions={"tp": [8], "draft_tokens": [0, 2]})
    with pytest.raises(CatalogError) as info:
        sp.serving_from_raw(raw, "toy.toml", Path("."))
    assert info.value.field == "workload.acceptance_rate" and "draft_tokens = [0, 2]" in info.value.expected
    for field, value in (("acceptance_rate", 1.5), ("acceptance_rate", -0.1), ("acceptance_rate", float("nan"))):
        bad = space(workload={"input_len": 64, "output_len": 8, "concurrency": 2, field: value})
        with pytest.raises(CatalogError, match="acceptance_rate"):
            sp.serving_from_raw(bad, "toy.toml", Path("."))
    for value in ([17], [-1], [2, 2]):
        bad = space(dimensions={"draft_tokens": value}, workload={"input_len": 64, "output_len": 8, "concurrency": 2,
                                                                   "acceptance_rate": 0.5})
        with pytest.raises(CatalogError, match="draft_tokens"):
            sp.serving_from_raw(bad, "toy.toml", Path("."))


def test_the_token_budget_counts_the_verified_positions():
    """Continuous batching fits a full batch's decode rows, max_batch x (k + 1), in max_tokens:
    with max_batch 64 and max_tokens 128, k = 0 and 1 fit (64, 128 rows), k = 2 (192) does not."""
    raw = space(dimensions={"tp": [8], "max_batch": [64], "max_tokens": [128], "draft_tokens": [0, 1, 2]},
                workload={"input_len": 64, "output_len": 8, "concurrency": 2, "acceptance_rate": 0.5})
    enc = sp.encode(sp.serving_from_raw(raw, "toy.toml", Path(".")))
    assert list(enc.columns["draft_tokens"]) == [0, 1]
    assert enc.first_reason[sp.ServingReason.TOKEN_BUDGET] == 1


def test_serve_rows_without_drafts_are_unchanged_bit_for_bit():
    """The catalog's Llama space with draft_tokens = [0, 2] at a = 0.8: its k = 0 rows are the
    rows of the space without the dimension, analytic and simulated (every candidate simulated)."""
    from paraspace.spaces.catalog import read_toml

    raw = read_toml(sp.SERVING_DIR / "llama3.1-70b-h100-8-fp8.toml")
    raw["dimensions"] = {**raw["dimensions"], "mode": ["agg"], "kv_dtype": ["fp8"], "pp": [1, 2]}
    base, _ = evaluate_space(sp.serving_from_raw(raw, "a.toml", sp.SERVING_DIR), simulate_top=1000)
    raw["dimensions"]["draft_tokens"] = [0, 2]
    raw["workload"]["acceptance_rate"] = 0.8
    both, _ = evaluate_space(sp.serving_from_raw(raw, "b.toml", sp.SERVING_DIR), simulate_top=1000)
    assert (both["draft_tokens"] == 2).sum() > 0
    keys = sorted(set(base) - {"row_id"})
    order_a = np.lexsort([base[k] for k in ("tp", "pp", "max_batch", "max_tokens", "scheduler")])
    k0 = both["draft_tokens"] == 0
    pick = {k: v[k0] for k, v in both.items()}
    order_b = np.lexsort([pick[k] for k in ("tp", "pp", "max_batch", "max_tokens", "scheduler")])
    for key in keys:
        a, b = base[key][order_a], pick[key][order_b]
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), key
    # the drafted rows' simulated tokens a step are near E = 1 + 0.8 + 0.64 = 2.44 (256-token answers)
    drafted = (both["draft_tokens"] == 2) & (both["simulated"] > 0) & np.isfinite(both["tokens_per_step"])
    assert drafted.any() and np.all(np.abs(both["tokens_per_step"][drafted] - 2.44) < 0.15)
