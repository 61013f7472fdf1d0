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
rules. Hence, per signature and without visiting a block:

- the valid suffixes are the product of each group's valid parts, in row order,
  so the one of rank k has the mixed-radix digits of k over those counts;
- the suffixes *clear* of a set of rules S (breaking none of them) below a
  suffix position x are counted group by group: those that first differ from x
  in group j keep x's parts before j (all clear of S, or none count), have one of
  the clear parts before x's in j, and any clear parts after j;
- the first-reason and breaks counts of a range follow from those clear counts,
  as first[r] = clear(rules before r) - clear(rules up to r) and
  breaks[r] = n - clear({r}).

A range of rows is its blocks, each from lo to hi (a whole block or, at most two
per range, a cut one): its counts are the clear counts below hi less those below
lo, and its valid rows those of rank clear(every rule) below lo to below hi,
copied from the signature's template (its valid suffixes, written once) or built
from their ranks. ``encode_ids`` takes each combination's masks directly. All of
it is vectorised numpy over blocks and rows; the work and memory of a range are
proportional to its blocks and valid rows, whatever the size of the space.
``encode_by_filter`` is the reference: it builds every combination of
a range in full and filters it with the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

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
              "norms (the two norms), moe-dispatch (the MoE dispatch), selective-ops (every other GEMM output kept, the rest "
              "recomputed)", enum=Recompute),
    Dimension("recompute_layers", np.int32, "with full recompute: only the last k layers of each device (0: all)"),
    Dimension("offload_activations", np.int8, "stored activations offloaded to host memory, overlapped with compute",
              boolean=True),
    Dimension("offload_weights", np.int8, "weights and gradients streamed from/to host memory layer by layer",
              boolean=True),
    Dimension("sequence_parallel", np.int8, "Megatron sequence parallelism", boolean=True),
    Dimension("tp_overlap", np.int8, "TP collectives overlapped with their GEMMs in chunks (Megatron "
              "--tp-comm-overlap)", boolean=True),
    Dimension("zero", np.int8, "ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +parameters"),
    Dimension("defer_grad_sync", np.int8, "ZeRO-3: the micro-batches' gradients accumulated unsharded and "
              "reduce-scattered once per step (FSDP no_sync)", boolean=True),
    Dimension("optimizer", np.int8, "optimizer: Adam on the device, 8-bit Adam, Adam on the host (ZeRO-Offload), "
              "Adam without fp32 master weights, paged 8-bit Adam (states on the host), or pure bf16 Adam (weights, "
              "gradients, m and v in bf16)", enum=Optimizer),
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

    def most_dropped(self) -> int:
        """The code of the rule charged with the most dropped combinations (never the
        VALID code 0): what to name where none is kept."""
        return int(self.first_reason[1:].argmax()) + 1


# --------------------------------------------------------------------------- rules

#: The first N_PREFIX dimensions fix a block of consecutive row ids; the others vary inside it.
N_PREFIX = 7
PREFIX_NAMES = DIMENSION_NAMES[:N_PREFIX]
SUFFIX_NAMES = DIMENSION_NAMES[N_PREFIX:]

Columns = dict[str, Any]

#: The prefix terms the suffix rules read that are flags (bit i of a signature's flags);
#: the one other term is ``stage_ranks``.
FLAG_TERMS = ("vpp_gt1", "pp1", "tp1", "micro_not_per_stage", "nothing_to_shard", "dualpipe_odd", "one_micro")


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
        "one_micro": has_dp & (n_micro == 1),
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
    Rule(Reason.DEFER_WITHOUT_ACCUMULATION, ("zero", "defer_grad_sync"),
         lambda t, c, s: (c["defer_grad_sync"] != 0) & ((c["zero"] < 3) | t["one_micro"])),
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
#: The suffix rules' codes, ascending (Reason order).
SUFFIX_CODES = tuple(int(r.reason) for r in SUFFIX_RULES)
#: The sets of suffix rules (bit masks) a block's counts are read from: the rules before each
#: one (``RULE_SETS[i]``: the first i rules, ``RULE_SETS[ALL]``: every one), then each rule
#: alone (``RULE_SETS[ALL + 1 + i]``). A combination breaking none of the set is *clear* of it.
RULE_SETS = np.array([sum(1 << c for c in SUFFIX_CODES[:i]) for i in range(len(SUFFIX_CODES) + 1)]
                     + [1 << c for c in SUFFIX_CODES], np.int64)
