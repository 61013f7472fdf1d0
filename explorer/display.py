"""What the command line shows on a terminal: result tables that fit its width, and the
first-run note while numba compiles the kernels.

Tables are rendered by ``rich`` into plain text (no colour codes, so the text is the
same on a terminal, in a pipe and under test) at the terminal's width. The compact
default shows the rank, ``row_id`` (what ``paraspace compare --ids`` takes), the
strategy dimensions that vary among the rows shown, the step time with its 80% band,
MFU, peak memory in GiB and whether the row fits; one line under the table names the
dimensions every row shares. When the compact table is still too wide, the last
varying dimensions are left out, then the band, and the note says which.
``columns`` picks exact columns; ``wide`` shows every column, one line per row,
however wide that is (for ``less -S`` or a wide window).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import polars as pl
from rich import box
from rich.console import Console
from rich.table import Table

from paraspace.spaces.encode import DIMENSION_NAMES

GIB = 1024**3
#: width assumed when the output is not a terminal and COLUMNS is unset
FALLBACK_WIDTH = 80
#: columns naming which problem a row belongs to, shown first where the rows hold several
SPACE_COLUMNS = ("space", "model")
#: the metrics of the compact table, after the dimensions (a training sweep's; a serving result's)
DEFAULT_METRICS = ("step_time_s", "mfu", "mem_peak_bytes", "feasible")
SERVING_METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_gpu", "mem_peak_bytes", "feasible")
#: dimensions kept longest when the compact table must drop some to fit
CORE_DIMENSIONS = ("tp", "pp", "dp", "micro_batch", "schedule", "mode", "max_batch")
BAND = ("step_time_lo_s", "step_time_hi_s")
#: a column that is not in the frame: the row's position in the table
RANK = "rank"


class ColumnError(ValueError):
    """A ``--columns`` entry that names no column of the results."""


def terminal_width() -> int:
    """The width of the terminal the output goes to (COLUMNS wins; FALLBACK_WIDTH in a pipe)."""
    return max(shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns, 20)


def gib_name(column: str) -> str:
    """The header of a byte column, whose cells are shown in GiB: ``mem_peak_bytes`` -> ``mem_peak_GiB``."""
    return column.removesuffix("_bytes") + "_GiB" if column.endswith("_bytes") else column


def is_serving(frame: pl.DataFrame) -> bool:
    """Rows of ``paraspace serve`` (TTFT and TPOT columns) rather than of a training sweep."""
    return "ttft_s" in frame.columns


def dimensions(frame: pl.DataFrame) -> tuple[str, ...]:
    """The strategy columns of ``frame``'s kind of result, in output order."""
    if is_serving(frame):
        from paraspace.results.serving_schema import STRATEGY

        return tuple(c.name for c in STRATEGY if c.name != "row_id")
    return DIMENSION_NAMES


def varying(frame: pl.DataFrame) -> tuple[list[str], dict[str, object]]:
    """The dimensions whose value differs between rows, and those held at one value (with it)."""
    differ, held = [], {}
    for name in dimensions(frame):
        if name not in frame.columns:
            continue
        if frame.height and frame[name].n_unique() == 1:
            held[name] = frame[name][0]
        else:
            differ.append(name)
    return differ, held


def _value_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def held_note(held: dict[str, object], serving: bool = False) -> str:
    """One note naming the dimensions every row shares: those off their default with the value,
    then those at it: ``same in every row: devices=64, zero=1; at their defaults: ep, tbo``
    (a serving result's with every value)."""
    if not held:
        return ""
    from paraspace.spaces.schema import Dimensions

    defaults = {} if serving else Dimensions().model_dump()
    at_default = [k for k, v in held.items() if (defaults.get(k) or (None,))[0] == v]
    valued = [f"{k}={_value_text(v)}" for k, v in held.items() if k not in at_default]
    parts = [", ".join(valued)] if valued else []
    if at_default:
        parts.append(f"at their defaults: {', '.join(at_default)}")
    return "same in every row: " + "; ".join(parts)


#: a cell whose value does not exist (null)
MISSING = "-"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(frame: pl.DataFrame, column: str, i: int) -> str:
    """One cell as text: null as ``MISSING``; the step time, MFU and byte columns in their units
    where they hold numbers (any other value, as a hand-made frame may hold, as it is)."""
    value = frame[column][i]
    if value is None:
        return MISSING
    if column == "feasible":
        if value:
            return "yes"
        reason = frame["infeasible_reason"][i] if "infeasible_reason" in frame.columns else None
        return f"no: {reason}" if reason not in (None, "ok") else "no"
    if isinstance(value, bool):
        return _value_text(value)
    if not _is_number(value):
        return str(value)
    if column == "step_time_s":
        return f"{value:.3f}"
    if column == "mfu":
        return f"{100 * value:.1f}%"
    if column.endswith("_bytes"):
        return f"{value / GIB:.1f}"
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _number(value: float) -> str:
    """A float with decimals by magnitude, so a column's values line up: 12,345 / 355.6 / 0.871 / 0.0156."""
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 0.1 or size == 0:
        return f"{value:.3f}"
    return f"{value:.4f}" if size >= 1e-3 else f"{value:.2e}"


