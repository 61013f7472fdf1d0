"""Operator latency kernels (``kernels.ops``): hand-derived numbers, the naive
references on seeded random inputs, and hypothesis properties."""

from __future__ import annotations

import math

import naive
from rows import cost_args
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.explorer.evaluate import pack_hardware
from paraspace.kernels import ops
from paraspace.kernels.params import DEVICE, record
from paraspace.spaces.catalog import load_hardware

TILES_H100 = np.array([[128.0, 128.0], [128.0, 256.0], [256.0, 128.0], [64.0, 128.0], [128.0, 64.0], [64.0, 64.0]])
PROPS = settings(max_examples=60, deadline=None)


# --------------------------------------------------------------------------- hand-derived


def test_tile_efficiency_waves(toy_tiles):
    """4096 x 4096 output, 128 x 128 tiles, 100 units: 32 * 32 = 1024 tiles in
    ceil(1024 / 100) = 11 waves of 100 slots: eff = 1024 / 1100."""
    assert ops.tile_efficiency(4096.0, 4096.0, 100.0, toy_tiles) == pytest.approx(1024 / 1100, rel=1e-15)


def test_tile_efficiency_exact_fit(toy_tiles):
    """1280 x 1280: 10 * 10 = 100 tiles, one full wave of 100 units: eff = 1."""
    assert ops.tile_efficiency(1280.0, 1280.0, 100.0, toy_tiles) == 1.0


def test_tile_efficiency_padding(toy_tiles):
    """192 x 192 pads to 256 x 256 (2 x 2 tiles) and fills 4 of 100 slots:
    eff = (192^2 / 256^2) * 4 / 100 = 0.5625 * 0.04 = 0.0225."""
    assert ops.tile_efficiency(192.0, 192.0, 100.0, toy_tiles) == pytest.approx(0.0225, rel=1e-14)


def test_tile_efficiency_picks_best_tile():
    """4096 x 4096 on 100 units: 128x128 gives 1024/1100 = 0.9309 (above);
    256x128 gives 16 * 32 = 512 tiles in 6 waves, 512/600 = 0.8533. Best wins
    whatever the order."""
    for tiles in ([[128.0, 128.0], [256.0, 128.0]], [[256.0, 128.0], [128.0, 128.0]]):
        assert ops.tile_efficiency(4096.0, 4096.0, 100.0, np.array(tiles)) == pytest.approx(1024 / 1100, rel=1e-15)
    assert ops.tile_efficiency(4096.0, 4096.0, 100.0, np.array([[256.0, 128.0]])) == pytest.approx(512 / 600)


def test_gemm_compute_bound(toy_dev, toy_tiles):
    """4096^3 on 100 TFLOP/s at tile eff 1024/1100: 2 * 4096^3 = 2^37 FLOP
    -> 2^37 / (1e14 * 1024 / 1100) = 1.476395008e-3 s; the traffic
    3 * 4096^2 * 2 B = 100.7 MB at 1 TB/s is 0.1 ms, below it."""
    expected = 2.0**37 / (1e14 * 1024 / 1100)
    assert expected == pytest.approx(1.476395008e-3, rel=1e-12)
    assert ops.gemm_time_s(4096.0, 4096.0, 4096.0, toy_dev[0], toy_tiles, 2.0) == pytest.approx(expected, rel=1e-14)


def test_gemm_reduction_fill_by_hand(make_device, toy_tiles):
    """1280 x 1280 output (one full wave of 100 tiles, tile eff 1) over k = 128 with a
    fill of 128: the tiles run at 128 / (128 + 128) = 1/2 of the plateau. 2 x 1280^2 x
    128 = 419,430,400 FLOP at 100 TFLOP/s x 1/2 = 8.388608 us (the traffic, (2 x 1280 x
    128 + 1280^2) x 2 B = 3,932,160 B at 1 TB/s = 3.93 us, stays below it); at k = 3840
    (fill share 3840 / 3968) 2 x 1280^2 x 3840 / (1e14 x 3840 / 3968) = 130.023424 us;
    no fill (0, the default): 4.194304 us at k = 128."""
    filled = make_device(gemm_k_fill=128.0)[0]
    assert ops.gemm_efficiency(1280.0, 1280.0, 128.0, filled, toy_tiles) == 0.5
    assert ops.gemm_time_s(1280.0, 1280.0, 128.0, filled, toy_tiles, 2.0) == pytest.approx(8.388608e-6, rel=1e-14)
    assert ops.gemm_time_s(1280.0, 1280.0, 3840.0, filled, toy_tiles, 2.0) == pytest.approx(130.023424e-6, rel=1e-14)
    plain = make_device()[0]
    assert ops.gemm_time_s(1280.0, 1280.0, 128.0, plain, toy_tiles, 2.0) == pytest.approx(4.194304e-6, rel=1e-14)


