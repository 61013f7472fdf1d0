"""Uncertainty bands (``explorer.bands``): classes, quantiles and coverage by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.explorer import bands

DENSE = bands.RowTraits(moe=False, family="h100", pipelined=False, gpus=8)
MOE = bands.RowTraits(moe=True, family="h100", pipelined=True, gpus=256)


def test_classes_run_from_finest_to_all():
    assert bands.class_keys(DENSE) == ("dense/h100/nopp/small", "dense/h100", "dense", "all")
    assert bands.class_keys(MOE) == ("moe/h100/pp/large", "moe/h100", "moe", "all")


def test_a_class_needs_enough_residuals_and_the_band_falls_back():
    """21 dense residuals -0.10, -0.09, ..., +0.10: the split-conformal bounds are the
    floor(22 x 0.1) = 2nd smallest, -0.09, and the ceil(22 x 0.9) = ceil(19.8) = 20th,
    +0.09. 3 MoE residuals are too few for a class of their own: an MoE row takes the
    "all" class of 24 residuals (floor(2.5) = 2nd: -0.09; ceil(22.5) = 23rd: +0.6)."""
    dense = np.round(np.arange(-0.10, 0.1001, 0.01), 10)
    res = np.concatenate([dense, [0.5, 0.6, 0.7]])
    traits = [DENSE] * 21 + [MOE] * 3
    table = bands.fit(res, traits)
    assert table["dense"] == (pytest.approx(-0.09, abs=1e-12), pytest.approx(0.09, abs=1e-12), 21)
    assert "moe" not in table and table["all"] == (pytest.approx(-0.09, abs=1e-12), pytest.approx(0.6), 24)
    lo, hi = bands.band(table, DENSE, 2.0)
    assert (lo, hi) == (pytest.approx(2.0 * math.exp(-0.09), rel=1e-12), pytest.approx(2.0 * math.exp(0.09), rel=1e-12))
    lo, hi = bands.band(table, MOE, 1.0)
    assert (math.log(lo), math.log(hi)) == (pytest.approx(table["all"][0]), pytest.approx(table["all"][1]))


def test_coverage_is_measured_on_sources_left_out():
    """Two sources of 20 residuals: A's spread -0.05..+0.05, B's -0.5..+0.5. B's
    band is fitted on A only (its 2nd and 19th of 20, about +-0.045): 2 of B's 20
    inside. A's band from B alone (about +-0.45) covers all of A. 22 of 40 = 55%."""
    a = np.linspace(-0.05, 0.05, 20)
    b = np.linspace(-0.5, 0.5, 20)
    res = np.concatenate([a, b])
    sources = np.array(["A"] * 20 + ["B"] * 20)
    cov = bands.coverage(res, [DENSE] * 40, sources)
    lo_a, hi_a = np.sort(a)[1], np.sort(a)[18]  # floor(21 x 0.1) = 2nd, ceil(21 x 0.9) = 19th
    expected_b = int(np.sum((b >= lo_a) & (b <= hi_a)))
    assert expected_b == 2
    assert cov == {"n": 40, "coverage": pytest.approx((20 + expected_b) / 40, rel=1e-12)}


def test_coverage_counts_only_sources_another_source_can_judge():
    """One source alone has no band fitted without it: its rows are not counted (no
    error). Beside a second source each is judged by the other's band: B's from A's
    0.1 and 0.3 (n = 2: the 1st and the 2nd) is [0.1, 0.3], B's 0.2 inside; A's from
    B's one residual is [0.2, 0.2], neither of A's inside: 1 of 3."""
    alone = bands.coverage(np.array([0.1, 0.2]), [DENSE] * 2, np.array(["A", "A"]))
    assert alone["n"] == 0 and math.isnan(alone["coverage"])
    cov = bands.coverage(np.array([0.1, 0.3, 0.2]), [DENSE] * 3, np.array(["A", "A", "B"]))
    assert cov == {"n": 3, "coverage": pytest.approx(1 / 3)}


def test_the_committed_table_loads_and_has_an_all_class():
    table = bands.load()
    assert "all" in table
    lo, hi, n = table["all"]
    assert lo < 0.0 < hi and n >= 100


def test_toml_round_trip(tmp_path):
    table = {"all": (-0.2, 0.15, 30), "dense": (-0.1, 0.1, 20)}
    path = tmp_path / "b.toml"
    path.write_text(bands.to_toml(table, "made by a test\nsecond line"))
    assert path.read_text().startswith("# made by a test\n# second line\n")
    assert bands.load(path) == table


def test_every_evaluated_row_carries_its_class_band():
    """llama3-8b on 64 H100: dense, H100 family, 64 GPUs (small). A row without a
    pipeline takes "dense/h100/nopp/small"; a pipelined one has no class of its own
    in the table and takes "dense/h100". lo = t exp(q10), hi = t exp(q90)."""
    from paraspace.explorer.evaluate import evaluate, pack
    from paraspace.spaces.catalog import load_space
    from paraspace.spaces.encode import Encoder

    space = load_space("llama3-8b-h100-64")
    enc = Encoder(space).encode(0, 4000)
    out = evaluate(pack(space), enc.columns, simulate=False)
    table = bands.committed()
    for pp, key in ((1, "dense/h100/nopp/small"), (2, "dense/h100/pp/small")):
        rows = enc.columns["pp"] == pp
        assert rows.any()
        cls = key if key in table else "dense/h100"
        lo, hi, _ = table[cls]
        np.testing.assert_allclose(out["step_time_lo_s"][rows], out["step_time_s"][rows] * math.exp(lo), rtol=1e-15)
        np.testing.assert_allclose(out["step_time_hi_s"][rows], out["step_time_s"][rows] * math.exp(hi), rtol=1e-15)
    assert np.all(out["step_time_lo_s"] < out["step_time_s"]) and np.all(out["step_time_s"] < out["step_time_hi_s"])


