"""Iteration-level discrete-event simulation of a serving engine's scheduler,
vectorised over configurations (``prange``), for the best candidates of the
analytic tier (issue 15; modeling.md section 8).

One configuration is one engine (``kernels.serving``): ``n`` requests with the
given prompt / output lengths arrive in a closed loop (``clients`` users, each
sending request k + clients when one finishes) or as a Poisson stream (unit
exponential gaps over the engine's rate). Every iteration, at time t:

1. arrivals up to t join the FIFO queue;
2. admission, in queue order, while the engine runs fewer than ``max_batch``
   requests and the KV cache can take the request's prompt (plus the tokens it
   had generated, when it was preempted); the static scheduler admits only
   into an empty engine; with the overlap scheduler (TensorRT-LLM's default,
   SGLang's zero-overhead scheduler) a busy engine scheduled this iteration
   while the previous one ran, so it admits only requests that had arrived
   before the previous iteration started (an arrival waits one iteration more;
   a closed-loop user's next request, sent when its last token is reported,
   which the engine does after launching the next iteration, two; the host
   time the scheduler hides is not modelled);
3. every running request whose prompt is done decodes one token (with k draft
   tokens: verifies q = k + 1 positions and emits 1 + the number of leading
   accepted drafts, below); if the cache cannot grow by q tokens for each, the
   most recently admitted request is preempted (vLLM's recompute: its cache is
   freed and it goes back to the head of the queue, to re-prefill prompt and
   generated tokens);
4. the rest of ``max_tokens`` (static: no limit) goes to prompt chunks, in
   admission order; the unchunked scheduler (TensorRT-LLM without
   ``enable_chunked_prefill``) takes whole prompts only and stops at the first
   that does not fit the rest;
5. the iteration takes ``host + rows(tokens) + head(rows) + kv * kv_read + pair
   * pairs`` (``kernels.serving.iteration_s``, with ``rows`` and ``head`` read off
   per-configuration tables over token counts, linear in between), plus with
   drafts the draft modules' pass over the iteration's prompt tokens and the k
   draft steps of its decoding requests (``kernels.serving.draft_prompt_s`` /
   ``draft_steps_s`` tables); a request whose prompt completes emits its first
   token at the iteration's end.

Speculative decoding: with k = ``draft`` > 0 a decoding request's step emits
1 + j tokens, j the number of leading drafts accepted, each with probability
``acceptance`` (a geometric count truncated at k, mean
``kernels.serving.expected_tokens``), at most the tokens it has left; its
cache grows by as many. Draft i of the step at generated count g of request r
is accepted when ``unit_draw(seed, r, g, i)`` < acceptance: a counter-based
draw, the same whatever the batch, the thread or a preemption in between.
``S_TOKENS_PER_STEP`` is the mean tokens a decode step emitted per request.

Runs of decode-only iterations in which no request completes, none arrives
and the cache does not fill are stepped without visiting each request (the
same iteration times, in the same order, as the full loop; without drafts:
with them every step draws each request's acceptances).

Disaggregated deployments (``simulate_disagg_one``) are simulated whole, two
stages (DistServe, Zhong et al. OSDI 2024, arXiv:2401.09670):

* ``n_prefill`` prefill replicas (one engine each; tables ``p_g``, ``p_h``,
  ``p_dp``, ``p_pair`` of the prefill replica, KV capacity ``p_cap``) take
  prompts from one FIFO queue (arrivals: closed loop of ``clients`` users of
  the deployment, or Poisson at ``rate`` requests/s). An idle replica starts
  an iteration of up to ``max_tokens`` prompt tokens: the prompt it had cut
  first, then prompts from the queue head while its cache holds them, the
  last one cut (chunked prefill). The iteration costs ``host + p_g(tokens) +
  p_h(prompts completing) + p_pair x causal pairs (+ p_dp(tokens) with
  drafts)``; a prompt completing emits the first token.
* On completion the request is routed to the decode engine with the fewest
  requests routed to it and not finished (lowest index on ties) and its
  prompt's cache sent there: ``xfer[r]`` seconds (``kernels.serving.kv_transfer_s``).
  Transfers run concurrently (each on its own ranks' links).
* ``n_decode`` decode engines (instances x pp; tables ``d_g``, ``d_h``,
  ``d_ds``, ``d_kv``, capacity ``d_cap`` per engine) admit, at the start of
  each iteration and in arrival order of their caches, while they run fewer
  than ``max_batch`` requests and the request's whole sequence fits beside
  the others' reservations: in + out + k tokens (TensorRT-LLM's
  GUARANTEED_NO_EVICT capacity policy: no preemption). The answer streams
  from the decode engine, so the first token reaches the user when it is
  admitted: TTFT includes the transfer. Decode-only iterations as the
  aggregated engine's (``kernels.serving.iteration_s``, k drafts verified
  and drawn as in ``simulate_one``).

Events at one instant are handled in the order decode iteration ends, prefill
iteration ends, transfer completions (by time, then request), arrivals, lower
engine index first; idle engines then start, decode engines before prefill
replicas. ``S_ITERATIONS`` counts the decode engines' iterations,
``S_PREFILL_ITERATIONS`` the prefill replicas', ``S_KV_PEAK`` the largest
high-water mark of one decode engine's cache. Stuck (``S_STUCK``) when a
prompt exceeds the prefill replica's cache or a request's sequence a decode
engine's. The prefill side's cache is freed when the prompt completes (the
transfers' milliseconds in flight are not held against it).

Each run is one loop over iterations (aggregated) or events (disaggregated)
holding what every step does; the steps that run only when due (Poisson
arrivals, preemption, a fast-forward, a decode engine's admission, a prefill
iteration's start and end, a transfer's arrival, a request's completion) are
kernels of their own, each taking the arrays it reads and writes. Numba
reference-counts every array a call passes (an atomic increment and decrement
each, some 8 ns) unless it can prove the pair redundant, which it rarely can in a
function with loops and calls: with every step a kernel (the run's state in named
tuples, or explicit arrays) a run was 2-35x slower, and even the aggregated
admission, once a request, cost the bench's 1000-request runs 30%; so those steps
stay in the loop. The run's scalars that the kernels update are two small arrays,
``counters`` (int64, ``C_*``) and ``acc`` (float64, ``A_*``).

Deterministic: the inputs (lengths, unit gaps) are sampled by the caller from
a seed; ties are broken by request index. A configuration whose head-of-queue
request cannot be admitted into an empty engine, or whose only running
request cannot grow its cache, is *stuck* (``S_STUCK`` = 1, latencies NaN).
Throughput is *sustained* throughput. Closed loop: over the whole run; with
``steady`` (a serving space's ``workload.steady_state``, its default) the loop's
start-up burst, every user's first request sent at once at t = 0, is left out:
latencies over the requests after it, and the throughput the loop sustains with
its c users always in the system (each request's successor is sent as it ends),
c / the mean latency (the response-time law with no think time; Lazowska et al.,
Quantitative System Performance, 1984, section 3.3), output tokens that times the
measured requests' mean output. Counting completions in a window instead would
depend on where its edges fall: users of equal lengths stay in step, so a run of a
few requests a user is a few waves (10% off Little's law on a deployment of
12,672 users, four requests each). Without it the statistics are a benchmark's of
``n`` requests started cold (``explorer.validate`` replays measured runs that way).
Poisson: an engine is *overloaded* (``S_OVERLOADED``) when its queue grows,
i.e. the mean TTFT of the last fifth of the requests exceeds twice that of the
second fifth (under overload TTFT grows with the arrival index, about 3x
between those fifths; a stable engine's is flat). A stable engine sustains the
arrival rate, n / the last arrival; an overloaded one its capacity, the
requests completed after the fifth-of-the-way arrival over the time since (it
runs saturated throughout; counting the drain after the last arrival as lost
capacity, or a warm-up short beside the latency, would bias it). The
time-average number of requests in the system is integrated separately
from the per-request latencies, so Little's law (``S_CONCURRENCY`` =
``S_RPS`` x ``S_E2E``) checks the bookkeeping.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from paraspace.kernels.inference import moe_mlp_s
from paraspace.kernels.jit import jit
from paraspace.kernels.serving import ROW_FILL_KEYS, STATIC, UNCHUNKED, kv_transfer_s

#: Output columns of ``simulate_rows``, in order.
SIM_OUTPUTS = (
    "ttft_s", "ttft_p50_s", "ttft_p90_s",
    "tpot_s", "tpot_p50_s", "tpot_p90_s",  # over requests with more than one output token
    "e2e_latency_s", "e2e_p90_s",
    "output_tokens_per_s",  # of the engine, sustained: output tokens completed / time (module doc)
    "requests_per_s",  # of the engine: requests / makespan (the arrival rate of Little's law)
    "concurrency",  # time-average requests in the system (queued or running)
    "makespan_s",
    "iterations",
    "preemptions",
    "kv_peak_tokens",
    "stuck",
    "sustained_requests_per_s",  # (module doc)
    "overloaded",  # 1: a Poisson engine's queue grows (module doc)
    "tokens_per_step",  # mean tokens a decoding request emitted per decode iteration (1 without drafts)
    # iterations that carried prompt tokens (aggregated: prefill-only or mixed; disaggregated: the prefill replicas')
    "prefill_iterations",
)
N_SIM = len(SIM_OUTPUTS)
(
    S_TTFT, S_TTFT_P50, S_TTFT_P90, S_TPOT, S_TPOT_P50, S_TPOT_P90, S_E2E, S_E2E_P90, S_OTPS, S_RPS, S_CONCURRENCY,
    S_MAKESPAN, S_ITERATIONS, S_PREEMPTIONS, S_KV_PEAK, S_STUCK, S_SUSTAINED_RPS, S_OVERLOADED, S_TOKENS_PER_STEP,
    S_PREFILL_ITERATIONS,
) = range(N_SIM)

#: Columns of the event log a run writes when given one (``log`` of shape (rows, N_LOG); a log of
#: 0 rows records nothing): one row per engine iteration, and per KV transfer of a disaggregated run.
#: The timeline of ``paraspace trace`` (``explorer.serve_timeline``) is read off it.
LOG_COLUMNS = (
    "engine",  # aggregated: 0 (the one engine simulated); disaggregated: prefill replica p, decode engine P + d
    "kind",  # LOG_PREFILL, LOG_DECODE, LOG_MIXED, LOG_TRANSFER
    "start_s",
    "end_s",
    "tokens",  # rows through the layers (a transfer: the prompt tokens whose cache moves)
    "requests",  # requests in the iteration (a transfer: 1)
    "prompt_tokens",  # of the tokens, prompt chunk tokens
    "kv_tokens",  # the engine's cached tokens at the iteration's high-water mark (with room for its new tokens)
    "kv_reserved_tokens",  # disaggregated decode engines: the cache reserved by their admitted requests
    "peer",  # a transfer: the destination decode engine (P + d); -1 otherwise
    "request",  # a transfer: the request; -1 otherwise
)
N_LOG = len(LOG_COLUMNS)
(L_ENGINE, L_KIND, L_START, L_END, L_TOKENS, L_REQUESTS, L_PROMPT, L_KV, L_KV_RESERVED, L_PEER, L_REQUEST) = range(N_LOG)
LOG_PREFILL = 0  # prompt chunks only
LOG_DECODE = 1  # decode steps only
LOG_MIXED = 2  # aggregated: decode steps and prompt chunks in one iteration
LOG_TRANSFER = 3  # disaggregated: one request's KV cache from its prefill replica to its decode engine
LOG_KIND_NAMES = ("prefill", "decode", "mixed", "kv transfer")


@jit
def _record(log, cursor: int, engine: int, kind: int, start: float, end: float, tokens: float, requests: float,
            prompt: float, kv_tokens: float, reserved: float, peer: int, request: int) -> int:
    """Write one log row at ``cursor`` (nothing past the log's end); the next cursor."""
    if cursor < log.shape[0]:
        row = log[cursor]
        row[L_ENGINE] = engine
        row[L_KIND] = kind
        row[L_START] = start
        row[L_END] = end
        row[L_TOKENS] = tokens
        row[L_REQUESTS] = requests
        row[L_PROMPT] = prompt
        row[L_KV] = kv_tokens
        row[L_KV_RESERVED] = reserved
        row[L_PEER] = peer
        row[L_REQUEST] = request
    return cursor + 1

@jit
def _mix32(x):
    """The low 32 bits of ``x`` (uint64) through Wellons' lowbias32 integer hash
    (products below 2^64: no wrap-around, so Python's numpy scalars agree)."""
    x = x & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    return x


@jit
def unit_draw(seed: int, request: int, position: int, draft: int) -> float:
    """A uniform number in [0, 1) (32 bits) that depends only on its four
    arguments (each below 2^32): the hash chained over them."""
    x = _mix32(np.uint64(seed) ^ np.uint64(0x9E3779B9))
    x = _mix32(x ^ np.uint64(request))
    x = _mix32(x ^ np.uint64(position))
    x = _mix32(x ^ np.uint64(draft))
    return float(x) / 4294967296.0


@jit
def lookup(grid, table, x: float) -> float:
    """``table`` at ``x`` by linear interpolation on ``grid`` (ascending), extrapolated
    linearly past either end; 0 at x <= 0."""
    if x <= 0.0:
        return 0.0
    k = grid.shape[0]
    j = np.searchsorted(grid, x)
    if j < k and grid[j] == x:
        return table[j]
    if j == 0:
        j = 1
    elif j >= k:
        j = k - 1
    w = (x - grid[j - 1]) / (grid[j] - grid[j - 1])
    return table[j - 1] + w * (table[j] - table[j - 1])

# --------------------------------------------------------------------------- a run's state

#: ``counters``: the queue's head and length (the FIFO of waiting requests is the ring
#: buffer ``queue``), requests issued (the next to arrive), the log's cursor, the KV
#: transfers in flight (the disaggregated run's heap).
C_HEAD, C_QUEUED, C_ISSUED, C_CURSOR, C_IN_FLIGHT = range(5)
N_COUNTERS = 5
#: ``acc``: the clock; the integral over time of the requests in the system, and their
#: number; requests done; cached tokens held (aggregated) and the high-water mark;
#: iterations (disaggregated: the decode engines'), those with prompt tokens (the prefill
#: replicas'); preemptions; (request, decode step) pairs and the tokens they emitted; the
#: start of the last iteration (when the overlap scheduler chose the next one's batch).
(A_T, A_AREA, A_IN_SYSTEM, A_DONE, A_KV_USED, A_KV_PEAK, A_ITERATIONS, A_PREFILL_ITERATIONS, A_PREEMPTIONS,
 A_DEC_STEPS, A_DEC_TOKENS, A_LAST_START) = range(12)
N_ACC = 12


@jit(inline=True)
def _enqueue_next(queue, counters, acc) -> None:
    """The workload's next request (``C_ISSUED``) joins the back of the queue and the system."""
    queue[(counters[C_HEAD] + counters[C_QUEUED]) % queue.shape[0]] = counters[C_ISSUED]
    counters[C_QUEUED] += 1
    counters[C_ISSUED] += 1
    acc[A_IN_SYSTEM] += 1.0


@jit(inline=True)
def _dequeue(queue, counters) -> int:
    """The request at the head of the queue, taken off it."""
    r = queue[counters[C_HEAD]]
    counters[C_HEAD] = (counters[C_HEAD] + 1) % queue.shape[0]
    counters[C_QUEUED] -= 1
    return r


@jit
def _start_run(clients: int, gaps, rate: float, arr_at, queue, counters, acc) -> None:
    """A run at 0: a closed loop queues its first ``clients`` requests, a Poisson
    stream gets every arrival time from its unit gaps."""
    n = arr_at.shape[0]
    if clients > 0:
        for _ in range(min(clients, n)):
            _enqueue_next(queue, counters, acc)
        return
    total = 0.0
    for r in range(n):
        total += gaps[r]
        arr_at[r] = total / rate


@jit(inline=True)
def _finish(r: int, closed: bool, done_at, arr_at, queue, counters, acc) -> None:
    """Request ``r`` completes now: it leaves the system and, in a closed loop, its
    user sends the workload's next request."""
    t = acc[A_T]
    done_at[r] = t
    acc[A_DONE] += 1.0
    acc[A_IN_SYSTEM] -= 1.0
    if closed and counters[C_ISSUED] < arr_at.shape[0]:
        arr_at[counters[C_ISSUED]] = t
        _enqueue_next(queue, counters, acc)


@jit(inline=True)
def _chunk(r: int, budget: float, prior: float, target, done_pre, chunk):
    """Request ``r``'s prompt chunk in an iteration with ``budget`` tokens left (kept in
    ``chunk``), ``prior`` prompt tokens before it: (its tokens, its causal pairs, 1 if it
    completes the prompt else 0)."""
    c = min(target[r] - done_pre[r], budget)
    chunk[r] = c
    return c, c * (prior + 0.5 * c + ROW_FILL_KEYS), 1.0 if done_pre[r] + c >= target[r] else 0.0


@jit(inline=True)
def _chunk_done(r: int, target, done_pre, chunk) -> bool:
    """Request ``r``'s chunk of the iteration that ended is computed; whether its prompt is."""
    done_pre[r] += chunk[r]
    chunk[r] = 0.0
    return done_pre[r] >= target[r]


@jit(inline=True)
def _emitted(seed: int, r: int, gen_r: int, out_r: float, draft: int, acceptance: float) -> int:
    """Tokens request ``r`` emits in a decode iteration: 1, plus its drafts accepted
    before the first rejection (``unit_draw``), capped at what it has left."""
    if draft <= 0:
        return 1
    accepted = 0
    while accepted < draft and unit_draw(seed, r, gen_r, accepted) < acceptance:
        accepted += 1
    return min(1 + accepted, int(out_r) - gen_r)


# --------------------------------------------------------------------------- the aggregated engine


@jit(inline=True)
def _poisson_arrivals(arr_at, queue, counters, acc) -> None:
    """A Poisson stream's requests that arrived by now join the queue (their wait
    since their arrival counted in the area)."""
    t = acc[A_T]
    while counters[C_ISSUED] < arr_at.shape[0] and arr_at[counters[C_ISSUED]] <= t:
        acc[A_AREA] += t - arr_at[counters[C_ISSUED]]
        _enqueue_next(queue, counters, acc)


@jit(inline=True)
def _preempt(running, n_run: int, n_dec: int, q: int, cap: float, kv, decoding, queue, counters, acc):
    """While the cache cannot grow by ``q`` tokens for each decoding request, the most
    recently admitted request is preempted (vLLM's recompute: its cache freed, back to
    the head of the queue); (running, decoding) after, or (0, 0) when the only running
    request cannot grow its cache (stuck)."""
    while acc[A_KV_USED] + n_dec * q > cap:
        if n_run == 1:
            return 0, 0
        victim = running[n_run - 1]
        n_run -= 1
        acc[A_KV_USED] -= kv[victim]
        kv[victim] = 0.0
        if decoding[victim]:
            n_dec -= 1
            decoding[victim] = False
        counters[C_HEAD] = (counters[C_HEAD] - 1) % queue.shape[0]
        queue[counters[C_HEAD]] = victim
        counters[C_QUEUED] += 1
        acc[A_PREEMPTIONS] += 1.0
    return n_run, n_dec


@jit
def _fast_forward(ahead: float, kv_read: float, base: float, kv_coef: float, pair_coef: float, next_at: float, running,
                  n_run: int, gen, kv, log, counters, acc) -> int:
    """Steps ``ahead`` decode-only iterations at most (every running request decoding, no
    drafts; ``kv_read`` cached tokens read by the first, ``base`` seconds of host, layers
    and head at n_run rows) in which nothing but the KV lengths change: none completes,
    none arrives (the next at ``next_at``), the cache does not fill; the same iteration
    times, in the same order, as the full loop. How many (0: an arrival is due)."""
    kv_used = acc[A_KV_USED]
    cursor = counters[C_CURSOR]
    t = acc[A_T]
    area = acc[A_AREA]
    kv_peak = acc[A_KV_PEAK]
    n_sys = acc[A_IN_SYSTEM]
    steps = 0
    while steps < ahead:
        if next_at <= t:
            break  # an arrival to enqueue: back to the full iteration
        dt = base + kv_coef * kv_read + pair_coef * 0.0
        cursor = _record(log, cursor, 0, LOG_DECODE, t, t + dt, float(n_run), float(n_run), 0.0, kv_used + n_run,
                         0.0, -1, -1)
        acc[A_LAST_START] = t
        t += dt
        area += n_sys * dt
        kv_read += n_run
        kv_peak = max(kv_peak, kv_used + n_run)
        kv_used += n_run
        steps += 1
    counters[C_CURSOR] = cursor
    acc[A_T] = t
    acc[A_AREA] = area
    acc[A_KV_PEAK] = kv_peak
    acc[A_KV_USED] = kv_used
    acc[A_ITERATIONS] += steps
    acc[A_DEC_STEPS] += steps * n_run
    acc[A_DEC_TOKENS] += steps * n_run
    for i in range(n_run):
        gen[running[i]] += steps
        kv[running[i]] += steps
    return steps


@jit
def simulate_one(in_len, out_len, gaps, clients: int, rate: float, max_batch: int, max_tokens: float,
                 scheduler: int, overlap: bool, cap: float, host: float, kv_coef: float, pair_coef: float, hit: float,
                 grid, g_row, h_row, draft: int, acceptance: float, seed: int, dp_row, ds_row, res, log,
                 steady: bool, samples) -> None:
    """Simulate one engine (module doc) and fill ``res`` (``SIM_OUTPUTS``); each
    iteration is written to ``log`` (``LOG_COLUMNS``) while it has rows (module doc: its split).
    ``steady``: a closed loop's statistics leave its start-up burst out (module doc).
    ``samples`` (n, 2), where it has rows: each measured request's TTFT and TPOT (NaN:
    not measured, or no TPOT), to pool with other engines' (``_summarise``)."""
    n = in_len.shape[0]
    arr_at, first_at, done_at, kv, target, done_pre, chunk = _request_arrays(n)
    gen = np.zeros(n, np.int64)  # tokens generated
    decoding = np.zeros(n, np.bool_)  # decodes this iteration
    cached = np.floor(in_len * hit)  # prefix-cache tokens of the prompt
    queue, counters, acc = np.zeros(n, np.int64), np.zeros(N_COUNTERS, np.int64), np.zeros(N_ACC)
    _start_run(clients, gaps, rate, arr_at, queue, counters, acc)
    running = np.zeros(n, np.int64)  # in admission order
    n_run = 0
    closed = clients > 0
    static = scheduler == STATIC
    whole = scheduler == UNCHUNKED  # prompts are not cut: whole ones, in order, while they fit
    q = draft + 1  # positions a decoding request verifies per iteration
    stuck = False
    while acc[A_DONE] < n:
        t = acc[A_T]
        if not closed and counters[C_ISSUED] < n and arr_at[counters[C_ISSUED]] <= t:
            _poisson_arrivals(arr_at, queue, counters, acc)
        admitting = not static or n_run == 0  # in queue order, while the batch and the cache have room
        late = overlap and n_run > 0  # a busy engine's batch was chosen when the last iteration started
        held = False  # an arrival waits for the next iteration (overlap scheduler)
        while admitting and counters[C_QUEUED] > 0 and n_run < max_batch:
            r = queue[counters[C_HEAD]]
            if late and arr_at[r] >= acc[A_LAST_START]:
                # it arrived after this iteration's batch was chosen: one that arrives as the last
                # iteration starts came from a completion the engine reported after launching it
                held = True
                break
            need = in_len[r] + gen[r]  # (a preempted request's generated tokens too)
            if acc[A_KV_USED] + need > cap:
                break
            _dequeue(queue, counters)
            running[n_run] = r
            n_run += 1
            acc[A_KV_USED] += need
            kv[r] = need
            target[r] = need - cached[r]
            done_pre[r] = 0.0
        if n_run == 0:
            if counters[C_QUEUED] > 0 or closed or counters[C_ISSUED] >= n:
                stuck = True  # the head of the queue does not fit an empty engine
                break
            acc[A_T] = arr_at[counters[C_ISSUED]]  # idle until the next arrival
            continue
        n_dec = 0
        for i in range(n_run):
            r = running[i]
            decoding[r] = done_pre[r] >= target[r]
            if decoding[r]:
                n_dec += 1
        if acc[A_KV_USED] + n_dec * q > cap:
            n_run, n_dec = _preempt(running, n_run, n_dec, q, cap, kv, decoding, queue, counters, acc)
            if n_run == 0:
                stuck = True  # the only running request cannot grow its cache
                break
        if n_dec == n_run and draft == 0 and not held:  # decode only: fast-forward while only KV lengths change
            ahead, kv_read = np.inf, 0.0
            for i in range(n_run):
                r = running[i]
                ahead = min(ahead, out_len[r] - gen[r] - 1.0)  # none of them completes
                kv_read += kv[r] + 1.0
            ahead = min(ahead, np.floor((cap - acc[A_KV_USED]) / n_dec))  # the cache does not fill
            next_at = arr_at[counters[C_ISSUED]] if not closed and counters[C_ISSUED] < n else np.inf
            if ahead >= 2.0 and _fast_forward(ahead, kv_read, host + lookup(grid, g_row, float(n_run))
                                              + lookup(grid, h_row, float(n_run)), kv_coef, pair_coef, next_at,
                                              running, n_run, gen, kv, log, counters, acc) > 0:
                continue
        budget = np.inf if static else max_tokens - n_dec * q  # prompt chunks in admission order
        tokens = rows = kv_read = pairs = prompt = 0.0
        for i in range(n_run):
            r = running[i]
            if decoding[r]:
                tokens += q
                rows += q
                kv_read += kv[r] + q
            elif budget > 0.0:
                if whole and target[r] - done_pre[r] > budget:
                    budget = 0.0  # in order: the first prompt that does not fit ends the prompts
                    continue
                c, pair, completes = _chunk(r, budget, kv[r] - target[r] + done_pre[r], target, done_pre, chunk)
                pairs += pair
                tokens += c
                prompt += c
                budget -= c
                rows += completes
        if tokens <= 0.0:
            stuck = True  # unchunked: nothing decodes and the first prompt exceeds max_tokens
            break
        dt = host + lookup(grid, g_row, tokens) + lookup(grid, h_row, rows) + kv_coef * kv_read + pair_coef * pairs
        if draft > 0:
            dt += lookup(grid, dp_row, prompt) + lookup(grid, ds_row, float(n_dec))
        kind = LOG_DECODE if prompt <= 0.0 else (LOG_PREFILL if n_dec == 0 else LOG_MIXED)
        high = acc[A_KV_USED] + n_dec * q
        counters[C_CURSOR] = _record(log, counters[C_CURSOR], 0, kind, t, t + dt, tokens, float(n_run), prompt, high,
                                     0.0, -1, -1)
        acc[A_LAST_START] = t
        t += dt
        acc[A_T] = t
        acc[A_AREA] += acc[A_IN_SYSTEM] * dt
        acc[A_ITERATIONS] += 1.0
        if prompt > 0.0:
            acc[A_PREFILL_ITERATIONS] += 1.0
        acc[A_KV_PEAK] = max(acc[A_KV_PEAK], high)
        keep = 0  # the iteration's end: decode steps emit, chunks are computed, finished requests leave
        kv_used, dec_steps, dec_tokens = acc[A_KV_USED], acc[A_DEC_STEPS], acc[A_DEC_TOKENS]  # (in registers)
        for i in range(n_run):
            r = running[i]
            if decoding[r]:
                m = _emitted(seed, r, gen[r], out_len[r], draft, acceptance)
                gen[r] += m
                kv[r] += m
                kv_used += m
                dec_steps += 1.0
                dec_tokens += m
            elif chunk[r] > 0.0 and _chunk_done(r, target, done_pre, chunk):
                gen[r] += 1  # the first token
                if first_at[r] < 0.0:
                    first_at[r] = t
            if gen[r] >= out_len[r]:
                kv_used -= kv[r]
                kv[r] = 0.0
                _finish(r, closed, done_at, arr_at, queue, counters, acc)
            else:
                running[keep] = r
                keep += 1
        acc[A_KV_USED], acc[A_DEC_STEPS], acc[A_DEC_TOKENS] = kv_used, dec_steps, dec_tokens
        n_run = keep
    _summarise(res, arr_at, first_at, done_at, out_len, closed, stuck, acc, clients if steady and closed else 0,
               samples)


@jit
def _request_arrays(n: int):
    """Per-request arrays at a run's start: arrival, first-token (-1: none yet) and
    completion instants; cached tokens held; prompt tokens to compute (the aggregated
    engine's since admission), computed, and in the iteration under way."""
    return np.zeros(n), np.full(n, -1.0), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)


