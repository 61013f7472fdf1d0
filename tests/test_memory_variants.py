"""Issue 9's remaining memory knobs: optimizer variants (Adam without fp32 master
weights, paged 8-bit Adam with its states on the host), partial recompute of
the norms or of the MoE dispatch, and memory overheads split into a fixed part,
allocator fragmentation and communication buffers per process group. Bytes per
parameter and activation bytes are derived by hand; the directions the memory
and time columns move in are checked on both models and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from rows import DEFAULTS, columns

from paraspace.explorer.evaluate import evaluate, pack, pack_hardware, pack_model
from paraspace.kernels.codes import (
    DISPATCH_ALLTOALL,
    OPTIMIZER_ADAM,
    OPTIMIZER_ADAM_8BIT,
    OPTIMIZER_ADAM_8BIT_PAGED,
    OPTIMIZER_ADAM_BF16,
    OPTIMIZER_ADAM_NO_MASTER,
    OPTIMIZER_CPU_ADAM,
    RECOMPUTE_FULL,
    RECOMPUTE_MOE_DISPATCH,
    RECOMPUTE_NONE,
    RECOMPUTE_NORMS,
    RECOMPUTE_SELECTIVE,
    SCHEDULE_1F1B,
    SCHEDULE_GPIPE,
    SCHEDULE_INTERLEAVED,
    ZERO_3_DEFERRED,
)
from paraspace.kernels.moe import dispatch_s, local_pass_s
from paraspace.kernels.routing import routing_imbalance
from paraspace.kernels.training import (
    OUTPUTS,
    activation_bytes_per_layer,
    comm_groups,
    evaluate_rows,
    moe_activation_bytes_per_layer,
)
from paraspace.spaces.catalog import load_hardware, load_model, load_space
from paraspace.spaces.encode import Encoder
from paraspace.spaces.enums import Reason
from paraspace.spaces.schema import Device

PROPS = settings(max_examples=40, deadline=None)
P_8B = 8_030_261_248  # Llama 3 8B parameters (tests/test_training_kernel.py)
LAUNCH = 4e-6  # H100 profile: launch_overhead_us
HBM = 3350e9 * 0.80  # H100 profile: HBM bandwidth x memory efficiency
LINK = 50e9  # H100 profile: host link per direction


def run(model, dev, tiers, tiles, work, base=DEFAULTS, **changes) -> dict[str, float]:
    cols = columns([{**base, **changes}], base)
    return dict(zip(OUTPUTS, (float(x) for x in evaluate_rows(*cols, model, dev, tiers, tiles, work)[0])))


@pytest.fixture(scope="module")
def llama(h100, llama3_8b, make_workload):
    """Llama 3 8B on H100s, s = 4096, bf16 weights, fp32 grads, Adam's 12 state bytes."""
    return llama3_8b, h100.device, h100.tiers, h100.tiles, make_workload(global_batch=64.0)


# --------------------------------------------------------------------------- optimizer variants


@pytest.mark.parametrize("d", [2, 4, 8, 64])
def test_optimizer_variant_bytes_per_param(llama, d):
    """Device bytes per parameter, weights 2 + gradients 4 + states, as in
    Megatron's 18 / 6 + 12/d accounting:
    adam-8bit (fp32 master 4, m and v 1 each): 12 unsharded, 6 + 6/d with ZeRO-1,
    2 + 10/d with ZeRO-2; adam-no-master (fp32 m and v, 16-bit weights updated in
    place): 14, 6 + 8/d, 2 + 12/d; adam-8bit-paged (m and v on the host): 6,
    6, 2 + 4/d on the device and 2, 2/d, 2/d on the host."""
    expected = {
        OPTIMIZER_ADAM_8BIT: {0: (12.0, 0.0), 1: (6 + 6 / d, 0.0), 2: (2 + 10 / d, 0.0)},
        OPTIMIZER_ADAM_NO_MASTER: {0: (14.0, 0.0), 1: (6 + 8 / d, 0.0), 2: (2 + 12 / d, 0.0)},
        OPTIMIZER_ADAM_8BIT_PAGED: {0: (6.0, 2.0), 1: (6.0, 2 / d), 2: (2 + 4 / d, 2 / d)},
    }
    for opt, by_zero in expected.items():
        for zero, (device, host) in by_zero.items():
            out = run(*llama, dp=d, zero=zero, opt=opt)
            states = out["mem_weights_bytes"] + out["mem_grads_bytes"] + out["mem_optimizer_bytes"]
            assert states == pytest.approx(device * P_8B, rel=1e-14), (opt, zero)
            assert out["mem_host_bytes"] == pytest.approx(host * P_8B, rel=1e-14), (opt, zero)


