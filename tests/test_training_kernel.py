"""The analytic training kernel (``kernels.training``): golden numbers from the
literature and by hand, the naive reference on seeded random candidates, and
the invariants of modeling.md section 9 as hypothesis properties."""

from __future__ import annotations

import math

import naive
from rows import COLUMNS, DEFAULTS, columns
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from paraspace.kernels import params
from paraspace.kernels.codes import (
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
    RECOMPUTE_SELECTIVE_OPS,
    SCHEDULE_1F1B,
    SCHEDULE_GPIPE,
    SCHEDULE_INTERLEAVED,
    SCHEDULE_ZB_H1,
)
from paraspace.kernels.training import (
    N_OUT,
    OUTPUTS,
    activation_bytes_per_layer,
    evaluate_one,
    evaluate_rows,
    in_flight_chunks,
    layer_params,
)

PROPS = settings(max_examples=60, deadline=None)

BASE = {**DEFAULTS, "schedule": SCHEDULE_1F1B, "recompute": RECOMPUTE_NONE}
TIME_FIELDS = ("step_time_analytic_s", "compute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
               "optimizer_s", "recompute_s", "stage_fwd_s", "stage_bwd_s")
PARTS = ("compute_s", "tp_comm_s", "cp_comm_s", "bubble_s", "pp_comm_s", "dp_comm_s", "optimizer_s")


def strategy(**changes: int) -> dict[str, int]:
    unknown = set(changes) - set(BASE)
    if unknown:
        raise ValueError(f"unknown strategy keys {sorted(unknown)}")
    return {**BASE, **changes}


def run_rows(strategies, model, dev, tiers, tiles, work) -> list[dict[str, float]]:
    """``evaluate_rows`` over a list of strategy dicts; one {OUTPUTS name: value} per row."""
    cols = columns(strategies, BASE)
    out = evaluate_rows(*cols, model, dev, tiers, tiles, work)
    return [dict(zip(OUTPUTS, (float(x) for x in row))) for row in out]


def run(model, dev, tiers, tiles, work, **changes: int) -> dict[str, float]:
    return run_rows([strategy(**changes)], model, dev, tiers, tiles, work)[0]


def run_naive(s, model, dev, tiers, tiles, work) -> dict[str, float]:
    return naive.evaluate_one(s, naive.fields(model), naive.fields(dev), naive.tier_list(tiers),
                              naive.tile_list(tiles), naive.fields(work))


def _tiers(*levels) -> np.ndarray:
    return params.tier_table(levels)


def _model(**values: float) -> np.ndarray:
    base = dict(layers=32.0, hidden=4096.0, heads=32.0, kv_heads=8.0, head_dim=128.0, ffn=14336.0, vocab=128256.0,
                glu=1.0, bias=0.0, tied_embeddings=0.0, dropout=0.0)
    base.update(values)
    return params.record(params.MODEL, **base)


# --------------------------------------------------------------------------- parameters


def test_llama3_parameter_counts(llama3_8b, llama3_70b):
    """Whole-model counts on one device (t = 1, untied): L * layer + 2 V h + h
    (embedding, output matrix, final norm). Hugging Face reports
    8,030,261,248 for Llama-3-8B and 70,553,706,496 for Llama-3-70B.
    8B layer: 4096 (4096 + 2*1024) + 4096^2 + 3 * 4096 * 14336 + 2 * 4096 = 218,112,000."""
    assert layer_params(llama3_8b[0], 1.0) == 218_112_000
    for model, total in ((llama3_8b, 8_030_261_248), (llama3_70b, 70_553_706_496)):
        m = model[0]
        assert m["layers"] * layer_params(m, 1.0) + 2 * m["vocab"] * m["hidden"] + m["hidden"] == total


def test_gpt3_layer_parameters(gpt3_175b):
    """GPT with biases (Narayanan et al. 2021, eq. for P): 12 h^2 + 13 h per layer.
    Under TP t the 12 h^2 weights and the 7 h column-parallel biases (QKV 3h,
    MLP up 4h) split; the 6 h of norm weights/biases and row-parallel biases stay."""
    m = gpt3_175b[0]
    h = 12288.0
    assert layer_params(m, 1.0) == 12 * h**2 + 13 * h
    for t in (2.0, 4.0, 8.0):
        assert layer_params(m, t) == pytest.approx((12 * h**2 + 7 * h) / t + 6 * h, rel=1e-15)


def test_layer_params_matches_naive():
    rng = np.random.default_rng(20240701)
    for _ in range(300):
        model = _random_model(rng)
        t = float(rng.choice([1, 2, 4, 8]))
        assert layer_params(model[0], t) == pytest.approx(naive.layer_params(naive.fields(model), t), rel=1e-13)


# --------------------------------------------------------------------------- activations


SBH = 2048.0 * 12288.0  # GPT-3: s = 2048, b = 1, h = 12288, a = 96; 5 a s / h = 80


