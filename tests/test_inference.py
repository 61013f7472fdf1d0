"""Inference kernels (``kernels.inference``) by hand on toy records, hypothesis
properties, and ``paraspace validate`` on the published inference rows.
modeling.md section 8."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.explorer import validate
from paraspace.explorer.cli import main
from paraspace.kernels import inference as inf
from paraspace.kernels import params

GIB = 2.0**30
PROPS = settings(max_examples=40, deadline=None)
VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
INFERENCE = VALIDATION / "inference.csv"
needs_data = pytest.mark.skipif(not INFERENCE.is_file(), reason=f"{INFERENCE} not present")

#: mean absolute error of the `ok` inference rows may not exceed this; it only
#: moves down. Measured 6.5% (FasterTransformer 13B latency rows 7.9%,
#: TensorRT-LLM dense Llama throughput rows 6.4%, mean signed -4.4%), then 5.6%
#: (TensorRT-LLM rows 5.3%) once the H100 family's GEMM efficiency was refitted
#: on the training rows (0.55 -> 0.575, explorer/fit_published.py). One
#: exception to "only down", said here: the serving engines' own all-reduce
#: (kernels.collectives.engine_all_reduce_s: one- or two-shot inside NVLink, 2-3
#: latencies instead of the ring's 14 on 8 GPUs) took 6 ms off a Llama-70B TP8
#: decode step and the closed-loop TPOT error from 13.9% to 10.9%, but it sped up
#: the Llama-3.1-405B TP8 max-throughput rows too, four of five already
#: over-predicted (128/4096 tokens: +10.5% -> +27.9%): 5.6% -> 6.0% here. A second,
#: said here too: the H200's HBM read as the 141 GiB torch measures (150.1e9 B) instead
#: of 141e9 B (stop 35) lets the TensorRT-LLM H200 max-throughput rows' KV-bound
#: batches grow, and those rows run slightly over (4.6% -> 4.7%): 6.0% -> 6.16%. 5.57% once
#: the engines' all-reduce kernel moves its bytes at the rate measured for it (60 GB/s on
#: H100s, kernels.collectives.CUSTOM_ALL_REDUCE_LINK_SHARE) with NCCL where that is faster:
#: the 405B TP8 rows' large decode batches no longer gather at the link's full rate.
INFERENCE_MAPE_OK_THRESHOLD = 0.0558
#: the `uncertain` rows (Qwen3-235B-A22B MoE, EP not printed) measured 70.4%,
#: all over-predicted: the MoE path (uniform routing, grouped-GEMM efficiency as
#: dense) is optimistic. Committed so that it only moves down, with one
#: exception, said here: the 0.55 -> 0.575 GEMM refit above (fitted on training
#: rows, every H100/H200 prediction faster) moved these already over-predicted
#: rows to 72.5%, and the threshold from 0.71 to 0.73; the second, 0.575 -> 0.625 once
#: fused attention ran at its measured rates (docs/measurements/), to 74.5%; 73.0% with
#: the Hopper GEMMs' reduction fill; 73.14% once the H200's HBM is read as the 141 GiB
#: torch measures (stop 35: these H200 rows' KV-bound batches grow).
INFERENCE_MAPE_UNCERTAIN_THRESHOLD = 0.732

# -------------------------------------------------------------------- toy records


def toy_model(**overrides: float) -> np.ndarray:
    """2 layers, h 1024, 8 heads of 128 (GQA: 2 KV heads), SwiGLU ffn 4096, vocab 32000, untied."""
    values = {"layers": 2.0, "hidden": 1024.0, "heads": 8.0, "kv_heads": 2.0, "head_dim": 128.0, "ffn": 4096.0,
              "vocab": 32000.0, "glu": 1.0, "bias": 0.0, "tied_embeddings": 0.0, "dropout": 0.0}
    values.update(overrides)
    return params.record(params.MODEL, **values)


def toy_moe() -> np.ndarray:
    """The toy with 8 routed experts of width 512, top-2, in every layer."""
    return toy_model(experts=8.0, top_k=2.0, expert_ffn=512.0)


def srv16(**overrides: float) -> np.ndarray:
    """One replica on one device, 16-bit weights, activations and KV cache."""
    values = {"tp": 1.0, "pp": 1.0, "n_gpus": 1.0, "weight_bytes": 2.0, "act_bytes": 2.0, "kv_bytes": 2.0}
    values.update(overrides)
    return inf.serving(**values)


@pytest.fixture(scope="module")
def fast_flops(make_device):
    """The toy device (1 TB/s, no launch cost, ideal efficiencies) with 1e18 FLOP/s:
    every kernel is bound by its bytes, so a time is bytes / 1e12."""
    return make_device(peak_flops_per_s=1e18)


@pytest.fixture(scope="module")
def one_unit(make_device):
    """The toy device (100 TFLOP/s, 1 TB/s) with one compute unit: a GEMM whose
    sizes are multiples of the 128 x 128 tile runs at full efficiency."""
    return make_device(compute_units=1.0)


@pytest.fixture(scope="module")
def nvlink(make_tiers):
    return make_tiers((8.0, 100e9, 1e-6), (0.0, 25e9, 5e-6))


# -------------------------------------------------------------------- memory


def test_kv_bytes_per_token_by_hand():
    """K and V of each layer: 2 layers x 2 x 2 KV heads x 128 x 2 bytes = 2048 B;
    TP 4 over 2 KV heads keeps one (replicated) head per rank: 1024 B; attention
    DP keeps all heads on each rank: 2048 B; MLA stores the latent and the RoPE
    key: 2 x (512 + 64) x 1 byte = 1152 B."""
    m = toy_model()[0]
    assert inf.kv_bytes_per_token(m, srv16()[0]) == 2 * 2 * 2 * 128 * 2
    assert inf.kv_bytes_per_token(m, srv16(tp=4.0)[0]) == 2 * 2 * 1 * 128 * 2
    assert inf.kv_bytes_per_token(m, srv16(tp=4.0, attention_dp=1.0)[0]) == 2 * 2 * 2 * 128 * 2
    mla = toy_model(mla=1.0, kv_lora_rank=512.0, qk_rope_head_dim=64.0, qk_nope_head_dim=128.0, v_head_dim=128.0)
    assert inf.kv_bytes_per_token(mla[0], srv16(kv_bytes=1.0)[0]) == 2 * (512 + 64) * 1


def test_weights_and_max_batch_by_hand(toy_dev):
    """Per layer h (q + 2 kv) + q h = 1024 x 1536 + 1024 x 1024 attention, 3 h f =
    3 x 1024 x 4096 MLP, 2 h norms; two layers and the final norm at 2 bytes; the
    embedding and the untied head 2 x 32000 x 1024 at 2 bytes. The KV cache gets
    95% of the 80 GiB left beside them; a sequence of 1000 tokens takes 2048 B
    each: 39,756 sequences, capped at 4096 unless the cap is raised."""
    m = toy_model()[0]
    layer = 1024 * (1024 + 2 * 256) + 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024
    weights = (2 * layer + 1024) * 2 + 2 * 32000 * 1024 * 2
    assert weights == 191_899_648
    assert inf.device_weight_bytes(m, srv16()[0]) == weights
    room = math.floor(0.95 * (80 * GIB - weights) / (2048 * 1000))
    assert room == 39_756
    assert inf.kv_capacity(m, toy_dev[0], srv16()[0], 1000.0) == room
    assert inf.max_batch(m, toy_dev[0], srv16()[0], 1000.0) == 4096
    assert inf.max_batch(m, toy_dev[0], srv16(batch_cap=1e9)[0], 1000.0) == room
    # attention DP over 4 ranks: every rank holds the whole model and its own sequences
    dp = srv16(tp=4.0, n_gpus=4.0, attention_dp=1.0, batch_cap=1e9)[0]
    assert inf.device_weight_bytes(m, dp) == weights
    assert inf.kv_capacity(m, toy_dev[0], dp, 1000.0) == 4 * room
    # two pipeline stages: one layer each, the embedding on the first, the final norm and head on the last
    pp = srv16(pp=2.0)[0]
    assert inf.device_weight_bytes(m, pp) == (layer + 1024) * 2 + 32000 * 1024 * 2


def test_model_that_does_not_fit_has_no_batch(toy_dev, nvlink, toy_tiles):
    huge = toy_model(layers=2000.0)[0]  # 2000 x 15.2M x 2 B = 61 GB of layers, 80 GiB HBM: fits
    assert inf.max_batch(huge, toy_dev[0], srv16()[0], 1000.0) > 0
    huger = toy_model(layers=3000.0)[0]  # 91 GB: does not
    assert inf.max_batch(huger, toy_dev[0], srv16()[0], 1000.0) == 0
    out = inf.serve(huger, toy_dev[0], nvlink, toy_tiles, srv16()[0], 0.0, 128.0, 128.0)
    assert out[inf.I_FITS] == 0 and out[inf.I_BATCH] == 0 and np.isnan(out[inf.I_OUT_TPS])


# -------------------------------------------------------------------- decode


def test_decode_step_is_the_bytes_it_reads(fast_flops, nvlink, toy_tiles):
    """One sequence, KV of 1000 tokens, bandwidth-bound device (1e12 B/s), in bytes:
    per layer QKV (1024 + 1024 x 1536 + 1536) x 2; attention Q/O 8 x 256 x 2 and
    the KV cache 1000 x 2 heads x 256 x 2; out-proj (1024 + 1024^2 + 1024) x 2;
    norms/residuals 10 x 1024 x 2, rotary 2 x 1280 x 2, KV write 2 x 2 x 128 x 2;
    MLP up (1024 + 1024 x 8192 + 8192) x 2, down (4096 + 4096 x 1024 + 1024) x 2,
    SwiGLU 3 x 4096 x 2. Then the embedding 2 x 1024 x 2, final norm 2 x 1024 x 2,
    LM head (1024 + 1024 x 32000 + 32000) x 2 and sampling 32000 x 2."""
    layer = ((1024 + 1024 * 1536 + 1536) * 2 + (8 * 256 * 2 + 1000 * 2 * 256 * 2)
             + (1024 + 1024 * 1024 + 1024) * 2 + (10 * 1024 * 2 + 2 * 1280 * 2 + 2 * 2 * 128 * 2)
             + (1024 + 1024 * 8192 + 8192) * 2 + (4096 + 4096 * 1024 + 1024) * 2 + 3 * 4096 * 2)
    assert layer == 31_525_888
    total = 2 * layer + 2 * 1024 * 2 + 2 * 1024 * 2 + (1024 + 1024 * 32000 + 32000) * 2 + 32000 * 2
    got = inf.decode_step_s(toy_model()[0], fast_flops[0], nvlink, toy_tiles, srv16()[0], 1.0, 1000.0)
    assert got == pytest.approx(total / 1e12, rel=1e-12)


def test_decode_attention_reads_the_kv_cache(fast_flops, nvlink, toy_tiles):
    """Each further token of KV costs 2 x kv_heads x head_dim x bytes per sequence
    per layer: 2 x 2 x 128 x 2 = 1024 B, times 3 sequences and 2 layers."""
    m, s = toy_model()[0], srv16()[0]
    a = inf.decode_step_s(m, fast_flops[0], nvlink, toy_tiles, s, 3.0, 1000.0)
    b = inf.decode_step_s(m, fast_flops[0], nvlink, toy_tiles, s, 3.0, 5000.0)
    assert b - a == pytest.approx(3 * 2 * 4000 * 1024 / 1e12, rel=1e-9)


def test_tp_all_reduces_are_latency(fast_flops, make_tiers, toy_tiles):
    """TP 2 on links of latency a and no bandwidth cost: two all-reduces per layer,
    2 (n - 1) a each, and the logits' all-gather, (n - 1) a: 2 x 2 x 2a + a = 9a."""
    m, s = toy_model()[0], srv16(tp=2.0, n_gpus=2.0)[0]
    slow = inf.decode_step_s(m, fast_flops[0], make_tiers((8.0, 1e30, 1e-6), (0.0, 1e30, 1e-6)), toy_tiles, s,
                             1.0, 1000.0)
    free = inf.decode_step_s(m, fast_flops[0], make_tiers((8.0, 1e30, 0.0), (0.0, 1e30, 0.0)), toy_tiles, s,
                             1.0, 1000.0)
    assert slow - free == pytest.approx(9e-6, rel=1e-9)


