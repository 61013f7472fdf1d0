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

from paraspace.kernels.jit import jit

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
)
N_SIM = len(SIM_OUTPUTS)
(
    S_TTFT, S_TTFT_P50, S_TTFT_P90, S_TPOT, S_TPOT_P50, S_TPOT_P90, S_E2E, S_E2E_P90, S_OTPS, S_RPS, S_CONCURRENCY,
    S_MAKESPAN, S_ITERATIONS, S_PREEMPTIONS, S_KV_PEAK, S_STUCK, S_SUSTAINED_RPS, S_OVERLOADED, S_TOKENS_PER_STEP,
) = range(N_SIM)

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


@jit
def simulate_one(in_len, out_len, gaps, clients: int, rate: float, max_batch: int, max_tokens: float,
                 scheduler: int, cap: float, host: float, kv_coef: float, pair_coef: float, hit: float, grid,
                 g_row, h_row, draft: int, acceptance: float, seed: int, dp_row, ds_row, res) -> None:
    """Simulate one engine (module doc) and fill ``res`` (``SIM_OUTPUTS``)."""
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
    issued = 0
    if closed:
        issued = min(clients, n)
        for r in range(issued):
            queue[(head + count) % n] = r
            count += 1
    else:
        acc = 0.0
        for r in range(n):
            acc += gaps[r]
            arr_at[r] = acc / rate
    t = 0.0
    area = 0.0
    n_sys = count
    n_done = 0
    kv_used = 0.0
    kv_peak = 0.0
    iterations = 0
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
        t += dt
        area += n_sys * dt
        iterations += 1
        kv_peak = max(kv_peak, kv_used + n_dec * q)
        keep = 0
        for i in range(n_run):
            r = running[i]
            if decoding[r]:
                m = 1
                if draft > 0:
                    accepted = 0
                    while accepted < draft and unit_draw(seed, r, gen[r], accepted) < acceptance:
                        accepted += 1
                    m = min(1 + accepted, int(out_len[r]) - gen[r])
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
                if closed and issued < n:
                    arr_at[issued] = t
                    queue[(head + count) % n] = issued
                    count += 1
                    n_sys += 1
                    issued += 1
            else:
                running[keep] = r
                keep += 1
        n_run = keep
    for k in range(N_SIM):
        res[k] = np.nan
    res[S_ITERATIONS] = iterations
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
    for i in prange(n):
        simulate_one(in_len, out_len, gaps, int(clients[i]), rate[i], int(max_batch[i]), max_tokens[i],
                     int(scheduler[i]), cap[i], host, kv_coef[i], pair_coef[i], hit, grid, g_table[i], h_table[i],
                     int(draft[i]), acceptance, seed, dp_table[i], ds_table[i], out[i])
    return out
