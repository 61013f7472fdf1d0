"""Hardware profiles fitted to measurements (``paraspace calibrate gemm|comm``).

Real clusters differ from datasheets. Given measured GEMM or collective timings,
these functions fit the profile fields the kernels read and write a TOML that
``extends`` the base profile and replaces only what was fitted; the written file
is loaded back through ``spaces.catalog.load_hardware`` and every measured point
is predicted by the kernels themselves, so the round trip is checked, not
assumed. (``explorer.fit_published`` is a different tool: it tunes
``gemm_max_efficiency`` against published end-to-end training runs.)

CSV files: a header row, then one measurement per row; blank lines and lines
starting with ``#`` are skipped, column names are matched case-insensitively,
other columns are ignored.

GEMM (``m, n, k, dtype`` and one of ``seconds`` / ``tflops``)
    One (m x k) @ (k x n) GEMM per row; ``seconds`` is the wall time of one call,
    ``tflops`` the achieved 2mnk / seconds in TFLOP/s (so seconds = 2mnk /
    (tflops * 1e12); a kernel-only "utilisation" u of the peak is tflops = u *
    peak and is read the same way). Rows of the same (m, n, k) are averaged (mean
    seconds). Each shape becomes one ``device.gemm_efficiency`` point::

        efficiency = 2mnk / ((seconds - launch_overhead) * peak(dtype))

    clamped to (0, 1], so that ``kernels.ops.gemm_time_s`` = 2mnk / (peak * eff)
    + launch reproduces the measured time wherever the GEMM is compute-bound
    (a point below the memory roofline is reported: the kernel then predicts the
    HBM traffic time instead). All rows must share one ``dtype``: the table is a
    property of the device, read as a fraction of the peak of whatever precision
    a run uses, so mixing precisions in one fit is refused (fit one file per
    precision into separate profiles). At most ``kernels.params.MAX_GEMM_POINTS``
    (64) distinct shapes; more is an error, not a silent reduction. The fitted
    table replaces the base's table whole (and, where the base had none, the
    tile model): the kernel interpolates in log m among the points of the nearest
    (n, k), flat beyond the measured m.

Collectives (``op, ranks, bytes`` and one of ``seconds`` / ``gbps``)
    ``op`` a ``spaces.enums.Collective`` label (all_reduce, all_gather,
    reduce_scatter, all_to_all, send_recv, broadcast, reduce); ``ranks`` the
    group size (>= 2); ``bytes`` the buffer as nccl-tests counts it (all-reduce
    input, all-gather output, reduce-scatter input, all-to-all send buffer,
    send/recv message, broadcast / reduce buffer);
    ``seconds`` the time of one operation, or ``gbps`` the bus bandwidth in
    decimal GB/s (1e9 bytes/s) as nccl-tests prints ``busbw``: seconds = bytes *
    busfactor / (gbps * 1e9), with the bus factors of
    ``kernels.collectives.flat_time_s`` (all-reduce 2(n-1)/n; all-gather,
    reduce-scatter, all-to-all (n-1)/n; send/recv, broadcast, reduce 1;
    all-reduce by the ring algorithm). Sources quoting binary
    GiB/s multiply by 1.073741824 first. Rows of the same (op, ranks, bytes) are
    averaged. The whole group is taken to run on the named tier (one flat level):

        seconds = steps * alpha + bytes * busfactor / (op_bandwidth * curve(bytes))

    with steps 2(n-1) for all-reduce, 1 for send/recv and n-1 otherwise. Fitted:

    * ``latency_us`` (alpha, shared by every op of the tier): least squares of
      seconds = steps * alpha + busfactor * bytes * beta over the small messages
      (at most ``SMALL_MESSAGE_BYTES`` = 64 KiB, nccl-tests' latency regime);
      with none in the file, the base tier's latency is kept. Either way it is
      clamped to [0, what every point allows]: no curve point may need more than
      the large-message bandwidth, and every point keeps a bandwidth term.
    * the size curve (``size_curve``, one per tier) from the op with the most
      distinct message sizes (then the most rows, then Collective order): per
      size, the latency-free bus bandwidth bytes * busfactor / (seconds - steps
      * alpha) (geometric mean over rank counts), divided by its maximum, so the
      curve peaks at 1. At most ``MAX_CURVE_POINTS`` (16) sizes; with more, the
      smallest, the largest and the fastest are kept and the size with the worst
      predicted error is added until 16. A single size gives no curve.
    * ``op_bandwidth_GB_per_s[op]`` for every op in the file: for the curve's op
      that maximum (its measured points are then reproduced exactly); for any
      other op the bandwidth minimising its largest relative time error under
      the shared alpha and curve (reported; it is exact only when that op's
      bandwidth-vs-size shape matches the curve's op). Ops of the base tier not in
      the file keep their bandwidth but now use the fitted alpha and curve.

    The written file restates every ``[[links]]`` tier of the base (arrays of
    tables replace the base's whole), with the fitted tier changed.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from paraspace.explorer.evaluate import MIB, pack_hardware
from paraspace.kernels import params
from paraspace.kernels.collectives import flat_time_s, link_bytes_per_s, size_fraction
from paraspace.kernels.ops import gemm_time_s
from paraspace.results.writer import check_replaceable, publish
from paraspace.spaces import catalog
from paraspace.spaces.enums import DTYPE_BYTES, Collective, Dtype, labels, parse
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.schema import GB, TFLOP, Hardware, LinkTier

#: messages up to this size fit the latency (nccl-tests' latency-bound regime)
SMALL_MESSAGE_BYTES = 64 * 1024
#: round-trip relative error above which a fitted point is reported
TOLERANCE = 0.05
#: no collective completes faster than this: a shorter measured time is a unit mistake
MIN_COLLECTIVE_S = 1e-9
#: the most a measured GEMM may run past the datasheet peak before it is a unit mistake (a time
#: in ms, FLOPs counted twice) rather than a clock: a GPU's peak is quoted at one boost clock and
#: short bursts run up to its maximum, 8% above on an H100 SXM (989.4 TFLOP/s = 132 SMs x 4,096
#: FLOP a clock x 1.83 GHz against the 1.98 GHz maximum boost); up to this a point is clamped to
#: the peak with a note, beyond it the file is refused
MAX_OVER_PEAK = 1.1
#: keep alpha strictly below every point's time / steps (a bandwidth term remains)
_ALPHA_HEADROOM = 0.999


# --------------------------------------------------------------------------- CSV


@dataclass(frozen=True)
class Row:
    """One CSV data row: its line number in the file and its cells by column."""

    line: int
    cells: dict[str, str]


def read_rows(path: Path, required: tuple[str, ...], either: tuple[str, str]) -> tuple[list[Row], str]:
    """Data rows of a measurement CSV with the ``required`` columns and exactly
    one of the two ``either`` columns; returns the rows and the one present."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise CatalogError(path, "(file)", str(path), f"a readable UTF-8 CSV file ({err})") from None
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise CatalogError(path, "(file)", "(empty)", f"a header row with the columns {', '.join(required)} and "
                                                      f"{either[0]} or {either[1]}, then one row per measurement")
    header_line, header_text = lines[0]
    header = [c.strip().lower() for c in next(csv.reader([header_text]))]
    repeated = sorted({c for c in header if c and header.count(c) > 1})
    if repeated:  # which copy a row's value comes from would be a guess
        raise CatalogError(path, f"line {header_line}, columns", header,
                           f"each column once ({', '.join(repeated)} given more than once)")
    missing = [c for c in required if c not in header]
    present = [c for c in either if c in header]
    if missing or len(present) != 1:
        what = f"missing {', '.join(missing)}" if missing else (
            f"both {either[0]} and {either[1]}: give one" if present else f"missing {either[0]} or {either[1]}")
        raise CatalogError(path, f"line {header_line}, columns", header,
                           f"the columns {', '.join(required)} and one of {either[0]} or {either[1]} ({what})")
    rows = []
    for line, raw in lines[1:]:
        values = next(csv.reader([raw]))
        if len(values) < len(header):
            values += [""] * (len(header) - len(values))
        rows.append(Row(line, {name: values[i].strip() for i, name in enumerate(header) if name}))
    if not rows:
        raise CatalogError(path, "(file)", "(header only)", "at least one measurement row below the header")
    return rows, present[0]


