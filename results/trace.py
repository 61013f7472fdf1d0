"""Exports of one configuration's simulated timeline.

Chrome trace / Perfetto JSON (open it in ui.perfetto.dev or chrome://tracing):
one process per pipeline stage's device, one thread per stream (compute, and
one per link tier), complete events (``"ph": "X"``, ``ts``/``dur`` in
microseconds) named by kind and micro-batch, with kind, micro-batch and chunk
in ``args``. And a static Gantt picture (PNG) of the same tasks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraspace.results.writer import ensure_folder, writing


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
    """``text`` written to ``path`` (its folder made); a ``ResultsError`` naming the path when
    it cannot be (``results.writer.writing``)."""
    path = Path(path)
    ensure_folder(path.parent)
    with writing(path):
        path.write_text(text)
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
    """Lay out a matplotlib figure, write it to ``path`` (its folder made) at the
    Gantt charts' resolution and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    try:
        ensure_folder(path.parent)
        with writing(path):
            fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path
