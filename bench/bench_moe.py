"""Analytic-tier rate of MoE rows against dense rows, measured in one run.

    python bench/bench_moe.py [--rows N]

Encodes the MoE space deepseek-v3-br166 (MLA attention, 256 experts, five
dispatch algorithms, two-batch overlap) and the dense default space
llama3-70b-h100-1024, tiles each space's candidates to the same number of
rows, and times ``explorer.evaluate.evaluate`` (analytic tier, all cores) on
both, best of 3 after a warm-up call. Issue 5 asks that MoE rows evaluate at
no worse than a third of the dense rows' rate.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paraspace.explorer.evaluate import evaluate, pack  # noqa: E402
from paraspace.spaces.catalog import load_space  # noqa: E402
from paraspace.spaces.encode import Encoder  # noqa: E402

SPACES = (("dense", "llama3-70b-h100-1024"), ("moe", "deepseek-v3-br166"))


def tiled(columns: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    reps = -(-n // len(columns["row_id"]))
    return {k: np.ascontiguousarray(np.tile(v, reps)[:n]) for k, v in columns.items()}


def rate(space_name: str, n: int) -> tuple[float, float, int]:
    space = load_space(space_name)
    cols = tiled(Encoder(space).encode_all().columns, n)
    packed = pack(space)
    t0 = time.perf_counter()
    evaluate(packed, {k: v[:100] for k, v in cols.items()}, simulate=False)
    jit_s = time.perf_counter() - t0
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        evaluate(packed, cols, simulate=False)
        best = min(best, time.perf_counter() - t0)
    return n / best, jit_s, len(cols["row_id"])


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    print(f"analytic tier, {args.rows:,} rows per space, best of 3, numba threads: {numba.get_num_threads()}")
    rates = {}
    for kind, name in SPACES:
        per_s, jit_s, n = rate(name, args.rows)
        rates[kind] = per_s
        print(f"{kind:<6} {name:<24} {per_s:>14,.0f} rows/s   (warm-up {jit_s:.2f} s)")
    ratio = rates["moe"] / rates["dense"]
    print(f"MoE / dense rate: {ratio:.2f} (target >= 0.33)")
    return {**rates, "ratio": ratio}


if __name__ == "__main__":
    main()
