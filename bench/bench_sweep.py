"""Throughput of the encoder, the analytic tier, the event tier and a whole sweep,
each beside a plain-Python (or plain-numpy) reference measured in the same run.

    python bench/bench_sweep.py [--space PATH] [--sample N] [--sim-sample N]

One line per figure, the ratio and the worst disagreement beside it:

- encoder: ``Encoder.chunks`` (valid combinations enumerated block by block)
  against ``spaces.encode.encode_by_filter`` (every combination of the product
  built and filtered), chunk by chunk over the whole space; the rows, their
  columns and the per-reason counts must be identical.
- analytic tier: ``explorer.evaluate.evaluate`` (no simulation) on every
  candidate against ``tests/naive.py``'s ``evaluate_one`` on a random sample
  of all candidates (host offload and last-k recompute included); worst
  relative disagreement of the step time and of the peak memory, and the rows
  whose feasibility or reason differs.
- event tier: ``evaluate`` on the candidates a sweep simulates (the best
  ``DEFAULT_SIMULATE_TOP`` by analytic step time, as ``best_analytic`` picks
  them) against a sample of the same rows whose task graphs
  (``kernels.event_tier.row_graph``) run through ``tests/naive_engine.py``'s
  ``simulate``; worst step time disagreement, and whether every device's
  compute order is ``naive_engine.compute_order``'s.
- end to end: ``run_sweep`` to Parquet.

The default space (bench/spaces/gpt3-175b-a100-18432-wide.toml: 7,962,624
combinations, 1,081,452 candidates) is the large one; Calculon's problem is
bench/spaces/gpt3-175b-a100-512-calculon.toml.
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

from paraspace.explorer.evaluate import DEFAULT_MAX_TASKS, evaluate, kernel_strategy, pack, simulable  # noqa: E402
from paraspace.explorer.sweep import DEFAULT_SIMULATE_TOP, best_analytic, run_sweep  # noqa: E402
from paraspace.kernels.event_tier import DEFAULT_BUCKETS, row_graph  # noqa: E402
from paraspace.kernels.pipeline import streams_per_device  # noqa: E402
from paraspace.spaces.catalog import load_space  # noqa: E402
from paraspace.spaces.encode import Encoded, Encoder, encode_by_filter  # noqa: E402
from paraspace.spaces.enums import Schedule  # noqa: E402
from tests import naive, naive_engine  # noqa: E402

DEFAULT_SPACE = ROOT / "bench" / "spaces" / "gpt3-175b-a100-18432-wide.toml"
CHUNK = 1 << 20
#: encoder timings taken (the best is reported)
ENCODE_REPEATS = 5
#: naive.evaluate_one's strategy keys and the encoder's columns they read
NAIVE_KEYS = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "vpp": "vpp", "mb": "micro_batch",
              "recompute": "recompute", "sp": "sequence_parallel", "tpo": "tp_overlap", "zero": "zero",
              "opt": "optimizer", "schedule": "schedule", "rc_layers": "recompute_layers",
              "off_act": "offload_activations", "off_w": "offload_weights", "defer": "defer_grad_sync",
              "n_micro": "n_microbatches"}
#: schedules whose compute order naive_engine.compute_order writes
ORDERED = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)


def same_encoding(got: Encoded, want: Encoded) -> bool:
    """Identical columns (names, dtypes, values, order) and per-reason counts."""
    return (list(got.columns) == list(want.columns)
            and all(got.columns[k].dtype == c.dtype and np.array_equal(got.columns[k], c)
                    for k, c in want.columns.items())
            and got.n_combinations == want.n_combinations
            and np.array_equal(got.first_reason, want.first_reason) and np.array_equal(got.breaks, want.breaks))


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a)


def pass_order(g, device: int, n_tiers: int) -> list[tuple[int, int, int]]:
    """A device's compute-stream order in a task graph as (pass F=0 / B=1, chunk,
    micro-batch), the pieces of one pass merged."""
    dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = g
    r = device * streams_per_device(n_tiers)
    seen: list[tuple[int, int, int]] = []
    for task in order_idx[order_ptr[r]:order_ptr[r + 1]]:
        if kind[task] in (naive_engine.F, naive_engine.B):  # kernels.engine K_FORWARD, K_BACKWARD
            key = (int(kind[task]), int(chunk[task]), int(micro[task]))
            if not seen or seen[-1] != key:
                seen.append(key)
    return seen


def naive_step_s(g) -> float:
    """The graph's step time by the plain-Python engine."""
    dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = g
    edges = [(a, int(succ_idx[e])) for a in range(dur.shape[0]) for e in range(succ_ptr[a], succ_ptr[a + 1])]
    orders = [order_idx[order_ptr[r]:order_ptr[r + 1]].tolist() for r in range(n_res)]
    status, _, ends = naive_engine.simulate(dur.tolist(), res.tolist(), kind.tolist(), sync.tolist(), edges, orders)
    if status != naive_engine.OK:
        raise RuntimeError("the reference engine deadlocked on a graph the kernel simulated")
    return max(ends) / 1e9


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=str(DEFAULT_SPACE))
    ap.add_argument("--sample", type=int, default=500, help="rows evaluated by the plain-Python analytic reference")
    ap.add_argument("--sim-sample", type=int, default=40, help="rows simulated by the plain-Python event engine")
    args = ap.parse_args(argv)

    space = load_space(args.space)
    unmodelled = sorted(set(space.spec.dimensions.schedule) - {"gpipe", "1f1b", "interleaved", "zb-h1"})
    if space.model.moe is not None or unmodelled:
        ap.error(f"{args.space}: the plain-Python reference models dense models under GPipe, 1F1B, interleaved "
                 f"and ZB-H1 (this space has {'an MoE model' if space.model.moe is not None else unmodelled})")
    encoder = Encoder(space)
    packed = pack(space)
    model, dev, work = naive.fields(packed.model), naive.fields(packed.device), naive.fields(packed.workload)
    tiers, tiles = naive.tier_list(packed.tiers), naive.tile_list(packed.tiles)
    n_tiers = packed.tiers.shape[0]
    rng = np.random.default_rng(0)

    # JIT: the first call compiles or loads both tiers from the cache; reported separately
    t0 = time.perf_counter()
    evaluate(packed, encoder.encode(0, 1000).columns)
    jit_s = time.perf_counter() - t0

    # ---- encoder: block by block against filtering the full product, chunk by chunk
    encode_s = float("inf")
    for _ in range(ENCODE_REPEATS):  # a run is tens of ms: the best of a few, as timeit does
        t0 = time.perf_counter()
        chunks = list(encoder.chunks(CHUNK))
        encode_s = min(encode_s, time.perf_counter() - t0)
    n_comb = sum(c.n_combinations for c in chunks)
    n_rows = sum(c.n_rows for c in chunks)
    filter_s = 0.0
    identical = True
    for k, enc in enumerate(chunks):
        ids = np.arange(k * CHUNK, k * CHUNK + enc.n_combinations, dtype=np.int64)
        t0 = time.perf_counter()
        ref_enc = encode_by_filter(encoder, ids)
        filter_s += time.perf_counter() - t0
        identical &= same_encoding(enc, ref_enc)
        del ref_enc

    # ---- analytic tier on every candidate; the reference on a sample of all of them
    t0 = time.perf_counter()
    outs = [evaluate(packed, c.columns, simulate=False) for c in chunks]
    eval_s = time.perf_counter() - t0
    cols = {k: np.concatenate([c.columns[k] for c in chunks]) for k in chunks[0].columns}
    got = {k: np.concatenate([o[k] for o in outs]) for k in ("step_time_analytic_s", "mem_peak_bytes", "feasible",
                                                            "infeasible_reason")}
    del outs
    idx = rng.choice(n_rows, size=min(args.sample, n_rows), replace=False)
    t0 = time.perf_counter()
    ref = [naive.evaluate_one({k: int(cols[c][i]) for k, c in NAIVE_KEYS.items()}, model, dev, tiers, tiles, work)
           for i in idx]
    naive_s = time.perf_counter() - t0
    worst_step = max(rel(got["step_time_analytic_s"][i], r["step_time_analytic_s"]) for r, i in zip(ref, idx))
    worst_mem = max(rel(got["mem_peak_bytes"][i], r["mem_peak_bytes"]) for r, i in zip(ref, idx))
    feas_diff = sum(got["feasible"][i] != r["feasible"] or got["infeasible_reason"][i] != r["infeasible_reason"]
                    for r, i in zip(ref, idx))
    n_new = int(np.count_nonzero((cols["offload_activations"][idx] != 0) | (cols["offload_weights"][idx] != 0)
                                 | (cols["recompute_layers"][idx] != 0)))

    # ---- event tier on the rows a sweep simulates; the reference engine on a sample of them
    only = best_analytic(encoder, packed, DEFAULT_SIMULATE_TOP, chunk_rows=CHUNK, start=0,
                         stop=encoder.n_combinations, max_tasks=DEFAULT_MAX_TASKS)
    chosen = np.isin(cols["row_id"], only) if only is not None else simulable(cols, got)
    best = {k: v[chosen] for k, v in cols.items()}
    n_best = int(chosen.sum())
    t0 = time.perf_counter()
    sim = evaluate(packed, best)
    event_s = time.perf_counter() - t0
    n_simulated = int(sim["simulated"].sum())
    sim_idx = rng.choice(n_best, size=min(args.sim_sample, n_best), replace=False)
    worst_sim = 0.0
    orders_checked = orders_same = 0
    t0 = time.perf_counter()
    for i in sim_idx:
        g = row_graph(*kernel_strategy({k: v[i] for k, v in best.items()}), packed.model[0], packed.device[0],
                      packed.tiers, packed.tiles, packed.workload[0], DEFAULT_BUCKETS)
        worst_sim = max(worst_sim, rel(sim["step_time_s"][i], naive_step_s(g)))
        schedule = int(best["schedule"][i])
        if schedule in ORDERED:
            p, m = int(best["pp"][i]), int(best["n_microbatches"][i])
            v = int(best["vpp"][i]) if schedule == Schedule.INTERLEAVED else 1
            orders_checked += 1
            orders_same += all(pass_order(g, d, n_tiers) == naive_engine.compute_order(schedule, p, v, m, d)
                               for d in range(p))
    ref_event_s = time.perf_counter() - t0

    # ---- end to end
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary = run_sweep(space, Path(tmp) / "bench.parquet", chunk_rows=CHUNK, progress=False)
        sweep_s = time.perf_counter() - t0
        size = summary.path.stat().st_size

    enc_rate, filter_rate = n_comb / encode_s, n_comb / filter_s
    eval_rate, naive_rate = n_rows / eval_s, len(idx) / naive_s
    event_rate, ref_event_rate = n_best / event_s, len(sim_idx) / ref_event_s
    print(f"space     {space.spec.name}: {n_comb:,} combinations, {n_rows:,} candidates; "
          f"JIT compile/load (first call) {jit_s:.1f} s")
    print(f"encoder   Encoder.chunks {enc_rate:,.0f} comb/s = {n_rows / encode_s:,.0f} valid/s (best of "
          f"{ENCODE_REPEATS}, {encode_s:.3f} s) | encode_by_filter {filter_rate:,.0f} "
          f"comb/s ({filter_s:.2f} s) | {enc_rate / filter_rate:,.1f}x | rows and reason counts identical: "
          f"{'yes' if identical else 'NO'}")
    print(f"analytic  numba {eval_rate:,.0f} cand/s ({eval_s:.2f} s, all) | naive.py {naive_rate:,.0f} cand/s "
          f"({len(idx)} of all, {n_new} with offload or last-k) | {eval_rate / naive_rate:,.0f}x | worst rel. diff "
          f"step {worst_step:.1e}, memory {worst_mem:.1e}, feasibility differs {feas_diff}/{len(idx)}")
    print(f"event     numba {event_rate:,.0f} conf/s ({event_s:.2f} s, best {n_best:,}, {n_simulated:,} simulated) | "
          f"naive_engine {ref_event_rate:,.1f} conf/s ({len(sim_idx)} of them) | {event_rate / ref_event_rate:,.0f}x | "
          f"worst rel. diff step {worst_sim:.1e}, compute orders equal {orders_same}/{orders_checked}")
    print(f"sweep     run_sweep to Parquet (encode, both tiers, write) {sweep_s:.2f} s, "
          f"{n_rows / sweep_s:,.0f} cand/s, {size / 2**20:.1f} MiB")
    print(f"peak RSS  {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:,.0f} MiB "
          "(holds every chunk for the reference checks)")


if __name__ == "__main__":
    main()
