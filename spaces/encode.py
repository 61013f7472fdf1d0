"""Encode a strategy space into columns: one row per valid candidate.

The space is the Cartesian product of its dimensions' values, flattened in C
order (the last dimension varies fastest), so every combination has a stable
``row_id``. Each dropped combination is charged to the first rule it breaks
(``Reason`` order), and ``breaks`` counts every rule a combination breaks.

The encoder enumerates the valid combinations directly rather than filtering
the product. The first seven dimensions (devices ... micro_batch, the prefix)
fix a block of ``n_suffix`` consecutive row ids, over which the other
dimensions (the suffix) vary. The rules on the prefix alone come first in
``Reason`` order; every other rule (``SUFFIX_RULES``) reads the prefix only
through a few terms (``_prefix``: vpp > 1, pp == 1, the stage's ranks, ...) and
only the suffix dimensions it names. Consecutive suffix dimensions that one
rule reads together form a group (``GROUPS``: recompute with
recompute_layers, offload_weights to optimizer, ep to tbo, ...), so for given
terms (a signature) each group has a small table of broken-rule bit masks over
its own combinations, and a suffix combination breaks the union of its parts'
rules. Hence, per signature and without visiting the block:

- the valid suffixes are the product of each group's valid parts, in row order;
- the suffixes breaking none of the rules S number the product over groups of
  the parts breaking none of S; the first-reason and breaks counts follow, as
  first[r] = clear(rules before r) - clear(rules up to r) and
  breaks[r] = n_suffix - clear({r}).

A range of rows is its blocks: a whole block adds its signature's counts and
writes only its valid rows; a cut block (at most two per range, or one per id
in ``encode_ids``) is walked combination by combination. The work and memory of
a range are proportional to its blocks and valid rows, whatever the size of
the space. ``encode_by_filter`` is the reference: it builds every combination of
a range in full and filters it with the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from paraspace.kernels.jit import jit
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


# --------------------------------------------------------------------------- rules

#: The first N_PREFIX dimensions fix a block of consecutive row ids; the others vary inside it.
N_PREFIX = 7
PREFIX_NAMES = DIMENSION_NAMES[:N_PREFIX]
SUFFIX_NAMES = DIMENSION_NAMES[N_PREFIX:]

Columns = dict[str, Any]

#: The prefix terms the suffix rules read that are flags (bit i of a signature's flags);
#: the one other term is ``stage_ranks``.
FLAG_TERMS = ("vpp_gt1", "pp1", "tp1", "micro_not_per_stage", "nothing_to_shard", "dualpipe_odd")


def _derive_dp(cols: Columns) -> None:
    """An omitted dp as devices / (tp * pp * cp), 0 where that does not divide."""
    others = cols["tp"].astype(np.int64) * cols["pp"] * cols["cp"]
    devices = cols["devices"].astype(np.int64)
    cols["dp"] = np.where(devices % others == 0, devices // others, 0).astype(cols["dp"].dtype)


def _prefix(space: LoadedSpace, c: Columns) -> tuple[dict[Reason, np.ndarray], dict[str, np.ndarray]]:
    """The rules on the prefix dimensions, and the terms through which ``SUFFIX_RULES`` read them."""
    spec, model = space.spec, space.model
    tp, pp, dp, cp, vpp, mb = (c[n].astype(np.int64) for n in ("tp", "pp", "dp", "cp", "vpp", "micro_batch"))
    has_dp = dp > 0  # a derived dp is 0 where tp * pp * cp does not divide the devices
    per_step = np.maximum(dp, 1) * mb
    n_micro = np.where(spec.global_batch % per_step == 0, spec.global_batch // per_step, 0)
    rules = {
        Reason.DEVICE_COUNT: tp * pp * dp * cp != c["devices"],
        Reason.TP_HEADS: (model.heads % tp != 0) | (model.kv_heads % tp != 0) | (model.ffn % tp != 0),
        Reason.PP_LAYERS: ((model.layers // pp) < vpp) if spec.uneven_layers else (model.layers % (pp * vpp) != 0),
        Reason.CP_SEQUENCE: (cp > 1) & (spec.seq_len % (2 * cp) != 0),
        Reason.BATCH: has_dp & (spec.global_batch % per_step != 0),
    }
    terms = {
        "vpp_gt1": vpp > 1,
        "pp1": pp == 1,
        "tp1": tp == 1,
        # the rules about dp apply to rows with a dp only
        "micro_not_per_stage": has_dp & (n_micro % pp != 0),
        "nothing_to_shard": has_dp & (dp * cp == 1),
        "dualpipe_odd": (pp % 2 != 0) | (has_dp & (n_micro % 2 != 0)),
        "stage_ranks": _as_expert_groups_see(space, np.where(has_dp, tp * cp * dp, 0)),
    }
    return rules, terms


def _as_expert_groups_see(space: LoadedSpace, stage_ranks: np.ndarray) -> np.ndarray:
    """The ranks of a stage, tp * cp * dp (0 without a dp: a multiple of anything), as
    far as the space's expert groups tell them apart: their gcd with L, the lcm of
    every ep * expert_tp listed. A divisor K of L divides g exactly when it divides
    gcd(g, L), so EP_GROUP judges both alike, and blocks that differ only in their
    stage size share a signature (with ep = expert_tp = 1: all of them)."""
    dims = space.spec.dimensions
    lcm = math.lcm(*(e * t for e in dims.ep for t in dims.expert_tp))
    return np.gcd(stage_ranks, lcm) if lcm < 2**62 else stage_ranks


@dataclass(frozen=True)
class Rule:
    """A rule that reads suffix dimensions: ``broken(terms, columns, space)`` sees the
    prefix only through ``_prefix``'s terms and is handed only the columns in ``dims``."""

    reason: Reason
    dims: tuple[str, ...]
    broken: Callable[[Columns, Columns, LoadedSpace], Any]


