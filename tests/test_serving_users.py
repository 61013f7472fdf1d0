"""A closed loop's users over a deployment's engines: every user on one engine, as evenly
as they go (``kernels.serving.engine_users``), in the analytic tier and the simulation.
Before, each engine took round(C / E) users, at least one, so a deployment served
E x round(C / E) users, not C: one user on 8 engines reported 8 users' throughput."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.explorer import serve
from paraspace.kernels import serving as ks
from paraspace.kernels import serving_sim
from paraspace.spaces import serving as sp
from test_serving import analytic, fast, toy_srv, workload  # noqa: F401  (fast: the toy device fixture)


def test_users_split_over_engines_by_hand():
    """(users, engines) of the busier group, then of the other: 12 users on 8 engines are
    2 on 12 - 8 = 4 engines and 1 on the other 4; 1 user on 8 is 1 on one engine, 7 idle;
    16 on 8 is 2 on each (the busier group has no engine)."""
    assert ks.engine_users(12.0, 8.0) == (2.0, 4.0, 1.0, 4.0)
    assert ks.engine_users(1.0, 8.0) == (1.0, 1.0, 0.0, 7.0)
    assert ks.engine_users(16.0, 8.0) == (3.0, 0.0, 2.0, 8.0)


@settings(max_examples=300, deadline=None)
@given(users=st.integers(1, 100_000), engines=st.integers(1, 512))
def test_every_user_is_on_one_engine(users, engines):
    """Conservation: the groups' engines add up to the deployment's and their users to
    the loop's; the busier group holds one user more an engine, on fewer engines than
    there are (as the array form the simulation uses says too)."""
    hi, n_hi, lo, n_lo = ks.engine_users(float(users), float(engines))
    assert n_hi + n_lo == engines
    assert hi * n_hi + lo * n_lo == users
    assert hi == lo + 1.0 and 0 <= n_hi < engines
    arrays = ks.engine_users.py_func(float(users), np.array([float(engines)]))
    assert tuple(float(a[0]) for a in arrays) == (hi, n_hi, lo, n_lo)


def test_one_user_on_eight_engines_is_one_users_load(fast):
    """One user can keep one request in flight: on 8 engines it is served by one engine,
    as on a deployment of one, and the deployment completes 1 / e2e requests a second
    (the old split gave each of the 8 engines a user: 8 / e2e)."""
    wl = workload(concurrency=1.0, host_s=1e-4)
    one = analytic(fast, toy_srv(), wl, max_batch=32.0, max_tokens=2048.0, instances=1.0)
    eight = analytic(fast, toy_srv(), wl, max_batch=32.0, max_tokens=2048.0, instances=8.0)
    for key in ("ttft_s", "tpot_s", "e2e_latency_s", "requests_per_s", "batch"):
        assert eight[key] == pytest.approx(one[key], rel=1e-12), key
    assert eight["requests_per_s"] * eight["e2e_latency_s"] == pytest.approx(1.0, rel=1e-12)
    # each GPU's share: the one busy engine's tokens over 8 devices' worth of the deployment
    assert eight["output_tokens_per_s_per_gpu"] == pytest.approx(one["output_tokens_per_s_per_gpu"], rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(users=st.integers(1, 200), instances=st.integers(1, 8))
def test_a_deployment_serves_its_groups_of_engines(fast, users, instances):
    """The deployment's rate is the sum of its groups' (each group's engines at a one-engine
    deployment's rate with that many users), its latencies the means over its requests
    (each group's weighted by the requests it completes), so Little's law holds for the
    loop's users exactly: rate x e2e = C."""
    kw = dict(max_batch=32.0, max_tokens=2048.0)
    deployment = analytic(fast, toy_srv(), workload(concurrency=float(users), host_s=1e-4), instances=float(instances),
                          **kw)
    hi, n_hi, lo, n_lo = ks.engine_users(float(users), float(instances))
    groups = [(analytic(fast, toy_srv(), workload(concurrency=c, host_s=1e-4), instances=1.0, **kw), n)
              for c, n in ((hi, n_hi), (lo, n_lo)) if c > 0 and n > 0]
    rate = sum(n * g["requests_per_s"] for g, n in groups)
    assert deployment["requests_per_s"] == pytest.approx(rate, rel=1e-12)
    for key in ("ttft_s", "tpot_s", "e2e_latency_s"):
        mean = sum(n * g["requests_per_s"] * g[key] for g, n in groups) / rate
        assert deployment[key] == pytest.approx(mean, rel=1e-12), key
    assert deployment["requests_per_s"] * deployment["e2e_latency_s"] == pytest.approx(users, rel=1e-12)
    assert deployment["batch"] == max(g["batch"] for g, _ in groups)  # the busiest engine's cache


def test_pooled_percentile_by_hand():
    """Values 1, 2, 3 weighing 1, 1, 2: each sits at its weight's midpoint of the
    cumulative weight, 0.5, 1.5, 3, less the first's 0.5 and scaled to the last's:
    0, 0.4, 1. The 50th percentile is 2 + (0.5 - 0.4) / 0.6 = 2.1667, the 90th
    2 + 0.5 / 0.6 = 2.8333; a NaN value is left out."""
    values, weights = np.array([3.0, 1.0, np.nan, 2.0]), np.array([2.0, 1.0, 5.0, 1.0])
    assert serve.pooled_percentile(values, weights, 50.0) == pytest.approx(2.0 + 0.1 / 0.6, rel=1e-12)
    assert serve.pooled_percentile(values, weights, 90.0) == pytest.approx(2.0 + 0.5 / 0.6, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0.0, 1e3), min_size=1, max_size=40), weight=st.floats(0.01, 100.0),
       q=st.floats(0.0, 100.0))
