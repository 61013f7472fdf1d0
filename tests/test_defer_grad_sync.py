"""ZeRO-3 with deferred gradient reduction (``defer_grad_sync``): the micro-batches'
gradients accumulate unsharded and are reduce-scattered once per step, as FSDP2's
``set_requires_gradient_sync(False)`` (FSDP1 ``no_sync``) on all but the last
micro-batch does. Memory holds the stage's whole gradient; the data-parallel
traffic loses m - 1 of its m gradient scatters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import analytic, evaluate, kernel_zero, pack
from paraspace.kernels import engine
from paraspace.kernels.codes import SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_ZB_H1, \
    ZERO_3_DEFERRED
from paraspace.spaces.catalog import space_from_raw
from paraspace.spaces.encode import Encoder
from test_pipeline import step

HERE = Path(__file__).parent


def space(**over):
    raw = {"name": "defer", "description": "ZeRO-3 deferred gradient reduction", "model": "llama3-8b",
           "hardware": "h100-sxm5-80gb", "devices": 8, "global_batch": 32, "seq_len": 2048,
           "dimensions": {"tp": [1], "pp": [1], "micro_batch": [1], "zero": [3], "defer_grad_sync": [False, True]}}
    raw.update(over)
    return space_from_raw(raw, "test", HERE)


def evaluated(sp):
    cols = Encoder(sp).encode_all().columns
    return cols, evaluate(pack(sp), cols)


def test_kernel_zero_codes_only_zero3_rows():
    assert kernel_zero(np.array([0, 1, 2, 3, 3], np.int8), np.array([1, 1, 1, 0, 1], np.int8)).tolist() == \
        [0, 1, 2, 3, ZERO_3_DEFERRED]
    assert kernel_zero(3, 1) == ZERO_3_DEFERRED and kernel_zero(2, 1) == 2


def test_memory_holds_the_whole_gradient():
    """Llama 3 8B, tp = pp = 1, dp = 8, m = 32 / 8 = 4 micro-batches. Its parameters by hand:
    embedding and head 2 x 128256 x 4096 = 1,050,673,152; per layer attention
    4096 x (4096 + 2 x 1024 + 4096) = 41,943,040, MLP 3 x 4096 x 14336 = 176,160,768,
    norms 2 x 4096 = 8,192, so 32 x 218,112,000 = 6,979,584,000; final norm 4,096:
    P = 8,030,261,248. fp32 gradients: deferred 4 P = 32,121,044,992 bytes; sharded
    4 P / 8 = 4,015,130,624. One stage, so the peak grows by exactly the difference."""
    cols, out = evaluated(space())
    assert cols["defer_grad_sync"].tolist() == [0, 1] and cols["n_microbatches"].tolist() == [4, 4]
    p = 8_030_261_248
    np.testing.assert_allclose(out["mem_grads_bytes"], [4 * p / 8, 4 * p], rtol=1e-12)
    np.testing.assert_allclose(out["mem_peak_bytes"][1] - out["mem_peak_bytes"][0], 4 * p - 4 * p / 8, rtol=1e-9)
    # weights and optimizer states stay sharded
    for key in ("mem_weights_bytes", "mem_optimizer_bytes", "mem_activations_bytes"):
        assert out[key][0] == out[key][1]


def test_exposed_traffic_loses_m_minus_one_scatters():
    """Llama 3 70B, dp = 64, one 512-token sequence per micro-batch: the gathers and
    scatters outlast the passes, so ZeRO-3 exposes m (2 G + S - t) and the deferred
    form 2 m G + S - m t: their difference is (m - 1) S. From m = 2 to m = 4 (global
    batch 128 -> 256) the difference triples (1 S -> 3 S) and the per-micro-batch
    form doubles."""
    dp = {}
    for gb in (128, 256):
        sp = space(model="llama3-70b", devices=64, global_batch=gb, seq_len=512)
        cols = Encoder(sp).encode_all().columns
        assert cols["n_microbatches"].tolist() == [gb // 64] * 2
        dp[gb] = analytic(pack(sp), cols)["dp_comm_s"]
        assert dp[gb][1] < dp[gb][0]
    saved2, saved4 = dp[128][0] - dp[128][1], dp[256][0] - dp[256][1]
    assert saved2 > 0
    np.testing.assert_allclose(saved4, 3 * saved2, rtol=1e-9)
    np.testing.assert_allclose(dp[256][0], 2 * dp[128][0], rtol=1e-9)


def test_one_scatter_per_chunk_in_the_event_graph():
    """Per device, ZeRO-3 gathers before every pass but the W ones and scatters after
    every gradient pass (m per chunk); deferred, after each chunk's last one only.
    p = 1, m = 4: 8 gathers + 4 scatters = 12 -> 8 + 1 = 9; 1F1B on p = 2: 2 x 12 ->
    2 x 9; interleaved, p = 2, v = 2: 2 x (16 + 8) -> 2 x (16 + 2); ZB-H1 (scatters
    after the W passes): 2 x 12 -> 2 x 9."""
    cases = [(SCHEDULE_GPIPE, 1, 1, 12, 9), (SCHEDULE_1F1B, 2, 1, 24, 18), (SCHEDULE_INTERLEAVED, 2, 2, 48, 36),
             (SCHEDULE_ZB_H1, 2, 1, 24, 18)]
    for schedule, p, v, every, deferred in cases:
        counts = []
        for zero in (3, ZERO_3_DEFERRED):
            s = step(schedule, p, v, 4, 100, 200, wgrad=80 if schedule == SCHEDULE_ZB_H1 else 0, zero=zero,
                     z3_gather_ns=5, z3_scatter_ns=7)
            assert s.status == 0
            counts.append(int((s.kind == engine.K_DP).sum()))
        assert counts == [every, deferred], schedule


def test_deferred_hand_example():
    """p = 1, GPipe, m = 4, t_f = 100, t_b = 200, gather 5 per pass, scatter 250 (longer
    than a backward). Deferred: the first gather [0, 5), F 4 x 100 to 405, B 4 x 200 to
    1205, the one scatter [1205, 1455): makespan 1455. Scattering every micro-batch
    queues four 250-long scatters one after another from the first backward's end
    (605): the step ends at 605 + 4 x 250 = 1605 at the earliest."""
    deferred = step(SCHEDULE_GPIPE, 1, 1, 4, 100, 200, zero=ZERO_3_DEFERRED, z3_gather_ns=5, z3_scatter_ns=250)
    assert deferred.makespan == 1455
    every = step(SCHEDULE_GPIPE, 1, 1, 4, 100, 200, zero=3, z3_gather_ns=5, z3_scatter_ns=250)
    assert every.makespan >= 605 + 4 * 250


def test_the_event_tier_sees_the_saving():
    """The simulated step of a deferred row is no longer than the same row scattering
    every micro-batch, and shorter where the scatters were exposed (8B, dp 64, 512-token
    sequences: short passes; the deferred gradient, 32 GB, still fits)."""
    _, out = evaluated(space(devices=64, global_batch=256, seq_len=512))
    assert out["simulated"].tolist() == [1.0, 1.0]
    assert out["dp_comm_s"][1] < out["dp_comm_s"][0]
    assert out["step_time_s"][1] < out["step_time_s"][0]


def test_sweep_writes_the_dimension_and_explains_the_rule(tmp_path):
    """End to end: a TOML space with zero 2 and 3 and defer_grad_sync both ways; the
    sweep keeps deferral on the ZeRO-3 rows only (ZeRO-2 deferral is charged to
    defer_without_accumulation) and writes the column."""
    toml = tmp_path / "defer.toml"
    toml.write_text('name = "defer"\ndescription = "deferral"\nmodel = "llama3-8b"\nhardware = "h100-sxm5-80gb"\n'
                    'devices = 8\nglobal_batch = 32\nseq_len = 2048\n[dimensions]\ntp = [1]\npp = [1]\n'
                    'micro_batch = [1]\nzero = [2, 3]\ndefer_grad_sync = [false, true]\n')
    out = tmp_path / "out" / "defer.parquet"
    result = CliRunner().invoke(main, ["sweep", str(toml), "--out", str(out), "--no-progress", "--explain"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "defer_without_accumulation" in result.output
    frame = pl.read_parquet(out).sort("zero", "defer_grad_sync")
    assert frame.select("zero", "defer_grad_sync").rows() == [(2, False), (3, False), (3, True)]
    grads = frame["mem_grads_bytes"].to_list()
    assert grads[2] == 8 * grads[1]  # dp 8: the deferred gradient is the unsharded one