def _number(path: Path, row: Row, column: str, *, integer: bool = False, minimum: float = 0.0) -> float:
    """A cell as a finite number above ``minimum`` (an integer when asked)."""
    text = row.cells.get(column, "")
    kind = "an integer" if integer else "a number"
    bound = f"at least {minimum + 1:g}" if integer and minimum > 0 else "greater than 0"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (integer and value != int(value)) or value <= minimum:
        raise CatalogError(path, f"line {row.line}, {column}", text or "(empty)", f"{kind} {bound}")
    return value


def file_digest(path: Path) -> str:
    """First 16 hex digits of the file's SHA-256 (recorded in the written profile)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


# --------------------------------------------------------------------------- GEMM


@dataclass(frozen=True)
class GemmMeasurement:
    """One measured GEMM shape (duplicate rows averaged)."""

    m: int
    n: int
    k: int
    seconds: float
    lines: tuple[int, ...]


@dataclass(frozen=True)
class GemmPoint:
    """A fitted ``gemm_efficiency`` point and what the kernel predicts with it."""

    measured: GemmMeasurement
    efficiency: float
    #: 2mnk / ((seconds - launch) * peak) before clamping to (0, 1]
    raw_efficiency: float
    #: the HBM traffic of the GEMM takes longer than its measured compute time
    memory_bound: bool


@dataclass(frozen=True)
class GemmFit:
    base: Hardware
    dtype: str
    points: tuple[GemmPoint, ...]

    @property
    def table(self) -> tuple[tuple[int, int, int, float], ...]:
        return tuple((p.measured.m, p.measured.n, p.measured.k, p.efficiency) for p in self.points)

    def lines_of(self, field: str) -> list[int]:
        """The CSV lines behind a profile field: a ``device.gemm_efficiency.I`` point's, else every line."""
        parts = field.split(".")
        if parts[:2] == ["device", "gemm_efficiency"] and len(parts) > 2 and parts[2].isdigit() \
                and int(parts[2]) < len(self.points):
            return list(self.points[int(parts[2])].measured.lines)
        return sorted(line for p in self.points for line in p.measured.lines)

    def hardware(self, name: str | None = None, description: str | None = None) -> Hardware:
        """The base with the fitted table (not validated; the written file is)."""
        device = self.base.device.model_copy(update={"gemm_efficiency": self.table})
        update: dict[str, Any] = {"device": device}
        if name:
            update.update(name=name, description=description or self.base.description)
        return self.base.model_copy(update=update)


