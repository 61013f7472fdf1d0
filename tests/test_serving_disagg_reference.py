"""The disaggregated simulation (``kernels.serving_sim.simulate_disagg_one``) against its
plain-Python reference (``naive_serving.simulate_disagg``) on seeded random deployments:
closed loop and Poisson, 1-3 prefill replicas and 1-4 decode engines, chunked prefill,
prefix-cache hits, drafts, caches that hold a few requests or none, transfers with ties,
equal requests whose events coincide; and a run whose last request ends at its decode
admission."""

from __future__ import annotations

import math

import numpy as np
import pytest

from naive_serving import simulate_disagg
from paraspace.kernels import serving as ks
from paraspace.kernels import serving_sim as ss

GRID = ks.token_grid()
REL = 1e-12
KEYS = ("ttft_s", "ttft_p50_s", "ttft_p90_s", "tpot_s", "tpot_p90_s", "e2e_latency_s", "e2e_p90_s", "makespan_s",
        "concurrency", "requests_per_s", "iterations", "prefill_iterations", "kv_peak_tokens", "tokens_per_step")


def table(rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
    """Seconds over the token grid: a fixed part and a slope (a stand-in for kernels.serving.cost_tables)."""
    return rng.uniform(lo, 10 * lo) + rng.uniform(hi, 10 * hi) * GRID


def deployment(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    in_len = np.maximum(np.rint(rng.lognormal(np.log(300), 0.7, n)), 1.0)
    out_len = np.maximum(np.rint(rng.lognormal(np.log(30), 0.8, n)), 1.0)
    clients = int(rng.choice([0, 1, 4, 16, 64]))
    n_decode = int(rng.integers(1, 5))
    xfer = rng.uniform(0.0, 2e-4) * in_len / 300.0
    if seed % 3 == 0:
        xfer = np.round(xfer, 5)  # transfers landing together
    if seed % 4 == 0:  # equal requests and instant transfers: events of every kind at one instant
        in_len[:] = in_len[0]
        out_len[:] = out_len[0]
        xfer[:] = 0.0
    return dict(in_len=in_len, out_len=out_len, gaps=rng.exponential(1.0, n), clients=clients,
                rate=0.0 if clients else float(np.exp(rng.uniform(np.log(50), np.log(20000)))),
                n_prefill=int(rng.integers(1, 4)), n_decode=n_decode, max_batch=int(rng.choice([1, 4, 16, 256])),
                max_tokens=float(rng.choice([128.0, 512.0, 2048.0, 8192.0])),
                p_cap=float(rng.choice([2000.0, 1e5, 1e7])), d_cap=float(rng.choice([3000.0, 1e5, 1e7])),
                host=float(rng.choice([0.0, 2e-5])), hit=float(rng.choice([0.0, 0.3])), p_g=table(rng, 5e-6, 1e-7),
                p_h=table(rng, 1e-7, 1e-9), p_pair=float(rng.uniform(0.0, 1e-11)), p_dp=table(rng, 1e-6, 1e-8),
                d_g=table(rng, 5e-6, 1e-7), d_h=table(rng, 1e-7, 1e-9), d_kv=float(rng.uniform(1e-10, 5e-9)),
                d_ds=table(rng, 1e-6, 1e-8), xfer=xfer, draft=int(rng.choice([0, 0, 1, 3])),
                acceptance=float(rng.choice([0.0, 0.7, 1.0])), seed=int(rng.integers(0, 2**32)),
                steady=bool(seed % 2))


def kernel(d: dict) -> dict:
    res = np.empty(ss.N_SIM)
    ss.simulate_disagg_one(d["in_len"], d["out_len"], d["gaps"], d["clients"], d["rate"], d["n_prefill"],
                           d["n_decode"], d["max_batch"], d["max_tokens"], d["p_cap"], d["d_cap"], d["host"], d["hit"],
                           GRID, d["p_g"], d["p_h"], d["p_pair"], d["p_dp"], d["d_g"], d["d_h"], d["d_kv"], d["d_ds"],
                           d["xfer"], d["draft"], d["acceptance"], d["seed"], res, np.empty((0, ss.N_LOG)),
                           d["steady"])
    return dict(zip(ss.SIM_OUTPUTS, res))


def reference(d: dict) -> dict:
    lists = {k: list(map(float, v)) if isinstance(v, np.ndarray) else v for k, v in d.items()}
    return simulate_disagg(grid=list(GRID), **lists)


def agree(sim: dict, ref: dict) -> None:
    assert sim["stuck"] == ref["stuck"]
    if ref["stuck"]:
        assert math.isnan(sim["ttft_s"])
        return
    for key in KEYS:
        if math.isnan(ref[key]):
            assert math.isnan(sim[key]), key
        else:
            assert sim[key] == pytest.approx(ref[key], rel=REL, abs=1e-300), key


@pytest.mark.parametrize("seed", range(40))
def test_kernel_agrees_with_the_reference_on_random_deployments(seed):
    d = deployment(seed)
    agree(kernel(d), reference(d))


def test_the_random_deployments_cover_the_cases():
    """The seeds above reach what the comparison is for: stuck runs and finished ones,
    both arrival processes, several engines a stage, drafts, chunked prompts."""
    runs = [(deployment(s), reference(deployment(s))) for s in range(40)]
    assert {r["stuck"] for _, r in runs} == {0, 1}
    done = [(d, r) for d, r in runs if not r["stuck"]]
    assert {d["clients"] > 0 for d, _ in done} == {True, False}
    assert any(d["n_prefill"] > 1 and d["n_decode"] > 1 for d, _ in done)
    assert any(r["tokens_per_step"] > 1.0 for _, r in done)
    assert any(r["prefill_iterations"] > 0 and d["in_len"].max() > d["max_tokens"] for d, r in done)


def test_a_run_whose_last_request_ends_at_its_admission_is_complete():
    """One request of 512 prompt tokens and 1 output token: its only token is the first,
    which reaches the user when its cache is admitted on the decode engine, so it finishes
    there (the kernel used to report such a run stuck): TTFT = e2e = prefill + transfer,
    no decode iteration, TPOT 0."""
    d = deployment(0) | dict(in_len=np.array([512.0]), out_len=np.array([1.0]), gaps=np.ones(1), clients=1,
                             n_prefill=1, n_decode=2, p_cap=1e7, d_cap=1e7, host=0.0, hit=0.0, draft=0,
                             xfer=np.array([1e-4]))
    sim = kernel(d)
    # the prompt's causal pairs and the attention kernel's fill, 225 keys a row
    prefill = ss.lookup(GRID, d["p_g"], 512.0) + ss.lookup(GRID, d["p_h"], 1.0) + d["p_pair"] * 512 * (256 + 225)
    assert sim["stuck"] == 0
    assert sim["ttft_s"] == sim["e2e_latency_s"] == pytest.approx(prefill + 1e-4, rel=REL)
    assert sim["tpot_s"] == 0.0 and sim["iterations"] == 0 and sim["prefill_iterations"] == 1
    agree(sim, reference(d))