@pytest.mark.parametrize(("t", "sp", "recompute", "per_sbh"), [
    # Korthikanti et al. 2022, eq. 2 / table 2, ab = 2, f = 4h, dropout, no flash
    (1.0, False, RECOMPUTE_NONE, 34 + 80),  # 34 + 5as/h
    (8.0, False, RECOMPUTE_NONE, 10 + 24 / 8 + 80 / 8),  # 10 + 24/t + 5as/(ht) = 23
    (8.0, True, RECOMPUTE_NONE, (34 + 80) / 8),  # (34 + 5as/h) / t = 14.25
    (8.0, False, RECOMPUTE_SELECTIVE, 10 + 24 / 8),  # the 5as/h term dropped: 13
    (8.0, True, RECOMPUTE_SELECTIVE, 34 / 8),  # 4.25
    (8.0, False, RECOMPUTE_FULL, 2.0),  # the layer input, 2sbh
    (8.0, True, RECOMPUTE_FULL, 2.0 / 8),  # split by SP
    (1.0, False, RECOMPUTE_FULL, 2.0),
])
def test_korthikanti_activation_memory(gpt3_175b, t, sp, recompute, per_sbh):
    """s b h = 25,165,824; e.g. t = 8 without SP: 23 sbh = 578,813,952 bytes,
    with SP 14.25 sbh = 358,612,992 bytes."""
    got = activation_bytes_per_layer(1.0, 2048.0, t, 1.0, sp, recompute, False, gpt3_175b[0], 2.0)
    assert got == pytest.approx(per_sbh * SBH, rel=1e-14)


def test_korthikanti_spot_values(gpt3_175b):
    m = gpt3_175b[0]
    assert activation_bytes_per_layer(1.0, 2048.0, 8.0, 1.0, False, RECOMPUTE_NONE, False, m, 2.0) == 578_813_952
    assert activation_bytes_per_layer(1.0, 2048.0, 8.0, 1.0, True, RECOMPUTE_NONE, False, m, 2.0) == 358_612_992


@pytest.mark.parametrize("sp", [False, True])
def test_flash_keeps_log_sum_exp_instead_of_scores(gpt3_175b, sp):
    """FlashAttention stores no s x s matrix, only the fp32 log-sum-exp per
    query row and head: selective activations + 4 * b * (a/t) * s bytes."""
    m = gpt3_175b[0]
    for recompute in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE):
        got = activation_bytes_per_layer(2.0, 2048.0, 8.0, 1.0, sp, recompute, True, m, 2.0)
        selective = activation_bytes_per_layer(2.0, 2048.0, 8.0, 1.0, sp, RECOMPUTE_SELECTIVE, False, m, 2.0)
        assert got == pytest.approx(selective + 4 * 2 * 12 * 2048, rel=1e-14)


@pytest.mark.parametrize("recompute", [RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL])
@pytest.mark.parametrize("flash", [False, True])
def test_context_parallel_halves_activations(gpt3_175b, recompute, flash):
    """CP splits the queries (and the rows of the scores) across c ranks."""
    one = activation_bytes_per_layer(1.0, 4096.0, 4.0, 1.0, True, recompute, flash, gpt3_175b[0], 2.0)
    two = activation_bytes_per_layer(1.0, 4096.0, 4.0, 2.0, True, recompute, flash, gpt3_175b[0], 2.0)
    assert two == pytest.approx(one / 2, rel=1e-14)


def test_activations_match_naive():
    rng = np.random.default_rng(20240702)
    for _ in range(400):
        model = _random_model(rng)
        b, s = float(rng.integers(1, 9)), float(rng.choice([512, 1024, 2048, 4096, 8192]))
        t, c = float(rng.choice([1, 2, 4, 8])), float(rng.choice([1, 2, 4]))
        sp, flash = bool(rng.integers(2)), bool(rng.integers(2))
        recompute, ab = int(rng.integers(5)), float(rng.choice([1.0, 2.0, 4.0]))
        got = activation_bytes_per_layer(b, s, t, c, sp, recompute, flash, model[0], ab)
        ref = naive.activation_bytes_per_layer(b, s, t, c, sp, recompute, flash, naive.fields(model), ab)
        assert got == pytest.approx(ref, rel=1e-13)


# --------------------------------------------------------------------------- pipeline in-flight


def test_in_flight_1f1b():
    """1F1B: stage i holds p - i micro-batches (at most m); GPipe holds all m."""
    assert [in_flight_chunks(SCHEDULE_1F1B, 8.0, 1.0, 32.0, float(i)) for i in range(8)] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert in_flight_chunks(SCHEDULE_1F1B, 8.0, 1.0, 4.0, 0.0) == 4.0
    assert in_flight_chunks(SCHEDULE_GPIPE, 8.0, 1.0, 32.0, 3.0) == 32.0


@pytest.mark.parametrize(("p", "v"), [(4.0, 2.0), (8.0, 3.0), (2.0, 4.0), (16.0, 2.0)])
def test_in_flight_interleaved_first_stage(p, v):
    """Narayanan et al. 2021, section 2.2: stage 0 holds p (1 + (p-1)/(p v))
    stage-equivalents: 2 (p - 1) + (v - 1) p + 1 chunks of 1/v of a stage.
    p = 4, v = 2: 6 + 4 + 1 = 11 chunks = 5.5 = 4 * (1 + 3/8)."""
    chunks = in_flight_chunks(SCHEDULE_INTERLEAVED, p, v, 64.0, 0.0)
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)), rel=1e-15)
    if (p, v) == (4.0, 2.0):
        assert chunks == 11.0


def test_in_flight_interleaved_last_stage_and_cap():
    """Last stage: (v - 1) p + 1; never more than m v chunks (all micro-batches)."""
    assert in_flight_chunks(SCHEDULE_INTERLEAVED, 4.0, 2.0, 64.0, 3.0) == 5.0
    assert in_flight_chunks(SCHEDULE_INTERLEAVED, 4.0, 2.0, 2.0, 0.0) == 4.0


def test_in_flight_matches_naive():
    rng = np.random.default_rng(20240703)
    for _ in range(300):
        schedule, p, v = int(rng.integers(3)), float(rng.integers(1, 33)), float(rng.integers(1, 6))
        m, stage = float(rng.integers(1, 128)), float(rng.integers(0, 32))
        stage = min(stage, p - 1)
        assert in_flight_chunks(schedule, p, v, m, stage) == naive.in_flight_chunks(schedule, p, v, m, stage)


