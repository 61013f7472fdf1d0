"""Throughput of encoding and of the analytic tier, against a plain-Python reference.

    python bench/bench_sweep.py [--space PATH] [--sample N]

Encodes and evaluates a space of over a million candidates
(bench/spaces/gpt3-175b-a100-18432-wide.toml: 7,962,624 combinations,
1,081,452 candidates), then evaluates a random sample of the same rows with
the plain-Python reference ``tests/naive.py`` in the same run and prints the
ratio. Also times the whole sweep to Parquet and reports peak RSS, which
stays flat because the sweep streams chunk by chunk.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paraspace.explorer.evaluate import DEFAULT_MAX_TASKS, evaluate, pack  # noqa: E402
from paraspace.explorer.sweep import DEFAULT_SIMULATE_TOP, best_analytic, run_sweep  # noqa: E402
from paraspace.kernels.training import OUTPUTS  # noqa: E402
from paraspace.spaces.catalog import load_space  # noqa: E402
from paraspace.spaces.encode import Encoder  # noqa: E402
from tests import naive  # noqa: E402

DEFAULT_SPACE = ROOT / "bench" / "spaces" / "gpt3-175b-a100-18432-wide.toml"
CHUNK = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=str(DEFAULT_SPACE))
    ap.add_argument("--sample", type=int, default=500, help="rows evaluated by the plain-Python reference")
    args = ap.parse_args()

    space = load_space(args.space)
    encoder = Encoder(space)
    packed = pack(space)

    # JIT: first call compiles or loads the cache; reported separately
    t0 = time.perf_counter()
    evaluate(packed, encoder.encode(0, 1000).columns)
    jit_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    chunks = list(encoder.chunks(CHUNK))
    encode_s = time.perf_counter() - t0
    n_comb = sum(c.n_combinations for c in chunks)
    n_rows = sum(c.n_rows for c in chunks)

    t0 = time.perf_counter()
    outs = [evaluate(packed, c.columns, simulate=False) for c in chunks]
    eval_s = time.perf_counter() - t0
    only = best_analytic(encoder, packed, DEFAULT_SIMULATE_TOP, chunk_rows=CHUNK, start=0,
                         stop=encoder.n_combinations, max_tasks=DEFAULT_MAX_TASKS)
    t0 = time.perf_counter()
    simulated = sum(int(evaluate(packed, c.columns, only=only)["simulated"].sum()) for c in chunks)
    both_s = time.perf_counter() - t0

    # plain-Python reference on a random sample of the same candidates
    cols = {k: np.concatenate([c.columns[k] for c in chunks]) for k in chunks[0].columns}
    got = {k: np.concatenate([o[k] for o in outs]) for k in OUTPUTS}
    rng = np.random.default_rng(0)
    # the reference implements every dimension but host offload and last-k-layer recompute:
    # it is compared only on the rows it covers, and the rest are counted, so the ratio
    # and the disagreement are like for like
    covered = np.flatnonzero((cols["offload_activations"] == 0) & (cols["offload_weights"] == 0)
                             & (cols["recompute_layers"] == 0))
    idx = rng.choice(covered, size=min(args.sample, covered.size), replace=False)
    model, dev, work = naive.fields(packed.model), naive.fields(packed.device), naive.fields(packed.workload)
    tiers, tiles = naive.tier_list(packed.tiers), naive.tile_list(packed.tiles)
    keys = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "vpp": "vpp", "mb": "micro_batch",
            "recompute": "recompute", "sp": "sequence_parallel", "tpo": "tp_overlap", "zero": "zero", "opt": "optimizer",
            "schedule": "schedule",
            "n_micro": "n_microbatches"}
    t0 = time.perf_counter()
    ref = [naive.evaluate_one({k: int(cols[c][i]) for k, c in keys.items()}, model, dev, tiers, tiles, work)
           for i in idx]
    naive_s = time.perf_counter() - t0
    worst = max(abs(r["step_time_analytic_s"] - got["step_time_analytic_s"][i]) / r["step_time_analytic_s"]
                for r, i in zip(ref, idx))

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary = run_sweep(space, Path(tmp) / "bench.parquet", chunk_rows=CHUNK, progress=False)
        sweep_s = time.perf_counter() - t0
        size = summary.path.stat().st_size

    numba_rate = n_rows / eval_s
    naive_rate = len(idx) / naive_s
    print(f"space: {space.spec.name}: {n_comb:,} combinations, {n_rows:,} candidates")
    print(f"JIT compile/load (first call):  {jit_s:8.2f} s")
    print(f"encode:   {encode_s:7.3f} s  {n_comb / encode_s:14,.0f} combinations/s  {n_rows / encode_s:12,.0f} candidates/s")
    print(f"evaluate: {eval_s:7.3f} s  {numba_rate:14,.0f} candidates/s (analytic tier, numba, parallel)")
    print(f"analytic + event tier: {both_s:7.3f} s  {n_rows / both_s:,.0f} candidates/s "
          f"({simulated:,} simulated: the best {DEFAULT_SIMULATE_TOP:,} feasible by analytic step time)")
    print(f"reference:{naive_s:7.3f} s  {naive_rate:14,.0f} candidates/s (plain Python, {len(idx)} sampled rows; "
          f"{n_rows - covered.size:,} candidates use host offload or last-k recompute, outside it, not sampled)")
    print(f"ratio numba / plain Python: {numba_rate / naive_rate:,.0f}x   (worst step_time_analytic_s disagreement "
          f"on the sample: {worst:.1e})")
    print(f"sweep to Parquet (encode + both tiers + write): {sweep_s:.2f} s, {n_rows / sweep_s:,.0f} candidates/s, "
          f"{size / 2**20:.1f} MiB file")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:,.0f} MiB "
          "(includes holding every chunk for the reference check above)")


if __name__ == "__main__":
    main()