def test_gemm_scaling_overhead_lengthens_compute_not_traffic_by_hand(make_device, toy_tiles):
    """FP8 in 128 x 128 blocks (overhead 0.19): a 1280 x 1280 x 3840 GEMM's 2 x 1280^2 x
    3840 = 12,582,912,000 FLOP at 100 TFLOP/s take 125.82912 us, x 1.19 = 149.7366528 us;
    its operands, (2 x 1280 x 3840 + 1280^2) x 1 B = 11,468,800 B at 1 TB/s = 11.4688 us,
    bound neither. On an HBM of 1 GB/s the same GEMM is traffic-bound, 11.4688 ms with and
    without the recipe (its compute, 0.15 ms, hides under the operands' traffic)."""
    blocks = make_device(gemm_scaling_overhead=0.19)[0]
    plain = make_device()[0]
    assert ops.gemm_time_s(1280.0, 1280.0, 3840.0, plain, toy_tiles, 1.0) == pytest.approx(125.82912e-6, rel=1e-12)
    assert ops.gemm_time_s(1280.0, 1280.0, 3840.0, blocks, toy_tiles, 1.0) == pytest.approx(149.7366528e-6, rel=1e-12)
    for overhead in (0.0, 0.19):
        slow_hbm = make_device(hbm_bytes_per_s=1e9, gemm_scaling_overhead=overhead)[0]
        assert ops.gemm_time_s(1280.0, 1280.0, 3840.0, slow_hbm, toy_tiles, 1.0) == pytest.approx(11.4688e-3, rel=1e-12)


def test_the_scaling_recipe_reaches_only_fp8_gemms():
    """The H100 family's measured overheads (row 0.02, block 0.19) pack into an FP8
    device record; BF16 has no recipe, per-tensor scaling costs nothing, and a part with
    no measurement (the A100, which has no FP8) has none."""
    h100 = load_hardware("h100-sxm5-80gb")
    assert pack_hardware(h100, "fp8", "flash2", "block")[0][0].gemm_scaling_overhead == 0.19
    assert pack_hardware(h100, "fp8", "flash2", "row")[0][0].gemm_scaling_overhead == 0.02
    assert pack_hardware(h100, "fp8", "flash2", "tensor")[0][0].gemm_scaling_overhead == 0.0
    assert pack_hardware(h100, "bf16", "flash2", "block")[0][0].gemm_scaling_overhead == 0.0
    assert pack_hardware(load_hardware("h800-sxm5-80gb"), "fp8", "flash2", "block")[0][0].gemm_scaling_overhead == 0.19
    assert pack_hardware(load_hardware("a100-sxm4-80gb"), "bf16", "flash2", "block")[0][0].gemm_scaling_overhead == 0.0


def test_an_unknown_scaling_recipe_is_refused_by_name():
    """A profile keying an overhead by a recipe that does not exist is refused with the
    field and the recipes there are."""
    from paraspace.spaces.schema import Device
    base = load_hardware("h100-sxm5-80gb").device.model_dump()
    with pytest.raises(ValueError, match=r"gemm_scaling_overhead\.blocks: a scaling recipe named one of"):
        Device(**{**base, "gemm_scaling_overhead": {"blocks": 0.2}})


def test_gemm_fill_is_256_bytes_of_k_in_every_precision():
    """The packed device's fill is 256 bytes of the GEMM precision: 128 BF16 / FP16
    elements, 256 FP8 / INT8, 512 FP4, 64 TF32 / FP32 (``Device.gemm_k_fill_bytes``, Hopper's
    measured value, which the Blackwell profiles take with Hopper's efficiencies); a part
    not measured (A100) has none."""
    from paraspace.explorer.evaluate import pack_hardware
    from paraspace.spaces.catalog import load_hardware

    hw = load_hardware("b200-sxm-180gb")
    want = {"bf16": 128.0, "fp16": 128.0, "fp8": 256.0, "int8": 256.0, "fp4": 512.0, "tf32": 64.0, "fp32": 64.0}
    for dtype, fill in want.items():
        assert pack_hardware(hw, dtype)[0][0].gemm_k_fill == fill, dtype
        # the GEMMs an 8-bit recipe keeps in 16 bits (the LM head) count 16-bit elements
        assert pack_hardware(hw, dtype)[0][0].gemm_k_fill_16bit == 128.0, dtype
    assert pack_hardware(load_hardware("a100-sxm4-80gb"), "bf16")[0][0].gemm_k_fill == 0.0