def test_pooled_percentile_of_equal_weights_is_numpys(values, weight, q):
    """Equal weights, any weight: np.percentile's linear method, as an engine's own run."""
    v = np.array(values)
    assert serve.pooled_percentile(v, np.full(v.size, weight), q) == pytest.approx(np.percentile(v, q), rel=1e-9,
                                                                                     abs=1e-9)


def with_users(name: str, users: int) -> sp.LoadedServing:
    space = sp.load_serving(name)
    workload_ = space.spec.workload.model_copy(update={"concurrency": users})
    return dataclasses.replace(space, spec=space.spec.model_copy(update={"workload": workload_}))


@pytest.mark.parametrize("users", [1, 12])
def test_simulated_deployments_serve_their_users(users):
    """The catalog Llama 3.1 70B space (1 to 8 engines) with 1 and 12 users, rows of each
    engine count simulated: every row's rate x e2e is the loop's users (each simulated
    engine sustains its users over their mean latency, the deployment's latencies are
    means over its requests), and a row of two groups (12 users on 8 engines: 2 on 4 of
    them, 1 on the others) pools its groups' requests: its p90 TTFT lies between the
    groups' own."""
    space = with_users("llama3.1-70b-h100-8-fp8", users)
    cols = serve.encode(space).columns
    metrics = serve.evaluate_columns(space, cols, simulate_top=0)
    packed = serve.pack_serving(space)
    srv = serve.serving_records(space, cols)
    prefill = serve.serving_records(space, cols, prefill=True)
    runnable = (metrics["reason"] == int(sp.Feasible.OK)) & (cols["mode"] == int(sp.Mode.AGG))
    rows = np.sort(np.concatenate([np.flatnonzero(runnable & (metrics["engines"] == e))[:2]
                                   for e in np.unique(metrics["engines"][runnable])]))
    serve.simulate(space, packed, srv, cols, metrics, rows, prefill)
    ok = rows[np.isfinite(metrics["e2e_latency_s"][rows])]
    assert ok.size >= 4
    little = metrics["requests_per_s"][ok] * metrics["e2e_latency_s"][ok]
    np.testing.assert_allclose(little, users, rtol=1e-9)
    split = [r for r in ok if users % metrics["engines"][r] != 0 and users > metrics["engines"][r]]
    assert (users == 1) == (not split)
    for row in split:
        sim, pooled = serve.run_sim(serve.sim_inputs(space, packed, srv, prefill, cols, metrics, np.array([row]), False))
        assert sim.shape[0] == 2 and len(pooled) == 1
        p90 = sim[:, serving_sim.S_TTFT_P90]
        assert p90.min() <= metrics["ttft_p90_s"][row] <= p90.max()


def test_a_trace_of_an_uneven_split_names_its_engine_and_gives_the_deployments_latencies():
    """3 users on 2 engines (TP 4, 2 instances): the trace runs one engine of the busier group
    (2 users), whose TTFT is its own; the title says so and gives the deployment's means,
    the ones serve writes for the row (both engines' requests), which differ."""
    from paraspace.explorer import serve_timeline

    space = with_users("llama3.1-70b-h100-8-fp8", 3)
    strategy = {"mode": "agg", "tp": 4, "pp": 1, "kv_dtype": "fp8", "max_batch": 16, "max_tokens": 4096,
                "scheduler": "continuous", "overlap_scheduler": False}
    timeline = serve_timeline.capture(space, strategy)
    cols, metrics = serve_timeline.pick_row(space, strategy)
    serve.simulate(space, serve.pack_serving(space), serve.serving_records(space, cols), cols, metrics, np.array([0]))
    own, deployment = timeline.result["ttft_s"], float(metrics["ttft_s"][0])
    assert abs(own / deployment - 1.0) > 0.05
    assert (f"on engine 0, one of 1 with 2 users (the deployment's 3 over 2 engines: TTFT {deployment * 1e3:.1f} ms, "
            f"TPOT {float(metrics['tpot_s'][0]) * 1e3:.2f} ms)") in timeline.title
