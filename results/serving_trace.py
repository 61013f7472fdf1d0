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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(tl), allow_nan=False))
    return path