def test_launch_overhead_per_kernel(make_device, nvlink, toy_tiles):
    """Per layer 5 GEMM-like kernels (QKV, attention, out, up, down) and 6 memory
    passes (2 norms, 2 residual adds, rotary, activation); then embedding, norm,
    LM head and sampling: 2 x 11 + 4 = 26 launches."""
    m, s = toy_model()[0], srv16()[0]
    with_launch = inf.decode_step_s(m, make_device(peak_flops_per_s=1e18, launch_s=1e-5)[0], nvlink, toy_tiles, s,
                                    1.0, 1000.0)
    without = inf.decode_step_s(m, make_device(peak_flops_per_s=1e18)[0], nvlink, toy_tiles, s, 1.0, 1000.0)
    assert with_launch - without == pytest.approx(26 * 1e-5, rel=1e-9)


def test_moe_decode_reads_only_the_routed_experts(fast_flops, nvlink, toy_tiles):
    """One token routed to 2 of 8 experts: 8 x (1 - (1 - 2/8)^1) = 2 experts read,
    one row each. Router (1024 + 1024 x 8 + 8) x 2 plus softmax/top-k 12 x 8;
    per expert up (1024 + 1024 x 1024 + 1024) x 2 and down (512 + 512 x 1024 +
    1024) x 2; SwiGLU 3 x 2 x 512 x 2; permute and unpermute 2 x (1 + 2 x 2) x 1024 x 2."""
    assert inf.active_experts(8.0, 2.0, 1.0) == pytest.approx(2.0, rel=1e-15)
    assert inf.active_experts(8.0, 2.0, 1000.0) == pytest.approx(8.0, rel=1e-12)
    nbytes = ((1024 + 1024 * 8 + 8) * 2 + 12 * 8 + 2 * (1024 + 1024 * 1024 + 1024) * 2
              + 2 * (512 + 512 * 1024 + 1024) * 2 + 3 * 2 * 512 * 2 + 2 * (1 + 2 * 2) * 1024 * 2)
    got = inf.moe_mlp_s(toy_moe()[0], fast_flops[0], nvlink, toy_tiles, srv16()[0], 1.0)
    assert got == pytest.approx(nbytes / 1e12, rel=1e-12)


