"""What a layer run as eager PyTorch ops keeps for its backward
(``SpaceSpec.elementwise = "eager"``, ``kernels.memory.eager_bytes_per_layer``) and
what its elementwise work costs (``kernels.elementwise``).

Measured to the byte on an H100 and an H200 (``docs/measurements``, ``layer.csv``,
``tests/test_device_measurements.py``): beside Korthikanti's tensors an eager block
keeps the rotated Q and K (rotary applied out of place), the attention output's
transposed copy the output projection reads, and an unfused SwiGLU's SiLU output.
Fused kernels (Megatron with Transformer Engine) keep none of them, the default."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cross_entropy_memory import sweep_one
from test_memory_variants import run

from paraspace.explorer.evaluate import pack_model
from paraspace.kernels import params
from paraspace.kernels.codes import (
    RECOMPUTE_FULL,
    RECOMPUTE_MOE_DISPATCH,
    RECOMPUTE_NONE,
    RECOMPUTE_NORMS,
    RECOMPUTE_SELECTIVE,
    RECOMPUTE_SELECTIVE_OPS,
)
from paraspace.kernels.attention import attention_s
from paraspace.kernels.memory import activation_bytes_per_layer, eager_bytes_per_layer
from paraspace.kernels.mlp import dense_mlp_s
from paraspace.kernels.shape import shape_of
from paraspace.spaces.catalog import load_model

#: modes whose layers keep their activations (what eager ops add applies) and those that do not
KEEPING = (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_NORMS, RECOMPUTE_MOE_DISPATCH)


def test_llama3_8b_layer_by_hand(llama3_8b):
    """Llama 3 8B (h 4,096, 32 heads and 8 KV heads of 128, f 14,336), 4 x 2,048 tokens,
    t = 1, ab = 2: rotated Q 32 x 128 + rotated K 8 x 128 + the transposed attention
    output 32 x 128 = 9,216, plus SiLU(gate) 14,336: 23,552 elements, 47,104 bytes a
    token, 385,875,968 for the 8,192 tokens. The fused count is 139,392 a token (4 ab h +
    ab d (2 x 32 + 2 x 8) + 3 ab f + 4 x 32 = 32,768 + 20,480 + 86,016 + 128): eager keeps
    33.8% more. At t = 4 every term is a TP rank's quarter."""
    model = llama3_8b[0]
    eager = eager_bytes_per_layer(4.0, 2048.0, 1.0, 1.0, RECOMPUTE_NONE, model, 2.0, False, 1.0)
    assert eager == 2 * 8192 * (32 * 128 + 8 * 128 + 32 * 128 + 14336) == 385_875_968
    fused = activation_bytes_per_layer(4.0, 2048.0, 1.0, 1.0, False, RECOMPUTE_NONE, True, model, 2.0)
    assert fused == 8192 * 139_392
    assert eager / fused == pytest.approx(0.338, abs=5e-4)
    assert eager_bytes_per_layer(4.0, 2048.0, 4.0, 1.0, RECOMPUTE_NONE, model, 2.0, False, 1.0) == eager / 4


def test_nothing_more_where_the_layer_keeps_only_its_input_or_a_policy_decides(llama3_8b):
    """Full recompute keeps the layer input; selective-ops' per-op policy decides what is
    kept (``kernels.memory``): neither keeps the eager extras."""
    model = llama3_8b[0]
    for mode in (RECOMPUTE_FULL, RECOMPUTE_SELECTIVE_OPS):
        assert eager_bytes_per_layer(1.0, 4096.0, 1.0, 1.0, mode, model, 2.0, False, 1.0) == 0.0
    for mode in KEEPING:
        assert eager_bytes_per_layer(1.0, 4096.0, 1.0, 1.0, mode, model, 2.0, False, 1.0) > 0.0


def test_gelu_mlp_keeps_no_silu_output(gpt3_175b):
    """A two-matrix GELU MLP keeps its input and the GELU output either way: only the
    attention's extras (GPT-3 175B, 96 heads of 128: 2 x 96 + 96 = 288 x 128 elements a
    token at t = 1)."""
    eager = eager_bytes_per_layer(1.0, 2048.0, 1.0, 1.0, RECOMPUTE_NONE, gpt3_175b[0], 2.0, False, 1.0)
    assert eager == 2 * 2048 * 288 * 128


def test_moe_layer_keeps_each_routed_rows_silu_output():
    """DeepSeek-V3 (MLA: 128 heads, rotary dim 64, v 128; 8 of 256 experts of 2,048, one
    shared), one sequence of 4,096 tokens at t = 1, imbalance 1.25: the attention's
    rotary parts and transposed output 128 x (64 + 128) + 64 = 24,640 a token, the routed
    rows' SiLU outputs 4,096 x 8 x 1.25 x 2,048 and the shared expert's 4,096 x 2,048."""
    m = pack_model(load_model("deepseek-v3"))[0]
    eager = eager_bytes_per_layer(1.0, 4096.0, 1.0, 1.0, RECOMPUTE_NONE, m, 2.0, True, 1.25)
    want = 2 * (4096 * 24_640 + 4096 * 8 * 1.25 * 2048 + 4096 * 2048)
    assert eager == pytest.approx(want, rel=1e-12)


