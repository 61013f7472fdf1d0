"""Uncertainty bands (``explorer.bands``): classes, quantiles and coverage by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paraspace.explorer import bands

DENSE = bands.RowTraits(moe=False, family="h100", pipelined=False, gpus=8)
MOE = bands.RowTraits(moe=True, family="h100", pipelined=True, gpus=256)


def test_classes_run_from_finest_to_all():
    assert bands.class_keys(DENSE) == ("dense/h100/nopp/small", "dense/h100", "dense", "all")
    assert bands.class_keys(MOE) == ("moe/h100/pp/large", "moe/h100", "moe", "all")


def test_a_class_needs_enough_residuals_and_the_band_falls_back():
    """21 dense residuals -0.10, -0.09, ..., +0.10: q10 = -0.08, q90 = +0.08 (numpy's
    linear quantile: position 0.1 x 20 = 2). 3 MoE residuals are too few for a class
    of their own: an MoE row takes the "all" class of 24 residuals."""
    dense = np.round(np.arange(-0.10, 0.1001, 0.01), 10)
    res = np.concatenate([dense, [0.5, 0.6, 0.7]])
    traits = [DENSE] * 21 + [MOE] * 3
    table = bands.fit(res, traits)
    assert table["dense"] == (pytest.approx(-0.08, abs=1e-12), pytest.approx(0.08, abs=1e-12), 21)
    assert "moe" not in table and table["all"][2] == 24
    lo, hi = bands.band(table, DENSE, 2.0)
    assert (lo, hi) == (pytest.approx(2.0 * math.exp(-0.08), rel=1e-12), pytest.approx(2.0 * math.exp(0.08), rel=1e-12))
    lo, hi = bands.band(table, MOE, 1.0)
    assert (math.log(lo), math.log(hi)) == (pytest.approx(table["all"][0]), pytest.approx(table["all"][1]))


def test_coverage_is_measured_on_sources_left_out():
    """Two sources of 20 residuals: A's spread -0.05..+0.05, B's -0.5..+0.5. B's
    band is fitted on A only (about +-0.04): 2 of B's 20 inside. A's band from
    B alone (about +-0.4) covers all of A. 22 of 40 = 55%."""
    a = np.linspace(-0.05, 0.05, 20)
    b = np.linspace(-0.5, 0.5, 20)
    res = np.concatenate([a, b])
    sources = np.array(["A"] * 20 + ["B"] * 20)
    cov = bands.coverage(res, [DENSE] * 40, sources)
    lo_a, hi_a = np.quantile(a, bands.QUANTILES)
    expected_b = int(np.sum((b >= lo_a) & (b <= hi_a)))
    assert expected_b == 2
    assert cov == {"n": 40, "coverage": pytest.approx((20 + expected_b) / 40, rel=1e-12)}


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
