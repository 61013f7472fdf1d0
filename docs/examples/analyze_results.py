"""Notebook-style analysis of a sweep with ``paraspace.results`` (run it as a script, or cell by
cell in Jupyter / VS Code: each ``# %%`` starts a cell).

    paraspace sweep docs/examples/my-space.toml --out results/my-space.parquet
    python docs/examples/analyze_results.py results/my-space.parquet
"""

# %% Load: a polars LazyFrame over the file (or a folder of shards), checked to hold one space
import sys

import polars as pl

from paraspace.results import load, pareto, read_metadata, top

path = sys.argv[1] if len(sys.argv) > 1 else "results/my-space.parquet"
frame = load(path)
GIB = 1024**3
n_rows, n_feasible = frame.select(pl.len(), pl.col("feasible").sum()).collect().row(0)
print(f"{path}: {n_rows} candidates, {n_feasible} fit in memory")

# %% The best configuration that fits, in words
best = top(path, 1).row(0, named=True)
print(f"fastest that fits: row_id {best['row_id']}: tp={best['tp']} pp={best['pp']} dp={best['dp']} "
      f"micro_batch={best['micro_batch']} recompute={best['recompute']}, step {best['step_time_s']:.3f} s "
      f"(80% band {best['step_time_lo_s']:.3f}-{best['step_time_hi_s']:.3f} s), MFU {100 * best['mfu']:.1f}%, "
      f"{best['mem_peak_bytes'] / GIB:.1f} GiB")

# %% Best step time per tensor-parallel size: how much does each tp cost?
by_tp = (frame.filter(pl.col("feasible"))
         .group_by("tp").agg(pl.col("step_time_s").min().alias("best_step_s"),
                             (pl.col("mem_peak_bytes").min() / GIB).round(1).alias("least_mem_GiB"))
         .sort("tp").collect())
print("best step time per tp:")
for row in by_tp.iter_rows(named=True):
    print(f"  tp={row['tp']}: {row['best_step_s']:.3f} s, least memory {row['least_mem_GiB']} GiB")

# %% Where the time goes in the best row: the closed-form breakdown adds up to step_time_analytic_s
parts = ("compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s")
print("breakdown of the best row: " + ", ".join(f"{p} {best[p]:.3f}" for p in parts)
      + f" (of {best['step_time_analytic_s']:.3f} s)")

# %% The trade-off between step time and memory, and where the numbers came from
front = pareto(path, "step_time_s", "mem_peak_bytes")
print(f"{front.height} configurations on the step time / memory front")
print("written by paraspace", read_metadata(path)["paraspace.version"])
