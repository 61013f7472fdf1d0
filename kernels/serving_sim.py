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
   into an empty engine;
3. every running request whose prompt is done decodes one token (with k draft
   tokens: verifies q = k + 1 positions and emits 1 + the number of leading
   accepted drafts, below); if the cache cannot grow by q tokens for each, the
   most recently admitted request is preempted (vLLM's recompute: its cache is
   freed and it goes back to the head of the queue, to re-prefill prompt and
   generated tokens);
4. the rest of ``max_tokens`` (static: no limit) goes to prompt chunks, in
   admission order;
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

Disaggregated deployments (``simulate_disagg_one``) are simulated whole: the
prefill replicas' iterations, each prompt's KV transfer to a decode engine and
the decode engines' iterations, as events in time order (its docstring).

Deterministic: the inputs (lengths, unit gaps) are sampled by the caller from
a seed; ties are broken by request index. A configuration whose head-of-queue
request cannot be admitted into an empty engine, or whose only running
request cannot grow its cache, is *stuck* (``S_STUCK`` = 1, latencies NaN).
Throughput is *sustained* throughput. Closed loop: over the whole run.
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
from paraspace.kernels.serving import kv_transfer_s

# spaces.serving.Scheduler (as kernels.serving)
STATIC = 0

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


@jit(inline=True)
def _start_arrivals(clients: int, gaps, rate: float, queue, arr_at) -> int:
    """The workload's start: a closed loop queues its first ``clients`` requests at 0
    (returned: how many), a Poisson stream gets every arrival time from its gaps (0)."""
    n = arr_at.shape[0]
    if clients > 0:
        issued = min(clients, n)
        for r in range(issued):
            queue[r] = r
        return issued
    acc = 0.0
    for r in range(n):
        acc += gaps[r]
        arr_at[r] = acc / rate
    return 0


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


@jit(inline=True)
def _next_client(t: float, closed: bool, issued: int, arr_at, queue, head: int, count: int) -> int:
    """A closed loop's finished user sends its next request at ``t`` (queued behind
    ``count`` others from ``head``): returns 1 if one was issued."""
    n = arr_at.shape[0]
    if not closed or issued >= n:
        return 0
    arr_at[issued] = t
    queue[(head + count) % n] = issued
    return 1