@jit
def _summarise(res, arr_at, first_at, done_at, out_len, closed: bool, stuck: bool, acc, burst: int,
               samples) -> None:
    """``res`` (``SIM_OUTPUTS``) from a run's per-request instants and its ``acc`` (module doc);
    ``burst``: the closed loop's first requests, sent at once at its start, that the
    steady statistics leave out (0: every request counts); ``samples`` (n, 2; or no rows):
    the measured requests' TTFT and TPOT (the requests the means are over), NaN elsewhere."""
    t = acc[A_T]
    n = arr_at.shape[0]
    for k in range(N_SIM):
        res[k] = np.nan
    samples[:, :] = np.nan
    res[S_ITERATIONS] = acc[A_ITERATIONS]
    res[S_PREFILL_ITERATIONS] = acc[A_PREFILL_ITERATIONS]
    res[S_PREEMPTIONS] = acc[A_PREEMPTIONS]
    res[S_KV_PEAK] = acc[A_KV_PEAK]
    res[S_STUCK] = 1.0 if stuck else 0.0
    if stuck:
        return
    if acc[A_DEC_STEPS] > 0.0:
        res[S_TOKENS_PER_STEP] = acc[A_DEC_TOKENS] / acc[A_DEC_STEPS]
    lo = burst if burst < n else 0  # the requests measured: lo .. n - 1
    arrived, first, done, outs = arr_at[lo:], first_at[lo:], done_at[lo:], out_len[lo:]
    ttft = first - arrived
    e2e = done - arrived
    multi = outs > 1
    res[S_TTFT] = ttft.mean()
    res[S_TTFT_P50] = np.percentile(ttft, 50.0)
    res[S_TTFT_P90] = np.percentile(ttft, 90.0)
    if multi.any():
        tpot = (done[multi] - first[multi]) / (outs[multi] - 1.0)
        res[S_TPOT] = tpot.mean()
        res[S_TPOT_P50] = np.percentile(tpot, 50.0)
        res[S_TPOT_P90] = np.percentile(tpot, 90.0)
    else:  # every request ends with its first token: no time between tokens (the analytic tier's 0)
        res[S_TPOT] = 0.0
        res[S_TPOT_P50] = 0.0
        res[S_TPOT_P90] = 0.0
    res[S_E2E] = e2e.mean()
    res[S_E2E_P90] = np.percentile(e2e, 90.0)
    if samples.shape[0] > 0:
        for r in range(lo, n):
            samples[r, 0] = first_at[r] - arr_at[r]
            if out_len[r] > 1:
                samples[r, 1] = (done_at[r] - first_at[r]) / (out_len[r] - 1.0)
    res[S_MAKESPAN] = t
    res[S_RPS] = n / t
    overloaded = False
    fifth = n // 5
    if not closed and fifth > 0:
        overloaded = ttft[n - fifth:].mean() > 2.0 * ttft[fifth:2 * fifth].mean()
    res[S_OVERLOADED] = 1.0 if overloaded else 0.0
    res[S_CONCURRENCY] = acc[A_AREA] / t
    if closed and lo > 0:  # the loop's lo users, each request's successor sent as it ends: users / latency
        res[S_SUSTAINED_RPS] = lo / res[S_E2E]
        res[S_OTPS] = res[S_SUSTAINED_RPS] * outs.mean()
        return
    start = 0.0
    stop = t
    window = overloaded
    if overloaded:
        start = arr_at[fifth]
    elif not closed:
        stop = arr_at[n - 1]
    served = 0.0
    tokens_served = 0.0
    for r in range(n):
        if window and not start < done_at[r] <= stop:
            continue
        served += 1.0
        tokens_served += out_len[r]
    res[S_SUSTAINED_RPS] = served / (stop - start)
    res[S_OTPS] = tokens_served / (stop - start)


