"""Pipeline schedules in closed form: the pipeline time of GPipe, 1F1B,
interleaved 1F1B, ZB-H1, DualPipe and PipeDream generalised to unequal stages,
the pipeline messages on the fill and drain path, and the micro-batch chunks a
device holds at its memory peak. The event tier (``kernels.pipeline``) runs the
same schedules task by task and agrees with these in the degenerate cases."""

from __future__ import annotations

from paraspace.kernels.codes import SCHEDULE_DUALPIPE, SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_PIPEDREAM, \
    SCHEDULE_ZB_H1
from paraspace.kernels.jit import jit
from paraspace.kernels.stage_pass import stage_pass_s


@jit(inline=True)
def in_flight_chunks(schedule: int, p: float, v: float, m: float, stage: float) -> float:
    """Micro-batch chunks whose activations a device holds at its peak.

    GPipe: all m. 1F1B: p - stage (at most m). ZB-H1: p on every stage (the
    p - stage of 1F1B plus the stage micro-batches whose W it defers; Qi et al.
    2023: ZB-H1's peak memory equals 1F1B's), counting a micro-batch until its W,
    conservatively with all its activations. Interleaved (Megatron-LM's
    warm-up count + 1): 2 (p - stage - 1) + (v - 1) p + 1 chunks of 1/v of the
    device's layers (at most m v), i.e. p (1 + (p-1)/(p v)) stage-equivalents
    on the first stage (Narayanan et al. 2021, section 2.2). DualPipe: p + 1
    one-stage chunks on every device (DeepSeek-V3, Table 2; at most m).
    PipeDream (asynchronous 1F1B): p - stage whatever m, as no flush drains the
    pipeline between steps. Returned in chunks; divide by v for stage-equivalents.
    """
    if schedule == SCHEDULE_GPIPE:
        return m
    if schedule == SCHEDULE_INTERLEAVED:
        return min(2.0 * (p - stage - 1.0) + (v - 1.0) * p + 1.0, m * v)
    if schedule == SCHEDULE_DUALPIPE:  # DeepSeek-V3 Table 2: p + 1 chunks of one stage on every device
        return min(p + 1.0, m)
    if schedule == SCHEDULE_PIPEDREAM:  # no flush: the next step's micro-batches keep the pipeline full
        return p - stage
    if schedule == SCHEDULE_ZB_H1:  # stage d also holds the d micro-batches whose W it defers
        return min(p, m)
    return min(p - stage, m)



@jit
def dualpipe_steady_s(pp: int, model, costs, recompute: int, rc_layers) -> float:
    """A DualPipe device's steady work per micro-batch: it runs m/2 micro-batches
    through each of its two stages (d and p-1-d), so m (t_d + t_(p-1-d)) / 2 in
    all: the heavy first and last stages share device 0, not m t_max each."""
    t_steady = 0.0
    for dd in range(pp // 2):
        f0, b0, _, _, _, _, _, _ = stage_pass_s(dd, pp, model, costs, recompute, rc_layers)
        f1, b1, _, _, _, _, _, _ = stage_pass_s(pp - 1 - dd, pp, model, costs, recompute, rc_layers)
        t_steady = max(t_steady, 0.5 * (f0 + b0 + f1 + b1))
    return t_steady


@jit(inline=True)
def zb_h1_moved_w_s(pp: int, m: float, bn) -> float:
    """The weight-gradient (W) seconds ZB-H1 takes out of its fill and drain
    (Qi et al. 2023). For m >= p on equal stages the bubble is (p - 1)(F + B - W),
    1F1B's (p - 1)(F + B + W) less 2 (p - 1) W: the other stages defer their W
    off the critical path ((p - 1) W), and the busiest device fills as much of
    its wait with its own W passes. With fewer micro-batches it has m - 1 W
    passes to fill with (its last W ends the step): (m + p - 1)(F + B) + W in
    all, which the event tier reproduces for every m (tests/test_pipeline.py).
    Over unequal stages the other stages' own W seconds are moved (w_sum - wgrad)."""
    if pp <= 1:
        return 0.0
    others = bn.w_sum - bn.wgrad
    return others * (1.0 + zb_h1_own_share(pp, m))


@jit(inline=True)
def zb_h1_own_share(pp: int, m: float) -> float:
    """The share of the other stages' W seconds that the busiest device fills its
    own wait with: 1 from m = p micro-batches, (m - 1) / (p - 1) below."""
    return min(m - 1.0, pp - 1.0) / (pp - 1.0)


@jit(inline=True)
def busy_s(schedule: int, pp: int, m: float, bn) -> float:
    """Seconds of its m micro-batches a device spends on passes, which data-parallel
    traffic can hide behind. ZB-H1 runs some of the busiest device's W passes in
    its pipeline wait instead (``zb_h1_moved_w_s``): they cost no time when the
    step is paced by its compute, and hide no traffic when it is paced by the
    data-parallel traffic."""
    busy = m * bn.t_max
    if schedule == SCHEDULE_ZB_H1 and pp > 1:
        busy -= (bn.w_sum - bn.wgrad) * zb_h1_own_share(pp, m)
    return busy


@jit(inline=True)
def pipeline_s(schedule: int, pp: int, v: float, m: float, bn, model, costs, recompute: int, rc_layers):
    """(pipeline time, the busiest device's steady work per micro-batch) of ``m``
    micro-batches over stages whose bottleneck is ``bn`` (``Bottleneck``)."""
    t_max = bn.t_max
    t_sum = bn.t_sum
    t_steady = t_max  # the busiest device's work per micro-batch
    if schedule == SCHEDULE_INTERLEAVED:
        pipe = m * t_max + (t_sum - t_max) / v
    elif schedule == SCHEDULE_ZB_H1:  # W passes fill the fill and drain: (p-1)(F+B-W) instead of (p-1)(F+B+W)
        pipe = m * t_max + max(0.0, t_sum - t_max - zb_h1_moved_w_s(pp, m, bn))
    elif schedule == SCHEDULE_DUALPIPE:  # DeepSeek-V3 Table 2: (p/2-1)(F&B + B - 3W), B the full backward, here
        # F&B = F + B (not overlapped); (p/2-1) t generalised as (t_sum - 2 t_max)/2. Published for m >= 2p:
        # never below one micro-batch's round trip through every stage (t_sum)
        t_steady = dualpipe_steady_s(pp, model, costs, recompute, rc_layers)
        pipe = m * t_steady + max(0.0, t_sum - 2.0 * t_max) / 2.0 * max(0.0, t_max + bn.bwd - 3.0 * bn.wgrad) / t_max
        pipe = max(pipe, t_sum)
    elif schedule == SCHEDULE_PIPEDREAM:  # asynchronous, no flush: the fill and drain happen once per run
        pipe = m * t_max
    else:
        pipe = m * t_max + (t_sum - t_max)
    return pipe, t_steady


@jit(inline=True)
def pp_comm_s(schedule: int, p: float, v: float, p2p: float) -> float:
    """Pipeline sends on the fill and drain path: 2 (p - 1) messages, v times as
    many with interleaving."""
    return 2.0 * (p - 1.0) * p2p * (v if schedule == SCHEDULE_INTERLEAVED else 1.0)