def test_optimizer_variant_step_times(llama):
    """One device, P = 8,030,261,248 parameters. adam-no-master moves 28 of Adam's
    34 HBM bytes per parameter. adam-8bit-paged pages 2 bytes/param in and out
    over the 50 GB/s link (overlapped in chunks: the time of 2 bytes), then updates
    in place with 16 HBM bytes/param: P (2 / 50e9 + 16 / (3350e9 x 0.8)) + 4 us
    = 0.3212 + 0.0479 = 0.3691 s, below CPU Adam's 4.302 s and above Adam's 0.102 s."""
    adam, no_master, paged, cpu = (run(*llama, opt=o) for o in (
        OPTIMIZER_ADAM, OPTIMIZER_ADAM_NO_MASTER, OPTIMIZER_ADAM_8BIT_PAGED, OPTIMIZER_CPU_ADAM))
    assert no_master["optimizer_s"] - LAUNCH == pytest.approx((adam["optimizer_s"] - LAUNCH) * 28 / 34, rel=1e-12)
    expected = P_8B * (2 / LINK + 16 / HBM) + LAUNCH
    assert expected == pytest.approx(0.3691, abs=1e-4)
    assert paged["optimizer_s"] == pytest.approx(expected, rel=1e-12)
    assert adam["optimizer_s"] < paged["optimizer_s"] < cpu["optimizer_s"]
    # states on the device: Adam 12 > no-master 8 > paged 0 = CPU Adam; the forward and backward do not care
    assert adam["mem_optimizer_bytes"] > no_master["mem_optimizer_bytes"] > paged["mem_optimizer_bytes"] == 0.0
    assert no_master["mem_optimizer_bytes"] == pytest.approx(8 * P_8B, rel=1e-14)
    assert adam["compute_s"] == no_master["compute_s"] == paged["compute_s"]


@pytest.mark.parametrize("d", [2, 8])
def test_pure_bf16_adam_bytes_and_step_by_hand(llama, d):
    """adam-bf16 (the model cast to bf16 and trained so, KempnerForge's setup): bf16
    weights 2, bf16 gradients 2, bf16 m and v 4 = 8 bytes/param unsharded:
    8 x 8,030,261,248 = 64,242,089,984 bytes (59.8 GiB, against Adam's 18 x P =
    134.6 GiB); 2 + 2 + 4/d with ZeRO-1, 2 + 6/d with ZeRO-2; a deferred ZeRO-3
    reduction accumulates its unsharded gradients in fp32, 4 bytes. Its step reads
    weight, m, v and gradient and writes weight, m and v, 2 bytes each, plus the
    clipping read: 16 bytes/param, P x 16 / (3350e9 x 0.8) + 4 us = 0.0479 s."""
    expected = {0: 8.0, 1: 4 + 4 / d, 2: 2 + 6 / d}
    for zero, per_param in expected.items():
        out = run(*llama, dp=d, zero=zero, opt=OPTIMIZER_ADAM_BF16)
        states = out["mem_weights_bytes"] + out["mem_grads_bytes"] + out["mem_optimizer_bytes"]
        assert states == pytest.approx(per_param * P_8B, rel=1e-14), zero
    assert 8 * P_8B == 64_242_089_984
    out = run(*llama, opt=OPTIMIZER_ADAM_BF16)
    assert out["mem_grads_bytes"] == pytest.approx(2 * P_8B, rel=1e-14)
    assert out["optimizer_s"] == pytest.approx(P_8B * 16 / HBM + LAUNCH, rel=1e-12)
    assert P_8B * 16 / HBM + LAUNCH == pytest.approx(0.0479, abs=1e-4)
    deferred = run(*llama, dp=d, zero=ZERO_3_DEFERRED, opt=OPTIMIZER_ADAM_BF16)
    assert deferred["mem_grads_bytes"] == pytest.approx(4 * P_8B, rel=1e-14)