def simulate_rows(in_len, out_len, gaps, clients, rate, max_batch, max_tokens, scheduler, overlap, cap, host, kv_coef,
                  pair_coef, hit, grid, g_table, h_table, draft, acceptance, seed, dp_table, ds_table, steady=False,
                  samples=None):
    """``SIM_OUTPUTS`` for every configuration (row): per-row ``clients`` (0: Poisson
    at ``rate``), ``max_batch``, ``max_tokens``, ``scheduler``, ``overlap`` (1: the
    overlap scheduler), KV ``cap`` tokens,
    ``kv_coef``, ``pair_coef``, ``draft`` tokens and cost tables
    (``kernels.serving.cost_tables``); the request lengths, unit gaps, ``host``,
    ``hit``, the draft ``acceptance`` and the draws' ``seed`` (below 2^32) are
    shared, and ``steady`` (a closed loop's statistics without its start-up burst,
    module doc). (n, N_SIM). ``samples`` (rows, requests, 2), if given, receives each
    row's measured requests' TTFT and TPOT (``simulate_one``)."""
    if samples is None:
        samples = np.empty((clients.shape[0], 0, 2))
    return _simulate_rows(in_len, out_len, gaps, clients, rate, max_batch, max_tokens, scheduler, overlap, cap, host,
                          kv_coef, pair_coef, hit, grid, g_table, h_table, draft, acceptance, seed, dp_table, ds_table,
                          steady, samples)