# --------------------------------------------------------------------------- whole-step golden numbers


@pytest.fixture(scope="module")
def h100_8b(h100, llama3_8b, make_workload):
    """Llama 3 8B on H100s, s = 4096, bf16 with fp32 grads and Adam."""
    return llama3_8b, h100.device, h100.tiers, h100.tiles, make_workload(global_batch=64.0)


@pytest.mark.parametrize("d", [2, 4, 8, 64])
def test_distributed_optimizer_bytes_per_param(h100_8b, d):
    """Megatron's distributed optimizer: 2 (bf16 weight) + 4 (fp32 grad) + 12
    (fp32 master, m, v) = 18 bytes/param unsharded, 6 + 12/d with ZeRO-1;
    ZeRO-2 also shards the gradient: 2 + 16/d. One device holds the whole
    8B model here: P = 8,030,261,248."""
    model, dev, tiers, tiles, work = h100_8b
    p_total = 8_030_261_248
    expected = {0: 18.0, 1: 6 + 12 / d, 2: 2 + 16 / d}
    for zero, per_param in expected.items():
        out = run(model, dev, tiers, tiles, work, dp=d, zero=zero)
        states = out["mem_weights_bytes"] + out["mem_grads_bytes"] + out["mem_optimizer_bytes"]
        assert states == pytest.approx(per_param * p_total, rel=1e-14), zero
    out = run(model, dev, tiers, tiles, work, dp=d, zero=0)
    assert out["mem_weights_bytes"] == 2 * p_total


def test_zero3_weights(h100_8b):
    """ZeRO-3 keeps 1/d of the weights plus two gathered layers (the current
    and the prefetched one): 2 P / d + 2 * 2 * 218,112,000 bytes."""
    model, dev, tiers, tiles, work = h100_8b
    out = run(model, dev, tiers, tiles, work, dp=8, zero=3)
    assert out["mem_weights_bytes"] == pytest.approx(2 * 8_030_261_248 / 8 + 4 * 218_112_000, rel=1e-14)


def test_model_flop_and_throughput(h100_8b):
    """Causal Llama 3 8B, s = 4096, one sequence forward:
    32 * (2 s * 218,103,808 + 2 s^2 * 4096) + 2 s h V
    = 61,572,651,155,456 + 4,303,557,230,592 = 65,876,208,386,048 FLOP;
    x3 (forward + backward) = 197,628,625,158,144 per sequence (cf. 6 N s = 1.9735e14)."""
    model, dev, tiers, tiles, work = h100_8b
    out = run(model, dev, tiers, tiles, work, dp=8, n_micro=8)
    assert out["model_flop_per_step"] == pytest.approx(64 * 197_628_625_158_144, rel=1e-14)
    assert out["tokens_per_s_per_gpu"] * out["step_time_analytic_s"] * 8 == pytest.approx(64 * 4096, rel=1e-13)
    assert out["mfu"] == pytest.approx(out["model_flop_per_step"] / (out["step_time_analytic_s"] * 8 * 989.4e12), rel=1e-13)
    assert 0.0 < out["mfu"] < 1.0


def test_single_device_is_sequential(h100_8b):
    """No parallelism: no communication, no bubble; step = compute + optimizer."""
    model, dev, tiers, tiles, work = h100_8b
    out = run(model, dev, tiers, tiles, work, n_micro=4)
    for name in ("tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s"):
        assert out[name] == 0.0, name
    assert out["step_time_analytic_s"] == pytest.approx(out["compute_s"] + out["optimizer_s"], rel=1e-15)
    assert out["compute_s"] == pytest.approx(4 * (out["stage_fwd_s"] + out["stage_bwd_s"]), rel=1e-15)


def test_pipeline_p2p_by_hand(make_device, toy_tiles, make_workload):
    """pp = 4 on one 100 GB/s tier, b s = 4096 tokens of h = 4096 in bf16:
    one activation message 4096 * 4096 * 2 B = 32 MiB -> 335.54432 us;
    2 (p - 1) = 6 exposed hops = 2.01326592 ms; interleaving (v = 2) doubles it."""
    model, tiers = _model(), _tiers((0.0, 100e9, 0.0))
    work = make_workload(global_batch=8.0)
    args = (model, make_device(), tiers, toy_tiles, work)
    plain = run(*args, pp=4, n_micro=8)
    inter = run(*args, pp=4, n_micro=8, vpp=2, schedule=SCHEDULE_INTERLEAVED)
    assert plain["pp_comm_s"] == pytest.approx(2.01326592e-3, rel=1e-14)
    assert inter["pp_comm_s"] == pytest.approx(2 * 2.01326592e-3, rel=1e-14)


@pytest.fixture(scope="module")
def even_stages(make_device, toy_tiles, make_workload):
    """Near-equal stages: vocab 8 makes the embedding and head negligible,
    bandwidth 1e30 and no latency make communication vanish."""
    model = _model(vocab=8.0)
    tiers = _tiers((0.0, 1e30, 0.0))
    return model, make_device(), tiers, toy_tiles, make_workload(global_batch=64.0)


@pytest.mark.parametrize("m", [1, 4, 8, 32])
def test_1f1b_bubble_fraction(even_stages, m):
    """GPipe and 1F1B: bubble / pipeline time = (p - 1) / (m + p - 1)."""
    p = 4
    for schedule in (SCHEDULE_GPIPE, SCHEDULE_1F1B):
        out = run(*even_stages, pp=p, n_micro=m, schedule=schedule)
        busy = out["compute_s"] + out["tp_comm_s"] + out["cp_comm_s"]
        assert out["bubble_s"] / (busy + out["bubble_s"]) == pytest.approx((p - 1) / (m + p - 1), rel=2e-3)


