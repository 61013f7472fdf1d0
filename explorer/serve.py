"""``paraspace serve``: a serving space -> candidates -> analytic tier -> the
iteration-level simulation of the best ones -> ranked Parquet.

The bridge between ``spaces.serving`` (records, encoding) and the kernels
(``kernels.serving`` analytic tier, ``kernels.serving_sim`` simulation): the
parameters are packed into records once, the candidates cross as columns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from paraspace.explorer.evaluate import pack_model, pack_space_hardware
from paraspace.explorer.sweep import provenance
from paraspace.kernels import inference, params, serving_sim
from paraspace.kernels import serving as ks
from paraspace.results import serving_schema as schema
from paraspace.results.schema import META_ENCODING
from paraspace.results.writer import ResultWriter, to_arrow
from paraspace.spaces import expert_balance
from paraspace.spaces.enums import Dtype, labels, parse
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.serving import (
    DIMENSION_ENUMS,
    FEASIBLE_TEXT,
    REASON_TEXT,
    SLA_TARGETS,
    Feasible,
    Lengths,
    LoadedServing,
    Mode,
    ServingReason,
    dtype_bytes_table,
    encode,
    enum_labels,
)
from paraspace.spaces.serving import names as serving_names

#: ``paraspace study`` objectives on a serving space (``explorer.serve_study``), the default first
SERVING_OBJECTIVES = ("throughput", "throughput-user")


def is_serving_space(ref: str | None) -> bool:
    """Whether a command line's space reference names a serving space: a name of
    ``spaces/catalog/serving``, or a TOML file with a ``[workload]`` table (training
    spaces have none)."""
    if ref is None:
        return False
    path = Path(ref)
    if ref.endswith(".toml") or path.exists():
        if not path.is_file():
            return False
        from paraspace.spaces.catalog import read_toml

        try:
            return isinstance(read_toml(path).get("workload"), dict)
        except CatalogError:
            return False
    return ref in serving_names()


#: activations, collectives, embedding and LM head stay 16-bit (kernels.inference)
ACT_BYTES = 2.0


@dataclass(frozen=True)
class PackedServing:
    model: np.ndarray
    devs: np.ndarray  # one DEVICE record per Dtype code (zeros for precisions the space does not use)
    tiers: np.ndarray
    tiles: np.ndarray
    workload: np.ndarray


def pack_serving(space: LoadedServing) -> PackedServing:
    spec = space.spec
    devs = None
    tiers = tiles = None
    for name in spec.dimensions.dtype:
        device, tiers, tiles = pack_space_hardware(space, name)
        if devs is None:
            devs = np.zeros(len(Dtype), dtype=device.dtype)
        devs[int(parse(Dtype, name))] = device[0]
    wl = spec.workload
    sla = spec.sla
    workload = np.zeros(1, ks.SERVING_WORKLOAD).view(np.recarray)
    in_len, out_len, _ = sample_requests(space)
    values = dict(input_len=wl.input_len.mean, output_len=wl.output_len.mean,
                  longest_seq_len=float((in_len + out_len).max()),
                  longest_prompt_len=float((in_len - np.floor(in_len * wl.prefix_hit_rate)).max()),
                  longest_input_len=float(in_len.max()),
                  prefix_hit_rate=wl.prefix_hit_rate,
                  concurrency=wl.concurrency or 0.0, rate_per_s=wl.rate_per_s or 0.0, devices=spec.devices,
                  host_s=spec.host_overhead_us * 1e-6, kv_fraction=spec.kv_fraction,
                  acceptance_rate=wl.acceptance_rate or 0.0,
                  sla_ttft_s=sla.ttft_s or 0.0, sla_ttft_p90_s=sla.ttft_p90_s or 0.0, sla_tpot_s=sla.tpot_s or 0.0,
                  sla_tpot_p90_s=sla.tpot_p90_s or 0.0)
    for key, value in values.items():
        workload[key] = value
    assert devs is not None and tiers is not None and tiles is not None  # the schema requires one dtype
    return PackedServing(pack_model(space.model), devs.view(np.recarray), tiers, tiles, workload)


def serving_records(space: LoadedServing, cols: dict[str, np.ndarray], *, prefill: bool = False) -> np.ndarray:
    """One ``kernels.inference.SERVING`` record per row (built column by column): the
    row's (decode) replica, or with ``prefill`` its prefill replica (prefill_tp
    devices, pp 1, its own ep, attention layout and dispatch); both run the row's
    draft tokens (the prefill replica's draft modules build their caches over the
    prompt) and two-batch overlap where their layout has an all-to-all. An EP
    group of more than one rank holds ``experts + redundant_experts`` expert
    slots, with the busiest rank's load from ``spaces.expert_balance``."""
    nbytes = dtype_bytes_table()
    n = cols["tp"].shape[0]
    rec = np.zeros(n, inference.SERVING)
    tp = cols["prefill_tp"] if prefill else cols["tp"]
    ep = cols["prefill_ep"] if prefill else cols["ep"]
    adp = cols["prefill_attention_dp"] if prefill else cols["attention_dp"]
    rec["tp"] = tp
    rec["pp"] = 1 if prefill else cols["pp"]
    rec["ep"] = ep
    rec["attention_dp"] = adp
    rec["n_gpus"] = space.spec.devices
    rec["weight_bytes"] = nbytes[cols["dtype"]]
    rec["act_bytes"] = ACT_BYTES
    rec["dispatch_bytes"] = params.DISPATCH_BYTES[space.spec.dispatch_dtype]
    rec["kv_bytes"] = nbytes[cols["kv_dtype"]]
    rec["kv_fraction"] = space.spec.kv_fraction
    rec["batch_cap"] = cols["max_batch"]
    rec["moe_imbalance"] = params.DERIVED_IMBALANCE  # sampling: from each forward's routed tokens (kernels.routing)
    rec["draft_tokens"] = cols["draft_tokens"]
    rec["dispatch"] = cols["prefill_dispatch"] if prefill else cols["dispatch"]
    rec["tbo"] = (cols["tbo"] != 0) & (adp != 0) & (ep > 1)
    rec["placement_imbalance"] = 1.0
    moe = space.model.moe
    if moe is not None:
        redundant = np.where(ep > 1, cols["redundant_experts"], 0).astype(np.int64)
        rec["expert_slots"] = moe.experts + redundant
        sigma = space.spec.workload.expert_popularity_sigma
        keys, inverse = np.unique(np.stack([redundant, ep.astype(np.int64)], axis=1), axis=0, return_inverse=True)
        table = expert_balance.imbalance_table(moe.experts, {(int(r), int(e)) for r, e in keys}, sigma)
        rec["placement_imbalance"] = np.array([table[int(r), int(e)] for r, e in keys])[inverse.reshape(-1)]
    return rec.view(np.recarray)


