"""The kernels against what was measured on real GPUs.

``docs/measurements/`` holds tables measured with ``tools/measure_device.py`` on
an H100 SXM5 and an H200 (torch 2.11, CUDA 13.0, cuDNN 9.19; provenance in each
folder's ``env.json``). No GPU is needed here: the tables are committed, and these
tests hold the kernels' assumptions to them.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import pack_hardware, pack_model
from paraspace.kernels import inference, moe, ops, params
from paraspace.kernels.attention import attention_s
from paraspace.kernels.codes import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from paraspace.kernels.memory import activation_bytes_per_layer, eager_bytes_per_layer
from paraspace.kernels.mlp import dense_mlp_s
from paraspace.kernels.recompute import recompute_s
from paraspace.kernels.shape import shape_of
from paraspace.spaces.catalog import load_hardware
from paraspace.spaces.enums import DTYPE_BYTES
from paraspace.spaces.schema import Model

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "measurements"
#: measured folder -> the device name torch reported on it
CARDS = {"h100-sxm5-80gb": "NVIDIA H100 80GB HBM3", "h200-sxm-141gb": "NVIDIA H200"}
PEAK_BF16 = 989.4e12  # both cards' dense BF16 datasheet peak (the profiles' bf16 entry)


def rows(card: str, name: str) -> list[dict]:
    with open(MEASURED / card / name, newline="") as f:
        return list(csv.DictReader(f))


def device(card: str, **update: float):
    """The card's catalog profile packed for bf16, with device fields changed."""
    hw = load_hardware(card)
    if update:
        hw = hw.model_copy(update={"device": hw.device.model_copy(update=update)})
    dev, _, tiles = pack_hardware(hw, "bf16")
    return dev[0], tiles


@pytest.mark.parametrize("card", sorted(CARDS))
def test_every_table_carries_its_provenance(card):
    """Which device, driver, software and date produced the numbers, and that the
    device is the part the folder is named after."""
    env = json.loads((MEASURED / card / "env.json").read_text())
    assert env["device"] == CARDS[card]
    for key in ("date_utc", "torch", "cuda", "cudnn", "smi_before", "smi_after", "timing"):
        assert env[key], key
    assert env["multiprocessors"] == load_hardware(card).device.compute_units


def test_fused_attention_by_hand_against_one_measured_row():
    """H100, FlashAttention-2, causal, 2 x 8192 tokens, 32 heads of 128: forward FLOP
    4 x 2 x 8192^2 x 32 x 128 / 2 = 1.0995e12. The profile's plateau 0.36 of 989.4
    TFLOP/s = 356.18, at 8192 / (8192 + 450) = 0.94793 of it: 337.64 TFLOP/s, so
    3.2565 ms + the 4 us launch = 3.2605 ms; measured 343.86 TFLOP/s = 3.1976 ms
    (the model 2.0% slow)."""
    dev, _ = device("h100-sxm5-80gb")
    fwd, _, flops = ops.attention_fwd_bwd_s(2.0, 8192.0, 8192.0, 32.0, 32.0, 128.0, True, True, dev, 2.0)
    assert flops == pytest.approx(4 * 2 * 8192**2 * 32 * 128 / 2, rel=1e-15)
    assert fwd == pytest.approx(flops / (989.4e12 * 0.36 * 8192 / 8642) + 4e-6, rel=1e-12)
    row = next(r for r in rows("h100-sxm5-80gb", "attention.csv")
               if r["backend"] == "flash" and r["seq"] == "8192" and r["head_dim"] == "128" and r["causal"] == "1")
    assert float(row["fwd_s"]) == pytest.approx(flops / 343.86e12, rel=1e-4)
    assert fwd / float(row["fwd_s"]) - 1 == pytest.approx(0.020, abs=0.001)


#: (SDPA backend, the profile field of the kernel class it measures)
BACKENDS = (("flash", "attention_efficiency"), ("cudnn", "attention_efficiency_flash3"))


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize(("backend", "field"), BACKENDS)
def test_fused_attention_rate_follows_the_fill_model(card, backend, field):
    """Every causal head-dim-128 row, 1K to 32K tokens (a 1.5x spread in rate): the
    kernels' forward and backward times with the H100 profile's plateau for that
    kernel class (the H200 inherits it) and ``ops.loop_fill`` of the keys per
    call are within 15% of each measured time, 7% on average. A flat rate (the fill
    terms removed) comes out 28-37% fast on the 1K rows."""
    hw = load_hardware(card).device
    dev, _ = device(card, attention_efficiency=getattr(hw, field))
    errors = []
    flat = []
    for r in rows(card, "attention.csv"):
        if r["backend"] != backend or r["head_dim"] != "128" or r["causal"] != "1":
            continue
        b, s, h = float(r["batch"]), float(r["seq"]), float(r["heads"])
        fwd, bwd, flops = ops.attention_fwd_bwd_s(b, s, s, h, h, 128.0, True, True, dev, 2.0)
        errors += [fwd / float(r["fwd_s"]) - 1, bwd / float(r["bwd_s"]) - 1]
        flat.append(flops / (PEAK_BF16 * getattr(hw, field)) / float(r["fwd_s"]) - 1)
    assert len(errors) == 12
    assert max(abs(e) for e in errors) < 0.15, np.round(errors, 3)
    assert statistics.mean(abs(e) for e in errors) < 0.07
    assert min(flat) < -0.25  # without the fill the short rows come out far too fast


# ---------------------------------------------------------------- context-parallel ring attention

#: ring_attention.csv's rows of one rank's ring (the whole-sequence calls are "global")
RING = "ring_attention.csv"


def _ring_rows(card: str = "h100-sxm5-80gb") -> dict[tuple[str, int, int, str], dict]:
    """(label, cp, rank, impl) -> row of a card's ring table (``tools/measure_device.py``
    ``RingRank``: PyTorch's ring run as one rank of a CP group, transfers left out)."""
    table = rows(card, RING)
    assert not [r for r in table if r["error"]], "every ring row measured"
    return {(r["label"], int(r["cp"]), int(r["rank"]), r["impl"]): r for r in table if r["label"] != "global"}


