"""Export of one simulated serving deployment (``explorer.serve_timeline``) as a
Chrome trace / Perfetto JSON file (open it in ui.perfetto.dev).

The conventions of ``results.trace``: complete events (``"ph": "X"``,
``ts``/``dur`` in microseconds), one process per device group, named by
metadata events. Here a process is an engine (the aggregated engine simulated,
or a disaggregated deployment's prefill replicas and decode engines) with:

* thread 0, ``iterations``: one slice per engine iteration, named prefill,
  decode or mixed (decode steps with prompt chunks), its token, request and
  cache counts in ``args``; an engine runs one iteration at a time, so its
  slices never overlap;
* thread 1, ``ep all-to-all``, where the engine has expert-parallel traffic
  (attention DP over ep > 1 ranks): one slice from each iteration's start
  lasting the seconds its MoE layers spend in the EP dispatch and combine,
  summed over the layers (they interleave with the compute in reality);
* a counter track ``kv cache tokens``: at each iteration's start its
  high-water mark of cached tokens (``cached``; decode engines of a
  disaggregated deployment also ``reserved``, their admitted requests' whole
  sequences), 0 after the engine's last iteration;
* the KV transfers of a disaggregated deployment as async slices (``"ph"``
  ``b``/``e``, one id a request) on the sending prefill replica, so that
  concurrent transfers may overlap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraspace.results.trace import save_png, write_text

US = 1e6
ITERATIONS_TID = 0
EP_TID = 1
KV_COUNTER = "kv cache tokens"
#: event kinds, as ``kernels.serving_sim`` codes them (LOG_PREFILL .. LOG_TRANSFER)
KIND_NAMES = ("prefill", "decode", "mixed", "kv transfer")
TRANSFER = 3


@dataclass(frozen=True)
class ServingTimeline:
    """Every iteration (and KV transfer) of one simulated serving deployment, one entry an event."""

    engine: np.ndarray  # int: the engine (process); a transfer: the sending prefill replica
    kind: np.ndarray  # int: index into KIND_NAMES
    start_s: np.ndarray
    end_s: np.ndarray
    tokens: np.ndarray  # rows through the layers (a transfer: prompt tokens whose cache moves)
    requests: np.ndarray
    prompt_tokens: np.ndarray
    kv_tokens: np.ndarray  # the engine's cached tokens at the iteration's high-water mark
    kv_reserved_tokens: np.ndarray  # disaggregated decode engines: reserved by admitted requests (else 0)
    peer: np.ndarray  # int: a transfer's decode engine, else -1
    request: np.ndarray  # int: a transfer's request, else -1
    ep_s: np.ndarray  # the iteration's EP dispatch + combine seconds (NaN: no EP traffic)
    engine_names: tuple[str, ...]
    kv_capacity_tokens: tuple[float, ...]  # by engine
    result: dict[str, float]  # the simulation's outputs
    strategy: dict[str, Any]
    title: str


def chrome_trace(tl: ServingTimeline) -> dict:
    """The timeline as a Chrome trace event dictionary (module doc)."""
    events: list[dict] = []
    has_ep = {int(e) for e in tl.engine[np.isfinite(tl.ep_s)]}
    for pid, name in enumerate(tl.engine_names):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": ITERATIONS_TID,
                       "args": {"name": "iterations"}})
        if pid in has_ep:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": EP_TID,
                           "args": {"name": "ep all-to-all"}})
    last_end: dict[int, float] = {}
    for i in np.lexsort((tl.engine, tl.start_s)):
        pid = int(tl.engine[i])
        kind = int(tl.kind[i])
        start, end = float(tl.start_s[i]), float(tl.end_s[i])
        if kind == TRANSFER:
            request = int(tl.request[i])
            name = f"kv transfer {request} -> {tl.engine_names[int(tl.peer[i])]}"
            common = {"name": name, "cat": "kv transfer", "id": request, "pid": pid, "tid": ITERATIONS_TID}
            events.append({**common, "ph": "b", "ts": start * US,
                           "args": {"prompt_tokens": float(tl.tokens[i]), "to_engine": int(tl.peer[i])}})
            events.append({**common, "ph": "e", "ts": end * US})
            continue
        name = KIND_NAMES[kind]
        events.append({"name": name, "cat": name, "ph": "X", "ts": start * US, "dur": (end - start) * US,
                       "pid": pid, "tid": ITERATIONS_TID,
                       "args": {"tokens": float(tl.tokens[i]), "requests": float(tl.requests[i]),
                                "prompt_tokens": float(tl.prompt_tokens[i]), "kv_tokens": float(tl.kv_tokens[i])}})
        if np.isfinite(tl.ep_s[i]):
            events.append({"name": "ep dispatch+combine", "cat": "ep", "ph": "X", "ts": start * US,
                           "dur": float(tl.ep_s[i]) * US, "pid": pid, "tid": EP_TID,
                           "args": {"tokens": float(tl.tokens[i]), "of_iteration_s": end - start}})
        counter = {"cached": float(tl.kv_tokens[i])}
        if tl.kv_reserved_tokens[i] > 0:
            counter["reserved"] = float(tl.kv_reserved_tokens[i])
        events.append({"name": KV_COUNTER, "ph": "C", "ts": start * US, "pid": pid, "args": counter})
        last_end[pid] = max(last_end.get(pid, 0.0), end)
    for pid, end in sorted(last_end.items()):
        events.append({"name": KV_COUNTER, "ph": "C", "ts": end * US, "pid": pid, "args": {"cached": 0.0}})
    other = {"title": tl.title, "strategy": tl.strategy, "kv_capacity_tokens": list(tl.kv_capacity_tokens),
             "simulation": {k: (v if np.isfinite(v) else None) for k, v in tl.result.items()}}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(tl: ServingTimeline, path: str | Path) -> Path:
    return write_text(json.dumps(chrome_trace(tl), allow_nan=False), path)


#: bar colours by event kind (KIND_NAMES), as the training Gantt colours its kinds
KIND_COLOURS = {"prefill": "#e8a14c", "decode": "#4c9be8", "mixed": "#7a5cc7", "kv transfer": "#55b36b"}


def gantt_rows(tl: ServingTimeline) -> list[tuple[int, bool]]:
    """The Gantt's rows, top to bottom: (engine, transfers?) for every engine with
    iterations, followed by its KV transfers' row where it sent any."""
    rows = []
    for engine in range(len(tl.engine_names)):
        mine = tl.engine == engine
        if (mine & (tl.kind != TRANSFER)).any():
            rows.append((engine, False))
        if (mine & (tl.kind == TRANSFER)).any():
            rows.append((engine, True))
    return rows


