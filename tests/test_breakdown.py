"""The closed-form step-time breakdown adds up: the ``results.schema.STEP_PARTS``
columns sum to ``step_time_analytic_s`` on every row (MoE expert-parallel
traffic in ``ep_comm_s``, DualPipe's two-stages-per-device credit in
``dualpipe_credit_s``)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.explorer.evaluate import analytic, pack
from paraspace.results.schema import BY_NAME, STEP_PARTS
from paraspace.spaces import catalog
from paraspace.spaces.encode import Encoder
from paraspace.spaces.enums import Schedule
from widened import SPACES, wide

def parts_sum(metrics: dict[str, np.ndarray]) -> np.ndarray:
    return sum(metrics[name] for name in STEP_PARTS)


@functools.cache
def catalog_rows(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every candidate of a catalog space and its analytic columns."""
    space = catalog.load_space(name)
    enc = Encoder(space).encode_all()
    return enc.columns, analytic(pack(space), enc.columns)


def test_every_part_is_a_seconds_column_and_step_time_names_them():
    assert len(set(STEP_PARTS)) == len(STEP_PARTS)
    assert all(BY_NAME[name].unit == "s" for name in STEP_PARTS)
    assert " + ".join(STEP_PARTS) in BY_NAME["step_time_analytic_s"].doc


def test_parts_add_up_on_every_row_of_every_catalog_space():
    seen = {"moe": 0, "dualpipe": 0}
    for name in SPACES:
        cols, metrics = catalog_rows(name)
        np.testing.assert_allclose(parts_sum(metrics), metrics["step_time_analytic_s"], rtol=1e-9, err_msg=name)
        dualpipe = cols["schedule"] == Schedule.DUALPIPE
        assert np.all(metrics["dualpipe_credit_s"][~dualpipe] == 0.0), name
        assert np.all(metrics["dualpipe_credit_s"][dualpipe] <= 0.0), name
        seen["moe"] += int(np.count_nonzero(metrics["ep_comm_s"] > 0))
        seen["dualpipe"] += int(np.count_nonzero(metrics["dualpipe_credit_s"] < 0))
    assert seen["moe"] > 0 and seen["dualpipe"] > 0  # the MoE and DualPipe terms were exercised


def test_dualpipe_credit_of_two_stages_is_half_their_difference():
    """pp = 2 on a dense model: the one device pair runs stage 0 and stage 1, so its steady work is
    m (t0 + t1) / 2 against the m t_max the parts count: the credit is -m (t_max - t_min) / 2. 1F1B on
    the same row gives m t_max (compute + TP) and, with two stages, a bubble of t_min."""
    space = catalog.load_space("llama3-8b-h100-64")
    encoder, packed = Encoder(space), pack(space)
    rows = {}
    for schedule in (Schedule.ONE_F_ONE_B, Schedule.DUALPIPE):
        cols = {k: v[:1].copy() for k, v in encoder.encode_all().columns.items()}
        cols.update(tp=np.array([8], np.int32), pp=np.array([2], np.int32), dp=np.array([4], np.int32),
                    schedule=np.array([schedule], np.int8), n_microbatches=np.array([8], np.int32))
        rows[schedule] = {k: float(v[0]) for k, v in analytic(packed, cols).items()}
    one, dual = rows[Schedule.ONE_F_ONE_B], rows[Schedule.DUALPIPE]
    m = 8
    t_max = (one["compute_s"] + one["tp_comm_s"]) / m
    t_min = one["bubble_s"]
    assert t_max > t_min > 0
    assert dual["dualpipe_credit_s"] == pytest.approx(-m * (t_max - t_min) / 2, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(SPACES), seed=st.integers(0, 2**32 - 1))
def test_parts_add_up_on_random_rows_of_widened_catalog_spaces(name, seed):
    """Every schedule, recompute mode, optimizer, offload, ZeRO stage and dispatch on each catalog
    space's model, hardware and workload: 2000 random combinations, of which some 100 are valid."""
    encoder, packed = wide(name)
    enc = encoder.encode_ids(np.unique(np.random.default_rng(seed).integers(0, encoder.n_combinations, 2000)))
    assert enc.n_rows > 0
    metrics = analytic(packed, enc.columns)
    np.testing.assert_allclose(parts_sum(metrics), metrics["step_time_analytic_s"], rtol=1e-9)