@jit(parallel=True)
def _simulate_rows(in_len, out_len, gaps, clients, rate, max_batch, max_tokens, scheduler, overlap, cap, host, kv_coef,
                   pair_coef, hit, grid, g_table, h_table, draft, acceptance, seed, dp_table, ds_table, steady: bool,
                   samples):
    """``simulate_rows``' parallel loop (``samples`` always given: no rows to fill none)."""
    n = clients.shape[0]
    out = np.empty((n, N_SIM))
    nolog = np.empty((0, N_LOG))
    for i in prange(n):
        simulate_one(in_len, out_len, gaps, int(clients[i]), rate[i], int(max_batch[i]), max_tokens[i],
                     int(scheduler[i]), overlap[i] != 0, cap[i], host, kv_coef[i], pair_coef[i], hit, grid, g_table[i],
                     h_table[i], int(draft[i]), acceptance, seed, dp_table[i], ds_table[i], out[i], nolog, steady,
                     samples[i])
    return out


# --------------------------------------------------------------------------- disaggregated deployments


@jit
def _heap_push(heap, size: int, key, r: int) -> int:
    """Push request ``r`` onto the binary min-heap ``heap[:size]`` ordered by (key[r], r); the new size."""
    i = size
    heap[i] = r
    while i > 0:
        parent = (i - 1) // 2
        p = heap[parent]
        if key[p] < key[r] or (key[p] == key[r] and p < r):
            break
        heap[i] = p
        heap[parent] = r
        i = parent
    return size + 1