def read_gemm_csv(path: Path, hw: Hardware) -> tuple[str, list[GemmMeasurement]]:
    """The file's precision and its measured shapes (duplicates averaged), sorted by (n, k, m)."""
    rows, timing = read_rows(path, ("m", "n", "k", "dtype"), ("seconds", "tflops"))
    dtypes: dict[str, int] = {}
    shapes: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
    known = labels(Dtype)
    for row in rows:
        m, n, k = (int(_number(path, row, c, integer=True)) for c in ("m", "n", "k"))
        dtype = row.cells.get("dtype", "").lower()
        if dtype not in known:
            raise CatalogError(path, f"line {row.line}, dtype", row.cells.get("dtype", "") or "(empty)",
                               f"one of {known}")
        if dtype not in hw.device.peak_TFLOP_per_s:
            raise CatalogError(path, f"line {row.line}, dtype", dtype,
                               f"a precision {hw.name} has a peak for: {sorted(hw.device.peak_TFLOP_per_s)}")
        dtypes.setdefault(dtype, row.line)
        value = _number(path, row, timing)
        seconds = value if timing == "seconds" else 2.0 * m * n * k / (value * TFLOP)
        shapes.setdefault((m, n, k), []).append((row.line, seconds))
    if len(dtypes) > 1:
        where = ", ".join(f"{d} (line {line})" for d, line in dtypes.items())
        raise CatalogError(path, "dtype", sorted(dtypes), "one precision per file: the gemm_efficiency table is a "
                           f"fraction of the peak of the precision a run uses (found {where}); fit each precision "
                           "into its own profile")
    if len(shapes) > params.MAX_GEMM_POINTS:
        raise CatalogError(path, "(m, n, k)", f"{len(shapes)} distinct shapes",
                           f"at most {params.MAX_GEMM_POINTS} (kernels.params.MAX_GEMM_POINTS, the size of the "
                           "device's table): keep the shapes your models run")
    measured = [GemmMeasurement(m, n, k, float(np.mean([s for _, s in got])), tuple(line for line, _ in got))
                for (m, n, k), got in shapes.items()]
    measured.sort(key=lambda g: (g.n, g.k, g.m))
    return next(iter(dtypes)), measured


def fit_gemm(measured: list[GemmMeasurement], hw: Hardware, dtype: str, source: str | Path = "measurements") -> GemmFit:
    """One efficiency point per shape: 2mnk / ((seconds - launch) * peak), clamped to (0, 1]; a
    shape more than ``MAX_OVER_PEAK`` past the peak is a ``CatalogError`` naming its line."""
    dev = hw.device
    peak = dev.peak_flops_per_s(dtype)
    launch = dev.launch_overhead_s
    hbm = dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency
    points = []
    for g in measured:
        compute = g.seconds - launch
        if compute <= 0.0:
            raise CatalogError(source, f"line {g.lines[0]}, seconds", g.seconds,
                               f"more than {hw.name}'s launch overhead of {dev.launch_overhead_us:g} us "
                               "(the kernel adds it to every GEMM)")
        flops = 2.0 * g.m * g.n * g.k
        raw = flops / (compute * peak)
        if raw > MAX_OVER_PEAK:
            raise CatalogError(source, f"line {g.lines[0]}, seconds", g.seconds,
                               f"at least {flops / (MAX_OVER_PEAK * peak) + launch:.4g} s: 2mnk = {flops:.4g} FLOP in "
                               f"that time is {raw:.2f} x {hw.name}'s {dtype} peak of "
                               f"{dev.peak_TFLOP_per_s[dtype]:g} TFLOP/s (a time in ms, or another dtype's peak?)")
        traffic = (g.m * g.k + g.k * g.n + g.m * g.n) * DTYPE_BYTES[dtype] / hbm
        points.append(GemmPoint(g, min(raw, 1.0), raw, traffic > compute))
    return GemmFit(hw, dtype, tuple(points))


def predict_gemm(hw: Hardware, dtype: str, shapes: list[tuple[float, float, float]]) -> list[float]:
    """``kernels.ops.gemm_time_s`` of each (m, n, k) on ``hw`` packed as the explorer packs it."""
    device, _, tiles = pack_hardware(hw, dtype)
    return [float(gemm_time_s(float(m), float(n), float(k), device[0], tiles, DTYPE_BYTES[dtype]))
            for m, n, k in shapes]


# --------------------------------------------------------------------------- collectives


def bus_factor(op: str, ranks: float) -> float:
    """nccl-tests bus bandwidth / algorithm bandwidth (``flat_time_s``'s factors)."""
    if op == "all_reduce":
        return 2.0 * (ranks - 1.0) / ranks
    if op in ("send_recv", "broadcast", "reduce"):
        return 1.0
    return (ranks - 1.0) / ranks


def latency_steps(op: str, ranks: float) -> float:
    """Latency terms alpha of one collective in ``flat_time_s`` (all-reduce: the
    ring algorithm, which the fit assumes)."""
    if op == "all_reduce":
        return 2.0 * (ranks - 1.0)
    if op == "send_recv":
        return 1.0
    return ranks - 1.0