def test_moe_attention_dp_dispatches(fast_flops, make_tiers, toy_tiles):
    """Under attention DP the expert outputs come back by all-to-all, not by an
    all-reduce: with latency-only links, TP attention pays the engines' one-shot
    all-reduce, 2a per MoE layer (NCCL's ring would pay 2 (n - 1) a = 6a;
    ``kernels.collectives.engine_all_reduce_s``), attention DP the dispatch and
    combine, (r - 1) a = 3a each, over an EP group of 4 on one node."""
    tiers = make_tiers((8.0, 1e30, 1e-6), (0.0, 1e30, 1e-6))
    free = make_tiers((8.0, 1e30, 0.0), (0.0, 1e30, 0.0))
    m = toy_moe()[0]
    for dp, comm in ((0.0, 2e-6), (1.0, 6e-6)):
        s = srv16(tp=4.0, ep=4.0, n_gpus=4.0, attention_dp=dp)[0]
        diff = (inf.moe_mlp_s(m, fast_flops[0], tiers, toy_tiles, s, 64.0)
                - inf.moe_mlp_s(m, fast_flops[0], free, toy_tiles, s, 64.0))
        assert diff == pytest.approx(comm, rel=1e-9)
    # the attention block: an all-reduce under TP, nothing under DP
    tp_attn = srv16(tp=4.0, ep=4.0, n_gpus=4.0)[0]
    dp_attn = srv16(tp=4.0, ep=4.0, n_gpus=4.0, attention_dp=1.0)[0]
    for s, comm in ((tp_attn, 2e-6), (dp_attn, 0.0)):
        diff = (inf.attention_block_s(m, fast_flops[0], tiers, toy_tiles, s, 4.0, 1.0, 100.0)
                - inf.attention_block_s(m, fast_flops[0], free, toy_tiles, s, 4.0, 1.0, 100.0))
        assert diff == pytest.approx(comm, abs=1e-15)


