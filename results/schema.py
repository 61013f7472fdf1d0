"""The Parquet schema: every metric column's name, unit, storage type and meaning.

This is the one place that names output columns. Strategy columns come from
the space's dimension table (``spaces.encode.DIMENSIONS``) and are passed in
by the explorer; metric columns are the kernels' outputs
(``kernels.training.OUTPUTS``, pinned to this table by ``tests/test_schema.py``).
Units are in the names (``_s`` seconds, ``_bytes`` bytes, ``_per_s`` rates).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    unit: str
    doc: str
    #: null where the value does not exist (event-tier columns of rows not simulated)
    nullable: bool = False
    #: the kernels that produce a breakdown column (module.function, in kernels/)
    kernel: str = ""


#: Identity and derived columns written before the strategy columns.
ROW_ID = Column("row_id", pa.int64(), "index", "position of the combination in the space's flat product (stable id)")
N_MICROBATCHES = Column("n_microbatches", pa.int32(), "count", "micro-batches per pipeline per step")

#: the breakdown columns that add up to step_time_analytic_s, for every row (tests/test_breakdown.py):
#: the bottleneck stage's m passes, the bubble, DualPipe's credit (<= 0), then the step's other parts.
#: recompute_s is not among them (it is part of compute_s and tp_comm_s), nor moe_dispatch_s (one
#: dispatch, inside ep_comm_s and compute_s)
STEP_PARTS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "offload_s", "bubble_s", "dualpipe_credit_s",
              "pp_comm_s", "dp_comm_s", "optimizer_s")

#: Metric columns, in output order: the prediction used for ranking first, then
#: the analytic tier's closed form with its breakdown (kernels.training.OUTPUTS),
#: then the event tier's extras (kernels.event_tier.SIM_OUTPUTS).
METRICS: tuple[Column, ...] = (
    Column("step_time_s", pa.float64(), "s", "predicted step time: simulated by the event engine where simulated, else the analytic step_time_analytic_s", kernel="kernels.event_tier.simulate_rows (kernels.engine.simulate) or kernels.training.evaluate_one"),
    Column("step_time_lo_s", pa.float64(), "s", "low end of step_time_s's 80% band: the 10% quantile of measured / predicted over the validation's leave-one-source-out predictions of the row's class", kernel="explorer.bands.band_factors (a factor on the prediction)"),
    Column("step_time_hi_s", pa.float64(), "s", "high end of step_time_s's 80% band: the 90% quantile", kernel="explorer.bands.band_factors (a factor on the prediction)"),
    Column("simulated", pa.bool_(), "bool", "step_time_s comes from the event engine"),
    Column("tokens_per_s_per_gpu", pa.float64(), "tokens/s", "global_batch * seq_len / (step_time_s * devices)"),
    Column("mfu", pa.float64(), "fraction", "model FLOP (3 passes, causal attention) / (step_time_s * devices * dense peak)"),
    Column("step_time_analytic_s", pa.float64(), "s", "closed-form step time: " + " + ".join(STEP_PARTS), kernel="kernels.training.evaluate_one"),
    Column("compute_s", pa.float64(), "s", "compute on the bottleneck device: GEMMs, attention, memory-bound ops, recompute", kernel="kernels.ops.gemm_time_s, attention_qkv_fwd_bwd_s, memory_bound_s; kernels.moe.grouped_gemm_s"),
    Column("tp_comm_s", pa.float64(), "s", "exposed tensor-parallel collectives (incl. vocab-parallel embedding and loss)", kernel="kernels.collectives.collective_time_s (all-reduce / all-gather / reduce-scatter); kernels.parallel_comm.tp_layer_comm_s, overlapped_s"),
    Column("cp_comm_s", pa.float64(), "s", "context-parallel K/V ring traffic not hidden behind attention", kernel="kernels.collectives.collective_time_s (send/recv ring)"),
    Column("pp_comm_s", pa.float64(), "s", "pipeline send/recv on the fill and drain critical path", kernel="kernels.collectives.collective_time_s (send/recv)"),
    Column("dp_comm_s", pa.float64(), "s", "data-parallel gradient / ZeRO traffic not hidden behind backward or forward", kernel="kernels.collectives.collective_time_s (all-reduce / reduce-scatter / all-gather)"),
    Column("ep_comm_s", pa.float64(), "s", "expert-parallel dispatch/combine (kernels.moe) not hidden behind expert compute", kernel="kernels.moe.dispatch_s, combine_s, two_batch_exposed_s"),
    Column("moe_dispatch_s", pa.float64(), "s", "one dispatch of one MoE layer's micro-batch with its permutation passes (kernels.moe; 0 on dense models)", kernel="kernels.moe.dispatch_s, local_pass_s"),
    Column("expert_gemm_rows", pa.float64(), "rows", "tokens per local expert on the busiest rank: the grouped GEMM's m"),
    Column("expert_gemm_efficiency", pa.float64(), "fraction", "achieved / peak of the expert gate/up GEMM at expert_gemm_rows (kernels.ops)", kernel="kernels.ops.gemm_efficiency"),
    Column("bubble_s", pa.float64(), "s", "pipeline bubble: idle time of the bottleneck device", kernel="kernels.schedules.pipeline_s (closed form per schedule)"),
    Column("dualpipe_credit_s", pa.float64(), "s", "<= 0, a negative part that the sum includes: a DualPipe device runs two stages (d and pp-1-d), so its steady work is m times the mean of its two stages' passes, less than the m passes of the slowest stage that compute_s, tp_comm_s, cp_comm_s, ep_comm_s and offload_s count; 0 on every other schedule", kernel="kernels.schedules.dualpipe_steady_s (DualPipe steady work)"),
    Column("optimizer_s", pa.float64(), "s", "optimizer step of this device's shard (on the device; host-link paging and the CPU step for the host-side optimizers)", kernel="kernels.optimizer.optimizer_step_s"),
    Column("recompute_s", pa.float64(), "s", "part of compute_s and tp_comm_s spent recomputing activations", kernel="kernels.recompute.recompute_s (the recomputed forward); kernels.stage_pass.layers_pass_s"),
    Column("offload_s", pa.float64(), "s", "host-link transfers of offloaded activations / weights not hidden behind compute", kernel="kernels.offload.host_exposed_s"),
    Column("stage_fwd_s", pa.float64(), "s", "forward of one micro-batch on the bottleneck device", kernel="kernels.stage_pass.layers_pass_s"),
    Column("stage_bwd_s", pa.float64(), "s", "backward of one micro-batch on the bottleneck device", kernel="kernels.stage_pass.layers_pass_s"),
    Column("model_flop_per_step", pa.float64(), "FLOP", "model FLOP of one step: 3 x forward, causal attention, no recompute"),
    Column("bubble_sim_s", pa.float64(), "s", "simulated idle compute time of the busiest device", nullable=True, kernel="kernels.event_tier.step_metrics"),
    Column("pp_exposed_sim_s", pa.float64(), "s", "simulated pipeline send time not overlapped by compute (worst device)", nullable=True, kernel="kernels.event_tier.step_metrics (kernels.engine.exposed_ns)"),
    Column("dp_exposed_sim_s", pa.float64(), "s", "simulated data-parallel / ZeRO time not overlapped by compute (worst device)", nullable=True, kernel="kernels.event_tier.step_metrics (kernels.engine.exposed_ns)"),
    Column("ep_exposed_sim_s", pa.float64(), "s", "simulated MoE dispatch/combine time not overlapped by compute (worst device; with DualPipe, what the paired pass's compute leaves exposed)", nullable=True, kernel="kernels.event_tier.step_metrics (kernels.engine.exposed_ns)"),
    Column("inflight_peak_stage0", pa.float64(), "micro-batches", "simulated peak micro-batches (stage-equivalents) whose activations stage 0 holds", nullable=True),
    Column("n_tasks", pa.float64(), "count", "tasks in the simulated step graph", nullable=True),
    Column("mem_weights_bytes", pa.float64(), "bytes", "16-bit weights on the peak-memory device", kernel="kernels.memory.stage_state_bytes (kernels.parameters.stage_params)"),
    Column("mem_grads_bytes", pa.float64(), "bytes", "fp32 main gradients on the peak-memory device", kernel="kernels.memory.stage_state_bytes (kernels.parameters.stage_params)"),
    Column("mem_optimizer_bytes", pa.float64(), "bytes", "optimizer states on the peak-memory device (fp32 master weights and Adam moments, or the optimizer's share of them)", kernel="kernels.memory.stage_state_bytes; kernels.optimizer OPT_STATE_FRACTION"),
    Column("mem_activations_bytes", pa.float64(), "bytes", "activations held at the schedule's peak (and fp32 logits on the last stage)", kernel="kernels.memory.activation_bytes_per_layer, moe_activation_bytes_per_layer, stage_activation_bytes; kernels.schedules.in_flight_chunks"),
    Column("mem_moe_buffers_bytes", pa.float64(), "bytes", "MoE dispatch staging and per-expert token buffers of the layer in flight", kernel="kernels.moe.staging_bytes"),
    Column("mem_host_bytes", pa.float64(), "bytes", "host memory of the peak-memory device: offloaded activations, weights and gradients, CPU-Adam states, paged 8-bit Adam moments", kernel="kernels.memory.stage_state_bytes, stage_activation_bytes (offload and CPU Adam)"),
    Column("mem_overhead_bytes", pa.float64(), "bytes", "memory beside the tensors at the peak stage: the profile's fixed overhead, communication buffers per process group, allocator fragmentation (a fraction of the tensors)", kernel="kernels.memory.fixed_overhead_bytes"),
    Column("mem_peak_bytes", pa.float64(), "bytes", "peak memory of the most loaded device", kernel="kernels.training.evaluate_one"),
    Column("mem_peak_stage", pa.int32(), "index", "pipeline stage of the most loaded device"),
    Column("feasible", pa.bool_(), "bool", "mem_peak_bytes fits in HBM (and, in a study with --max-mem, under that cap: the 'mem_cap_bytes' of the paraspace.study footer) and every device's offloaded tensors in its host memory"),
    Column("infeasible_reason", pa.dictionary(pa.int8(), pa.string()), "enum", "why not feasible ('ok' when feasible)"),
)
METRIC_NAMES = tuple(c.name for c in METRICS)
#: metric columns computed beside the kernels: the prediction's 80% band (explorer.bands)
BAND_COLUMNS = ("step_time_lo_s", "step_time_hi_s")
BY_NAME = {c.name: c for c in (ROW_ID, N_MICROBATCHES, *METRICS)}

#: default ranking: feasible first, then fastest, then least memory
RANK_BY = ("step_time_s", "mem_peak_bytes")

#: metadata keys in the Parquet footer
META_VERSION = "paraspace.version"
META_SPACE = "paraspace.space"
#: SHA-256 of the space definition a file came from (the space TOML with command-line
#: overrides, the resolved model and hardware): files with different digests are different problems
META_DIGEST = "paraspace.space_sha256"
META_CATALOG = "paraspace.catalog_sha256"
META_ENCODING = "paraspace.encoding"
META_COLUMNS = "paraspace.columns"
