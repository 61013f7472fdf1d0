"""Encode a strategy space into columns: one row per valid candidate.

The space is the Cartesian product of its dimensions' values, flattened in C
order (the last dimension varies fastest), so every combination has a stable
``row_id``. A chunk of that flat range is encoded with vectorized masks; each
dropped combination is charged to the first rule it breaks (``Reason`` order).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from paraspace.spaces.catalog import LoadedSpace
from paraspace.spaces.enums import Dispatch, Dtype, Optimizer, Placement, Recompute, Reason, Schedule, labels, parse
from paraspace.spaces.errors import CatalogError


@dataclass(frozen=True)
class Dimension:
    """One strategy dimension: its column name, storage type and meaning."""

    name: str
    dtype: type[np.generic]
    doc: str
    #: values are members of this enum (stored as their codes)
    enum: type[IntEnum] | None = None
    #: values are 0/1 flags
    boolean: bool = False


#: Every strategy dimension, in the order of the product (slowest first).
DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("devices", np.int32, "devices in the cluster (the space's devices value or list)"),
    Dimension("tp", np.int32, "tensor-parallel size"),
    Dimension("pp", np.int32, "pipeline-parallel size (stages)"),
    Dimension("dp", np.int32, "data-parallel size"),
    Dimension("cp", np.int32, "context-parallel size"),
    Dimension("vpp", np.int32, "virtual pipeline chunks per device"),
    Dimension("micro_batch", np.int32, "sequences per micro-batch"),
    Dimension("recompute", np.int8, "activation recomputation: none, selective (attention core), full (whole layers), "
              "norms (the two norms), moe-dispatch (the MoE dispatch)", enum=Recompute),
    Dimension("recompute_layers", np.int32, "with full recompute: only the last k layers of each device (0: all)"),
    Dimension("offload_activations", np.int8, "stored activations offloaded to host memory, overlapped with compute",
              boolean=True),
    Dimension("offload_weights", np.int8, "weights and gradients streamed from/to host memory layer by layer",
              boolean=True),
    Dimension("sequence_parallel", np.int8, "Megatron sequence parallelism", boolean=True),
    Dimension("tp_overlap", np.int8, "TP collectives overlapped with their GEMMs in chunks (Megatron "
              "--tp-comm-overlap)", boolean=True),
    Dimension("zero", np.int8, "ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +parameters"),
    Dimension("optimizer", np.int8, "optimizer: Adam on the device, 8-bit Adam, Adam on the host (ZeRO-Offload), "
              "Adam without fp32 master weights, or paged 8-bit Adam (states on the host)", enum=Optimizer),
    Dimension("schedule", np.int8, "pipeline schedule", enum=Schedule),
    Dimension("ep", np.int32, "expert-parallel size (MoE)"),
    Dimension("expert_tp", np.int32, "tensor-parallel size inside each expert (MoE)"),
    Dimension("ep_placement", np.int8, "EP group on adjacent ranks (inner) or spread over expert DP (outer)",
              enum=Placement),
    Dimension("dispatch", np.int8, "MoE token dispatch/combine algorithm", enum=Dispatch),
    Dimension("tbo", np.int8, "two-batch overlap of dispatch/combine with expert compute", boolean=True),
)
DIMENSION_NAMES = tuple(d.name for d in DIMENSIONS)
BY_NAME = {d.name: d for d in DIMENSIONS}

#: The most combinations a space may have: row ids are int64.
MAX_COMBINATIONS = 2**63 - 1

#: Columns the encoder derives from the dimensions.
DERIVED = {
    "row_id": (np.int64, "index of the combination in the space's flat product"),
    "n_microbatches": (np.int32, "micro-batches per pipeline per step: global_batch / (dp * micro_batch)"),
}


def dimension_values(space: LoadedSpace) -> dict[str, np.ndarray]:
    """Each dimension's allowed values as an integer array, checked.

    An omitted ``dp`` is the single placeholder value 0: the encoder derives it
    per row as devices / (tp * pp * cp), so the product never enumerates data-
    parallel sizes that cannot fill the cluster."""
    spec = space.spec
    out: dict[str, np.ndarray] = {}
    for dim in DIMENSIONS:
        if dim.name == "devices":
            raw = spec.device_counts
            where = "devices"
        else:
            raw = getattr(spec.dimensions, dim.name)
            where = f"dimensions.{dim.name}"
        if raw is None:  # dp omitted: derived per row as devices / (tp * pp * cp)
            out[dim.name] = np.zeros(1, dtype=dim.dtype)
            continue
        if len(raw) == 0:
            raise CatalogError(space.source, where, list(raw), "at least one value")
        if len(set(raw)) != len(raw):
            raise CatalogError(space.source, where, list(raw), "distinct values")
        if dim.enum is not None:
            try:
                raw = tuple(int(parse(dim.enum, v)) for v in raw)
            except ValueError:
                bad = next(v for v in raw if v not in labels(dim.enum))
                raise CatalogError(space.source, where, bad, f"one of {labels(dim.enum)}") from None
        out[dim.name] = np.asarray([int(v) for v in raw], dtype=dim.dtype)
    return out


def check_space(space: LoadedSpace) -> None:
    """Space-level checks beyond the schema (precision known to the hardware)."""
    spec = space.spec
    if spec.dtype not in labels(Dtype):
        raise CatalogError(space.source, "dtype", spec.dtype, f"one of {labels(Dtype)}")
    peaks = space.hardware.device.peak_TFLOP_per_s
    if spec.dtype not in peaks:
        raise CatalogError(space.source, "dtype", spec.dtype, f"a precision {space.hardware.name} has: {sorted(peaks)}")


@dataclass
class Encoded:
    """A chunk of a space: the kept rows' columns and what was dropped. Serving spaces
    (``spaces.serving.encode``) fill it with their own reason codes (``ServingReason``)."""

    columns: dict[str, np.ndarray]
    n_combinations: int
    #: combinations charged to each Reason (index = Reason value; [VALID] = kept)
    first_reason: np.ndarray = field(default_factory=lambda: np.zeros(len(Reason), np.int64))
    #: combinations that break each rule at all (a row may break several)
    breaks: np.ndarray = field(default_factory=lambda: np.zeros(len(Reason), np.int64))

    @property
    def n_rows(self) -> int:
        return int(self.columns["row_id"].shape[0])


class Encoder:
    """Encodes a loaded space chunk by chunk; checks it once on construction."""

    def __init__(self, space: LoadedSpace) -> None:
        check_space(space)
        self.space = space
        self.values = dimension_values(space)
        self.derive_dp = space.spec.dimensions.dp is None
        self.shape = tuple(len(self.values[n]) for n in DIMENSION_NAMES)
        # counted in Python ints: an int64 product would wrap around
        self.n_combinations = math.prod(self.shape)
        if self.n_combinations > MAX_COMBINATIONS:
            raise CatalogError(space.source, "dimensions", self.n_combinations,
                               f"at most {MAX_COMBINATIONS:,} combinations (row ids are int64): fewer values per "
                               f"dimension (they have {' x '.join(map(str, self.shape))})")

    def encode(self, start: int = 0, stop: int | None = None) -> Encoded:
        """Rows ``start:stop`` of the flat product, filtered."""
        stop = self.n_combinations if stop is None else min(stop, self.n_combinations)
        return self.encode_ids(np.arange(start, stop, dtype=np.int64))

    def row_ids(self, positions: dict[str, np.ndarray]) -> np.ndarray:
        """Row ids of combinations given as each dimension's value position."""
        return np.ravel_multi_index(tuple(positions[n] for n in DIMENSION_NAMES), self.shape).astype(np.int64)

    def encode_ids(self, flat: np.ndarray) -> Encoded:
        """The combinations with these row ids (in this order), filtered."""
        index = np.unravel_index(flat, self.shape)
        cols = {n: self.values[n][i] for n, i in zip(DIMENSION_NAMES, index)}
        if self.derive_dp:
            others = cols["tp"].astype(np.int64) * cols["pp"] * cols["cp"]
            devices = cols["devices"].astype(np.int64)
            cols["dp"] = np.where(devices % others == 0, devices // others, 0).astype(cols["dp"].dtype)
        reason, breaks = self._reasons(cols)
        keep = reason == Reason.VALID
        out = {n: np.ascontiguousarray(c[keep]) for n, c in cols.items()}
        out["row_id"] = flat[keep]
        out["n_microbatches"] = (self.space.spec.global_batch // (out["dp"] * out["micro_batch"])).astype(np.int32)
        return Encoded(
            columns=out,
            n_combinations=int(flat.shape[0]),
            first_reason=np.bincount(reason, minlength=len(Reason)).astype(np.int64),
            breaks=breaks,
        )

    def chunks(self, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[Encoded]:
        """Consecutive chunks of at most ``chunk_rows`` combinations."""
        stop = self.n_combinations if stop is None else min(stop, self.n_combinations)
        for lo in range(start, stop, chunk_rows):
            yield self.encode(lo, min(lo + chunk_rows, stop))

    def encode_all(self) -> Encoded:
        return self.encode(0, self.n_combinations)

    def _reasons(self, c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        spec, model = self.space.spec, self.space.model
        tp, pp, dp, cp, vpp, mb, ep, etp = (c[n].astype(np.int64) for n in (
            "tp", "pp", "dp", "cp", "vpp", "micro_batch", "ep", "expert_tp"))
        moe = model.moe
        n_experts = moe.experts if moe is not None else 1
        expert_ffn = moe.expert_ffn if moe is not None else 1
        interleaved = c["schedule"] == Schedule.INTERLEAVED
        has_dp = dp > 0  # a derived dp is 0 where tp * pp * cp does not divide the devices
        per_step = np.maximum(dp, 1) * mb
        n_micro = np.where(spec.global_batch % per_step == 0, spec.global_batch // per_step, 0)
        rules: dict[Reason, np.ndarray] = {
            Reason.DEVICE_COUNT: tp * pp * dp * cp != c["devices"],
            Reason.TP_HEADS: (model.heads % tp != 0) | (model.kv_heads % tp != 0) | (model.ffn % tp != 0),
            Reason.PP_LAYERS: ((model.layers // pp) < vpp) if spec.uneven_layers else (model.layers % (pp * vpp) != 0),
            Reason.CP_SEQUENCE: (cp > 1) & (spec.seq_len % (2 * cp) != 0),
            Reason.BATCH: has_dp & (spec.global_batch % per_step != 0),
            Reason.VPP_SCHEDULE: (vpp > 1) != interleaved,
            Reason.INTERLEAVE_MICROBATCHES: has_dp & interleaved & (n_micro % pp != 0),
            Reason.PP1_SCHEDULE: (pp == 1) & (c["schedule"] != Schedule.ONE_F_ONE_B),
            Reason.SP_WITHOUT_TP: (c["sequence_parallel"] != 0) & (tp == 1),
            Reason.ZERO_WITHOUT_DP: has_dp & (c["zero"] > 0) & (dp * cp == 1),
            Reason.TP_OVERLAP_WITHOUT_SP: (c["tp_overlap"] != 0) & (c["sequence_parallel"] == 0),
            Reason.EP_DENSE: (moe is None) & ((ep > 1) | (etp > 1)),
            Reason.EP_EXPERTS: (moe is not None) & ((n_experts % ep != 0) | (expert_ffn % etp != 0)),
            Reason.EP_GROUP: has_dp & ((tp * cp * dp) % (ep * etp) != 0),
            Reason.EP1_DISPATCH: (ep == 1) & ((c["dispatch"] != Dispatch.ALLTOALL) | (c["tbo"] != 0)
                                              | (c["ep_placement"] != Placement.INNER)),
            Reason.RECOMPUTE_LAYERS: (c["recompute_layers"] > 0) & (c["recompute"] != Recompute.FULL),
            Reason.WEIGHT_OFFLOAD: (c["offload_weights"] != 0) & (c["optimizer"] != Optimizer.CPU_ADAM),
            Reason.DUALPIPE_SHAPE: (c["schedule"] == Schedule.DUALPIPE)
            & ((pp % 2 != 0) | (has_dp & (n_micro % 2 != 0))),
            Reason.MOE_RECOMPUTE_DENSE: np.full(tp.shape[0], moe is None) & (c["recompute"] == Recompute.MOE_DISPATCH),
        }
        reason = np.zeros(tp.shape[0], dtype=np.int64)
        breaks = np.zeros(len(Reason), np.int64)
        for code, broken in rules.items():  # dict order = Reason order = precedence
            reason[(reason == 0) & broken] = int(code)
            breaks[int(code)] = int(broken.sum())
        return reason, breaks


REASON_TEXT: dict[Reason, str] = {
    Reason.VALID: "valid candidates",
    Reason.DEVICE_COUNT: "tp*pp*dp*cp != devices",
    Reason.TP_HEADS: "tp does not divide heads, kv_heads and ffn",
    Reason.PP_LAYERS: "pp*vpp does not divide layers (or, with uneven_layers, leaves a chunk without one)",
    Reason.CP_SEQUENCE: "2*cp does not divide seq_len",
    Reason.BATCH: "dp*micro_batch does not divide global_batch",
    Reason.VPP_SCHEDULE: "vpp>1 without the interleaved schedule (or interleaved with vpp=1)",
    Reason.INTERLEAVE_MICROBATCHES: "interleaved schedule with micro-batches not divisible by pp",
    Reason.PP1_SCHEDULE: "pp=1: schedules coincide, only 1f1b kept",
    Reason.SP_WITHOUT_TP: "sequence_parallel with tp=1 (same as without)",
    Reason.ZERO_WITHOUT_DP: "zero>0 with dp*cp=1 (nothing to shard)",
    Reason.TP_OVERLAP_WITHOUT_SP: "tp_overlap without sequence_parallel (Megatron needs it)",
    Reason.EP_DENSE: "ep>1 or expert_tp>1 on a dense model",
    Reason.EP_EXPERTS: "ep does not divide the routed experts, or expert_tp the expert FFN width",
    Reason.EP_GROUP: "ep*expert_tp does not divide tp*cp*dp (the ranks of a stage)",
    Reason.EP1_DISPATCH: "ep=1: no dispatch, only alltoall/inner/no tbo kept",
    Reason.RECOMPUTE_LAYERS: "recompute_layers>0 without recompute=full",
    Reason.WEIGHT_OFFLOAD: "offload_weights without the cpu-adam optimizer",
    Reason.DUALPIPE_SHAPE: "dualpipe with an odd pp or an odd number of micro-batches (each direction takes half)",
    Reason.MOE_RECOMPUTE_DENSE: "recompute=moe-dispatch on a dense model (no dispatch to redo: same as none)",
}