#: iterations the zoomed Gantt spans (typical iterations, from the middle of the run)
ZOOM_ITERATIONS = 40


def zoom_window(tl: ServingTimeline) -> tuple[float, float]:
    """The zoomed Gantt's time window: ``ZOOM_ITERATIONS`` median iterations long,
    starting at the middle of the run (its steady state, away from the start-up)."""
    work = tl.kind != TRANSFER
    if not work.any():
        return 0.0, 0.0
    end = float(tl.end_s[work].max())
    width = ZOOM_ITERATIONS * float(np.median(tl.end_s[work] - tl.start_s[work]))
    lo = 0.5 * end
    return lo, min(lo + width, end)


def _draw_gantt(ax: Any, tl: ServingTimeline, rows: list[tuple[int, bool]], lo: float, hi: float,
                edges: bool) -> None:
    """The events of ``rows`` overlapping [lo, hi] as bars, one ``broken_barh`` call per
    row and kind (a hundred thousand iterations draw in seconds); ``edges`` outlines each
    bar so that neighbouring iterations stay apart."""
    inside = (tl.end_s >= lo) & (tl.start_s <= hi)
    for y, (engine, transfers) in enumerate(rows):
        mine = inside & (tl.engine == engine) & ((tl.kind == TRANSFER) if transfers else (tl.kind != TRANSFER))
        for kind in np.unique(tl.kind[mine]):
            sel = mine & (tl.kind == kind)
            bars = list(zip(tl.start_s[sel], tl.end_s[sel] - tl.start_s[sel]))
            height = (y - 0.15, 0.3) if transfers else (y - 0.4, 0.8)
            ax.broken_barh(bars, height, facecolors=KIND_COLOURS[KIND_NAMES[int(kind)]],
                           edgecolor="white" if edges else "none", linewidth=0.4 if edges else 0.0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{tl.engine_names[e]}{' transfers' if t else ''}" for e, t in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)


def write_gantt_png(tl: ServingTimeline, path: str | Path) -> Path:
    """A picture of the run, three panels over time in seconds from the first arrival:
    the Gantt of the whole run, one row per engine (its iterations, coloured prefill /
    decode / mixed) and, under each prefill replica, a row of the KV transfers it sent
    (overlapping transfers drawn over each other); the same Gantt zoomed on
    ``zoom_window`` (every iteration outlined); and each engine's KV cache occupancy
    (cached tokens at each iteration's high-water mark over the engine's capacity)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = gantt_rows(tl)
    height = max(len(rows), 2)
    fig, (ax, zoom, kv) = plt.subplots(3, 1, figsize=(14, 0.9 * len(rows) + 5.5),
                                       gridspec_kw={"height_ratios": [height, height, 3]})
    end = float(tl.end_s.max()) if tl.end_s.size else 0.0
    _draw_gantt(ax, tl, rows, 0.0, end, edges=False)
    ax.set_title("\n".join(textwrap.wrap(tl.title, 160)), fontsize=9)
    kinds = [KIND_NAMES[k] for k in sorted({int(k) for k in np.unique(tl.kind)})]
    ax.legend(handles=[Patch(color=KIND_COLOURS[k], label=k) for k in kinds], loc="upper right", fontsize=7,
              ncol=len(kinds))
    lo, hi = zoom_window(tl)
    _draw_gantt(zoom, tl, rows, lo, hi, edges=True)
    if hi > lo:
        zoom.set_xlim(lo, hi)
    zoom.set_title(f"zoom: {lo:.4g} s to {hi:.4g} s ({ZOOM_ITERATIONS} typical iterations)", fontsize=8)
    for engine, name in enumerate(tl.engine_names):
        sel = (tl.engine == engine) & (tl.kind != TRANSFER)
        cap = tl.kv_capacity_tokens[engine]
        if sel.any() and cap > 0:
            order = np.argsort(tl.start_s[sel], kind="stable")
            kv.step(tl.start_s[sel][order], tl.kv_tokens[sel][order] / cap, where="post", linewidth=0.8, label=name)
    kv.set_xlim(ax.get_xlim())
    kv.set_ylim(0.0, 1.05)
    kv.set_ylabel("KV cache used", fontsize=8)
    kv.set_xlabel("time (s)")
    if len(tl.engine_names) <= 12:
        kv.legend(loc="upper right", fontsize=7, ncol=min(len(tl.engine_names), 6))
    return save_png(fig, path)