def replica_runs(srv: np.ndarray, dtype: np.ndarray) -> np.ndarray:
    """``kernels.serving.analytic_rows``'s ``run_of``: runs of consecutive rows whose
    (decode) replica records, ``batch_cap`` aside (the serving kernels never read
    it; ``serving_records`` sets it to the row's max_batch, a fast dimension), and
    precisions are equal (encode's order puts max_batch, max_tokens, scheduler and
    the prefill group last, so a replica's rows run together)."""
    n = srv.shape[0]
    change = np.ones(n, dtype=bool)
    if n > 1:
        # every SERVING field is a float64: compare the records as rows of a matrix
        fields = np.ascontiguousarray(srv).view(np.float64).reshape(n, len(srv.dtype.names))
        equal = fields[1:] == fields[:-1]
        equal[:, srv.dtype.names.index("batch_cap")] = True
        change[1:] = ~(equal.all(axis=1) & (dtype[1:] == dtype[:-1]))
    return np.cumsum(change, dtype=np.int64) - 1


def analytic(packed: PackedServing, srv: np.ndarray, cols: dict[str, np.ndarray],
             prefill: np.ndarray) -> dict[str, np.ndarray]:
    out = ks.analytic_rows(packed.model, packed.devs, packed.tiers, packed.tiles, srv, prefill, cols["dtype"],
                           cols["mode"], cols["max_batch"], cols["max_tokens"], cols["scheduler"],
                           cols["overlap_scheduler"], cols["instances"], cols["prefill_instances"], packed.workload,
                           replica_runs(srv, cols["dtype"]))
    return {name: out[:, i] for i, name in enumerate(ks.OUTPUTS)}  # each column contiguous already


def sample_lengths(lengths: Lengths, n: int, rng: np.random.Generator,
                   empirical: np.ndarray | None = None) -> np.ndarray:
    """``n`` request lengths: the fixed mean, lognormal with that mean (mu = ln mean - sigma^2 / 2), rounded, >= 1,
    or drawn with replacement from the ``empirical`` lengths (``LoadedServing.empirical``)."""
    assert lengths.mean is not None  # required, or filled in from the CSV on load (spaces.serving.Lengths)
    if lengths.distribution == "empirical":
        assert empirical is not None and empirical.size > 0
        return rng.choice(empirical, n)
    if lengths.distribution == "fixed":
        return np.full(n, float(round(lengths.mean)))
    mu = np.log(lengths.mean) - 0.5 * lengths.sigma**2
    return np.maximum(np.rint(rng.lognormal(mu, lengths.sigma, n)), 1.0)


