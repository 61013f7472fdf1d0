"""Event-tier throughput: simulated configurations and events per second.

    python bench/bench_engine.py [--rows N] [--reference K]

The issue's reference size: p = 8 stages, v = 2 interleaved chunks, m = 32
micro-batches, with data-parallel overlap on (ZeRO-0/1/2 bucketed reduction,
ZeRO-1/2 bucketed gathers), Llama 3 70B on 1024 H100 (tp 8, dp 16). Rows vary
recompute, sequence parallelism and ZeRO stage. Measured in one run: the
numba event tier over all rows (graph build + simulation + metrics, parallel
over rows), and the plain-Python heapq engine (tests/naive_engine.py) on the
same graphs for K rows, simulation only, so the ratio flatters the reference.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paraspace.explorer.evaluate import kernel_strategy, pack  # noqa: E402
from paraspace.spaces.enums import Dispatch  # noqa: E402
from paraspace.kernels.event_tier import S_STEP, S_TASKS, row_graph, simulate_rows  # noqa: E402
from paraspace.spaces.catalog import load_space  # noqa: E402
from tests import naive_engine  # noqa: E402



def rows(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    full = {"tp": 8, "pp": 8, "dp": 16, "cp": 1, "vpp": 2, "micro_batch": 1, "schedule": 2, "n_microbatches": 32}
    cols = {k: np.full(n, v, dtype=np.int8 if k == "schedule" else np.int32) for k, v in full.items()}
    cols["recompute"] = rng.integers(0, 3, n).astype(np.int8)
    cols["sequence_parallel"] = rng.integers(0, 2, n).astype(np.int8)
    cols["tp_overlap"] = (cols["sequence_parallel"] * rng.integers(0, 2, n)).astype(np.int8)
    cols["zero"] = rng.integers(0, 3, n).astype(np.int8)
    cols["optimizer"] = np.zeros(n, dtype=np.int8)
    # the dimensions this bench does not vary, at their defaults (spaces.schema.Dimensions)
    for name, value in (("ep", 1), ("expert_tp", 1), ("recompute_layers", 0)):
        cols[name] = np.full(n, value, dtype=np.int32)
    alltoall = int(Dispatch.ALLTOALL)
    for name, value in (("ep_placement", 0), ("dispatch", alltoall), ("tbo", 0), ("offload_activations", 0),
                        ("offload_weights", 0)):
        cols[name] = np.full(n, value, dtype=np.int8)
    return cols


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--reference", type=int, default=20, help="rows simulated by the plain-Python engine")
    args = ap.parse_args(argv)
    space = load_space("llama3-70b-h100-1024")
    pk = pack(space)
    records = (pk.model, pk.device, pk.tiers, pk.tiles, pk.workload)
    cols = rows(args.rows)
    strategy = list(kernel_strategy(cols))
    n = args.rows

    def run(k: int) -> np.ndarray:
        ones = np.ones(k)
        return simulate_rows(*[a[:k] for a in strategy], *records, np.ones(k, bool), ones, ones.copy(),
                             ones.copy(), 4)

    t0 = time.perf_counter()
    run(4)
    jit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = run(n)
    sim_s = time.perf_counter() - t0
    events = out[:, S_TASKS].sum()

    # the plain-Python engine on the same graphs (built by the kernels; simulation only)
    t_ref = 0.0
    worst = 0.0
    for i in range(args.reference):
        g = row_graph(*[int(a[i]) for a in strategy], pk.model[0], pk.device[0], pk.tiers, pk.tiles,
                      pk.workload[0], 4)
        dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = g
        edges = [(a, int(succ_idx[e])) for a in range(dur.shape[0]) for e in range(succ_ptr[a], succ_ptr[a + 1])]
        orders = [order_idx[order_ptr[r]:order_ptr[r + 1]].tolist() for r in range(n_res)]
        args_ref = (dur.tolist(), res.tolist(), kind.tolist(), sync.tolist(), edges, orders)
        t0 = time.perf_counter()
        status, _, ends = naive_engine.simulate(*args_ref)
        t_ref += time.perf_counter() - t0
        worst = max(worst, abs(max(ends) / 1e9 - out[i, S_STEP]))
    ref_rate = args.reference / t_ref
    rate = n / sim_s
    print(f"configuration: p=8 v=2 m=32, DP overlap on; {out[:, S_TASKS].mean():,.0f} tasks per configuration")
    print(f"JIT compile/load (first call): {jit_s:.2f} s")
    print(f"numba event tier: {n:,} configurations in {sim_s:.3f} s = {rate:,.0f} configurations/s, "
          f"{events / sim_s:,.0f} events/s (build + simulate + metrics, 2 cores)")
    print(f"plain-Python heapq engine: {ref_rate:,.1f} configurations/s (simulation only, {args.reference} rows)")
    print(f"ratio: {rate / ref_rate:,.0f}x   (step times agree to {worst:.1e} s)")


if __name__ == "__main__":
    main()