@pytest.mark.parametrize(("m", "v"), [(4, 2), (8, 2), (8, 4)])
def test_interleaved_bubble_fraction(even_stages, m, v):
    """Interleaved 1F1B: bubble / ideal time = (p - 1) / (v m)."""
    p = 4
    out = run(*even_stages, pp=p, n_micro=m, vpp=v, schedule=SCHEDULE_INTERLEAVED)
    busy = out["compute_s"] + out["tp_comm_s"] + out["cp_comm_s"]
    assert out["bubble_s"] / busy == pytest.approx((p - 1) / (v * m), rel=2e-3)


def test_one_microbatch_1f1b_equals_gpipe(h100_8b):
    """modeling.md section 9: with one micro-batch the schedules coincide (time and memory)."""
    model, dev, tiers, tiles, work = h100_8b
    gpipe, one = run_rows([strategy(pp=4, dp=2, n_micro=1, schedule=s) for s in (SCHEDULE_GPIPE, SCHEDULE_1F1B)],
                          model, dev, tiers, tiles, work)
    assert gpipe == one


def test_gpipe_holds_more_than_1f1b(h100_8b):
    model, dev, tiers, tiles, work = h100_8b
    gpipe, one = run_rows([strategy(pp=4, dp=2, n_micro=16, schedule=s) for s in (SCHEDULE_GPIPE, SCHEDULE_1F1B)],
                          model, dev, tiers, tiles, work)
    assert gpipe["step_time_analytic_s"] == one["step_time_analytic_s"]
    assert gpipe["mem_activations_bytes"] > one["mem_activations_bytes"]


def test_out_of_memory_flagged(h100, llama3_70b, make_workload):
    """Llama 3 70B on one 80 GB device needs 18 bytes/param x 70.6e9 = 1.27 TB: infeasible."""
    out = run(llama3_70b, h100.device, h100.tiers, h100.tiles, make_workload(global_batch=1.0))
    assert out["mem_peak_bytes"] > 18 * 70e9
    assert out["feasible"] == 0.0 and out["infeasible_reason"] == 1.0
    fits = run(llama3_70b, h100.device, h100.tiers, h100.tiles, make_workload(global_batch=64.0),
               tp=8, pp=8, n_micro=64, sp=1, recompute=RECOMPUTE_SELECTIVE)
    assert fits["feasible"] == 1.0 and fits["infeasible_reason"] == 0.0
    assert fits["mem_overhead_bytes"] == 4 * 2.0**30


# --------------------------------------------------------------------------- against the naive reference


def _random_model(rng) -> np.ndarray:
    heads = float(rng.choice([8, 16, 32, 64]))
    kv = float(rng.choice([8.0, heads]))
    head_dim = float(rng.choice([64, 128]))
    hidden = heads * head_dim * float(rng.choice([1.0, 1.0, 0.5]))
    return params.record(
        params.MODEL, layers=8.0 * float(rng.integers(1, 7)), hidden=hidden, heads=heads, kv_heads=kv,
        head_dim=head_dim, ffn=1024.0 * float(rng.integers(1, 40)), vocab=float(rng.integers(1000, 200000)),
        glu=float(rng.integers(2)), bias=float(rng.integers(2)), tied_embeddings=float(rng.integers(2)),
        dropout=float(rng.integers(2)),
    )


def _random_device(rng) -> np.ndarray:
    return params.record(
        params.DEVICE, peak_flops_per_s=rng.uniform(1e14, 2e15), hbm_bytes_per_s=rng.uniform(1e12, 5e12),
        hbm_capacity_bytes=rng.uniform(16, 192) * 2.0**30, compute_units=float(rng.integers(16, 200)),
        launch_s=rng.uniform(0.0, 1e-5), gemm_max_efficiency=rng.uniform(0.4, 1.0),
        attention_efficiency=rng.uniform(0.2, 0.8), memory_efficiency=rng.uniform(0.5, 1.0),
        memory_overhead_bytes=rng.uniform(0, 8) * 2.0**30, memory_fragmentation=rng.uniform(0.0, 0.2),
        comm_buffer_bytes=rng.uniform(0, 512) * 2.0**20, host_link_bytes_per_s=rng.uniform(10e9, 64e9),
        host_memory_bytes_per_s=rng.uniform(20e9, 100e9), host_capacity_bytes=256 * 2**30,
    )


def _random_tiers(rng) -> np.ndarray:
    n = int(rng.integers(1, 4))
    levels, domain, bw, lat = [], 1, rng.uniform(1e11, 1e12), rng.uniform(0.0, 5e-6)
    for i in range(n):
        domain *= int(2 ** rng.integers(1, 4))
        levels.append((0.0 if i == n - 1 else float(domain), bw, lat))
        bw *= rng.uniform(0.05, 1.0)
        lat += rng.uniform(0.0, 1e-5)
    return _tiers(*levels)


def _random_strategy(rng) -> dict[str, int]:
    tp, pp = int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 2, 4]))
    dp, cp = int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 2, 4]))
    schedule = SCHEDULE_1F1B if pp == 1 else int(rng.integers(4))
    interleaved = schedule == SCHEDULE_INTERLEAVED
    sp = int(rng.integers(2)) if tp > 1 else 0
    return dict(tp=tp, pp=pp, dp=dp, cp=cp, vpp=2 if interleaved else 1, mb=int(rng.integers(1, 5)),
                recompute=int(rng.integers(5)), sp=sp, tpo=int(rng.integers(2)) * sp,
                zero=int(rng.integers(4)) if dp > 1 else 0, opt=int(rng.integers(5)), schedule=schedule,
                n_micro=int(rng.integers(1, 17)) * (pp if interleaved else 1))