def sample_requests(space: LoadedServing, n: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths, unit exponential gaps) of ``n`` simulated requests (default:
    the workload's ``n_requests``), from the workload's seed. The gaps are scaled to a mean
    of exactly 1, so that a Poisson stream's n arrivals span n / rate: the sample offers
    the workload's rate, not that rate times its sampling noise (about 1 / sqrt(n); a
    Poisson sample conditioned on its last arrival, whose arrivals are then uniform
    order statistics over the span)."""
    wl = space.spec.workload
    n = wl.n_requests if n is None else n
    rng = np.random.default_rng(wl.seed)
    in_len = sample_lengths(wl.input_len, n, rng, space.empirical.get("input_len"))
    out_len = sample_lengths(wl.output_len, n, rng, space.empirical.get("output_len"))
    gaps = rng.exponential(1.0, n)
    return in_len, out_len, gaps * (n / gaps.sum())


def draw_seed(space: LoadedServing) -> int:
    """The seed of the simulation's acceptance draws (``kernels.serving_sim.unit_draw``):
    the workload's, folded below 2^32."""
    return space.spec.workload.seed % 2**32


@dataclass(frozen=True)
class SimInputs:
    """The simulation's arguments for some rows (``simulate_rows`` or
    ``simulate_disagg_rows``): one simulated engine per group of identical engines
    (``engines`` of them, of the row at ``owner``, an index into the rows given),
    rows in their order, a row's busier group first."""

    disagg: bool
    args: tuple
    engines: np.ndarray  # aggregated: the group's identical engines (one simulated); disaggregated: 1
    owner: np.ndarray