def test_paged_optimizer_needs_host_memory(llama):
    """Paged 8-bit Adam's 2 bytes/param (16 GB for 8B parameters) must fit the
    host share; with 8 GiB of host memory per device the row fails on host memory."""
    model, dev, tiers, tiles, work = llama
    small = dev.copy()
    small["host_capacity_bytes"] = 8 * 2.0**30
    out = run(model, small, tiers, tiles, work, opt=OPTIMIZER_ADAM_8BIT_PAGED)
    assert out["feasible"] == 0.0 and out["infeasible_reason"] == 2.0
    assert run(model, small, tiers, tiles, work, opt=OPTIMIZER_ADAM_NO_MASTER)["mem_host_bytes"] == 0.0


# --------------------------------------------------------------------------- norms recompute


SBH = 2048.0 * 12288.0  # GPT-3: s = 2048, b = 1, h = 12288, a = 96; 5 a s / h = 80


@pytest.mark.parametrize(("t", "sp", "per_sbh"), [
    # Korthikanti et al. 2022 with the two norm outputs (2 of the 4 replicated 2 sbh tensors) dropped
    (1.0, False, 34 - 4 + 80),  # 110
    (8.0, False, 10 - 4 + 24 / 8 + 80 / 8),  # 19, against none's 23 and selective's 13
    (8.0, True, (34 - 4 + 80) / 8),  # 13.75, against none's 14.25 and selective's 4.25
])
def test_norms_recompute_activation_memory(gpt3_175b, t, sp, per_sbh):
    got = activation_bytes_per_layer(1.0, 2048.0, t, 1.0, sp, RECOMPUTE_NORMS, False, gpt3_175b[0], 2.0)
    assert got == pytest.approx(per_sbh * SBH, rel=1e-14)
    none = activation_bytes_per_layer(1.0, 2048.0, t, 1.0, sp, RECOMPUTE_NONE, False, gpt3_175b[0], 2.0)
    assert none - got == pytest.approx(4.0 * SBH / (t if sp else 1.0), rel=1e-14)


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("s", [256.0, 2048.0, 8192.0])
def test_recompute_memory_order(gpt3_175b, llama3_8b, flash, sp, s):
    """What holds: none >= norms >= full and none >= selective >= full; with
    FlashAttention there are no scores to drop and selective keeps as much as none."""
    for model in (gpt3_175b[0], llama3_8b[0]):
        none, sel, full, norms = (activation_bytes_per_layer(1.0, s, 8.0, 1.0, sp, r, flash, model, 2.0)
                                  for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_NORMS))
        assert none > norms > full and none >= sel > full
        if flash:
            assert sel == none > norms
        # moe-dispatch on a dense layer keeps what none keeps
        assert activation_bytes_per_layer(1.0, s, 8.0, 1.0, sp, RECOMPUTE_MOE_DISPATCH, flash, model, 2.0) == none