def _band_cell(frame: pl.DataFrame, i: int) -> str:
    lo, hi = frame[BAND[0]][i], frame[BAND[1]][i]
    return f"{lo:.2f}-{hi:.2f}" if _is_number(lo) and _is_number(hi) else MISSING


#: headers shortened to keep the compact table narrow (the note spells out those shown)
SHORT_HEADERS = {"micro_batch": "mbs", "sequence_parallel": "sp", "recompute_layers": "rc_layers",
                 "offload_activations": "off_act", "offload_weights": "off_w", "tp_overlap": "tp_ovl",
                 "defer_grad_sync": "defer",
                 "ep_placement": "ep_place", "n_microbatches": "n_mb",
                 "mem_peak_bytes": "mem_GiB", "mfu": "MFU", "feasible": "fits", RANK: "#",
                 "attention_dp": "attn_dp", "prefill_tp": "p_tp", "prefill_instances": "p_inst",
                 "output_tokens_per_s_per_gpu": "tok/s/gpu", "output_tokens_per_s_per_user": "tok/s/user"}
#: short headers that need no legend
_PLAIN = ("mem_peak_bytes", "mfu", "feasible", RANK)


def _header(column: str, short: bool = True) -> str:
    if column == RANK or (short and column in SHORT_HEADERS):
        return SHORT_HEADERS[column]
    return gib_name(column)


def resolve_columns(frame: pl.DataFrame, names: Sequence[str]) -> list[str]:
    """``--columns`` entries as frame columns: names as the results spell them, ``rank``, and
    ``*_GiB`` for the byte columns; a ``ColumnError`` naming a close match otherwise."""
    by_name = ({c: c for c in frame.columns} | {gib_name(c): c for c in frame.columns} | {RANK: RANK}
               | {h: c for c, h in SHORT_HEADERS.items() if c in frame.columns or c == RANK})
    chosen = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if name not in by_name:
            close = difflib.get_close_matches(name, list(by_name), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ColumnError(f"command line: --columns {name!r}: expected a column of the results, e.g. "
                              f"row_id, tp, step_time_s, mem_peak_GiB (paraspace top --wide lists them all){hint}")
        chosen.append(by_name[name])
    if not chosen:
        raise ColumnError("command line: --columns = '': expected column names separated by commas, e.g. tp,pp,mfu")
    return chosen


def _console(buffer: io.StringIO, width: int) -> Console:
    return Console(file=buffer, width=width, color_system=None, force_terminal=False, legacy_windows=False,
                   soft_wrap=False)


#: two spaces between columns, a rule under the header, nothing else
_BOX = box.Box("    \n    \n ── \n    \n    \n    \n    \n    \n")


def _table(frame: pl.DataFrame, columns: list[str], band: bool, short: bool = False) -> Table:
    table = Table(box=_BOX, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0), collapse_padding=True)
    for column in columns:
        numeric = column not in SPACE_COLUMNS and frame.schema.get(column, pl.Int64).is_numeric()
        table.add_column(_header(column, short), justify="right" if numeric or column == RANK else "left", no_wrap=True)
        if band and column == "step_time_s":
            table.add_column("80% band", justify="right", no_wrap=True)
    for i in range(frame.height):
        cells = []
        for column in columns:
            cells.append(str(i + 1) if column == RANK else _cell(frame, column, i))
            if band and column == "step_time_s":
                cells.append(_band_cell(frame, i))
        table.add_row(*cells)
    return table


def _needed(table: Table) -> int:
    """The width ``table`` takes with no cell wrapped."""
    return _console(io.StringIO(), 1_000_000).measure(table).maximum


def _printed(renderable: Table | str, width: int) -> str:
    buffer = io.StringIO()
    _console(buffer, width).print(renderable, markup=False, highlight=False, emoji=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def frame_text(frame: pl.DataFrame, width: int | None = None) -> str:
    """Any small frame (``compare``'s columns side by side, a study's best trials) as a
    plain table at the terminal's width: every header whole, long cells folded rather
    than the table running past the edge. Where the headers alone are wider than the
    terminal the frame is printed expanded instead (psql's ``\\x``): one block per row,
    a line per column, name then value, so that no header is folded mid-word."""
    width = width or terminal_width()
    if frame.is_empty():
        return "(no rows)"
    if sum(len(column) + 2 for column in frame.columns) - 2 <= width:
        table = Table(box=_BOX, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0), collapse_padding=True)
        for column in frame.columns:
            table.add_column(column, justify="right" if frame.schema[column].is_numeric() else "left",
                             overflow="fold", min_width=len(column))
        for i in range(frame.height):
            table.add_row(*(_cell(frame, column, i) for column in frame.columns))
        return _printed(table, width)
    name_width = max(len(column) for column in frame.columns)
    blocks = [f"-[ {i + 1} ]-\n" + "\n".join(f"{column:<{name_width}}  {_cell(frame, column, i)}"
                                            for column in frame.columns) for i in range(frame.height)]
    return "\n".join(blocks)