# -------------------------------------------------------------------- prefill


def test_prefill_by_hand(one_unit, nvlink, toy_tiles):
    """One prompt of 1280 tokens on 100 TFLOP/s at full tile efficiency, in FLOP
    per layer: QKV 2 x 1280 x 1536 x 1024, causal attention 1280^2 x 8 x 256,
    out 2 x 1280 x 1024^2, up 2 x 1280 x 8192 x 1024, down 2 x 1280 x 1024 x 4096;
    memory passes at 1 TB/s: norms/residuals 10 x 1280 x 1024 x 2, rotary 2 x 1280
    x 1280 x 2, KV write 1280 x 2 x 2 x 128 x 2, SwiGLU 3 x 1280 x 4096 x 2. Then
    the embedding 2 x 1280 x 1024 x 2 B, and the head on the last token only:
    norm 2 x 1024 x 2 B, the LM head as a 128-row tile, 128 x 2 x 32000 x 1024
    FLOP, sampling 32000 x 2 B. The fused attention call spans 1280 keys: it runs at
    1280 / (1280 + 450) of the rate (``ops.loop_fill``), its FLOP x 1730 / 1280."""
    flop = (2 * 1280 * 1536 * 1024 + 1280 * 1280 * 8 * 256 * 1730 / 1280 + 2 * 1280 * 1024 * 1024
            + 2 * 1280 * 8192 * 1024 + 2 * 1280 * 1024 * 4096)
    mem = 10 * 1280 * 1024 * 2 + 2 * 1280 * 1280 * 2 + 1280 * 2 * 2 * 128 * 2 + 3 * 1280 * 4096 * 2
    expected = (2 * (flop / 1e14 + mem / 1e12) + 2 * 1280 * 1024 * 2 / 1e12
                + 2 * 1024 * 2 / 1e12 + 128 * 2 * 32000 * 1024 / 1e14 + 32000 * 2 / 1e12)
    got = inf.prefill_s(toy_model()[0], one_unit[0], nvlink, toy_tiles, srv16()[0], 1.0, 1280.0)
    assert got == pytest.approx(expected, rel=1e-12)


def test_pipeline_stages_sum_their_layers(one_unit, make_tiers, toy_tiles):
    """Two stages on free links: one batch's latency is the same layers in turn;
    serving splits the batch into two micro-batches that keep both stages busy."""
    free = make_tiers((8.0, 1e30, 0.0), (0.0, 1e30, 0.0))
    m = toy_model()[0]
    one, two = srv16()[0], srv16(pp=2.0, n_gpus=2.0)[0]
    assert inf.prefill_s(m, one_unit[0], free, toy_tiles, two, 4.0, 512.0) == pytest.approx(
        inf.prefill_s(m, one_unit[0], free, toy_tiles, one, 4.0, 512.0), rel=1e-12)
    out = inf.serve(m, one_unit[0], free, toy_tiles, two, 64.0, 512.0, 64.0)
    wave = inf.prefill_s(m, one_unit[0], free, toy_tiles, two, 32.0, 512.0) + 64 * inf.decode_step_s(
        m, one_unit[0], free, toy_tiles, two, 32.0, 512.0 + 65 / 2)
    assert out[inf.I_OUT_TPS] == pytest.approx(64 * 64 / wave, rel=1e-12)


# -------------------------------------------------------------------- end to end