def engine_groups(space: LoadedServing, engines: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(owner, users, count): the groups of identical engines one simulated engine
    stands for, for rows of ``engines`` aggregated engines: a Poisson stream's rate
    splits evenly (one group, users 0), a closed loop's users as evenly as they go
    (``kernels.serving.engine_users``: the busier group, then the other; a group of no
    engines or no users is not simulated). ``owner`` indexes ``engines``."""
    wl = space.spec.workload
    every = np.arange(engines.size)
    if wl.concurrency is None:
        return every, np.zeros(engines.size), engines.astype(np.float64)
    hi_users, hi_count, lo_users, lo_count = ks.engine_users.py_func(float(wl.concurrency), engines)
    owner = np.concatenate([every, every])
    users = np.concatenate([hi_users, lo_users])
    count = np.concatenate([hi_count, lo_count])
    keep = (users > 0) & (count > 0)
    order = np.argsort(owner[keep], kind="stable")  # a row's groups together, the busier first
    return owner[keep][order], users[keep][order], count[keep][order]


def sim_inputs(space: LoadedServing, packed: PackedServing, srv: np.ndarray, prefill: np.ndarray,
               cols: dict[str, np.ndarray], metrics: dict[str, np.ndarray], rows: np.ndarray, disagg: bool) -> SimInputs:
    """The simulation's inputs for ``rows`` (indices, all of one mode): an aggregated row
    simulates one engine of each group of its ``engines`` (``engine_groups``) serving the
    workload's ``n_requests``; a disaggregated row its whole deployment
    (``kernels.serving_sim.simulate_disagg_one``) serving ``n_requests`` per decode engine,
    so all ``rows`` must have as many decode engines."""
    wl = space.spec.workload
    engines = metrics["engines"][rows]
    if disagg and rows.size and not (engines == engines[0]).all():
        raise ValueError("sim_inputs: disaggregated rows of one call need one decode engine count")
    owner, users, count = (engine_groups(space, engines) if not disagg else
                           (np.arange(rows.size), np.full(rows.size, float(wl.concurrency or 0)), np.ones(rows.size)))
    sims = rows[owner]
    pick = {k: np.ascontiguousarray(v[sims]) for k, v in cols.items()}
    g, h, dp, ds, kv_coef, pair_coef, cap = ks.cost_tables(packed.model, packed.devs, packed.tiers, packed.tiles,
                                                           srv[sims].view(np.recarray), pick["dtype"], GRID)
    n = wl.n_requests * int(engines[0]) if disagg and rows.size else None
    in_len, out_len, gaps = sample_requests(space, n)
    host = space.spec.host_overhead_us * 1e-6
    acceptance = wl.acceptance_rate or 0.0
    max_batch = pick["max_batch"].astype(np.float64)
    max_tokens = pick["max_tokens"].astype(np.float64)
    if not disagg:
        rate = np.zeros(sims.size) if wl.rate_per_s is None else wl.rate_per_s / count
        args = (in_len, out_len, gaps, users, rate, max_batch, max_tokens, pick["scheduler"],
                pick["overlap_scheduler"], cap, host, kv_coef, pair_coef, wl.prefix_hit_rate, GRID, g, h,
                pick["draft_tokens"], acceptance, draw_seed(space), dp, ds, wl.steady_state)
        return SimInputs(False, args, count, owner)
    psrv = prefill[sims].view(np.recarray)
    pg, ph, pdp, _, _, p_pair, p_cap = ks.cost_tables(packed.model, packed.devs, packed.tiers, packed.tiles, psrv,
                                                       pick["dtype"], GRID)
    xfer = serving_sim.transfer_times(packed.model, packed.tiers, psrv, in_len, float(space.spec.devices))
    rate = np.full(sims.size, float(wl.rate_per_s or 0.0))
    args = (in_len, out_len, gaps, users, rate, pick["prefill_instances"].astype(np.float64), engines, max_batch,
            max_tokens, p_cap, cap, host, wl.prefix_hit_rate, GRID, pg, ph, p_pair, pdp, g, h, kv_coef, ds, xfer,
            pick["draft_tokens"], acceptance, draw_seed(space), wl.steady_state)
    return SimInputs(True, args, count, owner)


#: simulated engines whose requests' latencies one call keeps at most (``run_sim``, rows of
#: more than one group: their percentiles pool the groups' requests)
SAMPLED_SIMS = 1024


def run_sim(inputs: SimInputs) -> tuple[np.ndarray, list[np.ndarray]]:
    """``SIM_OUTPUTS`` of the simulated engines of ``inputs`` (engines, N_SIM) and, per row
    of more than one group, its groups' measured requests (``pooled``): (TTFT, TPOT, weight)
    arrays, each request weighing its group's completions a second over its measured
    requests (one request of the deployment's stream each)."""
    if inputs.disagg:
        return serving_sim.simulate_disagg_rows(*inputs.args), []
    owner = inputs.owner
    multi = np.flatnonzero(np.bincount(owner)[owner] > 1)  # the engines of rows of two groups, pair by pair
    args = list(inputs.args)
    out = np.empty((owner.size, serving_sim.N_SIM))
    single = np.setdiff1d(np.arange(owner.size), multi)
    out[single] = serving_sim.simulate_rows(*subset(args, single))
    pooled = []
    for start in range(0, multi.size, SAMPLED_SIMS):  # SAMPLED_SIMS is even: a row's pair stays whole
        part = multi[start:start + SAMPLED_SIMS]
        samples = np.empty((part.size, args[0].shape[0], 2))
        out[part] = serving_sim.simulate_rows(*subset(args, part), samples=samples)
        for first in range(0, part.size, 2):
            pair = part[first:first + 2]
            measured = ~np.isnan(samples[first:first + 2, :, 0])  # none where the engine was stuck
            with np.errstate(invalid="ignore", divide="ignore"):
                share = inputs.engines[pair] * out[pair, serving_sim.S_SUSTAINED_RPS] / measured.sum(axis=1)
            pooled.append(np.concatenate([
                np.stack([samples[first + k][measured[k], 0], samples[first + k][measured[k], 1],
                          np.full(measured[k].sum(), share[k])], axis=1) for k in range(2)]))
    return out, pooled


#: positions of ``simulate_rows``' per-engine arguments (``sim_inputs``' aggregated args):
#: clients, rate, max_batch, max_tokens, scheduler, overlap, cap, kv_coef, pair_coef, the
#: cost tables g and h, draft, and the draft tables dp and ds
PER_ENGINE_ARGS = (3, 4, 5, 6, 7, 8, 9, 11, 12, 15, 16, 17, 20, 21)


def subset(args: list, sims: np.ndarray) -> list:
    """``simulate_rows``' arguments (``sim_inputs``) for the simulated engines ``sims``."""
    return [a[sims] if i in PER_ENGINE_ARGS else a for i, a in enumerate(args)]


def pooled_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-th percentile of weighted ``values``: linear between the sorted values, each
    at its weight's midpoint of the cumulative weight, scaled so that the first sits at 0
    and the last at 1 (equal weights: ``np.percentile``'s linear method); NaN values out."""
    keep = ~np.isnan(values)
    v, w = values[keep], weights[keep]
    if v.size == 0:
        return np.nan
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    if v.size == 1:
        return float(v[0])
    mid = np.cumsum(w) - 0.5 * w - 0.5 * w[0]
    return float(np.interp(q / 100.0, mid / mid[-1], v))


def simulate(space: LoadedServing, packed: PackedServing, srv: np.ndarray, cols: dict[str, np.ndarray],
             metrics: dict[str, np.ndarray], rows: np.ndarray, prefill: np.ndarray | None = None) -> None:
    """Run the simulation on ``rows`` (indices) and overwrite their latency and throughput columns;
    ``prefill``: the rows' prefill replica records (built here when not given)."""
    if prefill is None:
        prefill = serving_records(space, cols, prefill=True)
    agg = rows[cols["mode"][rows] == Mode.AGG]
    if agg.size:
        inputs = sim_inputs(space, packed, srv, prefill, cols, metrics, agg, False)
        record_simulated(space, packed, metrics, agg, *run_sim(inputs), inputs)
    disagg = rows[cols["mode"][rows] == Mode.DISAGG]
    for engines in np.unique(metrics["engines"][disagg]):  # n_requests per decode engine: one call per count
        part = disagg[metrics["engines"][disagg] == engines]
        inputs = sim_inputs(space, packed, srv, prefill, cols, metrics, part, True)
        record_simulated(space, packed, metrics, part, *run_sim(inputs), inputs)


def record_simulated(space: LoadedServing, packed: PackedServing, metrics: dict[str, np.ndarray], rows: np.ndarray,
                     sim: np.ndarray, pooled: list[np.ndarray], inputs: SimInputs) -> None:
    """Write the simulated ``rows``' columns from their engines' runs (``run_sim``): rates
    summed over the groups' identical engines, latencies over the deployment's requests
    (means weighted by the requests each group completes, percentiles of the groups'
    requests pooled: ``pooled_percentile``)."""
    owner, count = inputs.owner, inputs.engines
    m = rows.size
    stuck = np.bincount(owner, sim[:, serving_sim.S_STUCK] != 0, minlength=m) > 0
    ok = ~stuck
    rate = np.where(stuck[owner], 0.0, count * sim[:, serving_sim.S_SUSTAINED_RPS])
    served = np.bincount(owner, rate, minlength=m)

    def mean(column: int) -> np.ndarray:  # over the deployment's requests
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.bincount(owner, np.where(stuck[owner], 0.0, rate * sim[:, column]), minlength=m) / served

    first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])  # each row's busier group
    pairs = np.flatnonzero(np.bincount(owner, minlength=m) > 1)
    two = np.zeros(m, bool)
    two[pairs] = True
    value = {column: np.where(two, mean(column), sim[first, column])  # one group: its own values, as they are
             for column in (serving_sim.S_TTFT, serving_sim.S_TPOT, serving_sim.S_E2E, serving_sim.S_TOKENS_PER_STEP)}
    ttft_p90, tpot_p90 = sim[first, serving_sim.S_TTFT_P90].copy(), sim[first, serving_sim.S_TPOT_P90].copy()
    for k, row in enumerate(pairs):
        requests = pooled[k]
        ttft_p90[row] = pooled_percentile(requests[:, 0], requests[:, 2], 90.0)
        tpot_p90[row] = pooled_percentile(requests[:, 1], requests[:, 2], 90.0)
        if np.isnan(requests[:, 1]).all():  # every request ends with its first token (the analytic tier's 0)
            tpot_p90[row] = 0.0
    devices = float(space.spec.devices)
    for target, values in (("ttft_s", value[serving_sim.S_TTFT]), ("ttft_p90_s", ttft_p90),
                           ("tpot_s", value[serving_sim.S_TPOT]), ("tpot_p90_s", tpot_p90),
                           ("e2e_latency_s", value[serving_sim.S_E2E])):
        metrics[target][rows[ok]] = values[ok]
    tokens = np.bincount(owner, np.where(stuck[owner], 0.0, count * sim[:, serving_sim.S_OTPS]), minlength=m)
    metrics["output_tokens_per_s_per_gpu"][rows[ok]] = tokens[ok] / devices
    metrics["requests_per_s"][rows[ok]] = served[ok]
    tpot = value[serving_sim.S_TPOT][ok]  # 0 where every request ends with its first token: no decode speed (NaN,
    metrics["output_tokens_per_s_per_user"][rows[ok]] = np.divide(  # as the analytic tier's)
        1.0, tpot, out=np.full(tpot.shape, np.nan), where=tpot > 0.0)
    per_step = value[serving_sim.S_TOKENS_PER_STEP]
    measured = ok & np.isfinite(per_step)  # not where no request decoded
    metrics["tokens_per_step"][rows[measured]] = per_step[measured]
    metrics["simulated"][rows] = 1.0
    overloaded = np.bincount(owner, sim[:, serving_sim.S_OVERLOADED] > 0, minlength=m) > 0
    sla = ks.sla_reasons(packed.workload, value[serving_sim.S_TTFT], ttft_p90, value[serving_sim.S_TPOT], tpot_p90)
    reason = np.where(ok, sla, int(Feasible.KV_TOO_SMALL))
    reason = np.where(ok & overloaded, int(Feasible.OVERLOADED), reason)
    metrics["reason"][rows] = reason


#: token counts of the simulation's cost tables
GRID = ks.token_grid()

#: the simulation's clock is float64 seconds from the first arrival: where a Poisson engine's arrivals span more
#: than this, one step of the clock (horizon * 2^-52) exceeds 10 ns and iterations round away (a TTFT of 0, or
#: NaN once the arrivals overflow). Such an engine serves each request alone, which the analytic tier's values are
MAX_SIM_HORIZON_S = 2.0**52 * 1e-8  # about 4.5e7 s (1.4 years)


def simulable(space: LoadedServing, engines: np.ndarray) -> np.ndarray:
    """Which rows of ``engines`` engines the simulation represents: Poisson arrivals at the
    engine's share of the rate that span at most ``MAX_SIM_HORIZON_S``; a closed loop with
    fewer users on its busiest engine (``kernels.serving.engine_users``) than ``n_requests``
    (with as many or more, every request is some user's first, all sent at t = 0: a burst,
    not the loop's steady state)."""
    wl = space.spec.workload
    if wl.rate_per_s is not None:
        _, _, gaps = sample_requests(space)
        with np.errstate(over="ignore", divide="ignore"):
            return gaps.sum() * engines / wl.rate_per_s <= MAX_SIM_HORIZON_S
    assert wl.concurrency is not None  # exactly one arrival process (spaces.serving.Workload)
    hi_users, hi_count, lo_users, _ = ks.engine_users.py_func(float(wl.concurrency), engines)
    return np.where(hi_count > 0, hi_users, lo_users) < wl.n_requests  # the busiest engine's users


@dataclass
class ServeSummary:
    path: Path | None
    n_combinations: int = 0
    n_rows: int = 0
    n_feasible: int = 0
    n_simulated: int = 0
    seconds: float = 0.0
    first_reason: np.ndarray = field(default_factory=lambda: np.zeros(len(ServingReason), np.int64))
    breaks: np.ndarray = field(default_factory=lambda: np.zeros(len(ServingReason), np.int64))
    table: pl.DataFrame | None = None
    #: the longest simulated request, prompt + output tokens (what an engine's KV cache must hold)
    longest_request_tokens: float = 0.0
    #: candidates the simulation could have run but cannot represent (``simulable``): analytic values kept
    n_not_simulable: int = 0
    #: feasible candidates left unsimulated, whose p90 SLA targets (percentiles only the simulation gives) are unchecked
    n_p90_unchecked: int = 0


def evaluate_columns(space: LoadedServing, cols: dict[str, np.ndarray], packed: PackedServing | None = None, *,
                     simulate_top: int | None = None) -> dict[str, np.ndarray]:
    """The metrics of encoded candidates ``cols`` (in their order): the analytic tier
    on all, the simulation on the runnable candidates it can represent
    (``simulable``): first the ``simulate_top`` (default: the space's) best by
    analytic throughput per GPU, then those the ranking (``rank_order``) puts among
    its best ``simulate_top`` until all of these are simulated or ``REFINE_ROUNDS``
    rounds have run."""
    return evaluate(space, cols, packed, simulate_top=simulate_top)[0]


def evaluate(space: LoadedServing, cols: dict[str, np.ndarray], packed: PackedServing | None = None, *,
             simulate_top: int | None = None) -> tuple[dict[str, np.ndarray], int]:
    """``evaluate_columns`` and the number of runnable candidates the simulation cannot represent."""
    packed = pack_serving(space) if packed is None else packed
    srv = serving_records(space, cols)
    prefill = serving_records(space, cols, prefill=True)
    metrics = analytic(packed, srv, cols, prefill)
    metrics["placement_imbalance"] = np.ascontiguousarray(srv["placement_imbalance"], dtype=np.float64)
    n = cols["tp"].shape[0]
    metrics["simulated"] = np.zeros(n)
    metrics["ttft_p90_s"] = np.full(n, np.nan)
    metrics["tpot_p90_s"] = np.full(n, np.nan)
    top = space.spec.simulate_top if simulate_top is None else simulate_top
    runnable = np.isin(metrics["reason"], [int(Feasible.OK), int(Feasible.SLA_TTFT), int(Feasible.SLA_TPOT)])
    fits = simulable(space, metrics["engines"])  # a disaggregated row's engines: its decode engines
    candidates = np.flatnonzero(runnable & fits)
    # the first round ranks by the analytic values alone, their SLA verdicts aside: the closed
    # forms' latencies can be far from the simulation's (a closed loop's waves, module doc of
    # kernels.serving), and a row they fail may meet the targets once simulated
    head = rank_order(cols, {**metrics, "feasible": np.ones(n)}, candidates)[:top]
    for _ in range(REFINE_ROUNDS):  # then until the ranking's best `top` candidates are all simulated
        fresh = head[metrics["simulated"][head] == 0]
        if fresh.size == 0:
            break
        simulate(space, packed, srv, cols, metrics, np.sort(fresh), prefill)
        metrics["feasible"] = (metrics["reason"] == Feasible.OK).astype(np.float64)
        head = rank_order(cols, metrics, candidates)[:top]
    metrics["feasible"] = (metrics["reason"] == Feasible.OK).astype(np.float64)
    return metrics, int((runnable & ~fits).sum())


#: rounds of simulation ``evaluate`` runs at most: the first simulates the ``simulate_top``
#: best candidates by analytic throughput per GPU (then TTFT); a row the simulation lowers
#: (it mostly does) or finds infeasible leaves a place in the ranking's head that the next
#: round fills by simulating the unsimulated candidate that took it
REFINE_ROUNDS = 4


def rank_order(cols: dict[str, np.ndarray], metrics: dict[str, np.ndarray],
               rows: np.ndarray | None = None) -> np.ndarray:
    """``rows`` (indices, default all) in the ranking's order (``schema.RANK``, NaN last,
    row_id breaking ties): the order ``paraspace serve`` writes and ``results.rank.ranked``
    reads back."""
    both = {**cols, **metrics}
    idx = np.arange(cols["row_id"].shape[0]) if rows is None else rows
    keys = [cols["row_id"][idx]]
    for name, descending in reversed(schema.RANK):  # np.lexsort's last key is its first
        value = np.asarray(both[name][idx], dtype=np.float64)
        keys.append(np.where(np.isnan(value), np.inf, -value if descending else value))
    return idx[np.lexsort(keys)]


def evaluate_space(space: LoadedServing, *, simulate_top: int | None = None) -> tuple[dict[str, np.ndarray], ServeSummary]:
    """Every valid candidate's columns (strategy and metrics), ranked (``rank_order``:
    feasible first, then the simulated rows, then throughput per GPU, then TTFT)."""
    began = time.perf_counter()
    enc = encode(space)
    summary = ServeSummary(path=None, n_combinations=enc.n_combinations, n_rows=enc.n_rows,
                           first_reason=enc.first_reason, breaks=enc.breaks)
    cols = enc.columns
    packed = pack_serving(space)
    summary.longest_request_tokens = float(packed.workload["longest_seq_len"][0])
    metrics, summary.n_not_simulable = evaluate(space, cols, packed, simulate_top=simulate_top)
    both = {**cols, **metrics, "infeasible_reason": metrics["reason"].astype(np.int8)}
    rank = rank_order(cols, metrics)
    ranked = {k: np.ascontiguousarray(v[rank]) for k, v in both.items()}
    summary.n_feasible = int(metrics["feasible"].sum())
    summary.n_simulated = int(metrics["simulated"].sum())
    if p90_targets(space):
        summary.n_p90_unchecked = int(((metrics["feasible"] > 0) & (metrics["simulated"] == 0)).sum())
    summary.seconds = time.perf_counter() - began
    return ranked, summary


def enum_columns() -> dict[str, list[str]]:
    return {"dtype": labels(Dtype), "kv_dtype": labels(Dtype), **DIMENSION_ENUMS,
            "infeasible_reason": enum_labels(Feasible)}


def run_serve(space: LoadedServing, out: Path, *, simulate_top: int | None = None) -> ServeSummary:
    """Evaluate ``space`` and write the ranked candidates to ``out`` (atomically); with no
    candidate at all nothing is written (whatever ``out`` held stays; the caller reports it)."""
    ranked, summary = evaluate_space(space, simulate_top=simulate_top)
    if summary.n_rows == 0:
        return summary
    table_schema = schema.arrow_schema()
    with ResultWriter(out, table_schema, provenance(space), schema.column_docs()) as writer:
        table = to_arrow(ranked, table_schema, enum_columns())
        writer.write(table)
        encoding = {"n_combinations": summary.n_combinations,
                    "first_reason": {r.name.lower(): int(summary.first_reason[r]) for r in ServingReason}}
        writer.close({META_ENCODING: encoding})
    summary.path = out
    summary.table = pl.from_arrow(table)
    return summary


def explain_table(summary: ServeSummary) -> str:
    lines = [f"{'rule':<20}{'removed':>10}{'breaks':>10}  meaning", "-" * 90]
    for reason in ServingReason:
        if reason != ServingReason.VALID:
            lines.append(f"{reason.name.lower():<20}{int(summary.first_reason[reason]):>10,}"
                         f"{int(summary.breaks[reason]):>10,}  {REASON_TEXT[reason]}")
    lines.append("-" * 90)
    lines.append(f"{'kept':<20}{int(summary.first_reason[ServingReason.VALID]):>10,}{'':>10}  of "
                 f"{summary.n_combinations:,} combinations")
    return "\n".join(lines)


def top_table(frame: pl.DataFrame, n: int) -> str:
    """The first ``n`` ranked deployments as the terminal table ``top`` prints (``explorer.display``)."""
    from paraspace.explorer.display import table_text

    return table_text(frame.head(n))


def output_path(space: LoadedServing, out: Path | None) -> Path:
    if out is not None:
        return out
    name = space.spec.name
    if not name or name.startswith(".") or any(c in name for c in "/\\\0:"):
        raise CatalogError(space.source, "name", name, "a file name: no '/', '\\', ':' or NUL, not starting with '.'")
    return Path("results") / f"{name}.parquet"


def encode_summary(space: LoadedServing) -> ServeSummary:
    """The encoder's counts alone (``--dry-run``)."""
    enc = encode(space)
    return ServeSummary(path=None, n_combinations=enc.n_combinations, n_rows=enc.n_rows,
                        first_reason=enc.first_reason, breaks=enc.breaks)


def headline(space: LoadedServing, summary: ServeSummary) -> str:
    spec = space.spec
    wl = spec.workload
    arrivals = f"{wl.concurrency} users (closed loop)" if wl.concurrency is not None else \
        f"Poisson {wl.rate_per_s:g} requests/s"
    return (f"{spec.name}: {space.model.name} on {spec.devices} x {space.hardware.name}, "
            f"{wl.input_len.distribution} {wl.input_len.mean:g} in / {wl.output_len.distribution} "
            f"{wl.output_len.mean:g} out, {arrivals}\n"
            f"{summary.n_combinations:,} combinations -> {summary.n_rows:,} candidates ({summary.n_feasible:,} feasible, "
            f"{summary.n_simulated:,} simulated) in {summary.seconds:.2f} s"
            + (f"\n{summary.n_not_simulable:,} candidates keep the analytic tier's values: the simulation cannot "
               f"represent their engines' load ({not_simulable_why(space)})" if summary.n_not_simulable else "")
            + (f"\n{summary.n_p90_unchecked:,} feasible candidates are not simulated: they meet the mean targets; "
               f"the p90 targets ({', '.join(p90_targets(space))}) are unchecked on them (--simulate-top checks more)"
               if summary.n_p90_unchecked else "")
            + (f"\nwrote {summary.path}" if summary.path is not None else "\nwrote nothing (no candidate)")
            + why_none_feasible(space, summary))


def p90_targets(space: LoadedServing) -> list[str]:
    """The space's SLA targets on 90th percentiles (columns only the simulation fills)."""
    sla = space.spec.sla
    return [name for name in ("ttft_p90_s", "tpot_p90_s") if getattr(sla, name) is not None]


def not_simulable_why(space: LoadedServing) -> str:
    """Why ``simulable`` refuses rows of this space's workload."""
    wl = space.spec.workload
    if wl.rate_per_s is not None:
        return (f"a Poisson rate so low that an engine's {wl.n_requests:,} arrivals span more than "
                f"{MAX_SIM_HORIZON_S:.2g} s, past the resolution of the simulation's clock")
    return (f"at least n_requests = {wl.n_requests:,} users per engine: every request would be a user's first, a "
            f"burst at t = 0 rather than the closed loop")


def why_none_feasible(space: LoadedServing, summary: ServeSummary) -> str:
    """Where candidates were evaluated and none is feasible, lines saying why: each
    reason's count and meaning (for kv-too-small the longest request against the
    roomiest engine's cache) and, where candidates fit and sustain the load but
    miss the SLA, the binding target: the one the closest candidate (smallest
    worst ratio of metric to target) misses most, with the best value per target.
    Empty otherwise."""
    frame = summary.table
    if frame is None or frame.height == 0 or summary.n_feasible > 0:
        return ""
    reasons = frame["infeasible_reason"].cast(pl.String)
    label = dict(zip(Feasible, enum_labels(Feasible)))
    lines = ["", "no candidate is feasible:"]
    for member in Feasible:
        rows = frame.filter(reasons == label[member])
        if member == Feasible.OK or rows.height == 0:
            continue
        text = FEASIBLE_TEXT[member]
        if member == Feasible.KV_TOO_SMALL:
            engine_cap = (rows["kv_capacity_tokens"] / rows["pp"]).max()
            text += (f": the longest request is {summary.longest_request_tokens:,.0f} tokens (prompt + output), the "
                     f"roomiest engine's cache holds {engine_cap:,.0f}")
        lines.append(f"  {rows.height:,} {label[member]}: {text}")
    sla_codes = [label[m] for _, _, m in SLA_TARGETS]
    served = frame.filter(reasons.is_in(sla_codes))
    targets = [(name, column, getattr(space.spec.sla, name)) for name, column, _ in SLA_TARGETS
               if getattr(space.spec.sla, name) is not None]
    if served.height == 0 or not targets:
        return "\n".join(lines)
    # metric / target per row and target; NaN (a p90 of a row not simulated) is not checked, as in sla_reason
    metric = np.stack([served[column].fill_null(np.nan).to_numpy() for _, column, _ in targets], axis=1)
    with np.errstate(over="ignore"):  # a target of a few 1e-324 s: the miss is infinitely many times it
        ratio = metric / np.array([target for _, _, target in targets])
    worst = np.nanmax(np.where(np.isnan(ratio), -np.inf, ratio), axis=1)
    closest = int(np.argmin(worst))
    binding = int(np.nanargmax(np.where(np.isnan(ratio[closest]), -np.inf, ratio[closest])))
    name, column, target = targets[binding]
    lines.append(f"no candidate meets the SLA; the binding target is sla.{name} = {target:g} s: the closest "
                 f"candidate (row_id {served['row_id'][closest]}) reaches {served[column][closest]:.4g} s, "
                 f"{ratio[closest, binding]:.3g}x the target")
    best = []
    for k, (name, column, target) in enumerate(targets):
        checked = ~np.isnan(ratio[:, k])
        if checked.any():
            best.append(f"{name} {np.min(metric[checked, k]):.4g} s (target {target:g} s, met by "
                        f"{int((ratio[checked, k] <= 1.0).sum()):,} of {int(checked.sum()):,})")
    lines.append("  best per target: " + ", ".join(best))
    return "\n".join(lines)
