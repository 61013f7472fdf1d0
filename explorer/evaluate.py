"""The bridge from a loaded space to the kernels: pack parameters, evaluate columns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from paraspace.explorer import bands
from paraspace.results.schema import BAND_COLUMNS
from paraspace.kernels import params
from paraspace.kernels.codes import ZERO_3, ZERO_3_DEFERRED
from paraspace.kernels.event_tier import DEFAULT_BUCKETS, SIM_OUTPUTS, simulate_rows, task_bound
from paraspace.kernels.training import OUTPUTS, evaluate_rows
from paraspace.spaces.catalog import LoadedSpace
from paraspace.spaces.encode import DIMENSION_NAMES, Encoder
from paraspace.spaces.enums import DTYPE_BYTES, AllReduceAlgorithm, Collective, parse
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.schema import GB, Dimensions, Hardware, Model, SpaceSpec, validate

#: bytes per element of the 16-bit activations/weights, fp32 main gradients and
#: fp32 master + Adam m + v (Megatron distributed optimizer: 2 + 4 + 12 = 18 bytes/param)
ACT_BYTES = 2.0
GRAD_BYTES = 4.0
OPTIMIZER_BYTES = 12.0
#: 8-bit GEMMs (Transformer Engine FP8 recipes) cast each 16-bit operand: read 2 bytes, write 1
CAST_BYTES_8BIT = 3.0
EIGHT_BIT_DTYPES = ("fp8", "int8")
MIB = 1024**2


@dataclass(frozen=True)
class Packed:
    """Everything the kernels need besides the strategy columns."""

    model: np.ndarray
    device: np.ndarray
    tiers: np.ndarray
    tiles: np.ndarray
    workload: np.ndarray
    #: the hardware's calibration family (``explorer.bands.family_of``): which
    #: uncertainty band a prediction carries
    family: str = "other"


def pack_model(model: Model) -> np.ndarray:
    extra: dict[str, float] = {"mtp_depth": model.mtp_depth, "sliding_window": model.sliding_window}
    if model.moe is not None:
        moe = model.moe
        extra.update(experts=moe.experts, top_k=moe.top_k, expert_ffn=moe.expert_ffn,
                     shared_experts=moe.shared_experts, dense_layers=moe.dense_layers, max_nodes=moe.max_nodes)
    if model.mla is not None:
        mla = model.mla
        extra.update(mla=1.0, q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                     qk_nope_head_dim=mla.qk_nope_head_dim, qk_rope_head_dim=mla.qk_rope_head_dim,
                     v_head_dim=mla.v_head_dim)
    return params.record(
        params.MODEL,
        layers=model.layers, hidden=model.hidden, heads=model.heads, kv_heads=model.kv_heads,
        head_dim=model.d_head, ffn=model.ffn, vocab=model.vocab, glu=model.glu, bias=model.bias,
        tied_embeddings=model.tied_embeddings, dropout=model.dropout, **extra,
    )


def _table_fits(hw: Hardware, field: str, points: tuple, limit: int) -> None:
    if len(points) > limit:
        raise CatalogError(hw.name, field, f"{len(points)} points", f"at most {limit} points")


def pack_hardware(hw: Hardware, dtype: str, attention_kernel: str = "flash2",
                  fp8_scaling: str = "tensor") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dev = hw.device
    device = params.record(
        params.DEVICE,
        peak_flops_per_s=dev.peak_flops_per_s(dtype), hbm_bytes_per_s=dev.hbm_bandwidth_bytes_per_s,
        peak_16bit_flops_per_s=dev.peak_flops_per_s("bf16") if "bf16" in dev.peak_TFLOP_per_s else 0.0,
        hbm_capacity_bytes=dev.hbm_capacity_bytes, compute_units=dev.compute_units,
        launch_s=dev.launch_overhead_s, gemm_max_efficiency=dev.gemm_max_efficiency,
        gemm_k_fill=dev.gemm_k_fill_bytes / DTYPE_BYTES[dtype],
        gemm_k_fill_16bit=dev.gemm_k_fill_bytes / DTYPE_BYTES["bf16"],
        gemm_scaling_overhead=dev.gemm_scaling_overhead_of(dtype, fp8_scaling),
        attention_efficiency=dev.attention_efficiency_of(attention_kernel), memory_efficiency=dev.memory_efficiency,
        memory_overhead_bytes=dev.memory_overhead_bytes, memory_fragmentation=dev.memory_fragmentation,
        comm_buffer_bytes=dev.comm_buffer_bytes, host_link_bytes_per_s=dev.host_link_bytes_per_s,
        host_memory_bytes_per_s=dev.host_memory_bytes_per_s, host_capacity_bytes=dev.host_capacity_bytes,
        kernel_fusion=dev.kernel_fusion,
    )
    _table_fits(hw, "device.gemm_efficiency", dev.gemm_efficiency, params.MAX_GEMM_POINTS)
    points = np.asarray(dev.gemm_efficiency, dtype=np.float64).reshape(-1, 4)
    device["n_gemm"] = len(points)
    for j, name in enumerate(("gemm_m", "gemm_n", "gemm_k", "gemm_eff")):
        device[name][0, : len(points)] = points[:, j]
    tiers = params.tier_table([
        (link.domain_devices or 0, link.bandwidth_bytes_per_s * link.efficiency / link.shared_by, link.latency_s)
        for link in hw.links
    ])
    for i, link in enumerate(hw.links):
        for op, gb in link.op_bandwidth_GB_per_s.items():
            tiers["op_scale"][i, int(parse(Collective, op))] = gb * GB / tiers["bytes_per_s"][i]
        tiers["allreduce_algorithm"][i] = int(parse(AllReduceAlgorithm, link.allreduce_algorithm))
        _table_fits(hw, f"links.{i}.size_curve", link.size_curve, params.MAX_CURVE_POINTS)
        tiers["n_curve"][i] = len(link.size_curve)
        for j, (mib, fraction) in enumerate(link.size_curve):
            tiers["curve_bytes"][i, j] = mib * MIB
            tiers["curve_fraction"][i, j] = fraction
    tiles = np.asarray(dev.gemm_tiles, dtype=np.float64)
    return device, tiers, tiles


def pack_space_hardware(space, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pack_hardware`` of a training or serving space (``LoadedSpace``, ``LoadedServing``)
    for GEMMs in ``dtype``: the attention kernel its model runs for the one the space names
    (``Model.attention_kernel``) and the space's FP8 scaling recipe."""
    spec = space.spec
    return pack_hardware(space.hardware, dtype, space.model.attention_kernel(spec.attention_kernel), spec.fp8_scaling)


