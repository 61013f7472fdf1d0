"""Validation rows are data (issue 14, items 1-2): every model and run is built
from the row's columns (head_dim, MLA dims, attention kernel, gpus_per_node),
and the hardware catalog holds the Blackwell parts, the 96 GB / 500 W H100, and
node sizes apart from NVLink domain sizes."""

from __future__ import annotations

import pytest

from paraspace.explorer import validate
from paraspace.explorer.evaluate import pack_hardware, pack_model
from paraspace.kernels import collectives, ops, params, training
from paraspace.kernels.codes import ALL_TO_ALL
from paraspace.spaces.catalog import load_hardware, load_space, space_from_raw
from paraspace.spaces.errors import CatalogError

#: a training row's columns with the second version's new ones
ROW = {
    "id": "r-1", "source": "s", "quality": "ok", "model": "m", "layers": "48", "hidden": "2048", "heads": "32",
    "kv_heads": "4", "head_dim": "128", "ffn": "6144", "vocab": "151936", "seq": "4096", "glu": "1", "mla": "0",
    "gpu": "h100-sxm5-80gb", "n_gpus": "8", "gpus_per_node": "8", "tp": "1", "pp": "1", "dp": "8", "cp": "1",
    "ep": "1", "vpp": "1", "micro_batch": "1", "global_batch": "64", "sequence_parallel": "0",
    "recompute": "full", "zero": "3", "dtype": "bf16", "attention": "flash2", "metric": "step_time_s", "value": "1.0",
    "step_time_s": "1.0",
}


def model_of(**change: str) -> object:
    space, _ = validate.training_space({**ROW, **change}, "t")
    return space


def test_head_dim_column_sets_the_attention_width():
    """Qwen3-30B-A3B: hidden 2048, 32 heads of 128 (kv 4). Q is 32 x 128 = 4096 wide,
    K and V 4 x 128 = 512 each, O 4096 -> 2048: 2048 (4096 + 2 x 512) + 4096 x 2048
    = 10,485,760 + 8,388,608 = 18,874,368 elements, twice the 9,437,184 that
    hidden / heads = 64 would give (2048 (2048 + 512) + 2048 x 2048)."""
    space = model_of()
    assert space.model.d_head == 128
    split, rep = training.attention_weights(pack_model(space.model)[0])
    assert (split, rep) == (18_874_368.0, 0.0)
    narrow = model_of(head_dim="64")
    assert training.attention_weights(pack_model(narrow.model)[0])[0] == 9_437_184.0


def test_mla_columns_build_the_latent_attention():
    """DeepSeek-V3's MLA from a row: heads 128, q rank 1536, kv rank 512, nope 128,
    rope 64, v 128, hidden 7168. Split by heads: kv up 512 x 128 (128 + 128)
    = 16,777,216, out 128 x 128 x 7168 = 117,440,512, q up 1536 x 128 x 192
    = 37,748,736: 171,966,464. Replicated: kv down 7168 (512 + 64) = 4,128,768,
    q down 7168 x 1536 = 11,010,048: 15,138,816."""
    space = model_of(hidden="7168", heads="128", kv_heads="128", head_dim="192", mla="1", q_lora_rank="1536",
                     kv_lora_rank="512", rope_head_dim="64", qk_nope_head_dim="128", v_head_dim="128",
                     ffn="18432", layers="4")
    mla = space.model.mla
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (
        1536, 512, 128, 64, 128)
    split, rep = training.attention_weights(pack_model(space.model)[0])
    assert (split, rep) == (171_966_464.0, 15_138_816.0)


def test_an_mla_row_without_its_dims_is_unsupported_with_the_field_named():
    with pytest.raises(CatalogError, match="kv_lora_rank"):
        model_of(mla="1", q_lora_rank="1536", rope_head_dim="64", qk_nope_head_dim="128", v_head_dim="128")


@pytest.mark.parametrize(("attention", "flash", "kernel"), [
    ("unfused", False, "flash2"), ("flash1", True, "flash1"), ("flash2", True, "flash2"),
    ("flash3", True, "flash3"), ("", True, "flash2"),
])
def test_attention_column_picks_the_kernel(attention, flash, kernel):
    spec = model_of(attention=attention).spec
    assert (spec.flash_attention, spec.attention_kernel) == (flash, kernel)