def _ep_experts(t: Columns, c: Columns, s: LoadedSpace) -> Any:
    moe = s.model.moe
    if moe is None:
        return np.zeros(c["ep"].shape, bool)
    return (moe.experts % c["ep"] != 0) | (moe.expert_ffn % c["expert_tp"] != 0)


#: Every rule but the prefix ones, in Reason order (which is precedence, after the prefix rules).
SUFFIX_RULES: tuple[Rule, ...] = (
    Rule(Reason.VPP_SCHEDULE, ("schedule",), lambda t, c, s: t["vpp_gt1"] != (c["schedule"] == Schedule.INTERLEAVED)),
    Rule(Reason.INTERLEAVE_MICROBATCHES, ("schedule",),
         lambda t, c, s: t["micro_not_per_stage"] & (c["schedule"] == Schedule.INTERLEAVED)),
    Rule(Reason.PP1_SCHEDULE, ("schedule",), lambda t, c, s: t["pp1"] & (c["schedule"] != Schedule.ONE_F_ONE_B)),
    Rule(Reason.SP_WITHOUT_TP, ("sequence_parallel",), lambda t, c, s: t["tp1"] & (c["sequence_parallel"] != 0)),
    Rule(Reason.ZERO_WITHOUT_DP, ("zero",), lambda t, c, s: t["nothing_to_shard"] & (c["zero"] > 0)),
    Rule(Reason.TP_OVERLAP_WITHOUT_SP, ("sequence_parallel", "tp_overlap"),
         lambda t, c, s: (c["tp_overlap"] != 0) & (c["sequence_parallel"] == 0)),
    Rule(Reason.EP_DENSE, ("ep", "expert_tp"),
         lambda t, c, s: (s.model.moe is None) & ((c["ep"] > 1) | (c["expert_tp"] > 1))),
    Rule(Reason.EP_EXPERTS, ("ep", "expert_tp"), _ep_experts),
    Rule(Reason.EP_GROUP, ("ep", "expert_tp"),
         lambda t, c, s: t["stage_ranks"] % (c["ep"].astype(np.int64) * c["expert_tp"]) != 0),
    Rule(Reason.EP1_DISPATCH, ("ep", "ep_placement", "dispatch", "tbo"),
         lambda t, c, s: (c["ep"] == 1) & ((c["dispatch"] != Dispatch.ALLTOALL) | (c["tbo"] != 0)
                                           | (c["ep_placement"] != Placement.INNER))),
    Rule(Reason.RECOMPUTE_LAYERS, ("recompute", "recompute_layers"),
         lambda t, c, s: (c["recompute_layers"] > 0) & (c["recompute"] != Recompute.FULL)),
    Rule(Reason.WEIGHT_OFFLOAD, ("offload_weights", "optimizer"),
         lambda t, c, s: (c["offload_weights"] != 0) & (c["optimizer"] != Optimizer.CPU_ADAM)),
    Rule(Reason.DUALPIPE_SHAPE, ("schedule",),
         lambda t, c, s: t["dualpipe_odd"] & (c["schedule"] == Schedule.DUALPIPE)),
    Rule(Reason.MOE_RECOMPUTE_DENSE, ("recompute",),
         lambda t, c, s: (s.model.moe is None) & (c["recompute"] == Recompute.MOE_DISPATCH)),
)