@pytest.mark.parametrize("n", [12, 30, 229])
def test_conformal_bounds_cover_at_least_80_percent_of_exchangeable_draws(n):
    """The split-conformal guarantee, checked by simulation: with n residuals drawn
    from one distribution, a new draw falls inside (lo, hi) with probability at least
    0.8: the new draw's rank R among the n + 1 is uniform, and it lies between the
    k_lo-th and k_hi-th of the n old ones when k_lo < R <= k_hi, so exactly
    (k_hi - k_lo) / (n + 1): n = 12: (12 - 1) / 13 = 84.6%; n = 30: (28 - 3) / 31 = 80.6%;
    n = 229: (207 - 23) / 230 = 80.0%."""
    rng = np.random.default_rng(n)
    inside = 0
    trials = 4000
    for _ in range(trials):
        xs = rng.standard_normal(n + 1)
        lo, hi = bands.conformal_bounds(xs[:n])
        inside += lo <= xs[n] <= hi
    k_lo, k_hi = math.floor((n + 1) * 0.1), min(math.ceil((n + 1) * 0.9), n)
    exact = (k_hi - k_lo) / (n + 1)
    assert exact >= 0.8
    assert inside / trials == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / trials))


def test_equal_weights_give_the_split_conformal_order_statistics():
    """Weighted bounds with every weight equal are the plain split-conformal ones, for
    every class size up to 259: the floor((n + 1) 0.1)-th and ceil((n + 1) 0.9)-th
    smallest, clipped to 1 .. n (n = 229: the 23rd and the 207th)."""
    for n in range(1, 260):
        xs = np.random.default_rng(n).standard_normal(n)
        s = np.sort(xs)
        k_lo = min(max(math.floor((n + 1) * 0.1), 1), n)
        k_hi = min(max(math.ceil((n + 1) * 0.9), 1), n)
        assert bands.conformal_bounds(xs) == (s[k_lo - 1], s[k_hi - 1]), n
        assert bands.conformal_bounds(xs, np.full(n, 0.37)) == (s[k_lo - 1], s[k_hi - 1]), n


def test_every_source_weighs_the_same_in_a_class():
    """Source A: 20 residuals -0.05..+0.05; source B: 4 residuals -0.4, -0.3, +0.3,
    +0.4. Each source weighs 1/2: A's rows 1/40 each, B's 1/8 each. n = 24, so
    lo's level is (0.1 x 25 - 1) / 24 = 0.0625 and hi's 0.9 x 25 / 24 = 0.9375.
    Sorted, the weight below -0.4 is 0 (<= 0.0625) and below -0.3 is 0.125, so
    lo = -0.4; the weight at or below +0.3 is 1/8 + 1/8 + 20/40 + 1/8 = 0.875 and at
    or below +0.4 is 1, so hi = +0.4. Unweighted the 2nd and 23rd of 24 give -0.3 and
    +0.3: A's 20 tight rows would set the band a new source is judged by."""
    a = np.linspace(-0.05, 0.05, 20)
    b = np.array([-0.4, -0.3, 0.3, 0.4])
    res = np.concatenate([a, b])
    sources = np.array(["A"] * 20 + ["B"] * 4)
    np.testing.assert_allclose(bands.source_weights(sources), [1 / 20] * 20 + [1 / 4] * 4)
    assert bands.conformal_bounds(res, bands.source_weights(sources)) == (-0.4, 0.4)
    assert bands.conformal_bounds(res) == (-0.3, 0.3)
    assert bands.fit(res, [DENSE] * 24, sources)["dense"] == (-0.4, 0.4, 24)
    assert bands.fit(res, [DENSE] * 24)["dense"] == (-0.3, 0.3, 24)


@given(st.lists(st.tuples(st.floats(-2, 2, allow_nan=False), st.sampled_from("ABCD")), min_size=1, max_size=60),
       st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_weighted_bounds_are_residuals_in_order_whatever_the_row_order(rows, rnd):
    """For any residuals and sources: lo <= hi, both are residuals of the class, and
    shuffling the rows changes neither."""
    xs = np.array([r for r, _ in rows])
    w = bands.source_weights([s for _, s in rows])
    lo, hi = bands.conformal_bounds(xs, w)
    assert lo <= hi and lo in xs and hi in xs
    order = list(range(len(rows)))
    rnd.shuffle(order)
    assert bands.conformal_bounds(xs[order], w[order]) == (lo, hi)


TRAITS = st.builds(bands.RowTraits, moe=st.booleans(), family=st.sampled_from(["a100", "h100", "other"]),
                   pipelined=st.booleans(), gpus=st.sampled_from([8, 64, 512]))


@given(st.lists(st.tuples(st.floats(-1, 1, allow_nan=False), TRAITS, st.sampled_from("ABC")), max_size=40))
@settings(max_examples=150, deadline=None)
def test_coverage_of_any_residuals_is_a_share_of_the_rows_another_source_judges(rows):
    """For any residuals, traits and sources: no error; n counts the rows of sources
    that have another source beside them, and the coverage is a share of those."""
    res = np.array([r for r, _, _ in rows])
    traits = [t for _, t, _ in rows]
    sources = np.array([s for _, _, s in rows])
    cov = bands.coverage(res, traits, sources)
    judged = sum(1 for s in sources if (sources != s).any())
    assert cov["n"] == judged
    if judged:
        assert 0.0 <= cov["coverage"] <= 1.0
    else:
        assert math.isnan(cov["coverage"])
