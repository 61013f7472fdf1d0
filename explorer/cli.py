"""The ``paraspace`` command line."""

from __future__ import annotations

import difflib
import functools
import json
import math
import signal
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np
import polars as pl

from paraspace.explorer import display
from paraspace.explorer.evaluate import DEFAULT_MAX_TASKS, analytic, pack, pin, row_id_in
from paraspace.explorer.precompile import GROUPS, precompile
from paraspace.explorer.signals import Terminated, sigterm_interrupts
from paraspace.explorer.sweep import (
    DEFAULT_CHUNK,
    DEFAULT_SIMULATE_TOP,
    WARN_AFTER_S,
    check_shard_count,
    confined_name,
    enum_labels,
    evaluate_encoded,
    expected_seconds,
    expected_simulations,
    named_for_output,
    other_shard_parts,
    remove_shard_parts,
    result_schema,
    run_sweep,
    shard_path,
    shard_range,
    shard_definitions,
    space_digest,
)
from paraspace.results.rank import SHARD_FILE, Results, ResultsError, compare, front_axes, open_results, pareto, top
from paraspace.results.schema import STEP_PARTS
from paraspace.results.writer import check_writable, to_arrow
from paraspace.spaces import catalog
from paraspace.spaces.catalog import LoadedSpace
from paraspace.spaces.encode import DIMENSION_NAMES, MAX_COMBINATIONS, REASON_TEXT, Encoder
from paraspace.spaces.enums import Feasibility, Reason
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.schema import MAX_COUNT, MAX_GIB, Dimensions

DEFAULT_SPACE = "llama3-70b-h100-1024"
GIB = 1024**3
#: a sampler's seed seeds numpy's generator (optuna.samplers), which takes 0 .. 2**32 - 1
MAX_SEED = 2**32 - 1


class InputError(click.ClickException):
    """Bad user input: printed as 'Error: ...', exit status 2."""

    exit_code = 2

    def format_message(self) -> str:
        return self.message


class FiniteFloatRange(click.FloatRange):
    """A ``click.FloatRange`` that also refuses nan, which every comparison lets through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{number} is not in the range {self._describe_range()}.", param, ctx)
        return number


class OutputPath(click.Path):
    """The ``click.Path`` of every ``--out``: refuses an empty value, which pathlib reads as '.'
    (the current folder, with no name to write or to add a suffix to)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str | bytes) and not value:
            self.fail("'': expected a path to write (an empty one names no file)", param, ctx)
        return super().convert(value, param, ctx)


#: numbers on the command line take the schema's bounds (spaces.schema): counts of
#: devices, tokens and sequences at most MAX_COUNT, rows and row ids at most
#: MAX_COMBINATIONS (int64), memory at most MAX_GIB
COUNT = click.IntRange(1, MAX_COUNT)
ROWS = click.IntRange(1, MAX_COMBINATIONS)
#: rows a table prints: polars indexes rows with u32 (head(2**32) overflows)
MAX_SHOWN_ROWS = 2**32 - 1
#: seconds a study may run: up to a year
MAX_TIMEOUT_S = 365 * 24 * 3600.0


def _guard(fn):  # noqa: ANN001, ANN202 - decorator
    """Turn bad-input errors into 'Error: ...' with exit status 2."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CatalogError, ResultsError) as err:
            raise InputError(str(err)) from None

    return wrapper


class _Commands(click.Group):
    """The command group; a command stopped by SIGTERM or Ctrl-C (after its cleanup:
    ``explorer.signals``) prints one line and exits 128 + the signal's number, as a shell reports a
    process the signal ended: 143 for SIGTERM, 130 for Ctrl-C."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with sigterm_interrupts():
                return super().invoke(ctx)
        except KeyboardInterrupt as err:
            number = signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT
            what = "SIGTERM" if number == signal.SIGTERM else "\nCtrl-C"  # a new line after the terminal's ^C
            click.echo(f"{what}: stopped (exit status {128 + number}); its staged output removed, earlier results "
                       "left as they were", err=True)
            raise click.exceptions.Exit(128 + number) from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="paraspace")
def main() -> None:
    """Evaluate parallel strategies for LLM training (step time and memory per device)
    and serving deployments (TTFT, TPOT and throughput), ranked."""


@main.command("catalog")
def catalog_cmd() -> None:
    """List the shipped hardware profiles, models, training and serving spaces and die topologies."""
    from paraspace.spaces import serving
    from paraspace.spaces.topology import load_topology, topology_names

    entries_by_kind = catalog.describe()
    entries_by_kind["serving"] = [(n, serving.load_serving(n).spec.description) for n in serving.names()]
    entries_by_kind["topology"] = [(n, load_topology(n).spec.description) for n in topology_names()]
    for kind, entries in entries_by_kind.items():
        click.echo(f"{kind}:")
        width = max(len(n) for n, _ in entries)
        for name, desc in entries:
            click.echo(f"  {name:<{width}}  {desc}")


@main.command("precompile")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Processes compiling at once (one group each).")
@click.option("--group", "groups", multiple=True, type=click.Choice(list(GROUPS)),
              help="A group of kernels to compile (repeatable); every group when omitted.")
def precompile_cmd(jobs: int, groups: tuple[str, ...]) -> None:
    """Compile the kernels into numba's cache ahead of a run, each group once and the groups in
    parallel: minutes on a fresh machine or after an upgrade, seconds once cached. Run it before
    starting several sweep shards or study workers on one node, which would each compile them."""
    chosen = groups or tuple(GROUPS)
    click.echo(f"compiling {', '.join(chosen)} in {min(jobs, len(chosen))} processes ...")
    for name, seconds in precompile(jobs, chosen).items():
        click.echo(f"  {name:<9} {seconds:6.1f} s")


@main.command("topology")
@click.argument("name")
@click.option("--src", type=click.IntRange(0, MAX_COUNT - 1), default=0, show_default=True, help="Rank whose routes are listed.")
@click.option("--mib", type=FiniteFloatRange(0, MAX_GIB * 1024), default=7.0, show_default=True,
              help="MiB every die sends every other die in the all-to-all bound.")