def test_unfused_attention_reads_and_writes_the_score_matrix(make_device):
    """One causal sequence of 4096 tokens, 32 heads of 128, 16-bit, on a 100 TFLOP/s,
    1 TB/s device at full efficiency. FLOP: 4096^2 x 32 x 256 (causal half of
    2 (128 + 128)) = 1.37439e11 -> 1.374 ms at the plateau; one flash call over 4096
    keys runs at 4096 / 4546 of it: 1.525 ms. Q, O, K, V: 4 x 4096 x 32 x 128 x 2 B
    = 134 MB -> 0.134 ms, so FlashAttention is compute-bound. Unfused adds the
    scores written and read twice: 4 x 32 x 4096^2 x 2 B = 4.295 GB -> 4.295 ms,
    memory-bound: 4.429 ms forward, twice that backward (flash backward: 2.5x the FLOP at
    0.90 of the forward's plateau and 4096 / 5096 of that, 2.5 x 1.374 / 0.90 x
    5096 / 4096 = 4.750 ms)."""
    dev = make_device(peak_16bit_flops_per_s=100e12)[0]
    flop = 4096.0**2 * 32 * 256
    io = 4 * 4096 * 32 * 128 * 2.0
    scores = 4 * 32 * 4096.0**2 * 2.0
    args = (1.0, 4096.0, 4096.0, 32.0, 32.0, 128.0, 128.0, True)
    f_fwd, f_bwd, _ = ops.attention_qkv_fwd_bwd_s(*args, True, dev, 2.0, 4096.0)
    u_fwd, u_bwd, _ = ops.attention_qkv_fwd_bwd_s(*args, False, dev, 2.0, 4096.0)
    assert f_fwd == pytest.approx(flop / 100e12 * 4546 / 4096, rel=1e-12)
    assert f_bwd == pytest.approx(2.5 * flop / (0.90 * 100e12) * 5096 / 4096, rel=1e-12)
    assert u_fwd == pytest.approx((io + scores) / 1e12, rel=1e-12)
    assert u_bwd == pytest.approx(2 * (io + scores) / 1e12, rel=1e-12)


def test_unfused_row_predicts_slower_than_the_same_row_with_flash2(tmp_path):
    import csv

    path = tmp_path / "t.csv"
    fields = list(ROW)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerow({**ROW, "id": "fa2", "seq": "8192"})
        writer.writerow({**ROW, "id": "unfused", "seq": "8192", "attention": "unfused"})
    fa2, unfused = validate.run(path)[1]
    assert fa2.status == unfused.status == "ok"
    assert unfused.predicted > fa2.predicted


# ------------------------------------------------------------------- hardware records


@pytest.mark.parametrize(("name", "peaks", "hbm_gib", "hbm_gbps", "domain", "node", "nvlink", "nic_gbps"), [
    # HGX B200 column of NVIDIA's Blackwell table, sparse figures halved; 180 GB read as GiB, as NVIDIA counts HBM
    ("b200-sxm-180gb", {"bf16": 2250, "fp8": 4500, "fp4": 9000, "int8": 4500, "tf32": 1125}, 180.0, 7700, 8, 8, 5,
     50),
    # Blackwell Ultra: dense FP4 13,125, no INT8 listed; 288 GB (GiB); ConnectX-8 800 Gb/s
    ("b300-sxm-288gb", {"bf16": 2250, "fp8": 4500, "fp4": 13125}, 288.0, 8000, 8, 8, 5, 100),
    # GB200 NVL72 column: 72 GPUs on NVLink 5, trays of 4; 186 GB (GiB)
    ("gb200-nvl72", {"bf16": 2500, "fp8": 5000, "fp4": 10000, "int8": 5000}, 186.0, 8000, 72, 4, 5, 50),
    # the H100's nominal peak with six HBM2e stacks: 96 GB at 2.4 TB/s
    ("h100-sxm5-96gb-500w", {"bf16": 989.4, "fp8": 1978.9}, 96.0, 2400, 8, 8, 4, 50),
])
def test_new_hardware_records_match_their_datasheets(name, peaks, hbm_gib, hbm_gbps, domain, node, nvlink, nic_gbps):
    hw = load_hardware(name)
    for dtype, tflops in peaks.items():
        assert hw.device.peak_TFLOP_per_s[dtype] == tflops, dtype
    assert hw.device.hbm_capacity_GiB == hbm_gib and hw.device.hbm_bandwidth_GB_per_s == hbm_gbps
    assert hw.links[0].domain_devices == domain and hw.devices_per_node == node
    assert hw.nvlink_generation == nvlink and hw.nics_per_device == 1
    assert hw.links[0].bandwidth_GB_per_s == (900 if nvlink == 5 else 450)
    assert hw.links[-1].bandwidth_GB_per_s == nic_gbps


