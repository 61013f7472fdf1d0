"""The serving analytic tier computes ``kv_s_per_token`` once per run of rows
that share a replica (``explorer.serve.replica_runs``, ``analytic_rows``'s
``run_of``) and remembers the run's one-token forwards (``forward_memo``): the
same numbers, bit for bit, as once per row."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraspace.explorer import serve
from paraspace.kernels import inference
from paraspace.kernels import serving as ks
from paraspace.spaces import serving as sp


@pytest.mark.parametrize("name", sp.names())
def test_runs_give_the_rows_results_bit_for_bit(name):
    space = sp.load_serving(name)
    cols = serve.encode(space).columns
    packed = serve.pack_serving(space)
    srv = serve.serving_records(space, cols)
    prefill = serve.serving_records(space, cols, prefill=True)
    args = (packed.model, packed.devs, packed.tiers, packed.tiles, srv, prefill, cols["dtype"], cols["mode"],
            cols["max_batch"], cols["max_tokens"], cols["scheduler"], cols["overlap_scheduler"], cols["instances"],
            cols["prefill_instances"], packed.workload)
    runs = serve.replica_runs(srv, cols["dtype"])
    assert runs[-1] + 1 < len(runs) / 2  # the rows of a replica do run together
    per_row = ks.analytic_rows(*args, np.arange(len(runs)))
    assert np.array_equal(ks.analytic_rows(*args, runs), per_row, equal_nan=True)
    # a shuffled order breaks the runs up, and the rows still get their own results
    order = np.random.default_rng(1).permutation(len(runs))
    shuffled = {k: np.ascontiguousarray(v[order]) for k, v in cols.items()}
    srv_s, prefill_s = srv[order], prefill[order]
    out = ks.analytic_rows(packed.model, packed.devs, packed.tiers, packed.tiles, srv_s, prefill_s, shuffled["dtype"],
                           shuffled["mode"], shuffled["max_batch"], shuffled["max_tokens"], shuffled["scheduler"],
                           shuffled["overlap_scheduler"], shuffled["instances"], shuffled["prefill_instances"], packed.workload,
                           serve.replica_runs(srv_s, shuffled["dtype"]))
    assert np.array_equal(out, per_row[order], equal_nan=True)


def test_a_run_holds_one_replica():
    """Rows of one run differ at most in batch_cap (the row's max_batch, which the serving
    kernels never read); a run changes where any other field or the precision does."""
    srv = np.zeros(6, inference.SERVING)
    srv["tp"] = [1, 1, 1, 2, 2, 2]
    srv["batch_cap"] = [8, 16, 8, 8, 16, 16]
    dtype = np.array([0, 0, 2, 2, 2, 2], np.int8)
    assert serve.replica_runs(srv, dtype).tolist() == [0, 0, 1, 2, 2, 2]
    assert serve.replica_runs(srv[:1], dtype[:1]).tolist() == [0]
    assert serve.replica_runs(srv[:0], dtype[:0]).tolist() == []


def test_a_serving_record_is_a_row_of_float64s():
    """``replica_runs`` compares the records as rows of a float64 matrix: every field
    must be one (a field of another type would be compared as the wrong bits)."""
    assert all(inference.SERVING[name] == np.float64 for name in inference.SERVING.names)


def test_chunks_start_where_a_run_does_and_every_chunk_rows_within_one():
    """Runs [0, 0, 0, 1, 1] in chunks of at most CHUNK_ROWS: chunks at 0 and 3, end 5.
    One run of 2 CHUNK_ROWS + 1 rows: chunks at 0, CHUNK_ROWS, 2 CHUNK_ROWS, end."""
    assert ks.chunk_starts(np.array([0, 0, 0, 1, 1])).tolist() == [0, 3, 5]
    c = ks.CHUNK_ROWS
    assert ks.chunk_starts(np.zeros(2 * c + 1, np.int64)).tolist() == [0, c, 2 * c, 2 * c + 1]
    assert ks.chunk_starts(np.zeros(0, np.int64)).tolist() == [0]


@pytest.fixture(scope="module")
def llama():
    space = sp.load_serving("llama3.1-70b-h100-8-fp8")
    cols = serve.encode(space).columns
    return space, cols, serve.pack_serving(space), serve.serving_records(space, cols)


@given(st.lists(st.sampled_from([1.0, 2.0, 3.0, 16.0, 17.0, 33.0, 48.0, 64.0, 4096.0, 8192.0, 8193.0, 65536.0,
                                 1.0e6, 3.0e6, 7.5, 1024.5]), min_size=1, max_size=60))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_remembered_forward_is_the_forward_bit_for_bit(llama, tokens):
    """Whatever token counts a run asks for, in any order and however many (past the
    memo's MEMO_SLOTS, which then overwrites slots), ``remembered_forward_s`` and
    ``remembered_rows_s`` return exactly ``forward_head_s(tokens, 1, 0)`` and ``rows_s``."""
    _, cols, packed, srv = llama
    m, d, tiers, tiles, s = packed.model[0], packed.devs[cols["dtype"][0]], packed.tiers, packed.tiles, srv[0]
    memo = ks.forward_memo()
    for t in tokens:
        assert ks.remembered_forward_s(memo, m, d, tiers, tiles, s, t) == inference.forward_head_s(m, d, tiers, tiles, s,
                                                                                                   t, 1.0, 0.0)
        assert ks.remembered_rows_s(memo, m, d, tiers, tiles, s, t) == ks.rows_s(m, d, tiers, tiles, s, t)
    assert ks.remembered_rows_s(memo, m, d, tiers, tiles, s, 0.0) == 0.0
    if len(set(tokens)) <= ks.MEMO_SLOTS:  # each count kept once, in its own slot
        assert sorted(memo[~np.isnan(memo[:, 0]), 0]) == sorted(set(tokens))


def test_a_run_longer_than_a_chunk_gives_each_row_its_own_results(llama):
    """One replica's rows repeated past CHUNK_ROWS (3 chunks of one run, each with its
    own memo): every row's outputs equal the row evaluated alone, bit for bit, and
    each output column comes back contiguous."""
    space, cols, packed, srv = llama
    agg = np.flatnonzero(cols["mode"] == ks.AGG)
    runs = serve.replica_runs(srv[agg], cols["dtype"][agg])
    first = agg[runs == runs[0]]
    pick = np.resize(first, 2 * ks.CHUNK_ROWS + 5)
    rows = {k: np.ascontiguousarray(v[pick]) for k, v in cols.items()}
    s, p = srv[pick], serve.serving_records(space, rows, prefill=True)
    args = (packed.model, packed.devs, packed.tiers, packed.tiles, s, p, rows["dtype"], rows["mode"], rows["max_batch"],
            rows["max_tokens"], rows["scheduler"], rows["overlap_scheduler"], rows["instances"],
            rows["prefill_instances"], packed.workload)
    run_of = serve.replica_runs(s, rows["dtype"])
    assert run_of[-1] == 0 and len(ks.chunk_starts(run_of)) == 4
    together = ks.analytic_rows(*args, run_of)
    assert np.array_equal(together, ks.analytic_rows(*args, np.arange(len(run_of))), equal_nan=True)
    metrics = serve.analytic(packed, s, rows, p)
    assert all(v.flags.c_contiguous for v in metrics.values())
    assert np.isfinite(metrics["ttft_s"]).any()


def test_a_remembered_iteration_is_the_iteration_bit_for_bit():
    """``remembered_iteration_s`` at a step returns exactly ``iteration_s``: from the
    memo when the step's arguments repeat, evaluated (and kept) when any differs, and
    evaluated when the memo has no row for the step (closed-loop chunks get an empty one)."""
    space = sp.load_serving("qwen3-235b-a22b-h200-8")
    cols = serve.encode(space).columns
    packed = serve.pack_serving(space)
    srv = serve.serving_records(space, cols)
    m, d, tiers, tiles, s = packed.model[0], packed.devs[cols["dtype"][0]], packed.tiers, packed.tiles, srv[0]
    kv, pair = ks.kv_s_per_token(m, d, tiers, tiles, s), ks.pair_s(m, d, s)
    memo = ks.iterate_memo(ks.FIXED_POINT_ITERATIONS)
    calls = [(3, (900.0, 40.0, 5.0e5, 2.0e6, 800.0, 30.0)), (3, (900.0, 40.0, 5.0e5, 2.0e6, 800.0, 30.0)),
             (3, (901.0, 40.0, 5.0e5, 2.0e6, 800.0, 30.0)), (0, (1.0, 1.0, 0.0, 0.0, 0.0, 0.0))]
    for step, args in calls:
        want = ks.iteration_s(m, d, tiers, tiles, s, 2e-4, kv, pair, *args)
        assert ks.remembered_iteration_s(memo, step, m, d, tiers, tiles, s, 2e-4, kv, pair, *args) == want
        assert memo[step, 6] == want and memo[step, 0] == args[0]
        assert ks.remembered_iteration_s(ks.iterate_memo(0), step, m, d, tiers, tiles, s, 2e-4, kv, pair, *args) == want
    assert np.isnan(memo[1, 6])  # steps never asked for stay empty


# --------------------------------------------------------------------------- the Poisson fixed point


def test_linear_piece_fixed_point_by_hand():
    """F(t) = 1 + t / 2 iterated from 0: 0, 1, 1.5, 1.75. Both chords have slope 1/2,
    so the piece meets the diagonal at 1.75 + 0.25 x 0.5 / 0.5 = 2 = 1 / (1 - 1/2), F's
    fixed point. A kink (1.8 after 1.5: slopes 1/2 then 3/5), fewer than four
    iterates, or a slope of 1 (0, 1, 2, 3: no fixed point) give -1."""
    assert ks.linear_piece_fixed_point(0.0, 1.0, 1.5, 1.75) == 2.0
    assert ks.linear_piece_fixed_point(0.0, 1.0, 1.5, 1.8) == -1.0
    assert ks.linear_piece_fixed_point(-1.0, 0.0, 1.0, 1.5) == -1.0
    assert ks.linear_piece_fixed_point(0.0, 1.0, 2.0, 3.0) == -1.0


def plain_fixed_point(args: tuple, lam: float, nd: float, e_tok: float, q: float, inl: float, outl: float,
                      new: float, pairs: float) -> tuple[float, int]:
    """t = F(t) iterated from 0 until a step moves less than FIXED_POINT_RTOL, and the steps taken."""
    t = 0.0
    for step in range(1, ks.FIXED_POINT_ITERATIONS + 1):
        nt = ks.poisson_iteration_s(ks.iterate_memo(0), 0, *args, lam, t, nd, e_tok, q, inl, outl, new, pairs)
        if abs(nt - t) <= ks.FIXED_POINT_RTOL * nt:
            return nt, step
        t = nt
    raise AssertionError("the plain iteration did not converge")


def test_the_fixed_point_is_found_in_a_few_steps_where_the_iteration_time_is_linear(make_device, make_tiers,
                                                                                    toy_tiles):
    """The toy model on a device bound by its bytes has an iteration time linear in
    its token and row counts, so F(t) is linear wherever more than one token runs
    (at t = 0 one token runs: a kink). Plain iteration creeps up at F's slope: 9, 19
    and 42 steps to 1e-12 at 50, 400 and 1000 arrivals a second. The extrapolation
    lands on the same point in five evaluations (the memo's filled rows): F at 0
    and at three iterates on the line, then at the point the line meets the
    diagonal."""
    from test_serving import toy_model, toy_srv

    m = toy_model()[0]
    d = make_device(peak_flops_per_s=1e18)[0]
    tiers = make_tiers((8, 1e11, 0.0), (0, 1e10, 0.0))
    s = toy_srv()[0]
    args = (m, d, tiers, toy_tiles, s, 1e-4, ks.kv_s_per_token(m, d, tiers, toy_tiles, s), ks.pair_s(m, d, s))
    for lam in (50.0, 400.0, 1000.0):
        rest = (lam, 255.0, 1.0, 1.0, 512.0, 256.0, 512.0, ks.prompt_pairs(512.0, 0.0))
        want, steps = plain_fixed_point(args, *rest)
        memo = ks.iterate_memo(ks.FIXED_POINT_ITERATIONS)
        got, converged = ks.poisson_fixed_point(memo, *args, *rest, 1e9, 1e12)
        evaluations = int(np.isfinite(memo[:, 6]).sum())
        assert converged and got == pytest.approx(want, rel=1e-11), lam
        assert evaluations == 5 < steps, (lam, evaluations, steps)


def test_catalog_poisson_rows_match_plain_iteration():
    """Every aggregated row of the catalog's Poisson space (Qwen3-235B on 8 H200, MoE,
    drafts, attention DP): the kernels' accelerated fixed point against the bench's
    plain-Python reference iterating plainly (``reference_row(accelerate=False)``): the
    same rows stable, and TTFT and TPOT within 1e-9 where they are; where they are not (the
    engine overloaded), the served rate, TPOT and batch of the engine run at its limit
    (``kernels.serving.saturated_t``) within 1e-12."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_serving.py"
    spec = importlib.util.spec_from_file_location("bench_serving", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    space = sp.load_serving("qwen3-235b-a22b-h200-8")
    base = serve.encode(space).columns
    cols = {k: np.ascontiguousarray(v[base["mode"] == ks.AGG]) for k, v in base.items()}
    packed = serve.pack_serving(space)
    srv = serve.serving_records(space, cols)
    out = serve.analytic(packed, srv, cols, serve.serving_records(space, cols, prefill=True))
    stable = overloaded = 0
    for i in range(len(cols["tp"])):
        if out["reason"][i] in (ks.WEIGHTS_OOM, ks.KV_TOO_SMALL):
            continue
        ref = bench.reference_row(packed, srv, cols, i, accelerate=False)
        assert ref["stable"] == (out["reason"][i] != ks.OVERLOADED), i
        if ref["stable"]:
            stable += 1
            assert out["ttft_s"][i] == pytest.approx(ref["ttft_s"], rel=1e-9), i
            assert out["tpot_s"][i] == pytest.approx(ref["tpot_s"], rel=1e-9), i
        else:
            overloaded += 1
            for key in ("requests_per_s", "tpot_s", "batch"):
                assert out[key][i] == pytest.approx(ref[key], rel=1e-12), (i, key)
            assert math.isinf(out["ttft_s"][i]) and out["requests_per_s"][i] < packed.workload[0].rate_per_s
    assert stable >= 20 and overloaded >= 20  # both kinds of row are compared