@dataclass(frozen=True)
class CommMeasurement:
    """One measured collective (duplicate rows averaged)."""

    op: str
    ranks: int
    bytes: float
    seconds: float
    lines: tuple[int, ...]

    @property
    def steps(self) -> float:
        return latency_steps(self.op, self.ranks)

    @property
    def bus_bytes(self) -> float:
        return self.bytes * bus_factor(self.op, self.ranks)


@dataclass(frozen=True)
class CommFit:
    base: Hardware
    tier_index: int
    measured: tuple[CommMeasurement, ...]
    latency_s: float
    #: how alpha was chosen, in words
    latency_note: str
    #: fitted large-message bus bandwidth per op, bytes/s
    op_bytes_per_s: dict[str, float]
    #: op the curve was fitted on ("" when the file has no op with two sizes)
    curve_op: str
    #: (bytes, fraction) ascending
    curve: tuple[tuple[float, float], ...]

    def lines_of(self, field: str) -> list[int]:
        """The CSV lines behind a profile field: an op's bandwidth comes from that op's lines, the size
        curve from its op's lines, the latency (and anything else) from every line."""
        parts = field.split(".")
        key = parts[2] if parts[0] == "links" and len(parts) > 2 else ""
        op = parts[3] if key == "op_bandwidth_GB_per_s" and len(parts) > 3 else (
            self.curve_op if key == "size_curve" else "")
        chosen = [c for c in self.measured if c.op == op] or list(self.measured)
        return sorted(line for c in chosen for line in c.lines)

    @property
    def tier(self) -> LinkTier:
        """The fitted tier (the base tier with latency, op bandwidths and curve replaced)."""
        old = self.base.links[self.tier_index]
        ops = {**old.op_bandwidth_GB_per_s, **{op: bw / GB for op, bw in self.op_bytes_per_s.items()}}
        ops = {label: ops[label] for label in labels(Collective) if label in ops}
        curve = tuple((b / MIB, f) for b, f in self.curve)
        return old.model_copy(update={"latency_us": self.latency_s * 1e6, "op_bandwidth_GB_per_s": ops,
                                      "size_curve": curve})

    def hardware(self, name: str | None = None, description: str | None = None) -> Hardware:
        links = list(self.base.links)
        links[self.tier_index] = self.tier
        update: dict[str, Any] = {"links": tuple(links)}
        if name:
            update.update(name=name, description=description or self.base.description)
        return self.base.model_copy(update=update)


def tier_index(hw: Hardware, tier: str) -> int:
    names = [link.name for link in hw.links]
    if tier not in names:
        raise CatalogError("command line", "--tier", tier, f"one of {hw.name}'s link tiers {names}")
    return names.index(tier)


def read_comm_csv(path: Path) -> list[CommMeasurement]:
    """Measured collectives (duplicates averaged), sorted by (op, ranks, bytes)."""
    rows, timing = read_rows(path, ("op", "ranks", "bytes"), ("seconds", "gbps"))
    known = labels(Collective)
    groups: dict[tuple[str, int, float], list[tuple[int, float]]] = {}
    for row in rows:
        op = row.cells.get("op", "").lower()
        if op not in known:
            raise CatalogError(path, f"line {row.line}, op", row.cells.get("op", "") or "(empty)", f"one of {known}")
        ranks = int(_number(path, row, "ranks", integer=True, minimum=1.0))
        size = _number(path, row, "bytes")
        value = _number(path, row, timing)
        seconds = value if timing == "seconds" else size * bus_factor(op, ranks) / (value * GB)
        if not MIN_COLLECTIVE_S <= seconds < math.inf:  # a unit mistake; the fit would divide by ~0
            raise CatalogError(path, f"line {row.line}, {timing}", row.cells[timing],
                               f"a measurement of at least {MIN_COLLECTIVE_S * 1e9:g} ns per collective "
                               f"(this row gives {seconds:.3g} s)")
        groups.setdefault((op, ranks, size), []).append((row.line, seconds))
    out = [CommMeasurement(op, ranks, size, float(np.mean([s for _, s in got])), tuple(line for line, _ in got))
           for (op, ranks, size), got in groups.items()]
    order = {label: i for i, label in enumerate(known)}
    out.sort(key=lambda c: (order[c.op], c.ranks, c.bytes))
    return out


def _curve_record(curve: tuple[tuple[float, float], ...]) -> np.ndarray:
    """A TIER record carrying only ``curve`` (for ``kernels.collectives.size_fraction``)."""
    rec = params.tier_table([(0.0, 1.0, 0.0)])
    rec["n_curve"][0] = len(curve)
    for j, (size, fraction) in enumerate(curve):
        rec["curve_bytes"][0, j] = size
        rec["curve_fraction"][0, j] = fraction
    return rec


def _model_s(c: CommMeasurement, alpha: float, bandwidth: float, tier: np.ndarray) -> float:
    return c.steps * alpha + c.bus_bytes / (bandwidth * size_fraction(tier[0], c.bytes))