@_guard
def topology_cmd(name: str, src: int, mib: float) -> None:
    """Routes of a die-level topology (peers, mates, strangers via mates) and the
    time bound of a uniform all-to-all over it."""
    from paraspace.spaces.topology import hop_counts, load_topology, route, uniform_all_to_all

    topo = load_topology(name)
    if src >= topo.n:
        raise InputError(f"command line: --src = {src}: expected a rank in 0..{topo.n - 1} of {topo.name}")
    click.echo(f"{topo.name}: {topo.n} ranks; tiers " + ", ".join(
        f"{t.name} {t.bandwidth_GB_per_s:g} GB/s" for t in topo.tiers))
    for dst in range(topo.n):
        if dst != src:
            hops = route(topo, src, dst)
            click.echo(f"  {src:>2} -> {dst:>2}: " + "  ".join(f"{h.src}->{h.dst} {h.tier}" for h in hops))
    counts = hop_counts(topo)
    off = counts[~np.eye(topo.n, dtype=bool)]
    click.echo("hops per pair: " + ", ".join(f"{k}: {int((off == k).sum())}" for k in sorted(set(off.tolist()))))
    loads = uniform_all_to_all(topo, mib * 2**20)
    busiest = f" (busiest link {loads.bottleneck[0]}->{loads.bottleneck[1]})" if loads.bottleneck else ""
    click.echo(f"uniform all-to-all, {mib:g} MiB per pair: {1e3 * loads.time_s:.3f} ms{busiest}")