def test_norms_and_selective_are_not_ordered(gpt3_175b, llama3_8b):
    """Without FlashAttention selective drops the scores, ab b (a/t) s^2 bytes, and
    norms two replicated ab s b h tensors: which keeps less depends on s and a/h.
    GPT-3 at s = 2048, t = 8: selective 13 sbh < norms 19 sbh. Llama 3 8B at
    s = 256, t = 8 (no dropout): scores 2 x 4 x 256^2 = 524,288 bytes against the
    norm outputs' 2 x 2 x 256 x 4096 = 4,194,304: norms keeps less."""
    gpt = [activation_bytes_per_layer(1.0, 2048.0, 8.0, 1.0, False, r, False, gpt3_175b[0], 2.0)
           for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_NORMS)]
    assert gpt[1] == pytest.approx(13 * SBH, rel=1e-14) and gpt[2] == pytest.approx(19 * SBH, rel=1e-14)
    llama = [activation_bytes_per_layer(1.0, 256.0, 8.0, 1.0, False, r, False, llama3_8b[0], 2.0)
             for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_NORMS)]
    assert llama[0] - llama[1] == 524_288 and llama[0] - llama[2] == 4_194_304
    assert llama[2] < llama[1]


def test_norms_recompute_time_by_hand(llama):
    """One device, one micro-batch of 4096 tokens: each of the 32 layers redoes two
    norms in the backward, reading the kept input and writing the output:
    32 x (4 x 4096 x 4096 x 2 bytes / (3350e9 x 0.8) + 2 launches of 4 us)."""
    none, norms = (run(*llama, recompute=r) for r in (RECOMPUTE_NONE, RECOMPUTE_NORMS))
    per_layer = 4 * 4096 * 4096 * 2 / HBM + 2 * LAUNCH
    assert norms["recompute_s"] == pytest.approx(32 * per_layer, rel=1e-12)
    assert norms["step_time_analytic_s"] - none["step_time_analytic_s"] == pytest.approx(32 * per_layer, rel=1e-9)
    assert norms["mem_activations_bytes"] < none["mem_activations_bytes"]


@st.composite
def candidates(draw) -> dict[str, int]:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    schedule = SCHEDULE_1F1B if pp == 1 else draw(st.sampled_from([SCHEDULE_GPIPE, SCHEDULE_1F1B,
                                                                   SCHEDULE_INTERLEAVED]))
    interleaved = schedule == SCHEDULE_INTERLEAVED
    sp = draw(st.sampled_from([0, 1])) if tp > 1 else 0
    return dict(DEFAULTS, tp=tp, pp=pp, dp=draw(st.sampled_from([1, 2, 4])), cp=draw(st.sampled_from([1, 2])),
                vpp=2 if interleaved else 1, mb=draw(st.sampled_from([1, 2])), sp=sp,
                off_act=draw(st.sampled_from([0, 1])), schedule=schedule,
                n_micro=draw(st.integers(1, 8)) * (pp if interleaved else 1))


@PROPS
@given(s=candidates(), flash=st.sampled_from([0.0, 1.0]), name=st.sampled_from(["llama3_8b", "gpt3_175b"]))
def test_norms_between_none_and_full(h100, llama3_8b, gpt3_175b, make_workload, s, flash, name):
    """norms keeps no more than none and no less than full, and recomputes more
    than none and less than full (two norm passes against a whole forward). The
    step follows the recompute unless activations are offloaded: then keeping
    less also moves less over the host link, and norms (like full) may be faster
    than none (the documents' "offload with recompute" trade)."""
    model = {"llama3_8b": llama3_8b, "gpt3_175b": gpt3_175b}[name]
    work = make_workload(global_batch=float(s["dp"] * s["mb"] * s["n_micro"]), seq_len=2048.0, flash_attention=flash)
    none, norms, full = (run(model, h100.device, h100.tiers, h100.tiles, work, base=s, recompute=r)
                         for r in (RECOMPUTE_NONE, RECOMPUTE_NORMS, RECOMPUTE_FULL))
    for key in ("mem_activations_bytes", "mem_peak_bytes"):
        assert full[key] <= norms[key] * (1 + 1e-12) and norms[key] <= none[key] * (1 + 1e-12), key
    assert none["recompute_s"] == 0.0 < norms["recompute_s"] < full["recompute_s"]
    if s["off_act"]:
        assert norms["offload_s"] <= none["offload_s"] * (1 + 1e-12)
        return
    assert none["step_time_analytic_s"] <= norms["step_time_analytic_s"] * (1 + 1e-12)
    assert norms["step_time_analytic_s"] <= full["step_time_analytic_s"] * (1 + 1e-12)