def _groups() -> tuple[tuple[int, int], ...]:
    """The suffix cut into runs of consecutive dimensions that no rule reads across,
    as [first, stop) positions in DIMENSION_NAMES."""
    joined = [False] * len(DIMENSION_NAMES)  # joined[i]: dimension i is in the group of dimension i - 1
    for rule in SUFFIX_RULES:
        at = [DIMENSION_NAMES.index(d) for d in rule.dims]
        if min(at) < N_PREFIX:
            raise RuntimeError(f"{rule.reason.name} reads a prefix dimension: {rule.dims} (prefix: {PREFIX_NAMES})")
        for i in range(min(at) + 1, max(at) + 1):
            joined[i] = True
    firsts = [i for i in range(N_PREFIX, len(DIMENSION_NAMES)) if i == N_PREFIX or not joined[i]]
    return tuple(zip(firsts, [*firsts[1:], len(DIMENSION_NAMES)]))


#: The rules on the prefix dimensions alone (``_prefix``): first in Reason order, so a
#: block whose prefix breaks one is charged to it whatever its suffix.
PREFIX_REASONS = (Reason.DEVICE_COUNT, Reason.TP_HEADS, Reason.PP_LAYERS, Reason.CP_SEQUENCE, Reason.BATCH)
if [*PREFIX_REASONS, *(r.reason for r in SUFFIX_RULES)] != sorted(set(Reason) - {Reason.VALID}):
    raise RuntimeError("every Reason but VALID must have one rule, the prefix rules first, in Reason order")
GROUPS = _groups()
GROUP_OF = {DIMENSION_NAMES[i]: g for g, (a, b) in enumerate(GROUPS) for i in range(a, b)}
#: output layout: every int32 column is a row of one int32 matrix, every int8 column of one int8 matrix
INT32_COLUMNS = (*(d.name for d in DIMENSIONS if d.dtype == np.int32), "n_microbatches")
INT8_COLUMNS = tuple(d.name for d in DIMENSIONS if d.dtype == np.int8)


# --------------------------------------------------------------------------- kernels


@jit(inline=True)
def _advance(digit, size):
    """Step a mixed-radix counter (last digit fastest); wraps to zero after the end."""
    g = digit.shape[0] - 1
    while g >= 0:
        digit[g] += 1
        if digit[g] < size[g]:
            return
        digit[g] = 0
        g -= 1