def test_gemm_memory_bound_with_launch(make_device, toy_tiles):
    """GEMV 1 x 8192 x 8192 at 100 GB/s HBM, 5 us launch.
    Compute: 1 x 8192 pads to 128 x 8192 (64 tiles, one wave of 100 slots):
    eff = (1/128) * 0.64 = 0.005 -> 2 * 8192^2 / (1e14 * 0.005) = 0.268 ms.
    Traffic: (8192 + 8192^2 + 8192) * 2 B = 134,250,496 B / 1e11 = 1.34250496 ms.
    Total = 1.34250496e-3 + 5e-6."""
    dev = make_device(hbm_bytes_per_s=1e11, launch_s=5e-6)
    assert ops.tile_efficiency(1.0, 8192.0, 100.0, toy_tiles) == pytest.approx(0.005, rel=1e-14)
    got = ops.gemm_time_s(1.0, 8192.0, 8192.0, dev[0], toy_tiles, 2.0)
    assert got == pytest.approx(1.34250496e-3 + 5e-6, rel=1e-14)


def test_gemm_efficiencies_scale(make_device, toy_tiles):
    """gemm_max_efficiency 0.5 doubles a compute-bound time; memory_efficiency
    0.5 doubles a memory-bound one."""
    base = ops.gemm_time_s(4096.0, 4096.0, 4096.0, make_device()[0], toy_tiles, 2.0)
    half = ops.gemm_time_s(4096.0, 4096.0, 4096.0, make_device(gemm_max_efficiency=0.5)[0], toy_tiles, 2.0)
    assert half == pytest.approx(2 * base, rel=1e-14)
    slow = make_device(hbm_bytes_per_s=1e11)
    gemv = ops.gemm_time_s(1.0, 8192.0, 8192.0, slow[0], toy_tiles, 2.0)
    gemv_half = ops.gemm_time_s(1.0, 8192.0, 8192.0, make_device(hbm_bytes_per_s=1e11, memory_efficiency=0.5)[0],
                                toy_tiles, 2.0)
    assert gemv_half == pytest.approx(2 * gemv, rel=1e-14)


@pytest.mark.parametrize("shape", [(0.0, 10.0, 10.0), (10.0, 0.0, 10.0), (10.0, 10.0, 0.0)])
def test_gemm_empty_is_free(make_device, toy_tiles, shape):
    """An empty GEMM launches nothing: 0 s even with a launch cost."""
    assert ops.gemm_time_s(*shape, make_device(launch_s=1e-5)[0], toy_tiles, 2.0) == 0.0


def test_gemm_fwd_bwd_square(toy_dev, toy_tiles):
    """Square GEMM: dX and dW are the same shape as the forward: bwd = 2 fwd; FLOP 2 * 4096^3."""
    fwd, bwd, flops = ops.gemm_fwd_bwd_s(4096.0, 4096.0, 4096.0, toy_dev[0], toy_tiles, 2.0)
    assert bwd == pytest.approx(2 * fwd, rel=1e-15)
    assert flops == 2.0**37


def test_gemm_fwd_bwd_shapes(toy_dev, toy_tiles):
    """(m, n, k) = (8192, 1024, 4096), each GEMM 2 * 2^35 = 2^36 FLOP = 0.68719476736 ms
    at 100 TFLOP/s before tile losses (traffic <= 0.1 ms, compute bound):
      forward Y (8192 x 1024):  64 x 8 = 512 tiles in 6 waves   -> x 600/512
      dX = dY W^T (8192 x 4096 over n): 64 x 32 = 2048 tiles, 21 waves -> x 2100/2048
      dW = X^T dY (4096 x 1024 over m): 32 x 8 = 256 tiles, 3 waves    -> x 300/256"""
    fwd, bwd, flops = ops.gemm_fwd_bwd_s(8192.0, 1024.0, 4096.0, toy_dev[0], toy_tiles, 2.0)
    unit = 2.0**36 / 1e14
    assert flops == 2.0**36
    assert fwd == pytest.approx(unit * 600 / 512, rel=1e-14)
    assert bwd == pytest.approx(unit * (2100 / 2048 + 300 / 256), rel=1e-14)


def test_attention_flash_causal(toy_dev):
    """b=1, s=4096, 32 heads (8 KV), d_h=128, causal, flash, 100 TFLOP/s, 1 TB/s, bf16.
    FLOP fwd = 4 * 1 * 4096^2 * 32 * 128 / 2 = 2^37 -> 1.37438953472 ms at the plateau
    rate (compute bound: traffic Q,O 2*4096*32*128*2 = 64 MiB + K,V 2*4096*8*128*2 =
    16 MiB = 83.9 us). One call spans 4096 keys: the forward runs at 4096 / (4096 + 450)
    of the plateau, 1.37438953472 * 4546 / 4096 = 1.52538447872 ms. Backward 2.5x the
    FLOP at 0.90 of the forward's plateau (ATTENTION_BWD_RATE) and 4096 / (4096 + 1000)
    of that: 2.5 * 1.37438953472 / 0.90 * 5096 / 4096 = 4.74981626311 ms."""
    fwd, bwd, flops = ops.attention_fwd_bwd_s(1.0, 4096.0, 4096.0, 32.0, 8.0, 128.0, True, True, toy_dev[0], 2.0)
    assert flops == 2.0**37
    assert fwd == pytest.approx(1.52538447872e-3, rel=1e-12)
    assert bwd == pytest.approx(3.4359738368e-3 / 0.90 * 5096 / 4096, rel=1e-14)
    assert bwd == pytest.approx(4.74981626311e-3, rel=1e-11)