# --------------------------------------------------------------------------- moe-dispatch recompute


@pytest.fixture(scope="module")
def mixtral(h100, make_workload):
    """Mixtral 8x7B (32 MoE layers, 8 experts, top-2) on H100s: tp 2 (SP), pp 4, dp 4, ep 8."""
    model = pack_model(load_model("mixtral-8x7b"))
    base = dict(DEFAULTS, tp=2, sp=1, pp=4, dp=4, ep=8, n_micro=8, dispatch=DISPATCH_ALLTOALL)
    return (model, h100.device, h100.tiers, h100.tiles, make_workload(global_batch=32.0)), base


def test_moe_dispatch_activation_bytes_by_hand(mixtral):
    """An MoE layer without its dispatched rows keeps ab x rows x h fewer bytes:
    rows = tokens / t x top_k x imbalance = 4096 / 2 x 2 = 4096, h = 4096, ab = 2:
    33,554,432 bytes per layer and micro-batch."""
    (model, *_), _ = mixtral
    for imbalance in (1.0, 1.5):
        none, moe = (moe_activation_bytes_per_layer(1.0, 4096.0, 2.0, 1.0, True, r, True, model[0], 2.0, imbalance)
                     for r in (RECOMPUTE_NONE, RECOMPUTE_MOE_DISPATCH))
        assert none - moe == pytest.approx(2 * (4096 / 2 * 2 * imbalance) * 4096, rel=1e-14)
    assert none - moe == pytest.approx(1.5 * 33_554_432, rel=1e-14)


def test_moe_dispatch_recompute_costs_one_more_dispatch(mixtral, h100):
    """Each of the device's 8 MoE layers dispatches once more in the backward: the
    EP communication of 8 micro-batches rises by 8 x 8 forward dispatches
    (kernels.moe.dispatch_s of the rank's 2048 tokens x 4096 x 2 bytes), the
    compute by as many permutations (of the busiest rank's rows: the routing
    imbalance of the EP8 group's 8 x 2048 tokens, top-2 of 8 experts), and
    activation memory falls."""
    args, base = mixtral
    none = run(*args, base=base, recompute=RECOMPUTE_NONE)
    moe = run(*args, base=base, recompute=RECOMPUTE_MOE_DISPATCH)
    tok_bytes = 4096 / 2 * 4096 * 2.0
    disp, _, _ = dispatch_s(DISPATCH_ALLTOALL, tok_bytes, 8.0, 1.0, 8.0, 2.0, 0.0, h100.tiers)
    imbalance = routing_imbalance(8 * 2048.0, 8.0, 2.0, 8.0)
    assert 1.0 < imbalance < 1.03
    local = local_pass_s(DISPATCH_ALLTOALL, tok_bytes, 8.0, 2.0, imbalance, h100.device[0])
    assert disp > 0 and local > 0
    assert moe["ep_comm_s"] - none["ep_comm_s"] == pytest.approx(8 * 8 * disp, rel=1e-9)
    assert moe["recompute_s"] == pytest.approx(8 * 8 * (disp + local), rel=1e-12)
    assert moe["moe_dispatch_s"] == pytest.approx(disp + local, rel=1e-12)
    assert moe["compute_s"] - none["compute_s"] == pytest.approx(8 * 8 * local, rel=1e-9)
    assert moe["step_time_analytic_s"] > none["step_time_analytic_s"]
    assert moe["mem_activations_bytes"] < none["mem_activations_bytes"]
    assert moe["mem_peak_bytes"] < none["mem_peak_bytes"]