def test_serve_totals_and_throughput(h100, llama3_8b):
    """total = prefill + output_len steps at the mean KV length input + (out + 1) / 2;
    output tokens per second = replicas x batch x output_len / total (pp = 1);
    8 GPUs at TP 2 are 4 replicas."""
    device = h100.device
    s2 = srv16(tp=2.0, n_gpus=2.0)[0]
    out = inf.serve(llama3_8b[0], device[0], h100.tiers, h100.tiles, s2, 16.0, 1000.0, 200.0)
    pre = inf.prefill_s(llama3_8b[0], device[0], h100.tiers, h100.tiles, s2, 16.0, 1000.0)
    step = inf.decode_step_s(llama3_8b[0], device[0], h100.tiers, h100.tiles, s2, 16.0, 1100.5)
    assert out[inf.I_PREFILL] == pre and out[inf.I_DECODE_STEP] == step
    assert out[inf.I_TOTAL] == pytest.approx(pre + 200 * step, rel=1e-15)
    assert out[inf.I_OUT_TPS] == pytest.approx(16 * 200 / (pre + 200 * step), rel=1e-12)
    assert out[inf.I_TPS] == pytest.approx(16 * 1200 / (pre + 200 * step), rel=1e-12)
    s8 = srv16(tp=2.0, n_gpus=8.0)[0]
    out8 = inf.serve(llama3_8b[0], device[0], h100.tiers, h100.tiles, s8, 16.0, 1000.0, 200.0)
    assert out8[inf.I_REPLICAS] == 4 and out8[inf.I_OUT_TPS] == pytest.approx(4 * out[inf.I_OUT_TPS], rel=1e-12)


def test_mean_kv_length_equals_the_exact_sum(h100, llama3_8b):
    """Decode attention is memory-bound, so a step is affine in the KV length and
    output_len steps at the mean length equal the sum over the exact lengths."""
    args = (llama3_8b[0], h100.device[0], h100.tiers, h100.tiles, srv16()[0], 32.0)
    exact = sum(inf.decode_step_s(*args, 1000.0 + i + 1) for i in range(300))
    assert 300 * inf.decode_step_s(*args, inf.mean_kv_len(1000.0, 300.0, 0.0)) == pytest.approx(exact, rel=1e-10)


# -------------------------------------------------------------------- properties

lengths = st.sampled_from([1.0, 16.0, 128.0, 1000.0, 4096.0])
batches = st.sampled_from([1.0, 2.0, 8.0, 64.0, 256.0, 1024.0])
speedup = st.floats(1.0, 8.0)


@PROPS
@given(b=batches, il=lengths, ol=lengths, tp=st.sampled_from([1.0, 2.0, 8.0]), bw_up=speedup, link_up=speedup,
       moe=st.booleans())
def test_more_bandwidth_is_never_slower(h100, llama3_8b, b, il, ol, tp, bw_up, link_up, moe):
    model = toy_moe() if moe else llama3_8b
    base = srv16(tp=tp, n_gpus=tp, ep=tp if moe else 1.0, attention_dp=1.0 if moe else 0.0)[0]
    dev = h100.device.copy()
    dev["hbm_bytes_per_s"] *= bw_up
    tiers = h100.tiers.copy()
    tiers["bytes_per_s"] *= link_up
    slow = inf.serve(model[0], h100.device[0], h100.tiers, h100.tiles, base, b, il, ol)
    fast = inf.serve(model[0], dev[0], tiers, h100.tiles, base, b, il, ol)
    for i in (inf.I_PREFILL, inf.I_DECODE_STEP, inf.I_TOTAL):
        assert 0.0 < fast[i] <= slow[i] and math.isfinite(slow[i])
    assert fast[inf.I_OUT_TPS] >= slow[inf.I_OUT_TPS] > 0.0


@PROPS
@given(b=batches, il=lengths, ol=lengths, tp=st.sampled_from([1.0, 2.0, 4.0]))
def test_more_batch_never_lowers_throughput(h100, llama3_8b, b, il, ol, tp):
    """Doubling the batch (while it fits) never lowers tokens per second, per decode
    step and end to end: no kernel gets slower per row with twice the rows."""
    device = h100.device.copy()
    device["peak_flops_per_s"] = 1978.9e12  # fp8
    s = srv16(tp=tp, n_gpus=tp, weight_bytes=1.0, kv_bytes=1.0)[0]
    args = (llama3_8b[0], device[0], h100.tiers, h100.tiles, s)
    if 2 * b > inf.kv_capacity(llama3_8b[0], device[0], s, il + ol):
        return
    one = inf.serve(*args, b, il, ol)
    two = inf.serve(*args, 2 * b, il, ol)
    assert 2 * b / two[inf.I_DECODE_STEP] >= b / one[inf.I_DECODE_STEP] * (1 - 1e-12)
    assert two[inf.I_OUT_TPS] >= one[inf.I_OUT_TPS] * (1 - 1e-12)
    assert one[inf.I_FITS] == two[inf.I_FITS] == 1


# -------------------------------------------------------------------- validate