def test_attention_fill_keys_per_call(toy_dev):
    """The rate depends on the keys one call spans, not on the FLOP: a context-parallel
    rank's ring step over 1024 of 4096 keys (call_keys 1024) runs its forward at
    1024 / 1474 of the plateau against 4096 / 4546 for one call over all 4096; without
    flash (GEMMs and a softmax) nothing changes with it."""
    dev = toy_dev[0]
    args = (1.0, 4096.0, 4096.0, 32.0, 32.0, 128.0, 128.0, True)
    whole, _, flops = ops.attention_qkv_fwd_bwd_s(*args, True, dev, 2.0, 4096.0)
    ring, _, _ = ops.attention_qkv_fwd_bwd_s(*args, True, dev, 2.0, 1024.0)
    assert (ring - dev.launch_s) / (whole - dev.launch_s) == pytest.approx((1474 / 1024) / (4546 / 4096), rel=1e-12)
    plain = [ops.attention_qkv_fwd_bwd_s(*args, False, dev, 2.0, keys) for keys in (1024.0, 4096.0)]
    assert plain[0] == plain[1]
    assert ops.loop_fill(450.0, ops.ATTENTION_FWD_FILL_KEYS) == 0.5


def test_attention_backward_rate_from_the_fa3_paper():
    """The backward / forward FLOP-rate ratio the FA3 paper's H100 figures give for
    three kernel generations (head dim 128, 16k, no causal mask): FA2 322/370 = 0.870,
    cuDNN 516/595 = 0.867, FA3 561/648 = 0.866. The model's at 16,384 keys per call:
    0.90 x (16384 / 17384) / (16384 / 16834) = 0.8715."""
    keys = 16384.0
    ratio = (ops.ATTENTION_BWD_RATE * ops.loop_fill(keys, ops.ATTENTION_BWD_FILL_KEYS)
             / ops.loop_fill(keys, ops.ATTENTION_FWD_FILL_KEYS))
    assert ratio == pytest.approx(0.8715255, rel=1e-6)
    for bwd, fwd in ((322, 370), (516, 595), (561, 648)):
        assert bwd / fwd == pytest.approx(ratio, abs=0.006)


def test_attention_core_runs_at_the_16_bit_peak(make_device):
    """An FP8 device record (GEMM peak 200 TFLOP/s, 16-bit peak 100) times a core on
    16-bit operands at 100 TFLOP/s: the same 1.52538447872 ms as the bf16 toy device
    above (FlashAttention and cuDNN fused attention stay in 16 bits under FP8
    training recipes, whose activations are 16-bit)."""
    fp8 = make_device(peak_flops_per_s=200e12, peak_16bit_flops_per_s=100e12)
    fwd, bwd, _ = ops.attention_fwd_bwd_s(1.0, 4096.0, 4096.0, 32.0, 8.0, 128.0, True, True, fp8[0], 2.0)
    assert fwd == pytest.approx(1.52538447872e-3, rel=1e-12)
    assert bwd == pytest.approx(4.74981626311e-3, rel=1e-11)
    # 8-bit operands (an FP8 KV cache, FP8 context FMHA) run at the 200 TFLOP/s peak: half
    fwd, bwd, _ = ops.attention_fwd_bwd_s(1.0, 4096.0, 4096.0, 32.0, 8.0, 128.0, True, True, fp8[0], 1.0)
    assert fwd == pytest.approx(1.52538447872e-3 / 2, rel=1e-12)
    assert bwd == pytest.approx(4.74981626311e-3 / 2, rel=1e-11)


def test_attention_kernel_picks_its_efficiency():
    """``SpaceSpec.attention_kernel`` = flash1 packs ``attention_efficiency_flash1``
    (A100: 0.36) instead of the FA2 value (0.70); a profile without a flash1 value
    (BR166) falls back to its one attention efficiency."""
    from paraspace.explorer.evaluate import pack_hardware
    from paraspace.spaces.catalog import load_hardware

    a100 = load_hardware("a100-sxm4-40gb")  # extends the 80 GB profile
    assert pack_hardware(a100, "bf16")[0][0].attention_efficiency == 0.70
    assert pack_hardware(a100, "bf16", "flash1")[0][0].attention_efficiency == 0.36
    br = load_hardware("br166-spc")
    assert br.device.attention_efficiency_flash1 is None
    assert pack_hardware(br, "bf16", "flash1")[0][0].attention_efficiency == br.device.attention_efficiency