@jit
def simulate_one(in_len, out_len, gaps, clients: int, rate: float, max_batch: int, max_tokens: float,
                 scheduler: int, cap: float, host: float, kv_coef: float, pair_coef: float, hit: float, grid,
                 g_row, h_row, draft: int, acceptance: float, seed: int, dp_row, ds_row, res, log) -> None:
    """Simulate one engine (module doc) and fill ``res`` (``SIM_OUTPUTS``); each
    iteration is written to ``log`` (``LOG_COLUMNS``) while it has rows."""
    n = in_len.shape[0]
    arr_at = np.zeros(n)
    first_at = np.full(n, -1.0)
    done_at = np.zeros(n)
    gen = np.zeros(n, np.int64)
    kv = np.zeros(n)  # cached tokens held
    target = np.zeros(n)  # prompt tokens to compute since admission
    done_pre = np.zeros(n)
    chunk = np.zeros(n)
    decoding = np.zeros(n, np.bool_)
    cached = np.zeros(n)  # prefix-cache tokens of the prompt
    for r in range(n):
        cached[r] = np.floor(in_len[r] * hit)
    queue = np.zeros(n, np.int64)  # ring buffer
    head = 0
    count = 0
    running = np.zeros(n, np.int64)
    n_run = 0
    closed = clients > 0
    issued = _start_arrivals(clients, gaps, rate, queue, arr_at)
    count = issued
    t = 0.0
    area = 0.0
    n_sys = count
    n_done = 0
    kv_used = 0.0
    kv_peak = 0.0
    iterations = 0
    prefill_iterations = 0
    cursor = 0
    preemptions = 0
    stuck = False
    static = scheduler == STATIC
    q = draft + 1  # positions a decoding request verifies per iteration
    dec_steps = 0.0  # (request, decode iteration) pairs
    dec_tokens = 0.0  # tokens they emitted
    while n_done < n:
        if not closed:
            while issued < n and arr_at[issued] <= t:
                queue[(head + count) % n] = issued
                count += 1
                area += t - arr_at[issued]
                n_sys += 1
                issued += 1
        if not static or n_run == 0:
            while count > 0 and n_run < max_batch:
                r = queue[head]
                need = in_len[r] + gen[r]
                if kv_used + need > cap:
                    break
                head = (head + 1) % n
                count -= 1
                running[n_run] = r
                n_run += 1
                kv_used += need
                kv[r] = need
                target[r] = need - cached[r]
                done_pre[r] = 0.0
        if n_run == 0:
            if count > 0 or closed or issued >= n:
                stuck = True
                break
            t = arr_at[issued]  # idle until the next arrival
            continue
        n_dec = 0
        for i in range(n_run):
            r = running[i]
            decoding[r] = done_pre[r] >= target[r]
            if decoding[r]:
                n_dec += 1
        while kv_used + n_dec * q > cap:  # preempt the latest admitted (recompute later)
            if n_run == 1:
                stuck = True
                break
            victim = running[n_run - 1]
            n_run -= 1
            kv_used -= kv[victim]
            kv[victim] = 0.0
            if decoding[victim]:
                n_dec -= 1
                decoding[victim] = False
            head = (head - 1) % n
            queue[head] = victim
            count += 1
            preemptions += 1
        if stuck:
            break
        # decode only (no drafts to draw): fast-forward the iterations in which nothing but the KV lengths change
        if n_dec == n_run and draft == 0:
            ahead = np.inf
            kv_read = 0.0
            for i in range(n_run):
                r = running[i]
                ahead = min(ahead, out_len[r] - gen[r] - 1.0)  # none of them completes
                kv_read += kv[r] + 1.0
            ahead = min(ahead, np.floor((cap - kv_used) / n_dec))  # the cache grows n_dec a step
            if ahead >= 2.0:
                base = host + lookup(grid, g_row, float(n_dec)) + lookup(grid, h_row, float(n_dec))
                steps = 0
                while steps < ahead:
                    if not closed and issued < n and arr_at[issued] <= t:
                        break  # an arrival to enqueue: back to the full iteration
                    dt = base + kv_coef * kv_read + pair_coef * 0.0
                    cursor = _record(log, cursor, 0, LOG_DECODE, t, t + dt, float(n_dec), float(n_dec), 0.0, kv_used + n_dec,
                                     0.0, -1, -1)
                    t += dt
                    area += n_sys * dt
                    kv_read += n_dec
                    kv_peak = max(kv_peak, kv_used + n_dec)
                    kv_used += n_dec
                    steps += 1
                if steps > 0:
                    iterations += steps
                    dec_steps += steps * n_dec
                    dec_tokens += steps * n_dec
                    for i in range(n_run):
                        r = running[i]
                        gen[r] += steps
                        kv[r] += steps
                    continue
        budget = np.inf if static else max_tokens - n_dec * q
        tokens = 0.0
        rows = 0.0
        kv_read = 0.0
        pairs = 0.0
        prompt = 0.0
        for i in range(n_run):
            r = running[i]
            if decoding[r]:
                tokens += q
                rows += q
                kv_read += kv[r] + q
            elif budget > 0.0:
                c = min(target[r] - done_pre[r], budget)
                prior = kv[r] - target[r] + done_pre[r]
                pairs += c * (prior + 0.5 * c)
                tokens += c
                prompt += c
                budget -= c
                chunk[r] = c
                if done_pre[r] + c >= target[r]:
                    rows += 1.0
        dt = host + lookup(grid, g_row, tokens) + lookup(grid, h_row, rows) + kv_coef * kv_read + pair_coef * pairs
        if draft > 0:
            dt += lookup(grid, dp_row, prompt) + lookup(grid, ds_row, float(n_dec))
        kind = LOG_DECODE if prompt <= 0.0 else (LOG_PREFILL if n_dec == 0 else LOG_MIXED)
        cursor = _record(log, cursor, 0, kind, t, t + dt, tokens, float(n_run), prompt, kv_used + n_dec * q, 0.0, -1,
                         -1)
        t += dt
        area += n_sys * dt
        iterations += 1
        if prompt > 0.0:
            prefill_iterations += 1
        kv_peak = max(kv_peak, kv_used + n_dec * q)
        keep = 0
        for i in range(n_run):
            r = running[i]
            if decoding[r]:
                m = _emitted(seed, r, gen[r], out_len[r], draft, acceptance)
                gen[r] += m
                kv[r] += m
                kv_used += m
                dec_steps += 1.0
                dec_tokens += m
            elif chunk[r] > 0.0:
                done_pre[r] += chunk[r]
                chunk[r] = 0.0
                if done_pre[r] >= target[r]:
                    gen[r] += 1
                    if first_at[r] < 0.0:
                        first_at[r] = t
            if gen[r] >= out_len[r]:
                done_at[r] = t
                kv_used -= kv[r]
                kv[r] = 0.0
                n_done += 1
                n_sys -= 1
                k = _next_client(t, closed, issued, arr_at, queue, head, count)
                count += k
                n_sys += k
                issued += k
            else:
                running[keep] = r
                keep += 1
        n_run = keep
    _summarise(res, arr_at, first_at, done_at, out_len, closed, stuck, t, area, iterations, prefill_iterations,
               preemptions, kv_peak, dec_steps, dec_tokens)


