"""``paraspace sweep``: encode -> evaluate in chunks -> stream to Parquet."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from paraspace.explorer.evaluate import DEFAULT_MAX_TASKS, Packed, analytic, evaluate, pack, simulable
from paraspace.explorer.signals import raise_if_terminated
from paraspace.results import schema
from paraspace.results.rank import SHARD_FILE, ResultsError, written_digest, written_for
from paraspace.results.writer import ResultWriter, arrow_schema, to_arrow, writing
from paraspace.spaces.catalog import LoadedSpace, catalog_hash
from paraspace.spaces.encode import DIMENSIONS, Encoded, Encoder
from paraspace.spaces.enums import Feasibility, Reason, labels
from paraspace.spaces.errors import CatalogError

if TYPE_CHECKING:
    from paraspace.spaces.serving import LoadedServing

#: combinations encoded and evaluated per chunk: bounds memory whatever the space size
DEFAULT_CHUNK = 1 << 20
#: the event tier simulates at most this many candidates: the best by the
#: analytic step time when more are feasible (a first, analytic-only pass finds them)
DEFAULT_SIMULATE_TOP = 20_000


def shard_range(n_combinations: int, index: int, count: int) -> tuple[int, int]:
    """Shard ``index`` of ``count``: contiguous, deterministic, covering and disjoint
    ranges of the flat product."""
    return n_combinations * index // count, n_combinations * (index + 1) // count


def check_shard_count(count: int, n_combinations: int, field: str, value: object) -> None:
    """Refuse a shard array with more shards than combinations: a shard with nothing to
    evaluate would write nothing, and the dataset would look incomplete forever."""
    if count > n_combinations:
        raise CatalogError("command line", field, value, f"at most {n_combinations:,} shards (the space has "
                           f"{n_combinations:,} combinations; every shard needs at least one)")


def shard_path(folder: Path, index: int, count: int) -> Path:
    """The file shard ``index`` of ``count`` is written to: ``FOLDER/part-I-of-N.parquet``."""
    return Path(folder) / f"part-{index}-of-{count}.parquet"


def other_shard_parts(folder: Path, count: int, space_name: str) -> list[Path]:
    """The parts of another shard count in ``folder`` that a run of ``count`` shards replaces.

    A sharded sweep (``--shard I/N``, ``--dask``) replaces the dataset in its folder: its own
    parts are overwritten one by one, as any earlier result is, and the parts of another shard
    count (``part-I-of-M.parquet``, which ``top`` would read as a second shard array) are
    removed once every part of this run is written (``shard_definitions``, then
    ``remove_shard_parts``): a run that fails part-way leaves the earlier dataset whole. Only a paraspace
    result of the same space is ever removed: any other file named as such a part (another
    space's, or not a paraspace result) is a ``ResultsError`` here, called before the run's
    work, and nothing is written or removed."""
    folder = Path(folder)
    with writing(folder, what="a folder"):
        files = sorted(folder.iterdir()) if folder.is_dir() else []
    why = (f"; a part of another shard count, which a sweep of {count} shards into {folder} removes only where it "
           f"is a paraspace result of its own space ({space_name}): refusing to, nothing written (give another --out "
           "or move the file)")
    others = []
    for file in files:
        match = SHARD_FILE.fullmatch(file.name)
        if match is None or int(match[2]) == count:
            continue
        try:
            name = written_for(file)
        except ResultsError as err:
            raise ResultsError(f"{err}{why}") from None
        if name != space_name:
            raise ResultsError(f"{file}: space = {name!r}: expected {space_name!r}{why}")
        others.append(file)
    return others


def shard_definitions(folder: Path, count: int) -> dict[Path, str | None]:
    """The parts of a run of ``count`` shards in ``folder`` that are paraspace results, each with
    the space definition it records (``results.rank.written_digest``; None: written before
    paraspace recorded one); parts not there (yet), or not results, are left out. A run's
    parts are complete where all ``count`` record its ``space_digest``; a part of another
    definition (the space's TOML changed since it was written) keeps ``top`` from reading the
    folder until this run writes it again."""
    found = {}
    for index in range(count):
        part = shard_path(folder, index, count)
        try:
            found[part] = written_digest(part)
        except ResultsError:
            continue
    return found


def remove_shard_parts(parts: list[Path], space_name: str) -> list[Path]:
    """Remove the ``parts`` of ``other_shard_parts`` that are still there and still results of
    ``space_name`` (another task of a shard array may have removed them first); the ones removed."""
    removed = []
    for part in parts:
        try:
            if written_for(part) != space_name:
                continue
        except ResultsError:  # gone, or replaced meanwhile by something else: left as it is
            continue
        with writing(part):
            part.unlink(missing_ok=True)
        removed.append(part)
    return removed


#: the longest output name: leaves room for ".parquet.partial" within a file system's 255 bytes
MAX_NAME_BYTES = 200


def confined_name(name: str, source: str, field: str) -> str:
    """``name`` if it is one file name that stays inside the output folder; a ``CatalogError`` otherwise."""
    bad = (not name or name.startswith(".") or any(c in name for c in "/\\\0:")
           or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES)
    if bad:
        raise CatalogError(source, field, name, "a file name inside the output folder: no '/', '\\', ':' or NUL, "
                           f"not starting with '.', at most {MAX_NAME_BYTES} bytes")
    return name


def _ref_stem(ref: str) -> str:
    """A model or hardware reference as it reads in a file name: the catalog name, or the TOML file's stem."""
    return Path(ref).stem if ref.endswith(".toml") or "/" in ref or "\\" in ref else ref


def named_for_output(space: LoadedSpace, overridden: bool) -> LoadedSpace:
    """The space named after the problem it runs, checked to stay inside the output folder.

    Without command-line overrides that is the space's own name. With --model,
    --hardware or --devices it is MODEL-HARDWARE-DEVICES of what actually runs
    (``my-model-h200-sxm-141gb-2048``), so a run never takes another space's file."""
    if not overridden:
        confined_name(space.spec.name, space.source, "name")
        return space
    spec = space.spec
    name = "-".join([_ref_stem(spec.model), _ref_stem(spec.hardware), *map(str, spec.device_counts)])
    confined_name(name, space.source, "name (from --model, --hardware, --devices)")
    return dataclasses.replace(space, spec=spec.model_copy(update={"name": name}), raw={**space.raw, "name": name})


def space_digest(space: LoadedSpace | LoadedServing) -> str:
    """SHA-256 of what defines a space's results (training or serving): its TOML (overrides applied),
    model and hardware, and a serving space's empirical request lengths (the CSV's numbers, not its
    path: an edited file is another workload under the same TOML)."""
    definition = {"space": space.raw, "model": space.model.model_dump(mode="json"),
                  "hardware": space.hardware.model_dump(mode="json")}
    for key, lengths in sorted(getattr(space, "empirical", {}).items()):
        definition[f"empirical.{key}"] = hashlib.sha256(np.ascontiguousarray(lengths, dtype=np.float64)).hexdigest()
    return hashlib.sha256(json.dumps(definition, sort_keys=True, default=str).encode()).hexdigest()


def paraspace_version() -> str:
    try:
        return version("paraspace")
    except PackageNotFoundError:  # running from a source tree without installation
        return "0+unknown"


def strategy_columns() -> list[tuple[str, pa.DataType, str]]:
    """(name, Arrow type, doc) of each strategy column, from the dimension table."""
    out = []
    for dim in DIMENSIONS:
        if dim.enum is not None:
            typ = pa.dictionary(pa.int8(), pa.string())
        elif dim.boolean:
            typ = pa.bool_()
        else:
            typ = pa.from_numpy_dtype(dim.dtype)
        out.append((dim.name, typ, dim.doc))
    return out


def enum_labels() -> dict[str, list[str]]:
    """Dictionary values of every enum column, indexed by code."""
    out = {d.name: labels(d.enum) for d in DIMENSIONS if d.enum is not None}
    out["infeasible_reason"] = labels(Feasibility)
    return out


def result_schema() -> pa.Schema:
    return arrow_schema(strategy_columns(), schema.METRICS)


def column_docs() -> dict[str, dict[str, str]]:
    docs = {name: {"unit": "enum" if pa.types.is_dictionary(t) else "value", "doc": doc}
            for name, t, doc in strategy_columns()}
    for col in (schema.ROW_ID, schema.N_MICROBATCHES, *schema.METRICS):
        docs[col.name] = {"unit": col.unit, "doc": col.doc, **({"kernel": col.kernel} if col.kernel else {})}
    return docs


def evaluate_encoded(packed: Packed, enc: Encoded, *, simulate: bool = True, max_tasks: int = DEFAULT_MAX_TASKS,
                     only: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Strategy and metric columns of one encoded chunk."""
    return {**enc.columns, **evaluate(packed, enc.columns, simulate=simulate, max_tasks=max_tasks, only=only)}


def best_analytic(encoder: Encoder, packed: Packed, n: int, *, chunk_rows: int, start: int, stop: int,
                  max_tasks: int, bar: tqdm | None = None) -> np.ndarray | None:
    """Sorted row ids of the ``n`` simulable candidates with the shortest analytic
    step (ties by row id), or None when there are no more than ``n`` of them.
    ``bar`` counts the combinations as they are ranked."""
    best_t = np.empty(0)
    best_id = np.empty(0, dtype=np.int64)
    total = 0
    for enc in encoder.chunks(chunk_rows, start, stop):
        raise_if_terminated()
        if bar is not None:
            bar.update(enc.n_combinations)
        metrics = analytic(packed, enc.columns)
        keep = simulable(enc.columns, metrics, max_tasks=max_tasks)
        total += int(keep.sum())
        best_t = np.concatenate([best_t, metrics["step_time_analytic_s"][keep]])
        best_id = np.concatenate([best_id, enc.columns["row_id"][keep]])
        if best_t.size > n:
            order = np.lexsort((best_id, best_t))[:n]
            best_t, best_id = best_t[order], best_id[order]
    return None if total <= n else np.sort(best_id)


#: rates behind ``expected_seconds``, measured on 2 cores (bench/bench_sweep.py, bench/bench_engine.py):
#: combinations per second in each of the two passes, and rows the event tier simulates
#: per second on the deep pipelines the best rows often are.
#: ENCODE_PER_S: ``best_analytic`` (encode, analytic tier, rank) and ``run_sweep(simulate=False)``
#: (encode, analytic tier, Parquet) timed over the Calculon and wide bench spaces and
#: llama3-70b-h100-1024 with 1M-combination chunks, 2 shared cores: 2.7-4.1M and 1.3-1.6M
#: combinations/s, about 2M/s a pass on average. The encoder itself (tens of millions of
#: combinations/s) no longer bounds a pass; it did (1M/s) when it filtered the whole product.
ENCODE_PER_S = 2.0e6
SIMULATE_PER_S = 1000.0
#: a sweep expected to take longer than this says so before it starts
WARN_AFTER_S = 60.0


def expected_simulations(n_combinations: int, simulate_top: int, simulate: bool) -> int:
    """The most rows a sweep's event tier can simulate: ``simulate_top``, never more than the
    combinations (0 without the simulation)."""
    return min(simulate_top, n_combinations) if simulate else 0


def expected_seconds(n_combinations: int, simulate_top: int, simulate: bool) -> float:
    """A rough time for a sweep: two passes over the combinations and the simulations
    (``expected_simulations``)."""
    passes = 2 if simulate else 1
    return passes * n_combinations / ENCODE_PER_S + expected_simulations(n_combinations, simulate_top,
                                                                          simulate) / SIMULATE_PER_S


@dataclass
class SweepSummary:
    path: Path
    n_combinations: int = 0
    n_rows: int = 0
    n_feasible: int = 0
    n_simulated: int = 0
    first_reason: np.ndarray = field(default_factory=lambda: np.zeros(len(Reason), np.int64))
    breaks: np.ndarray = field(default_factory=lambda: np.zeros(len(Reason), np.int64))
    seconds: float = 0.0
    #: the file at ``path`` was (re)written; False when the result was empty and discarded
    written: bool = False

    def encoding(self) -> dict[str, object]:
        return {
            "n_combinations": self.n_combinations,
            "n_rows": self.n_rows,
            "n_feasible": self.n_feasible,
            "n_simulated": self.n_simulated,
            "dropped_first": {r.name.lower(): int(self.first_reason[r]) for r in Reason if r != Reason.VALID},
            "breaks": {r.name.lower(): int(self.breaks[r]) for r in Reason if r != Reason.VALID},
        }


def provenance(space: LoadedSpace | LoadedServing) -> dict[str, object]:
    """The footer keys that say where a result file came from, training or serving alike: the
    version, the space (its TOML as ``{"toml": ...}``, model, hardware), the catalog and the
    space's digest, by which ``results.rank`` refuses to rank two spaces' files together."""
    return {
        schema.META_VERSION: paraspace_version(),
        schema.META_SPACE: {
            "source": space.source,
            "toml": space.raw,
            "model": space.model.model_dump(),
            "hardware": space.hardware.model_dump(),
        },
        schema.META_CATALOG: catalog_hash(),
        schema.META_DIGEST: space_digest(space),
    }


def run_sweep(space: LoadedSpace, out: Path, *, chunk_rows: int = DEFAULT_CHUNK, progress: bool = True,
              start: int = 0, stop: int | None = None, simulate: bool = True,
              max_tasks: int = DEFAULT_MAX_TASKS, simulate_top: int = DEFAULT_SIMULATE_TOP,
              keep_empty: bool = False) -> SweepSummary:
    """Evaluate combinations ``start:stop`` of ``space`` and write them to ``out``.

    The event tier simulates every feasible candidate (within ``max_tasks``), or
    the ``simulate_top`` best by analytic step time when there are more. With no
    valid candidate nothing is written (``summary.written`` is False, and a file
    already at ``out`` stays as it was) unless ``keep_empty`` (a shard of a
    dataset, whose empty part is a complete answer)."""
    encoder = Encoder(space)
    packed = pack(space)
    stop = encoder.n_combinations if stop is None else min(stop, encoder.n_combinations)
    began = time.perf_counter()
    quiet = None if progress else True
    only = None
    if simulate:
        with tqdm(total=stop - start, unit="comb", unit_scale=True, disable=quiet, leave=False,
                  desc=f"{space.spec.name}: ranking analytically", mininterval=0.5) as first:
            only = best_analytic(encoder, packed, simulate_top, chunk_rows=chunk_rows, start=start, stop=stop,
                                 max_tasks=max_tasks, bar=first)
    summary = SweepSummary(path=out)
    labels_ = enum_labels()
    table_schema = result_schema()
    # the second pass's cost is its simulations: with a top-K to simulate the bar counts
    # them (an honest rate and ETA), otherwise the combinations
    sims = None if only is None else len(only)
    with ResultWriter(out, table_schema, provenance(space), column_docs()) as writer, tqdm(
        total=sims if sims is not None else stop - start, unit="sim" if sims is not None else "comb",
        unit_scale=True, disable=quiet, desc=f"{space.spec.name}: " + ("simulating the best" if sims is not None
                                                                       else "evaluating"),
        leave=False, mininterval=0.5,
    ) as bar:
        for enc in encoder.chunks(chunk_rows, start, stop):
            raise_if_terminated()
            cols = evaluate_encoded(packed, enc, simulate=simulate, max_tasks=max_tasks, only=only)
            writer.write(to_arrow(cols, table_schema, labels_))
            summary.n_combinations += enc.n_combinations
            summary.n_rows += enc.n_rows
            summary.n_feasible += int(np.count_nonzero(cols["feasible"]))
            summary.n_simulated += int(np.count_nonzero(cols["simulated"]))
            summary.first_reason += enc.first_reason
            summary.breaks += enc.breaks
            bar.update(int(np.count_nonzero(cols["simulated"])) if sims is not None else enc.n_combinations)
            bar.set_postfix(rows=summary.n_rows, feasible=summary.n_feasible, refresh=False)
        summary.seconds = time.perf_counter() - began
        raise_if_terminated()  # a SIGTERM whose exception was lost: never publish after it (explorer.signals)
        if summary.n_rows or keep_empty:
            writer.close({schema.META_ENCODING: summary.encoding()})
            summary.written = True
        else:
            writer.discard()
    return summary