@jit
def _heap_pop(heap, size: int, key) -> int:
    """Remove the top of ``heap[:size]`` (``_heap_push``'s order); the new size."""
    size -= 1
    last = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        c = heap[child]
        if child + 1 < size:
            c2 = heap[child + 1]
            if key[c2] < key[c] or (key[c2] == key[c] and c2 < c):
                child += 1
                c = c2
        if key[last] < key[c] or (key[last] == key[c] and last < c):
            break
        heap[i] = c
        i = child
    heap[i] = last
    return size


#: Columns of a disaggregated run's per-decode-engine integers (``dec``, int64, engine d at
#: row d): the head and tail of its queue of transferred requests (a list through
#: ``link``; -1: empty), the requests it runs (``d_run[d, :n]``), the requests routed to
#: it and not finished; and of its floats (``dec_kv``): cached tokens held, tokens
#: reserved by the requests it admitted.
DEC_HEAD, DEC_TAIL, DEC_N, DEC_ROUTED = range(4)
DEC_USED, DEC_RESERVED = range(2)
#: Columns of the prefill replicas' integers (``pre``): the first and last request of
#: its iteration under way (a list through ``link``), the prompt it cut (-1: none).
PRE_FIRST, PRE_LAST, PRE_CARRY = range(3)
#: The events of a disaggregated run, in their order at one instant.
EV_DECODE_END, EV_PREFILL_END, EV_TRANSFER, EV_ARRIVAL = range(4)


