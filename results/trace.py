"""Exports of one configuration's simulated timeline.

Chrome trace / Perfetto JSON (open it in ui.perfetto.dev or chrome://tracing):
one process per pipeline stage's device, one thread per stream (compute, and
one per link tier), complete events (``"ph": "X"``, ``ts``/``dur`` in
microseconds) named by kind and micro-batch, with kind, micro-batch and chunk
in ``args``. And a static Gantt picture (PNG) of the same tasks.

Both files follow the output rules of ``results.writer``: each is staged as
``NAME.partial`` and renamed into place (an interrupt never leaves a truncated
trace), and an existing file is replaced only when it is an earlier trace of
ours. Ours are marked: the JSON begins with ``TRACE_START`` (a first key that
Perfetto and chrome://tracing ignore, as they ignore the other top-level keys
profilers add), the PNG has the text chunk ``Software: paraspace trace``. The
command line checks both targets before it simulates (``check_trace_files``)
and writes them together (``written_together``): a run that fails replaces
neither. The serving exports (``results.serving_trace``) write through
``write_text`` and ``save_png`` too.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraspace.results.rank import ResultsError
from paraspace.results.writer import check_replaceable, check_writable, partial_path, publish, writing

#: what every trace JSON of ours begins with (``write_text`` puts it there): its first key and value
TRACE_START = '{"generator": "paraspace trace"'
JSON_KIND = "trace JSON written by paraspace trace"
#: the first eight bytes of every PNG file
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: the PNG text chunk (keyword, value) that marks a Gantt picture of ours (``save_png`` writes it)
PNG_MARK = ("Software", "paraspace trace")
PNG_KIND = "Gantt PNG written by paraspace trace"
#: bytes of a PNG searched for the mark: the text chunks matplotlib writes come right after the header
PNG_HEAD_BYTES = 1 << 16


@dataclass(frozen=True)
class Timeline:
    """Every task of one simulated step."""

    device: np.ndarray  # int: pipeline stage's device
    stream: np.ndarray  # int: index into stream_names
    kind: np.ndarray  # int: index into kind_names
    micro: np.ndarray  # int: micro-batch, -1 for none
    chunk: np.ndarray  # int: virtual chunk, -1 for none
    start_s: np.ndarray
    end_s: np.ndarray
    stream_names: tuple[str, ...]
    kind_names: tuple[str, ...]
    title: str

    @property
    def step_s(self) -> float:
        return float(self.end_s.max()) if self.end_s.size else 0.0


def _label(tl: Timeline, i: int) -> str:
    name = tl.kind_names[tl.kind[i]]
    if tl.micro[i] >= 0:
        name += f" {tl.micro[i]}"
    if tl.chunk[i] > 0:
        name += f".{tl.chunk[i]}"
    return name


def chrome_trace(tl: Timeline) -> dict:
    """The timeline as a Chrome trace event dictionary."""
    events: list[dict] = []
    for dev in np.unique(tl.device):
        events.append({"ph": "M", "name": "process_name", "pid": int(dev), "args": {"name": f"stage {dev}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(dev), "args": {"sort_index": int(dev)}})
        for s, stream in enumerate(tl.stream_names):
            events.append({"ph": "M", "name": "thread_name", "pid": int(dev), "tid": s, "args": {"name": stream}})
    order = np.lexsort((tl.stream, tl.device, tl.start_s))
    for i in order:
        events.append({
            "name": _label(tl, i),
            "cat": tl.kind_names[tl.kind[i]],
            "ph": "X",
            "ts": float(tl.start_s[i]) * 1e6,
            "dur": float(tl.end_s[i] - tl.start_s[i]) * 1e6,
            "pid": int(tl.device[i]),
            "tid": int(tl.stream[i]),
            "args": {"kind": tl.kind_names[tl.kind[i]], "micro_batch": int(tl.micro[i]), "chunk": int(tl.chunk[i])},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": tl.title, "step_s": tl.step_s}}


def write_chrome_trace(tl: Timeline, path: str | Path) -> Path:
    return write_text(json.dumps(chrome_trace(tl)), path)


def write_text(text: str, path: str | Path) -> Path:
    """A Chrome trace's JSON ``text`` (one object) written to ``path`` atomically, marked as ours
    (``TRACE_START``); an existing ``path`` is replaced only where it is an earlier trace JSON of
    ours. A ``ResultsError`` naming the path when it cannot be (``results.writer.writing``)."""
    body = text.lstrip()
    if not body.startswith("{"):
        raise ValueError("write_text: expected the JSON text of one object (a Chrome trace)")
    rest = body[1:].lstrip()
    marked = TRACE_START + ("" if rest.startswith("}") else ", ") + rest
    return _staged(Path(path), check_trace_json, lambda staged: staged.write_text(marked, encoding="utf-8"))


def check_trace_json(path: str | Path) -> None:
    """Refuse, with a ``ResultsError`` naming ``path``, to write a trace JSON over anything but a new
    file, an empty one or an earlier trace JSON of ours (``results.writer.check_writable``)."""
    check_writable(path, starts_with=TRACE_START.encode(), kind=JSON_KIND)


def check_trace_png(path: str | Path) -> None:
    """Refuse, with a ``ResultsError`` naming ``path``, to write a Gantt PNG over anything but a new
    file, an empty one or an earlier Gantt PNG of ours (a PNG with the text chunk ``PNG_MARK``)."""
    path = Path(path)
    check_replaceable(path, starts_with=PNG_SIGNATURE, kind=PNG_KIND)  # a folder, unreadable, not a PNG
    if path.is_file() and path.stat().st_size and not png_is_ours(path):
        key, value = PNG_MARK
        raise ResultsError(f"{path}: output file = {str(path)!r}: expected a new file or an earlier {PNG_KIND} to "
                           f"replace (it is a PNG without the text '{key}: {value}' that marks ours; refusing to "
                           "overwrite it, nothing written: give another --out or remove the file)")
    check_writable(path, starts_with=PNG_SIGNATURE, kind=PNG_KIND)


def check_trace_files(json_path: str | Path, png_path: str | Path) -> None:
    """Both files of a trace checked (``check_trace_json``, ``check_trace_png``) before anything is
    simulated or written: an unusable or foreign target fails the run in a second, replacing nothing."""
    check_trace_json(json_path)
    check_trace_png(png_path)


def png_is_ours(path: str | Path) -> bool:
    """Whether the PNG at ``path`` has the text chunk ``PNG_MARK`` (its value followed by anything,
    such as the matplotlib version) among the chunks before its image data, in its first
    ``PNG_HEAD_BYTES`` bytes."""
    with open(path, "rb") as handle:
        head = handle.read(PNG_HEAD_BYTES)
    wanted = "\0".join(PNG_MARK).encode("latin-1")
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(head):
        length, kind = struct.unpack(">I4s", head[pos:pos + 8])
        if kind in (b"IDAT", b"IEND"):
            break
        if kind == b"tEXt" and head[pos + 8:pos + 8 + length].startswith(wanted):
            return True
        pos += 12 + length  # length, type, data, CRC
    return False


#: the files staged within ``written_together``: (staged, target, check); None outside it
_together: ContextVar[list[tuple[Path, Path, Callable[[Path], None]]] | None] = ContextVar("paraspace_trace_files",
                                                                                         default=None)


@contextlib.contextmanager
def written_together() -> Iterator[None]:
    """Within the block, ``write_text`` and ``save_png`` stage their files and rename none into
    place; when the block ends normally every target is checked again, then all are renamed, back
    to back. An error or an interrupt within the block (or in a check) replaces none of them, and
    every staged file is removed: a failed trace never leaves a new JSON beside an old PNG."""
    staged: list[tuple[Path, Path, Callable[[Path], None]]] = []
    try:
        token = _together.set(staged)
        try:
            yield
        finally:
            _together.reset(token)
        for _, target, check in staged:
            check(target)  # again: something else may have been written there meanwhile
        for part, target, _ in staged:
            with writing(target):
                publish(part, target)
    finally:  # gone once renamed; else (an error, an interrupt at any point) nothing half done stays
        for part, _, _ in staged:
            part.unlink(missing_ok=True)


def _staged(path: Path, check: Callable[[Path], None], write: Callable[[Path], object]) -> Path:
    """``path`` written by ``write`` into its staging file ``NAME.partial``, then renamed onto it
    (``results.writer.publish``) after ``check`` passes, or handed to ``written_together``. The staged
    file is removed on any error or interrupt; ``path`` keeps what it held."""
    check(path)
    part = partial_path(path)
    batch = _together.get()
    handed = False
    try:
        with writing(path):
            write(part)
        if batch is not None:
            batch.append((part, path, check))
            handed = True
        else:
            check(path)  # again: something else may have been written there meanwhile
            with writing(path):
                publish(part, path)
    finally:
        if not handed:  # renamed, or an error or interrupt: no staged file stays behind
            part.unlink(missing_ok=True)
    return path


#: colours by kind name (forward light, backward dark, communication muted)
COLOURS = {"forward": "#4c9be8", "backward": "#1f4e8c", "weight_grad": "#7a5cc7", "optimizer": "#e8a14c",
           "compute": "#999999", "pp": "#55b36b", "dp": "#d9534f", "tp": "#f0c419", "cp": "#8c564b", "ep": "#17becf"}


def write_gantt_png(tl: Timeline, path: str | Path, *, label_micro: bool = True) -> Path:
    """A Gantt chart: one row per (device, stream) that has tasks, time in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = sorted({(int(d), int(s)) for d, s in zip(tl.device, tl.stream)})
    index = {r: k for k, r in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.6))
    for i in range(tl.start_s.size):
        y = index[(int(tl.device[i]), int(tl.stream[i]))]
        x0 = tl.start_s[i] * 1e3
        w = (tl.end_s[i] - tl.start_s[i]) * 1e3
        kind = tl.kind_names[tl.kind[i]]
        ax.broken_barh([(x0, w)], (y - 0.4, 0.8), facecolors=COLOURS.get(kind, "#999999"), edgecolor="white",
                       linewidth=0.3)
        if label_micro and tl.micro[i] >= 0 and w > tl.step_s * 1e3 / 150:
            ax.text(x0 + w / 2, y, str(tl.micro[i]), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"stage {d} {tl.stream_names[s]}" for d, s in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(tl.title, fontsize=10)
    kinds = sorted({tl.kind_names[k] for k in np.unique(tl.kind)})
    ax.legend(handles=[Patch(color=COLOURS.get(k, "#999999"), label=k) for k in kinds], loc="upper right",
              fontsize=7, ncol=len(kinds))
    return save_png(fig, path)


def save_png(fig: Any, path: str | Path) -> Path:
    """Lay out a matplotlib figure, write it to ``path`` (its folder made) at the Gantt charts'
    resolution, marked as ours (``PNG_MARK``) and atomically as ``write_text`` writes, and close it."""
    import matplotlib
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        key, value = PNG_MARK
        mark = {key: f"{value} (matplotlib {matplotlib.__version__})"}
        return _staged(Path(path), check_trace_png,
                       lambda staged: fig.savefig(staged, format="png", dpi=110, metadata=mark))
    finally:
        plt.close(fig)