def test_attention_not_causal_doubles(toy_dev):
    fwd_c, bwd_c, flops_c = ops.attention_fwd_bwd_s(1.0, 4096.0, 4096.0, 32.0, 8.0, 128.0, True, True, toy_dev[0], 2.0)
    fwd, bwd, flops = ops.attention_fwd_bwd_s(1.0, 4096.0, 4096.0, 32.0, 8.0, 128.0, False, True, toy_dev[0], 2.0)
    assert flops == 2 * flops_c
    assert fwd == pytest.approx(2 * fwd_c, rel=1e-15)
    assert bwd == pytest.approx(2 * bwd_c, rel=1e-15)


def test_attention_without_flash_is_memory_bound(toy_dev):
    """Same shape without flash: the 32 x 4096 x 4096 score matrix (bf16) moves 4 times:
    4 * 32 * 4096^2 * 2 = 4,294,967,296 B, + 83,886,080 B of Q, K, V, O
    -> fwd 4.378853376 ms at 1 TB/s (> 1.374 ms of compute), bwd twice the traffic 8.757706752 ms."""
    fwd, bwd, _ = ops.attention_fwd_bwd_s(1.0, 4096.0, 4096.0, 32.0, 8.0, 128.0, True, False, toy_dev[0], 2.0)
    assert fwd == pytest.approx(4.378853376e-3, rel=1e-14)
    assert bwd == pytest.approx(8.757706752e-3, rel=1e-14)


def test_attention_launches(make_device):
    """Launch cost: 1 kernel forward, 2 backward (dQ and dK/dV passes)."""
    fwd0, bwd0, _ = ops.attention_fwd_bwd_s(1.0, 512.0, 512.0, 8.0, 8.0, 64.0, True, True, make_device()[0], 2.0)
    fwd1, bwd1, _ = ops.attention_fwd_bwd_s(1.0, 512.0, 512.0, 8.0, 8.0, 64.0, True, True,
                                            make_device(launch_s=1e-5)[0], 2.0)
    assert fwd1 - fwd0 == pytest.approx(1e-5, rel=1e-9)
    assert bwd1 - bwd0 == pytest.approx(2e-5, rel=1e-9)


def test_memory_bound(make_device):
    """1 GB over 1 TB/s at 80% with 3 launches of 4 us: 1e9 / 8e11 + 12 us = 1.262 ms."""
    dev = make_device(memory_efficiency=0.8, launch_s=4e-6)
    assert ops.memory_bound_s(1e9, 3.0, dev[0]) == pytest.approx(1.25e-3 + 12e-6, rel=1e-14)
    assert ops.memory_bound_s(0.0, 0.0, dev[0]) == 0.0


# --------------------------------------------------------------------------- against the naive reference


def _random_device(rng) -> dict[str, float]:
    return dict(
        peak_flops_per_s=rng.uniform(1e13, 2e15), hbm_bytes_per_s=rng.uniform(5e11, 5e12),
        hbm_capacity_bytes=80 * 2.0**30, compute_units=float(rng.integers(16, 200)), launch_s=rng.uniform(0.0, 1e-5),
        gemm_max_efficiency=rng.uniform(0.3, 1.0), attention_efficiency=rng.uniform(0.2, 1.0),
        memory_efficiency=rng.uniform(0.5, 1.0), memory_overhead_bytes=0.0, host_link_bytes_per_s=25e9,
        host_memory_bytes_per_s=50e9, host_capacity_bytes=256 * 2**30,
        gemm_k_fill=float(rng.choice([0.0, 64.0, 128.0, 256.0, 512.0])),
        gemm_scaling_overhead=float(rng.choice([0.0, 0.02, 0.19])),
    )


def _record(dev: dict[str, float]):
    return record(DEVICE, **dev)


def _random_tiles(rng):
    n = int(rng.integers(1, 5))
    return np.array([[float(rng.choice([32, 64, 128, 256])), float(rng.choice([32, 64, 128, 256]))] for _ in range(n)])


def test_tile_efficiency_matches_naive():
    rng = np.random.default_rng(20240601)
    for _ in range(400):
        tiles = _random_tiles(rng)
        m, n = float(rng.integers(1, 20000)), float(rng.integers(1, 20000))
        units = float(rng.integers(1, 200))
        got = ops.tile_efficiency(m, n, units, tiles)
        assert got == pytest.approx(naive.tile_efficiency(m, n, units, naive.tile_list(tiles)), rel=1e-12)
        assert 0.0 < got <= 1.0


def test_gemm_matches_naive():
    rng = np.random.default_rng(20240602)
    for _ in range(400):
        dev = _random_device(rng)
        tiles = _random_tiles(rng)
        m, n, k = (float(x) for x in rng.integers(1, 65536, size=3))
        ab = float(rng.choice([1.0, 2.0, 4.0]))
        fwd, bwd, flops = ops.gemm_fwd_bwd_s(m, n, k, _record(dev)[0], tiles, ab)
        ref_fwd, ref_bwd = naive.gemm_fwd_bwd_s(m, n, k, dev, naive.tile_list(tiles), ab)
        assert fwd == pytest.approx(ref_fwd, rel=1e-12)
        assert bwd == pytest.approx(ref_bwd, rel=1e-12)
        assert flops == 2 * m * n * k