ALL = len(SUFFIX_CODES)

#: Output layout: the int32 columns are the rows of one int32 matrix (the prefix and
#: n_microbatches first, repeated per block; then the suffix ones), the int8 columns of one
#: int8 matrix.
SUFFIX32 = tuple(n for n in SUFFIX_NAMES if BY_NAME[n].dtype == np.int32)
SUFFIX8 = tuple(n for n in SUFFIX_NAMES if BY_NAME[n].dtype == np.int8)
OUT32 = (*PREFIX_NAMES, "n_microbatches", *SUFFIX32)
N_PREFIX_OUT = N_PREFIX + 1
if {BY_NAME[n].dtype for n in PREFIX_NAMES} != {np.int32} or {*SUFFIX32, *SUFFIX8} != set(SUFFIX_NAMES):
    raise RuntimeError("the prefix dimensions must be int32 and every suffix dimension int32 or int8")


def _ragged(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``arange(starts[i], starts[i] + lengths[i])`` for every i, concatenated."""
    ends = np.cumsum(lengths)
    if ends.shape[0] == 0:
        return np.empty(0, np.int64)
    return np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


@dataclass
class _Tables:
    """Every signature met so far (row s: signature s), W = ``sum(Encoder._size)``:

    - ``masks`` (S, W): each group's combinations' broken-rule bits (bit = Reason), group g's
      from ``Encoder._at[g]``;
    - ``valid`` (S, W): group g's valid combinations, the first ``n_valid_parts[s, g]`` from
      ``Encoder._at[g]``;
    - ``cum`` (S, W + G, len(RULE_SETS)): at ``Encoder._cum_at[g] + d``, how many of group g's
      first d combinations are clear of each rule set;
    - ``tail`` (S, G + 1, len(RULE_SETS)): suffixes of groups g... clear of each rule set
      (``tail[s, 0]``: a whole block's);
    - the valid suffixes of signature s, written once, from column ``template_at[s]`` (-1: none)
      of ``template32`` and ``template8`` (the suffix columns with more than one value) and
      ``template_pos`` (their suffix positions).
    """

    masks: np.ndarray
    valid: np.ndarray
    n_valid_parts: np.ndarray
    cum: np.ndarray
    tail: np.ndarray
    template_at: np.ndarray
    template32: np.ndarray
    template8: np.ndarray
    template_pos: np.ndarray


#: A signature with at most TEMPLATE_ROWS valid suffixes keeps them as a template that
#: blocks copy, while all templates together hold at most TEMPLATE_BUDGET_ROWS; the
#: others' rows are written from their ranks in the product of valid group parts.
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
        #: a suffix position is the sum over groups of (the group's combination) * stride
        self._stride = np.array([math.prod(self.shape[b:]) for _, b in GROUPS], np.int64)
        self._at = np.array([0, *np.cumsum(sizes)[:-1]], np.int64)
        self._cum_at = self._at + np.arange(len(GROUPS))  # group g's cum has sizes[g] + 1 rows
        # each group's columns over its own combinations, in row order
        self._parts: list[dict[str, np.ndarray]] = []
        for a, b in GROUPS:
            index = np.unravel_index(np.arange(sizes[len(self._parts)]), self.shape[a:b])
            self._parts.append({n: self.values[n][i] for n, i in zip(DIMENSION_NAMES[a:b], index)})
        #: suffix columns with one value are filled, the others written row by row
        self._vary32 = tuple(n for n in SUFFIX32 if len(self.values[n]) > 1)
        self._vary8 = tuple(n for n in SUFFIX8 if len(self.values[n]) > 1)
        #: signatures met so far, by (flags, stage_ranks)
        self._signature_ids: dict[tuple[int, int], int] = {}
        w, n_sets, g = int(self._size.sum()), RULE_SETS.shape[0], len(GROUPS)
        self._tables = _Tables(
            masks=np.zeros((0, w), np.int64), valid=np.zeros((0, w), np.int64),
            n_valid_parts=np.zeros((0, g), np.int64), cum=np.zeros((0, w + g, n_sets), np.int64),
            tail=np.zeros((0, g + 1, n_sets), np.int64), template_at=np.zeros(0, np.int64),
            template32=np.zeros((len(self._vary32), 0), np.int32), template8=np.zeros((len(self._vary8), 0), np.int8),
            template_pos=np.zeros(0, np.int64))

    # ------------------------------------------------------------------ public

    def encode(self, start: int = 0, stop: int | None = None) -> Encoded:
        """Rows ``start:stop`` of the flat product, filtered."""
        stop = self.n_combinations if stop is None else min(stop, self.n_combinations)
        if stop <= start:
            return self._encoded(np.empty((len(OUT32), 0), np.int32), np.empty((len(SUFFIX8), 0), np.int8),
                                 np.empty(0, np.int64), 0, np.zeros(len(Reason), np.int64),
                                 np.zeros(len(Reason), np.int64))
        if start < 0:
            raise ValueError(f"start = {start}: expected a row id of at least 0")
        q = self.n_suffix
        first, last = start // q, (stop - 1) // q
        prefix = np.arange(first, last + 1, dtype=np.int64)
        lo = np.zeros(prefix.shape[0], np.int64)
        hi = np.full(prefix.shape[0], q, np.int64)
        lo[0] = start - first * q
        hi[-1] = stop - last * q
        return self._encode_blocks(prefix, lo, hi)

    def row_ids(self, positions: dict[str, np.ndarray]) -> np.ndarray:
        """Row ids of combinations given as each dimension's value position."""
        return np.ravel_multi_index(tuple(positions[n] for n in DIMENSION_NAMES), self.shape).astype(np.int64)

    def encode_ids(self, flat: np.ndarray) -> Encoded:
        """The combinations with these row ids (in this order), filtered: the rules each
        breaks are its prefix's and those of its part of every group."""
        flat = np.asarray(flat)
        if flat.dtype.kind not in "iu":
            raise TypeError(f"row ids of dtype {flat.dtype}: expected integers")
        if flat.ndim != 1:
            raise ValueError(f"row ids of shape {flat.shape}: expected one dimension")
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.n_combinations):
            raise ValueError(f"row ids from {flat.min()} to {flat.max()}: expected 0 to {self.n_combinations - 1}")
        prefix, at = np.divmod(flat.astype(np.int64), self.n_suffix)
        prefix_values, prefix_bits, _, sig = self._blocks(prefix)
        t = self._tables
        parts = [(at // self._stride[g]) % self._size[g] for g in range(len(GROUPS))]
        bits = prefix_bits.copy()
        for g, part in enumerate(parts):
            bits |= t.masks[sig, self._at[g] + part]
        first = np.zeros(flat.shape[0], np.int64)
        breaks = np.zeros(len(Reason), np.int64)
        for code in reversed(range(1, len(Reason))):  # the lowest code broken is the first
            broken = (bits >> code) & 1 == 1
            first[broken] = code
            breaks[code] = np.count_nonzero(broken)
        keep = np.flatnonzero(first == Reason.VALID)
        out32 = np.empty((len(OUT32), keep.shape[0]), np.int32)
        out8 = np.empty((len(SUFFIX8), keep.shape[0]), np.int8)
        out32[:N_PREFIX_OUT] = prefix_values[:, keep]
        self._write_suffix(out32, out8, None, slice(None), [part[keep] for part in parts])
        self._fill_constants(out32, out8)
        return self._encoded(out32, out8, flat[keep], flat.shape[0],
                             np.bincount(first, minlength=len(Reason)).astype(np.int64), breaks)

    def chunks(self, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[Encoded]:
        """Consecutive chunks of at most ``chunk_rows`` combinations."""
        stop = self.n_combinations if stop is None else min(stop, self.n_combinations)
        for lo in range(start, stop, chunk_rows):
            yield self.encode(lo, min(lo + chunk_rows, stop))

    def encode_all(self) -> Encoded:
        return self.encode(0, self.n_combinations)

    # ------------------------------------------------------------------ blocks

    def _blocks(self, prefix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The blocks' prefix columns and n_microbatches (int32, a row each), their broken
        prefix rules (bit = Reason), the first of those (0: none) and their signatures."""
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
        dp_mb = cols["dp"].astype(np.int64) * cols["micro_batch"]
        values = np.empty((N_PREFIX_OUT, prefix.shape[0]), np.int32)
        for i, name in enumerate(PREFIX_NAMES):
            values[i] = cols[name]
        values[N_PREFIX] = np.where(dp_mb > 0, self.space.spec.global_batch // np.maximum(dp_mb, 1), 0)
        return values, prefix_bits, prefix_first, self._signature_of(terms)

    def _encode_blocks(self, prefix: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Encoded:
        """Combinations ``lo[b]:hi[b]`` of block ``prefix[b]``, for every b in order.

        A block's counts are its suffixes below ``hi`` clear of each rule set less those
        below ``lo`` (for a whole block, its signature's ``tail[s, 0]``); its valid rows are
        its signature's valid suffixes, in row order, from rank (the valid suffixes below)
        ``lo`` to rank ``hi``."""
        prefix_values, prefix_bits, prefix_first, sig = self._blocks(prefix)
        t = self._tables
        n = hi - lo
        clean = prefix_first == 0
        # combinations clear of each rule set, summed over the blocks (all, clean): whole
        # blocks by signature, cut ones (at most two) from their ends
        whole = (lo == 0) & (hi == self.n_suffix)
        per_signature = t.tail[:, 0]
        inside_all = np.bincount(sig[whole], minlength=per_signature.shape[0]) @ per_signature
        inside_clean = np.bincount(sig[whole & clean], minlength=per_signature.shape[0]) @ per_signature
        cut = np.flatnonzero(~whole)
        below_lo = self._clear_below(sig[cut], lo[cut])
        cut_inside = self._clear_below(sig[cut], hi[cut]) - below_lo
        inside_all += cut_inside.sum(axis=0)
        inside_clean += cut_inside[clean[cut]].sum(axis=0)
        first_reason = np.zeros(len(Reason), np.int64)
        breaks = np.zeros(len(Reason), np.int64)
        for code in PREFIX_REASONS:
            breaks[code] = n[(prefix_bits >> code) & 1 == 1].sum()
            first_reason[code] = n[prefix_first == code].sum()
        codes = np.array(SUFFIX_CODES)
        first_reason[codes] += inside_clean[:ALL] - inside_clean[1:ALL + 1]
        first_reason[Reason.VALID] = inside_clean[ALL]
        breaks[codes] += n.sum() - inside_all[ALL + 1:]

        # each block's valid rows: ranks rank[b] to rank[b] + n_valid[b] of its signature's
        n_valid = per_signature[sig, ALL]
        n_valid[cut] = cut_inside[:, ALL]
        n_valid[~clean] = 0
        rank = np.zeros(prefix.shape[0], np.int64)
        rank[cut] = below_lo[:, ALL]
        out_at = np.zeros(prefix.shape[0] + 1, np.int64)
        np.cumsum(n_valid, out=out_at[1:])
        n_rows = int(out_at[-1])
        out32 = np.empty((len(OUT32), n_rows), np.int32)
        out8 = np.empty((len(SUFFIX8), n_rows), np.int8)
        pos = np.empty(n_rows, np.int64)
        templated = t.template_at[sig] >= 0
        for from_template in (True, False):
            b = np.flatnonzero((n_valid > 0) & (templated == from_template))
            if b.shape[0] == 0:
                continue
            count = n_valid[b]
            a, z = int(out_at[b[0]]), int(out_at[b[-1] + 1])
            rows: Any = slice(a, z) if z - a == int(count.sum()) else _ragged(out_at[b], count)
            if from_template:
                src = _ragged(t.template_at[sig[b]] + rank[b], count)
                for out, names, table in ((out32, self._vary32, t.template32), (out8, self._vary8, t.template8)):
                    for i, name in enumerate(names):
                        _take(table[i], src, out[_row(name)], rows)
                _take(t.template_pos, src, pos, rows)
            else:
                parts = self._product_parts(t.valid, t.n_valid_parts, np.repeat(sig[b], count),
                                            _ragged(rank[b], count))
                self._write_suffix(out32, out8, pos, rows, parts)
        for i in range(N_PREFIX_OUT):
            v = prefix_values[i]
            if v.shape[0] and (v == v[0]).all():
                out32[i] = v[0]
            else:
                out32[i] = np.repeat(v, n_valid)
        self._fill_constants(out32, out8)
        pos += np.repeat(prefix * self.n_suffix, n_valid)
        return self._encoded(out32, out8, pos, int(n.sum()), first_reason, breaks)

    def _clear_below(self, sig: np.ndarray, x: np.ndarray) -> np.ndarray:
        """[b, i]: the suffix positions below ``x[b]`` (at most ``n_suffix``) of a block with
        signature ``sig[b]`` that are clear of ``RULE_SETS[i]``.

        In mixed radix over the groups, a position below x first differs from x in some
        group j, where its part comes before x's: it is clear of a set when x's parts in
        the groups before j are, its part in j is one of the clear ones before x's, and its
        parts in the groups after j are any clear ones."""
        t = self._tables
        out = np.zeros((x.shape[0], RULE_SETS.shape[0]), np.int64)
        whole = x == self.n_suffix
        out[whole] = t.tail[sig[whole], 0]
        cut = np.flatnonzero((x > 0) & ~whole)
        if cut.shape[0]:
            s, xc = sig[cut], x[cut]
            clear_so_far = np.ones((cut.shape[0], RULE_SETS.shape[0]), bool)
            acc = np.zeros((cut.shape[0], RULE_SETS.shape[0]), np.int64)
            for g in range(len(GROUPS)):
                d = (xc // self._stride[g]) % self._size[g]
                acc += clear_so_far * t.cum[s, self._cum_at[g] + d] * t.tail[s, g + 1]
                clear_so_far &= (t.masks[s, self._at[g] + d][:, None] & RULE_SETS) == 0
            out[cut] = acc
        return out

    def _product_parts(self, valid: np.ndarray, count: np.ndarray, sig: np.ndarray,
                       rank: np.ndarray) -> list[np.ndarray]:
        """Each group's part of the valid suffix of rank ``rank`` of signature ``sig``: the
        rank's mixed-radix digits over the counts of valid parts (the last group fastest)
        pick the valid parts."""
        parts: list[np.ndarray] = [rank] * len(GROUPS)
        for g in reversed(range(len(GROUPS))):
            rank, digit = np.divmod(rank, count[sig, g])
            parts[g] = valid[sig, self._at[g] + digit]
        return parts

    def _write_suffix(self, out32: np.ndarray, out8: np.ndarray, pos: np.ndarray | None, rows: Any,
                      parts: list[np.ndarray]) -> None:
        """Write the combinations given as each group's part into ``rows`` of the outputs:
        the suffix columns with more than one value, and (unless None) the suffix positions."""
        for name in (*self._vary32, *self._vary8):
            g = GROUP_OF[name]
            (out32 if name in SUFFIX32 else out8)[_row(name), rows] = self._parts[g][name][parts[g]]
        if pos is not None:
            at = np.zeros(parts[0].shape[0], np.int64)
            for g, part in enumerate(parts):
                at += part * self._stride[g]
            pos[rows] = at

    def _fill_constants(self, out32: np.ndarray, out8: np.ndarray) -> None:
        """The suffix columns with one value."""
        for name in SUFFIX_NAMES:
            if len(self.values[name]) == 1:
                (out32 if name in SUFFIX32 else out8)[_row(name)] = self.values[name][0]

    @staticmethod
    def _encoded(out32: np.ndarray, out8: np.ndarray, row_id: np.ndarray, n_combinations: int,
                 first_reason: np.ndarray, breaks: np.ndarray) -> Encoded:
        columns = {name: (out32 if name in OUT32 else out8)[_row(name)] for name in DIMENSION_NAMES}
        columns["row_id"] = row_id
        columns["n_microbatches"] = out32[N_PREFIX]
        return Encoded(columns=columns, n_combinations=n_combinations, first_reason=first_reason, breaks=breaks)

    # ------------------------------------------------------------------ signatures

    def _signature_of(self, terms: dict[str, np.ndarray]) -> np.ndarray:
        """Each block's signature id (its terms), tabulating the signatures not seen yet."""
        flags = np.zeros(terms["stage_ranks"].shape[0], np.int64)
        for i, name in enumerate(FLAG_TERMS):
            flags |= terms[name].astype(np.int64) << i
        ranks, rank_of = np.unique(terms["stage_ranks"], return_inverse=True)
        keys, key_of = np.unique((rank_of.astype(np.int64) << len(FLAG_TERMS)) | flags, return_inverse=True)
        found = [(int(k) & ((1 << len(FLAG_TERMS)) - 1), int(ranks[int(k) >> len(FLAG_TERMS)])) for k in keys]
        new = [key for key in found if key not in self._signature_ids]
        if new:
            self._add_signatures(new)
        ids = np.array([self._signature_ids[key] for key in found], np.int64)
        return ids[key_of].reshape(-1)

    def _add_signatures(self, keys: list[tuple[int, int]]) -> None:
        """Tabulate the signatures with these (flags, stage_ranks), all at once: every rule is
        evaluated on terms of shape (signatures, 1) against its group's columns."""
        k, n_sets, w = len(keys), RULE_SETS.shape[0], int(self._size.sum())
        flags = np.array([f for f, _ in keys], np.int64)[:, None]
        terms: Columns = {name: (flags >> i) & 1 == 1 for i, name in enumerate(FLAG_TERMS)}
        terms["stage_ranks"] = np.array([r for _, r in keys], np.int64)[:, None]
        masks = np.zeros((k, w), np.int64)
        valid = np.zeros((k, w), np.int64)
        n_valid_parts = np.zeros((k, len(GROUPS)), np.int64)
        cum = np.zeros((k, w + len(GROUPS), n_sets), np.int64)
        tail = np.ones((k, len(GROUPS) + 1, n_sets), np.int64)
        for g in range(len(GROUPS)):
            group = masks[:, self._at[g]:self._at[g] + self._size[g]]
            for rule in SUFFIX_RULES:
                if GROUP_OF[rule.dims[0]] == g:
                    broken = rule.broken(terms, {d: self._parts[g][d] for d in rule.dims}, self.space)
                    group |= np.broadcast_to(broken, group.shape).astype(np.int64) << int(rule.reason)
            clear = (group[:, :, None] & RULE_SETS) == 0
            np.cumsum(clear, axis=1, out=cum[:, self._cum_at[g] + 1:self._cum_at[g] + 1 + self._size[g]])
            # the valid parts first, each side in order
            valid[:, self._at[g]:self._at[g] + self._size[g]] = np.argsort(group != 0, axis=1, kind="stable")
            n_valid_parts[:, g] = np.count_nonzero(group == 0, axis=1)
        for g in reversed(range(len(GROUPS))):
            tail[:, g] = tail[:, g + 1] * cum[:, self._cum_at[g] + self._size[g]]
        # templates, while the budget lasts
        t = self._tables
        n_valid = tail[:, 0, ALL]
        room = TEMPLATE_BUDGET_ROWS - t.template_pos.shape[0]
        take = np.flatnonzero(n_valid <= TEMPLATE_ROWS)
        take = take[np.cumsum(n_valid[take]) <= room]
        template_at = np.full(k, -1, np.int64)
        template_at[take] = t.template_pos.shape[0] + np.cumsum(n_valid[take]) - n_valid[take]
        count = n_valid[take]
        n_new = int(count.sum())
        new32 = np.empty((len(OUT32), n_new), np.int32)
        new8 = np.empty((len(SUFFIX8), n_new), np.int8)
        new_pos = np.empty(n_new, np.int64)
        parts = self._product_parts(valid, n_valid_parts, np.repeat(take, count), _ragged(np.zeros_like(count), count))
        self._write_suffix(new32, new8, new_pos, slice(None), parts)
        self._tables = _Tables(
            masks=np.concatenate([t.masks, masks]), valid=np.concatenate([t.valid, valid]),
            n_valid_parts=np.concatenate([t.n_valid_parts, n_valid_parts]), cum=np.concatenate([t.cum, cum]),
            tail=np.concatenate([t.tail, tail]), template_at=np.concatenate([t.template_at, template_at]),
            template32=np.concatenate([t.template32, new32[[_row(n) for n in self._vary32]]], axis=1),
            template8=np.concatenate([t.template8, new8[[_row(n) for n in self._vary8]]], axis=1),
            template_pos=np.concatenate([t.template_pos, new_pos]))
        for key in keys:
            self._signature_ids[key] = len(self._signature_ids)


def _row(name: str) -> int:
    """The row of column ``name`` in the int32 (``OUT32``) or int8 (``SUFFIX8``) output matrix."""
    return OUT32.index(name) if name in OUT32 else SUFFIX8.index(name)


def _take(values: np.ndarray, index: np.ndarray, out: np.ndarray, rows: Any) -> None:
    """``out[rows] = values[index]``, gathered in place where ``rows`` is a slice."""
    if isinstance(rows, slice):
        np.take(values, index, out=out[rows], mode="clip")  # "raise" would buffer
    else:
        out[rows] = values[index]


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
    Reason.DEFER_WITHOUT_ACCUMULATION: "defer_grad_sync without zero=3 or with one micro-batch per step (same as "
                                       "without)",
}