@needs_data
def test_published_inference_rows_are_predicted():
    """Every row predicted (the model fits on every published deployment), the ok
    rows within the committed threshold; the max-throughput rows report the batch
    the KV cache allowed and what bounded it."""
    kind, every = validate.run(INFERENCE)
    assert kind == "inference" and len(every) == 659
    # the second version's new rows (closed-loop TTFT/TPOT, per-GPU throughput of EP
    # deployments, MLPerf) are the serving issue's (15): each has a status, and the
    # rows the one-request model cannot take say why
    assert all(r.reason for r in every if r.status == "unsupported")
    results = [r for r in every if r.source in ("fastertransformer-13b-kipply", "tensorrt-llm-perf-overview")]
    assert len(results) == 83
    stats = validate.summary(results)
    assert stats["status"] == {"ok": 83, "oom": 0, "no-candidate": 0, "unsupported": 0}, stats["status"]
    assert stats["ok"]["n"] == 66 and stats["uncertain"]["n"] == 17
    assert stats["ok"]["mape"] <= INFERENCE_MAPE_OK_THRESHOLD, stats["ok"]
    assert stats["uncertain"]["mape"] <= INFERENCE_MAPE_UNCERTAIN_THRESHOLD, stats["uncertain"]
    by_id = {r.id: r for r in results}
    ft = by_id["ft-13b-tp1-total-latency"]
    assert ft.chosen == {"batch": 1, "replicas": 1}
    trt = by_id["trtllm-llama-3.1-8b-h100-tp1-128-128"]
    assert trt.chosen == {"batch": 4096, "replicas": 1, "batch_limit": "runtime-cap"}
    long = by_id["trtllm-llama-3.1-8b-h100-tp1-20000-2000"]
    assert long.chosen["batch_limit"] == "kv-cache" and 1 <= long.chosen["batch"] < 100
    qwen = by_id["trtllm-qwen3-235b-a22b-h200-tp8-128-128"]
    assert qwen.chosen["ep"] in (1, 2, 4, 8) and qwen.chosen["attention"] in ("tp", "dp")


ROW = {
    "id": "i-1", "source": "test", "ref": "here", "quality": "ok", "model": "toy", "layers": "32", "hidden": "4096",
    "heads": "32", "kv_heads": "8", "ffn": "14336", "vocab": "128256", "glu": "1", "n_experts": "", "topk": "",
    "expert_ffn": "", "gpu": "h100-sxm5-80gb", "n_gpus": "1", "tp": "1", "pp": "1", "ep": "1", "dtype": "fp8",
    "batch": "", "input_len": "128", "output_len": "128", "metric": "output_throughput_tokens_per_s",
    "value": "20000", "notes": "",
}


def write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "inference.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ROW))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_every_metric_reads_its_column(tmp_path, h100, llama3_8b):
    metrics = list(validate.INFERENCE_METRICS)
    rows = [{**ROW, "id": m, "metric": m, "batch": "8"} for m in metrics]
    kind, results = validate.run(write(tmp_path, rows))
    assert kind == "inference" and [r.status for r in results] == ["ok"] * len(metrics)
    by = {r.metric: r.predicted for r in results}
    assert by["ttft_s"] == by["prefill_latency_s"] and by["tpot_s"] == by["decode_latency_per_token_s"]
    assert by["total_latency_s"] == pytest.approx(by["prefill_latency_s"] + 128 * by["tpot_s"], rel=1e-12)
    assert by["throughput_tokens_per_s"] == pytest.approx(2 * by["output_throughput_tokens_per_s"], rel=1e-12)
    assert by["output_throughput_tokens_per_s"] == pytest.approx(8 * 128 / by["total_latency_s"], rel=1e-12)


def test_moe_row_searches_ep_and_attention_layout(tmp_path):
    moe = {**ROW, "id": "moe", "n_experts": "8", "topk": "2", "expert_ffn": "14336", "ffn": "14336", "tp": "4",
           "n_gpus": "4", "ep": "", "notes": "head_dim 128"}
    (result,) = validate.run(write(tmp_path, [moe]))[1]
    assert result.status == "ok" and set(result.chosen) == {"batch", "replicas", "batch_limit", "ep", "attention"}
    assert result.chosen["ep"] in (1, 2, 4)


def test_rows_that_cannot_fit_are_reported(tmp_path):
    """Llama-405B-sized weights on one H100: no batch fits (no-candidate, no
    prediction); with a batch given the row is predicted but marked oom."""
    big = {**ROW, "layers": "126", "hidden": "16384", "heads": "128", "ffn": "53248"}
    _, results = validate.run(write(tmp_path, [big, {**big, "id": "i-2", "batch": "1",
                                                     "metric": "decode_latency_per_token_s"}]))
    assert [r.status for r in results] == ["no-candidate", "oom"]
    assert results[0].predicted is None and results[1].predicted > 0


@pytest.mark.parametrize(("change", "needles"), [
    ({"metric": "latency"}, ["row i-1", "metric", "'latency'", "output_throughput_tokens_per_s"]),
    ({"gpu": "b200"}, ["row i-1", "gpu", "'b200'", "h100-sxm5-80gb"]),
    ({"gpu": "a100-sxm4-80gb"}, ["row i-1", "dtype", "'fp8'", "a100-sxm4-80gb"]),
    ({"tp": "two"}, ["row i-1", "tp", "'two'", "number"]),
    ({"n_gpus": "3", "tp": "2"}, ["row i-1", "n_gpus = 3", "multiple of tp*pp = 2"]),
    ({"input_len": ""}, ["row i-1", "input_len", "EMPTY is not allowed"]),
    ({"batch": "0"}, ["row i-1", "batch = '0'", "a whole number from 1"]),  # not EMPTY: a batch of none
    ({"n_experts": "8", "topk": "2", "expert_ffn": "1024", "ep": "3"}, ["row i-1", "ep = 3", "a divisor of tp"]),
    ({"n_experts": "8", "topk": "", "expert_ffn": "1024"}, ["row i-1", "topk", "MoE row"]),
])
def test_bad_inference_rows_are_unsupported_with_a_reason(tmp_path, change, needles):
    (result,) = validate.run(write(tmp_path, [{**ROW, **change}]))[1]
    assert result.status == "unsupported" and result.predicted is None
    for needle in needles:
        assert needle in result.reason, result.reason