@jit
def _admit_decode(d: int, max_batch: int, d_cap: float, draft: int, closed: bool, in_len, out_len, dec, dec_kv,
                  d_run, link, first_at, gen, kv, reserve, done_at, arr_at, queue, counters, acc) -> None:
    """Decode engine ``d`` admits from its queue, in arrival order of the caches, while it
    runs fewer than ``max_batch`` requests and the request's whole sequence (in + out + k
    tokens) fits beside the others' reservations. The first token reaches the user at
    admission; a request whose first token was its last finishes there."""
    t = acc[A_T]
    while dec[d, DEC_HEAD] >= 0 and dec[d, DEC_N] < max_batch:
        r = dec[d, DEC_HEAD]
        need = in_len[r] + out_len[r] + draft
        if dec_kv[d, DEC_RESERVED] + need > d_cap:
            break
        dec[d, DEC_HEAD] = link[r]
        if dec[d, DEC_HEAD] < 0:
            dec[d, DEC_TAIL] = -1
        link[r] = -1
        first_at[r] = t
        if gen[r] >= out_len[r]:  # the first token was the last
            dec[d, DEC_ROUTED] -= 1
            _finish(r, closed, done_at, arr_at, queue, counters, acc)
            continue
        d_run[d, dec[d, DEC_N]] = r
        dec[d, DEC_N] += 1
        dec_kv[d, DEC_RESERVED] += need
        reserve[r] = need
        dec_kv[d, DEC_USED] += kv[r]


@jit
def _gather_prompts(p: int, max_tokens: float, p_cap: float, in_len, pre, link, cached, target, done_pre, chunk,
                    queue, counters):
    """Prefill replica ``p``'s next iteration: up to ``max_tokens`` prompt tokens, the
    prompt it had cut first, then prompts from the queue head while its cache holds
    them, the last one cut (chunked prefill), listed from ``pre[p, PRE_FIRST]``.
    (tokens, prompts completing, causal pairs, cache held, stuck: a prompt larger than
    the cache)."""
    budget = max_tokens
    tokens = 0.0
    rows = 0.0
    pairs = 0.0
    held = 0.0
    while budget > 0.0:
        r = pre[p, PRE_CARRY]
        if r >= 0:
            pre[p, PRE_CARRY] = -1
        elif counters[C_QUEUED] > 0:
            r = queue[counters[C_HEAD]]
            if in_len[r] > p_cap:
                return tokens, rows, pairs, held, True
            if held + in_len[r] > p_cap:
                break
            _dequeue(queue, counters)
        else:
            break
        c, pair, completes = _chunk(r, budget, cached[r] + done_pre[r], target, done_pre, chunk)
        pairs += pair
        tokens += c
        budget -= c
        held += in_len[r]
        rows += completes
        if pre[p, PRE_FIRST] < 0:
            pre[p, PRE_FIRST] = r
        else:
            link[pre[p, PRE_LAST]] = r
        pre[p, PRE_LAST] = r
    return tokens, rows, pairs, held, False


@jit
def _start_prefill_replicas(max_tokens: float, p_cap: float, draft: int, in_len, p_end, pre, link, cached, target,
                            done_pre, chunk, queue, counters, acc, host: float, grid, p_g, p_h, p_dp,
                            p_pair: float, log) -> bool:
    """Every idle prefill replica (``p_end`` inf) with a prompt it cut or a queue to
    take from starts an iteration (``_gather_prompts``; its cost off the prefill tables,
    the draft modules over its prompt tokens); True when stuck."""
    t = acc[A_T]
    for p in range(p_end.shape[0]):
        if p_end[p] < np.inf or (pre[p, PRE_CARRY] < 0 and counters[C_QUEUED] == 0):
            continue
        tokens, rows, pairs, held, stuck = _gather_prompts(p, max_tokens, p_cap, in_len, pre, link, cached, target,
                                                           done_pre, chunk, queue, counters)
        if stuck:
            return True
        if tokens <= 0.0:
            continue
        dt = host + lookup(grid, p_g, tokens) + lookup(grid, p_h, rows) + p_pair * pairs  # kernels.serving.iteration_s
        if draft > 0:
            dt += lookup(grid, p_dp, tokens)
        counters[C_CURSOR] = _record(log, counters[C_CURSOR], p, LOG_PREFILL, t, t + dt, tokens, rows, tokens, held,
                                     0.0, -1, -1)
        p_end[p] = t + dt
        acc[A_PREFILL_ITERATIONS] += 1.0
    return False


