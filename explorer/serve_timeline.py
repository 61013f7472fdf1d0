"""``paraspace trace`` on a serving space: one deployment's simulated run, kept.

The deployment is the space narrowed by ``--set`` (each given dimension to one
value); of the candidates left, the first of the analytic ranking (feasible,
then throughput per GPU, then TTFT). It runs through the same simulation as
``paraspace serve`` (``explorer.serve.sim_inputs``), once more with the event
log on (``kernels.serving_sim.LOG_COLUMNS``, its rows counted by the first
run), and ``results.serving_trace`` writes the log as a Perfetto trace. An
aggregated deployment whose users do not split evenly over its engines
(``kernels.serving.engine_users``) is traced on one of its busier engines.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np

from paraspace.explorer import serve
from paraspace.kernels import serving_sim as ss
from paraspace.results.serving_trace import ServingTimeline
from paraspace.spaces import serving as sp
from paraspace.spaces.enums import Dtype, label
from paraspace.spaces.errors import CatalogError

#: links with no latency and no bandwidth limit: the EP slices are the MoE time the real links add
IDEAL_BYTES_PER_S = 1e30


def _code(space: sp.LoadedServing, name: str, value: Any) -> int:
    """A ``--set`` value (int, bool or label) as the encoded column holds it; a clear error when
    the space lacks it."""
    allowed = list(getattr(space.spec.dimensions, name))
    for i, v in enumerate(allowed):
        if isinstance(v, bool) == isinstance(value, bool) and (v == value if not isinstance(v, str) else v == str(value)):
            return int(sp.dimension_values(space)[name][i])
    raise CatalogError("command line", f"--set {name}", value, f"one of the space's values {allowed}")


def pick_row(space: sp.LoadedServing, strategy: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the columns, the analytic metrics) of the one candidate the trace runs (module doc)."""
    for key in strategy:
        if key not in sp.DIMENSIONS:
            close = difflib.get_close_matches(key, sp.DIMENSIONS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise CatalogError("command line", "--set", key, f"KEY=VALUE with KEY one of {', '.join(sp.DIMENSIONS)}"
                               f"{hint}")
    enc = sp.encode(space)
    keep = np.ones(enc.n_rows, dtype=bool)
    for key, value in strategy.items():
        keep &= enc.columns[key] == _code(space, key, value)
    if not keep.any():
        given = " ".join(f"{k}={v}" for k, v in strategy.items())
        raise CatalogError("command line", "--set", given or "(none)",
                           f"a valid candidate of {space.spec.name} (see paraspace serve {space.spec.name} --explain)")
    cols = {k: np.ascontiguousarray(v[keep]) for k, v in enc.columns.items()}
    metrics = serve.evaluate_columns(space, cols, simulate_top=0)
    feasible = metrics["feasible"]
    rank = np.lexsort((cols["row_id"], np.nan_to_num(metrics["ttft_s"], nan=np.inf),
                       -np.nan_to_num(metrics["output_tokens_per_s_per_gpu"], nan=-np.inf), -feasible))
    first = rank[:1]
    return ({k: np.ascontiguousarray(v[first]) for k, v in cols.items()},
            {k: np.ascontiguousarray(v[first]) for k, v in metrics.items()})


def capture(space: sp.LoadedServing, strategy: dict[str, Any]) -> ServingTimeline:
    """Simulate the chosen deployment with its event log (module doc)."""
    cols, metrics = pick_row(space, strategy)
    if int(metrics["reason"][0]) in (sp.Feasible.WEIGHTS_OOM, sp.Feasible.KV_TOO_SMALL):
        reason = sp.enum_labels(sp.Feasible)[int(metrics["reason"][0])]
        raise CatalogError("command line", "--set", _strategy_text(cols),
                           f"a deployment whose weights and requests fit its memory (this one: {reason})")
    packed = serve.pack_serving(space)
    srv = serve.serving_records(space, cols)
    prefill = serve.serving_records(space, cols, prefill=True)
    disagg = int(cols["mode"][0]) == sp.Mode.DISAGG
    inputs = serve.sim_inputs(space, packed, srv, prefill, cols, metrics, np.array([0]), disagg)
    sim, pooled = serve.run_sim(inputs)
    first = sim[0]  # the row's first simulated engine: its busier group's
    n_log = int(first[ss.S_ITERATIONS])  # aggregated: prefill iterations are among them
    if disagg:  # the decode engines', the prefill replicas', one transfer a request
        n_log += int(first[ss.S_PREFILL_ITERATIONS]) + inputs.args[0].shape[0]
    log = np.zeros((n_log, ss.N_LOG))
    res = np.empty(ss.N_SIM)
    a = inputs.args
    if disagg:
        (in_len, out_len, gaps, clients, rate, n_prefill, n_decode, max_batch, max_tokens, p_cap, d_cap, host, hit,
         grid, p_g, p_h, p_pair, p_dp, d_g, d_h, d_kv, d_ds, xfer, draft, acceptance, seed, steady) = a
        ss.simulate_disagg_one(in_len, out_len, gaps, int(clients[0]), rate[0], int(n_prefill[0]), int(n_decode[0]),
                               int(max_batch[0]), max_tokens[0], p_cap[0], d_cap[0], host, hit, grid, p_g[0], p_h[0],
                               p_pair[0], p_dp[0], d_g[0], d_h[0], d_kv[0], d_ds[0], xfer[0], int(draft[0]),
                               acceptance, seed, res, log, steady)
        P, D = int(n_prefill[0]), int(n_decode[0])
        pp = int(cols["pp"][0])
        names = tuple(f"prefill replica {p} (tp {int(cols['prefill_tp'][0])})" for p in range(P)) + tuple(
            f"decode engine {d} (replica {d // pp}" + (f", pipeline engine {d % pp}" if pp > 1 else "") + ")"
            for d in range(D))
        caps = (float(p_cap[0]),) * P + (float(d_cap[0]),) * D
    else:
        (in_len, out_len, gaps, clients, rate, max_batch, max_tokens, scheduler, overlap, cap, host, kv_coef,
         pair_coef, hit, grid, g, h, draft, acceptance, seed, dp, ds, steady) = a
        ss.simulate_one(in_len, out_len, gaps, int(clients[0]), rate[0], int(max_batch[0]), max_tokens[0],
                        int(scheduler[0]), overlap[0] != 0, cap[0], host, kv_coef[0], pair_coef[0], hit, grid, g[0],
                        h[0], int(draft[0]), acceptance, seed, dp[0], ds[0], res, log, steady, np.empty((0, 2)))
        engines, alike = int(metrics["engines"][0]), int(inputs.engines[0])
        users = f", {int(clients[0])} users each" if clients[0] > 0 else ""
        names = (f"engine 0 (one of {engines} engines; {alike} alike{users})",) if alike < engines else (
            f"engine 0 (one of {engines} identical engines{users})",)
        caps = (float(cap[0]),)
        P = 0
    if not np.array_equal(res, first, equal_nan=True):  # the log must not change the run
        raise RuntimeError("the logged simulation differs from the unlogged one")
    ideal = packed.tiers.copy()
    ideal["bytes_per_s"] = IDEAL_BYTES_PER_S
    ideal["latency_s"] = 0.0
    dev = packed.devs[int(cols["dtype"][0])]
    ep_s = np.full(log.shape[0], np.nan)
    if space.model.moe is not None and int(cols["attention_dp"][0]) and int(cols["ep"][0]) > 1:
        table = ss.ep_traffic_table(packed.model[0], dev, packed.tiers, ideal, packed.tiles, srv[0], serve.GRID)
        on = (log[:, ss.L_ENGINE] >= P) & (log[:, ss.L_KIND] != ss.LOG_TRANSFER)  # the (decode) engines' iterations
        ep_s[on] = [min(ss.lookup(serve.GRID, table, x), d) for x, d in
                    zip(log[on, ss.L_TOKENS], log[on, ss.L_END] - log[on, ss.L_START])]
    result = dict(zip(ss.SIM_OUTPUTS, (float(v) for v in res)))
    title = (f"{space.model.name} on {space.spec.devices} x {space.hardware.name}: {_strategy_text(cols)}; "
             f"{in_len.shape[0]} requests, TTFT {result['ttft_s'] * 1e3:.1f} ms, TPOT {result['tpot_s'] * 1e3:.2f} ms")
    if not disagg and int(inputs.engines[0]) < int(metrics["engines"][0]):
        # users split unevenly (kernels.serving.engine_users): the traced engine is one of the busier
        # group; the deployment's means, over every engine's requests, are what serve writes
        serve.record_simulated(space, packed, metrics, np.array([0]), sim, pooled, inputs)
        title += (f" on engine 0, one of {int(inputs.engines[0])} with {int(clients[0])} users (the deployment's "
                  f"{space.spec.workload.concurrency} over {int(metrics['engines'][0])} engines: TTFT "
                  f"{metrics['ttft_s'][0] * 1e3:.1f} ms, TPOT {metrics['tpot_s'][0] * 1e3:.2f} ms)")
    as_int = lambda c: log[:, c].astype(np.int64)  # noqa: E731
    return ServingTimeline(
        engine=as_int(ss.L_ENGINE), kind=as_int(ss.L_KIND), start_s=log[:, ss.L_START], end_s=log[:, ss.L_END],
        tokens=log[:, ss.L_TOKENS], requests=log[:, ss.L_REQUESTS], prompt_tokens=log[:, ss.L_PROMPT],
        kv_tokens=log[:, ss.L_KV], kv_reserved_tokens=log[:, ss.L_KV_RESERVED], peer=as_int(ss.L_PEER),
        request=as_int(ss.L_REQUEST), ep_s=ep_s, engine_names=names, kv_capacity_tokens=caps, result=result,
        strategy={k: v[0].item() for k, v in cols.items()}, title=title)


def _strategy_text(cols: dict[str, np.ndarray]) -> str:
    """``name=value`` of each dimension, labels for enums; the prefill group's only when disaggregated."""
    parts = []
    for name in (*sp.DIMENSIONS, "instances"):
        value = int(cols[name][0])
        if name.startswith("prefill_") and int(cols["mode"][0]) == sp.Mode.AGG:
            continue
        if name in sp.DIMENSION_ENUMS:
            parts.append(f"{name}={sp.DIMENSION_ENUMS[name][value]}")
        elif name in ("dtype", "kv_dtype"):
            parts.append(f"{name}={label(Dtype(value))}")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)


__all__ = ["capture", "pick_row"]
