"""Kernel throughput: GEMM and collective evaluations per second, against a plain-Python reference.

    python bench/bench_kernels.py [--n N] [--ref-n K]

Draws N seeded random inputs per kernel (numpy default_rng(0)) and evaluates
them with the numba kernels through a parallel batch driver (prange over
rows), then evaluates the first K of the same rows with the plain-Python
reference ``tests/naive.py`` in the same run, checks that both agree
(relative 1e-9, no absolute slack) and prints the ratio of the rates.

- GEMM: ``kernels.ops.gemm_time_s`` on H100 SXM5 80GB in bf16 (2-byte
  operands, the catalog's six output tiles); m, n, k log-uniform in
  [1, 65536], rounded to integers.
- Collectives: ``kernels.collectives.collective_time_s`` over the H100 tier
  table (NVLink domain of 8, then IB) with the all-reduce algorithm set to
  auto on both tiers (so that all-reduce rows evaluate the ring and NCCL's
  double binary tree and take the faster per level); op uniform over the seven
  codes of ``kernels.codes``, group size 2..4096 (powers of two), stride 1..8,
  buffer log-uniform in 1 KiB..16 GiB, rounded to whole bytes.

The kernel time is the best of 3 runs after a warm-up call (whose time, JIT
compile or cache load, is reported separately). The reference is timed once,
over plain Python values (inputs converted to lists before the clock starts).
The reference rows are drawn from the same distribution as the rest, so its
rate extrapolates per evaluation. Its collective rate is dominated by
send/recv, which the reference derives the long way round (walking every
neighbour hop of every interleaved pipeline, up to 8 x 4095 per call; the
tree's depth likewise, by walking NCCL's tree), so the collective ratio is
printed with the reference's rate per op beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paraspace.explorer.evaluate import ACT_BYTES, pack_hardware  # noqa: E402
from paraspace.kernels.codes import ALLREDUCE_AUTO, COLLECTIVES  # noqa: E402
from paraspace.kernels.batch import collective_rows, gemm_rows  # noqa: E402
from paraspace.spaces.catalog import load_hardware  # noqa: E402
from tests import naive  # noqa: E402

HARDWARE = "h100-sxm5-80gb"
DTYPE = "bf16"
RTOL = 1e-9
REPEATS = 3
KIB, GIB = 2.0**10, 2.0**30


def plain_fields(rec: np.ndarray) -> dict[str, float | list[float]]:
    """A one-element record array as the reference's ``{field: value}``: scalars as
    floats (as ``naive.fields``), table fields (fixed-size arrays) as lists."""
    row = rec[0]
    return {name: float(row[name]) if rec.dtype[name].shape == () else np.asarray(row[name]).tolist()
            for name in rec.dtype.names or ()}


def log_uniform(rng: np.random.Generator, lo: float, hi: float, n: int) -> np.ndarray:
    """Integers log-uniform in [lo, hi]."""
    return np.rint(np.exp(rng.uniform(np.log(lo), np.log(hi), n)))


def gemm_inputs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    return tuple(log_uniform(rng, 1.0, 65536.0, n) for _ in range(3))


def collective_inputs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    codes = np.array([code for _, code in COLLECTIVES], dtype=np.int64)
    op = codes[rng.integers(0, codes.shape[0], n)]
    size = 2.0 ** rng.integers(1, 13, n)  # 2 .. 4096
    stride = rng.integers(1, 9, n).astype(np.float64)  # 1 .. 8
    size_bytes = log_uniform(rng, KIB, 16 * GIB, n)
    return op, size, stride, size_bytes


def best_of(fn: Callable[[], np.ndarray], repeats: int = REPEATS) -> tuple[float, np.ndarray]:
    best, out = float("inf"), np.empty(0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(name: str, kernel: Callable[[int], np.ndarray], reference: Callable[[int], tuple[list[float], float]],
            n: int, ref_n: int) -> dict[str, float | str | int]:
    """Warm-up, best-of-3 kernel timing over n rows, the reference over the first ref_n, agreement check."""
    t0 = time.perf_counter()
    kernel(min(n, 16))
    compile_s = time.perf_counter() - t0
    kernel_s, got = best_of(lambda: kernel(n))
    want, ref_s = reference(ref_n)
    want_arr = np.asarray(want, dtype=np.float64)
    sub = got[:ref_n]
    if not np.allclose(sub, want_arr, rtol=RTOL, atol=0.0):
        bad = np.flatnonzero(~np.isclose(sub, want_arr, rtol=RTOL, atol=0.0))
        i = int(bad[0])
        raise RuntimeError(f"{name}: kernel and plain-Python reference disagree on {bad.size} of {ref_n} rows "
                           f"(rtol {RTOL}); first at row {i}: kernel {sub[i]!r}, reference {want_arr[i]!r}")
    scale = np.where(want_arr != 0.0, np.abs(want_arr), 1.0)
    worst = float(np.max(np.abs(sub - want_arr) / scale)) if ref_n else 0.0
    return {"kernel": name, "n": n, "ref_n": ref_n, "compile_s": compile_s, "kernel_s": kernel_s, "ref_s": ref_s,
            "kernel_rate": n / kernel_s, "ref_rate": ref_n / ref_s, "worst_rel": worst}


def main(argv: Sequence[str] | None = None) -> list[dict[str, float | str | int]]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="random inputs per kernel")
    ap.add_argument("--ref-n", type=int, default=20_000, help="of those, rows evaluated by the plain-Python reference")
    args = ap.parse_args(argv)
    if args.n < 1 or not 1 <= args.ref_n <= args.n:
        ap.error("need 1 <= --ref-n <= --n")
    n, ref_n = args.n, args.ref_n

    device, tiers, tiles = pack_hardware(load_hardware(HARDWARE), DTYPE)
    tiers["allreduce_algorithm"] = ALLREDUCE_AUTO  # ring and tree both evaluated
    dtype_bytes = ACT_BYTES  # bf16 operands
    dev_ref, tiers_ref, tiles_ref = plain_fields(device), naive.tier_list(tiers), naive.tile_list(tiles)

    rng = np.random.default_rng(0)
    gm, gn, gk = gemm_inputs(rng, n)
    op, size, stride, size_bytes = collective_inputs(rng, n)

    def gemm_kernel(rows: int) -> np.ndarray:
        return gemm_rows(gm[:rows], gn[:rows], gk[:rows], device, tiles, dtype_bytes)

    def gemm_reference(rows: int) -> tuple[list[float], float]:
        ms, ns, ks = gm[:rows].tolist(), gn[:rows].tolist(), gk[:rows].tolist()
        t0 = time.perf_counter()
        out = [naive.gemm_time_s(a, b, c, dev_ref, tiles_ref, dtype_bytes) for a, b, c in zip(ms, ns, ks)]
        return out, time.perf_counter() - t0

    def collective_kernel(rows: int) -> np.ndarray:
        return collective_rows(op[:rows], size[:rows], stride[:rows], size_bytes[:rows], tiers)

    by_op: dict[str, tuple[int, float]] = {}  # plain-Python (rows, seconds) per collective

    def collective_reference(rows: int) -> tuple[list[float], float]:
        """Timed op by op (the send/recv reference walks every neighbour hop and
        dominates); the values go back in row order."""
        out = [0.0] * rows
        for name, code in COLLECTIVES:
            idx = np.flatnonzero(op[:rows] == code)
            cols = idx.tolist(), size[idx].tolist(), stride[idx].tolist(), size_bytes[idx].tolist()
            t0 = time.perf_counter()
            vals = [naive.collective_time_s(code, s, st, b, tiers_ref) for _, s, st, b in zip(*cols)]
            by_op[name] = (idx.size, time.perf_counter() - t0)
            for i, v in zip(cols[0], vals):
                out[i] = v
        return out, sum(sec for _, sec in by_op.values())

    results = [measure("gemm_time_s", gemm_kernel, gemm_reference, n, ref_n),
               measure("collective_time_s", collective_kernel, collective_reference, n, ref_n)]

    print(f"hardware {HARDWARE} ({DTYPE}), {len(tiles)} GEMM tiles, {len(tiers)} link tiers (all-reduce auto); "
          f"numba threads: {numba.get_num_threads()}")
    print(f"kernel: best of {REPEATS} after a warm-up call (JIT s: that call, compile or cache load); "
          f"plain Python: first {ref_n:,} rows, once; agreement rtol {RTOL:g}")
    header = (f"{'kernel':<18} {'n inputs':>10} {'kernel evals/s':>15} {'plain-Python evals/s':>21} {'ratio':>8}"
              f" {'kernel s':>9} {'JIT s':>6} {'worst rel':>9}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['kernel']:<18} {r['n']:>10,} {r['kernel_rate']:>15,.0f} {r['ref_rate']:>21,.0f} "
              f"{r['kernel_rate'] / r['ref_rate']:>7,.0f}x {r['kernel_s']:>9.4f} {r['compile_s']:>6.2f} "
              f"{r['worst_rel']:>9.1e}")
    print("plain-Python collective_time_s by op (evals/s): " + ", ".join(
        f"{name} {rows / sec:,.0f}" for name, (rows, sec) in by_op.items() if rows and sec > 0))
    return results


if __name__ == "__main__":
    main()