def table_text(frame: pl.DataFrame, *, columns: Sequence[str] | None = None, wide: bool = False,
               width: int | None = None, extra: Sequence[str] = ()) -> str:
    """``frame``'s rows as a table for a terminal ``width`` columns wide (default: this terminal's).

    Default: the compact table (rank, row_id, a space/model column where rows hold several,
    the varying dimensions, step time and its band, MFU, memory in GiB, feasibility, then
    ``extra`` metrics), fitted to ``width`` and followed by the held-constant note.
    ``columns``: exactly those (``resolve_columns``). ``wide``: every column, unlimited width.
    """
    width = width or terminal_width()
    if frame.is_empty():
        return "(no rows)"
    if wide:
        shown = [RANK, *[c for c in frame.columns if c != "infeasible_reason" or "feasible" not in frame.columns]]
        table = _table(frame, shown, band=False)
        return _printed(table, _needed(table))
    if columns:
        return _printed(_table(frame, resolve_columns(frame, columns), band=False), width)
    differ, held = varying(frame)
    spaces = [c for c in SPACE_COLUMNS if c in frame.columns and frame[c].n_unique() > 1]
    metrics = [c for c in (*(SERVING_METRICS if is_serving(frame) else DEFAULT_METRICS), *extra)
               if c in frame.columns]
    metrics = list(dict.fromkeys(metrics))
    band = all(c in frame.columns for c in BAND)
    dims = list(differ)
    # what goes first when too wide: the other dimensions from the last, the band, then the core ones
    drop_order = [d for d in reversed(dims) if d not in CORE_DIMENSIONS]
    dropped: list[str] = []
    while True:
        table = _table(frame, [RANK, "row_id", *spaces, *dims, *metrics], band, short=True)
        if _needed(table) <= width:
            break
        if drop_order:
            name = drop_order.pop(0)
            dims.remove(name)
            dropped.append(name)
        elif band:
            band = False
        elif len(dims) > 1:
            dropped.append(dims.pop())
        else:
            break  # rich folds what still does not fit; no line is longer than width
    for name in list(reversed(dropped)):  # room left once the band went: take back what fits, first ones first
        trial = [d for d in differ if d in dims or d == name]
        trial_table = _table(frame, [RANK, "row_id", *spaces, *trial, *metrics], band, short=True)
        if _needed(trial_table) <= width:
            dims, table = trial, trial_table
            dropped.remove(name)
    text = _printed(table, width)
    shown = [RANK, "row_id", *spaces, *dims, *metrics]
    abbreviated = [f"{SHORT_HEADERS[c]} = {c}" for c in shown if c in SHORT_HEADERS and c not in _PLAIN]
    notes = [held_note(held, is_serving(frame))] + (["columns: " + ", ".join(abbreviated)] if abbreviated else [])
    hidden = list(reversed(dropped)) + (["80% band"] if all(c in frame.columns for c in BAND) and not band else [])
    if hidden:
        notes.append(f"not shown (too narrow): {', '.join(hidden)}; "
                     "see them with --columns or --wide")
    note_text = _printed("\n".join(n for n in notes if n), width)
    return f"{text}\n{note_text}" if note_text else text


def parse_columns(text: str | None) -> list[str] | None:
    """``--columns a,b,c`` as a list (None when not given)."""
    return None if text is None else [part.strip() for part in text.split(",")]


# --------------------------------------------------------------------------- first run


def kernel_cache_dir() -> Path:
    """Where numba keeps the compiled kernels (the policy in ``kernels.jit`` picks the folder)."""
    import numba

    from paraspace.kernels import jit

    kernels = os.path.dirname(os.path.abspath(jit.__file__))
    if numba.config.CACHE_DIR:  # numba's user-provided locator: CACHE_DIR / parentdir_sha1(dirname)
        return Path(numba.config.CACHE_DIR) / f"{Path(kernels).name}_{hashlib.sha1(kernels.encode()).hexdigest()}"
    return Path(kernels) / "__pycache__"


#: the row kernels every evaluation compiles first (module.function, as numba names the index files)
ENTRY_KERNELS = ("training.grouped_rows", "event_tier.simulate_rows")
_announced = False


def kernels_need_compiling() -> bool:
    """True when numba has no cached machine code for the row kernels yet (a first run, or
    the kernels changed): their index files are missing from ``kernel_cache_dir``."""
    import numba

    if numba.config.DISABLE_JIT:
        return False
    folder = kernel_cache_dir()
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    return not all(any(folder.glob(f"{name}-*.{tag}.nbi")) for name in ENTRY_KERNELS)


def announce_compile(echo: Callable[[str], object]) -> bool:
    """Say once per process, through ``echo`` (stderr), that the kernels compile now; True if said."""
    global _announced
    if _announced or not kernels_need_compiling():
        return False
    _announced = True
    echo(f"compiling kernels once, about a minute; later runs start in seconds (cache: {kernel_cache_dir()})")
    return True