def _assert_outputs_close(got: dict[str, float], ref: dict[str, float], context) -> None:
    for name in OUTPUTS:
        if name in TIME_FIELDS:
            atol = 1e-12 * ref["step_time_analytic_s"]
        elif name.startswith("mem_") and name != "mem_peak_stage":
            atol = 1e-12 * ref["mem_peak_bytes"]
        else:
            atol = 0.0
        assert got[name] == pytest.approx(ref[name], rel=1e-9, abs=atol), (name, context)


def test_evaluate_matches_naive():
    """30 random models x hardware x workloads (fused or eager elementwise work), 10
    random candidates each."""
    rng = np.random.default_rng(20240710)
    for _ in range(30):
        model, dev, tiers = _random_model(rng), _random_device(rng), _random_tiers(rng)
        tiles = np.array([[float(rng.choice([64, 128, 256])), float(rng.choice([64, 128, 256]))]
                          for _ in range(int(rng.integers(1, 4)))])
        strategies = [_random_strategy(rng) for _ in range(10)]
        work = params.record(
            params.WORKLOAD, global_batch=float(rng.integers(1, 2048)),
            seq_len=float(rng.choice([512, 1024, 2048, 4096, 8192])), act_bytes=2.0, weight_bytes=2.0,
            grad_bytes=float(rng.choice([2.0, 4.0])), optimizer_bytes=float(rng.choice([12.0, 16.0])),
            flash_attention=float(rng.integers(2)), gemm_cast_bytes=float(rng.choice([0.0, 3.0])),
            eager_elementwise=float(rng.integers(2)),
        )
        for s, got in zip(strategies, run_rows(strategies, model, dev, tiers, tiles, work)):
            _assert_outputs_close(got, run_naive(s, model, dev, tiers, tiles, work), s)


def test_evaluate_one_matches_rows(h100_8b):
    """The single-row kernel fills ``out`` exactly as the row-parallel one does."""
    model, dev, tiers, tiles, work = h100_8b
    rng = np.random.default_rng(20240711)
    strategies = [_random_strategy(rng) for _ in range(20)]
    rows = run_rows(strategies, model, dev, tiers, tiles, work)
    for s, row in zip(strategies, rows):
        out = np.full(N_OUT, np.nan)
        evaluate_one(*(dtype({**BASE, **s}[name]) for name, dtype in COLUMNS), model[0], dev[0], tiers, tiles, work[0], out)
        assert dict(zip(OUTPUTS, out.tolist())) == row


def test_offload_and_last_k_recompute_match_naive():
    """Host offload of activations and weights and last-k-layer recompute, with
    every other dimension random as above: 30 random setups x 10 candidates, the
    host memory small enough on some that weight offload does not fit there."""
    rng = np.random.default_rng(20240712)
    n_exposed = n_last_k = n_host_full = 0
    for _ in range(30):
        model, dev, tiers = _random_model(rng), _random_device(rng), _random_tiers(rng)
        dev["host_capacity_bytes"] = rng.uniform(1, 512) * 2.0**30
        tiles = np.array([[float(rng.choice([64, 128, 256])), float(rng.choice([64, 128, 256]))]])
        strategies = []
        for _ in range(10):
            s = _random_strategy(rng)
            s.update(recompute=int(rng.choice([s["recompute"], RECOMPUTE_FULL])),
                     rc_layers=int(rng.integers(0, model["layers"][0] + 1)), off_act=int(rng.integers(2)),
                     off_w=int(rng.integers(2)))
            strategies.append(s)
        work = params.record(
            params.WORKLOAD, global_batch=float(rng.integers(1, 2048)),
            seq_len=float(rng.choice([512, 2048, 8192])), act_bytes=2.0, weight_bytes=2.0,
            grad_bytes=float(rng.choice([2.0, 4.0])), optimizer_bytes=12.0, flash_attention=float(rng.integers(2)),
            gemm_cast_bytes=float(rng.choice([0.0, 3.0])),
        )
        for s, got in zip(strategies, run_rows(strategies, model, dev, tiers, tiles, work)):
            _assert_outputs_close(got, run_naive(s, model, dev, tiers, tiles, work), s)
            n_exposed += got["offload_s"] > 0
            n_last_k += s["recompute"] == RECOMPUTE_FULL and 0 < s["rc_layers"] < model["layers"][0]
            n_host_full += got["infeasible_reason"] == 2
    assert n_exposed >= 20 and n_last_k >= 20 and n_host_full >= 5, (n_exposed, n_last_k, n_host_full)


#: the short keys of ``naive.evaluate_one`` and the encoder's columns they read
NAIVE_KEYS = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "vpp": "vpp", "mb": "micro_batch",
              "recompute": "recompute", "sp": "sequence_parallel", "tpo": "tp_overlap", "zero": "zero",
              "opt": "optimizer", "schedule": "schedule", "rc_layers": "recompute_layers",
              "off_act": "offload_activations", "off_w": "offload_weights", "defer": "defer_grad_sync",
              "n_micro": "n_microbatches"}