@jit
def _summarise(res, arr_at, first_at, done_at, out_len, closed: bool, stuck: bool, t: float, area: float,
               iterations: float, prefill_iterations: float, preemptions: float, kv_peak: float, dec_steps: float,
               dec_tokens: float) -> None:
    """``res`` (``SIM_OUTPUTS``) from a run's per-request instants (module doc)."""
    n = arr_at.shape[0]
    for k in range(N_SIM):
        res[k] = np.nan
    res[S_ITERATIONS] = iterations
    res[S_PREFILL_ITERATIONS] = prefill_iterations
    res[S_PREEMPTIONS] = preemptions
    res[S_KV_PEAK] = kv_peak
    res[S_STUCK] = 1.0 if stuck else 0.0
    if stuck:
        return
    if dec_steps > 0.0:
        res[S_TOKENS_PER_STEP] = dec_tokens / dec_steps
    ttft = first_at - arr_at
    e2e = done_at - arr_at
    multi = out_len > 1
    res[S_TTFT] = ttft.mean()
    res[S_TTFT_P50] = np.percentile(ttft, 50.0)
    res[S_TTFT_P90] = np.percentile(ttft, 90.0)
    if multi.any():
        tpot = (done_at[multi] - first_at[multi]) / (out_len[multi] - 1.0)
        res[S_TPOT] = tpot.mean()
        res[S_TPOT_P50] = np.percentile(tpot, 50.0)
        res[S_TPOT_P90] = np.percentile(tpot, 90.0)
    else:  # every request ends with its first token: no time between tokens (the analytic tier's 0)
        res[S_TPOT] = 0.0
        res[S_TPOT_P50] = 0.0
        res[S_TPOT_P90] = 0.0
    res[S_E2E] = e2e.mean()
    res[S_E2E_P90] = np.percentile(e2e, 90.0)
    res[S_MAKESPAN] = t
    res[S_RPS] = n / t
    overloaded = False
    fifth = n // 5
    if not closed and fifth > 0:
        overloaded = ttft[n - fifth:].mean() > 2.0 * ttft[fifth:2 * fifth].mean()
    res[S_OVERLOADED] = 1.0 if overloaded else 0.0
    start = 0.0
    stop = t
    if overloaded:
        start = arr_at[fifth]
    elif not closed:
        stop = arr_at[n - 1]
    served = 0.0
    tokens_served = 0.0
    for r in range(n):
        if overloaded and not start < done_at[r] <= stop:
            continue
        served += 1.0
        tokens_served += out_len[r]
    res[S_SUSTAINED_RPS] = served / (stop - start)
    res[S_OTPS] = tokens_served / (stop - start)
    res[S_CONCURRENCY] = area / t