def test_attention_matches_naive():
    rng = np.random.default_rng(20240603)
    for _ in range(400):
        dev = _random_device(rng)
        kv = float(rng.choice([1, 2, 4, 8]))
        heads = kv * float(rng.choice([1, 2, 4, 8]))
        b, s_kv = float(rng.integers(1, 8)), float(rng.choice([512, 1024, 4096, 8192, 32768]))
        s_q = s_kv / float(rng.choice([1, 2, 4]))
        dh = float(rng.choice([64, 128, 192]))
        causal, flash = bool(rng.integers(2)), bool(rng.integers(2))
        ab = float(rng.choice([1.0, 2.0]))
        fwd, bwd, flops = ops.attention_fwd_bwd_s(b, s_q, s_kv, heads, kv, dh, causal, flash, _record(dev)[0], ab)
        ref_fwd, ref_bwd = naive.attention_fwd_bwd_s(b, s_q, s_kv, heads, kv, dh, causal, flash, dev, ab, s_kv)
        assert fwd == pytest.approx(ref_fwd, rel=1e-12)
        assert bwd == pytest.approx(ref_bwd, rel=1e-12)
        assert flops == pytest.approx(4 * b * s_q * s_kv * heads * dh / (2 if causal else 1), rel=1e-15)


def test_memory_bound_matches_naive():
    rng = np.random.default_rng(20240604)
    for _ in range(300):
        dev = _random_device(rng)
        nbytes, kernels = rng.uniform(0, 1e11), float(rng.integers(0, 10))
        got = ops.memory_bound_s(nbytes, kernels, _record(dev)[0])
        assert got == pytest.approx(naive.memory_bound_s(nbytes, kernels, dev), rel=1e-12)


# --------------------------------------------------------------------------- properties

dims = st.integers(1, 1 << 16).map(float)
speedup = st.floats(1.0, 1e3)


def _scaled(peak: float = 1.0, hbm: float = 1.0, **fixed: float):
    """An H100-like device record with peak FLOP/s and HBM bandwidth scaled up."""
    base = dict(peak_flops_per_s=989e12, hbm_bytes_per_s=3.35e12, hbm_capacity_bytes=80 * 2.0**30,
                compute_units=132.0, launch_s=4e-6, gemm_max_efficiency=0.75, attention_efficiency=0.4,
                memory_efficiency=0.8, memory_overhead_bytes=0.0, host_link_bytes_per_s=25e9,
                host_memory_bytes_per_s=50e9, host_capacity_bytes=256 * 2**30)
    base.update(fixed)
    base["peak_flops_per_s"] *= peak
    base["hbm_bytes_per_s"] *= hbm
    return record(DEVICE, **base)[0]


@PROPS
@given(m=dims, n=dims, k=dims, flops_up=speedup, bw_up=speedup)
def test_gemm_faster_device_never_slower(m, n, k, flops_up, bw_up):
    slow = ops.gemm_time_s(m, n, k, _scaled(), TILES_H100, 2.0)
    fast = ops.gemm_time_s(m, n, k, _scaled(flops_up, bw_up), TILES_H100, 2.0)
    assert 0.0 < fast <= slow
    assert math.isfinite(slow)


@PROPS
@given(m=st.integers(1, 1 << 15).map(float), n=dims, k=dims)
def test_gemm_doubling_m_at_most_doubles_time(m, n, k):
    """Per tile, ceil(2m/tm) <= 2 ceil(m/tm), so waves and traffic at most double.
    Where both sizes fill the same tiles the two times are equal in exact arithmetic
    and may differ by an ulp either way (m=87, n=1387, k=1384 gives 6.0176341031344795e-06
    then 6.017634103134479e-06): the bounds hold to 1e-12 relative."""
    one = ops.gemm_time_s(m, n, k, _scaled(), TILES_H100, 2.0)
    two = ops.gemm_time_s(2 * m, n, k, _scaled(), TILES_H100, 2.0)
    assert one <= two * (1 + 1e-12)
    assert two <= 2 * one * (1 + 1e-12)


@PROPS
@given(m=dims, n=dims, units=st.integers(1, 256).map(float))
def test_tile_efficiency_is_a_fraction(m, n, units):
    eff = ops.tile_efficiency(m, n, units, TILES_H100)
    assert 0.0 < eff <= 1.0


@PROPS
@given(b=st.integers(1, 16).map(float), s=st.integers(1, 1 << 17).map(float), heads=st.integers(1, 128).map(float),
       head_dim=st.sampled_from([64.0, 128.0, 192.0]), causal=st.booleans(), flash=st.booleans(),
       flops_up=speedup, bw_up=speedup)