@jit(inline=True)
def _route(dec) -> int:
    """The decode engine with the fewest requests routed to it and not finished (lowest index on ties)."""
    best = 0
    for d in range(1, dec.shape[0]):
        if dec[d, DEC_ROUTED] < dec[best, DEC_ROUTED]:
            best = d
    return best


@jit
def _end_prefill_iteration(p: int, in_len, xfer, p_end, pre, dec, link, target, done_pre, chunk, gen, kv, dest,
                           ready_at, heap, counters, acc, log) -> None:
    """Prefill replica ``p``'s iteration ends: its chunks are computed; a prompt completed
    emits the first token and its cache leaves for the decode engine ``_route`` picks
    (``xfer[r]`` s, logged from ``p`` to engine P + d); a prompt cut stays with ``p``."""
    t = acc[A_T]
    n_prefill = p_end.shape[0]
    p_end[p] = np.inf
    r = pre[p, PRE_FIRST]
    pre[p, PRE_FIRST] = -1
    pre[p, PRE_LAST] = -1
    while r >= 0:
        nxt = link[r]
        link[r] = -1
        if _chunk_done(r, target, done_pre, chunk):
            gen[r] = 1
            kv[r] = in_len[r]
            best = _route(dec)
            dec[best, DEC_ROUTED] += 1
            dest[r] = best
            ready_at[r] = t + xfer[r]
            counters[C_IN_FLIGHT] = _heap_push(heap, counters[C_IN_FLIGHT], ready_at, r)
            counters[C_CURSOR] = _record(log, counters[C_CURSOR], p, LOG_TRANSFER, t, ready_at[r], in_len[r], 1.0, 0.0,
                                         0.0, 0.0, n_prefill + best, r)
        else:
            pre[p, PRE_CARRY] = r
        r = nxt


@jit(inline=True)
def _transfer_arrives(dec, link, dest, ready_at, heap, counters) -> None:
    """The earliest KV transfer in flight completes: its request joins its decode engine's queue."""
    r = heap[0]
    counters[C_IN_FLIGHT] = _heap_pop(heap, counters[C_IN_FLIGHT], ready_at)
    d = dest[r]
    if dec[d, DEC_TAIL] < 0:
        dec[d, DEC_HEAD] = r
    else:
        link[dec[d, DEC_TAIL]] = r
    dec[d, DEC_TAIL] = r


@jit
def _engines(n_prefill: int, n_decode: int, max_batch: int):
    """The engines of a disaggregated run at its start, all idle (end inf): the prefill
    replicas' iteration ends and integers (``PRE_*``, -1: none), the decode engines'
    iteration ends, integers (``DEC_*``; empty queues) and floats (``DEC_USED``,
    ``DEC_RESERVED``), and their running requests (``d_run[d, :n]``)."""
    dec = np.zeros((n_decode, 4), np.int64)
    for d in range(n_decode):
        dec[d, DEC_HEAD] = -1
        dec[d, DEC_TAIL] = -1
    return (np.full(n_prefill, np.inf), np.full((n_prefill, 3), -1, np.int64), np.full(n_decode, np.inf), dec,
            np.zeros((n_decode, 2)), np.zeros((n_decode, max(max_batch, 1)), np.int64))


