"""``paraspace calibrate``: profiles fitted to measurements, written, loaded back and
predicted by the kernels (explorer.fit_measurements)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from paraspace.explorer import fit_measurements
from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import pack_hardware
from paraspace.kernels import params
from paraspace.kernels.codes import SEND_RECV
from paraspace.kernels.collectives import collective_time_s
from paraspace.kernels.ops import gemm_efficiency, gemm_time_s
from paraspace.spaces.catalog import CATALOG_DIR, load_hardware, read_toml
from paraspace.spaces.errors import CatalogError

MIB = 2**20
GIB_PER_S_IN_GB_PER_S = 1.073741824  # 1 GiB/s = 2**30 / 1e9 GB/s
PEAK_TFLOPS = 512.0  # br166-spc, bf16, per die
#: the documents' grouped-GEMM "TCore utilisation" by m (n = 4096, k = 7168), seed-digest.md section 2
GROUPED_GEMM = ((1024, 0.34), (2048, 0.42), (4096, 0.53))
#: the documents' inter-node SPC send/recv, run 1: message MiB -> GiB/s
SEND_RECV_RUN1 = ((1, 0.18), (32, 3.88), (64, 8.07), (128, 7.55), (256, 11.04), (1024, 12.19))


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def grouped_gemm_csv(path: Path, scale: float = 1.0) -> Path:
    return write_csv(path, "m,n,k,dtype,tflops",
                     [f"{m},4096,7168,bf16,{scale * u * PEAK_TFLOPS}" for m, u in GROUPED_GEMM])


def send_recv_csv(path: Path) -> Path:
    return write_csv(path, "op,ranks,bytes,gbps",
                     [f"send_recv,2,{mib * MIB},{gib * GIB_PER_S_IN_GB_PER_S}" for mib, gib in SEND_RECV_RUN1])


# --------------------------------------------------------------------------- (a) GEMM


def test_gemm_round_trip_grouped_gemm(tmp_path):
    """The documents' grouped GEMM on br166-spc (bf16 peak 512 TFLOP/s, launch 5 us).

    m = 1024: 2mnk = 2 x 1024 x 4096 x 7168 = 60.13 GFLOP; at 34% of 512 =
    174.08 TFLOP/s it takes 60.13e9 / 174.08e12 = 345.4 us; the kernel adds the
    5 us launch, so the fitted efficiency is 60.13e9 / ((345.4 - 5) us x 512e12)
    = 0.3450. Likewise m = 2048: 120.3 GFLOP / 215.04 TFLOP/s = 559.2 us ->
    0.4238; m = 4096: 240.5 GFLOP / 271.36 TFLOP/s = 886.3 us -> 0.5330.
    All three are compute-bound (HBM traffic of m = 4096: (mk + kn + mn) x 2 B =
    151 MB / (644.2 GB/s x 0.8) = 293 us < 881 us), so gemm_time_s of the
    written profile = 2mnk / (peak x eff) + launch = the measured time."""
    csv = grouped_gemm_csv(tmp_path / "grouped.csv")
    out = tmp_path / "br166-gemm.toml"
    cal = fit_measurements.calibrate_gemm(csv, "br166-spc", out)

    hw = load_hardware(str(out))
    assert hw.name == "br166-spc-calibrated"
    assert "grouped.csv" in hw.description
    base = load_hardware("br166-spc")
    assert hw.device.model_copy(update={"gemm_efficiency": base.device.gemm_efficiency}) == base.device
    assert hw.links == base.links
    effs = [p[3] for p in hw.device.gemm_efficiency]
    assert effs == pytest.approx([0.3450, 0.4238, 0.5330], abs=5e-4)

    device, _, tiles = pack_hardware(hw, "bf16")
    worst = 0.0
    for m, util in GROUPED_GEMM:
        measured = 2.0 * m * 4096 * 7168 / (util * PEAK_TFLOPS * 1e12)
        predicted = gemm_time_s(float(m), 4096.0, 7168.0, device[0], tiles, 2.0)
        worst = max(worst, abs(predicted / measured - 1.0))
    assert worst < 0.05
    assert cal.worst_error == pytest.approx(worst, abs=1e-12)
    assert worst < 1e-9  # exact up to rounding

    # between measured m: between the neighbours' efficiencies (log-m interpolation)
    mid = gemm_efficiency(1448.0, 4096.0, 7168.0, device[0], tiles)
    assert effs[0] < mid < effs[1]
    mid2 = gemm_efficiency(3000.0, 4096.0, 7168.0, device[0], tiles)
    assert effs[1] < mid2 < effs[2]

    text = out.read_text()
    assert text.count('extends = "br166-spc"') == 1
    assert "#   1024    4096    7168" in text  # the comment block records the fitted rows


def test_gemm_duplicates_averaged_and_seconds_column(tmp_path):
    """Two rows of one shape: their mean time is fitted; h100 (no table) gets one."""
    flops = 2.0 * 8192 * 8192 * 8192
    t1, t2 = flops / 600e12, flops / 500e12
    csv = write_csv(tmp_path / "dup.csv", "M,N,K,dtype,seconds,comment",
                    [f"8192,8192,8192,bf16,{t1},a", "# a comment line", "", f"8192,8192,8192,bf16,{t2},b"])
    cal = fit_measurements.calibrate_gemm(csv, "h100-sxm5-80gb", tmp_path / "h.toml", "my-h100")
    (point,) = cal.points
    assert point["rows"] == 2 and point["measured_s"] == pytest.approx((t1 + t2) / 2, rel=1e-12)
    hw = load_hardware(str(tmp_path / "h.toml"))
    assert hw.name == "my-h100"
    expected = flops / (((t1 + t2) / 2 - 4e-6) * 989.4e12)
    assert hw.device.gemm_efficiency == ((8192, 8192, 8192, pytest.approx(expected, rel=1e-12)),)
    assert abs(point["error"]) < 1e-9


def test_gemm_base_given_as_a_path(tmp_path):
    """A base profile given by path is extended by a path relative to the written file."""
    (tmp_path / "base").mkdir()
    shutil.copy(CATALOG_DIR / "hardware" / "br166-spc.toml", tmp_path / "base" / "mine.toml")
    out = tmp_path / "out" / "fitted.toml"
    fit_measurements.calibrate_gemm(grouped_gemm_csv(tmp_path / "g.csv"), str(tmp_path / "base" / "mine.toml"), out)
    assert read_toml(out)["extends"] == "../base/mine.toml"
    assert load_hardware(str(out)).name == "br166-spc-calibrated"


def test_gemm_clamped_and_memory_bound_points_are_reported(tmp_path):
    """A point above the peak (by less than a boost clock's margin) is clamped to 1; one
    below the memory roofline is flagged."""
    flops = 2.0 * 4096 * 4096 * 4096
    rows = [f"4096,4096,4096,bf16,{flops / 540e12 + 5e-6}",  # 5% faster than the 512 TFLOP/s peak
            "64,64,65536,bf16,2e-5"]  # 17 MB of traffic: 32 us at 515 GB/s, measured 20 us
    cal = fit_measurements.calibrate_gemm(write_csv(tmp_path / "c.csv", "m,n,k,dtype,seconds", rows), "br166-spc",
                                     tmp_path / "c.toml")
    by_m = {p["m"]: p for p in cal.points}
    assert by_m[4096]["clamped"] and by_m[4096]["efficiency"] == 1.0
    assert by_m[64]["memory_bound"]
    assert "clamped to 1" in cal.summary and "memory roofline" in cal.summary


def test_a_gemm_far_past_the_peak_is_refused_naming_its_line(tmp_path):
    """4096^3 in 2.75e-5 s is 1.37e14 FLOP / 2.75e-5 s = 5,000 TFLOP/s, 9.8 x BR166's 512
    (a time in the wrong unit): no boost clock runs that fast, so the file is refused at
    that line, nothing written; at most 1.1 x the peak passes, clamped."""
    flops = 2.0 * 4096 ** 3
    rows = ["8192,8192,8192,bf16,0.004", f"4096,4096,4096,bf16,{flops / 5000e12}"]
    out = tmp_path / "c.toml"
    with pytest.raises(CatalogError) as err:
        fit_measurements.calibrate_gemm(write_csv(tmp_path / "c.csv", "m,n,k,dtype,seconds", rows), "br166-spc", out)
    assert "line 3, seconds" in str(err.value) and "x br166-spc's bf16 peak of 512 TFLOP/s" in str(err.value)
    assert not out.exists()


# --------------------------------------------------------------------------- (b) collectives


def test_comm_round_trip_send_recv_curve(tmp_path):
    """The documents' inter-node SPC send/recv (run 1) on br166-spc's rdma tier.

    GiB/s -> GB/s: x 1.073741824 (12.19 GiB/s = 13.089 GB/s); bytes = MiB x 2**20;
    measured time = bytes / (GB/s x 1e9), e.g. 1 GiB: 1073741824 / 13.089e9 =
    82.03 ms, 1 MiB: 1048576 / 0.19327e9 = 5.425 ms. No message is at most 64 KiB,
    so alpha keeps the base tier's 10 us; the send/recv bandwidth is the fastest
    latency-free point, 1 GiB / (82.03 - 0.01) ms = 13.0905 GB/s, and the curve
    is each size's latency-free bandwidth over it: 1 MiB 1.0486e6 / (5.425 -
    0.010) ms = 0.1936 GB/s / 13.0905 = 0.0148, ..., 1 GiB 1.0. Two stages 16 dies
    apart cross the node boundary (2 x 16 > 16), so collective_time_s uses the
    rdma tier: 10 us + bytes / (13.0905 GB/s x curve(bytes)) = the measured time."""
    out = tmp_path / "br166-rdma.toml"
    cal = fit_measurements.calibrate_comm(send_recv_csv(tmp_path / "sr.csv"), "br166-spc", "rdma", out)

    hw = load_hardware(str(out))
    base = load_hardware("br166-spc")
    assert [t.name for t in hw.links] == [t.name for t in base.links]
    assert hw.links[:2] == base.links[:2] and hw.device == base.device
    rdma = hw.links[2]
    assert rdma.latency_us == pytest.approx(10.0)
    assert rdma.op_bandwidth_GB_per_s == {"send_recv": pytest.approx(13.0905, abs=1e-4)}
    assert [mib for mib, _ in rdma.size_curve] == [float(mib) for mib, _ in SEND_RECV_RUN1]
    fractions = [f for _, f in rdma.size_curve]
    assert fractions[-1] == 1.0
    assert fractions == pytest.approx([0.0148, 0.3187, 0.6628, 0.6197, 0.9060, 1.0], abs=1e-4)

    _, tiers, _ = pack_hardware(hw, "bf16")
    worst = 0.0
    for mib, gib_per_s in SEND_RECV_RUN1:
        size = float(mib * MIB)
        measured = size / (gib_per_s * GIB_PER_S_IN_GB_PER_S * 1e9)
        predicted = collective_time_s(SEND_RECV, 2.0, 16.0, size, tiers)
        worst = max(worst, abs(predicted / measured - 1.0))
    assert worst < 0.05
    assert worst < 1e-9 and cal.worst_error < 1e-9
    assert "kept from the base tier" in cal.summary


def nccl_like_rows(alpha: float = 8e-6, bandwidth: float = 40e9) -> list[str]:
    """Synthetic nccl-tests sweeps 8 B .. 1 GiB (28 sizes) of all-reduce on 8 and
    16 ranks and all-gather on 8 ranks (30% faster), with one smooth ramp."""
    rows = []
    for e in range(3, 31):
        size = 2**e
        ramp = 1.0 / (1.0 + (MIB / size) ** 0.7)
        for op, n, bw in (("all_reduce", 8, bandwidth), ("all_reduce", 16, bandwidth),
                          ("all_gather", 8, 1.3 * bandwidth)):
            steps = 2 * (n - 1) if op == "all_reduce" else n - 1
            factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
            rows.append(f"{op},{n},{size},{steps * alpha + size * factor / (bw * ramp)}")
    return rows


def test_comm_many_sizes_and_ops(tmp_path):
    """More sizes than curve points and two ops: alpha from the small messages,
    16 curve points (greedy), every point within 5%."""
    csv = write_csv(tmp_path / "ib.csv", "op,ranks,bytes,seconds", nccl_like_rows())
    cal = fit_measurements.calibrate_comm(csv, "h100-sxm5-80gb", "ib", tmp_path / "ib.toml")
    ib = load_hardware(str(tmp_path / "ib.toml")).links[1]
    assert len(ib.size_curve) == params.MAX_CURVE_POINTS
    assert ib.latency_us == pytest.approx(8.0, rel=0.05)
    assert ib.op_bandwidth_GB_per_s["all_reduce"] == pytest.approx(40.0, rel=0.05)
    assert ib.op_bandwidth_GB_per_s["all_gather"] == pytest.approx(52.0, rel=0.05)
    assert len(cal.points) == 84 and cal.worst_error < 0.05
    assert "least squares" in cal.summary


def test_comm_gbps_is_bus_bandwidth(tmp_path):
    """gbps is nccl-tests busbw: an 8-rank all-reduce of 1 GB at busbw 35 GB/s takes
    1e9 x 2 x 7/8 / 35e9 = 50 ms."""
    csv = write_csv(tmp_path / "ar.csv", "op,ranks,bytes,gbps", ["all_reduce,8,1000000000,35"])
    cal = fit_measurements.calibrate_comm(csv, "h100-sxm5-80gb", "ib", tmp_path / "ar.toml")
    assert cal.points[0]["measured_s"] == pytest.approx(0.05, rel=1e-12)
    assert abs(cal.points[0]["error"]) < 1e-9
    ib = cal.hardware.links[1]
    assert ib.size_curve == () and ib.latency_us == 6.0  # one size: no curve; alpha kept
    assert ib.op_bandwidth_GB_per_s["all_reduce"] == pytest.approx(1.75e9 / (0.05 - 14 * 6e-6) / 1e9, rel=1e-9)


# --------------------------------------------------------------------------- (c) command line


def test_cli_calibrate_gemm(tmp_path):
    csv = grouped_gemm_csv(tmp_path / "slow.csv", scale=0.5)
    out = tmp_path / "slow.toml"
    result = run("calibrate", "gemm", str(csv), "--hardware", "br166-spc", "--out", str(out), "--name", "br166-slow")
    assert result.exit_code == 0, result.output
    assert out.is_file() and f"wrote {out}" in result.output and "worst round-trip error 0.00%" in result.output
    hw = load_hardware(str(out))
    assert hw.name == "br166-slow"
    device, _, tiles = pack_hardware(hw, "bf16")
    m, util = GROUPED_GEMM[1]
    measured = 2.0 * m * 4096 * 7168 / (0.5 * util * PEAK_TFLOPS * 1e12)
    assert gemm_time_s(float(m), 4096.0, 7168.0, device[0], tiles, 2.0) == pytest.approx(measured, rel=1e-9)


def test_cli_calibrated_profile_in_eval(tmp_path):
    """``paraspace eval --hardware PROFILE.toml`` uses the fitted table: at half the
    documents' utilisation the step's compute time grows."""
    out = tmp_path / "slow.toml"
    result = run("calibrate", "gemm", str(grouped_gemm_csv(tmp_path / "slow.csv", scale=0.5)), "--hardware",
                 "br166-spc", "--out", str(out))
    assert result.exit_code == 0, result.output
    config = ["--model", "llama3-8b", "--devices", "16", "--global-batch", "16", "--seq-len", "4096", "--set", "tp=2",
              "--json"]
    base = run("eval", "--hardware", "br166-spc", *config)
    slow = run("eval", "--hardware", str(out), *config)
    assert base.exit_code == 0 and slow.exit_code == 0, slow.output
    assert json.loads(slow.stdout)["compute_s"] > 1.5 * json.loads(base.stdout)["compute_s"]


def test_cli_calibrate_comm(tmp_path):
    out = tmp_path / "rdma.toml"
    result = run("calibrate", "comm", str(send_recv_csv(tmp_path / "sr.csv")), "--hardware", "br166-spc",
                 "--tier", "rdma", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "latency_us 10" in result.output and "send_recv 13.09" in result.output
    assert load_hardware(str(out)).links[2].size_curve[0][0] == 1.0


def test_cli_calibrate_help():
    result = run("calibrate", "--help")
    assert result.exit_code == 0 and "gemm" in result.output and "comm" in result.output


# --------------------------------------------------------------------------- (d) bad input


def gemm_error(tmp_path: Path, header: str, rows: list[str], hardware: str = "br166-spc") -> str:
    csv = write_csv(tmp_path / "bad.csv", header, rows)
    result = run("calibrate", "gemm", str(csv), "--hardware", hardware, "--out", str(tmp_path / "o.toml"))
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "o.toml").exists()
    return result.output


def comm_error(tmp_path: Path, header: str, rows: list[str], tier: str = "rdma", hardware: str = "br166-spc") -> str:
    csv = write_csv(tmp_path / "bad.csv", header, rows)
    result = run("calibrate", "comm", str(csv), "--hardware", hardware, "--tier", tier, "--out",
                 str(tmp_path / "o.toml"))
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "o.toml").exists()
    return result.output


def test_error_missing_column(tmp_path):
    out = gemm_error(tmp_path, "m,n,dtype,tflops", ["1024,4096,bf16,100"])
    assert "bad.csv: line 1, columns = ['m', 'n', 'dtype', 'tflops']" in out and "(missing k)" in out


def test_error_no_timing_column_and_both(tmp_path):
    assert "(missing seconds or tflops)" in gemm_error(tmp_path, "m,n,k,dtype", ["1,1,1,bf16"])
    assert "both seconds and gbps" in comm_error(tmp_path, "op,ranks,bytes,seconds,gbps", ["send_recv,2,1,1,1"])


def test_error_non_positive_value(tmp_path):
    out = gemm_error(tmp_path, "m,n,k,dtype,seconds", ["1024,4096,7168,bf16,0.001", "1024,4096,7168,bf16,-1"])
    assert "bad.csv: line 3, seconds = '-1': expected a number greater than 0" in out
    out = gemm_error(tmp_path, "m,n,k,dtype,seconds", ["1024.5,4096,7168,bf16,0.001"])
    assert "line 2, m = '1024.5': expected an integer greater than 0" in out
    out = comm_error(tmp_path, "op,ranks,bytes,seconds", ["send_recv,2,,0.1"])
    assert "line 2, bytes = '(empty)': expected a number greater than 0" in out
    out = comm_error(tmp_path, "op,ranks,bytes,seconds", ["all_reduce,1,1024,0.1"])
    assert "line 2, ranks = '1': expected an integer at least 2" in out


def test_error_unknown_op(tmp_path):
    out = comm_error(tmp_path, "op,ranks,bytes,gbps", ["allreduce,8,1024,1.0"])
    assert "bad.csv: line 2, op = 'allreduce': expected one of ['all_reduce', 'all_gather'" in out


def test_error_unknown_tier(tmp_path):
    out = comm_error(tmp_path, "op,ranks,bytes,gbps", ["send_recv,2,1024,1.0"], tier="ib")
    assert "--tier = 'ib': expected one of br166-spc's link tiers ['d2d', 'node', 'rdma']" in out


def test_error_unknown_hardware(tmp_path):
    out = comm_error(tmp_path, "op,ranks,bytes,gbps", ["send_recv,2,1024,1.0"], hardware="br999")
    assert "hardware = 'br999': expected a hardware TOML path or one of" in out


def test_error_mixed_and_unknown_dtypes(tmp_path):
    out = gemm_error(tmp_path, "m,n,k,dtype,tflops", ["1024,4096,7168,bf16,100", "2048,4096,7168,fp16,100"])
    assert "bad.csv: dtype = ['bf16', 'fp16']: expected one precision per file" in out
    out = gemm_error(tmp_path, "m,n,k,dtype,tflops", ["1024,4096,7168,fp8,100"])
    assert "line 2, dtype = 'fp8': expected a precision br166-spc has a peak for" in out
    out = gemm_error(tmp_path, "m,n,k,dtype,tflops", ["1024,4096,7168,bf17,100"])
    assert "line 2, dtype = 'bf17': expected one of ['bf16'" in out


def test_error_too_many_shapes(tmp_path):
    rows = [f"{m},4096,7168,bf16,100" for m in range(1, params.MAX_GEMM_POINTS + 2)]
    out = gemm_error(tmp_path, "m,n,k,dtype,tflops", rows)
    assert "(m, n, k) = '65 distinct shapes': expected at most 64" in out


def test_error_time_below_launch(tmp_path):
    out = gemm_error(tmp_path, "m,n,k,dtype,seconds", ["128,128,128,bf16,4e-6"])
    assert "line 2, seconds = 4e-06: expected more than br166-spc's launch overhead of 5 us" in out


def test_error_empty_file_and_overwriting_the_base(tmp_path):
    assert "bad.csv: (file) = '(header only)'" in gemm_error(tmp_path, "m,n,k,dtype,tflops", [])
    base = tmp_path / "base.toml"
    shutil.copy(CATALOG_DIR / "hardware" / "br166-spc.toml", base)
    with pytest.raises(CatalogError, match="a file other than the base profile"):
        fit_measurements.calibrate_gemm(grouped_gemm_csv(tmp_path / "g.csv"), str(base), base)
    with pytest.raises(CatalogError, match="--out = .*: expected a file that can be written"):
        fit_measurements.calibrate_gemm(grouped_gemm_csv(tmp_path / "g.csv"), "br166-spc", base / "under-a-file.toml")


def test_out_replaces_only_an_earlier_calibrated_profile(tmp_path):
    """--out may name an earlier profile of calibrate (refitted in place), never the measurements
    being read, notes or a result: those stay byte for byte and the error names the file."""
    flops = 2.0 * 8192 * 8192 * 8192
    csv = write_csv(tmp_path / "m.csv", "M,N,K,dtype,seconds", [f"8192,8192,8192,bf16,{flops / 600e12}"])
    kept = csv.read_bytes()
    runner = CliRunner()
    refused = runner.invoke(main, ["calibrate", "gemm", str(csv), "--hardware", "h100-sxm5-80gb", "--out", str(csv)])
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert f"{csv}: output file" in refused.output and "profile written by paraspace calibrate" in refused.output
    assert csv.read_bytes() == kept
    out = tmp_path / "h.toml"
    for _ in range(2):  # the second run replaces the first one's profile
        done = runner.invoke(main, ["calibrate", "gemm", str(csv), "--hardware", "h100-sxm5-80gb", "--out", str(out)])
        assert done.exit_code == 0, done.output
    assert out.read_text().startswith(fit_measurements.PROFILE_START)


def test_a_comm_fit_whose_latency_leaves_no_bytes_term_is_refused(tmp_path):
    """One 1 MiB all-reduce over 16 ranks at 40 GB/s bus bandwidth: 1048576 x 2 x 15 / 16 / 40e9
    = 49 us, under the base IB tier's 6 us x 30 ring steps; the latency, clamped to what the
    point allows (0.999 of it), leaves 0.1% for the bytes, which would be 1000x the measured
    40 GB/s. Refused, naming the line and the bandwidth it would give; nothing written."""
    csv = write_csv(tmp_path / "one.csv", "op,ranks,bytes,gbps", ["all_reduce,16,1048576,40"])
    out = tmp_path / "c.toml"
    with pytest.raises(CatalogError) as err:
        fit_measurements.calibrate_comm(csv, "h100-sxm5-80gb", "ib", out)
    assert "line 2 (all_reduce) = 'busbw at most 40 GB/s'" in str(err.value)
    assert "would make the all_reduce bandwidth 4e+04 GB/s" in str(err.value)
    assert not out.exists()


def test_a_repeated_csv_column_is_refused(tmp_path):
    """m given twice: which copy a row means is a guess, so the header is refused, naming it."""
    csv = write_csv(tmp_path / "dup.csv", "m,n,k,dtype,m,tflops", ["1024,4096,4096,bf16,2048,200"])
    with pytest.raises(CatalogError) as err:
        fit_measurements.calibrate_gemm(csv, "h100-sxm5-80gb", tmp_path / "x.toml")
    assert "line 1, columns" in str(err.value) and "each column once (m given more than once)" in str(err.value)