@pytest.mark.parametrize("model_name", ["llama3-8b", "gpt3-175b"])
def test_widened_space_matches_naive(model_name):
    """A catalog dense model on catalog hardware, every dimension the reference
    models widened (tp, pp, cp, vpp, micro-batch, recompute and its last k layers,
    offload of activations and weights, SP, TP overlap, ZeRO and ZeRO-3's deferred
    gradient reduction, every optimizer, the schedules GPipe, 1F1B, interleaved,
    ZB-H1): 300 random candidates of
    the encoded space through ``explorer.evaluate.analytic``, as a sweep
    evaluates them, against the plain-Python reference."""
    from pathlib import Path

    from paraspace.explorer.evaluate import analytic, pack
    from paraspace.spaces.catalog import space_from_raw
    from paraspace.spaces.encode import Encoder

    raw = {"name": "wide", "description": "every dense dimension widened", "model": model_name,
           "hardware": "a100-sxm4-80gb", "devices": 16, "global_batch": 64, "seq_len": 4096,
           "dimensions": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "cp": [1, 2], "vpp": [1, 2], "micro_batch": [1, 2, 4],
                          "recompute": ["none", "selective", "full", "norms", "selective-ops"],
                          "recompute_layers": [0, 1, 3],
                          "offload_activations": [False, True], "offload_weights": [False, True],
                          "sequence_parallel": [False, True], "tp_overlap": [False, True], "zero": [0, 1, 2, 3],
                          "defer_grad_sync": [False, True],
                          "optimizer": ["adam", "adam-8bit", "cpu-adam", "adam-no-master", "adam-8bit-paged",
                                        "adam-bf16"],
                          "schedule": ["gpipe", "1f1b", "interleaved", "zb-h1"]}}
    space = space_from_raw(raw, "test", Path(__file__).parent)
    packed = pack(space)
    cols = Encoder(space).encode_all().columns
    got = analytic(packed, cols)
    model, dev, work = naive.fields(packed.model), naive.fields(packed.device), naive.fields(packed.workload)
    tiers, tiles = naive.tier_list(packed.tiers), naive.tile_list(packed.tiles)
    rng = np.random.default_rng(20240713)
    idx = rng.choice(cols["tp"].shape[0], size=300, replace=False)
    for i in idx:
        s = {k: int(cols[c][i]) for k, c in NAIVE_KEYS.items()}
        _assert_outputs_close({name: float(got[name][i]) for name in OUTPUTS},
                              naive.evaluate_one(s, model, dev, tiers, tiles, work), s)
    sample = {c: cols[c][idx] for c in ("offload_activations", "offload_weights", "recompute_layers",
                                        "defer_grad_sync", "recompute")}
    assert sample["offload_activations"].any() and sample["offload_weights"].any()
    assert (sample["recompute_layers"] > 0).any() and sample["defer_grad_sync"].any()
    assert (sample["recompute"] == RECOMPUTE_SELECTIVE_OPS).any()


# --------------------------------------------------------------------------- properties (modeling.md section 9)


@st.composite
def candidates(draw) -> dict[str, int]:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    schedule = SCHEDULE_1F1B if pp == 1 else draw(st.sampled_from([SCHEDULE_GPIPE, SCHEDULE_1F1B,
                                                                   SCHEDULE_INTERLEAVED, SCHEDULE_ZB_H1]))
    interleaved = schedule == SCHEDULE_INTERLEAVED
    sp = draw(st.sampled_from([0, 1])) if tp > 1 else 0
    return dict(
        tp=tp, pp=pp, dp=dp, cp=draw(st.sampled_from([1, 2])), vpp=2 if interleaved else 1,
        mb=draw(st.sampled_from([1, 2])), recompute=draw(st.sampled_from([0, 1, 2])),
        sp=sp, tpo=draw(st.sampled_from([0, 1])) * sp, zero=draw(st.integers(0, 3)) if dp > 1 else 0,
        opt=draw(st.sampled_from([0, 1, 2])),
        schedule=schedule, n_micro=draw(st.integers(1, 16)) * (pp if interleaved else 1),
    )


#: the models the properties run on: Llama 3 8B (GQA + SwiGLU), GPT-3 175B (MHA +
#: GeLU + biases + dropout) and an 8-layer Llama 3 8B, whose stages can hold a
#: single layer (the corner where memory invariants are easiest to break)
MODELS = st.sampled_from(["llama3_8b", "gpt3_175b", "llama3_8b_8_layers"])
WORKLOADS = st.fixed_dictionaries({"seq_len": st.sampled_from([2048.0, 4096.0]),
                                   "flash_attention": st.sampled_from([0.0, 1.0]),
                                   "eager_elementwise": st.sampled_from([0.0, 1.0])})


