"""The serving Parquet schema: every column of ``paraspace serve`` output, with
its unit, storage type and meaning, in one place (the pattern of
``results.schema``: units in the names, ``Column`` records).

A row is one candidate deployment: its identity and strategy columns
(``spaces.serving.DIMENSIONS`` plus the derived ``instances``), then the
metrics below. The latency and throughput columns hold the simulation's
values where ``simulated`` is true and the analytic tier's otherwise; the p90
columns exist only for simulated rows (null elsewhere).
"""

from __future__ import annotations

import pyarrow as pa

from paraspace.results.schema import Column

#: identity and strategy columns, in output order
STRATEGY: tuple[Column, ...] = (
    Column("row_id", pa.int64(), "index", "position of the combination in the serving space's flat product"),
    Column("mode", pa.dictionary(pa.int8(), pa.string()), "enum",
           "agg: replicas prefill and decode; disagg: prefill replicas and decode replicas apart"),
    Column("tp", pa.int32(), "count", "tensor-parallel ranks of a (decode) replica"),
    Column("pp", pa.int32(), "count", "pipeline stages of a replica (each runs pp engines)"),
    Column("ep", pa.int32(), "count", "expert-parallel ranks among the tp ranks"),
    Column("attention_dp", pa.bool_(), "bool", "attention data parallelism (each rank its own requests)"),
    Column("redundant_experts", pa.int32(), "count",
           "MoE: expert slots beyond the routed experts (copies of hot experts) in each EP group of more than one rank"),
    Column("dispatch", pa.dictionary(pa.int8(), pa.string()), "enum",
           "MoE under attention DP: how tokens reach their experts (spaces.enums.Dispatch)"),
    Column("tbo", pa.bool_(), "bool", "two-batch overlap: one half-batch's all-to-all under the other's compute"),
    Column("dtype", pa.dictionary(pa.int8(), pa.string()), "enum", "GEMM weight precision"),
    Column("kv_dtype", pa.dictionary(pa.int8(), pa.string()), "enum", "KV cache precision"),
    Column("draft_tokens", pa.int32(), "tokens",
           "speculative decoding: tokens drafted per decode step (0: off) by MTP modules or a one-layer draft head"),
    Column("max_batch", pa.int32(), "requests", "most requests an engine runs at once"),
    Column("max_tokens", pa.int32(), "tokens", "tokens per iteration (chunked-prefill budget)"),
    Column("scheduler", pa.dictionary(pa.int8(), pa.string()), "enum",
           "static, continuous (chunked prefill) or continuous-unchunked batching"),
    Column("overlap_scheduler", pa.bool_(), "bool",
           "the next iteration scheduled while one runs: a busy engine admits an arrival one iteration later"),
    Column("prefill_tp", pa.int32(), "count", "disagg: tensor-parallel ranks of a prefill replica"),
    Column("prefill_instances", pa.int32(), "count", "disagg: prefill replicas"),
    Column("prefill_ep", pa.int32(), "count", "disagg: expert-parallel ranks among a prefill replica's ranks"),
    Column("prefill_attention_dp", pa.bool_(), "bool", "disagg: attention data parallelism in the prefill replicas"),
    Column("prefill_dispatch", pa.dictionary(pa.int8(), pa.string()), "enum",
           "disagg: the prefill replicas' dispatch algorithm"),
    Column("instances", pa.int32(), "count",
           "(decode) replicas: devices / (tp * pp), disagg (devices - prefill_instances * prefill_tp) / (tp * pp)"),
)