def _fit_latency(measured: list[CommMeasurement], base_latency_s: float) -> tuple[float, str]:
    """Least-squares alpha over the small messages (unclamped), with a note."""
    small = [c for c in measured if c.bytes <= SMALL_MESSAGE_BYTES]
    if not small:
        return base_latency_s, (f"kept from the base tier: no message of at most {SMALL_MESSAGE_BYTES // 1024} KiB "
                                "to fit it on")
    steps = np.array([c.steps for c in small])
    times = np.array([c.seconds for c in small])
    design = np.column_stack([steps, [c.bus_bytes for c in small]])
    (alpha, beta), _, rank, _ = np.linalg.lstsq(design, times, rcond=None)
    if rank < 2 or beta < 0.0:  # one message size, or noise: latency only
        alpha = float(steps @ times / (steps @ steps))
    note = f"least squares over {len(small)} message(s) of at most {SMALL_MESSAGE_BYTES // 1024} KiB"
    return max(float(alpha), 0.0), note


def _latency_bound(measured: list[CommMeasurement], curve_points: list[CommMeasurement]) -> float:
    """The largest alpha every point allows: each keeps a bandwidth term, and no
    point of the curve's op gets faster than its fastest point at alpha = 0."""
    bound = min(_ALPHA_HEADROOM * c.seconds / c.steps for c in measured)
    if curve_points:
        fastest = max(curve_points, key=lambda c: (c.bus_bytes / c.seconds, c.bytes))
        for c in curve_points:
            r = c.bus_bytes / fastest.bus_bytes
            slope = c.steps - r * fastest.steps
            if c is not fastest and slope > 0.0:
                bound = min(bound, max(c.seconds - r * fastest.seconds, 0.0) / slope)
    return bound


def _choose_knots(sizes: list[float], fractions: list[float], must: set[int],
                  error_of: Callable[[tuple[tuple[float, float], ...]], np.ndarray]) -> list[int]:
    """Indices of at most MAX_CURVE_POINTS sizes: ``must`` first, then greedily the worst-predicted."""
    if len(sizes) <= params.MAX_CURVE_POINTS:
        return list(range(len(sizes)))
    knots = sorted(must)
    while len(knots) < params.MAX_CURVE_POINTS:
        curve = tuple((sizes[i], fractions[i]) for i in knots)
        errors = error_of(curve)
        errors[knots] = -1.0
        knots = sorted({*knots, int(np.argmax(errors))})
    return knots


def _minimax_bandwidth(points: list[CommMeasurement], alpha: float, tier: np.ndarray) -> float:
    """The bandwidth minimising the largest relative time error of ``points``
    (bisection on 1/bandwidth: every error grows with it)."""
    fixed = np.array([c.steps * alpha / c.seconds for c in points])
    slope = np.array([c.bus_bytes / (size_fraction(tier[0], c.bytes) * c.seconds) for c in points])

    def gap(u: float) -> float:
        err = fixed + slope * u - 1.0
        return float(err.max() + err.min())

    lo, hi = 0.0, float(np.max(2.0 / slope))
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0.0 else (lo, mid)
    return 1.0 / (0.5 * (lo + hi))


def fit_comm(measured: list[CommMeasurement], hw: Hardware, index: int) -> CommFit:
    """Alpha, per-op bandwidths and the tier's size curve (see the module docstring)."""
    tier = hw.links[index]
    ops = [label for label in labels(Collective) if any(c.op == label for c in measured)]
    by_op = {op: [c for c in measured if c.op == op] for op in ops}
    curve_op = max(ops, key=lambda op: (len({c.bytes for c in by_op[op]}), len(by_op[op]), -ops.index(op)))
    curve_points = by_op[curve_op] if len({c.bytes for c in by_op[curve_op]}) > 1 else []

    alpha, note = _fit_latency(measured, tier.latency_s)
    bound = _latency_bound(measured, curve_points)
    if alpha > bound:
        note += f"; {alpha * 1e6:.4g} us clamped to {bound * 1e6:.4g} us, the most every measured point allows"
        alpha = bound

    # the curve's op: latency-free bus bandwidth per size, over its maximum
    sizes = sorted({c.bytes for c in by_op[curve_op]})
    per_size = [float(np.exp(np.mean([np.log(c.bus_bytes / (c.seconds - c.steps * alpha))
                                      for c in by_op[curve_op] if c.bytes == s]))) for s in sizes]
    peak = max(per_size)
    fractions = [min(bw / peak, 1.0) for bw in per_size]
    curve: tuple[tuple[float, float], ...] = ()
    if curve_points:
        def errors(candidate: tuple[tuple[float, float], ...]) -> np.ndarray:
            rec = _curve_record(candidate)
            worst = np.zeros(len(sizes))
            for c in by_op[curve_op]:
                i = sizes.index(c.bytes)
                worst[i] = max(worst[i], abs(_model_s(c, alpha, peak, rec) / c.seconds - 1.0))
            return worst

        must = {0, len(sizes) - 1, int(np.argmax(per_size))}
        knots = _choose_knots(sizes, fractions, must, errors)
        curve = tuple((sizes[i], fractions[i]) for i in knots)

    rec = _curve_record(curve)
    bandwidths = {op: (peak if op == curve_op else _minimax_bandwidth(by_op[op], alpha, rec)) for op in ops}
    return CommFit(hw, index, tuple(measured), alpha, note, bandwidths, curve_op if curve else "", curve)


#: a fitted op bandwidth this many times the best bus bandwidth measured for the op is refused:
#: the latency took (nearly) all of every point's time, so the bytes term, and with it the
#: bandwidth, is whatever little is left (a 6 us tier over 30 ring steps against a 49 us
#: all-reduce: 0.1% left, 1000x the measured 40 GB/s)
MAX_BANDWIDTH_OVER_MEASURED = 4.0