def test_moe_dispatch_on_a_dense_model_is_none(llama):
    """Without MoE layers there is nothing to redo: every column equals recompute = none
    (the encoder drops such rows, Reason.MOE_RECOMPUTE_DENSE)."""
    kw = dict(pp=2, dp=2, tp=2, sp=1, n_micro=4, schedule=SCHEDULE_1F1B)
    assert run(*llama, recompute=RECOMPUTE_MOE_DISPATCH, **kw) == run(*llama, recompute=RECOMPUTE_NONE, **kw)


def test_encoder_drops_moe_dispatch_on_dense_models():
    dense = load_space("llama3-8b-h100-64", {"dimensions": dict(
        tp=[8], pp=[1], cp=[1], vpp=[1], micro_batch=[1], recompute=["none", "norms", "moe-dispatch"],
        sequence_parallel=[True], zero=[1], schedule=["1f1b"])})
    enc = Encoder(dense).encode_all()
    assert enc.n_rows == 2 and enc.first_reason[Reason.MOE_RECOMPUTE_DENSE] == 1
    moe = load_space("llama3-8b-h100-64", {"model": "mixtral-8x7b", "global_batch": 64, "dimensions": dict(
        tp=[2], pp=[4], cp=[1], vpp=[1], micro_batch=[1], recompute=["none", "moe-dispatch"],
        sequence_parallel=[True], zero=[1], schedule=["1f1b"], ep=[8])})
    enc = Encoder(moe).encode_all()
    assert enc.first_reason[Reason.MOE_RECOMPUTE_DENSE] == 0
    rc = enc.columns["recompute"]
    assert set(rc.tolist()) == {RECOMPUTE_NONE, RECOMPUTE_MOE_DISPATCH}
    # both tiers honour it: the simulated step is slower too, the activations smaller
    m = evaluate(pack(moe), enc.columns, simulate=True)
    none, redo = (int(np.flatnonzero(rc == r)[0]) for r in (RECOMPUTE_NONE, RECOMPUTE_MOE_DISPATCH))
    assert m["simulated"][none] > 0 and m["simulated"][redo] > 0
    assert m["step_time_s"][redo] > m["step_time_s"][none]
    assert m["mem_activations_bytes"][redo] < m["mem_activations_bytes"][none]


# --------------------------------------------------------------------------- memory overheads


@pytest.mark.parametrize("fragmentation", [0.05, 0.2])
def test_fragmentation_scales_with_the_tensors(llama, fragmentation):
    """The allocator's fragmentation is a fraction of the tensors' bytes: the
    overhead column grows by exactly that fraction of weights + gradients +
    states + activations, and the peak with it."""
    model, dev, tiers, tiles, work = llama
    frag = dev.copy()
    frag["memory_fragmentation"] = fragmentation
    frag["memory_overhead_bytes"] = 3 * 2.0**30
    kw = dict(pp=2, dp=4, zero=1, n_micro=4)
    plain = dev.copy()
    plain["memory_overhead_bytes"] = 3 * 2.0**30
    base, out = run(model, plain, tiers, tiles, work, **kw), run(model, frag, tiers, tiles, work, **kw)
    tensors = sum(base[k] for k in ("mem_weights_bytes", "mem_grads_bytes", "mem_optimizer_bytes",
                                    "mem_activations_bytes", "mem_moe_buffers_bytes"))
    assert base["mem_overhead_bytes"] == 3 * 2.0**30
    assert out["mem_overhead_bytes"] == pytest.approx(3 * 2.0**30 + fragmentation * tensors, rel=1e-14)
    assert out["mem_peak_bytes"] - 3 * 2.0**30 == pytest.approx((1 + fragmentation) * tensors, rel=1e-14)
    assert out["step_time_analytic_s"] == base["step_time_analytic_s"]