#: metric columns, in output order
METRICS: tuple[Column, ...] = (
    Column("ttft_s", pa.float64(), "s", "mean time to first token (queueing and, disagg, the KV transfer included)",
           kernel="kernels.serving.analytic_one, disagg_one / kernels.serving_sim.simulate_one, simulate_disagg_one"),
    Column("ttft_p90_s", pa.float64(), "s", "90th percentile TTFT (simulated rows)", nullable=True,
           kernel="kernels.serving_sim.simulate_one, simulate_disagg_one"),
    Column("tpot_s", pa.float64(), "s", "mean time per output token after the first",
           kernel="kernels.serving.analytic_one, disagg_one / kernels.serving_sim.simulate_one, simulate_disagg_one"),
    Column("tpot_p90_s", pa.float64(), "s", "90th percentile TPOT (simulated rows)", nullable=True,
           kernel="kernels.serving_sim.simulate_one, simulate_disagg_one"),
    Column("e2e_latency_s", pa.float64(), "s", "mean request latency, arrival to last token"),
    Column("output_tokens_per_s_per_gpu", pa.float64(), "tokens/s", "generated tokens per second of the deployment / devices"),
    Column("output_tokens_per_s_per_user", pa.float64(), "tokens/s", "1 / tpot_s: a user's decode speed"),
    Column("requests_per_s", pa.float64(), "requests/s", "completed requests per second of the deployment"),
    Column("batch", pa.float64(), "requests", "mean running requests per engine (analytic tier)"),
    Column("prefill_s", pa.float64(), "s", "prefill of one wave / one prompt (analytic tier)",
           kernel="kernels.serving.wave_s"),
    Column("decode_step_s", pa.float64(), "s", "one decode iteration at the batch (analytic tier)",
           kernel="kernels.serving.wave_s"),
    Column("tokens_per_step", pa.float64(), "tokens",
           "tokens a decoding request emits per decode iteration: (1 - a^(k+1)) / (1 - a) for k drafts accepted "
           "at rate a (simulated rows: measured), 1 without drafts", kernel="kernels.serving.expected_tokens"),
    Column("kv_transfer_s", pa.float64(), "s", "disagg: one prompt's KV cache from prefill to decode replica",
           kernel="kernels.serving.kv_transfer_s"),
    Column("placement_imbalance", pa.float64(), "ratio",
           "MoE: the busiest EP rank's expected expert load over the mean rank's in a (decode) replica from expert "
           "popularity after the slots' placement (1: even); the routing's sampling noise multiplies it in the "
           "kernels (kernels.routing)", kernel="spaces.expert_balance.imbalance"),
    Column("kv_capacity_tokens", pa.float64(), "tokens", "tokens the KV cache of one replica holds",
           kernel="kernels.serving.kv_capacity_tokens"),
    Column("mem_weights_bytes", pa.float64(), "bytes", "weights on the fullest device",
           kernel="kernels.inference.device_weight_bytes"),
    Column("mem_kv_bytes", pa.float64(), "bytes", "KV cache of the running batches' whole sequences, per device"),
    Column("mem_peak_bytes", pa.float64(), "bytes", "weights + framework overhead + mem_kv_bytes per device"),
    Column("feasible", pa.bool_(), "bool", "fits in memory, sustains the load and meets the SLA"),
    Column("infeasible_reason", pa.dictionary(pa.int8(), pa.string()), "enum", "why not feasible ('ok' when feasible)"),
    Column("simulated", pa.bool_(), "bool", "latency and throughput columns come from the iteration-level simulation"),
)
COLUMNS = STRATEGY + METRICS
BY_NAME = {c.name: c for c in COLUMNS}

#: ranking, one key after another as (column, descending); row_id breaks the last ties.
#: Feasible first; then the simulated rows, whose values (and p90 targets) the
#: simulation checked, before the rest, whose analytic values are closed forms the
#: simulation mostly lowers (so a row it was not asked to run would otherwise rank
#: above the rows it ran); then throughput per GPU, then TTFT
RANK = (("feasible", True), ("simulated", True), ("output_tokens_per_s_per_gpu", True), ("ttft_s", False))


def arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS])


def column_docs() -> dict[str, dict[str, str]]:
    return {c.name: {"unit": c.unit, "doc": c.doc, **({"kernel": c.kernel} if c.kernel else {})} for c in COLUMNS}