@jit
def simulate_disagg_one(in_len, out_len, gaps, clients: int, rate: float, n_prefill: int, n_decode: int,
                        max_batch: int, max_tokens: float, p_cap: float, d_cap: float, host: float, hit: float, grid,
                        p_g, p_h, p_pair: float, p_dp, d_g, d_h, d_kv: float, d_ds, xfer, draft: int,
                        acceptance: float, seed: int, res, log, steady: bool) -> None:
    """Simulate a whole disaggregated deployment (module doc) and fill ``res`` (``SIM_OUTPUTS``);
    every iteration and KV transfer is written to ``log`` while it has rows; ``steady`` as
    ``simulate_one``'s."""
    n = in_len.shape[0]
    arr_at, first_at, done_at, kv, target, done_pre, chunk = _request_arrays(n)
    gen = np.zeros(n, np.int64)
    cached = np.floor(in_len * hit)
    for r in range(n):
        target[r] = in_len[r] - cached[r]
    ready_at, reserve, dest = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)  # transfer done, decode cache, engine
    link = np.full(n, -1, np.int64)  # next member of a prefill iteration, or next in a decode engine's queue
    queue, counters, acc = np.zeros(n, np.int64), np.zeros(N_COUNTERS, np.int64), np.zeros(N_ACC)
    _start_run(clients, gaps, rate, arr_at, queue, counters, acc)
    p_end, pre, d_end, dec, dec_kv, d_run = _engines(n_prefill, n_decode, max_batch)
    heap = np.zeros(n, np.int64)  # the KV transfers in flight (C_IN_FLIGHT of them), by (ready_at, request)
    q = draft + 1
    closed = clients > 0
    stuck = False
    start_engines = True
    while acc[A_DONE] < n:
        t = acc[A_T]
        if start_engines:  # idle engines start, decode first
            for d in range(n_decode):
                r = dec[d, DEC_HEAD]
                if d_end[d] < np.inf or r < 0 and dec[d, DEC_N] == 0:
                    continue
                if (r >= 0 and dec[d, DEC_N] < max_batch
                        and dec_kv[d, DEC_RESERVED] + in_len[r] + out_len[r] + draft <= d_cap):  # one to admit
                    _admit_decode(d, max_batch, d_cap, draft, closed, in_len, out_len, dec, dec_kv, d_run, link,
                                  first_at, gen, kv, reserve, done_at, arr_at, queue, counters, acc)
                n_run = dec[d, DEC_N]
                if n_run == 0:
                    stuck = dec[d, DEC_HEAD] >= 0  # its next request does not fit the empty engine
                    if stuck:
                        break
                    continue
                kv_read = 0.0
                for i in range(n_run):
                    kv_read += kv[d_run[d, i]] + q
                rows = float(n_run * q)
                dt = host + lookup(grid, d_g, rows) + lookup(grid, d_h, rows) + d_kv * kv_read
                if draft > 0:
                    dt += lookup(grid, d_ds, float(n_run))
                high = dec_kv[d, DEC_USED] + n_run * q
                acc[A_KV_PEAK] = max(acc[A_KV_PEAK], high)
                counters[C_CURSOR] = _record(log, counters[C_CURSOR], n_prefill + d, LOG_DECODE, t, t + dt, rows,
                                             float(n_run), 0.0, high, dec_kv[d, DEC_RESERVED], -1, -1)
                d_end[d] = t + dt
                acc[A_ITERATIONS] += 1.0
            if stuck:
                break
            for p in range(n_prefill):
                if p_end[p] == np.inf and (pre[p, PRE_CARRY] >= 0 or counters[C_QUEUED] > 0):  # one can start
                    stuck = _start_prefill_replicas(max_tokens, p_cap, draft, in_len, p_end, pre, link, cached, target,
                                                    done_pre, chunk, queue, counters, acc, host, grid, p_g, p_h, p_dp,
                                                    p_pair, log)
                    break
            if stuck or acc[A_DONE] >= n:  # (or the last request finished at its admission)
                break
        te, kind, who = np.inf, -1, -1  # the next event (module doc: decode ends, prefill ends, transfers, arrivals)
        for d in range(n_decode):
            if d_end[d] < te:
                te, kind, who = d_end[d], EV_DECODE_END, d
        for p in range(n_prefill):
            if p_end[p] < te:
                te, kind, who = p_end[p], EV_PREFILL_END, p
        if counters[C_IN_FLIGHT] > 0 and ready_at[heap[0]] < te:
            te, kind, who = ready_at[heap[0]], EV_TRANSFER, heap[0]
        if not closed and counters[C_ISSUED] < n and arr_at[counters[C_ISSUED]] < te:
            te, kind, who = arr_at[counters[C_ISSUED]], EV_ARRIVAL, counters[C_ISSUED]
        if kind < 0:  # nothing in flight and requests left: no engine can take them
            stuck = True
            break
        acc[A_AREA] += acc[A_IN_SYSTEM] * (te - t)
        acc[A_T] = te
        if kind == EV_DECODE_END:  # its requests emit their tokens; finished ones leave with their reservation
            d = who
            d_end[d] = np.inf
            keep = 0
            used, dec_steps, dec_tokens = dec_kv[d, DEC_USED], acc[A_DEC_STEPS], acc[A_DEC_TOKENS]  # (in registers)
            for i in range(dec[d, DEC_N]):
                r = d_run[d, i]
                m = _emitted(seed, r, gen[r], out_len[r], draft, acceptance)
                gen[r] += m
                kv[r] += m
                used += m
                dec_steps += 1.0
                dec_tokens += m
                if gen[r] >= out_len[r]:
                    used -= kv[r]
                    dec_kv[d, DEC_RESERVED] -= reserve[r]
                    dec[d, DEC_ROUTED] -= 1
                    _finish(r, closed, done_at, arr_at, queue, counters, acc)
                else:
                    d_run[d, keep] = r
                    keep += 1
            dec_kv[d, DEC_USED], acc[A_DEC_STEPS], acc[A_DEC_TOKENS] = used, dec_steps, dec_tokens
            dec[d, DEC_N] = keep
        elif kind == EV_PREFILL_END:
            _end_prefill_iteration(who, in_len, xfer, p_end, pre, dec, link, target, done_pre, chunk, gen, kv, dest,
                                   ready_at, heap, counters, acc, log)
        elif kind == EV_TRANSFER:
            _transfer_arrives(dec, link, dest, ready_at, heap, counters)
        else:
            _enqueue_next(queue, counters, acc)
        start_engines = True  # unless another event is due now: handled before any engine starts
        for d in range(n_decode):
            start_engines = start_engines and d_end[d] > te
        for p in range(n_prefill):
            start_engines = start_engines and p_end[p] > te
        if counters[C_IN_FLIGHT] > 0 and ready_at[heap[0]] <= te:
            start_engines = False
        if not closed and counters[C_ISSUED] < n and arr_at[counters[C_ISSUED]] <= te:
            start_engines = False
    _summarise(res, arr_at, first_at, done_at, out_len, closed, stuck, acc, clients if steady and closed else 0,
               np.empty((0, 2)))


@jit(parallel=True)
def simulate_disagg_rows(in_len, out_len, gaps, clients, rate, n_prefill, n_decode, max_batch, max_tokens, p_cap,
                         d_cap, host, hit, grid, p_g, p_h, p_pair, p_dp, d_g, d_h, d_kv, d_ds, xfer, draft,
                         acceptance, seed, steady=False):
    """``SIM_OUTPUTS`` of every disaggregated configuration (row) of a whole
    deployment (``simulate_disagg_one``): per row the deployment's ``clients``
    (0: Poisson at ``rate``), ``n_prefill`` replicas, ``n_decode`` engines,
    ``max_batch``, ``max_tokens``, per-engine capacities, cost tables of the
    prefill (``p_*``) and decode (``d_*``) replicas, each request's transfer
    seconds ``xfer`` (rows x requests) and ``draft`` tokens; the rest shared as
    in ``simulate_rows``. (n, N_SIM)."""
    n = clients.shape[0]
    out = np.empty((n, N_SIM))
    nolog = np.empty((0, N_LOG))
    for i in prange(n):
        simulate_disagg_one(in_len, out_len, gaps, int(clients[i]), rate[i], int(n_prefill[i]), int(n_decode[i]),
                            int(max_batch[i]), max_tokens[i], p_cap[i], d_cap[i], host, hit, grid, p_g[i], p_h[i],
                            p_pair[i], p_dp[i], d_g[i], d_h[i], d_kv[i], d_ds[i], xfer[i], int(draft[i]), acceptance,
                            seed, out[i], nolog, steady)
    return out


@jit(parallel=True)
def transfer_times(model, tiers, prefill_rows, in_len, devices: float):
    """``kernels.serving.kv_transfer_s`` of each request's prompt (columns) from each
    row's prefill replica (rows): (rows, requests)."""
    n = prefill_rows.shape[0]
    out = np.empty((n, in_len.shape[0]))
    for i in prange(n):
        for r in range(in_len.shape[0]):
            out[i, r] = kv_transfer_s(model[0], tiers, prefill_rows[i], in_len[r], devices)
    return out


@jit
def ep_traffic_table(model, dev, tiers, ideal_tiers, tiles, srv, grid):
    """Seconds of an iteration of ``grid`` tokens (replica rows) that the MoE layers spend
    in communication (``kernels.inference.moe_mlp_s`` on ``tiers`` minus the same on
    ``ideal_tiers``, links without latency or bandwidth limit), all MoE layers: under
    attention DP the expert-parallel dispatch and combine (and expert-TP gathers) of
    ``paraspace trace``'s EP slices; 0 for a dense model."""
    out = np.zeros(grid.shape[0])
    if model.experts <= 0:
        return out
    moe_layers = model.layers - min(model.dense_layers, model.layers)
    for j in range(grid.shape[0]):
        rows = grid[j] / srv.tp if srv.attention_dp > 0 else grid[j]
        out[j] = moe_layers * (moe_mlp_s(model, dev, tiers, tiles, srv, rows)
                               - moe_mlp_s(model, dev, ideal_tiers, tiles, srv, rows))
    return out