def test_attention_faster_device_never_slower(b, s, heads, head_dim, causal, flash, flops_up, bw_up):
    slow = ops.attention_fwd_bwd_s(b, s, s, heads, heads, head_dim, causal, flash, _scaled(), 2.0)
    fast = ops.attention_fwd_bwd_s(b, s, s, heads, heads, head_dim, causal, flash, _scaled(flops_up, bw_up), 2.0)
    for f, sl in zip(fast[:2], slow[:2]):
        assert 0.0 < f <= sl and math.isfinite(sl)
    assert slow[1] >= slow[0]  # backward never cheaper than forward


@PROPS
@given(nbytes=st.floats(0.0, 1e12), kernels=st.integers(0, 100).map(float), bw_up=speedup)
def test_memory_bound_more_bandwidth_never_slower(nbytes, kernels, bw_up):
    slow = ops.memory_bound_s(nbytes, kernels, _scaled())
    fast = ops.memory_bound_s(nbytes, kernels, _scaled(hbm=bw_up))
    assert 0.0 <= fast <= slow and math.isfinite(slow)


# --------------------------------------------------------------------------- sliding window and fusion


def test_sliding_window_key_length_by_hand():
    """s = 8 keys, window 4: queries 0..3 see 0..3 keys... (the continuous mean)
    w - w^2 / (2 s) = 4 - 16 / 16 = 3 keys; the causal formulas halve the key
    length, so it is 2 x 3 = 6. No window, or one at least s long: s itself."""
    from paraspace.kernels.ops import causal_kv_len

    assert causal_kv_len(8.0, 4.0) == 6.0
    assert causal_kv_len(8.0, 0.0) == causal_kv_len(8.0, 8.0) == causal_kv_len(8.0, 100.0) == 8.0
    # 32K tokens under a 4K window: 2 x 4096 - 4096^2 / 32768 = 7680 keys, 4.3x less than 32768
    assert causal_kv_len(32768.0, 4096.0) == 7680.0


def test_windowed_model_attends_less(h100, make_workload):
    """A model with a 4K sliding window over 32K tokens costs less forward
    attention FLOP than the same model with full attention; nothing else moves."""
    from paraspace.explorer.evaluate import pack_model
    from paraspace.kernels.training import model_flop_per_sequence
    from paraspace.spaces.catalog import load_model

    full = pack_model(load_model("llama3-8b"))[0]
    windowed = full.copy()
    windowed["sliding_window"] = 4096.0
    s = 32768.0
    # 32 layers x 2 s x keys x 32 heads x 128: the core with 32768 vs 7680 keys
    diff = 32 * 2 * s * (32768.0 - 7680.0) * 32 * 128
    assert model_flop_per_sequence(full, s) - model_flop_per_sequence(windowed, s) == pytest.approx(diff, rel=1e-12)


def test_kernel_fusion_removes_launches_and_round_trips(h100, llama3_8b, make_workload):
    """Fused elementwise kernels: fewer launches and less HBM traffic per layer, so
    the compute column falls and nothing else about the row changes."""
    import numpy as np

    from paraspace.kernels.training import N_COST, C_LAYER_FWD, C_LAYER_BWD, row_costs

    work = make_workload(global_batch=8.0)
    fused = h100.device.copy()
    fused["kernel_fusion"] = 1.0
    costs = []
    for dev in (h100.device, fused):
        c = np.empty(N_COST)
        row_costs(*cost_args(dp=8), llama3_8b[0], dev[0], h100.tiers, h100.tiles, work[0], c)
        costs.append(c)
    plain, fast = costs
    assert fast[C_LAYER_FWD] < plain[C_LAYER_FWD] and fast[C_LAYER_BWD] < plain[C_LAYER_BWD]
    # forward saving, by hand: 6 launches become 2, and (2 T h + rope 2 T (q + kv) + activation 3 T f) x 2 bytes
    t, h, q, kv, f = 4096.0, 4096.0, 4096.0, 1024.0, 14336.0
    saved = (2 * t * h + 2 * t * (q + kv) + 3 * t * f) * 2 / (h100.device[0].hbm_bytes_per_s * 0.8) + \
        4 * h100.device[0].launch_s
    assert plain[C_LAYER_FWD] - fast[C_LAYER_FWD] == pytest.approx(saved, rel=1e-9)