@jit
def _count_blocks(sig, lo, hi, prefix_first, prefix_bits, n_suffix, masks, sig_first, sig_breaks,
                  size, stride, at, first_reason, breaks, n_valid):
    """Add each block's combinations lo..hi to ``first_reason`` and ``breaks``, and
    set ``n_valid``: a whole block from its signature's counts, a cut one walked."""
    n_groups = size.shape[0]
    n_reasons = first_reason.shape[0]
    part = np.empty(n_groups, np.int64)
    for b in range(sig.shape[0]):
        s = sig[b]
        n = hi[b] - lo[b]
        for r in range(n_reasons):
            if (prefix_bits[b] >> r) & 1:
                breaks[r] += n
        if lo[b] == 0 and hi[b] == n_suffix:
            for r in range(n_reasons):
                breaks[r] += sig_breaks[s, r]
            if prefix_first[b] != 0:
                first_reason[prefix_first[b]] += n
                n_valid[b] = 0
            else:
                for r in range(n_reasons):
                    first_reason[r] += sig_first[s, r]
                n_valid[b] = sig_first[s, 0]
            continue
        for g in range(n_groups):
            part[g] = (lo[b] // stride[g]) % size[g]
        kept = 0
        for _ in range(n):
            m = 0
            for g in range(n_groups):
                m |= masks[s, at[g] + part[g]]
            if prefix_first[b] != 0:
                first_reason[prefix_first[b]] += 1
            elif m == 0:
                first_reason[0] += 1
                kept += 1
            r = 0
            first = prefix_first[b] == 0
            while m != 0:
                if m & 1:
                    breaks[r] += 1
                    if first:
                        first_reason[r] += 1
                        first = False
                m >>= 1
                r += 1
            _advance(part, size)
        n_valid[b] = kept


@jit(inline=True)
def _write_row(o, base, part, stride, dim_group, dim_at, dim_int8, dim_row, local_values, out32, out8, row_id):
    """Row ``o``: suffix position ``part`` (each group's combination) of the block at ``base``."""
    pos = base
    for g in range(part.shape[0]):
        pos += part[g] * stride[g]
    row_id[o] = pos
    for j in range(dim_group.shape[0]):
        v = local_values[dim_at[j] + part[dim_group[j]]]
        if dim_int8[j]:
            out8[dim_row[j], o] = v
        else:
            out32[dim_row[j], o] = v


@jit(inline=True)
def _write_product(start, stop, base, s, valid, count, stride, at, group_dims, dim_at, dim_int8, dim_row,
                   local_values, out32, out8, row_id):
    """Rows ``start:stop``: the product of the valid group parts of signature ``s``
    (``count[g]`` of group g), column by column; a group's value repeats for each
    combination of the later groups' parts."""
    n = stop - start
    if n == 0:
        return
    for o in range(start, stop):
        row_id[o] = base
    inner = n
    for g in range(count.shape[0]):
        c = count[g]
        inner //= c
        outer = n // (c * inner)
        o = start
        for _ in range(outer):
            for i in range(c):
                pos = valid[s, at[g] + i] * stride[g]
                for _ in range(inner):
                    row_id[o] += pos
                    o += 1
        for j in range(group_dims[g], group_dims[g + 1]):
            r = dim_row[j]
            o = start
            for _ in range(outer):
                for i in range(c):
                    v = local_values[dim_at[j] + valid[s, at[g] + i]]
                    if dim_int8[j]:
                        for _ in range(inner):
                            out8[r, o] = v
                            o += 1
                    else:
                        for _ in range(inner):
                            out32[r, o] = v
                            o += 1


@jit
def _write_blocks(sig, lo, hi, base, out_at, prefix_values, prefix_rows, n_suffix, masks, valid, n_valid_parts,
                  template_at, template32, template8, template_pos,
                  size, stride, at, group_dims, dim_group, dim_at, dim_int8, dim_row, local_values,
                  out32, out8, row_id):
    """Write the valid rows of every block from ``out_at[b]``: a whole block as a copy
    of its signature's template (its valid suffixes, written once) or else as the
    product of the signature's valid group parts; a cut block by walking it."""
    n_groups = size.shape[0]
    part = np.empty(n_groups, np.int64)
    for b in range(sig.shape[0]):
        start, stop = out_at[b], out_at[b + 1]
        if start == stop:
            continue
        s = sig[b]
        t = template_at[s]
        if lo[b] == 0 and hi[b] == n_suffix and t >= 0:
            n = stop - start
            for j in range(dim_row.shape[0]):
                r = dim_row[j]
                if dim_int8[j]:
                    for i in range(n):
                        out8[r, start + i] = template8[r, t + i]
                else:
                    for i in range(n):
                        out32[r, start + i] = template32[r, t + i]
            for i in range(n):
                row_id[start + i] = base[b] + template_pos[t + i]
        elif lo[b] == 0 and hi[b] == n_suffix:
            _write_product(start, stop, base[b], s, valid, n_valid_parts[s], stride, at, group_dims, dim_at,
                           dim_int8, dim_row, local_values, out32, out8, row_id)
        else:
            o = start
            for g in range(n_groups):
                part[g] = (lo[b] // stride[g]) % size[g]
            for _ in range(hi[b] - lo[b]):
                m = 0
                for g in range(n_groups):
                    m |= masks[s, at[g] + part[g]]
                if m == 0:
                    _write_row(o, base[b], part, stride, dim_group, dim_at, dim_int8, dim_row, local_values,
                               out32, out8, row_id)
                    o += 1
                _advance(part, size)
        for k in range(prefix_rows.shape[0]):
            v = prefix_values[k, b]
            r = prefix_rows[k]
            for i in range(start, stop):
                out32[r, i] = v


# --------------------------------------------------------------------------- the encoder


@dataclass
class _Signature:
    """The suffix of every block with one signature (one set of ``_prefix`` terms)."""

    #: each group's combinations' broken-rule bits (bit = Reason), group g from ``Encoder._at[g]``
    masks: np.ndarray
    #: each group's valid combinations: group g's ``n_valid_parts[g]`` from ``Encoder._at[g]``
    valid: np.ndarray
    n_valid_parts: np.ndarray
    #: a whole block's counts
    first_reason: np.ndarray
    breaks: np.ndarray
    #: the valid suffixes written once (int32 columns, int8 columns, suffix positions), or None
    template: tuple[np.ndarray, np.ndarray, np.ndarray] | None


@dataclass
class _Tables:
    """Every signature's arrays stacked for the kernels (signature s: row s, or
    template columns ``template_at[s]`` on, -1 for none)."""

    masks: np.ndarray
    valid: np.ndarray
    n_valid_parts: np.ndarray
    first_reason: np.ndarray
    breaks: np.ndarray
    template_at: np.ndarray
    template32: np.ndarray
    template8: np.ndarray
    template_pos: np.ndarray

    @classmethod
    def stack(cls, signatures: list[_Signature]) -> _Tables:
        templates = [s.template for s in signatures if s.template is not None]
        lengths = [0 if s.template is None else s.template[2].shape[0] for s in signatures]
        at = np.cumsum([0, *lengths[:-1]], dtype=np.int64)
        return cls(
            *(np.stack([getattr(s, f) for s in signatures])
              for f in ("masks", "valid", "n_valid_parts", "first_reason", "breaks")),
            template_at=np.where([s.template is not None for s in signatures], at, -1).astype(np.int64),
            template32=np.concatenate([t[0] for t in templates], axis=1) if templates
            else np.zeros((len(INT32_COLUMNS), 0), np.int32),
            template8=np.concatenate([t[1] for t in templates], axis=1) if templates
            else np.zeros((len(INT8_COLUMNS), 0), np.int8),
            template_pos=np.concatenate([t[2] for t in templates]) if templates else np.zeros(0, np.int64),
        )


#: A signature with at most TEMPLATE_ROWS valid suffixes keeps them as a template that
#: whole blocks copy (63 bytes a row), while all templates together hold at most
#: TEMPLATE_BUDGET_ROWS; the others' blocks are written as products of group parts.
TEMPLATE_ROWS = 1 << 14
TEMPLATE_BUDGET_ROWS = 1 << 18


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
        #: combinations in one block (one value of every prefix dimension)
        self.n_suffix = math.prod(self.shape[N_PREFIX:])
        sizes = [math.prod(self.shape[a:b]) for a, b in GROUPS]
        self._size = np.array(sizes, np.int64)
        self._stride = np.array([math.prod(self.shape[b:]) for _, b in GROUPS], np.int64)
        self._at = np.array([0, *np.cumsum(sizes)[:-1]], np.int64)
        # each group's columns over its own combinations, in row order
        self._parts: list[dict[str, np.ndarray]] = []
        for a, b in GROUPS:
            index = np.unravel_index(np.arange(math.prod(self.shape[a:b])), self.shape[a:b])
            self._parts.append({n: self.values[n][i] for n, i in zip(DIMENSION_NAMES[a:b], index)})
        # the writer's layout: each suffix column's values over its group's combinations
        dim_at, at = [], 0
        for name in SUFFIX_NAMES:
            dim_at.append(at)
            at += int(self._size[GROUP_OF[name]])
        self._dim_group = np.array([GROUP_OF[n] for n in SUFFIX_NAMES], np.int64)
        #: group g's columns are suffix columns group_dims[g]:group_dims[g + 1]
        self._group_dims = np.array([a - N_PREFIX for a, _ in GROUPS] + [len(SUFFIX_NAMES)], np.int64)
        self._dim_at = np.array(dim_at, np.int64)
        self._dim_int8 = np.array([BY_NAME[n].dtype == np.int8 for n in SUFFIX_NAMES])
        self._dim_row = np.array([(INT8_COLUMNS if BY_NAME[n].dtype == np.int8 else INT32_COLUMNS).index(n)
                                  for n in SUFFIX_NAMES], np.int64)
        self._local_values = np.concatenate(
            [self._parts[GROUP_OF[n]][n].astype(np.int32) for n in SUFFIX_NAMES])
        self._prefix_rows = np.array([INT32_COLUMNS.index(n) for n in (*PREFIX_NAMES, "n_microbatches")], np.int64)
        #: signatures met so far, by (flags, stage_ranks)
        self._signature_ids: dict[tuple[int, int], int] = {}
        self._signatures: list[_Signature] = []
        self._template_rows = 0
        self._tables: _Tables | None = None

    # ------------------------------------------------------------------ public

    def encode(self, start: int = 0, stop: int | None = None) -> Encoded:
        """Rows ``start:stop`` of the flat product, filtered."""
        stop = self.n_combinations if stop is None else min(stop, self.n_combinations)
        if stop <= start:
            return self._encode_blocks(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.int64)
        if start < 0:
            raise ValueError(f"start = {start}: expected a row id of at least 0")
        q = self.n_suffix
        first, last = start // q, (stop - 1) // q
        prefix = np.arange(first, last + 1, dtype=np.int64)
        lo = np.zeros(prefix.shape[0], np.int64)
        hi = np.full(prefix.shape[0], q, np.int64)
        lo[0] = start - first * q
        hi[-1] = stop - last * q
        return self._encode_blocks(prefix, lo, hi, np.int64)

    def row_ids(self, positions: dict[str, np.ndarray]) -> np.ndarray:
        """Row ids of combinations given as each dimension's value position."""
        return np.ravel_multi_index(tuple(positions[n] for n in DIMENSION_NAMES), self.shape).astype(np.int64)

    def encode_ids(self, flat: np.ndarray) -> Encoded:
        """The combinations with these row ids (in this order), filtered."""
        flat = np.asarray(flat)
        if flat.dtype.kind not in "iu":
            raise TypeError(f"row ids of dtype {flat.dtype}: expected integers")
        if flat.ndim != 1:
            raise ValueError(f"row ids of shape {flat.shape}: expected one dimension")
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.n_combinations):
            raise ValueError(f"row ids from {flat.min()} to {flat.max()}: expected 0 to {self.n_combinations - 1}")
        prefix, lo = np.divmod(flat.astype(np.int64), self.n_suffix)
        return self._encode_blocks(prefix, lo, lo + 1, flat.dtype)

    def chunks(self, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[Encoded]:
        """Consecutive chunks of at most ``chunk_rows`` combinations."""
        stop = self.n_combinations if stop is None else min(stop, self.n_combinations)
        for lo in range(start, stop, chunk_rows):
            yield self.encode(lo, min(lo + chunk_rows, stop))

    def encode_all(self) -> Encoded:
        return self.encode(0, self.n_combinations)

    # ------------------------------------------------------------------ blocks

    def _encode_blocks(self, prefix: np.ndarray, lo: np.ndarray, hi: np.ndarray, id_dtype: Any) -> Encoded:
        """Combinations ``lo[b]:hi[b]`` of block ``prefix[b]``, for every b in order."""
        if prefix.shape[0] == 0:
            columns = {name: np.empty(0, BY_NAME[name].dtype) for name in DIMENSION_NAMES}
            columns.update(row_id=np.empty(0, id_dtype), n_microbatches=np.empty(0, np.int32))
            return Encoded(columns=columns, n_combinations=0)
        index = np.unravel_index(prefix, self.shape[:N_PREFIX])
        cols = {n: self.values[n][i] for n, i in zip(PREFIX_NAMES, index)}
        if self.derive_dp:
            _derive_dp(cols)
        rules, terms = _prefix(self.space, cols)
        prefix_first = np.zeros(prefix.shape[0], np.int64)
        prefix_bits = np.zeros(prefix.shape[0], np.int64)
        for code, broken in rules.items():  # dict order = Reason order = precedence
            prefix_first[(prefix_first == 0) & broken] = int(code)
            prefix_bits |= broken.astype(np.int64) << int(code)
        sig = self._signature_of(terms)
        if self._tables is None:
            self._tables = _Tables.stack(self._signatures)
        t = self._tables
        first_reason = np.zeros(len(Reason), np.int64)
        breaks = np.zeros(len(Reason), np.int64)
        n_valid = np.empty(prefix.shape[0], np.int64)
        _count_blocks(sig, lo, hi, prefix_first, prefix_bits, self.n_suffix, t.masks, t.first_reason, t.breaks,
                      self._size, self._stride, self._at, first_reason, breaks, n_valid)
        out_at = np.zeros(prefix.shape[0] + 1, np.int64)
        np.cumsum(n_valid, out=out_at[1:])
        n = int(out_at[-1])
        dp_mb = cols["dp"].astype(np.int64) * cols["micro_batch"]
        n_micro = np.where(dp_mb > 0, self.space.spec.global_batch // np.maximum(dp_mb, 1), 0)
        prefix_values = np.stack([*(cols[c].astype(np.int32) for c in PREFIX_NAMES), n_micro.astype(np.int32)])
        out32 = np.empty((len(INT32_COLUMNS), n), np.int32)
        out8 = np.empty((len(INT8_COLUMNS), n), np.int8)
        row_id = np.empty(n, np.int64)
        _write_blocks(sig, lo, hi, prefix * self.n_suffix, out_at, prefix_values, self._prefix_rows, self.n_suffix,
                      t.masks, t.valid, t.n_valid_parts, t.template_at, t.template32, t.template8, t.template_pos,
                      self._size, self._stride, self._at, self._group_dims, self._dim_group, self._dim_at,
                      self._dim_int8, self._dim_row, self._local_values, out32, out8, row_id)
        columns = {name: out8[INT8_COLUMNS.index(name)] if BY_NAME[name].dtype == np.int8
                   else out32[INT32_COLUMNS.index(name)] for name in DIMENSION_NAMES}
        columns["row_id"] = row_id if id_dtype == np.int64 else row_id.astype(id_dtype)
        columns["n_microbatches"] = out32[INT32_COLUMNS.index("n_microbatches")]
        return Encoded(columns=columns, n_combinations=int((hi - lo).sum()), first_reason=first_reason,
                       breaks=breaks)

    # ------------------------------------------------------------------ signatures

    def _signature_of(self, terms: dict[str, np.ndarray]) -> np.ndarray:
        """Each block's signature id (its terms), tabulating the signatures not seen yet."""
        flags = np.zeros(terms["stage_ranks"].shape[0], np.int64)
        for i, name in enumerate(FLAG_TERMS):
            flags |= terms[name].astype(np.int64) << i
        ranks, rank_of = np.unique(terms["stage_ranks"], return_inverse=True)
        keys, key_of = np.unique((rank_of.astype(np.int64) << len(FLAG_TERMS)) | flags, return_inverse=True)
        ids = np.array([self._signature(int(k) & ((1 << len(FLAG_TERMS)) - 1), int(ranks[int(k) >> len(FLAG_TERMS)]))
                        for k in keys], np.int64)
        return ids[key_of].reshape(-1)

    def _signature(self, flags: int, stage_ranks: int) -> int:
        key = (flags, stage_ranks)
        if key in self._signature_ids:
            return self._signature_ids[key]
        terms: Columns = {name: bool((flags >> i) & 1) for i, name in enumerate(FLAG_TERMS)}
        terms["stage_ranks"] = np.int64(stage_ranks)
        parts = [np.zeros(int(n), np.int64) for n in self._size]
        for rule in SUFFIX_RULES:
            g = GROUP_OF[rule.dims[0]]
            broken = rule.broken(terms, {d: self._parts[g][d] for d in rule.dims}, self.space)
            parts[g] |= np.broadcast_to(broken, parts[g].shape).astype(np.int64) << int(rule.reason)

        def clear(bits: int) -> int:  # suffix combinations that break none of these rules
            return math.prod(int(np.count_nonzero(p & bits == 0)) for p in parts)

        first_reason = np.zeros(len(Reason), np.int64)
        breaks = np.zeros(len(Reason), np.int64)
        before = 0
        for code in sorted(int(r.reason) for r in SUFFIX_RULES):
            first_reason[code] = clear(before) - clear(before | 1 << code)
            breaks[code] = self.n_suffix - clear(1 << code)
            before |= 1 << code
        first_reason[Reason.VALID] = clear(before)
        valid = np.zeros(int(self._size.sum()), np.int64)
        n_valid_parts = np.zeros(len(parts), np.int64)
        for g, p in enumerate(parts):
            ok = np.flatnonzero(p == 0)
            valid[self._at[g]:self._at[g] + ok.shape[0]] = ok
            n_valid_parts[g] = ok.shape[0]
        n_valid = int(first_reason[Reason.VALID])
        template = None
        if n_valid <= TEMPLATE_ROWS and self._template_rows + n_valid <= TEMPLATE_BUDGET_ROWS:
            template = (np.zeros((len(INT32_COLUMNS), n_valid), np.int32),
                        np.zeros((len(INT8_COLUMNS), n_valid), np.int8), np.zeros(n_valid, np.int64))
            _write_product(0, n_valid, 0, 0, valid[None, :], n_valid_parts, self._stride, self._at, self._group_dims,
                           self._dim_at, self._dim_int8, self._dim_row, self._local_values, *template)
            self._template_rows += n_valid
        self._signatures.append(_Signature(np.concatenate(parts), valid, n_valid_parts, first_reason, breaks, template))
        self._tables = None
        self._signature_ids[key] = len(self._signatures) - 1
        return len(self._signatures) - 1


def encode_by_filter(encoder: Encoder, flat: np.ndarray) -> Encoded:
    """The reference for ``Encoder.encode_ids``: the combinations with these row ids
    built in full, every rule applied to every one, the valid ones kept (about a
    million combinations per second)."""
    space = encoder.space
    index = np.unravel_index(flat, encoder.shape)
    cols = {n: encoder.values[n][i] for n, i in zip(DIMENSION_NAMES, index)}
    if encoder.derive_dp:
        _derive_dp(cols)
    rules, terms = _prefix(space, cols)
    for rule in SUFFIX_RULES:
        rules[rule.reason] = rule.broken(terms, {d: cols[d] for d in rule.dims}, space)
    reason = np.zeros(flat.shape[0], dtype=np.int64)
    breaks = np.zeros(len(Reason), np.int64)
    for code in sorted(rules):  # Reason order = precedence
        broken = np.broadcast_to(rules[code], reason.shape)
        reason[(reason == 0) & broken] = int(code)
        breaks[int(code)] = int(np.count_nonzero(broken))
    keep = reason == Reason.VALID
    out = {n: np.ascontiguousarray(c[keep]) for n, c in cols.items()}
    out["row_id"] = flat[keep]
    out["n_microbatches"] = (space.spec.global_batch // (out["dp"] * out["micro_batch"])).astype(np.int32)
    return Encoded(columns=out, n_combinations=int(flat.shape[0]),
                   first_reason=np.bincount(reason, minlength=len(Reason)).astype(np.int64), breaks=breaks)


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

