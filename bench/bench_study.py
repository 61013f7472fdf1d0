"""How close an Optuna study gets to the exhaustive sweep's best, and its throughput.

    python bench/bench_study.py [--space NAME] [--trials 100 300 1000]

One run: the exhaustive sweep's best feasible step time, then for each budget
a fresh TPE study (and a random-sampler baseline) of that many trials in an
in-memory storage: best-found / true optimum, and trials per second with
batched ask/tell (64 per batch) against one trial per batch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import optuna
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paraspace.explorer.study import run_study  # noqa: E402
from paraspace.explorer.sweep import run_sweep  # noqa: E402
from paraspace.spaces.catalog import load_space  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="llama3-70b-h100-1024")
    ap.add_argument("--trials", type=int, nargs="+", default=[100, 300, 1000])
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(args.space)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        summary = run_sweep(space, out / "sweep.parquet", progress=False)
        optimum = pl.read_parquet(summary.path).filter(pl.col("feasible"))["step_time_s"].min()
        print(f"{args.space}: exhaustive best {optimum:.4f} s over {summary.n_rows:,} candidates "
              f"({summary.seconds:.1f} s)")
        for n in args.trials:
            for sampler in ("tpe", "random"):
                t0 = time.perf_counter()
                res = run_study(space, n_trials=n, out_dir=out / f"{sampler}-{n}", sampler=sampler,
                                objective="time", seed=0)
                dt = time.perf_counter() - t0
                best = res.best[0]["step_time_s"] if res.best else float("nan")
                print(f"  {sampler:<6} {n:>5} trials: best {best:.4f} s = {best / optimum:.3f} x optimum, "
                      f"{n / dt:,.0f} trials/s")
        t0 = time.perf_counter()
        run_study(space, n_trials=128, out_dir=out / "one", batch=1, seed=0)
        one = 128 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_study(space, n_trials=128, out_dir=out / "batched", batch=64, seed=0)
        batched = 128 / (time.perf_counter() - t0)
        print(f"  ask/tell: batched (64) {batched:,.0f} trials/s vs one at a time {one:,.0f} trials/s: "
              f"{batched / one:.1f}x")


if __name__ == "__main__":
    main()