@jit(parallel=True)
def simulate_rows(in_len, out_len, gaps, clients, rate, max_batch, max_tokens, scheduler, cap, host, kv_coef,
                  pair_coef, hit, grid, g_table, h_table, draft, acceptance, seed, dp_table, ds_table):
    """``SIM_OUTPUTS`` for every configuration (row): per-row ``clients`` (0: Poisson
    at ``rate``), ``max_batch``, ``max_tokens``, ``scheduler``, KV ``cap`` tokens,
    ``kv_coef``, ``pair_coef``, ``draft`` tokens and cost tables
    (``kernels.serving.cost_tables``); the request lengths, unit gaps, ``host``,
    ``hit``, the draft ``acceptance`` and the draws' ``seed`` (below 2^32) are
    shared. (n, N_SIM)."""
    n = clients.shape[0]
    out = np.empty((n, N_SIM))
    nolog = np.empty((0, N_LOG))
    for i in prange(n):
        simulate_one(in_len, out_len, gaps, int(clients[i]), rate[i], int(max_batch[i]), max_tokens[i],
                     int(scheduler[i]), cap[i], host, kv_coef[i], pair_coef[i], hit, grid, g_table[i], h_table[i],
                     int(draft[i]), acceptance, seed, dp_table[i], ds_table[i], out[i], nolog)
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