@pytest.fixture(scope="module")
def setup(h100, llama3_8b, gpt3_175b, make_workload):
    """(model name, workload overrides) -> the kernel arguments on H100s."""
    shallow = llama3_8b.copy()
    shallow["layers"] = 8.0
    models = {"llama3_8b": llama3_8b, "gpt3_175b": gpt3_175b, "llama3_8b_8_layers": shallow}

    def build(name: str, work: dict[str, float], s: dict[str, int], tiers=None, device=None):
        workload = make_workload(global_batch=float(s["dp"] * s["mb"] * s["n_micro"]), **work)
        return (models[name], h100.device if device is None else device, h100.tiers if tiers is None else tiers,
                h100.tiles, workload)

    return build


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_step_time_is_conserved(setup, name, work, s):
    """step = compute + tp + cp + bubble + pp + dp + optimizer; all parts >= 0;
    step and throughput positive and finite."""
    out = run_rows([s], *setup(name, work, s))[0]
    assert sum(out[p] for p in PARTS) == pytest.approx(out["step_time_analytic_s"], rel=1e-9)
    assert all(out[p] >= 0.0 for p in PARTS)
    assert 0.0 < out["step_time_analytic_s"] < math.inf
    assert 0.0 < out["tokens_per_s_per_gpu"] < math.inf and 0.0 < out["mfu"] < 1.0
    assert out["recompute_s"] <= out["compute_s"] + out["tp_comm_s"] + out["cp_comm_s"]
    assert out["mem_peak_bytes"] == pytest.approx(sum(out[k] for k in (
        "mem_weights_bytes", "mem_grads_bytes", "mem_optimizer_bytes", "mem_activations_bytes",
        "mem_overhead_bytes")), rel=1e-12)
    assert 0 <= out["mem_peak_stage"] < s["pp"]


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_deterministic(setup, name, work, s):
    args = setup(name, work, s)
    first = evaluate_rows(*columns([s], BASE), *args)
    second = evaluate_rows(*columns([s], BASE), *args)
    assert first.tobytes() == second.tobytes()


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_one_stage_has_no_bubble(setup, name, work, s):
    s = {**s, "pp": 1, "schedule": SCHEDULE_1F1B, "vpp": 1}
    out = run_rows([s], *setup(name, work, s))[0]
    assert out["bubble_s"] == 0.0 and out["pp_comm_s"] == 0.0


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_more_recompute_never_faster(setup, name, work, s):
    """none -> selective -> full: the step never gets shorter."""
    rows = [{**s, "recompute": r} for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL)]
    none, selective, full = run_rows(rows, *setup(name, work, s))
    assert none["step_time_analytic_s"] <= selective["step_time_analytic_s"] * (1 + 1e-12)
    assert selective["step_time_analytic_s"] <= full["step_time_analytic_s"] * (1 + 1e-12)
    assert none["recompute_s"] == 0.0 < selective["recompute_s"] < full["recompute_s"]


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_more_recompute_never_more_memory(setup, name, work, s):
    """none -> selective -> full never raises the stored activations or the peak.

    Recompute keeps less per layer and, transiently, the layer being recomputed
    holds again what it did not keep; with A_none >= A_sel >= A_full and n >= 1
    layers in flight, n A_sel + (A_none - A_sel) <= n A_none and the full-vs-
    selective difference is (n - 1)(A_full - A_sel) <= 0, down to one layer."""
    rows = [{**s, "recompute": r} for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL)]
    none, selective, full = run_rows(rows, *setup(name, work, s))
    for key in ("mem_activations_bytes", "mem_peak_bytes"):
        assert full[key] <= selective[key] * (1 + 1e-12) and selective[key] <= none[key] * (1 + 1e-12), key


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_higher_zero_stage_never_more_memory(setup, name, work, s):
    """ZeRO 0 -> 1 -> 2 -> 3 never raises the peak (dp >= 2): ZeRO-3's shard
    plus two gathered layers is capped at the unsharded weights."""
    s = {**s, "dp": max(s["dp"], 2)}
    rows = [{**s, "zero": z} for z in range(4)]
    peaks = [r["mem_peak_bytes"] for r in run_rows(rows, *setup(name, work, s))]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(peaks, peaks[1:])), peaks


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates(), ups=st.lists(st.floats(1.0, 1e3), min_size=2, max_size=2))
def test_more_link_bandwidth_never_slower(setup, h100, name, work, s, ups):
    fast_tiers = h100.tiers.copy()
    fast_tiers["bytes_per_s"] *= np.array(ups)
    slow, fast = (run_rows([s], *setup(name, work, s, tiers=t))[0] for t in (h100.tiers, fast_tiers))
    assert fast["step_time_analytic_s"] <= slow["step_time_analytic_s"] * (1 + 1e-12)
    for key in ("tp_comm_s", "cp_comm_s", "pp_comm_s"):
        assert fast[key] <= slow[key] * (1 + 1e-12) + 1e-15, key


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates(), flops_up=st.floats(1.0, 1e3), hbm_up=st.floats(1.0, 1e3))
@example(name="gpt3_175b", work=dict(seq_len=2048.0, flash_attention=0.0, eager_elementwise=0.0),
         s=dict(tp=8, pp=2, dp=2, cp=1, vpp=1, mb=2, recompute=0, sp=1, tpo=1, zero=0, opt=0,
                schedule=SCHEDULE_ZB_H1, n_micro=1), flops_up=8.0, hbm_up=1.0)  # one micro-batch on ZB-H1: the
# published bubble's 2 (p - 1) moved W passes made a faster GPU 0.1% slower (1338.7 -> 1340.4 ms)
def test_faster_device_never_slower(setup, h100, name, work, s, flops_up, hbm_up):
    fast_dev = h100.device.copy()
    fast_dev["peak_flops_per_s"] *= flops_up
    fast_dev["hbm_bytes_per_s"] *= hbm_up
    slow, fast = (run_rows([s], *setup(name, work, s, device=d))[0] for d in (h100.device, fast_dev))
    assert fast["step_time_analytic_s"] <= slow["step_time_analytic_s"] * (1 + 1e-12)
    assert fast["compute_s"] <= slow["compute_s"] * (1 + 1e-12)


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_each_parallelism_reports_only_its_own_traffic(setup, h100, name, work, s):
    """Without tensor parallelism no second is TP traffic, without context
    parallelism none is CP traffic, whatever the recompute (a full recompute's
    rerun of the forward's CP exchange used to be reported as TP traffic). Links
    at a thousandth of H100's so the CP ring outlasts the attention it hides behind."""
    slow = h100.tiers.copy()
    slow["bytes_per_s"] /= 1e3
    s = {**s, "tp": 1, "sp": 0, "tpo": 0, "cp": 2}
    out = run_rows([s], *setup(name, work, s, tiers=slow))[0]
    assert out["tp_comm_s"] == 0.0
    assert out["cp_comm_s"] > 0.0
    s = {**s, "tp": 2, "cp": 1}
    out = run_rows([s], *setup(name, work, s, tiers=slow))[0]
    assert out["cp_comm_s"] == 0.0
    assert out["tp_comm_s"] > 0.0


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_infinite_bandwidth_removes_communication(setup, h100, name, work, s):
    """Links at 1e30 B/s with no latency: TP, CP, PP and DP communication vanish."""
    ideal = h100.tiers.copy()
    ideal["bytes_per_s"] = 1e30
    ideal["latency_s"] = 0.0
    out = run_rows([s], *setup(name, work, s, tiers=ideal))[0]
    for key in ("tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s"):
        assert out[key] <= 1e-12 * out["step_time_analytic_s"], key


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_tp_overlap_never_slower_and_hides_at_most_three_quarters(setup, name, work, s):
    """Overlapping TP collectives with their GEMMs never lengthens the step, and
    a collective chunked in 4 keeps at least its first quarter exposed."""
    if s["tp"] == 1:
        s = {**s, "tp": 2}
    s = {**s, "sp": 1}
    plain, overlapped = run_rows([{**s, "tpo": 0}, {**s, "tpo": 1}], *setup(name, work, s))
    assert overlapped["step_time_analytic_s"] <= plain["step_time_analytic_s"] * (1 + 1e-12)
    assert overlapped["tp_comm_s"] >= plain["tp_comm_s"] / 4 * (1 - 1e-9)