def _check_bandwidths(fit: CommFit, measurements: Path) -> None:
    """Refuse a fit whose op bandwidth the measurements do not determine (``MAX_BANDWIDTH_OVER_MEASURED``)."""
    for op, bandwidth in fit.op_bytes_per_s.items():
        points = [c for c in fit.measured if c.op == op]
        best = max(points, key=lambda c: c.bus_bytes / c.seconds)
        busbw = best.bus_bytes / best.seconds
        if bandwidth > MAX_BANDWIDTH_OVER_MEASURED * busbw:
            raise CatalogError(measurements, f"{_lines_text([line for c in points for line in c.lines])} ({op})",
                               f"busbw at most {busbw / GB:.4g} GB/s",
                               f"measurements whose bytes term the latency leaves room for: the fitted latency "
                               f"{fit.latency_s * 1e6:.4g} us ({fit.latency_note}) takes all but "
                               f"{100 * busbw / bandwidth:.2g}% of their time, which would make the {op} bandwidth "
                               f"{bandwidth / GB:.4g} GB/s; add larger messages (a bandwidth-bound point) or small "
                               "ones (to fit the latency on)")


def predict_comm(hw: Hardware, index: int, points: list[tuple[str, float, float]]) -> list[float]:
    """``kernels.collectives.flat_time_s`` of each (op, ranks, bytes) on tier ``index``
    of ``hw`` packed as the explorer packs it (the whole group on that tier)."""
    _, tiers, _ = pack_hardware(hw, next(iter(hw.device.peak_TFLOP_per_s)))
    tier = tiers[index]
    out = []
    for op, ranks, size in points:
        code = int(parse(Collective, op))
        out.append(float(flat_time_s(code, float(ranks), float(size), link_bytes_per_s(tier, code, float(size)),
                                     tier.latency_s)))
    return out


# --------------------------------------------------------------------------- TOML


def _toml(data: dict[str, Any]) -> str:
    """``data`` as TOML (tomli-w); a non-finite number, which TOML can write but a
    profile cannot hold, is refused."""

    def check(value: Any) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} to a profile")
        if isinstance(value, dict):
            for v in value.values():
                check(v)
        elif isinstance(value, list | tuple):
            for v in value:
                check(v)

    check(data)
    return tomli_w.dumps(data)


#: how every profile ``calibrate`` writes begins (``gemm_toml``, ``comm_toml``)
PROFILE_START = "# Fitted by `paraspace calibrate "


def _comment(text: str) -> str:
    """A comment line (no line breaks inside)."""
    return "# " + " ".join(text.split()) if text.strip() else "#"


def extends_ref(hardware_ref: str, out: Path) -> str:
    """How the written file names its base: the catalog name, or the base file's
    path relative to the written file's folder (absolute where none exists)."""
    base_path = catalog.resolve("hardware", hardware_ref)
    if base_path.resolve() == Path(out).resolve():
        raise CatalogError("command line", "--out", str(out), f"a file other than the base profile {base_path}")
    if not hardware_ref.endswith(".toml") and "/" not in hardware_ref and not Path(hardware_ref).exists():
        return hardware_ref
    try:
        rel = os.path.relpath(base_path.resolve(), Path(out).resolve().parent)
    except ValueError:  # another drive
        return str(base_path.resolve())
    rel = Path(rel).as_posix()
    return rel if "/" in rel else f"./{rel}"


def _header(base_ref: str, name: str, description: str) -> dict[str, Any]:
    return {"extends": base_ref, "name": name, "description": description}


def gemm_toml(fit: GemmFit, base_ref: str, name: str, description: str, source: Path,
              predicted: list[float]) -> str:
    dev = fit.base.device
    lines = [
        _comment(f"{PROFILE_START[2:]}gemm` from {Path(source).name} (sha256 {file_digest(source)}): "
                 f"{len(fit.points)} {fit.dtype} GEMM shapes on {fit.base.name}."),
        _comment(f"efficiency = 2mnk / ((seconds - launch {dev.launch_overhead_us:g} us) x {fit.dtype} peak "
                 f"{dev.peak_TFLOP_per_s[fit.dtype]:g} TFLOP/s), clamped to (0, 1]; duplicate shapes averaged."),
        _comment("The table replaces the base's gemm_efficiency (and its tile model) for every GEMM: kernels.ops "
                 "interpolates in log m among the points of the nearest (n, k), flat beyond them; runs in another "
                 "precision read the same fractions of that precision's peak."),
        "#",
        "#      m       n       k  rows   measured_s  TFLOP/s  efficiency  predicted_s   error  note",
    ]
    for p, pred in zip(fit.points, predicted):
        g = p.measured
        note = "memory-bound" if p.memory_bound else ""
        if p.raw_efficiency > 1.0:
            note = (note + ", " if note else "") + f"clamped from {p.raw_efficiency:.4f}"
        lines.append(f"# {g.m:>6} {g.n:>7} {g.k:>7} {len(g.lines):>5}  {g.seconds:11.5e} "
                     f"{2.0 * g.m * g.n * g.k / g.seconds / TFLOP:8.2f}  {p.efficiency:10.6f}  {pred:11.5e} "
                     f"{100.0 * (pred / g.seconds - 1.0):+6.2f}%  {note}".rstrip())
    data = _header(base_ref, name, description)
    data["device"] = {"gemm_efficiency": [[m, n, k, eff] for m, n, k, eff in fit.table]}
    return "\n".join(lines) + "\n\n" + _toml(data)


