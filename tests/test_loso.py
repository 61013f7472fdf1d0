"""Leave-one-source-out (``explorer.loso``) on toy data whose answer is known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from paraspace.explorer import loso

GRID = np.array([0.3, 0.4, 0.5, 0.6])


def toy(true_k: dict[str, float], family: dict[str, int] | None = None):
    """Two rows per source; a row's predicted time at knob k is c / k and its
    measured time c / k_source (the knob that source's runs imply)."""
    sources, measured, seconds, fam = [], [], [], []
    for s, k in true_k.items():
        for c in (1.0, 3.0):
            sources.append(s)
            measured.append(c / k)
            seconds.append(c / GRID)
            fam.append((family or {}).get(s, 0))
    return np.array(fam), np.array(seconds), np.array(measured), np.array(sources)


def test_every_source_agreeing_gives_exact_held_out_predictions():
    fam, sec, meas, src = toy({"a": 0.5, "b": 0.5, "c": 0.5})
    held = loso.leave_one_source_out(fam, sec, meas, src, np.ones(len(meas), bool))
    np.testing.assert_allclose(held, meas, rtol=1e-15)


def test_a_biased_source_moves_the_others_fit_by_hand():
    """A and B imply k = 0.5, C k = 0.6. The error of predicting at k a source whose
    runs imply k_s is |k_s / k - 1|. Without A: at 0.5 the sources' mean error is
    (0 + 0.2) / 2 = 0.1, at 0.6 (0.1667 + 0) / 2 = 0.0833: the fit takes 0.6, and A,
    held out, is off by 0.5 / 0.6 - 1 = -16.7%. B likewise. Without C the fit is
    0.5, and C is off by 0.6 / 0.5 - 1 = +20%."""
    fam, sec, meas, src = toy({"a": 0.5, "b": 0.5, "c": 0.6})
    held = loso.leave_one_source_out(fam, sec, meas, src, np.ones(len(meas), bool))
    err = held / meas - 1.0
    np.testing.assert_allclose(err[src == "a"], 0.5 / 0.6 - 1, rtol=1e-12)
    np.testing.assert_allclose(err[src == "b"], 0.5 / 0.6 - 1, rtol=1e-12)
    np.testing.assert_allclose(err[src == "c"], 0.6 / 0.5 - 1, rtol=1e-12)


def test_a_family_alone_takes_the_pooled_fit_and_unfitted_rows_do_not_fit():
    """D is the only source of family 1: held out, its family has nothing to fit on,
    so it takes the point fitted on the other families' sources (A, B: 0.4). Rows
    outside the fit set (``fit_rows`` false: C) are predicted but never fitted on."""
    fam, sec, meas, src = toy({"a": 0.4, "b": 0.4, "c": 0.6, "d": 0.3}, family={"d": 1})
    fit_rows = src != "c"
    held = loso.leave_one_source_out(fam, sec, meas, src, fit_rows)
    err = held / meas - 1.0
    np.testing.assert_allclose(err[src == "d"], 0.3 / 0.4 - 1, rtol=1e-12)
    np.testing.assert_allclose(err[src == "c"], 0.6 / 0.4 - 1, rtol=1e-12)
    np.testing.assert_allclose(err[src == "a"], 0.0, atol=1e-15)


def test_interpolation_is_exact_for_a_power_law():
    """Step time c / k is linear in log-log, so interpolating it between coarse knob
    values reproduces it exactly at the fine ones."""
    xs, fine = (0.4, 0.5, 0.7), (0.4, 0.45, 0.6, 0.7)
    coarse = np.array([[2.0 / x for x in xs]])
    out = loso.interpolate(coarse, xs, fine, axis=1)
    np.testing.assert_allclose(out[0], [2.0 / x for x in fine], rtol=1e-12)


@pytest.mark.parametrize("knob", loso.KNOBS)
def test_fine_grid_spans_the_coarse_one(knob):
    assert loso.FINE[knob][0] == loso.COARSE[knob][0] and loso.FINE[knob][-1] == loso.COARSE[knob][-1]


def test_a_knob_no_fit_row_exercises_keeps_its_prior():
    """A 2-D grid whose second knob changes no row's time (no FA1 row in the fit
    set): every value of it ties, and the fit keeps the prior's (index 2)."""
    fam, sec, meas, src = toy({"a": 0.5, "b": 0.5})
    cube = np.repeat(sec[:, :, None], 4, axis=2)
    assert loso.fit_index(cube, meas, src, prior=(0, 2)) == (2, 2)
    assert loso.fit_index(cube, meas, src) == (2, 0)


def test_the_flash1_prior_is_half_the_fa2_efficiency_by_hand():
    """FlashAttention-2 is about 2x the first-generation kernel (Dao 2023): the A100
    profile's FA2 plateau 0.70 gives an FA1 prior of 0.35, the H100's 0.36 gives 0.18.
    On the LOSO fine grid (0.10 + k x 0.4 / 18) those are k = 11.25 -> 11 (0.3444) and
    k = 3.6 -> 4 (0.1889), not the FA2 values' k = 27 -> off the grid's top (0.50,
    k = 18) and k = 11.7 -> 12."""
    from paraspace.explorer import fit_published

    assert fit_published.flash1_prior(0.70) == pytest.approx(0.35)
    assert fit_published.flash1_prior(0.36) == pytest.approx(0.18)
    priors = loso.knob_priors()
    assert list(fit_published.FAMILIES) == ["a100", "h100"]
    assert priors[0][1] == 11 and priors[1][1] == 4
    assert loso.FINE["attention_efficiency_flash1"][11] == pytest.approx(0.3444, abs=1e-4)