def pack(space: LoadedSpace) -> Packed:
    spec = space.spec
    device, tiers, tiles = pack_space_hardware(space, spec.dtype)
    workload = params.record(
        params.WORKLOAD,
        global_batch=spec.global_batch, seq_len=spec.seq_len,
        act_bytes=ACT_BYTES, weight_bytes=ACT_BYTES, grad_bytes=GRAD_BYTES, optimizer_bytes=OPTIMIZER_BYTES,
        flash_attention=spec.flash_attention,
        gemm_cast_bytes=CAST_BYTES_8BIT if spec.dtype in EIGHT_BIT_DTYPES else 0.0,
        moe_imbalance=params.DERIVED_IMBALANCE if spec.moe_imbalance is None else spec.moe_imbalance,
        quantize_attention=1.0 if spec.quantized_gemms == "all" else 0.0,
        loss_bytes=params.LOSS_BYTES[spec.cross_entropy],
        eager_elementwise=1.0 if spec.elementwise == "eager" else 0.0,
        checkpoint_early_stop=1.0 if spec.checkpoint == "early-stop" else 0.0,
        zero3_master_shard=1.0 if spec.zero3_shard == "master" else 0.0,
        dispatch_bytes=params.DISPATCH_BYTES[spec.dispatch_dtype],
    )
    return Packed(pack_model(space.model), device, tiers, tiles, workload, family=bands.family_of(space.hardware.name))


