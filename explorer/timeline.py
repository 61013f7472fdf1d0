"""Timeline capture: simulate one configuration and keep every task."""

from __future__ import annotations

import numpy as np

from paraspace.explorer.evaluate import Packed, ScheduleError, kernel_strategy
from paraspace.kernels.codes import SCHEDULE_PIPEDREAM
from paraspace.kernels.engine import KIND_NAMES, OK, simulate
from paraspace.kernels.event_tier import DEFAULT_BUCKETS, row_graph
from paraspace.kernels.pipeline import steady_span_ns, streams_per_device
from paraspace.results.trace import Timeline
from paraspace.spaces.catalog import LoadedSpace
from paraspace.spaces.enums import Schedule, label
from paraspace.spaces.schema import Hardware

NS = 1e9


def stream_names(hw: Hardware) -> tuple[str, ...]:
    """Per device: the compute stream, then per link tier the critical stream (pipeline
    sends, EP traffic), then per link tier the data-parallel stream (``kernels.pipeline``)."""
    return ("compute", *(link.name for link in hw.links), *(f"{link.name} dp" for link in hw.links))


def capture(space: LoadedSpace, packed: Packed, row: dict[str, int], *, n_buckets: int = DEFAULT_BUCKETS) -> Timeline:
    """Simulate one encoded row (strategy values as ints, plus n_microbatches) with capture on."""
    g = row_graph(*kernel_strategy(row), packed.model[0], packed.device[0], packed.tiers, packed.tiles,
                  packed.workload[0], n_buckets)
    dur, res, kind, stage, micro, chunk, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, n_res = g
    start = np.empty(dur.shape[0], dtype=np.int64)
    end = np.empty(dur.shape[0], dtype=np.int64)
    status = simulate(dur, res, kind, sync, succ_ptr, succ_idx, n_pred, order_ptr, order_idx, start, end)
    if status != OK:
        stuck = np.flatnonzero(end < 0)[:10]
        names = [f"{KIND_NAMES[kind[i]]}(stage {stage[i]}, micro {micro[i]}, chunk {chunk[i]})" for i in stuck]
        raise ScheduleError(f"schedule deadlocked; {int((end < 0).sum())} tasks never ran, e.g. {', '.join(names)}")
    per_device = streams_per_device(packed.tiers.shape[0])
    spec = space.spec
    step_ns = end.max()
    if row["schedule"] == SCHEDULE_PIPEDREAM:  # one steady-state period, staggered over the devices
        step_ns = steady_span_ns(res, start, end, row["pp"], packed.tiers.shape[0])
    title = (f"{space.model.name} on {spec.devices_text} x {space.hardware.name}: "
             + " ".join(f"{k}={row[k]}" for k in ("tp", "pp", "dp", "cp", "vpp", "micro_batch"))
             + f" {label(Schedule(row['schedule']))}, m={row['n_microbatches']}, step {step_ns / NS * 1e3:.1f} ms")
    return Timeline(
        device=stage.astype(np.int64), stream=(res % per_device).astype(np.int64), kind=kind.astype(np.int64),
        micro=micro.astype(np.int64), chunk=chunk.astype(np.int64), start_s=start / NS, end_s=end / NS,
        stream_names=stream_names(space.hardware), kind_names=KIND_NAMES, title=title,
    )
