"""Serving spaces (issue 15): the schema and encoder, the analytic tier by hand,
the memory-bandwidth ceiling, the simulation against the closed forms, Little's
law and determinism, the plain-Python references, and ``paraspace serve`` on
every catalog serving space."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from click.testing import CliRunner

import naive_serving
from naive_serving import disagg_steady_state, lookup, simulate as naive_simulate, steady_state
from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import pack_hardware, pack_model
from paraspace.kernels import inference, serving_sim
from paraspace.kernels.ops import ATTENTION_FWD_FILL_KEYS, loop_fill
from paraspace.kernels import serving as ks
from paraspace.explorer import serve
from paraspace.results import serving_schema
from paraspace.results.rank import top
from paraspace.spaces import serving as sp
from paraspace.spaces.catalog import load_hardware, load_model
from paraspace.spaces.errors import CatalogError

GIB = 2.0**30
GRID = ks.token_grid()
REL = 1e-12


# --------------------------------------------------------------------------- toy records


def toy_model(**overrides: float) -> np.ndarray:
    """2 layers, h 1024, 8 heads of 128 (GQA: 2 KV heads), SwiGLU ffn 4096, vocab 32000, untied."""
    values = {"layers": 2.0, "hidden": 1024.0, "heads": 8.0, "kv_heads": 2.0, "head_dim": 128.0, "ffn": 4096.0,
              "vocab": 32000.0, "glu": 1.0, "bias": 0.0, "tied_embeddings": 0.0, "dropout": 0.0}
    values.update(overrides)
    from paraspace.kernels import params

    return params.record(params.MODEL, **values)


def toy_srv(**overrides: float) -> np.ndarray:
    """One device, 16-bit weights / activations / KV, 90% of the free HBM for the KV cache."""
    values = {"tp": 1.0, "pp": 1.0, "n_gpus": 1.0, "weight_bytes": 2.0, "act_bytes": 2.0, "kv_bytes": 2.0,
              "kv_fraction": 0.9}
    values.update(overrides)
    return inference.serving(**values)


def workload(**overrides: float) -> np.ndarray:
    values = dict(input_len=512.0, output_len=16.0, longest_seq_len=0.0, longest_prompt_len=0.0, longest_input_len=0.0,
                  prefix_hit_rate=0.0, concurrency=1.0, rate_per_s=0.0,
                  devices=1.0, host_s=0.0, kv_fraction=0.9, acceptance_rate=0.0, sla_ttft_s=0.0, sla_ttft_p90_s=0.0, sla_tpot_s=0.0,
                  sla_tpot_p90_s=0.0)
    values.update(overrides)
    rec = np.zeros(1, ks.SERVING_WORKLOAD).view(np.recarray)
    for key, value in values.items():
        rec[key] = value
    return rec


@pytest.fixture(scope="module")
def fast(make_device, make_tiers, toy_tiles):
    """The toy device (1 TB/s, no launch cost, ideal efficiencies, no fusion) at 1e18
    FLOP/s, so every kernel is bound by its bytes: a time is bytes / 1e12."""
    return dict(model=toy_model(), dev=make_device(peak_flops_per_s=1e18), tiers=make_tiers((8, 1e11, 0.0), (0, 1e10, 0.0)),
                tiles=toy_tiles)


def analytic(env, srv, wl, *, max_batch=256.0, max_tokens=8192.0, scheduler=ks.CONTINUOUS, overlap=False, instances=1.0,
             prefill=None, prefill_instances=1.0):
    """The analytic tier on one row: aggregated, or disaggregated with ``prefill`` replicas.
    Its columns have the encoder's dtypes and the row its own run (``explorer.serve.analytic``
    passes these types): any other compiles the whole kernel again."""
    mode = ks.AGG if prefill is None else ks.DISAGG
    for value in (max_batch, max_tokens, instances, prefill_instances):
        assert value == int(value), value  # int32 columns, as the encoder's
    whole = lambda v: np.array([v], np.int32)  # noqa: E731
    out = ks.analytic_rows(env["model"], env["dev"], env["tiers"], env["tiles"], srv,
                           srv if prefill is None else prefill, np.zeros(1, np.int8), np.array([mode], np.int8),
                           whole(max_batch), whole(max_tokens), np.array([scheduler], np.int8),
                           np.array([overlap], np.int8), whole(instances), whole(prefill_instances), wl,
                           np.zeros(1, np.int64))
    return dict(zip(ks.OUTPUTS, out[0]))


def tables(env, srv):
    return ks.cost_tables(env["model"], env["dev"], env["tiers"], env["tiles"], srv, np.zeros(1, np.int8), GRID)


def run_sim(env, srv, in_len, out_len, gaps=None, *, clients=0, rate=0.0, max_batch=256.0, max_tokens=8192.0,
            scheduler=ks.CONTINUOUS, overlap=False, host=0.0, hit=0.0, cap=None, acceptance=0.0, seed=0, steady=False):
    """One engine of ``srv`` (its draft_tokens) simulated; returns (outputs, its cost parts)."""
    g, h, dp, ds, kv_coef, pair_coef, capacity = tables(env, srv)
    if cap is not None:
        capacity = np.array([cap])
    gaps = np.ones(len(in_len)) if gaps is None else gaps
    out = serving_sim.simulate_rows(np.asarray(in_len, float), np.asarray(out_len, float), gaps, np.array([clients], float),
                                    np.array([rate]), np.array([max_batch]), np.array([max_tokens]),
                                    np.array([scheduler], np.int8), np.array([overlap], np.int8), capacity, host, kv_coef,
                                    pair_coef, hit, GRID, g, h,
                                    srv["draft_tokens"].astype(np.int32), acceptance, seed, dp, ds, steady)
    return dict(zip(serving_sim.SIM_OUTPUTS, out[0])), (g[0], h[0], kv_coef[0], pair_coef[0], capacity[0], dp[0], ds[0])


# --------------------------------------------------------------------------- enums, schema, encoder


def test_kernel_codes_mirror_the_enums():
    assert (ks.STATIC, ks.CONTINUOUS, ks.UNCHUNKED) == (sp.Scheduler.STATIC, sp.Scheduler.CONTINUOUS,
                                                         sp.Scheduler.CONTINUOUS_UNCHUNKED)
    assert (naive_serving.STATIC, naive_serving.CONTINUOUS, naive_serving.UNCHUNKED) == (
        ks.STATIC, ks.CONTINUOUS, ks.UNCHUNKED)
    assert (ks.AGG, ks.DISAGG) == (sp.Mode.AGG, sp.Mode.DISAGG)
    assert (serving_sim.STATIC, serving_sim.UNCHUNKED) == (ks.STATIC, ks.UNCHUNKED)
    codes = {name: getattr(ks, name) for name in sp.Feasible.__members__}
    assert codes == {m.name: int(m) for m in sp.Feasible}


def space(**changes) -> dict:
    raw = {"name": "t", "description": "toy", "model": "llama3-8b", "hardware": "h100-sxm5-80gb", "devices": 8,
           "workload": {"input_len": 1024, "output_len": 128, "concurrency": 16},
           "dimensions": {"tp": [1, 2, 3, 4, 8], "max_batch": [64], "max_tokens": [32, 4096]}}
    for key, value in changes.items():
        raw[key] = value
    return raw


def test_encoder_charges_each_dropped_combination_to_its_first_rule():
    loaded = sp.serving_from_raw(space(), "toy.toml", Path("."))
    enc = sp.encode(loaded)
    # 5 tp x 2 max_tokens = 10; tp = 3 does not divide 8 devices (2 rows); max_tokens 32 < max_batch 64
    # on the other 4 tp values (4 rows): 4 kept, instances = 8 / tp
    assert enc.n_combinations == 10
    assert enc.first_reason[sp.ServingReason.DEVICE_BUDGET] == 2
    assert enc.first_reason[sp.ServingReason.TOKEN_BUDGET] == 4
    assert list(enc.columns["tp"]) == [1, 2, 4, 8]
    assert list(enc.columns["instances"]) == [8, 4, 2, 1]
    assert list(enc.columns["row_id"]) == [1, 3, 7, 9]


@pytest.mark.parametrize("change, field, expected", [
    ({"workload": {"input_len": {"distribution": "zipf", "mean": 10}, "output_len": 4, "concurrency": 1}},
     "workload.input_len.distribution", "'fixed', 'lognormal' or 'empirical'"),
    ({"workload": {"input_len": 8, "output_len": 4, "concurrency": 1, "rate_per_s": 2.0}},
     "workload.concurrency", "exactly one of"),
    ({"dimensions": {"dtype": ["fp4"]}}, "dimensions.dtype", "h100-sxm5-80gb has a peak for"),
    ({"dimensions": {"tp": [2, 2]}}, "dimensions.tp", "distinct values"),
])
def test_bad_serving_input_is_a_catalog_error(change, field, expected):
    with pytest.raises(CatalogError) as info:
        sp.serving_from_raw(space(**change), "toy.toml", Path("."))
    assert info.value.field == field
    assert expected in info.value.expected


# --------------------------------------------------------------------------- analytic tier by hand


def test_iteration_parts_by_hand(fast):
    """The toy at 1e18 FLOP/s and 1 TB/s: every kernel costs its bytes / 1e12.

    Per layer for T rows (2-byte elements, no fusion, tp = 1 so no all-reduce):
      QKV GEMM (T x 1024) @ (1024 x 1536):  2 (1024 T + 1572864 + 1536 T) = 5120 T + 3145728
      attention core over an empty cache (Q read, O written): T * 8 heads * 256 * 2 = 4096 T
      out-projection (T x 1024) @ (1024 x 1024): 2 (2048 T + 1048576)  = 4096 T + 2097152
      norms, residuals 10 * 2048 T, rotary 2 * 1280 * 2 T, KV write 2 * 2 * 128 * 2 T = 26624 T
      up (T x 1024) @ (1024 x 8192): 2 (9216 T + 8388608)            = 18432 T + 16777216
      down (T x 4096) @ (4096 x 1024): 2 (5120 T + 4194304)          = 10240 T + 8388608
      SwiGLU activation 3 * 4096 * 2 T                                 = 24576 T
      sum: 93184 T + 30408704 (the layer's weights, 15204352 x 2 bytes)
    Two layers plus the embedding lookup 2 * 1024 * 2 T = 4096 T:
      rows_s(T) = (190464 T + 60817408) / 1e12
    Head for r rows: final norm 4096 r, LM head (r x 1024) @ (1024 x 32000)
      2 (1024 r + 32768000 + 32000 r), sampling pass 32000 * 2 r:
      head_rows_s(r) = (134144 r + 65536000) / 1e12
    Decode attention reads 2 layers x 2 (K, V) x 2 heads x 128 x 2 bytes = 2048 bytes a cached token.
    Prefill attention: 2 layers x 2 x 8 heads x 256 = 8192 FLOP a causal pair."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv()[0]
    for t in (1.0, 512.0):
        assert ks.rows_s(m, d, tiers, tiles, srv, t) == pytest.approx((190464 * t + 60817408) / 1e12, rel=REL)
    assert ks.head_rows_s(m, d, tiers, tiles, srv, 3.0) == pytest.approx((134144 * 3 + 65536000) / 1e12, rel=REL)
    assert ks.head_rows_s(m, d, tiers, tiles, srv, 0.0) == 0.0
    assert ks.kv_s_per_token(m, d, tiers, tiles, srv) == pytest.approx(2048 / 1e12, rel=1e-9)
    assert ks.pair_s(m, d, srv) == pytest.approx(8192 / 1e18, rel=REL)


@pytest.mark.parametrize("keys", [64.0, 512.0, 4096.0, 32768.0])
def test_a_whole_prompts_attention_follows_the_measured_fill_law(keys):
    """The fused attention kernel runs a causal call over L keys at plateau x L / (L + 450)
    (kernels.ops.loop_fill, docs/measurements): L^2 / 2 pairs take as long as
    L^2 / 2 x (L + 450) / L = L (L / 2 + 225) pairs at the plateau, which is what the
    serving tier charges a prompt (``prompt_pairs``: 225 keys a prompt row). L = 512:
    512 x 481 = 246,272 = 131,072 x 962 / 512."""
    assert ks.prompt_pairs(keys, 0.0) == pytest.approx(0.5 * keys * keys / loop_fill(keys, ATTENTION_FWD_FILL_KEYS),
                                                       rel=1e-12)
    if keys == 512.0:
        assert ks.prompt_pairs(keys, 0.0) == 246_272.0
    # a prefix hit leaves p cached keys before the new rows: 750 new of 1,000 with 0.25 hit
    assert ks.prompt_pairs(1000.0, 0.25) == pytest.approx(750.0 * (250.0 + 375.0 + 225.0), rel=1e-12)


def test_prefill_and_decode_step_by_hand(fast):
    """One user, a 512-token prompt, 16 output tokens:
      prefill = rows_s(512) + head(1) + 8192e-18 * 512 * (256 + 225) pair-equivalents
                (the causal pairs 512 x 256, and the kernel's fill: 225 keys a prompt row)
              = (190464*512 + 60817408 + 134144 + 65536000) e-12 + 8192e-18 * 246272
              = 224005120e-12 + 2.017460224e-9 = 2.24007137460224e-4 s (the TTFT)
      decode j = 1..15 reads 512 + j tokens: 15 (rows_s(1) + head(1)) + 2048e-12 * (15*512 + 120)
              = 15 * 126678016e-12 + 2048e-12 * 7800 = 1.90017024e-3 + 1.59744e-5 = 1.91614464e-3 s
      TPOT = 1.91614464e-3 / 15; 16 tokens over prefill + decode."""
    out = analytic(fast, toy_srv(), workload())
    prefill = 224005120e-12 + 2.017460224e-9
    decode = 15 * 126678016e-12 + 2048e-12 * 7800
    assert out["prefill_s"] == pytest.approx(prefill, rel=1e-9)
    assert out["ttft_s"] == pytest.approx(prefill, rel=1e-9)
    assert out["tpot_s"] == pytest.approx(decode / 15, rel=1e-9)
    assert out["e2e_latency_s"] == pytest.approx(prefill + decode, rel=1e-9)
    assert out["output_tokens_per_s_per_gpu"] == pytest.approx(16 / (prefill + decode), rel=1e-9)
    assert out["reason"] == ks.OK


def test_moe_decode_reads_only_the_experts_it_hits(fast):
    """The toy with 8 routed experts of width 512, top-2, in both layers, one decode token:
    1 - (1 - 2/8)^1 = 1/4 of the experts (2) are hit, one row each. Per layer (bytes):
      attention half as for the dense toy at T = 1: 39936 + 5242880          = 5282816
      router (1 x 1024) @ (1024 x 8) at 2 bytes: 2 (1024 + 8192 + 8) = 18448; top-k pass 12 * 8 = 96
      2 experts' gate/up (1 x 1024) @ (1024 x 1024): 2 x 2 (1024 + 1048576 + 1024) = 4202496
      2 experts' down (1 x 512) @ (512 x 1024): 2 x 2 (512 + 524288 + 1024)     = 2103296
      SwiGLU 3 x 2 rows x 512 x 2 = 6144; permute + unpermute 2 x (1 + 2 x 2) x 1024 x 2 = 20480
      sum 11633776; two layers + the embedding lookup 4096: 23271648 bytes = 2.3271648e-5 s.
    The two experts' weights, 2 x 3 x 1024 x 512 x 2 = 6291456 bytes, are read; the other six are not."""
    moe = toy_model(experts=8.0, top_k=2.0, expert_ffn=512.0)
    srv = toy_srv()[0]
    assert inference.active_experts(8.0, 2.0, 1.0) == 2.0
    got = ks.rows_s(moe[0], fast["dev"][0], fast["tiers"], fast["tiles"], srv, 1.0)
    assert got == pytest.approx(23271648e-12, rel=REL)


def test_kv_capacity_by_hand(make_device):
    """1 GiB of HBM, 0.25 GiB overhead. Weights: per layer 15204352 matrix parameters + 2 norms
    of 1024 = 15206400; 2 layers + final norm 1024 = 30413824 parameters x 2 bytes = 60827648
    bytes, plus the embedding and the untied head, 2 x 32000 x 1024 x 2 = 131072000: 191899648.
    free = 1073741824 - 268435456 - 191899648 = 613406720; 0.9 of it / 2048 bytes a token
    = 269563.5 -> 269563 tokens."""
    dev = make_device(hbm_capacity_bytes=GIB, memory_overhead_bytes=GIB / 4)
    model = toy_model()
    srv = toy_srv()
    assert inference.device_weight_bytes(model[0], srv[0]) == 191899648
    assert ks.kv_capacity_tokens(model[0], dev[0], srv[0]) == 269563
    # no room beside the weights: 0 tokens, and the analytic tier says why
    small = make_device(hbm_capacity_bytes=191899648.0 * 0.5, peak_flops_per_s=1e18)
    assert ks.kv_capacity_tokens(model[0], small[0], srv[0]) == 0


def test_weights_and_kv_reasons(fast, make_device):
    env = {**fast, "dev": make_device(hbm_capacity_bytes=1e8, peak_flops_per_s=1e18)}
    assert analytic(env, toy_srv(), workload())["reason"] == ks.WEIGHTS_OOM
    # 0.2 GiB free: 0.9 * (214748364.8 - 191899648) / 2048 = 10040 tokens < 1 request of 20000
    env = {**fast, "dev": make_device(hbm_capacity_bytes=0.2 * GIB, peak_flops_per_s=1e18)}
    assert analytic(env, toy_srv(), workload(input_len=19000.0, output_len=1000.0))["reason"] == ks.KV_TOO_SMALL


@pytest.fixture(scope="module")
def h100_fp8():
    device, tiers, tiles = pack_hardware(load_hardware("h100-sxm5-80gb"), "fp8")
    return dict(model=pack_model(load_model("llama3-70b")), dev=device, tiers=tiers, tiles=tiles)


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("batch, kv_len", [(1, 128), (16, 2048), (64, 8192), (256, 1024)])
def test_decode_never_beats_the_memory_bandwidth_ceiling(h100_fp8, tp, batch, kv_len):
    """A decode iteration reads every weight it multiplies (not the embedding table, of which
    it gathers rows) and every cached token: step >= (weights + KV read) / HBM bandwidth."""
    m, d, tiers, tiles = h100_fp8["model"][0], h100_fp8["dev"][0], h100_fp8["tiers"], h100_fp8["tiles"]
    srv = inference.serving(tp=tp, pp=1, n_gpus=8, weight_bytes=1.0, act_bytes=2.0, kv_bytes=1.0)[0]
    weights = inference.device_weight_bytes(m, srv) - m.vocab * m.hidden / tp * 2.0
    kv_read = inference.kv_bytes_per_token(m, srv) * batch * kv_len
    b = float(batch)  # the jitted callers' float64: an int compiles iteration_s again
    step = ks.iteration_s(m, d, tiers, tiles, srv, 0.0, ks.kv_s_per_token(m, d, tiers, tiles, srv), 0.0,
                          b, b, b * kv_len, 0.0, 0.0, b)
    assert step >= (weights + kv_read) / d.hbm_bytes_per_s


# --------------------------------------------------------------------------- disaggregation


def test_kv_transfer_by_hand(fast, make_tiers):
    """A 512-token prompt's KV cache on a one-device prefill replica: 512 x 2048 bytes
    = 1048576 bytes, sent over NVLink (1e11 B/s, 2 us) when the deployment fits in a node
    of 8, else over the NIC (1e10 B/s, 5 us): 1.248576e-5 s and 1.098576e-4 s. With
    prefill_tp = 2 each rank sends its KV head's half at once: 5.24288e-6 + 2e-6 s."""
    tiers = make_tiers((8, 1e11, 2e-6), (0, 1e10, 5e-6))
    m = fast["model"][0]
    assert ks.kv_transfer_s(m, tiers, toy_srv()[0], 512.0, 2.0) == pytest.approx(1048576 / 1e11 + 2e-6, rel=REL)
    assert ks.kv_transfer_s(m, tiers, toy_srv()[0], 512.0, 16.0) == pytest.approx(1048576 / 1e10 + 5e-6, rel=REL)
    assert ks.kv_transfer_s(m, tiers, toy_srv(tp=2.0)[0], 512.0, 2.0) == pytest.approx(524288 / 1e11 + 2e-6,
                                                                                        rel=REL)


def test_disaggregated_poisson_row_by_its_definition(fast):
    """Poisson 20 requests/s, 512 in / 16 out, one prefill replica and one decode replica of
    one device each: the prefill iteration packs floor(4096 / 512) = 8 prompts in t_p =
    rows_s(4096) + head(8) + pair 8 x 512 x (256 + 225) (the causal pairs and the attention
    kernel's fill, 225 keys a prompt row), so mu = 8 / t_p prompts/s and the batched queue's
    wait is rho / (2 (1 - rho)) t_p at rho = 20 / mu; a prompt alone takes t_1 = rows_s(512)
    + head(1) + pair 512 x 481, and the M/D/1 queue of such iterations waits rho_1 / (2 (1 -
    rho_1)) t_1 at rho_1 = 20 t_1: the prompt's time is the shorter of wait + iteration. The
    decode batch B makes B / (15 t_d(B)) = 20; TTFT = that + transfer + half a decode
    iteration (the cache waits for the engine's next iteration to be admitted); TPOT = t_d."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv(n_gpus=2.0)
    out = analytic(fast, srv, workload(concurrency=0.0, rate_per_s=20.0, devices=2.0), max_tokens=4096.0,
                   prefill=toy_srv(n_gpus=2.0))
    t_p = ks.rows_s(m, d, tiers, tiles, srv[0], 4096.0) + ks.head_rows_s(m, d, tiers, tiles, srv[0], 8.0) \
        + ks.pair_s(m, d, srv[0]) * 8 * 512 * (256 + 225)
    t_1 = ks.rows_s(m, d, tiers, tiles, srv[0], 512.0) + ks.head_rows_s(m, d, tiers, tiles, srv[0], 1.0) \
        + ks.pair_s(m, d, srv[0]) * 512 * (256 + 225)
    rho, rho_1 = 20.0 / (8.0 / t_p), 20.0 * t_1
    prompt = min(rho / (2 * (1 - rho)) * t_p + t_p, rho_1 / (2 * (1 - rho_1)) * t_1 + t_1)
    assert t_1 < t_p and prompt == pytest.approx(rho_1 / (2 * (1 - rho_1)) * t_1 + t_1, rel=1e-12)  # alone, here
    b = out["batch"]
    t_d = ks.decode_only_s(m, d, tiers, tiles, srv[0], 0.0, ks.kv_s_per_token(m, d, tiers, tiles, srv[0]), b, 520.0)
    xfer = 1048576 / 1e11
    assert out["prefill_s"] == pytest.approx(t_p, rel=REL)
    assert b / (15 * t_d) == pytest.approx(20.0, rel=1e-9)
    assert out["kv_transfer_s"] == pytest.approx(xfer, rel=REL)
    assert out["ttft_s"] == pytest.approx(prompt + xfer + 0.5 * t_d, rel=1e-9)
    assert out["tpot_s"] == pytest.approx(t_d, rel=1e-9)
    assert out["output_tokens_per_s_per_gpu"] == pytest.approx(20.0 * 16 / 2, rel=REL)
    assert out["reason"] == ks.OK
    # the prefill replica saturates: 8 prompts per t_p ~ 0.25 ms is ~32,000 prompts/s
    over = analytic(fast, srv, workload(concurrency=0.0, rate_per_s=1e6, devices=2.0), max_tokens=4096.0,
                    prefill=toy_srv(n_gpus=2.0))
    assert over["reason"] == ks.OVERLOADED


def test_disaggregated_closed_loop_obeys_littles_law(fast):
    """Closed loop, 16 users: the prompts come as answers end, in the clumps an iteration
    took, so none waits while the prefill replica keeps up: B decoding + X (t_p + transfer
    + half a decode iteration to be admitted) = 16, TTFT = t_p + transfer + t_d / 2 and
    e2e = 16 / X, X = B / (15 t_d(B)) below mu = 8 / t_p (at 32 users X reaches mu: the
    next test's regime)."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv(n_gpus=2.0)
    out = analytic(fast, srv, workload(concurrency=16.0, devices=2.0), max_tokens=4096.0, prefill=toy_srv(n_gpus=2.0))
    x, b = out["requests_per_s"], out["batch"]
    t_p, xfer = out["prefill_s"], out["kv_transfer_s"]
    t_d = ks.decode_only_s(m, d, tiers, tiles, srv[0], 0.0, ks.kv_s_per_token(m, d, tiers, tiles, srv[0]), b, 520.0)
    assert b < 16 and x < 0.9 * 8 / t_p  # neither side saturated
    assert x == pytest.approx(b / (15 * t_d), rel=1e-12)
    assert out["e2e_latency_s"] == pytest.approx(16 / x, rel=REL)
    assert b + x * (t_p + xfer + 0.5 * t_d) == pytest.approx(16, rel=1e-9)
    assert out["ttft_s"] == pytest.approx(t_p + xfer + 0.5 * t_d, rel=1e-9)


def test_disaggregated_closed_loop_bound_by_its_prefill_replica(fast):
    """The same deployment, but one prompt an iteration (max_tokens 512) and 4,096 users: the
    decode batch the loop alone would reach completes more than mu = 1 / t_p requests a
    second, so the prefill replica bounds the rate: X = mu, B makes B / (15 t_d(B)) = mu,
    and the users not decoding wait for a prefill iteration: TTFT = 4096 / X - 15 t_d(B),
    more than an iteration and the transfer."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv(n_gpus=2.0)
    out = analytic(fast, srv, workload(concurrency=4096.0, devices=2.0), max_batch=4096.0, max_tokens=512.0,
                   prefill=toy_srv(n_gpus=2.0))
    t_p = ks.rows_s(m, d, tiers, tiles, srv[0], 512.0) + ks.head_rows_s(m, d, tiers, tiles, srv[0], 1.0) \
        + ks.pair_s(m, d, srv[0]) * 512 * (256 + 225)
    x, b = out["requests_per_s"], out["batch"]
    t_d = ks.decode_only_s(m, d, tiers, tiles, srv[0], 0.0, ks.kv_s_per_token(m, d, tiers, tiles, srv[0]), b, 520.0)
    assert out["prefill_s"] == pytest.approx(t_p, rel=REL)
    assert x == pytest.approx(1.0 / t_p, rel=1e-9) and b < 4096
    assert out["ttft_s"] == pytest.approx(4096 / x - 15 * t_d, rel=1e-9)
    assert out["ttft_s"] > t_p + out["kv_transfer_s"] + 0.5 * t_d


def test_disaggregated_memory_is_the_fullest_devices(fast):
    """A prefill replica of one device beside decode replicas of TP2 (3 devices): the
    prefill device holds the whole toy model's weights (2 bytes x its parameters) and
    the caches of the 8 prompts of one iteration, floor(4096 / 512) = 8 x 512 tokens x
    2048 bytes = 8,388,608 bytes, against a decode device's half the weights and its
    share of the batch's caches; the memory columns are the prefill device's."""
    m = fast["model"][0]
    prefill, decode = toy_srv(n_gpus=3.0), toy_srv(tp=2.0, n_gpus=3.0)
    out = analytic(fast, decode, workload(concurrency=16.0, devices=3.0), max_tokens=4096.0, prefill=prefill)
    weights = ks.replica_weight_bytes(m, prefill[0])
    assert weights > ks.replica_weight_bytes(m, decode[0])
    assert out["mem_weights_bytes"] == weights
    assert out["mem_kv_bytes"] == 8 * 512 * 2048
    assert out["mem_peak_bytes"] == weights + 8 * 512 * 2048  # the toy device has no framework overhead
    # the other way round the decode device is the fuller one: its own columns stand
    out = analytic(fast, prefill, workload(concurrency=16.0, devices=3.0), max_tokens=4096.0, prefill=decode)
    assert out["mem_weights_bytes"] == weights
    assert out["mem_kv_bytes"] == out["batch"] * (512 + 16) * 2048


def test_disaggregated_prefill_batch_is_what_its_cache_holds(fast, make_device):
    """A one-device prefill replica whose cache holds 1,600 tokens (0.9 of the HBM beside
    the weights; the decode replicas, TP2, hold far more): the prefill iteration packs
    min(floor(4096 / 512), floor(1600 / 512)) = 3 prompts, so t_p = rows_s(1536) + head(3)
    + pair 3 x 512 x (256 + 225); with 1,000 tokens one prompt an iteration, and with 500
    none fits: the row is infeasible for its KV cache, where the simulation is stuck."""
    m = fast["model"][0]
    prefill, decode = toy_srv(n_gpus=3.0), toy_srv(tp=2.0, n_gpus=3.0)
    weights = ks.replica_weight_bytes(m, prefill[0])
    rows = {}
    for tokens in (1600, 1000, 500):
        dev = make_device(peak_flops_per_s=1e18, hbm_capacity_bytes=weights + (tokens + 0.5) * 2048 / 0.9)
        assert math.floor(ks.kv_capacity_tokens(m, dev[0], prefill[0])) == tokens
        assert ks.kv_capacity_tokens(m, dev[0], decode[0]) > 40 * (512 + 16)  # the decode side never binds
        rows[tokens] = analytic({**fast, "dev": dev}, decode,
                                workload(concurrency=0.0, rate_per_s=20.0, devices=3.0, longest_input_len=512.0,
                                         longest_seq_len=528.0), max_tokens=4096.0, prefill=prefill)
    d, tiers, tiles, p = fast["dev"][0], fast["tiers"], fast["tiles"], prefill[0]
    t_p = ks.rows_s(m, d, tiers, tiles, p, 1536.0) + ks.head_rows_s(m, d, tiers, tiles, p, 3.0) \
        + ks.pair_s(m, d, p) * 3 * 512 * (256 + 225)
    assert rows[1600]["prefill_s"] == pytest.approx(t_p, rel=REL)
    t_p = ks.rows_s(m, d, tiers, tiles, p, 512.0) + ks.head_rows_s(m, d, tiers, tiles, p, 1.0) \
        + ks.pair_s(m, d, p) * 512 * (256 + 225)
    assert rows[1000]["prefill_s"] == pytest.approx(t_p, rel=REL)
    assert rows[1000]["reason"] == ks.OK
    assert rows[500]["reason"] == ks.KV_TOO_SMALL


def test_disaggregated_encoding_sizes_groups_from_the_budget():
    """8 devices, prefill replicas of 2 devices: 1 of them leaves 6 devices (3 decode replicas
    at tp 2, none whole at tp 4), 2 of them leave 4 (2 at tp 2, 1 at tp 4)."""
    raw = space(dimensions={"tp": [2, 4], "mode": ["disagg"], "prefill_tp": [2], "prefill_instances": [1, 2]})
    enc = sp.encode(sp.serving_from_raw(raw, "toy.toml", Path(".")))
    kept = list(zip(enc.columns["tp"], enc.columns["prefill_instances"], enc.columns["instances"]))
    assert kept == [(2, 1, 3), (2, 2, 2), (4, 2, 1)]
    assert enc.first_reason[sp.ServingReason.DISAGG_BUDGET] == 1


# --------------------------------------------------------------------------- simulation against the closed forms


def test_one_request_equals_the_closed_form(fast):
    """One user, one request: TTFT = the prefill iteration, TPOT = the decode iterations' mean
    (512 and 1 rows lie on the cost table's grid, so the table is exact there)."""
    srv = toy_srv()
    closed = analytic(fast, srv, workload())
    sim, _ = run_sim(fast, srv, [512.0], [16.0], clients=1)
    assert sim["ttft_s"] == pytest.approx(closed["ttft_s"], rel=REL)
    assert sim["tpot_s"] == pytest.approx(closed["tpot_s"], rel=REL)
    assert sim["e2e_latency_s"] == pytest.approx(closed["e2e_latency_s"], rel=REL)
    assert sim["iterations"] == 16 and sim["preemptions"] == 0


def test_one_token_outputs_have_no_time_per_output_token(fast):
    """Requests that end with their first token (output_len = 1) have no time between
    tokens: TPOT is 0 in both tiers (the simulation used to leave NaN there), and TTFT
    is still the prefill iteration."""
    srv = toy_srv()
    closed = analytic(fast, srv, workload(output_len=1.0))
    sim, _ = run_sim(fast, srv, [512.0], [1.0], clients=1)
    assert closed["tpot_s"] == 0.0
    assert sim["tpot_s"] == sim["tpot_p50_s"] == sim["tpot_p90_s"] == 0.0
    assert sim["ttft_s"] == pytest.approx(closed["ttft_s"], rel=REL) and sim["ttft_s"] > 0.0


@pytest.mark.parametrize("scheduler", [ks.CONTINUOUS, ks.STATIC, ks.UNCHUNKED])
def test_saturated_closed_loop_equals_the_waves(fast, scheduler):
    """16 users, batch 8, 64-token prompts (8 x 64 = 512 tokens: one prefill iteration),
    16 output tokens, 64 requests: the engine runs 8 identical waves; each request after the
    first wave waits one period, so the median TTFT is period - decode (= e2e - decode of the
    closed form, e2e = 16 / 8 periods), TPOT is exact and the throughput is 8 x 16 / period."""
    srv = toy_srv()
    wl = workload(input_len=64.0, concurrency=16.0)
    closed = analytic(fast, srv, wl, max_batch=8.0, max_tokens=512.0, scheduler=scheduler)
    sim, _ = run_sim(fast, srv, [64.0] * 64, [16.0] * 64, clients=16, max_batch=8.0, max_tokens=512.0,
                     scheduler=scheduler)
    assert closed["batch"] == 8
    assert sim["ttft_p50_s"] == pytest.approx(closed["ttft_s"], rel=REL)
    assert sim["tpot_s"] == pytest.approx(closed["tpot_s"], rel=REL)
    assert sim["tpot_p90_s"] == pytest.approx(closed["tpot_s"], rel=REL)
    assert sim["output_tokens_per_s"] == pytest.approx(closed["output_tokens_per_s_per_gpu"], rel=REL)
    assert sim["iterations"] == 8 * 16


def lognormal_requests(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    in_len = np.maximum(np.rint(rng.lognormal(np.log(300), 0.6, n)), 1.0)
    out_len = np.maximum(np.rint(rng.lognormal(np.log(40), 0.5, n)), 1.0)
    return in_len, out_len, rng.exponential(1.0, n)


@pytest.mark.parametrize("clients, rate", [(0, 400.0), (24, 0.0)])
def test_littles_law(fast, clients, rate):
    """The time-average number in the system (integrated iteration by iteration) equals the
    completion rate times the mean latency (per request) on a Poisson and a closed-loop run."""
    in_len, out_len, gaps = lognormal_requests(400)
    sim, _ = run_sim(fast, toy_srv(), in_len, out_len, gaps, clients=clients, rate=rate, max_batch=32.0,
                     max_tokens=1024.0)
    assert sim["stuck"] == 0
    assert sim["concurrency"] == pytest.approx(sim["requests_per_s"] * sim["e2e_latency_s"], rel=1e-9)
    if clients:  # every user has one request in the system until the last ones are not replaced
        assert sim["concurrency"] <= clients


@pytest.mark.parametrize("max_batch, max_tokens, scheduler", [(16, 8192, ks.CONTINUOUS), (256, 2048, ks.CONTINUOUS),
                                                             (16, 8192, ks.STATIC)])
def test_an_overloaded_engine_serves_the_largest_rate_it_sustains(fast, max_batch, max_tokens, scheduler):
    """Offered more than it sustains, an engine runs at its limit (``kernels.serving.saturated_t``:
    the batch limit, 16; or the token budget, 2048, of 15 q / E decode rows and 512-token
    prompts per request; static waves of 16) and serves one rate whatever is offered. On the
    bytes-bound toy the time of an iteration grows by less than its load, so that rate is the
    largest at which the engine is stable: the rate bisected between the last stable and the
    first overloaded one, to 1e-10. Before, the rate and TPOT came from whichever iterate
    first left the limits, at 1e6 requests/s the batch of one token's, and under the token
    budget the served rate was the one offered."""
    def at(rate: float) -> dict:
        return analytic(fast, toy_srv(), workload(concurrency=0.0, rate_per_s=rate), max_batch=max_batch,
                        max_tokens=max_tokens, scheduler=scheduler)

    stable, over = 1.0, 1e6
    assert at(stable)["reason"] == ks.OK and at(over)["reason"] == ks.OVERLOADED
    while over - stable > 1e-10 * stable:
        mid = 0.5 * (stable + over)
        stable, over = (mid, over) if at(mid)["reason"] == ks.OK else (stable, mid)
    for offered in (over * (1 + 1e-9), 2.0 * over, 1e3 * over):
        row = at(offered)
        assert row["reason"] == ks.OVERLOADED and math.isinf(row["ttft_s"])
        assert row["requests_per_s"] == pytest.approx(stable, rel=1e-8), offered
        # the same iteration at every rate offered, so the same TPOT and batch
        assert row["tpot_s"] == pytest.approx(at(over)["tpot_s"], rel=1e-12)
        assert row["batch"] == pytest.approx(at(over)["batch"], rel=1e-12)
    if scheduler == ks.CONTINUOUS and max_tokens == 2048:  # the budget binds before the batch
        assert at(over)["batch"] < max_batch


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_batch=st.integers(1, 512), max_tokens=st.integers(600, 16384), input_len=st.integers(8, 512),
       output_len=st.integers(2, 300), scheduler=st.sampled_from([ks.STATIC, ks.CONTINUOUS, ks.UNCHUNKED]),
       overlap=st.booleans(), hit=st.sampled_from([0.0, 0.5]), rate=st.floats(1e4, 1e8))
def test_an_overloaded_engine_serves_one_rate_below_the_offered(fast, max_batch, max_tokens, input_len, output_len,
                                                                scheduler, overlap, hit, rate):
    """Property over engine limits, lengths, schedulers and offered rates: an overloaded
    engine serves less than is offered, the same rate, TPOT and batch at ten times the
    offered rate (its iterations run at its limit, which the rate does not move), a batch
    within its limit, and an infinite TTFT."""
    def at(offered: float) -> dict:
        wl = workload(concurrency=0.0, rate_per_s=offered, input_len=float(input_len), output_len=float(output_len),
                      prefix_hit_rate=hit)
        return analytic(fast, toy_srv(), wl, max_batch=float(max_batch), max_tokens=float(max_tokens),
                        scheduler=scheduler, overlap=overlap)

    row = at(rate)
    if row["reason"] != ks.OVERLOADED:  # out of memory, a prompt over an unchunked budget, or (rarely) stable
        return
    more = at(10.0 * rate)
    assert more["reason"] == ks.OVERLOADED
    assert 0.0 < row["requests_per_s"] < rate
    for key in ("requests_per_s", "tpot_s", "batch"):
        assert more[key] == pytest.approx(row[key], rel=1e-12), key
    assert row["batch"] <= max_batch * (1 + 1e-12) and math.isinf(row["ttft_s"])


@pytest.mark.parametrize("rate, overloaded", [(300.0, False), (30000.0, True)])
def test_overload_is_detected_and_capacity_measured(fast, rate, overloaded):
    """A Poisson engine below its capacity sustains the arrival rate (n / the last arrival) and
    its TTFT stays flat; far above it the queue grows and the sustained rate is its capacity,
    well below the offered one."""
    in_len, out_len, gaps = lognormal_requests(500, seed=5)
    sim, _ = run_sim(fast, toy_srv(), in_len, out_len, gaps, rate=rate, max_batch=32.0, max_tokens=1024.0)
    assert sim["overloaded"] == overloaded
    if overloaded:
        assert sim["sustained_requests_per_s"] < 0.5 * rate
    else:
        last_arrival = np.cumsum(gaps)[-1] / rate
        assert sim["sustained_requests_per_s"] == pytest.approx(500 / last_arrival, rel=REL)


def test_preemption_frees_the_cache_and_every_request_finishes(fast):
    """A cache of 3000 tokens under 16 users of ~300 + 40 tokens: admission by the prompt
    overcommits the cache, decode growth then preempts, and every request still completes."""
    in_len, out_len, gaps = lognormal_requests(200)
    sim, _ = run_sim(fast, toy_srv(), in_len, out_len, gaps, clients=16, max_batch=16.0, max_tokens=2048.0,
                     cap=3000.0)
    assert sim["stuck"] == 0 and sim["preemptions"] > 0
    assert sim["kv_peak_tokens"] <= 3000


@pytest.mark.parametrize("scheduler", [ks.CONTINUOUS, ks.UNCHUNKED])
def test_prompts_per_iteration_by_hand(fast, scheduler):
    """Three users send 100-token prompts of one output token each under a budget of 250
    tokens, no host time. Chunked: iteration 1 computes prompts 1 and 2 and 50 tokens of 3
    (250 tokens; causal pairs 100 x 50 + 100 x 50 + 50 x 25 = 11,250, plus the attention
    kernel's fill of 225 keys a prompt row, 250 x 225 = 56,250: 67,500 pair-equivalents; two
    prompts complete), iteration 2 the other 50 (50 x (50 + 25 + 225) = 15,000; one
    completes). Unchunked: prompt 3 does not fit the 50 tokens left, so iteration 1 computes
    prompts 1 and 2 (200 tokens, 10,000 + 45,000 = 55,000) and iteration 2 prompt 3 whole
    (100 tokens, 5,000 + 22,500 = 27,500).
    Every first token is its request's end: TTFT = e2e, the mean of (t1, t1, t1 + t2)."""
    sim, (g, h, _, pair_coef, _, _, _) = run_sim(fast, toy_srv(), [100.0] * 3, [1.0] * 3, clients=3,
                                                 max_tokens=250.0, scheduler=scheduler)
    cost = lambda tokens, rows, pairs: (serving_sim.lookup(GRID, g, tokens) + serving_sim.lookup(GRID, h, rows)
                                        + pair_coef * pairs)
    if scheduler == ks.UNCHUNKED:
        t1, t2 = cost(200.0, 2.0, 55_000.0), cost(100.0, 1.0, 27_500.0)
    else:
        t1, t2 = cost(250.0, 2.0, 67_500.0), cost(50.0, 1.0, 15_000.0)
    assert sim["iterations"] == 2
    assert sim["ttft_s"] == pytest.approx((3.0 * t1 + t2) / 3.0, rel=REL)
    assert sim["makespan_s"] == pytest.approx(t1 + t2, rel=REL)


@pytest.mark.parametrize("overlap", [False, True])
def test_overlap_scheduler_admits_an_arrival_one_iteration_later_by_hand(fast, overlap):
    """Two users; 10-token prompts; request 0 wants 2 tokens, request 1 five, request 2
    (user 0's next) one; no host time. Iteration 1 prefills 0 and 1 (20 tokens, 2 rows,
    pairs 2 x 10 x 5 = 100 plus the attention kernel's fill, 20 rows x 225: 4,600); iteration 2 decodes both (KV read 11 + 11 = 22) and request 0
    ends, so request 2 arrives at t2. Without overlap iteration 3 prefills it beside request
    1's decode (11 tokens, 2 rows, KV read 12, pairs 50 + 10 x 225 = 2,300): TTFT_2 = t(3). With the overlap
    scheduler iteration 3's batch was chosen when iteration 2 started, and iteration 4's
    when iteration 3 started, at t2 itself, before the engine had reported request 0's
    end: iterations 3 and 4 decode request 1 alone (1 token, KV read 12, then 13),
    iteration 5 takes request 2 (11 tokens, 2 rows, KV read 14, pairs 2,300): TTFT_2 =
    t(3') + t(4') + t(5). Requests 0 and 1 see t(1). Mean TTFT = (2 t(1) + TTFT_2) / 3."""
    sim, (g, h, kv_coef, pair_coef, _, _, _) = run_sim(fast, toy_srv(), [10.0] * 3, [2.0, 5.0, 1.0], clients=2,
                                                        overlap=overlap)
    cost = lambda tokens, rows, kv, pairs: (serving_sim.lookup(GRID, g, tokens) + serving_sim.lookup(GRID, h, rows)
                                            + kv_coef * kv + pair_coef * pairs)
    t1 = cost(20.0, 2.0, 0.0, 4_600.0)
    ttft_2 = (cost(1.0, 1.0, 12.0, 0.0) + cost(1.0, 1.0, 13.0, 0.0) + cost(11.0, 2.0, 14.0, 2_300.0) if overlap
              else cost(11.0, 2.0, 12.0, 2_300.0))
    assert sim["ttft_s"] == pytest.approx((2.0 * t1 + ttft_2) / 3.0, rel=REL)


def test_unchunked_prompt_over_the_budget_is_stuck_in_the_simulation_and_explained_by_the_tier(fast):
    """Whole prompts only: a 600-token prompt never fits a 512-token iteration. The
    simulation stops (stuck, NaN latencies) instead of spinning; the analytic tier marks
    the candidate prompt-too-long; chunked, the same prompt takes two iterations."""
    sim, _ = run_sim(fast, toy_srv(), [600.0], [4.0], clients=1, max_tokens=512.0, scheduler=ks.UNCHUNKED)
    assert sim["stuck"] == 1 and math.isnan(sim["ttft_s"])
    chunked, _ = run_sim(fast, toy_srv(), [600.0], [4.0], clients=1, max_tokens=512.0, scheduler=ks.CONTINUOUS)
    assert chunked["stuck"] == 0 and chunked["iterations"] == 2 + 3
    wl = workload(input_len=600.0, longest_prompt_len=600.0, concurrency=1.0)
    assert analytic(fast, toy_srv(), wl, max_batch=8.0, max_tokens=512.0, scheduler=ks.UNCHUNKED)["reason"] \
        == ks.PROMPT_TOO_LONG
    assert analytic(fast, toy_srv(), wl, max_batch=8.0, max_tokens=512.0, scheduler=ks.CONTINUOUS)["reason"] == ks.OK


def test_a_request_larger_than_the_cache_is_stuck_not_a_hang(fast):
    sim, _ = run_sim(fast, toy_srv(), [512.0], [16.0], clients=1, cap=100.0)
    assert sim["stuck"] == 1 and math.isnan(sim["ttft_s"])


def test_simulation_is_deterministic(fast):
    in_len, out_len, gaps = lognormal_requests(300, seed=7)
    runs = [run_sim(fast, toy_srv(), in_len, out_len, gaps, rate=300.0, max_batch=32.0, max_tokens=512.0)[0]
            for _ in range(2)]
    assert runs[0] == runs[1] or all(
        (a == b) or (math.isnan(a) and math.isnan(b)) for a, b in zip(runs[0].values(), runs[1].values()))


# --------------------------------------------------------------------------- plain-Python references


@pytest.mark.parametrize("case", [
    dict(clients=16, rate=0.0, cap=None, scheduler=ks.CONTINUOUS, max_tokens=700.0),
    dict(clients=0, rate=350.0, cap=None, scheduler=ks.CONTINUOUS, max_tokens=512.0),
    dict(clients=0, rate=350.0, cap=None, scheduler=ks.STATIC, max_tokens=512.0),
    dict(clients=12, rate=0.0, cap=2500.0, scheduler=ks.CONTINUOUS, max_tokens=1024.0),
    dict(clients=16, rate=0.0, cap=None, scheduler=ks.UNCHUNKED, max_tokens=2600.0),
    dict(clients=0, rate=350.0, cap=2500.0, scheduler=ks.UNCHUNKED, max_tokens=2600.0),
    dict(clients=16, rate=0.0, cap=None, scheduler=ks.UNCHUNKED, max_tokens=2600.0, overlap=True),
    dict(clients=0, rate=350.0, cap=2500.0, scheduler=ks.CONTINUOUS, max_tokens=700.0, overlap=True),
    dict(clients=16, rate=0.0, cap=None, scheduler=ks.CONTINUOUS, max_tokens=700.0, steady=True),
    dict(clients=12, rate=0.0, cap=2500.0, scheduler=ks.CONTINUOUS, max_tokens=1024.0, steady=True),
    dict(clients=0, rate=350.0, cap=None, scheduler=ks.CONTINUOUS, max_tokens=512.0, steady=True),  # no burst
])
def test_simulation_agrees_with_the_reference(fast, case):
    in_len, out_len, gaps = lognormal_requests(150, seed=3)
    sim, (g, h, kv_coef, pair_coef, cap, _, _) = run_sim(
        fast, toy_srv(), in_len, out_len, gaps, clients=case["clients"], rate=case["rate"], max_batch=16.0,
        max_tokens=case["max_tokens"], scheduler=case["scheduler"], overlap=case.get("overlap", False), host=2e-5,
        hit=0.25, cap=case["cap"], steady=case.get("steady", False))
    ref = naive_simulate(list(in_len), list(out_len), list(gaps), clients=case["clients"], rate=case["rate"],
                         max_batch=16, max_tokens=case["max_tokens"], scheduler=case["scheduler"],
                         cap=float(cap), host=2e-5, kv_coef=float(kv_coef), pair_coef=float(pair_coef), hit=0.25,
                         grid=list(GRID), g=list(g), h=list(h), overlap=case.get("overlap", False),
                         steady=case.get("steady", False))
    for key in ("ttft_s", "ttft_p50_s", "ttft_p90_s", "tpot_s", "tpot_p90_s", "e2e_latency_s", "makespan_s",
                "concurrency", "preemptions"):
        assert sim[key] == pytest.approx(ref[key], rel=REL), key


def test_lookup_agrees_with_the_reference():
    table = np.sqrt(GRID)
    for x in (0.0, 1.0, 1.2, 5.0, 100.0, 3e6, 2e7):
        assert serving_sim.lookup(GRID, table, x) == pytest.approx(lookup(list(GRID), list(table), x), rel=REL)


#: workloads the analytic tier is checked on against the plain-Python reference: closed
#: loop and Poisson, continuous and static batching
REFERENCE_CASES = [
    ({"concurrency": 40.0, "input_len": 700.0, "output_len": 90.0}, ks.CONTINUOUS),
    ({"concurrency": 40.0, "input_len": 700.0, "output_len": 90.0}, ks.STATIC),
    ({"concurrency": 0.0, "rate_per_s": 30.0, "prefix_hit_rate": 0.5}, ks.CONTINUOUS),
    ({"concurrency": 0.0, "rate_per_s": 30.0}, ks.STATIC),
    ({"concurrency": 40.0, "input_len": 700.0, "output_len": 90.0}, ks.UNCHUNKED),
    ({"concurrency": 0.0, "rate_per_s": 30.0, "prefix_hit_rate": 0.5}, ks.UNCHUNKED),
    ({"concurrency": 0.0, "rate_per_s": 30.0, "overlap": True}, ks.CONTINUOUS),
    ({"concurrency": 40.0, "input_len": 700.0, "output_len": 90.0, "overlap": True}, ks.UNCHUNKED),
    ({"concurrency": 0.0, "rate_per_s": 2.0, "input_len": 5000.0}, ks.CONTINUOUS),  # a prompt of 3 chunks
    ({"concurrency": 41.0, "input_len": 700.0, "output_len": 90.0}, ks.CONTINUOUS),  # 21 and 20 users on the 2 engines
    ({"concurrency": 1.0, "input_len": 700.0, "output_len": 90.0}, ks.STATIC),  # one user: an engine idle
    # 2 users an engine whose 2 x 300 prompt tokens one iteration takes: alike requests run in waves
    ({"concurrency": 4.0, "input_len": 300.0, "output_len": 90.0}, ks.CONTINUOUS),
    ({"concurrency": 4.0, "input_len": 300.0, "output_len": 90.0}, ks.UNCHUNKED),
    # the same means, lengths that differ: the users spread out
    ({"concurrency": 4.0, "input_len": 300.0, "output_len": 90.0, "longest_input_len": 900.0,
      "longest_seq_len": 1000.0}, ks.CONTINUOUS),
]


def in_step(wl) -> bool:
    """Whether a workload's requests all have its mean lengths (``kernels.serving``: a closed
    loop of such requests runs in waves where one iteration takes their prompts)."""
    return bool(wl.longest_input_len[0] <= wl.input_len[0]
                and wl.longest_seq_len[0] <= wl.input_len[0] + wl.output_len[0])


@pytest.mark.parametrize("wl_change, scheduler", REFERENCE_CASES)
def test_analytic_tier_agrees_with_the_reference(fast, wl_change, scheduler):
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv()
    wl_change = dict(wl_change)
    overlap = wl_change.pop("overlap", False)
    wl = workload(host_s=1e-4, **wl_change)
    out = analytic(fast, srv, wl, max_batch=32.0, max_tokens=2048.0, scheduler=scheduler, overlap=overlap, instances=2.0)
    ref = steady_state(lambda t: ks.rows_s(m, d, tiers, tiles, srv[0], float(t)),
                       lambda r: ks.head_rows_s(m, d, tiers, tiles, srv[0], float(r)),
                       ks.kv_s_per_token(m, d, tiers, tiles, srv[0]), ks.pair_s(m, d, srv[0]),
                       ks.kv_capacity_tokens(m, d, srv[0]), input_len=wl.input_len[0], output_len=wl.output_len[0],
                       hit=wl.prefix_hit_rate[0], concurrency=wl.concurrency[0], rate=wl.rate_per_s[0],
                       host=1e-4, max_batch=32.0, max_tokens=2048.0, scheduler=scheduler, engines=2.0,
                       devices=1.0, overlap=overlap, in_step=in_step(wl))
    assert ref["stable"] == (out["reason"] != ks.OVERLOADED)
    for key in ("batch", "ttft_s", "tpot_s", "e2e_latency_s", "requests_per_s", "output_tokens_per_s_per_gpu"):
        assert out[key] == pytest.approx(ref[key], rel=1e-10), key


#: disaggregated rows against ``naive_serving.disagg_steady_state``: (workload changes, max_batch,
#: max_tokens); the toy's host cost (1e-4 s an iteration) makes a prompt alone cost more than
#: an eighth of eight (t_1 2.1e-4 s, t_8 9.8e-4 s)
DISAGG_CASES = [
    ({"concurrency": 16.0}, 256.0, 4096.0),  # neither side saturated
    ({"concurrency": 4096.0}, 4096.0, 512.0),  # one prompt an iteration: the prefill replica bounds the rate
    ({"concurrency": 256.0}, 4.0, 4096.0),  # the decode batch limit bounds it (X(4) < mu)
    ({"concurrency": 16.0, "prefix_hit_rate": 0.5, "output_len": 40.0}, 256.0, 2048.0),
    ({"concurrency": 0.0, "rate_per_s": 2000.0}, 256.0, 4096.0),  # a prompt alone: the one-prompt queue
    ({"concurrency": 0.0, "rate_per_s": 6000.0}, 256.0, 4096.0),  # rho_1 > 1: the batched queue
    ({"concurrency": 0.0, "rate_per_s": 9000.0}, 256.0, 4096.0),  # past mu = 8 / t_8: overloaded
]


@pytest.mark.parametrize("wl_change, max_batch, max_tokens", DISAGG_CASES)
def test_disaggregated_analytic_tier_agrees_with_the_reference(fast, wl_change, max_batch, max_tokens):
    """``kernels.serving.disagg_one`` against its plain-Python reference, which solves for the
    decode batch to the last bit rather than by the kernel's fixed halvings: one prefill
    replica and two decode engines of one device each."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv(n_gpus=3.0)
    wl = workload(host_s=1e-4, devices=3.0, **wl_change)
    out = analytic(fast, srv, wl, max_batch=max_batch, max_tokens=max_tokens, instances=2.0, prefill=srv)
    ref = disagg_steady_state(lambda b: ks.decode_rows_s(m, d, tiers, tiles, srv[0], float(b)),
                              lambda t: ks.rows_s(m, d, tiers, tiles, srv[0], float(t)),
                              lambda r: ks.head_rows_s(m, d, tiers, tiles, srv[0], float(r)),
                              ks.pair_s(m, d, srv[0]), ks.kv_s_per_token(m, d, tiers, tiles, srv[0]),
                              ks.kv_transfer_s(m, tiers, srv[0], wl.input_len[0], 3.0),
                              ks.kv_capacity_tokens(m, d, srv[0]), ks.kv_capacity_tokens(m, d, srv[0]),
                              input_len=wl.input_len[0], output_len=wl.output_len[0], hit=wl.prefix_hit_rate[0],
                              concurrency=wl.concurrency[0], rate=wl.rate_per_s[0], host=1e-4, max_batch=max_batch,
                              max_tokens=max_tokens, engines=2.0, prefill_replicas=1.0)
    assert ref["stable"] == (out["reason"] != ks.OVERLOADED)
    assert out["prefill_s"] == pytest.approx(ref["prefill_s"], rel=1e-12)
    if ref["stable"]:
        for key in ("batch", "ttft_s", "tpot_s", "e2e_latency_s", "requests_per_s"):
            assert out[key] == pytest.approx(ref[key], rel=1e-10), key


def test_disaggregated_screen_agrees_with_the_simulation_on_the_llama_space():
    """The screen (analytic tier) of 24 of the Llama space's disaggregated rows, drawn at random,
    against their simulation: TTFT a median within 5% (1.00x; the M/D/1 prefill queue it had
    before gave 1.54x) and every row's throughput within 3% (0.89-1.00x before)."""
    space = sp.load_serving("llama3.1-70b-h100-8-fp8")
    cols = serve.encode(space).columns
    packed = serve.pack_serving(space)
    srv, pre = serve.serving_records(space, cols), serve.serving_records(space, cols, prefill=True)
    m = serve.analytic(packed, srv, cols, pre)
    n = cols["tp"].shape[0]
    m.update(simulated=np.zeros(n), ttft_p90_s=np.full(n, np.nan), tpot_p90_s=np.full(n, np.nan))
    screen = {k: m[k].copy() for k in ("ttft_s", "requests_per_s")}
    ok = np.flatnonzero(np.isfinite(m["ttft_s"]) & (cols["mode"] == ks.DISAGG) & serve.simulable(space, m["engines"]))
    rows = np.sort(np.random.default_rng(0).choice(ok, size=24, replace=False))
    serve.simulate(space, packed, srv, cols, m, rows, pre)
    assert (m["simulated"][rows] > 0).all()
    ttft = screen["ttft_s"][rows] / m["ttft_s"][rows]
    served = screen["requests_per_s"][rows] / m["requests_per_s"][rows]
    assert abs(np.median(ttft) - 1.0) < 0.05, np.round(ttft, 3)
    assert (abs(served - 1.0) < 0.03).all(), np.round(served, 3)


def ranked_digest(name: str) -> str:
    import hashlib

    ranked, _ = __import__("paraspace.explorer.serve", fromlist=["evaluate_space"]).evaluate_space(
        sp.load_serving(name), simulate_top=3)
    digest = hashlib.sha256()
    for key in sorted(ranked):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(ranked[key]).tobytes())
    return digest.hexdigest()


def test_serve_is_deterministic_across_processes():
    """The ranked columns (analytic and simulated, lognormal Poisson workload) are bit-identical
    in another process."""
    import subprocess
    import sys

    here = ranked_digest("qwen3-235b-a22b-h200-8")
    code = ("import sys; sys.path.insert(0, %r); from test_serving import ranked_digest; "
            "print(ranked_digest('qwen3-235b-a22b-h200-8'))" % str(Path(__file__).parent))
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == here


@pytest.mark.parametrize("slow, fast_", [(1e12, 2e12), (2e12, 8e12)])
def test_more_bandwidth_never_slows_an_iteration(make_device, make_tiers, toy_tiles, slow, fast_):
    """Monotonicity: the same iterations on faster HBM and links take no longer."""
    m = toy_model(experts=8.0, top_k=2.0, expert_ffn=512.0)[0]
    srv = toy_srv(tp=2.0, n_gpus=2.0)[0]
    times = []
    for bw in (slow, fast_):
        dev = make_device(hbm_bytes_per_s=bw, launch_s=4e-6)[0]
        tiers = make_tiers((8, bw / 10, 2e-6), (0, bw / 100, 5e-6))
        kv = ks.kv_s_per_token(m, dev, tiers, toy_tiles, srv)
        times.append([ks.iteration_s(m, dev, tiers, toy_tiles, srv, 1e-4, kv, ks.pair_s(m, dev, srv), t, r, t * 900, 0.0,
                                     t - r, r)
                      for t, r in ((1.0, 1.0), (16.0, 16.0), (600.0, 8.0), (4096.0, 64.0))])
    assert all(b <= a for a, b in zip(*times))


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("name", sp.names())
def test_serve_writes_a_ranked_parquet(tmp_path, name):
    target = tmp_path / f"{name}.parquet"
    result = CliRunner().invoke(main, ["serve", name, "--out", str(target), "-n", "3", "--simulate-top", "4"])
    assert result.exit_code == 0, result.output
    assert "top 3" in result.output and str(target) in result.output
    table = pq.read_table(target)
    assert table.schema.names == [c.name for c in serving_schema.COLUMNS]
    frame = table.to_pydict()
    feasible, simulated = frame["feasible"], frame["simulated"]
    # feasible rows first, the simulated ones of each class before the rest
    classes = [(not f, not s) for f, s in zip(feasible, simulated)]
    assert classes == sorted(classes)
    # the first round simulates 4; a row the simulation lowers or rejects hands its place to another
    assert 4 <= sum(simulated) <= 4 * serve.REFINE_ROUNDS
    for f, s in {*zip(feasible, simulated)}:  # throughput per GPU descending within a class
        tps = [frame["output_tokens_per_s_per_gpu"][i] for i in range(len(feasible))
               if (feasible[i], simulated[i]) == (f, s)]
        assert tps == sorted(tps, reverse=True)
    assert all(frame["infeasible_reason"][i] == "ok" for i, f in enumerate(feasible) if f)
    # the head of the ranking is what the simulation checked (the catalog spaces need no more rounds)
    assert all(simulated[:min(4, sum(feasible))])
    # and `paraspace top` reads the file back in the order it was written
    assert top(target, n=len(feasible))["row_id"].to_list() == frame["row_id"]


def test_rank_order_by_hand():
    """feasible, then simulated, then throughput per GPU (descending), then TTFT (ascending),
    NaN last within each, row_id breaking the rest."""
    cols = {"row_id": np.array([0, 1, 2, 3, 4, 5, 6])}
    metrics = {"feasible": np.array([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]),
               "simulated": np.array([0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]),
               "output_tokens_per_s_per_gpu": np.array([900.0, 500.0, 500.0, 990.0, np.nan, 900.0, 950.0]),
               "ttft_s": np.array([0.2, 0.3, 0.1, 0.1, 0.1, np.nan, 0.5])}
    # simulated feasible: 2 (TTFT 0.1) before 1 (0.3); unsimulated feasible: 6 (950), then 0 and 5
    # (900; TTFT 0.2 before NaN), then 4 (NaN throughput); the infeasible 3 last
    assert serve.rank_order(cols, metrics).tolist() == [2, 1, 6, 0, 5, 4, 3]
    assert serve.rank_order(cols, metrics, np.array([0, 3, 5])).tolist() == [0, 5, 3]


def test_poisson_sample_offers_the_rate():
    """The gaps of a Poisson sample are scaled to a mean of 1: n arrivals span n / rate
    whatever the seed, so a stable engine's simulated request rate is the workload's."""
    space = sp.load_serving("qwen3-235b-a22b-h200-8")
    for seed in (0, 1, 7):
        wl = space.spec.workload.model_copy(update={"seed": seed})
        spec = space.spec.model_copy(update={"workload": wl})
        _, _, gaps = serve.sample_requests(dataclasses.replace(space, spec=spec))
        assert gaps.shape == (wl.n_requests,) and (gaps > 0).all()
        assert gaps.sum() == pytest.approx(wl.n_requests, rel=1e-12)
    cols = serve.encode(space).columns
    metrics = serve.evaluate_columns(space, cols, simulate_top=4)
    stable = (metrics["simulated"] > 0) & (metrics["reason"] != ks.OVERLOADED)
    assert stable.any()
    # the rate is measured up to the last arrival: n / (n / rate)
    assert metrics["requests_per_s"][stable] == pytest.approx(space.spec.workload.rate_per_s, rel=1e-9)


def test_serve_dry_run_explains_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["serve", "llama3.1-70b-h100-8-fp8", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "disagg_budget" in result.output and "kept" in result.output
    assert list(tmp_path.iterdir()) == []


def test_serve_bad_space_is_an_error_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\ndescription = "d"\nmodel = "llama3-8b"\nhardware = "h100-sxm5-80gb"\ndevices = 8\n'
                   '[workload]\ninput_len = { distribution = "pareto", mean = 5 }\noutput_len = 4\nconcurrency = 2\n')
    result = CliRunner().invoke(main, ["serve", str(bad)])
    assert result.exit_code == 2
    assert "workload.input_len.distribution" in result.output and "Traceback" not in result.output


def test_bench_runs_and_agrees(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_serving.py"
    spec = importlib.util.spec_from_file_location("bench_serving", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--rows", "300", "--configs", "2", "--requests", "40", "--reference", "1"])
    out = capsys.readouterr().out
    agree = [float(m.group(1)) for m in re.finditer(r"agrees? to (\S+)", out)]
    # analytic (closed loop, Poisson, disaggregated closed loop), aggregated and disaggregated simulation
    assert len(agree) == 5 and max(agree) < 1e-12, out


def test_lengths_the_cache_cannot_hold_are_an_explained_row_not_a_traceback(tmp_path):
    """Llama 3 8B on one H100 holds ~0.47M KV tokens; lognormal prompts of mean 100k and sigma 1.5
    send some of several million tokens: every candidate is infeasible with kv-too-small."""
    path = tmp_path / "long.toml"
    path.write_text('name = "long"\ndescription = "d"\nmodel = "llama3-8b"\nhardware = "h100-sxm5-80gb"\n'
                    'devices = 1\nsimulate_top = 2\n[workload]\n'
                    'input_len = { distribution = "lognormal", mean = 100000, sigma = 1.5 }\noutput_len = 100\n'
                    'concurrency = 4\nn_requests = 200\n')
    target = tmp_path / "long.parquet"
    result = CliRunner().invoke(main, ["serve", str(path), "--out", str(target)])
    assert result.exit_code == 0, result.output
    frame = pq.read_table(target).to_pydict()
    assert frame["infeasible_reason"] == ["kv-too-small"] and frame["feasible"] == [False]


def test_catalog_serving_spaces_ship_as_package_data():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"catalog/*/*.toml"' in text  # covers spaces/catalog/serving/*.toml
    assert {"llama3.1-70b-h100-8-fp8", "qwen3-235b-a22b-h200-8"} <= set(sp.names())


@pytest.mark.parametrize(("path", "value"), [(("workload", "input_len"), 1e300), (("workload", "rate_per_s"), float("inf")),
                                             (("workload", "input_len"), 5e-324),
                                             (("workload", "output_len", "sigma"), 6.0),
                                             (("sla", "ttft_s"), float("nan")), (("host_overhead_us",), 1e30)])
def test_serving_numbers_are_bounded(path, value):
    """Serving lengths, rates and latencies are finite and at most 2**24, as the catalog's counts."""
    from paraspace.spaces.catalog import read_toml
    from paraspace.spaces.errors import CatalogError
    from paraspace.spaces.serving import SERVING_DIR, serving_from_raw

    raw = read_toml(SERVING_DIR / "qwen3-235b-a22b-h200-8.toml")
    target = raw
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    with pytest.raises(CatalogError, match=path[-1]):
        serving_from_raw(raw, "t.toml", SERVING_DIR)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 24), clients=st.integers(0, 6), scheduler=st.sampled_from([ks.STATIC, ks.CONTINUOUS, ks.UNCHUNKED]),
       overlap=st.booleans(), max_tokens=st.sampled_from([64.0, 300.0, 4096.0]), cap=st.sampled_from([None, 900.0]),
       seed=st.integers(0, 2**16))
def test_simulation_equals_the_reference_on_random_runs(fast, n, clients, scheduler, overlap, max_tokens, cap, seed):
    """Property over every scheduler, with and without the overlap scheduler, a closed loop
    or Poisson arrivals, budgets below and above the prompts, a small cache that preempts:
    the kernel and the plain-Python reference give the same run, or both find it stuck
    (a prompt over an unchunked budget, a request over the cache)."""
    rng = np.random.default_rng(seed)
    in_len = np.maximum(np.rint(rng.lognormal(np.log(120), 0.7, n)), 1.0)
    out_len = np.maximum(np.rint(rng.lognormal(np.log(12), 0.6, n)), 1.0)
    gaps = rng.exponential(1.0, n)
    rate = 0.0 if clients else 300.0
    sim, (g, h, kv_coef, pair_coef, capacity, _, _) = run_sim(
        fast, toy_srv(), in_len, out_len, gaps, clients=clients, rate=rate, max_batch=4.0, max_tokens=max_tokens,
        scheduler=scheduler, overlap=overlap, host=1e-5, cap=cap)
    try:
        ref = naive_simulate(list(in_len), list(out_len), list(gaps), clients=clients, rate=rate, max_batch=4,
                             max_tokens=max_tokens, scheduler=scheduler, cap=float(capacity), host=1e-5,
                             kv_coef=float(kv_coef), pair_coef=float(pair_coef), hit=0.0, grid=list(GRID), g=list(g),
                             h=list(h), overlap=overlap)
    except AssertionError as stuck:
        assert "stuck" in str(stuck) and sim["stuck"] == 1
        return
    assert sim["stuck"] == 0
    for key in ("ttft_s", "ttft_p90_s", "tpot_s", "e2e_latency_s", "makespan_s", "concurrency", "preemptions"):
        assert sim[key] == pytest.approx(ref[key], rel=REL, nan_ok=True), key


def test_first_round_simulates_the_best_analytic_rows_whatever_their_sla_verdict():
    """The closed forms' latencies are not the simulation's, so the first round takes the
    best by analytic throughput per GPU, SLA misses included: on the Llama space with its
    TTFT target at 0.7 s (the catalog's is 2 s) two of the best four (disaggregated
    deployments) miss it by the closed forms (0.71 and 0.78 s), and all four are simulated."""
    space = sp.load_serving("llama3.1-70b-h100-8-fp8")
    sla = space.spec.sla.model_copy(update={"ttft_s": 0.7})
    space = dataclasses.replace(space, spec=space.spec.model_copy(update={"sla": sla}))
    cols = serve.encode(space).columns
    analytic = serve.evaluate_columns(space, cols, simulate_top=0)
    runnable = np.isin(analytic["reason"], [ks.OK, ks.SLA_TTFT, ks.SLA_TPOT])
    best = serve.rank_order(cols, {**analytic, "feasible": np.ones(len(runnable))}, np.flatnonzero(runnable))[:4]
    assert (analytic["reason"][best] != ks.OK).any()  # the case this test is about
    simulated = serve.evaluate_columns(space, cols, simulate_top=4)
    assert (simulated["simulated"][best] == 1).all()


def test_poisson_ttft_carries_the_prompt_at_its_own_cost(fast):
    """TTFT under a Poisson stream = half the mean iteration t + the iterations that carry
    the prompt, each at its own cost: at 0.001 requests/s a prompt of 5000 tokens in a
    budget of 2048 takes 3 iterations (2048, 2048 and 904 tokens beside the vanishing
    decode batch b, the head on b rows and, in the last one, the prompt's first token;
    the prompt's causal pairs once). The simulation of requests 1000 s apart has no
    half iteration to wait and no fractional batch, whose head still reads the LM
    head's weights (two reads here, 8% of the prompt): it lands within that of the prompt."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv()
    host = 1e-4
    wl = workload(concurrency=0.0, rate_per_s=1e-3, input_len=5000.0, output_len=4.0, host_s=host)
    out = analytic(fast, srv, wl, max_tokens=2048.0)
    kv, pc = ks.kv_s_per_token(m, d, tiers, tiles, srv[0]), ks.pair_s(m, d, srv[0])
    b = out["batch"]
    assert 0.0 < b < 1e-5

    def chunk(tokens, rows, pairs):  # one iteration: the decode batch b (5002 cached tokens each) and a chunk
        return ks.iteration_s(m, d, tiers, tiles, srv[0], host, kv, pc, b + tokens, b + rows, b * 5002.0, pairs,
                              tokens, b)

    prompt = 2.0 * chunk(2048.0, 0.0, 0.0) + chunk(904.0, 1.0, ks.prompt_pairs(5000.0, 0.0))
    t = out["decode_step_s"]  # the mean iteration
    assert out["prefill_s"] == pytest.approx(prompt, rel=1e-12)
    assert out["ttft_s"] == pytest.approx(0.5 * t + prompt, rel=1e-12)
    assert prompt > 2.0 * 3.0 * t  # more than twice the 3 t that the mean iteration per chunk gives
    sim, _ = run_sim(fast, srv, [5000.0] * 3, [4.0] * 3, np.full(3, 1000.0), rate=1.0, max_tokens=2048.0, host=host)
    head = ks.head_rows_s(m, d, tiers, tiles, srv[0], b)
    assert sim["ttft_s"] == pytest.approx(prompt - 2.0 * head, rel=1e-3)


def test_closed_loop_of_spread_users_by_hand(fast):
    """8 users on one engine, 1,000-token prompts, 11 output tokens, a budget of 2,048
    tokens: the 8 prompts (8,000 tokens) take 4 iterations, so the users spread out
    (``kernels.serving`` module doc) and the engine batches continuously. All 8 are in
    service, in clumps of g = floor(2,048 / 1,000) = 2 (alike requests: those that
    started together finish and send again together); a clump's 2,000 prompt tokens fit
    one iteration beside the decode rows (k = 1), then 10 decode iterations, so an
    iteration holds b = 8 x 10 / 11 decoding requests, and the other 3 clumps' prompt
    iterations fall x = 3 / 11 to each of a request's 11:
    C0 = host + rows(b) + head(b) + kv x b (1,000 + 11 / 2) (no prompt),
    C1 = host + rows(b + 2,000) + head(b + 2) + kv x b x 1,005.5 + pair x 2 pairs(1,000),
    C2 the same with two clumps (4,000 tokens, 4 first tokens, 4 prompts' pairs).
    Decode: t = (8 C0 + 3 C1) / 11 an iteration; prefill P = (8 C1 + 3 C2) / 11 (its own
    clump and, 3 times in 11, another's). period = P + 10 t = e2e (no user waits: 8 <=
    the batch limit), TTFT = P, TPOT = t, 8 / period requests a second (Little's law)."""
    m, d, tiers, tiles = fast["model"][0], fast["dev"][0], fast["tiers"], fast["tiles"]
    srv = toy_srv()
    s = srv[0]
    host = 1e-4
    wl = workload(concurrency=8.0, input_len=1000.0, output_len=11.0, host_s=host)
    out = analytic(fast, srv, wl, max_batch=32.0, max_tokens=2048.0, scheduler=ks.CONTINUOUS)
    kv, pc = ks.kv_s_per_token(m, d, tiers, tiles, s), ks.pair_s(m, d, s)
    b = 8.0 * 10.0 / 11.0
    pairs = ks.prompt_pairs(1000.0, 0.0)

    def clumps(n: float) -> float:  # an iteration of the b decoding beside n clumps of 2 prompts
        return (host + ks.rows_s(m, d, tiers, tiles, s, b + 2000.0 * n) + ks.head_rows_s(m, d, tiers, tiles, s, b + 2 * n)
                + kv * b * 1005.5 + pc * 2 * n * pairs)

    t = (8.0 * clumps(0.0) + 3.0 * clumps(1.0)) / 11.0
    prompt = (8.0 * clumps(1.0) + 3.0 * clumps(2.0)) / 11.0
    period = prompt + 10.0 * t
    assert out["batch"] == 8.0
    assert out["decode_step_s"] == pytest.approx(t, rel=1e-12)
    assert out["tpot_s"] == pytest.approx(t, rel=1e-12)
    assert out["prefill_s"] == pytest.approx(prompt, rel=1e-12)
    assert out["ttft_s"] == pytest.approx(prompt, rel=1e-12)
    assert out["e2e_latency_s"] == pytest.approx(period, rel=1e-12)
    assert out["requests_per_s"] == pytest.approx(8.0 / period, rel=1e-12)
    # the same users with a budget that takes their 8 prompts at once stay in step: waves
    waves = analytic(fast, srv, wl, max_batch=32.0, max_tokens=8192.0, scheduler=ks.CONTINUOUS)
    static = analytic(fast, srv, wl, max_batch=32.0, max_tokens=8192.0, scheduler=ks.STATIC)
    for key in ("ttft_s", "tpot_s", "e2e_latency_s"):
        assert waves[key] == static[key], key


def test_steady_state_leaves_out_the_burst_and_the_drain(fast):
    """A closed loop of 4 users, constant lengths (64 in, 8 out), 5 requests a user: the
    users stay in step, so the run is 5 waves of one period P each (every wave the same:
    the first admits the 4 prompts at t = 0, the later ones as the last wave ends). Over
    the requests after the burst (waves 2-5) the latencies are a wave's, as over all of
    them; the throughput is counted between the first arrival after the burst (P) and
    the last arrival (4 P): the 12 completions of waves 2-4 over 3 P = 4 / P, the
    whole run's 20 / 5 P."""
    kw = dict(clients=4, max_batch=4.0, max_tokens=512.0)
    whole, _ = run_sim(fast, toy_srv(), [64.0] * 20, [8.0] * 20, **kw)
    steady, _ = run_sim(fast, toy_srv(), [64.0] * 20, [8.0] * 20, steady=True, **kw)
    period = whole["makespan_s"] / 5.0
    for key in ("ttft_s", "ttft_p90_s", "tpot_s", "e2e_latency_s"):
        assert steady[key] == pytest.approx(whole[key], rel=1e-12), key
    assert whole["e2e_latency_s"] == pytest.approx(period, rel=1e-12)  # each request lasts its wave
    assert steady["sustained_requests_per_s"] == pytest.approx(4.0 / period, rel=1e-12)
    assert steady["output_tokens_per_s"] == pytest.approx(4.0 * 8.0 / period, rel=1e-12)


def test_steady_state_does_not_depend_on_the_run_length(fast):
    """Lognormal lengths, 16 users: the mean TTFT over every request carries the start-up
    burst (16 prompts at once), a share that shrinks as the run grows (8 requests a user:
    +30% over 256 a user). Without the burst, 8 requests a user land within 10% of 256
    (what is left is the short sample's shorter prompts, 310 tokens against 365), the
    sustained throughput, users over the mean latency, within 2.5% (those prompts again:
    its latency is 2.1% shorter), and on the long run it is what the whole run's
    completions over its makespan measure apart, within 1% (the burst and the drain are
    1/256 of the run)."""
    runs = {}
    for steady in (False, True):
        for per_user in (8, 256):
            in_len, out_len, gaps = lognormal_requests(16 * per_user, seed=5)
            runs[steady, per_user], _ = run_sim(fast, toy_srv(), in_len, out_len, gaps, clients=16, max_batch=16.0,
                                                max_tokens=1024.0, host=2e-5, steady=steady)
    short, long = runs[True, 8], runs[True, 256]
    assert short["ttft_s"] == pytest.approx(long["ttft_s"], rel=0.1)
    assert short["sustained_requests_per_s"] == pytest.approx(long["sustained_requests_per_s"], rel=0.025)
    cold = runs[False, 8]["ttft_s"] / runs[False, 256]["ttft_s"] - 1.0
    assert cold > 2.0 * abs(short["ttft_s"] / long["ttft_s"] - 1.0)  # the burst is what moved
    assert long["sustained_requests_per_s"] == pytest.approx(long["requests_per_s"], rel=0.01)


@pytest.mark.parametrize("users, max_batch", [(6, 4), (12, 8)])
def test_a_short_closed_loop_sustains_the_long_runs_rate(fast, users, max_batch):
    """Equal lengths (512 in, 64 out), more users than the batch: the users stay in
    step, so a run of 3 or 4 requests a user is a few uneven waves. Its steady
    throughput, the users over their mean latency, is within 5% of a run of 200 a user
    (measured: 0.2% and 3.4% for 6 users, 0.6% and 3.3% for 12). Counting the
    completions between the first arrival after the burst and the last arrival, as the
    simulation did, gave +22% and +29% at 3 requests a user: the window's edges fall
    where the waves put them (a deployment of 12,672 users with four requests each
    broke Little's law by 10%)."""
    def rate(per_user: int) -> float:
        n = users * per_user
        run, _ = run_sim(fast, toy_srv(), [512.0] * n, [64.0] * n, clients=users, max_batch=float(max_batch),
                         max_tokens=1024.0, host=2e-5, steady=True)
        assert run["sustained_requests_per_s"] * run["e2e_latency_s"] == pytest.approx(users, rel=1e-12)
        return run["sustained_requests_per_s"]

    long = rate(200)
    for per_user in (3, 4):
        assert rate(per_user) == pytest.approx(long, rel=0.05), per_user


def test_headline_counts_the_feasible_rows_whose_p90_targets_are_unchecked(tmp_path):
    """The Qwen3 space has a p90 TPOT target, which only the simulation's percentiles can
    check: the feasible rows it did not simulate are counted and named in the headline."""
    space = sp.load_serving("qwen3-235b-a22b-h200-8")
    summary = serve.run_serve(space, tmp_path / "q.parquet", simulate_top=4)
    frame = summary.table
    unchecked = int((frame["feasible"] & ~frame["simulated"]).sum())
    assert unchecked > 0 and summary.n_p90_unchecked == unchecked
    assert (f"{unchecked:,} feasible candidates are not simulated: they meet the mean targets; the p90 targets "
            "(tpot_p90_s) are unchecked on them") in serve.headline(space, summary)
    assert frame.filter(frame["simulated"])["tpot_p90_s"].null_count() == 0