def test_cli_prints_inference_rows(tmp_path):
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path, [ROW]))])
    assert result.exit_code == 0, result.output
    assert "i-1" in result.output and "batch=" in result.output and "MAPE" in result.output


def test_kernel_fusion_drops_passes_and_launches(make_device, nvlink, toy_tiles):
    """Fused: per layer QKV, attention, out, two residual+norm kernels, up, down
    = 7 launches (11 unfused); 2 x 7 + 4 = 18. The bytes drop by the rotary pass
    2 x 1280 x 2, 2 x 1024 x 2 of norms and the SwiGLU pass 3 x 4096 x 2 per layer."""
    m, s = toy_model()[0], srv16()[0]
    fused = make_device(peak_flops_per_s=1e18, kernel_fusion=1.0)
    plain = make_device(peak_flops_per_s=1e18)
    launch = make_device(peak_flops_per_s=1e18, kernel_fusion=1.0, launch_s=1e-5)
    a = inf.decode_step_s(m, fused[0], nvlink, toy_tiles, s, 1.0, 1000.0)
    b = inf.decode_step_s(m, plain[0], nvlink, toy_tiles, s, 1.0, 1000.0)
    c = inf.decode_step_s(m, launch[0], nvlink, toy_tiles, s, 1.0, 1000.0)
    assert b - a == pytest.approx(2 * (2 * 1280 * 2 + 2 * 1024 * 2 + 3 * 4096 * 2) / 1e12, rel=1e-9)
    assert c - a == pytest.approx(18 * 1e-5, rel=1e-9)


def test_sliding_window_bounds_keys_and_cache(toy_dev, fast_flops, nvlink, toy_tiles):
    """Window 105, prompt 100, 10 tokens: the steps attend 101, ..., 104, then 105
    six times: mean (101 + 102 + 103 + 104 + 105 + 5 x 105) / 10 = 104; the sum of
    the exact steps equals 10 steps at that mean. A sequence keeps at most 105
    entries per layer, so the cache holds 1000 / 105 times more long sequences."""
    assert inf.mean_kv_len(100.0, 10.0, 105.0) == pytest.approx(104.0, rel=1e-15)
    assert inf.mean_kv_len(100.0, 10.0, 50.0) == 50.0
    assert inf.mean_kv_len(100.0, 10.0, 0.0) == 105.5
    m = toy_model(sliding_window=105.0)[0]
    args = (m, fast_flops[0], nvlink, toy_tiles, srv16()[0], 4.0)
    exact = sum(inf.decode_step_s(*args, 100.0 + i + 1) for i in range(10))
    assert 10 * inf.decode_step_s(*args, 104.0) == pytest.approx(exact, rel=1e-12)
    out = inf.serve(m, fast_flops[0], nvlink, toy_tiles, srv16()[0], 4.0, 100.0, 10.0)
    assert out[inf.I_DECODE_STEP] == inf.decode_step_s(*args, 104.0)
    full = srv16(batch_cap=1e9)[0]
    assert inf.kv_capacity(m, toy_dev[0], full, 1000.0) == math.floor(
        inf.kv_capacity(toy_model()[0], toy_dev[0], full, 105.0))


#: closed-loop serving points (AIConfigurator's measured TTFT / TPOT on H100,
#: ok rows), predicted by the serving space's simulation: 32.0% (the one-request
#: model read TTFT as one prefill and was at 260%), 29.3% with each engine's scheduler
#: and token budget, 16.9% with TensorRT-LLM's overlap scheduler; only moves down, with
#: one exception, said here: 18.1% once the H100 family's GEMM knob was refitted on the
#: training rows under the measured attention rates (0.575 -> 0.625; these rows were
#: already too fast, tests/test_validate_inference.py says more); 18.0% with the Hopper
#: GEMMs' reduction fill, 16.3% with the benchmark's 10 requests per user, 16.0% with
#: vLLM's default 16-bit KV cache, 15.9% with the attention kernel's fill on each prompt row,
#: 15.1% with the engines' all-reduce kernel at its measured rate
SERVING_MAPE_OK_THRESHOLD = 0.152