def test_ring_rank_pairs_are_the_causal_pairs_over_cp():
    """Round-robin load balance gives every rank the same pairs: its own two chunks of
    n / 2 tokens causal, n (n + 1) / 2, plus cp - 1 steps of n x n / 2 (both query chunks
    on one earlier chunk, or the second query chunk on both of a later rank's), so
    n (n + 1) / 2 + (cp - 1) n^2 / 2 = cp n (cp n + 1) / 2 / cp: exactly the causal pairs
    of the whole sequence over cp, whatever the rank (n = 32,768, cp = 8: 4,294,983,680)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import measure_device as md
    finally:
        sys.path.remove(str(ROOT / "tools"))
    n = 32768
    assert md.ring_pairs(8, 0, n) == md.ring_pairs(8, 7, n) == 4_294_983_680
    for cp in (1, 2, 4, 8):
        for rank in range(cp):
            assert md.ring_pairs(cp, rank, n) * cp == (cp * n) * (cp * n + 1) // 2
    assert md.ring_schedule(4, 1) == [("all", "all", True), ("all", "first", False), ("second", "all", False),
                                      ("second", "all", False)]
    for card in CARDS:
        for (label, cp, rank, _), r in _ring_rows(card).items():
            assert int(r["pairs"]) == md.ring_pairs(cp, rank, n) * int(r["heads"]), label


@pytest.mark.parametrize("card", sorted(CARDS))
def test_a_ring_rank_costs_its_sdpa_calls_and_a_little_more(card):
    """PyTorch's own ring (torchtitan's context parallel: the step's SDPA call, its output
    and log-sum-exp merged in fp32, the KV concatenated for the next rank, the backward's
    gradients accumulated in fp32) against the same FlashAttention-2 calls alone, H100 and
    H200, Llama 3.1 8B (32 heads of 128 after repeat_kv) and a TP8 rank of 405B (16), 32K
    tokens a rank, CP 1-8: the ring takes 0-8% longer than its kernels (the merges and
    copies are memory passes over a rank's output, small next to n^2 attention), never less."""
    ring = _ring_rows(card)
    assert len(ring) == 28
    for (label, cp, rank, impl), r in ring.items():
        if impl != "torch":
            continue
        alone = ring[(label, cp, rank, "kernels")]
        for field in ("fwd_s", "bwd_s"):
            ratio = float(r[field]) / float(alone[field])
            assert 0.97 <= ratio <= 1.10, (label, cp, rank, field, ratio)


@pytest.mark.parametrize("card", sorted(CARDS))
def test_a_ring_rank_runs_at_one_causal_calls_rate_whatever_the_cp_size(card):
    """A rank's ring time grows with its pairs and nothing else: per pair, CP 8 takes
    0.93-1.07x what CP 1 (one causal call over the rank's 32K tokens) takes, forward and
    backward. So the context-parallel rows of torchtitan (Llama 3.1 8B at 32K tokens a GPU,
    CP 1 to 8 over 32K to 256K tokens) that the model predicts 14-38% fast, the error
    growing with CP, do not lose it in a rank's attention compute: what a GPU adds is
    elsewhere (transfers, their contention with the kernels, the allocator near capacity),
    which one GPU cannot measure. The H200 alike."""
    ring = _ring_rows(card)
    for label in ("llama31-8b", "llama31-405b/tp8"):
        one = ring[(label, 1, 0, "torch")]
        for cp in (2, 4, 8):
            for rank in (0, cp - 1):
                r = ring[(label, cp, rank, "torch")]
                for field in ("fwd_s", "bwd_s"):
                    per_pair = float(r[field]) / int(r["pairs"]) / (float(one[field]) / int(one["pairs"]))
                    assert 0.92 <= per_pair <= 1.10, (label, cp, rank, field, per_pair)


def test_kernels_price_a_ring_rank_from_its_share_of_the_causal_flops():
    """``ops.attention_qkv_fwd_bwd_s`` as a CP rank's attention calls it (its n queries
    against the whole sequence's cp n keys, causal, the keys of one call n): CP 8,
    Llama 3.1 8B, n = 32,768: forward FLOP 2 x 32,768 x 262,144 x 32 x 256 / 2 = 7.0369e13;
    the H100's FA2 plateau 0.36 x 989.4 = 356.18 TFLOP/s at 32,768 / (32,768 + 450) =
    0.98645 of it, 351.36 TFLOP/s: 0.20028 s with the launch, against PyTorch's ring
    measured at 0.21987 s (8.9% fast). Forward and backward together the kernels are
    within 8% of every measured rank (1.5-7.2% fast): a rank's ring is priced."""
    dev, _ = device("h100-sxm5-80gb")
    n = 32768.0
    fwd, _, flops = ops.attention_qkv_fwd_bwd_s(1.0, n, 8 * n, 32.0, 32.0, 128.0, 128.0, True, True, dev, 2.0, n)
    assert flops == pytest.approx(2 * 32768 * 262144 * 32 * 256 / 2, rel=1e-15)
    assert fwd == pytest.approx(7.0369e13 / (0.36 * 989.4e12 * 32768 / 33218) + 4e-6, rel=1e-4)
    ring = _ring_rows()
    assert fwd / float(ring[("llama31-8b", 8, 7, "torch")]["fwd_s"]) - 1 == pytest.approx(-0.089, abs=0.001)
    for card in CARDS:  # the H200 (its profile inherits the H100's plateau): 1.6-5.3% fast
        dev, _ = device(card)
        errors = []
        for (label, cp, rank, impl), r in _ring_rows(card).items():
            if impl != "torch":
                continue
            h = float(r["heads"])
            f, b, _ = ops.attention_qkv_fwd_bwd_s(1.0, n, cp * n, h, h, 128.0, 128.0, True, True, dev, 2.0, n)
            errors.append((f + b) / (float(r["fwd_s"]) + float(r["bwd_s"])) - 1)
        assert len(errors) == 14
        assert -0.08 <= min(errors) and max(errors) <= 0.0, (card, np.round(errors, 3))


#: attention_heads.csv backend -> the profile field of its kernel class's plateau
HEADS_BACKENDS = {"flash": "attention_efficiency", "cudnn": "attention_efficiency_flash3"}


def heads_share(blocks: float, sms: float) -> float:
    """The share of the plateau a fused-attention call's ``blocks`` thread blocks reach
    on ``sms`` SMs, as measured (``attention_heads.csv``): blocks / (blocks + SMs), about
    one wave idle (``ops.loop_fill`` with the SMs as the fill)."""
    return ops.loop_fill(blocks, sms)


def _heads_errors(backend: str, with_blocks: bool, card: str = "h100-sxm5-80gb") -> tuple[list, list, list, list]:
    """Priced / measured - 1 of a card's attention_heads.csv causal rows of one backend
    with at least 128 thread blocks (batch x heads x ceil(tokens / 128); a TP8 rank's few
    heads and more): the forwards, the backwards of up to 8K tokens, those of 16K-32K, and
    the rows' blocks. Priced by the kernels, and with ``with_blocks`` their compute time
    over ``heads_share`` as well."""
    hw = load_hardware(card).device
    dev, _ = device(card, attention_efficiency=getattr(hw, HEADS_BACKENDS[backend]))
    fwd_e, bwd_short, bwd_long, blocks_of = [], [], [], []
    for r in rows(card, "attention_heads.csv"):
        if r["backend"] != backend or r["causal"] != "1":
            continue
        b, s, h = int(r["batch"]), int(r["seq"]), int(r["heads"])
        blocks = b * h * -(-s // 128)
        if blocks < 128:
            continue
        fwd, bwd, _ = ops.attention_fwd_bwd_s(float(b), float(s), float(s), float(h), float(h), 128.0, True, True,
                                              dev, 2.0)
        if with_blocks:
            share = heads_share(blocks, dev.compute_units)
            fwd = (fwd - dev.launch_s) / share + dev.launch_s
            bwd = (bwd - 2 * dev.launch_s) / share + 2 * dev.launch_s
        fwd_e.append(fwd / float(r["fwd_s"]) - 1)
        (bwd_short if s <= 8192 else bwd_long).append(bwd / float(r["bwd_s"]) - 1)
        blocks_of.append(blocks)
    return fwd_e, bwd_short, bwd_long, blocks_of


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize("backend", sorted(HEADS_BACKENDS))
def test_fused_attention_rate_follows_its_thread_blocks(backend, card):
    """``attention_heads.csv`` (H100 ``env-heads.json``, H200 ``env-ring-heads.json``): one
    sequence of 1K-32K tokens with 1-64 heads of 128, causal. With few heads the rate falls
    far below the plateau (FlashAttention-2 at 8K on the H100: 233 TFLOP/s forward with 8
    heads, 327 with 64; cuDNN 496 and 566; the H200 alike, its cuDNN up to 10% faster). The key fill the
    kernels price times blocks / (blocks + SMs), at the profile's plateaus (not refitted),
    over the 39 rows of 128 or more blocks a backend: forwards within 30% and 8% on average
    (H100 7.1% and 7.0%, H200 6.9% and 7.2%), backwards of up to 8K tokens within 37% and
    13% on average (H100 9.2% and 8.5%, H200 9.8% and 12.6%); the backwards of 16K-32K
    tokens reach their plateau with fewer blocks than the law says (at 256-512 blocks up to
    61% slower than measured, from 2,048 within 14%). The kernels, which leave the blocks
    out, price the same rows 17-22% too fast on average, up to 56-66% (next test)."""
    fwd_e, bwd_short, bwd_long, _ = _heads_errors(backend, True, card)
    assert len(fwd_e) == 39 and len(bwd_short) == 26 and len(bwd_long) == 13
    assert max(abs(e) for e in fwd_e) < 0.30 and statistics.mean(abs(e) for e in fwd_e) < 0.08
    assert max(abs(e) for e in bwd_short) < 0.37 and statistics.mean(abs(e) for e in bwd_short) < 0.13
    assert -0.06 < min(bwd_long) and max(bwd_long) < 0.65
    kernels = [e for part in _heads_errors(backend, False, card)[:3] for e in part]
    assert statistics.mean(kernels) < -0.15 and min(kernels) < -0.55


@pytest.mark.xfail(strict=True, reason=(
    "measured (attention_heads.csv) but not priced: blocks / (blocks + SMs) in the kernels took "
    "in-sample MAPE 7.87% -> 7.74% and leave-one-source-out 8.96% -> 9.36% (2026-11-27): the Megatron and "
    "NeMo H100 rows, filed flash2, run Transformer Engine's cuDNN kernel of the FA3 class and are priced at "
    "FA2's rate already, so slowing their TP8 ranks' few-head attention moved the GEMM knob the other sources "
    "are judged by (issue 14)"))
@pytest.mark.parametrize("backend", sorted(HEADS_BACKENDS))
def test_kernels_price_few_head_attention(backend):
    """A TP8 rank's attention (8-16 heads of a 2K-8K sequence, 128-1,024 thread blocks)
    priced within 12% of the measured calls on average, forward and backward."""
    fwd_e, bwd_short, _, blocks = _heads_errors(backend, False)
    few = [e for e, n in zip(fwd_e, blocks) if n <= 1024]
    assert statistics.mean(abs(e) for e in few + bwd_short) < 0.12


def test_batch_and_heads_are_one_dimension_of_thread_blocks():
    """The rate follows batch x heads, not either: at 2K and 8K tokens, 8 sequences of one
    head, 4 of 2, 2 of 4 and 1 of 8 run within 7% of each other forward (FlashAttention-2
    and cuDNN, H100 and H200): a call's thread blocks are batch x heads x ceil(tokens / 128)."""
    for card in CARDS:
        table = rows(card, "attention_heads.csv")
        assert not [r for r in table if r["error"]]
        for backend in ("flash", "cudnn"):
            for s in ("2048", "8192"):
                rates = [float(r["fwd_tflops"]) for r in table
                         if r["backend"] == backend and r["seq"] == s and r["causal"] == "1"
                         and int(r["batch"]) * int(r["heads"]) == 8]
                assert len(rates) == 4
                assert max(rates) / min(rates) < 1.07, (card, backend, s, rates)


def _dense(card: str) -> list[dict]:
    return [r for r in rows(card, "gemm_bf16.csv") if r["role"] in ("fwd", "dgrad", "wgrad")]


#: the measured GEMM tables, their precision and its dense peak on both cards
GEMM_TABLES = {"bf16": ("gemm_bf16.csv", PEAK_BF16), "fp8": ("gemm_fp8.csv", 1978.9e12)}


def kernel_plateau(card: str, dtype: str, fill: float) -> float:
    """The GEMM kernel's plateau read off the card's measured ``dtype`` table: the median,
    over the training projections of at least 1e11 FLOP, of their efficiency over their
    k's fill share (``ops.loop_fill`` of ``fill`` elements; 0: none)."""
    name, peak = GEMM_TABLES[dtype]
    return statistics.median(
        2.0 * int(r["m"]) * int(r["n"]) * int(r["k"]) / float(r["seconds"]) / peak
        / (ops.loop_fill(float(r["k"]), fill) if fill else 1.0)
        for r in rows(card, name)
        if r["role"] in ("fwd", "dgrad", "wgrad") and 2.0 * int(r["m"]) * int(r["n"]) * int(r["k"]) >= 1e11)


def _gemm_errors(card: str, dtype: str, k_fill: bool) -> tuple[np.ndarray, np.ndarray]:
    """(model time / measured time - 1, k) of the card's measured ``dtype`` GEMMs of the
    training projections (m >= 1024), the model at the kernel's plateau read off the
    table: the median over the shapes of at least 1e11 FLOP of their efficiency over
    their k's fill share (with ``k_fill``; without it, of their efficiency), so
    neither variant is handed a plateau the other fits better."""
    name, _ = GEMM_TABLES[dtype]
    shapes = [r for r in rows(card, name) if r["role"] in ("fwd", "dgrad", "wgrad")]
    hw = load_hardware(card)
    dev, _, tiles = pack_hardware(hw, dtype)
    fill = dev[0].gemm_k_fill if k_fill else 0.0
    dev["gemm_max_efficiency"] = kernel_plateau(card, dtype, fill)
    dev["gemm_k_fill"] = fill
    nbytes = DTYPE_BYTES[dtype]
    errors = np.array([ops.gemm_time_s(float(r["m"]), float(r["n"]), float(r["k"]), dev[0], tiles, nbytes)
                       / float(r["seconds"]) - 1 for r in shapes])
    return errors, np.array([float(r["k"]) for r in shapes])


def test_gemm_shape_model_against_720_measured_h100_shapes():
    """cuBLAS BF16 GEMMs of the QKV, output, gate+up and down projections of three
    models at TP 1-8 and 1K-16K tokens, forward and both gradients, each replayed
    from a CUDA graph at the card's 700 W limit. At the measured kernel plateau the
    kernels' GEMM time (tile and wave model, the fill of the reduction length k,
    HBM roofline, the profile's 4 us launch, which a graph replay does not pay in
    full) is within 4.5% of the measured times on average; the worst shapes (under
    1e10 FLOP) are within 40%."""
    errors, _ = _gemm_errors("h100-sxm5-80gb", "bf16", k_fill=True)
    assert len(errors) == 720
    assert np.mean(np.abs(errors)) < 0.045
    assert np.max(np.abs(errors)) < 0.40


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize("dtype", sorted(GEMM_TABLES))
def test_gemm_rate_rises_with_k_by_a_fill_of_256_bytes(card, dtype):
    """A GEMM's rate rises with its reduction length (the profile's ``gemm_k_fill_bytes``).
    For every output shape (m, n) measured at a short k (<= 1024) and a long one
    (>= 4096), both over 1e10 FLOP (launch-free, plateau-free: one shape's two rates
    compared), the short one's rate over the long one's is what ``loop_fill`` of k
    over 256 bytes (128 BF16, 256 FP8 elements) says within 8% on average, where a
    rate flat in k is off by 11-34%. Measured ratios: BF16 0.89 (H100) and 0.90
    (H200) at the median, the law 0.90; FP8 0.76 and 0.78, the law 0.83."""
    name, peak = GEMM_TABLES[dtype]
    fill = pack_hardware(load_hardware(card), dtype)[0][0].gemm_k_fill
    assert fill == 256.0 / (1.0 if dtype == "fp8" else 2.0)
    by_shape: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in rows(card, name):
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        if r["role"] in ("fwd", "dgrad", "wgrad") and 2.0 * m * n * k >= 1e10:
            by_shape.setdefault((m, n), []).append((float(k), 2.0 * m * n * k / float(r["seconds"]) / peak))
    measured, law = [], []
    for points in by_shape.values():
        for k_short, rate_short in (p for p in points if p[0] <= 1024):
            for k_long, rate_long in (p for p in points if p[0] >= 4096):
                measured.append(rate_short / rate_long)
                law.append(ops.loop_fill(k_short, fill) / ops.loop_fill(k_long, fill))
    measured_ratio, law_ratio = np.array(measured), np.array(law)
    assert len(measured_ratio) >= 15
    law_error = np.mean(np.abs(law_ratio / measured_ratio - 1))
    flat_error = np.mean(np.abs(1 / measured_ratio - 1))
    assert law_error < 0.08
    assert flat_error > 0.10 and law_error < flat_error / 3


@pytest.mark.parametrize("card", sorted(CARDS))
def test_fp8_scaling_recipes_against_their_measured_gemms(card):
    """``gemm_fp8_scaling.csv`` (H100 and H200, 224 forward GEMMs of Qwen3-32B and Llama 3 70B at
    TP 1-8 and 16-8K tokens, each in BF16 and FP8 under three scaling recipes): at 1K-8K
    tokens (128 shapes, compute-bound) the kernels' time under each recipe over its time
    with one scale a tensor (1.19 blocks, 1.02 rows: the profile's
    ``gemm_scaling_overhead``) is within 6.5% of the measured ratio on average (5.8% for
    blocks, 6.1% for rows), and no shape is off by more than 35%: the worst, TP8's narrow QKV GEMMs (1,280
    outputs), take 1.5x under either recipe against the 1.19 and 1.02 priced; the same GEMM in BF16 takes 1.8-2x the per-tensor FP8
    time, as the two peaks say. At 16-64 tokens the FP8 GEMMs stream their weights, and
    cuBLAS's block- and row-scaled kernels take 1.3-1.6x the per-tensor one there: recorded,
    not priced (the serving engines run their own small-batch kernels)."""
    table = rows(card, "gemm_fp8_scaling.csv")
    assert not [r for r in table if r["error"]]
    env = json.loads((MEASURED / card / "env-fp8-scaling.json").read_text())
    assert env["device"] == CARDS[card] and env["torch"] and env["smi_after"]
    by = {}
    for r in table:
        by.setdefault((int(r["m"]), int(r["n"]), int(r["k"]), r["layer"]), {})[r["scaling"]] = float(r["seconds"])
    assert len(by) == 224 and all(len(v) == 4 for v in by.values())
    hw = load_hardware(card)
    big = {shape: t for shape, t in by.items() if shape[0] >= 1024}
    assert len(big) == 128
    for recipe in ("block", "row"):
        dev = pack_hardware(hw, "fp8", "flash2", recipe)[0][0]
        base, tiles = pack_hardware(hw, "fp8", "flash2", "tensor")[0][0], pack_hardware(hw, "fp8")[2]
        errors = []
        for (m, n, k, _), t in big.items():
            model = ops.gemm_time_s(m, n, k, dev, tiles, 1.0) / ops.gemm_time_s(m, n, k, base, tiles, 1.0)
            errors.append(model / (t[recipe] / t["tensor"]) - 1)
        assert np.mean(np.abs(errors)) < 0.065, recipe
        assert np.max(np.abs(errors)) < 0.35, recipe
    bf16_over_fp8 = [t["bf16"] / t["tensor"] for t in big.values()]
    assert 1.7 < statistics.median(bf16_over_fp8) < 2.0


@pytest.mark.parametrize("card", sorted(CARDS))
def test_the_fitted_gemm_knob_stays_below_the_measured_kernel(card):
    """``gemm_max_efficiency`` is fitted on whole training steps; whatever the steps
    lose beyond the model's terms lowers it, so it can sit below what a GEMM alone
    reaches on the card but never above it (that would be a fit compensating for
    time the model invents elsewhere)."""
    kernel = statistics.median(2.0 * int(r["m"]) * int(r["n"]) * int(r["k"]) / float(r["seconds"]) / PEAK_BF16
                               for r in _dense(card))
    fitted = load_hardware(card).device.gemm_max_efficiency
    assert 0.5 * kernel < fitted <= kernel


def _grouped(card: str, regime) -> tuple[np.ndarray, list[dict]]:
    """The model's grouped-GEMM time over the measured one, minus 1, for the balanced
    rows of ``regime(groups, rows per expert)`` on ``card``, at its dense kernel plateau
    (each dense shape's efficiency over its k's fill share, as ``_gemm_errors``)."""
    dev, tiles = device(card)
    dense = [2.0 * int(r["m"]) * int(r["n"]) * int(r["k"]) / float(r["seconds"]) / PEAK_BF16
             / ops.loop_fill(float(r["k"]), dev.gemm_k_fill) for r in _dense(card)]
    dev, tiles = device(card, gemm_max_efficiency=statistics.median(dense))
    picked = []
    for r in rows(card, "grouped_gemm.csv"):
        per = [int(x) for x in r["rows"].split("/")]
        if len(set(per)) == 1 and regime(int(r["groups"]), per[0]):
            picked.append(r)
    err = np.array([moe.grouped_gemm_s(float(r["groups"]), float(r["m"]), float(r["n"]), float(r["k"]), dev,
                                       tiles, 2.0) / float(r["seconds"]) - 1 for r in picked])
    return err, picked


@pytest.mark.parametrize("card", sorted(CARDS))
def test_grouped_gemm_where_moe_training_runs(card):
    """``torch._grouped_mm`` over 4-32 local experts of 1,024-4,096 tokens each (the
    regime of expert-parallel training: DeepSeek-V3, Qwen3-30B-A3B, GPT-OSS-120B and
    Mixtral expert shapes, forward and both gradients): the kernels' grouped GEMM,
    each expert at its own shape's efficiency, is within 10% on average."""
    err, picked = _grouped(card, lambda g, m: g >= 4 and m >= 1024)
    assert len(picked) >= 100
    assert np.mean(np.abs(err)) < 0.10


@pytest.mark.parametrize("card", sorted(CARDS))
def test_grouped_gemm_with_few_tokens_per_expert(card):
    """At 256 tokens per expert the model is 10% fast on the median row (-9.7% on the
    H100, -10.1% on the H200), more than 20% fast before GEMMs paid their reduction
    fill: these experts' weight gradients reduce over their 256 tokens, where a
    GEMM runs at 256 / (256 + 128) = 2/3 of its plateau. What is left: the tile model
    fills the waves with 64-wide tiles at the large-tile rate, which real kernels do
    not reach (rows from 0.23 to 1.9 of the measured time)."""
    err, picked = _grouped(card, lambda g, m: m == 256)
    assert len(picked) >= 40
    assert -0.12 < np.median(err) < 0.0
    assert err.min() < -0.5  # the small-tile rows the tile model still credits too well


@pytest.mark.parametrize("card", sorted(CARDS))
def test_skewed_experts_cost_a_grouped_kernel_what_their_mean_rows_cost(card):
    """Why the MoE layer prices the busiest EP rank's rows, not the busiest expert's:
    eight local experts with one at 1.5x or 2x the mean load (512 or 2,048 tokens)
    run one grouped kernel at about the useful FLOP rate of a balanced kernel at that
    mean (interpolated in log rows between the balanced 256 / 1,024 and 1,024 / 4,096
    rows): on the H100 0.96 of it on average over the 24 DeepSeek-V3 expert GEMMs, each
    within 0.70-1.20 (the H200 likewise). A kernel that ran at the hot expert's pace
    would take 1.5-2x as long."""
    rows_ = [r for r in rows(card, "grouped_gemm.csv")
             if r["family"] == "deepseek-v3" and r["groups"] == "8"]
    balanced = {}
    for r in rows_:
        per = [int(x) for x in r["rows"].split("/")]
        if len(set(per)) == 1:
            balanced[(r["linear"], r["role"], per[0])] = float(r["useful_tflops"])
    ratios = []
    for r in rows_:
        per = [int(x) for x in r["rows"].split("/")]
        if len(set(per)) == 1:
            continue
        mean = sum(per) / len(per)
        lo, hi = (256, 1024) if mean < 1024 else (1024, 4096)
        a, b = balanced[(r["linear"], r["role"], lo)], balanced[(r["linear"], r["role"], hi)]
        ratios.append(float(r["useful_tflops"]) / (a + (b - a) * np.log(mean / lo) / np.log(hi / lo)))
    assert len(ratios) == 24
    assert np.all((np.array(ratios) > 0.70) & (np.array(ratios) < 1.20)), np.round(ratios, 3)
    assert abs(np.mean(ratios) - 1) < 0.10


def test_calibrate_gemm_from_the_measured_table(tmp_path):
    """``paraspace calibrate gemm`` on 60 measured H100 shapes (Llama 3 70B at TP 1 and
    8, Llama 3 8B at TP 1, forward): the written profile reproduces each measured
    time within 1% and loads back with every efficiency in (0, 1]."""
    keep = [r for r in rows("h100-sxm5-80gb", "gemm_bf16.csv") if r["role"] == "fwd" and (
        r["layer"].startswith("llama3-70b/") and r["layer"].endswith(("/tp1", "/tp8"))
        or r["layer"].startswith("llama3-8b/") and r["layer"].endswith("/tp1"))]
    assert len(keep) == 60
    table = tmp_path / "gemm.csv"
    with open(table, "w", newline="") as f:  # the columns calibrate reads; no second time column
        w = csv.DictWriter(f, fieldnames=["m", "n", "k", "dtype", "seconds", "layer"], extrasaction="ignore")
        w.writeheader()
        w.writerows(keep)
    out = tmp_path / "h100-measured.toml"
    result = CliRunner().invoke(main, ["calibrate", "gemm", str(table), "--hardware", "h100-sxm5-80gb",
                                       "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    worst = float(result.output.split("worst round-trip error ")[1].split("%")[0])
    assert worst < 1.0
    points = load_hardware(str(out)).device.gemm_efficiency
    assert len(points) == 60
    assert all(0.0 < p[3] <= 1.0 for p in points)


def test_measure_script_plans_what_the_kernels_price():
    """The measuring script (run where torch and a GPU are; planned here without
    them): its three GEMMs of a linear have the same FLOP and the shapes
    ``ops.gemm_fwd_bwd_s`` prices (dgrad (m, k, n); wgrad over the tokens), and
    its attention FLOP count is ``ops.attention_flops``'s; its FP8 scaling sweep covers
    the recipes ``schema.Fp8Scaling`` names."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import measure_device as md
    finally:
        sys.path.remove(str(ROOT / "tools"))
    plan = md.gemm_plan(tokens=(2048,))
    assert len(plan) == 3 * 4 * len(md.TP_SIZES) * len(md.MODELS)
    for i in range(0, len(plan), 3):
        (_, r1, m, n, k), (_, r2, *dg), (_, r3, *wg) = plan[i:i + 3]
        assert (r1, r2, r3) == ("fwd", "dgrad", "wgrad")
        assert tuple(dg) == (m, k, n)
        assert tuple(wg) == (n, k, m)  # dW (n_out x k_in) over the m tokens
    for causal in (True, False):
        assert md.attention_flops(2, 4096, 32, 128, causal) == ops.attention_flops(2.0, 4096.0, 4096.0, 32.0,
                                                                                   128.0, causal)
    assert md.skewed_rows(8, 512, 2.0)[0] == 1024 and sum(md.skewed_rows(8, 512, 2.0)) == 4096
    # the scaling sweep measures every recipe a space may name, beside BF16, on shapes
    # whose k splits into the 128-wide blocks of the block recipe
    from paraspace.spaces.schema import FP8_SCALINGS
    assert set(md.SCALINGS) == {"bf16", *FP8_SCALINGS}
    assert all(k % 128 == 0 and n % 128 == 0 for _, _, n, k in md.scaling_plan())


# ---------------------------------------------------------------- whole layers and decode iterations

#: layer.csv / decode_step.csv SDPA backend -> the attention kernel class it runs
BACKEND_KERNEL = {"flash": "flash2", "cudnn": "flash3"}
RECOMPUTE_CODE = {"none": RECOMPUTE_NONE, "selective": RECOMPUTE_SELECTIVE, "full": RECOMPUTE_FULL}


def _block_model(r: dict):
    """The measured block of a layer.csv or decode_step.csv row as a one-layer model
    record (decode rows are SwiGLU blocks)."""
    return pack_model(Model(name=r["label"], description="measured block", layers=1, hidden=int(r["hidden"]),
                            heads=int(r["heads"]), kv_heads=int(r["kv_heads"]), head_dim=int(r["head_dim"]),
                            ffn=int(r["ffn"]), vocab=32000, glu=r.get("gated", "1") == "1"))[0]


def _layer_model(card: str, r: dict, early_stop: float = 0.0) -> tuple[float, float, float]:
    """(forward, step, kept activation bytes) the kernels give a layer.csv row: its block on
    one device of the card's profile at the GEMM kernel's measured plateau (the fitted
    ``gemm_max_efficiency`` stands for whole training steps, not a kernel), with the row's
    backend's attention kernel class. The step is forward + backward + what the row's
    recompute mode adds to the backward (``kernels.recompute``: the attention core for
    selective, one forward for full, less the down projection with ``early_stop``)."""
    dev, _, tiles = pack_hardware(load_hardware(card), "bf16", BACKEND_KERNEL[r["backend"]])
    dev["gemm_max_efficiency"] = kernel_plateau(card, "bf16", dev[0].gemm_k_fill)
    model = _block_model(r)
    b, s = float(r["batch"]), float(r["seq"])
    work = params.record(params.WORKLOAD, global_batch=b, seq_len=s, act_bytes=2.0, weight_bytes=2.0,
                         grad_bytes=4.0, optimizer_bytes=12.0, gemm_cast_bytes=0.0, flash_attention=1.0)[0]
    sh = shape_of(1, 1, 1, 1, int(b), 1, 1, 0, model, dev[0], work)
    att = attention_s(sh, model, dev[0], tiles, work)
    mlp = dense_mlp_s(sh, model, dev[0], tiles)
    fwd = att.part_f + mlp.up_f + mlp.down_f + mlp.act
    bwd = att.part_b + mlp.up_b + mlp.down_b + 2.0 * mlp.act
    code = RECOMPUTE_CODE[r["recompute"]]
    rc, _ = recompute_s(code, sh, fwd, 0.0, 0.0, att, mlp, model, dev[0], early_stop)
    kept = activation_bytes_per_layer(b, s, 1.0, 1.0, False, code, True, model, 2.0)
    return fwd, fwd + bwd + rc, kept


@pytest.mark.parametrize("card", sorted(CARDS))
def test_a_whole_layer_is_the_sum_of_its_operators(card):
    """``layer.csv``: one transformer block (Llama 3 8B, MPT-7B and 30B, a TP8 rank of
    Llama 3 70B and of GPT-3 175B; 2K-8K tokens; FlashAttention-2 and cuDNN; no, selective
    and full recompute: 48 rows a card) timed whole in PyTorch, forward and forward +
    backward. The kernels' sum of its operators (GEMMs at the measured kernel plateau,
    fused attention at its kernel class's rate, norms, rotary, activation and residuals
    as memory-bound passes with a launch each) is within 7.5% of the measured times on
    average on both cards (H100: forward 5.9%, step 6.5%; H200: 4.9%, 5.0%), within 5% of
    them in the mean (H100 +1.8% and +3.9%), and no row is off by more than 20% (the
    worst 17%). The largest errors: GPT-3's TP8 rank on cuDNN 13-17% slow, MPT-7B's
    full-recompute steps on cuDNN 12-17% slow (see the next test), the eager Llama blocks
    5-11% fast (their rotary runs as eight small kernels, priced as one pass)."""
    table = rows(card, "layer.csv")
    assert len(table) == 48 and not [r for r in table if r["error"]]
    env = json.loads((MEASURED / card / "env-layer.json").read_text())
    assert env["device"] == CARDS[card] and env["smi_after"] and "whole layers" in env["timing"]
    fwd_err, step_err = [], []
    for r in table:
        fwd, step, _ = _layer_model(card, r)
        fwd_err.append(fwd / float(r["fwd_s"]) - 1)
        step_err.append(step / float(r["step_s"]) - 1)
    for errors in (np.array(fwd_err), np.array(step_err)):
        assert np.mean(np.abs(errors)) < 0.075, np.round(errors, 3)
        assert abs(np.mean(errors)) < 0.05
        assert np.max(np.abs(errors)) < 0.20


@pytest.mark.parametrize("card", sorted(CARDS))
def test_full_recompute_costs_at_most_one_forward(card):
    """What ``torch.utils.checkpoint`` (non-reentrant, as FSDP trainers wrap a block) adds
    to a step, over the block's forward: (full step - plain step) / plain forward, per
    block and backend. The kernels charge one whole forward (``recompute_s``; Megatron's
    reentrant checkpoint reruns all of it). Measured: 0.68-1.06 of a forward, median 0.93
    (H100) and 0.87 (H200): PyTorch's early stop skips the tail of the block whose
    outputs the backward does not read (the down projection), most visibly on MPT-7B
    (0.68-0.94, that GEMM a third of the block's), so the kernels' full-recompute steps
    run up to 17% slow there. Not priced: no column of the validation data says which
    checkpoint a run used, and Megatron's runs (full recompute in Narayanan et al.) redo
    the whole forward. Selective recompute (the attention core again) adds -0.07-0.47 of
    a forward, median 0.15 and 0.11, the core's share."""
    table = rows(card, "layer.csv")
    by = {(r["label"], r["batch"], r["backend"], r["recompute"]): r for r in table}
    full, selective = [], []
    for (label, b, backend, mode), r in by.items():
        if mode != "none":
            continue
        extra = float(by[(label, b, backend, "full")]["step_s"]) - float(r["step_s"])
        full.append(extra / float(r["fwd_s"]))
        extra = float(by[(label, b, backend, "selective")]["step_s"]) - float(r["step_s"])
        selective.append(extra / float(r["fwd_s"]))
    assert len(full) == 16
    assert 0.6 < min(full) and max(full) < 1.1
    assert 0.8 < statistics.median(full) < 1.0
    assert -0.1 < min(selective) and max(selective) < 0.5 and statistics.median(selective) < 0.2


@pytest.mark.parametrize("card", sorted(CARDS))
def test_kept_activations_to_the_byte(card):
    """The bytes a block's forward leaves allocated for its backward (``saved_bytes``:
    allocated after the forward, less its output) plus its input (which the next layer
    would keep; here it exists before the forward), against
    ``activation_bytes_per_layer`` (Korthikanti's count: two norm inputs and outputs, Q,
    K, V, the attention output, the MLP's intermediates, FlashAttention's fp32
    log-sum-exp). MPT-7B at 8 x 1,024 tokens by hand, h = 4,096, 32 heads of 128, f =
    16,384, ab = 2: per token 4 ab h + ab (2 x 32 + 2 x 32) 128 + 2 ab f + 4 x 32 =
    32,768 + 32,768 + 65,536 + 128 = 131,200 bytes, x 8,192 = 1,074,790,400; measured
    1,066,729,472 + 8,192 x 2 x 4,096 = 1,074,922,496 (0.01% more: the norms' fp32
    statistics). The GELU blocks (MPT, GPT-3's TP8 rank) match so; the eager SwiGLU
    blocks with rotary keep, to 0.01%, three tensors more: the SiLU output (ab f: an
    unfused SwiGLU keeps the gate, up, SiLU and product), the rotated Q and K (ab (heads
    + kv_heads) d, beside the QKV output V is a view of) and the attention output's
    transposed copy that the output projection reads (ab heads d): 34% more for Llama 3
    8B, what a PyTorch-eager trainer keeps and a fused one (Megatron, Transformer
    Engine) does not: ``eager_bytes_per_layer`` (``SpaceSpec.elementwise = "eager"``).
    The GELU blocks measured have no rotary embedding (MPT: ALiBi; GPT-3: learned
    positions), so their Q and K stay views of the QKV output; the kernels assume rotary
    in every layer."""
    for r in rows(card, "layer.csv"):
        if r["recompute"] != "none":
            continue
        tokens, h, ab = int(r["batch"]) * int(r["seq"]), int(r["hidden"]), 2
        measured = int(r["saved_bytes"]) + ab * tokens * h
        _, _, kept = _layer_model(card, r)
        eager = 0.0
        if r["gated"] == "1":  # the rotary SwiGLU blocks: what SpaceSpec.elementwise = "eager" adds
            eager = eager_bytes_per_layer(float(r["batch"]), float(r["seq"]), 1.0, 1.0, RECOMPUTE_NONE,
                                          _block_model(r), 2.0, False, 1.0)
            heads, kv, d = int(r["heads"]), int(r["kv_heads"]), int(r["head_dim"])
            assert eager == ab * tokens * (int(r["ffn"]) + (heads + kv) * d + heads * d)
        assert kept + eager == pytest.approx(measured, rel=3e-4), r["label"]
        if r["label"] == "mpt-7b" and r["batch"] == "8":
            assert kept == 1_074_790_400 and measured == 1_074_922_496
        if r["label"] == "llama3-8b":
            assert measured / kept == pytest.approx(1.338, abs=0.001)


def _serving_layer_s(model, dev, tiers, tiles, wbytes: float, b: float, q: float, s: float) -> float:
    """One block on one device as the serving kernels price it (``attention_block_s`` +
    ``dense_mlp_s``): ``b`` sequences of ``q`` new tokens over ``s`` keys (q = s: a causal
    prefill; q = 1: a decode step), weights of ``wbytes`` bytes, 16-bit activations and cache."""
    srv = inference.serving(tp=1, pp=1, ep=1, attention_dp=0.0, n_gpus=1, weight_bytes=wbytes, act_bytes=2.0,
                            kv_bytes=2.0)[0]
    return (inference.attention_block_s(model, dev[0], tiers, tiles, srv, b, q, s)
            + inference.dense_mlp_s(model, dev[0], tiers, tiles, srv, b * q))


#: (decode-step table, its linears' precision, their weights' bytes per element, rows, the
#: hand-checked row: Qwen3-32B on the H100 at one batch and 1K cached tokens, its weight and
#: cache bytes per layer, and the measured seconds)
DECODE_TABLES = (("decode_step.csv", "bf16", 2.0, 1, 975_175_680, 4_194_304, 394e-6),
                 ("decode_step_fp8.csv", "fp8", 1.0, 16, 487_587_840, 67_108_864, 253e-6))


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize(("table_name", "dtype", "wbytes", "batch", "weights", "cache", "seconds"), DECODE_TABLES)
def test_a_decode_iteration_streams_weights_and_cache(card, table_name, dtype, wbytes, batch, weights, cache,
                                                      seconds):
    """``decode_step.csv`` (BF16) and ``decode_step_fp8.csv`` (FP8 weights, ``torch._scaled_mm``
    with one static scale a tensor, 16-128 sequences): one decode iteration through four
    SwiGLU blocks of Qwen3-32B and of Llama 3 8B, 1-128 sequences of 1K or 4K cached
    tokens, replayed from a CUDA graph. Per layer, the serving kernels
    (``attention_block_s`` + ``dense_mlp_s``: the weights and the cache read at the
    profile's ``memory_efficiency`` of HBM, the GEMMs, norms, rotary and cache write, a
    launch per kernel) are within 6% of the measured time on average on cuDNN's attention
    on both cards and on FlashAttention-2 on the H100 (BF16: 2.3% and 5.6% on the H100;
    FP8: 2.8% and 4.8%), and within 12% at worst (the H100's cuDNN kernel reads a 4K cache
    of 128 sequences at 2.8 TB/s, 0.84 of HBM). By hand, Qwen3-32B on the H100 at one
    sequence (BF16) or 16 (FP8) of 1K tokens: weights + cache per layer, 975.2 + 4.2 MB or
    487.6 + 67.1 MB, at 0.80 x 3.35 TB/s stream in 365 us or 207 us; with 8 launches and
    the small GEMMs' fixed terms the kernels give 410 and 254 us against 394 and 253
    measured. So neither precision's decode kernels are where the TensorRT-LLM FP8 rows'
    TPOT, 11% too fast, comes from. FlashAttention-2 on the H200 reads large caches at
    the H100's pace (2.4 TB/s at 128 x 4K, half of its 4.8), so there the priced decode
    is up to 31% fast: recorded, not priced (the serving engines run their own decode
    kernels)."""
    table = rows(card, table_name)
    assert len(table) == 32 and not [r for r in table if r["error"]]
    assert all(r["timing"] == "graph" for r in table)
    hw = load_hardware(card)
    errors: dict[str, list[float]] = {}
    for r in table:
        dev, tiers, tiles = pack_hardware(hw, dtype, BACKEND_KERNEL[r["backend"]])
        model = _block_model(r)
        layer = _serving_layer_s(model, dev, tiers, tiles, wbytes, float(r["batch"]), 1.0, float(r["context"]))
        errors.setdefault(r["backend"], []).append(layer / float(r["seconds_per_layer"]) - 1)
        if (card.startswith("h100") and r["label"] == "qwen3-32b" and int(r["batch"]) == batch
                and r["context"] == "1024" and r["backend"] == "flash"):
            assert (int(r["weight_bytes_per_layer"]), int(r["kv_bytes_per_layer"])) == (weights, cache)
            stream = (weights + cache) / (0.80 * 3.35e12)
            assert stream < layer < stream + 60e-6
            assert float(r["seconds_per_layer"]) == pytest.approx(seconds, rel=0.01)
    cudnn = np.array(errors["cudnn"])
    assert np.mean(np.abs(cudnn)) < 0.06 and np.max(np.abs(cudnn)) < 0.12
    flash = np.array(errors["flash"])
    if card.startswith("h100"):
        assert np.mean(np.abs(flash)) < 0.06 and np.max(np.abs(flash)) < 0.12
    else:
        assert np.min(flash) < -0.25  # FA2 reads the H200's cache at H100 speed


@pytest.mark.parametrize("card", sorted(CARDS))
def test_a_prefill_forward_is_priced_by_the_serving_kernels(card):
    """``layer.csv``'s forward without autograd (``infer_s``, a prefill's) of the rotary
    SwiGLU blocks (Llama 3 8B at 4 x 2K and 1 x 8K tokens, a TP8 rank of Llama 3 70B at 2 x
    4K), against the serving kernels' causal prefill of the same block
    (``attention_block_s`` with q = s + ``dense_mlp_s``, the profile's fitted GEMM knob):
    within 6% on average and 11% at worst on both cards (H100 4.8%, H200 3.3%). So the
    serving prefill is not where vLLM's closed-loop TTFT, 24% slow, comes from. (With the
    kernel's measured plateau in place of the fitted knob, TPOT over the 83 closed-loop
    rows goes from 10.2% to 11.6% and TTFT from 21.6% to 22.2%, tried 2026-11-26.)"""
    hw = load_hardware(card)
    errors = []
    for r in rows(card, "layer.csv"):
        if r["recompute"] != "none" or r["gated"] != "1":
            continue
        dev, tiers, tiles = pack_hardware(hw, "bf16", BACKEND_KERNEL[r["backend"]])
        model = _block_model(r)
        prefill = _serving_layer_s(model, dev, tiers, tiles, 2.0, float(r["batch"]), float(r["seq"]),
                                   float(r["seq"]))
        errors.append(prefill / float(r["infer_s"]) - 1)
    assert len(errors) == 6
    assert np.mean(np.abs(errors)) < 0.06 and np.max(np.abs(errors)) < 0.11


# ---------------------------------------------------------------- whole training steps

#: whole-model training steps (``tools/measure_device.py`` ``train_memory``; H100, 2026-11-27), run
#: twice: the caching allocator as found, and with ``expandable_segments:True``
TRAIN_TABLES = {"train_memory.csv": "env-train-memory.json",
                "train_memory_expandable.csv": "env-train-memory-expandable.json"}


def _train_rows(name: str) -> dict[tuple, dict]:
    """(layers, micro-batch, sequence, recompute, optimizer, compiled) -> row."""
    return {(int(r["layers"]), int(r["batch"]), int(r["seq"]), r["recompute"], r["optimizer"], r["compiled"] == "1"): r
            for r in rows("h100-sxm5-80gb", name)}


def _llama_8b_shape():
    """Llama 3.1 8B's shapes (what ``train_memory.csv``'s models have, with fewer layers)."""
    return pack_model(Model(name="llama31-8b", description="measured", layers=1, hidden=4096, heads=32, kv_heads=8,
                            head_dim=128, ffn=14336, vocab=128256, glu=True))[0]


@pytest.mark.parametrize("name", sorted(TRAIN_TABLES))
def test_whole_training_steps_carry_their_provenance(name):
    """Nine steps a table, none failed, on the H100 with FSDP2 on a one-rank group; the
    environment names the allocator setting each ran under."""
    env = json.loads((MEASURED / "h100-sxm5-80gb" / TRAIN_TABLES[name]).read_text())
    assert env["device"] == CARDS["h100-sxm5-80gb"] and env["smi_after"] and env["torch"].startswith("2.11")
    assert ("expandable" in env["allocator"]) == ("expandable" in name)
    table = rows("h100-sxm5-80gb", name)
    assert len(table) == 9 and not [r for r in table if r["error"]]
    assert {r["wrap"] for r in table} == {"fsdp2-1rank"}


@pytest.mark.parametrize("name", sorted(TRAIN_TABLES))
def test_an_fsdp_step_stores_the_fp32_master_and_two_moments(name):
    """Between steps (gradients set to None, the 16-bit parameters resharded) a device
    holds what the kernels charge Adam under FSDP's mixed precision: ``OPTIMIZER_BYTES``
    (12: the fp32 master the shard is, m and v) a parameter and no 16-bit copy
    (``OPT_DEVICE_MASTER``). Llama 3.1 8B's shapes with 4 layers, 1,923,125,248
    parameters: 12 x that = 23,077,502,976 bytes; measured 23,149,068,288 (0.31% more: the
    step's token ids, the rotary table and the library's workspaces)."""
    from paraspace.explorer.evaluate import OPTIMIZER_BYTES
    from paraspace.kernels.codes import OPTIMIZER_ADAM
    from paraspace.kernels.optimizer import OPT_DEVICE_MASTER, OPT_STATE_FRACTION
    assert OPT_DEVICE_MASTER[OPTIMIZER_ADAM] == 1.0
    per_param = OPTIMIZER_BYTES * OPT_STATE_FRACTION[OPTIMIZER_ADAM]
    assert per_param == 12.0
    for key, r in _train_rows(name).items():
        expected = per_param * int(r["params"])
        assert expected <= int(r["states_bytes"]) <= 1.01 * expected, key
    if name == "train_memory.csv":
        r = _train_rows(name)[(4, 2, 8192, "op", "foreach", False)]
        assert int(r["params"]) == 1_923_125_248 and int(r["states_bytes"]) == 23_149_068_288


@pytest.mark.parametrize("name", sorted(TRAIN_TABLES))
def test_a_layer_keeps_what_the_kernels_count_under_each_checkpoint(name):
    """What one more layer leaves allocated after the forward (6 layers less 4, halved, the
    states' difference taken out), 2 x 8,192 tokens of Llama 3.1 8B's shapes:

    - torchtitan's per-op policy (``selective-ops``): the layer input, Q, V, the attention
      output, the gate output and the down projection's output, ab (h + heads d + kv d +
      heads d + f + h) = 2 (4,096 + 4,096 + 1,024 + 4,096 + 14,336 + 4,096) = 63,488 bytes a
      token, x 16,384 = 1,040,187,392, and FlashAttention's fp32 log-sum-exp, 4 x 2 x 32 x
      8,192 = 2,097,152: 1,042,284,544. Measured 1,042,285,568 (1 KiB more).
    - full recompute: the layer input alone, 2 x 16,384 x 4,096 = 134,217,728. Measured
      exactly that."""
    from paraspace.kernels.codes import RECOMPUTE_SELECTIVE_OPS
    model = _llama_8b_shape()
    table = _train_rows(name)
    for mode, code, hand in (("op", RECOMPUTE_SELECTIVE_OPS, 1_042_284_544), ("full", RECOMPUTE_FULL, 134_217_728)):
        six, four = table[(6, 2, 8192, mode, "foreach", False)], table[(4, 2, 8192, mode, "foreach", False)]
        kept = [int(r["after_forward_bytes"]) - int(r["states_bytes"]) for r in (six, four)]
        per_layer = (kept[0] - kept[1]) / 2
        priced = activation_bytes_per_layer(2.0, 8192.0, 1.0, 1.0, False, code, True, model, 2.0)
        assert priced == hand
        assert per_layer == pytest.approx(priced, rel=2e-6), mode


@pytest.mark.parametrize("name", sorted(TRAIN_TABLES))
def test_pytorch_cross_entropy_holds_three_fp32_copies_of_the_logits(name):
    """``F.cross_entropy(logits.float(), labels)`` (torchtitan's loss) on 32,768 tokens of a
    128,256-word vocabulary (4,202,692,608 logits; two layers, so the loss is the peak):
    the backward's peak over the states and the root module's gathered bf16 embedding,
    head and norm (2 x (2 x 128,256 x 4,096 + 4,096) = 2,101,354,496 bytes) is the saved
    fp32 log-softmax, the fp32 gradient arriving from the loss and the fp32 gradient it
    returns: 12 bytes a logit, ``LOSS_BYTES["unfused"]``; measured 50,377,925,632 / 4.2027e9
    = 11.99. The forward's peak holds the bf16 logits, their fp32 copy and the
    log-softmax: 2 + 4 + 4 = 10, measured 9.99. The "fused" loss the validation rows are
    priced with (4 bytes, Megatron's in-place vocab-parallel loss) would miss 33.6 GB here."""
    r = _train_rows(name)[(2, 1, 32768, "full", "foreach", False)]
    logits = 32768 * 128256
    root = 2 * (2 * 128256 * 4096 + 4096)
    states = int(r["states_bytes"])
    backward = (int(r["bwd_peak_bytes"]) - states - root) / logits
    forward = (int(r["fwd_peak_bytes"]) - states - root) / logits
    assert backward == pytest.approx(params.LOSS_BYTES["unfused"], rel=0.005)
    assert forward == pytest.approx(2.0 + 4.0 + 4.0, rel=0.005)
    assert params.LOSS_BYTES["fused"] * logits < 0.4 * (int(r["bwd_peak_bytes"]) - states)


def test_the_allocator_reserves_a_quarter_more_than_an_fsdp_step_allocates():
    """What a trainer that prints the caching allocator's peak *reserved* memory (torchtitan's
    "peak memory", ``explorer.validate._MEMORY``) reports against the peak the kernels price
    (allocated tensors): reserved / allocated 1.13-1.33 over the nine steps as the allocator
    was found (median 1.27), 1.13-1.29 (median 1.27) with expandable segments, which do not
    remove it. The allocated peaks are the same bytes under both settings (within 0.01%):
    the setting changes what is cached, not what is allocated. The lowest ratios are the
    steps that came nearest the 79 GiB the device has (the 32K-token step reserved 79.6 GB
    of 85.0): the allocator frees its cache and retries rather than fail, so reserved
    memory is capped by the device, not by a fraction. The profiles' ``memory_fragmentation``
    stays 0: the validation rows' memory figures are a mix of reserved and allocated peaks,
    and which one a row quotes is not in its columns."""
    found, expandable = _train_rows("train_memory.csv"), _train_rows("train_memory_expandable.csv")
    assert found.keys() == expandable.keys()
    ratios = {}
    for name, table in (("found", found), ("expandable", expandable)):
        ratios[name] = [int(r["peak_reserved_bytes"]) / int(r["peak_allocated_bytes"]) for r in table.values()]
        assert 1.1 < min(ratios[name]) and max(ratios[name]) < 1.35, name
        assert 1.2 < statistics.median(ratios[name]) < 1.3
    for key, r in found.items():
        assert int(expandable[key]["peak_allocated_bytes"]) == pytest.approx(int(r["peak_allocated_bytes"]), rel=1e-4)
    assert load_hardware("h100-sxm5-80gb").device.memory_fragmentation == 0.0


#: whole steps in bf16 and FP8 (``train_fp8``: torchao 0.18 Float8Linear, tensorwise dynamic
#: scaling, blocks compiled), on both cards (``env-train-fp8.json``)
FP8_CARDS = ("h100-sxm5-80gb", "h200-sxm-141gb")


def _fp8_rows(card: str) -> dict[tuple, dict]:
    """(layers, micro-batch, sequence, dtype, compiled) -> row of a card's train_fp8.csv."""
    return {(int(r["layers"]), int(r["batch"]), int(r["seq"]), r["dtype"], r["compiled"] == "1"): r
            for r in rows(card, "train_fp8.csv")}


def _predicted_step_s(card: str, r: dict) -> float:
    """``validate``'s step time for a measured step: its model (Llama 3.1 8B's shapes, its layers)
    on one GPU of the card, FSDP2 (notes), torchtitan's per-op checkpoint or full, its dtype;
    torch.compile unless it ran eagerly."""
    from paraspace.explorer import validate
    recompute = {"op": "selective", "full": "full", "none": "none"}[r["recompute"]]
    notes = "FSDP2 one rank; per-op SAC; Float8 tensorwise" + ("" if r["compiled"] == "1" else "; torch.compile=no")
    row = {"id": "measured", "source": "device", "ref": "docs/measurements", "quality": "ok",
           "model": "Llama 3.1 8B shapes", "layers": r["layers"], "hidden": "4096", "heads": "32", "kv_heads": "8",
           "head_dim": "128", "ffn": "14336", "vocab": "128256", "seq": r["seq"], "glu": "1", "mla": "0",
           "gpu": card, "n_gpus": "1", "gpus_per_node": "8", "tp": "1", "pp": "1", "dp": "1", "cp": "1", "ep": "1",
           "vpp": "1", "micro_batch": r["batch"], "global_batch": r["batch"], "sequence_parallel": "0",
           "recompute": recompute, "zero": "0", "dtype": r["dtype"], "attention": "flash2", "metric": "step_time_s",
           "value": r["step_s"], "step_time_s": r["step_s"], "derivation": "measured", "notes": notes}
    result = validate.predict_row(validate.predict_training, row, "train_fp8.csv")
    assert result.status == "ok", result.reason
    return result.predicted


@pytest.mark.parametrize("card", FP8_CARDS)
def test_fp8_steps_carry_their_provenance(card):
    """The runs name torchao's release; every step ran but the H100's 32K-token compiled ones,
    out of memory on its 80 GB (the H200 ran them)."""
    env = json.loads((MEASURED / card / "env-train-fp8.json").read_text())
    assert env["device"] == CARDS[card] and env["torchao"].startswith("0.18.0") and env["smi_after"]
    table = rows(card, "train_fp8.csv")
    assert len(table) == 11
    failed = [r for r in table if r["error"]]
    assert [r["seq"] for r in failed] == (["32768"] * 4 if card == "h100-sxm5-80gb" else [])
    assert all("OutOfMemoryError" in r["error"] for r in failed)


@pytest.mark.parametrize("card", FP8_CARDS)
def test_an_fp8_step_keeps_its_head_in_16_bits(card):
    """Per layer (6 layers less 4, halved: the loss, the head and the optimizer cancel) FP8 runs
    a compiled Llama 3.1 8B block 1.36x (H100) and 1.41x (H200) as fast as bf16 at 2 x 8K tokens;
    the kernels' layers give 1.42x and 1.46x, each precision's layer within 12% of its measured
    time. What the layers leave (the head over a 128,256-word vocabulary, the loss, the
    optimizer) takes longer in the FP8 step than in the bf16 one (0.164 s against 0.142 s on the
    H100): torchao's Float8 leaves the head in bf16, as torchtitan filters it out and as
    Transformer Engine and DeepSeek-V3 keep theirs. The kernels price the head at the 16-bit peak
    under every 8-bit recipe (``gemm_passes_16bit_s``): its three passes, 3 x 2 x 16,384 x
    128,256 x 4,096 = 51.6 TFLOP, take twice their 8-bit time on the profile (0.110 s against
    0.055 s on the H100's), the difference 16-18% of the 4-layer FP8 step, which the 8-bit
    pricing took 31-33% fast (the 6-layer one 26-28%). The compiled FP8 steps now come out 15-21%
    fast (the bf16 ones 8-13%): the FP8 step's remainder, 22 ms above the bf16 one's, is not
    priced, nor is eager Float8 (its casts unfused: 47-51% fast, a case no validation row runs)."""
    from paraspace.kernels.gemm_passes import gemm_passes_16bit_s, gemm_passes_s
    table = _fp8_rows(card)
    measured, predicted = {}, {}
    for dtype in ("bf16", "fp8"):
        for layers in (4, 6):
            r = table[(layers, 2, 8192, dtype, True)]
            measured[dtype, layers] = float(r["step_s"])
            predicted[dtype, layers] = _predicted_step_s(card, r)
    per_layer = {k: {d: (v[d, 6] - v[d, 4]) / 2 for d in ("bf16", "fp8")} for k, v in
                 (("measured", measured), ("predicted", predicted))}
    speedup = {k: v["bf16"] / v["fp8"] for k, v in per_layer.items()}
    assert 1.3 < speedup["measured"] < 1.45 and 1.35 < speedup["predicted"] < 1.5
    for d in ("bf16", "fp8"):
        assert per_layer["predicted"][d] == pytest.approx(per_layer["measured"][d], rel=0.12), d
    base = {d: measured[d, 4] - 4 * per_layer["measured"][d] for d in ("bf16", "fp8")}
    assert base["fp8"] > base["bf16"]  # the head does not speed up in FP8
    dev, _, tiles = pack_hardware(load_hardware(card), "fp8")
    head16 = sum(gemm_passes_16bit_s(16384.0, 128256.0, 4096.0, dev[0], tiles, 2.0))
    head8 = sum(gemm_passes_s(16384.0, 128256.0, 4096.0, dev[0], tiles, 2.0))
    assert 1.8 < head16 / head8 < 2.2
    assert 0.14 < (head16 - head8) / measured["fp8", 4] < 0.19
    for (dtype, layers), t in predicted.items():
        error = t / measured[dtype, layers] - 1
        assert (-0.22 if dtype == "fp8" else -0.14) < error < 0.0, (dtype, layers)