def test_tp_overlap_hand_example():
    """kernels.training.overlapped_s: a 4 ms all-gather chunked in 4 behind a 10 ms GEMM
    exposes its first 1 ms chunk only; behind a 2 ms GEMM, 1 + (3 - 2) = 2 ms."""
    from paraspace.kernels.training import overlapped_s

    assert overlapped_s(4e-3, 10e-3) == pytest.approx(1e-3, rel=1e-15)
    assert overlapped_s(4e-3, 2e-3) == pytest.approx(2e-3, rel=1e-15)
    assert overlapped_s(0.0, 2e-3) == 0.0


def test_optimizer_choices_memory_and_step(h100_8b):
    """Llama 3 8B, one device (P = 8,030,261,248 parameters), H100 profile:
    Adam keeps 12 bytes/param of fp32 states, 8-bit Adam 6, CPU Adam none;
    CPU Adam's step moves 4 bytes/param over PCIe (50 GB/s) and streams 28
    bytes/param of host memory (76.8 GB/s x memory efficiency 0.8):
    P * (4 / 50e9 + 28 / (76.8e9 * 0.8)) + 4 us launch = 0.642 + 3.660 = 4.302 s."""
    model, dev, tiers, tiles, work = h100_8b
    p_total = 8_030_261_248
    adam, eight, cpu = (run(model, dev, tiers, tiles, work, dp=1, opt=o) for o in (0, 1, 2))
    assert adam["mem_optimizer_bytes"] == pytest.approx(12 * p_total, rel=1e-14)
    assert eight["mem_optimizer_bytes"] == pytest.approx(6 * p_total, rel=1e-14)
    assert cpu["mem_optimizer_bytes"] == 0.0
    expected = p_total * (4 / 50e9 + 28 / (76.8e9 * 0.8)) + 4e-6
    assert expected == pytest.approx(4.302, abs=1e-3)
    assert cpu["optimizer_s"] == pytest.approx(expected, rel=1e-12)
    # 8-bit Adam moves 22 of Adam's 34 bytes per parameter on the device
    assert (eight["optimizer_s"] - 4e-6) == pytest.approx((adam["optimizer_s"] - 4e-6) * 22 / 34, rel=1e-12)
    # the forward and backward do not care
    assert adam["compute_s"] == eight["compute_s"] == cpu["compute_s"]


@PROPS
@given(name=MODELS, work=WORKLOADS, s=candidates())
def test_optimizer_offload_never_raises_device_memory(setup, name, work, s):
    rows = [{**s, "opt": o} for o in (0, 1, 2)]
    adam, eight, cpu = run_rows(rows, *setup(name, work, s))
    assert cpu["mem_optimizer_bytes"] <= eight["mem_optimizer_bytes"] <= adam["mem_optimizer_bytes"]
    assert cpu["mem_peak_bytes"] <= eight["mem_peak_bytes"] * (1 + 1e-12)
    assert eight["mem_peak_bytes"] <= adam["mem_peak_bytes"] * (1 + 1e-12)


def test_uneven_layer_split():
    """30 layers on 4 stages: 30 // 4 = 7 each and the first 30 mod 4 = 2 stages
    one more: 8, 8, 7, 7; in 2 chunks per device: (4, 4), (4, 4), (4, 3), (4, 3)."""
    from paraspace.kernels.training import chunk_layers, device_layers

    assert [device_layers(s, 4, 30.0) for s in range(4)] == [8.0, 8.0, 7.0, 7.0]
    assert [[chunk_layers(s, c, 4, 2, 30.0) for c in range(2)] for s in range(4)] == [[4, 4], [4, 4], [4, 3], [4, 3]]
    assert sum(device_layers(s, 7, 126.0) for s in range(7)) == 126.0


def test_uneven_pipelines_match_the_reference(h100, llama3_8b, make_workload):
    """A 30-layer Llama on 4 and 8 stages (uneven), against the plain-Python reference."""
    model = llama3_8b.copy()
    model["layers"] = 30.0
    rng = np.random.default_rng(7)
    strategies = []
    for _ in range(40):
        s = _random_strategy(rng)
        s.update(pp=int(rng.choice([4, 8])), schedule=int(rng.choice([SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_ZB_H1])),
                 vpp=1)
        strategies.append(s)
    work = make_workload(global_batch=256.0)
    for s, got in zip(strategies, run_rows(strategies, model, h100.device, h100.tiers, h100.tiles, work)):
        _assert_outputs_close(got, run_naive(s, model, h100.device, h100.tiers, h100.tiles, work), s)