def _overrides(model: str | None, hardware: str | None, devices: int | None) -> dict[str, Any]:
    given = {"model": model, "hardware": hardware, "devices": devices}
    return {k: v for k, v in given.items() if v is not None}


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` with 0 <= I < N."""
    index, slash, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or not (0 <= i < n):
        raise InputError(f"command line: --shard = {text!r}: expected I/N with 0 <= I < N (e.g. 0/4)")
    return i, n


def explain_table(first: Any, breaks: Any, n_combinations: int) -> str:
    lines = [f"{'rule':<26}{'removed':>12}{'breaks':>12}  meaning", "-" * 100]
    for reason in Reason:
        if reason == Reason.VALID:
            continue
        lines.append(f"{reason.name.lower():<26}{int(first[reason]):>12,}{int(breaks[reason]):>12,}  {REASON_TEXT[reason]}")
    lines.append("-" * 100)
    lines.append(f"{'kept':<26}{int(first[Reason.VALID]):>12,}{'':>12}  of {n_combinations:,} combinations")
    lines.append("removed: charged to the first rule a combination breaks; breaks: combinations breaking the rule at all")
    return "\n".join(lines)


#: strategy columns every table shows; the others only where a row leaves their default
ALWAYS_SHOWN = ("tp", "pp", "dp", "micro_batch", "schedule")


def _dimensions_shown(frame: pl.DataFrame) -> list[str]:
    """The strategy columns worth printing: the main sizes always, the cluster size
    where it varies, any other dimension where some row leaves its default (a
    dense model's expert columns, unused offload flags, ... stay out of the way)."""
    defaults = Dimensions().model_dump()
    shown = []
    for name in DIMENSION_NAMES:
        if name in ALWAYS_SHOWN or frame.is_empty():
            shown.append(name)
        elif name == "devices":
            if frame["devices"].n_unique() > 1:
                shown.append(name)
        elif frame[name].n_unique() > 1 or frame[name][0] != defaults[name][0]:
            shown.append(name)
    return shown


def _top_table(frame: pl.DataFrame, columns: str | None = None, wide: bool = False,
               extra: tuple[str, ...] = ()) -> str:
    """Ranked rows as a table that fits the terminal (explorer.display): --columns, --wide, ``extra`` metrics."""
    try:
        return display.table_text(frame, columns=display.parse_columns(columns), wide=wide, extra=extra)
    except display.ColumnError as err:
        raise InputError(str(err)) from None


def _check_columns(columns: str | None) -> None:
    """``--columns`` checked against a sweep's result columns before the sweep runs, so that a
    mistyped name fails at once, with nothing evaluated or written (the table comes after both)."""
    if columns is not None:
        try:
            display.resolve_columns(pl.from_arrow(result_schema().empty_table()), display.parse_columns(columns))
        except display.ColumnError as err:
            raise InputError(str(err)) from None


def table_options(fn):  # noqa: ANN001, ANN201 - decorator
    """--columns and --wide of the commands that print ranked rows."""
    options = [
        click.option("--columns", default=None, metavar="A,B,C",
                     help="Show these columns, e.g. row_id,tp,pp,step_time_s,mem_peak_GiB "
                          "[default: rank, row_id, the dimensions that vary, step time, MFU, memory, fits]."),
        click.option("--wide", is_flag=True, help="Show every column, one line per row (wider than the terminal)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _announce_compile() -> None:
    """On a first run (no compiled kernels cached), say on stderr why the next minute is silent."""
    display.announce_compile(lambda text: click.echo(text, err=True))


@main.command()
@click.argument("space", required=False, default=None)
@click.option("--space", "space_opt", default=None, help="Space name or TOML path (same as the argument).")
@click.option("--model", default=None, help="Replace the space's model (catalog name or TOML path).")
@click.option("--hardware", default=None, help="Replace the space's hardware (catalog name or TOML path).")
@click.option("--devices", type=COUNT, default=None, help="Replace the space's device count.")
@click.option("--out", type=OutputPath(path_type=Path), default=None,
              help="Output Parquet file [default: results/SPACE.parquet]; with --shard or --dask, the folder of the "
                   "parts [default: results/SPACE].")
@click.option("-n", "--top", "n_top", type=click.IntRange(0, MAX_SHOWN_ROWS), default=10, show_default=True,
              help="Rows of the ranking to print.")
@click.option("--chunk-rows", type=COUNT, default=DEFAULT_CHUNK, show_default=True,
              help="Combinations encoded and evaluated per chunk.")
@click.option("--explain", is_flag=True, help="Print how many combinations each validity rule removed.")
@click.option("--dry-run", is_flag=True, help="Encode and explain only; evaluate and write nothing.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on a terminal.")
@click.option("--simulate/--no-simulate", default=True, show_default=True,
              help="Run the event engine on every feasible candidate (ranking uses its step time).")
@click.option("--max-tasks", type=COUNT, default=DEFAULT_MAX_TASKS, show_default=True,
              help="Candidates whose step graph has more tasks keep the analytic step time.")
@click.option("--simulate-top", type=ROWS, default=DEFAULT_SIMULATE_TOP, show_default=True,
              help="With more feasible candidates than this, simulate only this many best by analytic step time.")
@click.option("--shard", default=None, metavar="I/N",
              help="Evaluate only shard I of N (0-based) of the combinations, e.g. for a nightly job array; "
                   "writes part-I-of-N.parquet in the --out folder [default: results/SPACE], then removes the "
                   "space's parts of another N there (with --dask: once every shard is written).")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run the shards on a Dask distributed scheduler (tcp://host:8786, or 'local' for a LocalCluster).")
@click.option("--shards", type=COUNT, default=8, show_default=True, help="Shards to submit with --dask.")
@table_options
@_guard
def sweep(space: str | None, space_opt: str | None, model: str | None, hardware: str | None, devices: int | None,
          out: Path | None, n_top: int, chunk_rows: int, explain: bool, dry_run: bool, progress: bool,
          simulate: bool, max_tasks: int, simulate_top: int, shard: str | None, dask_address: str | None,
          shards: int, columns: str | None, wide: bool) -> None:
    """Evaluate every candidate of a strategy space and write them ranked to Parquet.

    With no arguments, sweeps the shipped default space (Llama 3 70B on 1024 H100)."""
    if space and space_opt and space != space_opt:
        raise InputError(f"command line: space given twice ({space!r} and {space_opt!r}): expected one")
    _check_columns(columns)  # before the sweep writes its file, not after
    overrides = _overrides(model, hardware, devices)
    loaded = named_for_output(catalog.load_space(space or space_opt or DEFAULT_SPACE, overrides), bool(overrides))
    encoder = Encoder(loaded)
    if dry_run:
        enc = encoder.encode_all() if encoder.n_combinations <= 50_000_000 else None
        if enc is None:
            raise InputError(f"{loaded.source}: space = {encoder.n_combinations:,} combinations: expected at most "
                             "50,000,000 for --dry-run")
        click.echo(explain_table(enc.first_reason, enc.breaks, enc.n_combinations))
        return
    if dask_address is not None:
        from paraspace.explorer.distributed import run_on_dask

        if shard is not None:
            raise InputError(f"command line: --shard = {shard!r} with --dask: expected one of them (--dask runs every "
                             "shard of --shards N; --shard runs one here)")
        check_shard_count(shards, encoder.n_combinations, "--shards", shards)
        folder = _parts_folder(out, loaded, "--dask")
        replaced = other_shard_parts(folder, shards, loaded.spec.name)  # refused before the run, not after
        # every sweep option reaches the shards (progress bars stay on the workers' side: off)
        parts = run_on_dask(loaded, folder, dask_address, shards, chunk_rows,
                            options={"simulate": simulate, "max_tasks": max_tasks, "simulate_top": simulate_top})
        _replace_shard_parts(replaced, loaded, folder, shards)
        rows = sum(p["n_rows"] for p in parts)
        n_combinations = sum(p["n_combinations"] for p in parts)
        click.echo(f"{len(parts)} shards on {dask_address}: {n_combinations:,} combinations "
                   f"-> {rows:,} candidates ({sum(p['n_feasible'] for p in parts):,} fit, "
                   f"{sum(p['n_simulated'] for p in parts):,} simulated) in {folder}/")
        if explain:
            first = np.sum([p["first_reason"] for p in parts], axis=0)
            click.echo(explain_table(first, np.sum([p["breaks"] for p in parts], axis=0), n_combinations))
        if n_top and rows:
            click.echo(_top_table(top(folder, n_top), columns, wide))
        return
    start, stop = 0, encoder.n_combinations
    replaced: list[Path] = []
    if shard is not None:
        index, count = parse_shard(shard)
        check_shard_count(count, encoder.n_combinations, "--shard", shard)
        start, stop = shard_range(encoder.n_combinations, index, count)
        folder = _parts_folder(out, loaded, "--shard")
        replaced = other_shard_parts(folder, count, loaded.spec.name)  # refused before the run, not after
        target = shard_path(folder, index, count)
    else:
        target = out or Path("results") / f"{loaded.spec.name}.parquet"
    check_writable(target)  # before the sweep's minutes, not after (the writer checks again)
    _announce_compile()
    expected = expected_seconds(stop - start, simulate_top, simulate)
    if expected > WARN_AFTER_S:
        sims = expected_simulations(stop - start, simulate_top, simulate)
        click.echo(f"{loaded.spec.name}: {stop - start:,} combinations and up to {sims:,} simulations: "
                   f"about {expected / 60:.0f} minutes on 2 cores (--shard I/N or --dask splits it; "
                   "--simulate-top lowers the simulations)", err=True)
    summary = run_sweep(loaded, target, chunk_rows=chunk_rows, progress=progress, simulate=simulate,
                        max_tasks=max_tasks, simulate_top=simulate_top, start=start, stop=stop,
                        keep_empty=shard is not None)
    if shard is not None:
        _replace_shard_parts(replaced, loaded, target.parent, count)
    if summary.n_rows == 0:
        click.echo(explain_table(summary.first_reason, summary.breaks, summary.n_combinations), err=True)
        if shard is not None:  # an empty part is this shard's complete answer; the dataset needs it
            click.echo(f"{loaded.spec.name} shard {shard}: no valid candidate; wrote {summary.path} (0 rows)")
            return
        kept = f"{target} left as it was" if target.exists() else "nothing written"
        raise InputError(f"{loaded.source}: dimensions = {summary.n_combinations:,} combinations: expected at least "
                         f"one valid candidate (see the table above; {kept})")
    spec = loaded.spec
    click.echo(f"{spec.name}: {loaded.model.name} on {spec.devices_text} x {loaded.hardware.name}, "
               f"{spec.global_batch} x {spec.seq_len} tokens per step, {spec.dtype}")
    click.echo(f"{summary.n_combinations:,} combinations -> {summary.n_rows:,} candidates "
               f"({summary.n_feasible:,} fit in memory, {summary.n_simulated:,} simulated) in {summary.seconds:.2f} s "
               f"({summary.n_combinations / max(summary.seconds, 1e-9):,.0f} combinations/s)")
    click.echo(f"wrote {summary.path}")
    if explain:
        click.echo(explain_table(summary.first_reason, summary.breaks, summary.n_combinations))
    if n_top:
        click.echo(f"top {n_top} by step time (feasible first):")
        click.echo(_top_table(top(summary.path, n_top), columns, wide))


def _replace_shard_parts(replaced: list[Path], loaded: LoadedSpace, folder: Path, count: int) -> None:
    """After a sharded run wrote its part(s): remove the earlier run's parts of another shard count
    (``other_shard_parts``) once every part of this run is written, else say on stderr that they
    are kept until then; and say when parts of this count are still another definition's."""
    digest = space_digest(loaded)
    counts = " and of ".join(map(str, sorted({int(SHARD_FILE.fullmatch(p.name)[2]) for p in replaced})))
    written = shard_definitions(folder, count)
    if len(written) == count and all(d == digest for d in written.values()):  # this run's parts, all of them
        removed = remove_shard_parts(replaced, loaded.spec.name)
        if removed:
            click.echo(f"removed {len(removed)} part(s) of an earlier run of {counts} shards from {folder}/ "
                       f"(replaced by this run's {count})", err=True)
        return
    if replaced:
        click.echo(f"kept {len(replaced)} part(s) of an earlier run of {counts} shards in {folder}/ until every "
                   f"part of this run's {count} is written (the last to finish removes them)", err=True)
    stale = [part for part, d in written.items() if d != digest]
    if stale:
        click.echo(f"{folder}/: {', '.join(p.name for p in stale)} of another definition of {loaded.spec.name} "
                   f"(written before its TOML changed): the folder reads once this run has written them again",
                   err=True)


def _parts_folder(out: Path | None, loaded: LoadedSpace, flag: str) -> Path:
    """The folder a sharded sweep (``--shard`` or ``--dask``) writes its ``part-I-of-N.parquet`` into:
    ``--out``, or ``results/SPACE``. An ``--out`` naming a Parquet file is refused: every shard
    would write that one file, each replacing the last, and the survivor would rank as the whole."""
    if out is None:
        return Path("results") / loaded.spec.name
    if out.suffix.lower() == ".parquet":
        raise InputError(f"command line: --out = {str(out)!r} with {flag}: expected a folder ({flag} writes one "
                         f"part-I-of-N.parquet per shard into it, which top, pareto and compare read as one "
                         f"dataset), e.g. --out {out.with_suffix('')}")
    return out


def _opened(results: Path) -> Results:
    """The checked results (one space, every shard, one row per row_id); what was done to
    their rows (exact repeats dropped) is said on stderr."""
    opened = open_results(results)
    if opened.note:
        click.echo(opened.note, err=True)
    return opened


def _with_frame_config(frame: pl.DataFrame) -> str:
    return display.frame_text(frame)


@main.command("top")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--by", default="step_time_s", show_default=True, help="Column to rank by (ascending).")
@click.option("--max-mem", "max_mem", type=FiniteFloatRange(0, MAX_GIB), default=None,
              help="Keep rows with peak memory <= GiB.")
@click.option("--where", default=None, help="SQL condition, e.g. \"tp = 8 AND schedule = 'interleaved'\".")
@click.option("-n", "n_top", type=click.IntRange(1, MAX_SHOWN_ROWS), default=10, show_default=True)
@click.option("--max-ttft", "max_ttft", type=FiniteFloatRange(0, 1e6, min_open=True), default=None,
              help="Serving results: keep rows whose mean TTFT is at most this many seconds.")
@click.option("--max-tpot", "max_tpot", type=FiniteFloatRange(0, 1e6, min_open=True), default=None,
              help="Serving results: keep rows whose mean TPOT is at most this many seconds.")
@table_options
@_guard
def top_cmd(results: Path, by: str, max_mem: float | None, where: str | None, n_top: int, max_ttft: float | None,
            max_tpot: float | None, columns: str | None, wide: bool) -> None:
    """The best rows of a result file or dataset (feasible first; serving results by throughput per GPU)."""
    frame = top(_opened(results), n_top, (by, "mem_peak_bytes"), where=where, max_mem_gib=max_mem,
                max_ttft_s=max_ttft, max_tpot_s=max_tpot)
    click.echo(_top_table(frame, columns, wide, extra=(by,)))


@main.command("pareto")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--x", "x", default="step_time_s", show_default=True, help="First column to minimise.")
@click.option("--y", "y", default="mem_peak_bytes", show_default=True, help="Second column to minimise.")
@click.option("--where", default=None, help="SQL condition applied first.")
@table_options
@_guard
def pareto_cmd(results: Path, x: str, y: str, where: str | None, columns: str | None, wide: bool) -> None:
    """Feasible rows that no other row beats on both columns."""
    opened = _opened(results)
    front = pareto(opened, x, y, where=where)
    drawn_x, drawn_y, maximised = front_axes(opened.frame, x, y)  # a serving result's default axes are its own
    click.echo(f"{front.height} rows on the {drawn_x} / {drawn_y} front{' (both maximised)' if maximised else ''}:")
    click.echo(_top_table(front, columns, wide, extra=(drawn_x, drawn_y)))


@main.command("report")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--out", type=OutputPath(dir_okay=False, path_type=Path), default=Path("report.html"), show_default=True)
@click.option("-n", "n_top", type=click.IntRange(1, MAX_SHOWN_ROWS), default=10, show_default=True)
@_guard
def report_cmd(results: Path, out: Path, n_top: int) -> None:
    """A self-contained HTML page: best rows, Pareto front, breakdown and sensitivity."""
    from paraspace.results.report import write

    _opened(results)
    click.echo(f"wrote {write(results, out, list(DIMENSION_NAMES), n_top)}")


@main.command("compare")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--ids", "ids", type=click.IntRange(0, MAX_COMBINATIONS), multiple=True, required=True,
              help="row_id to show (give it again for each row: two or more side by side, with the differences of two).")
@_guard
def compare_cmd(results: Path, ids: tuple[int, ...]) -> None:
    """Rows side by side, with the difference of every column for two rows."""
    click.echo(_with_frame_config(compare(_opened(results), list(ids))))


@main.command("study")
@click.argument("space", required=False, default=None)
@click.option("--trials", "n_trials", type=COUNT, default=200, show_default=True)
@click.option("--timeout", "timeout_s", type=FiniteFloatRange(0, MAX_TIMEOUT_S), default=None,
              help="Stop after about this many seconds: the first batch is one trial and later batches shrink to "
                   "the time left, so it is overrun by about one trial's time.")
@click.option("--sampler", type=click.Choice(["tpe", "nsga2", "random", "grid"]), default="tpe", show_default=True)
@click.option("--objective", type=click.Choice(["time-memory", "time", "throughput", "throughput-user"]), default=None,
              help="Training: minimise step time and peak memory (time-memory, the default), or step time alone "
                   "(time), under the memory cap. Serving: maximise output tokens/s per GPU (throughput, the "
                   "default), or that and tokens/s per user (throughput-user), under the SLA.")
@click.option("--max-mem", "max_mem", type=FiniteFloatRange(0, MAX_GIB, min_open=True), default=None,
              help="Memory cap in GiB [default: the device's HBM].")
@click.option("--storage", default=None, help="Optuna storage URL (e.g. postgresql+psycopg2://user:password@host/db, "
                                              "or sqlite:///study.db) [default: a journal file in the output folder].")
@click.option("--study-name", default=None, help="[default: the space's name]")
@click.option("--batch", type=COUNT, default=64, show_default=True, help="Trials asked per batch.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Seed of the sampler (numpy's range).")
@click.option("--out", "out_dir", type=OutputPath(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder for the journal and the Parquet parts.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Progress bar with trials per second and the best feasible step time so far.")
@click.option("--simulate/--no-simulate", default=None,
              help="Serving: simulate every runnable trial iteration by iteration (the default; p90 targets "
                   "checked), or keep the analytic tier's values (much faster; mean targets only).")
@_guard
def study_cmd(space: str | None, n_trials: int, timeout_s: float | None, sampler: str, objective: str | None,
              max_mem: float | None, storage: str | None, study_name: str | None, batch: int, seed: int,
              out_dir: Path, progress: bool, simulate: bool | None) -> None:
    """Search a space (training, or serving: spaces/catalog/serving) with Optuna; resumes the named study if it
    exists."""
    import optuna

    from paraspace.explorer import serve
    from paraspace.explorer.study import OBJECTIVES, run_study
    from paraspace.spaces.serving import load_serving

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    serving = serve.is_serving_space(space)
    kinds = serve.SERVING_OBJECTIVES if serving else OBJECTIVES
    if objective is not None and objective not in kinds:
        raise InputError(f"command line: --objective = {objective}: expected one of {', '.join(kinds)} for a "
                         f"{'serving' if serving else 'training'} space")
    if simulate is not None and not serving:
        raise InputError(f"command line: --{'' if simulate else 'no-'}simulate: expected only with a serving space "
                         f"(a training study evaluates every trial by the event tier)")
    extra: dict[str, Any] = {}
    if serving:
        from paraspace.explorer.serve_study import run_serving_study

        extra = {"simulate": simulate is not False}
        loaded = load_serving(space)
        label = lambda best: f"best {best:,.4g} tokens/s/GPU"  # noqa: E731
    else:
        loaded = named_for_output(catalog.load_space(space or DEFAULT_SPACE), overridden=False)
        label = lambda best: f"best step {best:.4g} s"  # noqa: E731
    _announce_compile()
    if study_name is not None:  # names the journal and the parts' folder: keep them inside --out
        confined_name(study_name, "command line", "--study-name")
    from tqdm import tqdm

    with tqdm(total=n_trials, unit="trial", desc=f"study {study_name or loaded.spec.name}", leave=False,
              disable=None if progress else True, mininterval=0.5) as bar:
        def on_batch(done: int, best: float | None) -> None:
            bar.update(done - bar.n)
            bar.set_postfix_str(label(best) if best is not None else "no feasible trial yet")

        run = run_serving_study if serving else run_study
        summary = run(loaded, n_trials=n_trials, out_dir=out_dir, study_name=study_name, storage=storage,
                      sampler=sampler, objective=objective or kinds[0], max_mem_gib=max_mem, batch=batch,
                      timeout_s=timeout_s, seed=seed, on_batch=on_batch, **extra)
    metrics_dir = out_dir / summary.study_name
    where = f"metrics in {metrics_dir}/" if metrics_dir.is_dir() else "no metrics written"  # --timeout before a batch
    click.echo(f"study {summary.study_name}: {summary.n_new} new trials ({summary.n_trials_total} in total) in "
               f"{summary.seconds:.1f} s; {where}")
    if summary.best:
        click.echo(_with_frame_config(pl.DataFrame(summary.best)))
    else:
        click.echo("no feasible trial yet")


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text.strip()


def _eval_space(space: str | None, model: str | None, hardware: str | None, devices: int | None,
                global_batch: int | None, seq_len: int | None, dtype: str | None,
                sets: tuple[str, ...]) -> tuple[LoadedSpace, LoadedSpace | None]:
    """The one-configuration space of eval and trace: ``--space`` (every setting of it kept) or the
    workload flags, narrowed to the ``--set`` strategy by ``explorer.evaluate.pin``, the one path
    from a space and a strategy to an evaluation; and the ``--space`` it was narrowed from (None
    without one)."""
    strategy: dict[str, Any] = {}
    keys = ", ".join(DIMENSION_NAMES)
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise InputError(f"command line: --set {item!r}: expected KEY=VALUE with KEY one of {keys}")
        if key.strip() not in DIMENSION_NAMES:
            close = difflib.get_close_matches(key.strip(), DIMENSION_NAMES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise InputError(f"command line: --set {item}: expected KEY=VALUE with KEY one of {keys}{hint}")
        _set_once(strategy, key.strip(), value)
    given = {"model": model, "hardware": hardware, "devices": devices, "global_batch": global_batch,
             "seq_len": seq_len, "dtype": dtype}
    given = {k: v for k, v in given.items() if v is not None}
    if "devices" in strategy and "devices" in given and strategy["devices"] != given["devices"]:
        raise InputError(f"command line: --set devices={strategy['devices']}: expected the --devices value "
                         f"{given['devices']} (or only one of them)")
    if "devices" in strategy and not space:  # --set devices=N stands for --devices N
        given["devices"] = strategy["devices"]
    if space:
        base = catalog.load_space(space, given)
        if "devices" in given:  # one of the space's own cluster sizes picked: the row of its sweep, all sizes listed
            whole = catalog.load_space(space, {k: v for k, v in given.items() if k != "devices"})
            if given["devices"] in whole.spec.device_counts:
                return pin(base, strategy), whole
    else:
        for key in ("model", "hardware", "devices", "global_batch", "seq_len"):
            if key not in given:
                raise InputError(f"command line: --{key.replace('_', '-')} = (missing): expected a value (or --space)")
        base = catalog.space_from_raw({"name": "eval", "description": "one configuration from the command line",
                                       **given}, "command line", Path.cwd())
    return pin(base, strategy), base if space else None


def config_options(fn):  # noqa: ANN001, ANN201 - decorator
    """The options that name one configuration (shared by eval and trace)."""
    options = [
        click.option("--space", default=None, help="Take every setting from this space (model, hardware, devices, "
                     "workload, dtype, uneven_layers, ...): the row a sweep of it gives."),
        click.option("--model", default=None, help="Model: catalog name or TOML path."),
        click.option("--hardware", default=None, help="Hardware: catalog name or TOML path."),
        click.option("--devices", type=COUNT, default=None, help="Number of devices."),
        click.option("--global-batch", type=COUNT, default=None, help="Sequences per optimizer step."),
        click.option("--seq-len", type=COUNT, default=None, help="Tokens per sequence."),
        click.option("--dtype", default=None, help="GEMM precision (bf16, fp16, fp8, ...) [default: bf16]."),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="A strategy value, e.g. --set tp=8 --set recompute=selective; a dimension not set "
                          "takes the space's value where it has one, else its default (dp: devices/(tp*pp*cp))."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _set_once(strategy: dict[str, Any], key: str, value: str) -> None:
    """``--set KEY=VALUE`` into ``strategy``; a key given twice is an error naming both values."""
    if key in strategy:
        raise InputError(f"command line: --set {key}={value}: expected {key} once (already --set {key}="
                         f"{strategy[key]})")
    strategy[key] = _parse_value(value)


def _one_row(space: str | None, model: str | None, hardware: str | None, devices: int | None,
             global_batch: int | None, seq_len: int | None, dtype: str | None, sets: tuple[str, ...]):  # noqa: ANN202
    """The loaded space and the encoded single row of a command-line configuration, and the
    ``--space`` it comes from (None without one)."""
    loaded, base = _eval_space(space, model, hardware, devices, global_batch, seq_len, dtype, sets)
    _announce_compile()
    enc = Encoder(loaded).encode_all()
    if enc.n_rows != 1:
        reason = Reason(enc.most_dropped())
        dims = loaded.raw["dimensions"]
        mine = {item.partition("=")[0].strip() for item in sets}  # what --set gave, named first
        given = " ".join(f"--set {k}={v[0]}" for k, v in dims.items() if k in mine) or "the configuration"
        sizes = {k: getattr(loaded.spec.dimensions, k) for k in ("tp", "pp", "dp", "cp")}
        rest = " ".join([f"devices={loaded.spec.device_counts[0]}"]
                        + [f"{k}={v[0]}" for k, v in sizes.items() if k not in mine and v]
                        + [f"{k}={v[0]}" for k, v in dims.items() if k not in mine and k not in sizes])
        raise InputError(f"command line: {given}: expected a valid configuration, but {REASON_TEXT[reason]} "
                         f"(rule {reason.name.lower()}; with {rest or 'nothing else set'})")
    return loaded, enc, base


@main.command("eval")
@config_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the Parquet column names.")
@_guard
def eval_cmd(space: str | None, model: str | None, hardware: str | None, devices: int | None,
             global_batch: int | None, seq_len: int | None, dtype: str | None, sets: tuple[str, ...],
             as_json: bool) -> None:
    """Evaluate one configuration and print its metrics and breakdown."""
    loaded, enc, base = _one_row(space, model, hardware, devices, global_batch, seq_len, dtype, sets)
    cols = evaluate_encoded(pack(loaded), enc)
    row = to_arrow(cols, result_schema(), enum_labels()).to_pylist()[0]
    if as_json:
        # the configuration's row_id in the --space's enumeration (a sweep's key), never the
        # one-row space's own 0; left out where there is none
        rid = row_id_in(base, {k: v[0] for k, v in enc.columns.items()}) if base is not None else None
        row = {**row, "row_id": rid} if rid is not None else {k: v for k, v in row.items() if k != "row_id"}
        click.echo(json.dumps(row))
        return
    click.echo(_report(loaded, row))


@main.command("trace")
@config_options
@click.option("--out", "prefix", type=OutputPath(dir_okay=False, path_type=Path), default=Path("trace"),
              show_default=True, help="Writes PREFIX.json (Chrome trace / Perfetto) and PREFIX.png (Gantt).")
@_guard
def trace_cmd(space: str | None, model: str | None, hardware: str | None, devices: int | None,
              global_batch: int | None, seq_len: int | None, dtype: str | None, sets: tuple[str, ...],
              prefix: Path) -> None:
    """Simulate one configuration with timeline capture and export it (open the JSON in ui.perfetto.dev).

    With a serving space (--space NAME of spaces/catalog/serving, or its TOML), --set narrows its dimensions
    (e.g. --set mode=disagg --set tp=4) and the best candidate left by the analytic ranking is simulated: its
    engines' prefill and decode iterations, EP traffic and KV-cache occupancy, to PREFIX.json."""
    from paraspace.explorer import serve

    if serve.is_serving_space(space):
        _serving_trace(space, {"--model": model, "--hardware": hardware, "--devices": devices,
                               "--global-batch": global_batch, "--seq-len": seq_len, "--dtype": dtype}, sets, prefix)
        return
    from paraspace.explorer.timeline import capture
    from paraspace.results.trace import check_trace_files, write_chrome_trace, write_gantt_png, written_together

    json_out, png_out = _trace_files(prefix)
    loaded, enc, _ = _one_row(space, model, hardware, devices, global_batch, seq_len, dtype, sets)
    check_trace_files(json_out, png_out)  # both, before the simulation and before either is written
    row = {k: int(v[0]) for k, v in enc.columns.items()}
    packed = pack(loaded)
    tl = capture(loaded, packed, row)
    with written_together():  # the pair replaced together or not at all
        json_path = write_chrome_trace(tl, json_out)
        png_path = write_gantt_png(tl, png_out)
    click.echo(f"{tl.title}\n{tl.start_s.size:,} tasks; wrote {json_path} and {png_path}")
    fit = analytic(packed, enc.columns)  # the memory model: the timeline has no verdict of its own
    if not fit["feasible"][0]:
        code = int(fit["infeasible_reason"][0])
        device = loaded.hardware.device
        used, cap, what = ((fit["mem_host_bytes"][0], device.host_capacity_bytes, "host memory (offloaded)")
                           if code == Feasibility.OUT_OF_HOST_MEMORY else
                           (fit["mem_peak_bytes"][0], device.hbm_capacity_bytes, "peak memory"))
        click.echo(f"this configuration does NOT fit ({enum_labels()['infeasible_reason'][code]}): {what} "
                   f"{used / GIB:.2f} GiB of {cap / GIB:.1f} GiB per device; the trace times a step it could not run")


#: what trace writes: PREFIX + each of these
TRACE_SUFFIXES = (".json", ".png")


def _trace_files(prefix: Path) -> tuple[Path, Path]:
    """PREFIX.json and PREFIX.png, the suffixes appended (``llama3-8b.tp2`` keeps its ``.tp2``: two
    prefixes that differ there never write the same files); a prefix ending in one of them has
    that one taken off first (``--out run.json`` writes run.json and run.png)."""
    name = prefix.name
    for suffix in TRACE_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[:-len(suffix)]
            break
    if not name or name in (".", ".."):
        raise InputError(f"command line: --out = {str(prefix)!r}: expected a file name prefix (trace writes "
                         "PREFIX.json and PREFIX.png)")
    return prefix.with_name(name + TRACE_SUFFIXES[0]), prefix.with_name(name + TRACE_SUFFIXES[1])


def _serving_trace(space: str, unused: dict[str, Any], sets: tuple[str, ...], prefix: Path) -> None:
    from paraspace.explorer.serve_timeline import capture
    from paraspace.results.serving_trace import TRANSFER, write_chrome_trace, write_gantt_png
    from paraspace.results.trace import check_trace_files, written_together
    from paraspace.spaces.serving import load_serving

    for flag, value in unused.items():
        if value is not None:
            raise InputError(f"command line: {flag} = {value}: expected none with a serving space ({space} names the "
                             "model, hardware and devices)")
    strategy: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise InputError(f"command line: --set {item!r}: expected KEY=VALUE with KEY a serving dimension")
        _set_once(strategy, key.strip(), value)
    json_out, png_out = _trace_files(prefix)
    loaded = load_serving(space)
    check_trace_files(json_out, png_out)  # both, before the simulation and before either is written
    _announce_compile()
    tl = capture(loaded, strategy)
    with written_together():  # the pair replaced together or not at all
        path = write_chrome_trace(tl, json_out)
        png_path = write_gantt_png(tl, png_out)
    click.echo(f"{tl.title}\n{int((tl.kind != TRANSFER).sum()):,} iterations on {len(tl.engine_names)} engine(s); "
               f"wrote {path} and {png_path}")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None: JSON has no NaN or infinity."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@main.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: rows and summary.")
@click.option("--loso", is_flag=True,
              help="Training files: also fit the calibrated knobs without each source and predict it "
                   "(leave-one-source-out; about two minutes on 2 cores).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on a terminal.")
@_guard
def validate_cmd(file: Path, as_json: bool, loso: bool, progress: bool) -> None:
    """Predict every row of a published-measurement CSV and report the errors."""
    from paraspace.explorer import validate

    _announce_compile()
    from tqdm import tqdm

    with tqdm(unit="row", desc=f"validate {file.name}", leave=False, mininterval=0.5,
              disable=None if progress else True) as bar:
        def on_row(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        kind, results = validate.run(file, on_row)
    stats = validate.summary(results)
    held = held_stats = None
    loso_notes: dict[str, str] = {}
    if loso and kind == "training":
        from paraspace.explorer import loso as loso_mod

        with tqdm(unit="fit", desc="leave-one-source-out: rows at each knob pair", leave=False, mininterval=0.5,
                  disable=None if progress else True) as bar:
            def on_job(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            held = loso_mod.run(str(file), results, on_job=on_job)
        held_stats = loso_mod.summary(results, held)
        held_stats["bands"] = loso_mod.band_coverage(list(validate.read(file).iter_rows(named=True)), results, held)
        for source in sorted({r.source for r, h in zip(results, held) if r.status == "ok" and h is None}):
            loso_notes[source] = ("no prediction with its rows left out: the knobs are fitted on the other sources' "
                                  "ok dense rows (explorer.loso), and this file has none beside it")
    if kind == "inference":  # no knob is fitted on inference rows: instant, so always (explorer.loso)
        from paraspace.explorer import loso as loso_mod

        held, loso_notes = loso_mod.inference_run(file, results)
        held_stats = loso_mod.summary(results, held)
    if as_json:
        rows = [{"id": r.id, "metric": r.metric, "measured": r.measured, "predicted": r.predicted,
                 "error": r.error, "status": r.status, "reason": r.reason, "quality": r.quality, "source": r.source,
                 "chosen": r.chosen, "band": [r.predicted_lo, r.predicted_hi], "mem_peak_bytes": r.mem_peak_bytes,
                 "measured_mem_bytes": r.measured_mem_bytes}
                | ({"loso_predicted": held[i]} if held is not None else {})
                | ({"framework": r.framework, "ceiling": r.ceiling, "beyond_ceiling": r.beyond_ceiling}
                   if kind == "inference" else {})
                for i, r in enumerate(results)]
        out = ({"kind": kind, "rows": rows, "summary": stats} | ({"loso": held_stats} if held_stats else {})
               | ({"loso_notes": loso_notes} if loso_notes else {}))
        click.echo(json.dumps(_finite(out), allow_nan=False))
        return
    click.echo(validate.table(results))
    click.echo(f"\n{kind} rows: " + ", ".join(f"{v} {k}" for k, v in stats["status"].items()))
    for group in ("ok", "uncertain"):
        st = stats[group]
        if st["n"]:
            held_text = ""
            if held_stats and held_stats[group]["n"]:
                held_text = f"  (leave-one-source-out {100 * held_stats[group]['mape']:.1f}%)"
            click.echo(f"{group:>9} rows: n={st['n']}  MAPE {100 * st['mape']:.1f}%{held_text}  median "
                       f"{100 * st['median_ape']:.1f}%  mean signed {100 * st['mean_signed']:+.1f}%")
            if st["oom"]:
                held_oom = (f", leave-one-source-out {100 * held_stats[group]['mape_with_oom']:.1f}%"
                            if held_stats and held_stats[group]["n"] else "")
                click.echo(f"  {st['oom']} more measured runs predicted out of memory (left out above); counting "
                           f"their fastest configurations: MAPE {100 * st['mape_with_oom']:.1f}%{held_oom}")
            click.echo("  worst: " + ", ".join(f"{rid} {100 * err:+.1f}%" for rid, err in st["worst"]))
    for key in ("by_source", "by_gpu", "by_metric", "by_framework"):
        for name, st in stats.get(key, {}).items():
            if st["n"]:
                held_st = (held_stats or {}).get(key, {}).get(name)
                held_text = f"  left out {100 * held_st['mape']:5.1f}%" if held_st and held_st["n"] else ""
                click.echo(f"  {name:<34} n={st['n']:>3}  MAPE {100 * st['mape']:5.1f}%  "
                           f"signed {100 * st['mean_signed']:+6.1f}%{held_text}")
    if held_stats and "bands" in held_stats and held_stats["bands"]["n"]:
        cover = held_stats["bands"]
        click.echo(f"bands: the 80% band fitted without each source holds {100 * cover['coverage']:.1f}% of its "
                   f"{cover['n']} ok rows' measured step times (target 75-85%)")
    rank, mem = stats["ranking"], stats["memory"]
    if rank["pairs"]:
        told = f"{100 * rank['distinguished']:.0f}%" if rank["distinguished"] is not None else "-"
        click.echo(f"ranking: {rank['pairs']} pairs of one job differing by >= 5% measured; predicted order right "
                   f"in {100 * rank['agreement']:.0f}% ({rank['ties']} predicted as ties, the same configuration by "
                   f"their columns; {told} of the others)")
    if mem["n"]:
        click.echo(f"memory: {mem['n']} rows with a measured peak; MAPE {100 * mem['mape']:.1f}%, "
                   f"mean signed {100 * mem['mean_signed']:+.1f}%")
    if "ceiling" in stats:
        bound = stats["ceiling"]
        click.echo(f"memory-bandwidth bound: {bound['checked']} decode predictions checked, "
                   f"{len(bound['beyond'])} beyond it" + (f" ({', '.join(bound['beyond'])})" if bound["beyond"] else "")
                   + f"; the closest at {100 * bound['closest']:.0f}% of it")
    for source, note in loso_notes.items():
        click.echo(f"leave-one-source-out, {source}: {note}")


# --------------------------------------------------------------------------- calibrate (issue 4)
# The fitting lives in explorer.fit_measurements (its docstring documents the CSV columns and the fits).


@main.group("calibrate")
def calibrate_group() -> None:
    """Fit a hardware profile to measured GEMM or collective timings.

    Writes a TOML that extends the base profile and replaces only the fitted
    fields; use it anywhere a hardware name is accepted (--hardware PROFILE.toml)."""


def _calibrate_options(fn):  # noqa: ANN001, ANN201 - decorator
    options = [
        click.argument("measurements", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option("--hardware", required=True, help="Base profile: catalog name or TOML path."),
        click.option("--out", required=True, type=OutputPath(dir_okay=False, path_type=Path),
                     help="The profile TOML to write."),
        click.option("--name", default=None, help="Name of the new profile [default: the base's name + -calibrated]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@calibrate_group.command("gemm")
@_calibrate_options
@_guard
def calibrate_gemm_cmd(measurements: Path, hardware: str, out: Path, name: str | None) -> None:
    """Fit device.gemm_efficiency to a CSV of m, n, k, dtype and seconds or tflops (TFLOP/s = 2mnk/s/1e12)."""
    from paraspace.explorer.fit_measurements import calibrate_gemm

    click.echo(calibrate_gemm(measurements, hardware, out, name).summary)


@calibrate_group.command("comm")
@_calibrate_options
@click.option("--tier", required=True, help="The link tier the measurements ran on (a [[links]] name).")
@_guard
def calibrate_comm_cmd(measurements: Path, hardware: str, out: Path, name: str | None, tier: str) -> None:
    """Fit one link tier to a CSV of op, ranks, bytes and seconds or gbps (nccl-tests busbw, decimal GB/s).

    Fits the tier's latency, each measured op's bandwidth and its bandwidth-vs-size curve."""
    from paraspace.explorer.fit_measurements import calibrate_comm

    click.echo(calibrate_comm(measurements, hardware, tier, out, name).summary)


def _report(loaded: LoadedSpace, row: dict[str, Any]) -> str:
    spec = loaded.spec
    step = row["step_time_s"]
    lines = [
        f"{loaded.model.name} on {spec.devices_text} x {loaded.hardware.name}, "
        f"{spec.global_batch} x {spec.seq_len} tokens per step, {spec.dtype}",
        "strategy: " + " ".join(f"{n}={row[n]}" for n in _dimensions_shown(pl.DataFrame([row])))
        + f" (n_microbatches={row['n_microbatches']})",
        f"step time {step:.4f} s ({'simulated' if row['simulated'] else 'analytic'})   "
        f"tokens/s/gpu {row['tokens_per_s_per_gpu']:,.0f}   MFU {100 * row['mfu']:.1f}%",
    ]
    if row["simulated"]:
        lines.append(f"event engine ({row['n_tasks']:,.0f} tasks): bubble {row['bubble_sim_s']:.4f} s, exposed pipeline "
                     f"sends {row['pp_exposed_sim_s']:.4f} s, exposed data-parallel {row['dp_exposed_sim_s']:.4f} s, "
                     f"stage 0 holds {row['inflight_peak_stage0']:.2f} micro-batches at peak")
    analytic = row["step_time_analytic_s"]
    lines.append(f"closed-form breakdown (bottleneck device), step {analytic:.4f} s:")
    for col in STEP_PARTS:  # they add up to the step (dualpipe_credit_s <= 0)
        lines.append(f"  {col:<18}{row[col]:>10.4f} s  {100 * row[col] / analytic:6.1f}%")
    lines.append(f"  {'(recompute_s)':<18}{row['recompute_s']:>10.4f} s  included above")
    cap = loaded.hardware.device.hbm_capacity_bytes
    lines.append(f"memory (stage {row['mem_peak_stage']}, the most loaded device):")
    for col in ("mem_weights_bytes", "mem_grads_bytes", "mem_optimizer_bytes", "mem_activations_bytes",
                "mem_overhead_bytes"):
        lines.append(f"  {col:<22}{row[col] / GIB:>8.2f} GiB")
    verdict = "fits" if row["feasible"] else f"does NOT fit ({row['infeasible_reason']})"
    lines.append(f"  {'mem_peak_bytes':<22}{row['mem_peak_bytes'] / GIB:>8.2f} GiB of {cap / GIB:.1f} GiB: {verdict}")
    return "\n".join(lines)


@main.command("serve")
@click.argument("space")
@click.option("--out", type=OutputPath(dir_okay=False, path_type=Path), default=None,
              help="Output Parquet file [default: results/SPACE.parquet].")
@click.option("-n", "--top", "n_top", type=click.IntRange(0, MAX_SHOWN_ROWS), default=10, show_default=True,
              help="Rows of the ranking to print.")
@click.option("--simulate-top", type=click.IntRange(0, MAX_COUNT), default=None,
              help="Simulate the ranking's best candidates until this many of the best are simulated (rounds of "
                   "re-ranking by the simulated values) [default: the space's simulate_top].")
@click.option("--explain", is_flag=True, help="Print how many combinations each validity rule removed.")
@click.option("--dry-run", is_flag=True, help="Encode and explain only; evaluate and write nothing.")
@_guard
def serve_cmd(space: str, out: Path | None, n_top: int, simulate_top: int | None, explain: bool,
              dry_run: bool) -> None:
    """Evaluate a serving space (catalog name under spaces/catalog/serving, or a TOML path): TTFT, TPOT and
    throughput of every deployment, the best ones simulated, ranked to Parquet."""
    from paraspace.explorer import serve
    from paraspace.spaces.serving import load_serving

    loaded = load_serving(space)
    if dry_run:
        click.echo(serve.explain_table(serve.encode_summary(loaded)))
        return
    target = serve.output_path(loaded, out)
    check_writable(target)  # before the evaluation, not after (the writer checks again)
    summary = serve.run_serve(loaded, target, simulate_top=simulate_top)
    click.echo(serve.headline(loaded, summary))
    if explain or summary.n_rows == 0:
        click.echo(serve.explain_table(summary))
    if summary.n_rows == 0:
        raise InputError(f"{loaded.source}: dimensions = {summary.n_combinations:,} combinations: expected at least "
                         "one valid candidate (see the table above)")
    if n_top and summary.table is not None:
        click.echo(f"top {n_top} (feasible first, simulated next, then output tokens/s per GPU, then TTFT):")
        click.echo(serve.top_table(summary.table, n_top))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