def _elementwise_s(h100, model, eager: float) -> tuple[float, float]:
    """(attention side, activation) forward seconds of one Llama 3 8B layer's
    elementwise work, 4 x 2,048 tokens on one H100, fused or eager."""
    work = params.record(params.WORKLOAD, global_batch=4.0, seq_len=2048.0, act_bytes=2.0, weight_bytes=2.0,
                         grad_bytes=4.0, optimizer_bytes=12.0, gemm_cast_bytes=0.0, flash_attention=1.0,
                         eager_elementwise=eager)[0]
    dev = h100.device[0]
    sh = shape_of(1, 1, 1, 1, 4, 1, 1, 0, model, dev, work)
    att = attention_s(sh, model, dev, h100.tiles, work)
    return att.part_f - att.qkv_f - att.out_f - att.core_f, dense_mlp_s(sh, model, dev, h100.tiles).act


def test_eager_elementwise_time_by_hand(h100, llama3_8b):
    """Llama 3 8B (h 4,096; Q 4,096 and K, V 1,024 wide; f 14,336), 8,192 tokens, ab = 2,
    torchtitan's layer op by op (``kernels.elementwise``), bytes a token:
    two fp32 RMSNorms at 28 + 4 ab = 36 bytes an element and two residual adds at 3 ab:
    4,096 x (72 + 12) = 344,064; the complex rotary on Q and K at 16 + 2 ab = 20: 5,120 x
    20 = 102,400; the output's transposed copy 2 ab x 4,096 = 16,384; repeat_kv's K and V
    2 ab x (1,024 + 4,096) = 20,480; together 483,328 against the unfused passes' 10 ab h +
    2 ab x 5,120 = 102,400. SwiGLU apart: 5 ab f = 143,360 against 3 ab f = 86,016.
    Launches: 2 x 8 + 2 + 2 x 3 + 3 = 27 and 2, against 5 and 1."""
    model = llama3_8b[0]
    dev = h100.device[0]
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    tokens = 8192
    (fused_att, fused_act), (eager_att, eager_act) = (_elementwise_s(h100, model, e) for e in (0.0, 1.0))
    assert fused_att == pytest.approx(tokens * 102_400 / bw + 5 * dev.launch_s, rel=1e-12)
    assert fused_act == pytest.approx(tokens * 86_016 / bw + 1 * dev.launch_s, rel=1e-12)
    assert eager_att == pytest.approx(tokens * 483_328 / bw + 27 * dev.launch_s, rel=1e-12)
    assert eager_act == pytest.approx(tokens * 143_360 / bw + 2 * dev.launch_s, rel=1e-12)
    # 8,192 x (626,688 - 188,416) = 3.6 GB more a layer's forward, 3.3 times the bytes:
    # 1.4 ms more at the H100's achieved 2.5 TB/s
    assert (eager_att + eager_act) - (fused_att + fused_act) == pytest.approx(
        tokens * (626_688 - 188_416) / bw + 23 * dev.launch_s, rel=1e-12)
    assert 1.4e-3 < (eager_att + eager_act) - (fused_att + fused_act) < 1.5e-3


def test_eager_mla_layer_by_hand(h100):
    """DeepSeek-V3's MLA attention (h 7,168; 128 heads, rotary dim 64, values 128; latent
    ranks 512 for KV and 1,536 for Q), 4,096 tokens, ab = 2, eager: two fp32 RMSNorms and
    two residual adds 7,168 x (72 + 12) = 602,112 bytes a token; the two latent norms,
    fp32 too, (512 + 1,536) x 36 = 73,728; the complex rotary on 128 x 64 query and 64 key
    elements, 8,256 x 20 = 165,120; the output's transposed copy 2 ab x 128 x 128 = 65,536;
    no repeat_kv (MLA's K and V have every head): 906,496 bytes a token. Launches: 2 x 8 +
    2 + 2 x 8 + 2 x 3 + 1 = 41."""
    model = pack_model(load_model("deepseek-v3"))[0]
    dev = h100.device[0]
    work = params.record(params.WORKLOAD, global_batch=1.0, seq_len=4096.0, act_bytes=2.0, weight_bytes=2.0,
                         grad_bytes=4.0, optimizer_bytes=12.0, gemm_cast_bytes=0.0, flash_attention=1.0,
                         eager_elementwise=1.0)[0]
    sh = shape_of(1, 1, 1, 1, 1, 1, 1, 0, model, dev, work)
    att = attention_s(sh, model, dev, h100.tiles, work)
    eager = att.part_f - att.qkv_f - att.out_f - att.core_f
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    assert eager == pytest.approx(4096 * 906_496 / bw + 41 * dev.launch_s, rel=1e-12)