@needs_data
def test_closed_loop_serving_rows_go_through_the_serving_simulation():
    from paraspace.explorer.serve import evaluate_space
    from paraspace.spaces.serving import LoadedServing, ServingSpec, check_serving
    from paraspace.spaces.schema import validate as build

    kind, every = validate.run(INFERENCE)
    served = [r for r in every if r.source == "aiconfigurator-silicon-public"]
    assert len(served) == 554 and all(r.status in ("ok", "oom") for r in served)
    # 550 give their concurrency; the 4 that do not are read as the one-request model reads them
    assert sum("simulated" in r.chosen for r in served) == 550
    assert all(r.chosen["simulated"] for r in served if r.status == "ok" and "simulated" in r.chosen)
    stats = validate.summary(served)
    assert stats["ok"]["mape"] <= SERVING_MAPE_OK_THRESHOLD, stats["ok"]
    assert set(stats["by_metric"]) >= {"ttft_s", "tpot_s"}
    # the same row as a serving space by hand gives the same number
    row = next(r for r in validate.read(INFERENCE).iter_rows(named=True)
               if r["source"] == "aiconfigurator-silicon-public" and r["metric"] == "tpot_s" and r["attention_dp"] == "0")
    assert row["framework"].startswith("vllm")
    model = validate.row_model(row, "t", "t")
    hw = validate.row_hardware(row, "t", "t", row["gpu"])
    raw = {"name": "row", "description": "d", "model": model.name, "hardware": hw.name, "devices": int(row["n_gpus"]),
           "host_overhead_us": validate.SERVING_HOST_US, "simulate_top": 1,
           "workload": {"input_len": int(row["input_len"]), "output_len": int(row["output_len"]),
                        "concurrency": int(row["concurrency"]),
                        # AIConfigurator's benchmark: 10 requests per user (validate.SERVING_REQUESTS_PER_USER),
                        # all of them measured (the start-up burst too: validate turns steady_state off)
                        "n_requests": 10 * int(row["concurrency"]), "steady_state": False},
           "dimensions": {"tp": [int(row["tp"])], "pp": [int(row["pp"])], "ep": [int(row["ep"] or 1)],
                          # FP8 weights; vLLM's "auto" cache keeps the model's 16-bit type (validate.row_kv_dtype)
                          "attention_dp": [False], "dtype": [row["dtype"]], "kv_dtype": [row["kv_dtype"] or "bf16"],
                          "max_batch": [int(row["batch"] or row["concurrency"])],
                          # AIConfigurator's budget for the engine: batch + isl + 1,500; vLLM chunks prompts
                          "max_tokens": [int(row["batch"] or row["concurrency"]) + int(row["input_len"]) + 1500],
                          "scheduler": ["continuous"], "overlap_scheduler": [False]}}
    space = LoadedServing(spec=build(ServingSpec, raw, "t"), model=model, hardware=hw, source="t", raw=raw)
    check_serving(space)
    cols, _ = evaluate_space(space)
    by_id = {r.id: r for r in served}
    assert by_id[row["id"]].predicted == float(cols["tpot_s"][0])


PHASE = {**ROW, "id": "p-1", "mode": "prefill", "metric": "input_tokens_per_s_per_gpu", "tp": "2", "n_gpus": "2",
         "pp": "1", "ep": "1", "attention_dp": "0", "batch": "4", "input_len": "1000", "output_len": "",
         "value": "5000"}


def test_isolated_phases_are_tokens_per_second_per_gpu_of_the_replica(tmp_path, h100, llama3_8b):
    """Prefill of 4 prompts of 1,000 tokens on a TP2 replica: 4 x 1,000 tokens over the
    replica's prefill time, per GPU (/ 2). Decode: 4 tokens (one per sequence) over one
    step at a KV length of 1,000, per GPU. Under attention DP the batch is per rank:
    4 x 2 = 8 sequences in the replica."""
    fields = list(PHASE) + ["mode"]
    rows = [PHASE, {**PHASE, "id": "d-1", "mode": "decode", "metric": "output_tokens_per_s_per_gpu"}]
    path = tmp_path / "phase.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(fields)))
        writer.writeheader()
        writer.writerows(rows)
    prefill, decode = validate.run(path)[1]
    assert prefill.status == decode.status == "ok"
    dev, tiers, tiles = validate.pack_hardware(validate.load_hardware("h100-sxm5-80gb"), "fp8")
    model = validate.pack_model(validate.row_model(PHASE, "t", "t"))[0]
    srv = inf.serving(tp=2, pp=1, ep=1, attention_dp=0.0, n_gpus=2, weight_bytes=1.0, act_bytes=2.0, kv_bytes=1.0)[0]
    t_pre = inf.prefill_s(model, dev[0], tiers, tiles, srv, 4.0, 1000.0)
    t_dec = inf.decode_step_s(model, dev[0], tiers, tiles, srv, 4.0, 1000.0)
    assert prefill.predicted == pytest.approx(4 * 1000 / t_pre / 2, rel=1e-12)
    assert decode.predicted == pytest.approx(4 / t_dec / 2, rel=1e-12)
    assert prefill.chosen == {"batch": 4, "batch_limit": "row"}


def test_a_phase_row_with_an_ep_that_splits_no_expert_evenly_holds_redundant_copies(tmp_path):
    """8 experts over EP3: the smallest multiple of 3 from 8 is 9 slots, one redundant
    copy (``validate.row_expert_slots``), 3 a rank; the row is predicted."""
    moe = {**PHASE, "n_experts": "8", "topk": "2", "expert_ffn": "1024", "ep": "3", "tp": "3", "n_gpus": "3",
           "heads": "33", "kv_heads": "3", "hidden": "4224"}
    path = tmp_path / "p.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys([*PHASE, *moe])))
        writer.writeheader()
        writer.writerow(moe)
    (result,) = validate.run(path)[1]
    assert result.status == "ok" and result.predicted > 0, result.reason
    assert result.chosen["expert_slots"] == 9