def _link_table(link: LinkTier) -> dict[str, Any]:
    data = link.model_dump(exclude_defaults=True)
    data.setdefault("name", link.name)
    return {key: data[key] for key in LinkTier.model_fields if key in data}


def comm_toml(fit: CommFit, base_ref: str, name: str, description: str, source: Path,
              predicted: list[float]) -> str:
    tier = fit.tier
    ops = ", ".join(f"{op} {bw / GB:.4g} GB/s" for op, bw in fit.op_bytes_per_s.items())
    lines = [
        _comment(f"{PROFILE_START[2:]}comm` from {Path(source).name} (sha256 {file_digest(source)}): "
                 f"{len(fit.measured)} measurements on tier {tier.name!r} of {fit.base.name}."),
        _comment(f"latency_us = {fit.latency_s * 1e6:.6g} ({fit.latency_note})."),
        _comment(f"op_bandwidth_GB_per_s (large-message bus bandwidth): {ops}."),
        _comment(f"size_curve from {fit.curve_op} ({len(fit.curve)} sizes), fraction of its bandwidth by message size"
                 if fit.curve else "no size_curve: the file has no op measured at two message sizes"),
        _comment("Model per point: steps x alpha + bytes x busfactor / (op bandwidth x curve(bytes)) "
                 "(kernels.collectives.flat_time_s); the links below restate every tier of the base, "
                 "since arrays of tables replace the base's whole."),
        "#",
        "#  op              ranks           bytes  rows   measured_s  predicted_s   error  busbw_GB/s",
    ]
    for c, pred in zip(fit.measured, predicted):
        lines.append(f"#  {c.op:<15} {c.ranks:>5} {c.bytes:>15.0f} {len(c.lines):>5}  {c.seconds:11.5e}  {pred:11.5e} "
                     f"{100.0 * (pred / c.seconds - 1.0):+6.2f}%  {c.bus_bytes / c.seconds / GB:10.4g}")
    data = _header(base_ref, name, description)
    data["links"] = [_link_table(tier if i == fit.tier_index else link) for i, link in enumerate(fit.base.links)]
    return "\n".join(lines) + "\n\n" + _toml(data)


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Calibration:
    """What a ``paraspace calibrate`` command wrote, re-loaded and checked."""

    path: Path
    hardware: Hardware
    #: one dict per measured point: what was measured, what the written profile predicts
    points: tuple[dict[str, Any], ...]
    worst_error: float
    summary: str


def _lines_text(lines: list[int]) -> str:
    shown = ", ".join(map(str, lines[:6])) + (f" and {len(lines) - 6} more" if len(lines) > 6 else "")
    return f"line {shown}" if len(lines) == 1 else f"lines {shown}"


def _written(out: Path, text: str, measurements: Path, lines_of: Callable[[str], list[int]]) -> Hardware:
    """Check the profile, then write it: ``text`` is loaded from a file beside ``out`` (so a relative
    ``extends`` resolves as it will) and renamed onto ``out`` only when it loads. A profile that
    does not load is never written, and the error names the CSV lines whose fit broke it
    (``lines_of`` maps the profile field to them), not the file that was never written."""
    out = Path(out)
    # only an earlier profile of ours is replaced: never the measurements, notes or a result
    check_replaceable(out, starts_with=PROFILE_START.encode(), kind="profile written by paraspace calibrate")
    staged = out.with_name(f"{out.stem}.partial{out.suffix or '.toml'}")
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            staged.write_text(text, encoding="utf-8")
        except OSError as err:
            raise _unwritable(out, err) from None
        try:
            loaded = catalog.load_hardware(str(staged.resolve()))
        except CatalogError as err:
            kept = f"{out} left as it was" if out.exists() else f"{out} not written"
            raise CatalogError(measurements, f"{_lines_text(lines_of(err.field))} (fitted {err.field})", err.value,
                               f"{err.expected}; these measurements give no valid profile ({kept})") from None
        try:
            publish(staged, out)
        except OSError as err:  # the rename refused (a folder, or an immutable file, at --out)
            raise _unwritable(out, err) from None
    finally:  # gone once renamed; else (an error, Ctrl-C or SIGTERM at any point) removed, never a folder there
        if staged.is_file():
            staged.unlink(missing_ok=True)
    return loaded


def _unwritable(out: Path, err: OSError) -> CatalogError:
    return CatalogError("command line", "--out", str(out), f"a file that can be written ({err.strerror or err})")


def _rel_errors(predicted: list[float], measured: list[float]) -> list[float]:
    return [p / m - 1.0 for p, m in zip(predicted, measured)]