@pytest.mark.parametrize("recompute", [RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL])
def test_eager_adds_its_bytes_for_each_layer_in_flight_and_its_passes(h100, llama3_8b, make_workload, recompute):
    """Llama 3 8B's 32 layers on one device, one micro-batch of 4,096 tokens: the peak holds
    every layer's activations once, so eager adds 32 x 47,104 x 4,096 bytes where the
    layers keep them (none, selective); under full recompute only the layer being
    recomputed holds them, while its backward runs: 47,104 x 4,096 once. The step gains
    the eager passes' extra time in each layer's forward and twice in its backward, and
    once more where full recompute reruns the forward (the attention core alone, under
    selective, has none)."""
    model = llama3_8b[0]
    fused, eager = (run(llama3_8b, h100.device, h100.tiers, h100.tiles,
                        make_workload(global_batch=1.0, eager_elementwise=e), recompute=recompute)
                    for e in (0.0, 1.0))
    per_layer = eager_bytes_per_layer(1.0, 4096.0, 1.0, 1.0, RECOMPUTE_NONE, model, 2.0, False, 1.0)
    assert per_layer == 47_104 * 4096
    layers = 1 if recompute == RECOMPUTE_FULL else 32
    assert eager["mem_activations_bytes"] - fused["mem_activations_bytes"] == pytest.approx(layers * per_layer,
                                                                                          rel=1e-12)
    work = {e: params.record(params.WORKLOAD, global_batch=1.0, seq_len=4096.0, act_bytes=2.0, weight_bytes=2.0,
                             grad_bytes=4.0, optimizer_bytes=12.0, gemm_cast_bytes=0.0, flash_attention=1.0,
                             eager_elementwise=e)[0] for e in (0.0, 1.0)}
    extra = 0.0
    for e, sign in ((1.0, 1.0), (0.0, -1.0)):
        sh = shape_of(1, 1, 1, 1, 1, 1, 1, 0, model, h100.device[0], work[e])
        att = attention_s(sh, model, h100.device[0], h100.tiles, work[e])
        extra += sign * (att.part_f - att.qkv_f - att.out_f - att.core_f
                         + dense_mlp_s(sh, model, h100.device[0], h100.tiles).act)
    passes = 4 if recompute == RECOMPUTE_FULL else 3
    assert eager["step_time_analytic_s"] - fused["step_time_analytic_s"] == pytest.approx(32 * passes * extra,
                                                                                        rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), mb=st.integers(1, 4), recompute=st.sampled_from(KEEPING + (
    RECOMPUTE_FULL, RECOMPUTE_SELECTIVE_OPS)), sp=st.integers(0, 1), pp=st.sampled_from([1, 2, 4]),
       off_act=st.integers(0, 1))
def test_eager_never_needs_less_memory(h100, llama3_8b, make_workload, tp, mb, recompute, sp, pp, off_act):
    """Fuzz over the strategy: eager's peak is never below fused's, nor its step time."""
    work = {e: make_workload(global_batch=16.0, eager_elementwise=e) for e in (0.0, 1.0)}
    fused, eager = (run(llama3_8b, h100.device, h100.tiers, h100.tiles, work[e], tp=tp, mb=mb, recompute=recompute,
                        sp=sp, pp=pp, dp=1, n_micro=16 // mb, off_act=off_act) for e in (0.0, 1.0))
    assert eager["mem_peak_bytes"] >= fused["mem_peak_bytes"]
    assert eager["step_time_analytic_s"] > fused["step_time_analytic_s"]


def test_the_default_is_fused():
    from paraspace.spaces.schema import SpaceSpec

    assert SpaceSpec.model_fields["elementwise"].default == "fused"
    assert params.DEFAULTS["eager_elementwise"] == 0.0


def test_sweep_end_to_end(tmp_path):
    """``paraspace sweep`` of one Llama 3 8B configuration (t = 1, one micro-batch of
    8,192 tokens, no recompute, FSDP on 8 GPUs) either way: the eager rows hold 32 x 47,104
    x 8,192 bytes more activations, nothing else changes. (A space sets the field and a
    bad value is named: ``tests/test_cross_entropy_memory.py``.)"""
    out = {kind: sweep_one(tmp_path, "elementwise", kind, "none") for kind in ("fused", "eager")}
    gap = out["eager"]["mem_activations_bytes"][0] - out["fused"]["mem_activations_bytes"][0]
    assert gap == pytest.approx(32 * 47_104 * 8192, rel=1e-12)
    assert out["eager"]["step_time_s"][0] > out["fused"]["step_time_s"][0]