@jit
def simulate_disagg_one(in_len, out_len, gaps, clients: int, rate: float, n_prefill: int, n_decode: int,
                        max_batch: int, max_tokens: float, p_cap: float, d_cap: float, host: float, hit: float, grid,
                        p_g, p_h, p_pair: float, p_dp, d_g, d_h, d_kv: float, d_ds, xfer, draft: int,
                        acceptance: float, seed: int, res, log) -> None:
    """Simulate a whole disaggregated deployment and fill ``res`` (``SIM_OUTPUTS``);
    every iteration and KV transfer is written to ``log`` while it has rows.

    Two stages (issue 15; DistServe, Zhong et al. OSDI 2024, arXiv:2401.09670):

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

    Events at one instant are handled in the order decode iteration ends,
    prefill iteration ends, transfer completions (by time, then request),
    arrivals, lower engine index first; idle engines then start, decode engines
    before prefill replicas. ``S_ITERATIONS`` counts the decode engines'
    iterations, ``S_PREFILL_ITERATIONS`` the prefill replicas', ``S_KV_PEAK``
    the largest high-water mark of one decode engine's cache. Stuck (``S_STUCK``)
    when a prompt exceeds the prefill replica's cache or a request's sequence a
    decode engine's. The prefill side's cache is freed when the prompt
    completes (the transfers' milliseconds in flight are not held against it).
    """
    n = in_len.shape[0]
    P = n_prefill
    D = n_decode
    q = draft + 1
    arr_at = np.zeros(n)
    first_at = np.full(n, -1.0)
    done_at = np.zeros(n)
    ready_at = np.zeros(n)
    gen = np.zeros(n, np.int64)
    kv = np.zeros(n)
    reserve = np.zeros(n)
    target = np.zeros(n)
    done_pre = np.zeros(n)
    chunk = np.zeros(n)
    dest = np.zeros(n, np.int64)
    link = np.full(n, -1, np.int64)  # next member of a prefill iteration, or next in a decode engine's queue
    cached = np.zeros(n)
    for r in range(n):
        cached[r] = np.floor(in_len[r] * hit)
        target[r] = in_len[r] - cached[r]
    queue = np.zeros(n, np.int64)  # the prefill FIFO (ring buffer)
    head = 0
    count = 0
    p_busy = np.zeros(P, np.bool_)
    p_end = np.zeros(P)
    p_first = np.full(P, -1, np.int64)
    p_last = np.full(P, -1, np.int64)
    carry = np.full(P, -1, np.int64)  # the prompt a replica cut at its last iteration
    d_busy = np.zeros(D, np.bool_)
    d_end = np.zeros(D)
    d_head = np.full(D, -1, np.int64)
    d_tail = np.full(D, -1, np.int64)
    d_run = np.zeros((D, max(max_batch, 1)), np.int64)
    d_n = np.zeros(D, np.int64)
    d_used = np.zeros(D)  # cached tokens held
    d_res = np.zeros(D)  # tokens reserved by the admitted requests
    d_routed = np.zeros(D, np.int64)
    heap = np.zeros(n, np.int64)  # transfers in flight, by ready_at
    n_heap = 0
    closed = clients > 0
    issued = _start_arrivals(clients, gaps, rate, queue, arr_at)
    count = issued
    n_sys = count
    t = 0.0
    area = 0.0
    n_done = 0
    d_iters = 0
    p_iters = 0
    cursor = 0
    kv_peak = 0.0
    dec_steps = 0.0
    dec_tokens = 0.0
    stuck = False
    start_engines = True
    while n_done < n:
        if start_engines:
            for d in range(D):  # decode first: an admission that completes a request can queue a prompt
                if d_busy[d]:
                    continue
                while d_head[d] >= 0 and d_n[d] < max_batch:
                    r = d_head[d]
                    need = in_len[r] + out_len[r] + draft
                    if d_res[d] + need > d_cap:
                        break
                    d_head[d] = link[r]
                    if d_head[d] < 0:
                        d_tail[d] = -1
                    link[r] = -1
                    first_at[r] = t
                    if gen[r] >= out_len[r]:  # the first token was the last
                        done_at[r] = t
                        d_routed[d] -= 1
                        n_done += 1
                        n_sys -= 1
                        k = _next_client(t, closed, issued, arr_at, queue, head, count)
                        count += k
                        n_sys += k
                        issued += k
                        continue
                    d_run[d, d_n[d]] = r
                    d_n[d] += 1
                    d_res[d] += need
                    reserve[r] = need
                    d_used[d] += kv[r]
                if d_n[d] == 0:
                    if d_head[d] >= 0:  # its next request cannot fit an empty engine
                        stuck = True
                        break
                    continue
                kv_read = 0.0
                for i in range(d_n[d]):
                    kv_read += kv[d_run[d, i]] + q
                rows = float(d_n[d] * q)
                dt = host + lookup(grid, d_g, rows) + lookup(grid, d_h, rows) + d_kv * kv_read
                if draft > 0:
                    dt += lookup(grid, d_ds, float(d_n[d]))
                high = d_used[d] + d_n[d] * q
                kv_peak = max(kv_peak, high)
                cursor = _record(log, cursor, P + d, LOG_DECODE, t, t + dt, rows, float(d_n[d]), 0.0, high, d_res[d],
                                 -1, -1)
                d_busy[d] = True
                d_end[d] = t + dt
                d_iters += 1
            if stuck:
                break
            for p in range(P):
                if p_busy[p] or (carry[p] < 0 and count == 0):
                    continue
                budget = max_tokens
                tokens = 0.0
                rows = 0.0
                pairs = 0.0
                held = 0.0
                while budget > 0.0:
                    r = carry[p]
                    if r >= 0:
                        carry[p] = -1
                    elif count > 0:
                        r = queue[head]
                        if in_len[r] > p_cap:
                            stuck = True
                            break
                        if held + in_len[r] > p_cap:
                            break
                        head = (head + 1) % n
                        count -= 1
                    else:
                        break
                    c = min(target[r] - done_pre[r], budget)
                    prior = cached[r] + done_pre[r]
                    pairs += c * (prior + 0.5 * c)
                    tokens += c
                    budget -= c
                    held += in_len[r]
                    chunk[r] = c
                    if done_pre[r] + c >= target[r]:
                        rows += 1.0
                    if p_first[p] < 0:
                        p_first[p] = r
                    else:
                        link[p_last[p]] = r
                    p_last[p] = r
                if stuck:
                    break
                if tokens <= 0.0:
                    continue
                dt = host + lookup(grid, p_g, tokens) + lookup(grid, p_h, rows) + p_pair * pairs
                if draft > 0:
                    dt += lookup(grid, p_dp, tokens)
                cursor = _record(log, cursor, p, LOG_PREFILL, t, t + dt, tokens, rows, tokens, held, 0.0, -1, -1)
                p_busy[p] = True
                p_end[p] = t + dt
                p_iters += 1
            if stuck:
                break
        # the next event (module order: decode ends, prefill ends, transfers, arrivals)
        te = np.inf
        kind = -1
        who = -1
        for d in range(D):
            if d_busy[d] and d_end[d] < te:
                te = d_end[d]
                kind = 0
                who = d
        for p in range(P):
            if p_busy[p] and p_end[p] < te:
                te = p_end[p]
                kind = 1
                who = p
        if n_heap > 0 and ready_at[heap[0]] < te:
            te = ready_at[heap[0]]
            kind = 2
            who = heap[0]
        if not closed and issued < n and arr_at[issued] < te:
            te = arr_at[issued]
            kind = 3
            who = issued
        if kind < 0:  # nothing in flight and requests left: no engine can take them
            stuck = True
            break
        area += n_sys * (te - t)
        t = te
        if kind == 0:
            d = who
            d_busy[d] = False
            keep = 0
            for i in range(d_n[d]):
                r = d_run[d, i]
                m = _emitted(seed, r, gen[r], out_len[r], draft, acceptance)
                gen[r] += m
                kv[r] += m
                d_used[d] += m
                dec_steps += 1.0
                dec_tokens += m
                if gen[r] >= out_len[r]:
                    done_at[r] = t
                    d_used[d] -= kv[r]
                    d_res[d] -= reserve[r]
                    d_routed[d] -= 1
                    n_done += 1
                    n_sys -= 1
                    k = _next_client(t, closed, issued, arr_at, queue, head, count)
                    count += k
                    n_sys += k
                    issued += k
                else:
                    d_run[d, keep] = r
                    keep += 1
            d_n[d] = keep
        elif kind == 1:
            p = who
            p_busy[p] = False
            r = p_first[p]
            p_first[p] = -1
            p_last[p] = -1
            while r >= 0:
                nxt = link[r]
                link[r] = -1
                done_pre[r] += chunk[r]
                chunk[r] = 0.0
                if done_pre[r] >= target[r]:
                    gen[r] = 1
                    kv[r] = in_len[r]
                    best = 0
                    for d in range(1, D):
                        if d_routed[d] < d_routed[best]:
                            best = d
                    d_routed[best] += 1
                    dest[r] = best
                    ready_at[r] = t + xfer[r]
                    n_heap = _heap_push(heap, n_heap, ready_at, r)
                    cursor = _record(log, cursor, p, LOG_TRANSFER, t, ready_at[r], in_len[r], 1.0, 0.0, 0.0, 0.0,
                                     P + best, r)
                else:
                    carry[p] = r
                r = nxt
        elif kind == 2:
            r = who
            n_heap = _heap_pop(heap, n_heap, ready_at)
            d = dest[r]
            if d_tail[d] < 0:
                d_head[d] = r
            else:
                link[d_tail[d]] = r
            d_tail[d] = r
        else:
            queue[(head + count) % n] = issued
            count += 1
            n_sys += 1
            issued += 1
        # another event at this instant: handle it before any engine starts
        start_engines = True
        for d in range(D):
            if d_busy[d] and d_end[d] <= t:
                start_engines = False
        for p in range(P):
            if p_busy[p] and p_end[p] <= t:
                start_engines = False
        if n_heap > 0 and ready_at[heap[0]] <= t:
            start_engines = False
        if not closed and issued < n and arr_at[issued] <= t:
            start_engines = False
    _summarise(res, arr_at, first_at, done_at, out_len, closed, stuck, t, area, d_iters, p_iters, 0.0, kv_peak,
               dec_steps, dec_tokens)


@jit(parallel=True)
def simulate_disagg_rows(in_len, out_len, gaps, clients, rate, n_prefill, n_decode, max_batch, max_tokens, p_cap,
                         d_cap, host, hit, grid, p_g, p_h, p_pair, p_dp, d_g, d_h, d_kv, d_ds, xfer, draft,
                         acceptance, seed):
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
                            seed, out[i], nolog)
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