def test_comm_buffers_per_process_group(llama, mixtral):
    """Buffers per communicator: Llama tp 2 x pp 2 x dp 2 sits in a TP, a PP and a
    DP group (3); with cp 2 also a CP group and the DP x CP group (4); Mixtral tp 2,
    pp 4, dp 4, ep 8 in TP, PP, DP and EP groups (expert DP = 2 x 4 / 8 = 1: none)."""
    assert comm_groups(2.0, 1.0, 2.0, 2.0, 1.0, 1.0, 4.0, False) == 3.0
    assert comm_groups(2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 8.0, False) == 4.0
    assert comm_groups(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, False) == 0.0
    assert comm_groups(2.0, 1.0, 4.0, 4.0, 8.0, 1.0, 1.0, True) == 4.0
    model, dev, tiers, tiles, work = llama
    buffered = dev.copy()
    buffered["comm_buffer_bytes"] = 256 * 2.0**20
    out = run(model, buffered, tiers, tiles, work, tp=2, pp=2, dp=2, n_micro=4)
    assert out["mem_overhead_bytes"] == dev["memory_overhead_bytes"][0] + 3 * 256 * 2.0**20
    (mmodel, mdev, mtiers, mtiles, mwork), base = mixtral
    moe_dev = mdev.copy()
    moe_dev["comm_buffer_bytes"] = 256 * 2.0**20
    out = run(mmodel, moe_dev, mtiers, mtiles, mwork, base=base)
    assert out["mem_overhead_bytes"] == mdev["memory_overhead_bytes"][0] + 4 * 256 * 2.0**20


def test_profile_overheads_pack_and_default():
    """The catalog's memory_overhead_GiB stays valid and means the fixed part; the
    two new constants default to 0 and pack in bytes; fragmentation is a fraction."""
    hw = load_hardware("h100-sxm5-80gb")
    assert hw.device.memory_fragmentation == 0.0 and hw.device.comm_buffer_MiB == 0.0
    device, _, _ = pack_hardware(hw, "bf16")
    assert device["memory_overhead_bytes"][0] == 4 * 2.0**30
    assert device["memory_fragmentation"][0] == 0.0 and device["comm_buffer_bytes"][0] == 0.0
    tuned = hw.model_copy(update={"device": hw.device.model_copy(update={"memory_fragmentation": 0.1,
                                                                          "comm_buffer_MiB": 128.0})})
    device, _, _ = pack_hardware(tuned, "bf16")
    assert device["memory_fragmentation"][0] == 0.1 and device["comm_buffer_bytes"][0] == 128 * 2.0**20
    data = hw.device.model_dump()
    Device.model_validate({**data, "memory_fragmentation": 0.25, "comm_buffer_MiB": 64.0})
    with pytest.raises(ValidationError):
        Device.model_validate({**data, "memory_fragmentation": 1.5})


@PROPS
@given(s=candidates(), zero=st.integers(0, 3))
def test_optimizer_variants_order_device_memory(h100, llama3_8b, make_workload, s, zero):
    """Device states: Adam 12 >= no-master 8 >= 8-bit 6 >= paged 0 = CPU Adam; the
    paged and CPU variants hold their states on the host instead."""
    s = {**s, "zero": zero if s["dp"] * s["cp"] > 1 else 0, "off_act": 0}
    work = make_workload(global_batch=float(s["dp"] * s["mb"] * s["n_micro"]), seq_len=2048.0)
    outs = [run(llama3_8b, h100.device, h100.tiers, h100.tiles, work, base=s, opt=o) for o in (
        OPTIMIZER_ADAM, OPTIMIZER_ADAM_NO_MASTER, OPTIMIZER_ADAM_8BIT, OPTIMIZER_ADAM_8BIT_PAGED, OPTIMIZER_CPU_ADAM)]
    for key in ("mem_optimizer_bytes", "mem_peak_bytes"):
        values = [o[key] for o in outs]
        assert all(b <= a * (1 + 1e-12) for a, b in zip(values, values[1:])), (key, values)
    adam, no_master, eight, paged, cpu = outs
    assert paged["mem_peak_bytes"] == pytest.approx(cpu["mem_peak_bytes"], rel=1e-12)
    assert 0.0 < paged["mem_host_bytes"] < cpu["mem_host_bytes"]
    assert adam["mem_host_bytes"] == no_master["mem_host_bytes"] == eight["mem_host_bytes"] == 0.0