def test_power_capped_h100_runs_at_its_sustained_clock():
    """The 500 W H100 keeps the datasheet peaks (above) but computes at the clock it
    sustains: 0.896 of the SXM clock, the 500 W point of a line from the H100 NVL
    (835.5 TFLOP/s BF16 at 400 W) to the H100 SXM (989.4 at 700 W):
    835.5 + 153.9 * 100 / 300 = 886.8, / 989.4 = 0.8963. Packed BF16 peak
    989.4e12 * 0.896 = 886.5024e12 FLOP/s, FP8 1978.9e12 * 0.896 = 1773.0944e12;
    the 700 W part and the H200 (the same die at 700 W) are not scaled."""
    from paraspace.explorer.evaluate import pack_hardware

    capped = load_hardware("h100-sxm5-96gb-500w")
    assert capped.device.sustained_clock_fraction == 0.896
    assert (835.5 + (989.4 - 835.5) * (500 - 400) / (700 - 400)) / 989.4 == pytest.approx(0.896, abs=5e-4)
    packed = pack_hardware(capped, "fp8")[0][0]
    assert packed.peak_flops_per_s == pytest.approx(1773.0944e12, rel=1e-12)
    assert packed.peak_16bit_flops_per_s == pytest.approx(886.5024e12, rel=1e-12)
    for name in ("h100-sxm5-80gb", "h200-sxm-141gb"):
        dev = load_hardware(name).device
        assert dev.sustained_clock_fraction == 1.0
        assert pack_hardware(load_hardware(name), "bf16")[0][0].peak_flops_per_s == pytest.approx(989.4e12, rel=1e-12)


def test_node_size_is_separate_from_the_nvlink_domain():
    """HGX H200 in servers of 4 (KempnerForge): the NVLink domain is the server, so
    it shrinks to 4. GB200 NVL72 with trays of 2: the domain spans trays and stays 72."""
    h200 = load_hardware("h200-sxm-141gb").with_node_devices(4, "t")
    assert h200.devices_per_node == 4 and h200.links[0].domain_devices == 4
    nvl = load_hardware("gb200-nvl72").with_node_devices(2, "t")
    assert nvl.devices_per_node == 2 and nvl.links[0].domain_devices == 72
    with pytest.raises(CatalogError, match="node_devices"):
        load_hardware("gb200-nvl72").with_node_devices(5, "t")


def test_a_space_overrides_the_node_size():
    base = load_space("llama3-8b-h100-64")
    raw = {**base.raw, "node_devices": 4}
    space = space_from_raw(raw, "t", base_dir=__import__("pathlib").Path("."))
    assert space.hardware.devices_per_node == 4 and space.hardware.links[0].domain_devices == 4
    row = validate.training_space({**ROW, "gpu": "h200-sxm-141gb", "gpus_per_node": "4"}, "t")[0]
    assert row.hardware.links[0].domain_devices == 4


def test_ep_group_inside_one_nvl72_domain_runs_on_nvlink_and_across_racks_on_ib():
    """An EP group of 64 adjacent GPUs fits one NVL72 domain: its all-to-all sends
    63/64 of the buffer at 900 GB/s x 0.8 = 720 GB/s after 63 NVLink latencies of
    3 us. A group of 144 spans two racks: 72 members per domain, the rest over IB.
    On HGX B200 (domains of 8) the same 64 ranks cross InfiniBand."""
    _, nvl, _ = pack_hardware(load_hardware("gb200-nvl72"), "bf16")
    _, hgx, _ = pack_hardware(load_hardware("b200-sxm-180gb"), "bf16")
    size = 64 * 2**20
    assert collectives.group_tier(64.0, 1.0, nvl) == 0
    assert collectives.group_tier(144.0, 1.0, nvl) == 1
    assert collectives.group_tier(64.0, 1.0, hgx) == 1
    t_nvl = collectives.collective_time_s(ALL_TO_ALL, 64.0, 1.0, float(size), nvl)
    assert t_nvl == pytest.approx(63 * 3e-6 + size * 63 / 64 / 720e9, rel=1e-12)
    # two racks: 72 of 144 inside each domain (71/144 of the buffer at 720 GB/s after
    # 71 latencies), then the 72 members of the other rack over IB at 50 x 0.9 GB/s
    t_two = collectives.collective_time_s(ALL_TO_ALL, 144.0, 1.0, float(size), nvl)
    expected = 71 * 3e-6 + size * 71 / 144 / 720e9 + 1 * 6e-6 + size * (144 - 72) / 144 / 45e9
    assert t_two == pytest.approx(expected, rel=1e-12)
    # HGX: 7 of the 64 ranks share a node's NVLink, the other 56 are 7 nodes away over IB
    t_hgx = collectives.collective_time_s(ALL_TO_ALL, 64.0, 1.0, float(size), hgx)
    assert t_hgx == pytest.approx(7 * 3e-6 + size * 7 / 64 / 720e9 + 7 * 6e-6 + size * 56 / 64 / 45e9, rel=1e-12)
    assert t_hgx > 4 * t_nvl


def test_tier_records_hold_the_nvl72_domain():
    tiers = params.tier_table([(72, 720e9, 3e-6), (0, 45e9, 6e-6)])
    assert tiers["domain_devices"][0] == 72 and tiers["domain_devices"][1] == 0