def test_attention_gemms_can_stay_in_16_bits_under_fp8(h100, llama3_8b, make_workload):
    """quantized_gemms = "mlp": the QKV and output projections run at the BF16 peak and
    skip the FP8 casts; the MLP GEMMs stay in FP8. By hand for Llama 3 8B, 4096
    tokens on one H100: the forward grows by the two projections' time at 989.4
    instead of 1978.9 TFLOP/s (and the reduction fill of 128 16-bit elements instead of
    256 8-bit ones: the profile's 256 bytes), less the casts of their inputs (2 x 4096 x
    4096) and weights (4096 x 6144 + 4096 x 4096) at 3 bytes each (read 2, write 1)."""
    import numpy as np

    from paraspace.explorer.evaluate import pack_hardware
    from paraspace.kernels.ops import gemm_time_at_s
    from paraspace.kernels.training import C_LAYER_FWD, N_COST, row_costs
    from paraspace.spaces.catalog import load_hardware

    dev, tiers, tiles = pack_hardware(load_hardware("h100-sxm5-80gb"), "fp8")
    assert dev[0].peak_16bit_flops_per_s == 989.4e12 and dev[0].peak_flops_per_s == 1978.9e12
    assert dev[0].gemm_k_fill_16bit == 128.0 and dev[0].gemm_k_fill == 256.0
    out = {}
    for quant in (1.0, 0.0):
        work = make_workload(global_batch=8.0, gemm_cast_bytes=3.0, quantize_attention=quant)
        c = np.empty(N_COST)
        row_costs(*cost_args(dp=8), llama3_8b[0], dev[0], tiers, tiles, work[0], c)
        out[quant] = c[C_LAYER_FWD]
    t, h, qkv = 4096.0, 4096.0, 4096.0 + 2 * 1024.0
    d = dev[0]
    slower = sum(gemm_time_at_s(t, n, k, d, tiles, 2.0, 989.4e12, 128.0)
                 - gemm_time_at_s(t, n, k, d, tiles, 2.0, 1978.9e12, 256.0) for n, k in ((qkv, h), (h, h)))
    casts = 3.0 * (t * (h + h) + h * qkv + h * h) / (d.hbm_bytes_per_s * d.memory_efficiency)
    assert slower > casts > 0
    assert out[0.0] - out[1.0] == pytest.approx(slower - casts, rel=1e-9)


def test_the_lm_head_stays_in_16_bits_under_fp8(h100, llama3_8b, make_workload):
    """Under an 8-bit dtype the layers' GEMMs run at the FP8 peak and the LM head at the BF16
    one (Transformer Engine, torchao's Float8 and DeepSeek-V3 leave the head in 16 bits; measured
    on whole steps, tests/test_device_measurements.py): an FP8 row's head slots are the BF16
    row's to the bit. By hand for Llama 3 8B, 4,096 tokens on one H100: the head's forward is
    one GEMM of 4,096 x 128,256 x 4,096 = 4.30 TFLOP at 989.4 TFLOP/s times its efficiency
    with the 16-bit reduction fill (128 elements), not at 1,978.9 with the 8-bit one (256);
    its layer slots are faster in FP8."""
    import numpy as np

    from paraspace.explorer.evaluate import pack_hardware
    from paraspace.kernels.ops import gemm_time_at_s
    from paraspace.kernels.training import C_HEAD_B, C_HEAD_F, C_HEAD_WGRAD, C_LAYER_FWD, N_COST, row_costs
    from paraspace.spaces.catalog import load_hardware

    costs = {}
    for dtype, cast in (("bf16", 0.0), ("fp8", 3.0)):
        dev, tiers, tiles = pack_hardware(load_hardware("h100-sxm5-80gb"), dtype)
        work = make_workload(global_batch=8.0, gemm_cast_bytes=cast)
        c = np.empty(N_COST)
        row_costs(*cost_args(dp=8), llama3_8b[0], dev[0], tiers, tiles, work[0], c)
        costs[dtype] = (c, dev[0], tiles)
    (bf16, _, _), (fp8, d8, tiles8) = costs["bf16"], costs["fp8"]
    for slot in (C_HEAD_F, C_HEAD_B, C_HEAD_WGRAD):
        assert fp8[slot] == bf16[slot]
    assert fp8[C_LAYER_FWD] < 0.8 * bf16[C_LAYER_FWD]
    t, v, h = 4096.0, 128256.0, 4096.0
    assert 2 * t * v * h == pytest.approx(4.30e12, rel=1e-3)
    head16 = gemm_time_at_s(t, v, h, d8, tiles8, 2.0, 989.4e12, 128.0)
    head8 = gemm_time_at_s(t, v, h, d8, tiles8, 2.0, 1978.9e12, 256.0)
    assert fp8[C_HEAD_WGRAD] == gemm_time_at_s(h, v, t, d8, tiles8, 2.0, 989.4e12, 128.0)
    assert 1.8 < head16 / head8 < 2.1


def test_quantized_gemms_is_a_no_op_in_16_bits(tmp_path):
    """In a BF16 space there is nothing to keep out of 8 bits: "mlp" and "all" agree."""
    from paraspace.explorer.evaluate import evaluate, pack
    from paraspace.spaces.catalog import load_space
    from paraspace.spaces.encode import Encoder

    results = []
    for scope in ("all", "mlp"):
        space = load_space("llama3-8b-h100-64", {"quantized_gemms": scope, "dimensions": {"tp": [2], "pp": [2]}})
        cols = Encoder(space).encode_all().columns
        results.append(evaluate(pack(space), cols, simulate=False)["step_time_s"])
    assert (results[0] == results[1]).all()