def pin(space: LoadedSpace, strategy: Mapping[str, Any]) -> LoadedSpace:
    """``space`` narrowed to one strategy: the one way a single configuration is evaluated.

    Every setting of the space is kept (model, hardware, workload, dtype,
    ``attention_kernel``, ``uneven_layers``, ``moe_imbalance``,
    ``quantized_gemms``, ...); each dimension is pinned to ``strategy``'s value,
    else to the space's own value where it has only one, else to its default.
    ``dp``, unless given or single in the space, stays derived as
    devices / (tp * pp * cp). ``devices`` in ``strategy`` picks the cluster size
    (required when the space has several). The result is encoded and evaluated
    like any space (``Encoder``, ``pack``, ``evaluate``), so ``paraspace eval``
    and ``trace`` of a sweep or study row reproduce that row exactly.

    Raises ``CatalogError`` for an unknown dimension or value, a cluster size
    left open, or a derived dp that tp * pp * cp cannot give.
    """
    spec = space.spec
    given = dict(strategy)
    raw = {k: v for k, v in space.raw.items() if k != "dimensions"}
    if "devices" in given:
        raw["devices"] = given.pop("devices")
    elif len(spec.device_counts) > 1:
        raise CatalogError(space.source, "devices", list(spec.device_counts),
                           "one device count for a single configuration (--devices N)")
    dims: dict[str, Any] = {}
    for name in Dimensions.model_fields:
        values = getattr(spec.dimensions, name)
        if name not in given and values is not None and len(values) == 1:
            dims[name] = values
    dims.update({name: (value,) for name, value in given.items()})  # unknown names: the schema's error
    raw["dimensions"] = dims
    try:
        pinned = validate(SpaceSpec, raw, space.source)
    except CatalogError as err:
        # a value given on the command line: name the option, not the schema's list index
        name = err.field.removeprefix("dimensions.").split(".")[0]
        if err.field.startswith("dimensions.") and name in given:
            raise CatalogError("command line", f"--set {name}", given[name], err.expected) from None
        raise
    if pinned.dimensions.dp is None:
        others = 1
        for name in ("tp", "pp", "cp"):
            others *= getattr(pinned.dimensions, name)[0]
        devices = pinned.device_counts[0]
        if devices % others:
            # blame where the sizes came from: the command line's --set where it gave one
            from_set = [f"{name}={strategy[name]}" for name in ("tp", "pp", "cp", "devices") if name in strategy]
            if from_set:
                raise CatalogError("command line", f"--set {' --set '.join(from_set)}: tp*pp*cp", others,
                                   f"a divisor of devices = {devices}")
            raise CatalogError(space.source, "tp*pp*cp", others, f"a divisor of devices = {devices}")
    return LoadedSpace(spec=pinned, model=space.model, hardware=space.hardware, source=space.source, raw=raw)


def row_id_in(space: LoadedSpace, row: Mapping[str, Any]) -> int | None:
    """The ``row_id`` one configuration has in ``space``'s enumeration (the id a sweep or study of
    ``space`` gives it), ``row`` being its encoded strategy columns (``Encoder`` codes); None where
    ``space`` does not hold it (a value outside a dimension's list, a dp its derivation would not
    give) or is too large to enumerate."""
    try:
        encoder = Encoder(space)
    except CatalogError:
        return None
    positions = {}
    for name in DIMENSION_NAMES:
        at = np.flatnonzero(encoder.values[name] == (0 if name == "dp" and encoder.derive_dp else row[name]))
        if at.size == 0:
            return None
        positions[name] = at[:1]
    rid = encoder.row_ids(positions)
    found = encoder.encode_ids(rid)  # the same combination there, dp derived as the space derives it
    if found.n_rows != 1 or any(int(found.columns[n][0]) != int(row[n]) for n in DIMENSION_NAMES):
        return None
    return int(rid[0])


#: rows whose step graph would exceed this many tasks are not simulated (their
#: step_time_s stays analytic); bounds the event tier's time and memory per row
DEFAULT_MAX_TASKS = 200_000


#: the strategy columns in the order the row kernels take them (evaluate_rows,
#: simulate_rows, row_graph), followed there by the parameter records
KERNEL_ARGS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "recompute", "sequence_parallel", "tp_overlap", "zero",
               "optimizer", "schedule", "ep", "expert_tp", "ep_placement", "dispatch", "tbo", "recompute_layers",
               "offload_activations", "offload_weights", "n_microbatches")


def kernel_zero(zero: Any, defer: Any) -> Any:
    """The ZeRO code the kernels take (``kernels.codes``): the row's stage, or
    ``ZERO_3_DEFERRED`` where a ZeRO-3 row defers its gradient reduction
    (``defer_grad_sync``); arrays in, an array out, ints in, an int out."""
    code = np.where((np.asarray(defer) != 0) & (np.asarray(zero) >= ZERO_3), ZERO_3_DEFERRED, zero).astype(np.int8)
    return code if code.ndim else int(code)


def kernel_strategy(cols: Mapping[str, Any]) -> tuple[Any, ...]:
    """The strategy arguments of the row kernels (``KERNEL_ARGS``) from encoded columns
    (or one row's values): ``zero`` as ``kernel_zero`` codes it (columns without
    ``defer_grad_sync``, built by hand, defer nothing)."""
    return tuple(kernel_zero(cols["zero"], cols.get("defer_grad_sync", 0)) if k == "zero" else cols[k]
                 for k in KERNEL_ARGS)