def calibrate_gemm(measurements: Path, hardware_ref: str, out: Path, name: str | None = None) -> Calibration:
    """Fit ``device.gemm_efficiency`` of ``hardware_ref`` to a GEMM CSV and write ``out``."""
    base = catalog.load_hardware(hardware_ref)
    base_ref = extends_ref(hardware_ref, out)
    dtype, measured = read_gemm_csv(measurements, base)
    fit = fit_gemm(measured, base, dtype, measurements)
    name = name or f"{base.name}-calibrated"
    description = (f"{base.name} with device.gemm_efficiency fitted to {len(measured)} {dtype} GEMM shapes "
                   f"measured in {Path(measurements).name}")
    shapes = [(p.measured.m, p.measured.n, p.measured.k) for p in fit.points]
    in_memory = predict_gemm(fit.hardware(), dtype, shapes)
    loaded = _written(out, gemm_toml(fit, base_ref, name, description, measurements, in_memory), measurements,
                      fit.lines_of)
    predicted = predict_gemm(loaded, dtype, shapes)
    errors = _rel_errors(predicted, [p.measured.seconds for p in fit.points])
    points = tuple({"m": p.measured.m, "n": p.measured.n, "k": p.measured.k, "rows": len(p.measured.lines),
                    "measured_s": p.measured.seconds, "predicted_s": pred, "error": err,
                    "efficiency": p.efficiency, "memory_bound": p.memory_bound, "clamped": p.raw_efficiency > 1.0}
                   for p, pred, err in zip(fit.points, predicted, errors))
    lines = [(f"wrote {out}: {name} (extends {base_ref}), device.gemm_efficiency from {len(points)} {dtype} "
              f"shapes in {measurements}"),
             (f"{'m':>7} {'n':>7} {'k':>7} {'rows':>5} {'measured_s':>12} {'predicted_s':>12} {'error':>8} "
              f"{'efficiency':>11}")]
    for p in points:
        lines.append(f"{p['m']:>7} {p['n']:>7} {p['k']:>7} {p['rows']:>5} {p['measured_s']:12.5e} "
                     f"{p['predicted_s']:12.5e} {100 * p['error']:+7.2f}% {p['efficiency']:11.4f}")
    worst = max(abs(e) for e in errors)
    lines.append(f"worst round-trip error {100 * worst:.2f}%")
    for p in points:
        if p["memory_bound"]:
            lines.append(f"note: ({p['m']}, {p['n']}, {p['k']}) is below the memory roofline of {base.name}: the "
                         "kernel predicts its HBM traffic time, not the measured time")
        if p["clamped"]:
            lines.append(f"note: ({p['m']}, {p['n']}, {p['k']}) measured faster than the {dtype} peak: efficiency "
                         "clamped to 1")
    return Calibration(Path(out), loaded, points, worst, "\n".join(lines))


def calibrate_comm(measurements: Path, hardware_ref: str, tier: str, out: Path,
                   name: str | None = None) -> Calibration:
    """Fit link tier ``tier`` of ``hardware_ref`` to a collective CSV and write ``out``."""
    base = catalog.load_hardware(hardware_ref)
    index = tier_index(base, tier)
    base_ref = extends_ref(hardware_ref, out)
    measured = read_comm_csv(measurements)
    fit = fit_comm(measured, base, index)
    _check_bandwidths(fit, measurements)
    name = name or f"{base.name}-calibrated"
    ops = [op for op in fit.op_bytes_per_s]
    description = (f"{base.name} with link tier {tier} (latency, {'/'.join(ops)} bandwidth, size curve) fitted to "
                   f"{len(measured)} collective measurements in {Path(measurements).name}")
    keys = [(c.op, c.ranks, c.bytes) for c in measured]
    in_memory = predict_comm(fit.hardware(), index, keys)
    loaded = _written(out, comm_toml(fit, base_ref, name, description, measurements, in_memory), measurements,
                      fit.lines_of)
    predicted = predict_comm(loaded, index, keys)
    errors = _rel_errors(predicted, [c.seconds for c in measured])
    points = tuple({"op": c.op, "ranks": c.ranks, "bytes": c.bytes, "rows": len(c.lines), "measured_s": c.seconds,
                    "predicted_s": pred, "error": err}
                   for c, pred, err in zip(measured, predicted, errors))
    fitted = loaded.links[index]
    lines = [f"wrote {out}: {name} (extends {base_ref}), tier {tier} from {len(points)} measurements in {measurements}",
             f"  latency_us {fitted.latency_us:.6g} ({fit.latency_note})",
             "  op_bandwidth_GB_per_s " + ", ".join(f"{op} {fitted.op_bandwidth_GB_per_s[op]:.6g}" for op in ops),
             f"  size_curve from {fit.curve_op}: " + ", ".join(f"{mib:g} MiB {f:.4f}" for mib, f in fitted.size_curve)
             if fitted.size_curve else "  no size_curve (no op measured at two message sizes)",
             f"{'op':<15} {'ranks':>5} {'bytes':>14} {'rows':>5} {'measured_s':>12} {'predicted_s':>12} {'error':>8}"]
    for p in points:
        lines.append(f"{p['op']:<15} {p['ranks']:>5} {p['bytes']:>14.0f} {p['rows']:>5} {p['measured_s']:12.5e} "
                     f"{p['predicted_s']:12.5e} {100 * p['error']:+7.2f}%")
    worst = max(abs(e) for e in errors)
    lines.append(f"worst round-trip error {100 * worst:.2f}%")
    beyond = [p for p in points if abs(p["error"]) > TOLERANCE]
    if beyond:
        lines.append(f"warning: {len(beyond)} point(s) beyond {100 * TOLERANCE:.0f}%: the tier has one latency and one "
                     f"size curve (fitted on {fit.curve_op or 'no op'}), so other ops fit only as far as their "
                     "bandwidth-vs-size shape matches")
    return Calibration(Path(out), loaded, points, worst, "\n".join(lines))
