"""Sweep throughput end to end (rows/s including Parquet writing): one process,
two local processes (shards), and a Dask LocalCluster of two workers.

    python bench/bench_scaleout.py [--space NAME] [--shards 4]

One run, the same space for all three; the numba cache is warmed first so no
variant pays compilation. On this 2-core machine numba already spreads one
process over both cores, so extra processes mostly add overhead: the figure
to watch is the cluster's overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paraspace.explorer.distributed import run_on_dask  # noqa: E402
from paraspace.explorer.sweep import run_sweep  # noqa: E402
from paraspace.spaces.catalog import load_space  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="llama3-70b-h100-1024")
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    space = load_space(args.space)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        run_sweep(space, out / "warm.parquet", progress=False)  # compile / load the cache
        t0 = time.perf_counter()
        summary = run_sweep(space, out / "one.parquet", progress=False)
        one = time.perf_counter() - t0
        rows = summary.n_rows

        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "paraspace.explorer.cli", "sweep", args.space, "--shard",
                                   f"{i}/2", "--out", str(out / f"two-{i}.parquet"), "--no-progress", "-n", "0"],
                                  cwd=ROOT, stdout=subprocess.DEVNULL) for i in range(2)]
        assert all(p.wait() == 0 for p in procs)
        two = time.perf_counter() - t0

        t0 = time.perf_counter()
        run_on_dask(space, out / "dask", "local", args.shards)
        dask_s = time.perf_counter() - t0
    print(f"{args.space}: {rows:,} candidates per sweep (incl. the event tier and Parquet writing)")
    print(f"  1 process:                 {one:6.2f} s  {rows / one:10,.0f} rows/s")
    print(f"  2 processes (--shard I/2): {two:6.2f} s  {rows / two:10,.0f} rows/s  ({one / two:.2f}x)")
    print(f"  Dask LocalCluster, 2 workers, {args.shards} shards: {dask_s:6.2f} s  {rows / dask_s:10,.0f} rows/s  "
          f"({one / dask_s:.2f}x, cluster start included)")


if __name__ == "__main__":
    main()