def analytic(packed: Packed, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The analytic tier's columns (``kernels.training.OUTPUTS``) for every row."""
    out = evaluate_rows(*kernel_strategy(cols), packed.model, packed.device, packed.tiers, packed.tiles,
                        packed.workload)
    return {name: np.ascontiguousarray(out[:, i]) for i, name in enumerate(OUTPUTS)}


#: the event engine counts int64 nanoseconds, which wrap around past 2**63 ns (292 years);
#: a simulated step stays within a small multiple of its closed form, so rows whose
#: closed form exceeds 1e9 s (32 years, 2**8 below the wrap) keep their analytic time
SIM_HORIZON_S = 1e9
#: and its tasks last whole nanoseconds: a closed-form step under a microsecond (1,000
#: ticks) would lose most of its tasks to rounding (under a nanosecond, all of them: a
#: 0 s step read as infinite throughput), so such rows keep their analytic time too
SIM_FLOOR_S = 1e-6


def simulable(cols: dict[str, np.ndarray], metrics: dict[str, np.ndarray], *, max_tasks: int = DEFAULT_MAX_TASKS,
              n_buckets: int = DEFAULT_BUCKETS) -> np.ndarray:
    """Rows the event tier takes: feasible, with a graph of at most ``max_tasks`` tasks,
    and a closed-form step the engine's clock can time (``SIM_FLOOR_S`` to ``SIM_HORIZON_S``)."""
    tasks = task_bound(cols["pp"], cols["vpp"], cols["schedule"], cols["n_microbatches"], cols["zero"], n_buckets)
    step = metrics["step_time_analytic_s"]
    return (metrics["feasible"] > 0) & (tasks <= max_tasks) & (step >= SIM_FLOOR_S) & (step < SIM_HORIZON_S)


def unsimulated(step_time_analytic_s: np.ndarray) -> dict[str, np.ndarray]:
    """The event tier's columns (``kernels.event_tier.SIM_OUTPUTS``) of rows it does
    not simulate, as ``simulate_rows`` gives them (the analytic step time,
    ``simulated`` 0, NaN elsewhere), without a pass over the rows' strategies."""
    n = len(step_time_analytic_s)
    cols = {name: np.full(n, np.nan) for name in SIM_OUTPUTS}
    cols["step_time_s"] = step_time_analytic_s.copy()
    cols["simulated"] = np.zeros(n)
    return cols


def evaluate(packed: Packed, cols: dict[str, np.ndarray], *, simulate: bool = True,
             max_tasks: int = DEFAULT_MAX_TASKS, n_buckets: int = DEFAULT_BUCKETS,
             only: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Metric columns for encoded strategy columns: the analytic tier on every row,
    then the event tier (``kernels.event_tier.SIM_OUTPUTS``) on the ``simulable``
    rows, restricted to the sorted ``row_id``s in ``only`` when given."""
    metrics = analytic(packed, cols)
    select = simulable(cols, metrics, max_tasks=max_tasks, n_buckets=n_buckets) if simulate \
        else np.zeros(len(cols["tp"]), dtype=bool)
    if only is not None:
        select &= np.isin(cols["row_id"], only, assume_unique=True)
    if select.any():
        sim = simulate_rows(*kernel_strategy(cols), packed.model, packed.device, packed.tiers, packed.tiles,
                            packed.workload, select, metrics["step_time_analytic_s"], metrics["tokens_per_s_per_gpu"],
                            metrics["mfu"], n_buckets)
        metrics.update({name: np.ascontiguousarray(sim[:, i]) for i, name in enumerate(SIM_OUTPUTS)})
    else:
        metrics.update(unsimulated(metrics["step_time_analytic_s"]))
    stuck = np.flatnonzero(metrics["simulated"] < 0)
    if stuck.size:
        rows = ", ".join(f"row_id {cols['row_id'][i]}" for i in stuck[:5])
        raise ScheduleError(f"{stuck.size} candidates' schedules deadlocked in the event engine ({rows}); "
                            "run 'paraspace trace' on one to see the stuck tasks")
    # the 80% band of the prediction, from the validation's leave-one-source-out residuals
    lo, hi = bands.band_factors(bands.committed(), bool(packed.model["experts"][0] > 0), packed.family,
                                cols["pp"] > 1, cols["devices"])
    low, high = BAND_COLUMNS
    metrics[low] = metrics["step_time_s"] * lo
    metrics[high] = metrics["step_time_s"] * hi
    return metrics


class ScheduleError(RuntimeError):
    """A simulated schedule could not finish: its order contradicts its dependencies."""
