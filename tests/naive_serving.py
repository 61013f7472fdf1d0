"""Plain-Python references of the serving kernels: the analytic steady state
(``kernels.serving.analytic_one``) and the iteration-level simulation
(``kernels.serving_sim.simulate_one``), written for reading, not speed (lists,
a deque, one request at a time). Tests check the kernels against them to
~1e-12; ``bench/bench_serving.py`` times them beside the kernels.

The iteration's cost parts (``rows_s``, ``head_rows_s``, the draft modules'
``draft_prompt_s`` / ``draft_steps_s``: the operator and collective kernels of
``kernels.inference``) are taken as given callables or tables: they are tested
on their own. Speculative decoding: ``draft`` tokens a step, each accepted with
probability ``acceptance``; the simulation draws them with ``unit_draw``."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable

#: spaces.serving.Scheduler's codes: static batches; continuous with chunked prompts; continuous, whole prompts
STATIC, CONTINUOUS, UNCHUNKED = 0, 1, 2
#: the fused attention kernel's fixed part per prompt row, in keys: a causal call over L keys
#: runs at plateau x L / (L + 450) (docs/measurements), L^2 / 2 + 225 L pair-equivalents
ROW_FILL = 225.0


def lookup(grid: list[float], table: list[float], x: float) -> float:
    """Linear interpolation on an ascending grid, extrapolated past the ends, 0 at x <= 0."""
    if x <= 0:
        return 0.0
    j = bisect.bisect_left(grid, x)
    if j < len(grid) and grid[j] == x:
        return table[j]
    j = min(max(j, 1), len(grid) - 1)
    w = (x - grid[j - 1]) / (grid[j] - grid[j - 1])
    return table[j - 1] + w * (table[j] - table[j - 1])


def expected_tokens(acceptance: float, draft: int) -> float:
    """1 + a + a^2 + ... + a^k."""
    return sum(acceptance**j for j in range(draft + 1))


def unit_draw(seed: int, request: int, position: int, draft: int) -> float:
    """kernels.serving_sim.unit_draw: lowbias32 chained over the four numbers."""
    def mix(x: int) -> int:
        x &= 0xFFFFFFFF
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    x = mix(seed ^ 0x9E3779B9)
    for value in (request, position, draft):
        x = mix(x ^ value)
    return x / 2**32


def steady_state(rows: Callable[[float], float], head: Callable[[float], float], kv_coef: float, pair_coef: float,
                 cap_tokens: float, *, input_len: float, output_len: float, hit: float, concurrency: float,
                 rate: float, host: float, max_batch: float, max_tokens: float, scheduler: int, engines: float,
                 devices: float, draft: int = 0, acceptance: float = 0.0, overlap: bool = False,
                 draft_prompt: Callable[[float], float] = lambda t: 0.0,
                 draft_steps: Callable[[float], float] = lambda b: 0.0, accelerate: bool = True,
                 in_step: bool = True) -> dict[str, float]:
    """The analytic tier's closed forms for one candidate (kernels.serving module doc).
    ``accelerate`` False: the Poisson fixed point by plain iteration only, without the
    kernels' linear-piece extrapolation (``kernels.serving.poisson_fixed_point``).
    ``in_step``: every request has the mean lengths (a closed loop whose prompts fit one
    iteration then runs in waves)."""
    new = input_len * (1 - hit)
    pairs_one = new * (input_len - new + new / 2 + ROW_FILL)
    nd = output_len - 1
    q = draft + 1
    e_tok = expected_tokens(acceptance, draft)
    steps = nd / e_tok  # decode iterations a request
    b_max = min(max_batch, math.floor(cap_tokens / (input_len + output_len)))
    static = scheduler == STATIC

    def wave(b: float) -> tuple[float, float]:
        """kernels.serving.wave_s: a static batch's prompts in one iteration, then its decode."""
        prompt = b * new
        pre = host + rows(prompt) + head(b) + pair_coef * b * pairs_one + draft_prompt(prompt)
        dec = 0.0
        if nd > 0:  # step j = 1 .. steps reads input_len + q + (j - 1) e_tok cached tokens
            reads = steps * input_len + steps * q + e_tok * steps * (steps - 1) / 2
            dec = steps * (host + rows(b * q) + head(b * q) + draft_steps(b)) + kv_coef * b * reads
        return pre, dec

    def iteration(b: float, tokens: float, head_rows: float, pairs: float, prompt: float) -> float:
        """kernels.serving.iteration_s beside b decoding requests: ``prompt`` of the tokens prompt tokens."""
        return (host + rows(tokens) + head(head_rows) + kv_coef * b * (input_len + output_len / 2 + q - 1)
                + pair_coef * pairs + draft_prompt(prompt) + draft_steps(b))

    def prompt_iterations(b: float, room: float) -> float:
        """kernels.serving.prompt_iterations_s: the prompt's chunks of ``room`` beside b decoding
        requests, each at its own cost."""
        if room <= 0:
            return math.inf
        chunks = max(math.ceil(new / room), 1)
        last = new - (chunks - 1) * room
        pre = (chunks - 1) * iteration(b, b * q + room, b * q, 0.0, room) if chunks > 1 else 0.0
        return pre + iteration(b, max(b * q + last, 1.0), b * q + 1, pairs_one, last)

    def continuous(b: float) -> tuple[float, float]:
        """kernels.serving.continuous_s: (prefill, decode) of a request among b in service,
        whose users send their prompts in clumps of g (alike requests: as many as the budget
        takes; else 1), each clump k iterations of prompt chunks and ``steps`` of decode, the
        other clumps' chunks x = (b / g - 1) k / (steps + k) to an iteration: its prefill k
        iterations of its own chunk and x others, its decode ``steps`` iterations of x."""
        g = min(b, max(math.floor(max_tokens / new), 1)) if in_step and new > 0 else 1
        k = 1
        for _ in range(8 if scheduler != UNCHUNKED else 0):  # unchunked: the prompts whole
            settled = max(math.ceil(g * new / (max_tokens - b * steps / (steps + k) * q)), 1)
            if settled == k:
                break
            k = settled
        b_d = b * steps / (steps + k)

        def carrying(chunks: float) -> float:  # b_d decoding beside whole chunks of clumps
            return iteration(b_d, max(b_d * q + chunks * g * new / k, 1.0), max(b_d * q + chunks * g / k, 1.0),
                             chunks * g * pairs_one / k, chunks * g * new / k)

        def mean(clumps: float) -> float:  # iterations of floor(clumps) and one more chunk, in shares
            whole = math.floor(clumps)
            return (1 - (clumps - whole)) * carrying(whole) + (clumps - whole) * carrying(whole + 1)

        others = (b / g - 1) * k / (steps + k)
        t = mean(others)
        pre = k * mean(1 + others) + (t if overlap else 0.0)
        return pre, steps * t

    if concurrency > 0:
        # the users over the engines as evenly as they go: C mod E engines hold one more
        users, n_engines = int(concurrency), int(engines)
        groups = [(users // n_engines + 1, users % n_engines), (users // n_engines, n_engines - users % n_engines)]
        per_group = []  # (requests a second of the group, its e2e, ttft, decode time, batch)
        for c, count in groups:
            if c == 0 or count == 0:
                continue
            b = min(c, b_max)
            if static or (in_step and b * new <= max_tokens):  # waves: the users stay in step
                pre, dec = wave(b)
            else:
                b = max(min(b, math.floor((max_tokens - 1) / q)), 1)
                pre, dec = continuous(b)
            period = pre + dec
            per_group.append((count * b / period, c * period / b, c * period / b - dec, dec, b))
        total = sum(g[0] for g in per_group)
        e2e = sum(g[0] * g[1] for g in per_group) / total
        ttft = sum(g[0] * g[2] for g in per_group) / total
        dec = sum(g[0] * g[3] for g in per_group) / total
        b = max(g[4] for g in per_group)
        rps = total / engines
        stable = True
    elif static:
        lam = rate / engines
        b, stable = 1.0, False
        for _ in range(200):
            pre, dec = wave(b)
            nb = max(lam * (pre + dec), 1.0)
            if nb > b_max:
                break
            if abs(nb - b) <= 1e-12 * nb:
                b, stable = nb, True
                break
            b = nb
        ttft = (pre + dec) / 2 + pre
        e2e = ttft + dec
        rps = lam
        if not stable:  # overloaded: waves of the batch limit
            b = b_max
            pre, dec = wave(b)
            rps = min(lam, b / (pre + dec))
            ttft = e2e = math.inf
    else:
        lam = rate / engines

        def fits(x: float) -> bool:  # x's decode batch and tokens within the engine's limits
            return lam * steps * x <= b_max and lam * steps * x * q + lam * x * new <= max_tokens

        def at(x: float) -> float:  # the iteration time F(x)
            b, arrivals = lam * steps * x, lam * x
            return iteration(b, max(b * q + arrivals * new, 1.0), max(b * q + arrivals, 1.0), arrivals * pairs_one,
                             arrivals * new)

        t, stable, before = 0.0, False, []  # before: the iterates before t
        for _ in range(200):
            if not fits(t):
                break
            nt = at(t)
            if abs(nt - t) <= 1e-12 * nt:
                t, stable = nt, True
                break
            if accelerate and len(before) >= 2 and before[-2] < before[-1] < t < nt:
                # the last four iterates on one linear piece of F: try where it meets the diagonal
                r1, r2 = (t - before[-1]) / (before[-1] - before[-2]), (nt - t) / (t - before[-1])
                if 0 < r2 < 1 and abs(r2 - r1) <= 1e-6 * r2:
                    probe = nt + (nt - t) * r2 / (1 - r2)
                    if fits(probe):
                        value = at(probe)
                        if abs(value - probe) <= 1e-12 * value:
                            t, stable = value, True
                            break
            before.append(t)
            t = nt
        b = lam * steps * t
        pre = prompt_iterations(b, new if scheduler == UNCHUNKED else max_tokens - b * q)
        ttft = t / 2 + pre
        if overlap:  # the batch an arrival could join was already scheduled: one iteration more
            ttft += t
        dec = steps * t
        e2e = ttft + dec
        rps = lam
        if not stable:  # overloaded: iterations at the engine's limit, admitting lam x full of the queue
            bounds = [b_max / (lam * steps)] if lam * steps > 0 else []
            if lam * (steps * q + new) > 0:
                bounds.append(max_tokens / (lam * (steps * q + new)))
            full = min(bounds)
            t = at(full)
            b = lam * steps * full
            dec = steps * t
            rps = min(lam, lam * full / t)
            ttft = e2e = math.inf
    tpot = dec / nd if nd > 0 else 0.0
    return {"batch": b, "ttft_s": ttft, "tpot_s": tpot, "e2e_latency_s": e2e, "stable": stable,
            "requests_per_s": rps * engines, "output_tokens_per_s_per_gpu": rps * engines * output_len / devices}


class Front:
    """The workload's side of a run: each request's arrival and completion instants,
    the FIFO of requests waiting, and how many were issued, are in the system and
    have finished. A closed loop of ``clients`` users starts with that many queued
    and sends the next request when one finishes; a Poisson stream arrives at the
    unit ``gaps`` over ``rate``."""

    def __init__(self, n: int, gaps: list[float], clients: int, rate: float) -> None:
        self.n = n
        self.closed = clients > 0
        self.arrive = [0.0] * n
        self.done: list[float | None] = [None] * n
        if not self.closed:
            acc = 0.0
            for r in range(n):
                acc += gaps[r]
                self.arrive[r] = acc / rate
        self.issued = min(clients, n) if self.closed else 0
        self.queue: deque[int] = deque(range(self.issued))
        self.in_system = self.issued
        self.finished = 0

    def arrival(self) -> None:
        """The next request of a Poisson stream joins the queue."""
        self.queue.append(self.issued)
        self.in_system += 1
        self.issued += 1

    def finish(self, r: int, t: float) -> None:
        """Request ``r`` completes at ``t``; in a closed loop its user sends the next."""
        self.done[r] = t
        self.finished += 1
        self.in_system -= 1
        if self.closed and self.issued < self.n:
            self.arrive[self.issued] = t
            self.arrival()


def simulate(in_len: list[float], out_len: list[float], gaps: list[float], *, clients: int, rate: float,
             max_batch: int, max_tokens: float, scheduler: int, cap: float, host: float, kv_coef: float,
             pair_coef: float, hit: float, grid: list[float], g: list[float], h: list[float], draft: int = 0,
             acceptance: float = 0.0, seed: int = 0, dp: list[float] | None = None,
             ds: list[float] | None = None, overlap: bool = False, steady: bool = False) -> dict[str, float]:
    """One engine's continuous- (chunked or not) or static-batching run (kernels.serving_sim module doc);
    ``steady``: a closed loop's latencies without its start-up burst."""
    static = scheduler == STATIC
    n = len(in_len)
    q = draft + 1
    step_count = step_tokens = 0
    front = Front(n, gaps, clients, rate)
    closed, arrive, done, queue = front.closed, front.arrive, front.done, front.queue
    cached = [math.floor(x * hit) for x in in_len]
    first = [None] * n
    gen = [0] * n
    kv = [0.0] * n
    target = [0.0] * n
    computed = [0.0] * n
    running: list[int] = []
    t = area = kv_used = 0.0
    scheduled_at = 0.0  # overlap scheduler: the batch of an iteration is chosen when the one before starts
    preemptions = 0
    while front.finished < n:
        if not closed:
            while front.issued < n and arrive[front.issued] <= t:
                area += t - arrive[front.issued]
                front.arrival()
        if not static or not running:
            late = overlap and bool(running)  # a busy engine chose this batch when the last iteration started
            while queue and len(running) < max_batch:
                r = queue[0]
                if late and arrive[r] >= scheduled_at:
                    break
                need = in_len[r] + gen[r]
                if kv_used + need > cap:
                    break
                queue.popleft()
                running.append(r)
                kv_used += need
                kv[r] = need
                target[r] = need - cached[r]
                computed[r] = 0.0
        if not running:
            assert not queue and not closed and front.issued < n, "stuck"
            t = arrive[front.issued]
            continue
        decoding = {r for r in running if computed[r] >= target[r]}
        while kv_used + len(decoding) * q > cap:
            assert len(running) > 1, "stuck"
            victim = running.pop()
            kv_used -= kv[victim]
            kv[victim] = 0.0
            decoding.discard(victim)
            queue.appendleft(victim)
            preemptions += 1
        budget = math.inf if static else max_tokens - len(decoding) * q
        tokens = rows = kv_read = pairs = prompt = 0.0
        chunks = {}
        for r in running:
            if r in decoding:
                tokens += q
                rows += q
                kv_read += kv[r] + q
            elif budget > 0:
                if scheduler == UNCHUNKED and target[r] - computed[r] > budget:
                    budget = 0  # whole prompts in order: the first that does not fit ends them
                    continue
                c = min(target[r] - computed[r], budget)
                pairs += c * (kv[r] - target[r] + computed[r] + c / 2 + ROW_FILL)
                tokens += c
                prompt += c
                budget -= c
                chunks[r] = c
                if computed[r] + c >= target[r]:
                    rows += 1
        assert tokens > 0, "stuck"  # unchunked: no decodes and the first prompt exceeds max_tokens
        scheduled_at = t
        dt = host + lookup(grid, g, tokens) + lookup(grid, h, rows) + kv_coef * kv_read + pair_coef * pairs
        if draft:
            dt += lookup(grid, dp, prompt) + lookup(grid, ds, len(decoding))
        t += dt
        area += front.in_system * dt
        still = []
        for r in running:
            if r in decoding:
                accepted = 0
                while accepted < draft and unit_draw(seed, r, gen[r], accepted) < acceptance:
                    accepted += 1
                m = min(1 + accepted, int(out_len[r]) - gen[r])
                gen[r] += m
                kv[r] += m
                kv_used += m
                step_count += 1
                step_tokens += m
            elif r in chunks:
                computed[r] += chunks[r]
                if computed[r] >= target[r]:
                    gen[r] += 1
                    if first[r] is None:
                        first[r] = t
            if gen[r] >= out_len[r]:
                kv_used -= kv[r]
                kv[r] = 0.0
                front.finish(r, t)
            else:
                still.append(r)
        running = still
    measured = measured_requests(n, clients, steady)
    ttft = sorted(first[r] - arrive[r] for r in measured)
    tpot = sorted((done[r] - first[r]) / (out_len[r] - 1) for r in measured if out_len[r] > 1)
    e2e = [done[r] - arrive[r] for r in measured]
    return {"ttft_s": sum(ttft) / len(measured), "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "tpot_s": sum(tpot) / len(tpot) if tpot else math.nan, "tpot_p90_s": percentile(tpot, 90) if tpot else math.nan,
            "e2e_latency_s": sum(e2e) / len(measured), "makespan_s": t, "concurrency": area / t, "requests_per_s": n / t,
            "preemptions": preemptions, "tokens_per_step": step_tokens / step_count if step_count else math.nan}


#: a transferred cache's wait for its decode engine's next iteration, in iterations (kernels.serving.ADMIT_WAIT)
ADMIT_WAIT = 0.5


def root(f: Callable[[float], float], lo: float, hi: float) -> float:
    """Where the increasing ``f`` crosses 0 in [lo, hi] (f(lo) < 0 <= f(hi)), to the last bit
    the bisection can reach (not the kernels' fixed count of halvings)."""
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            return hi
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)


def disagg_steady_state(decode_rows: Callable[[float], float], prefill_rows: Callable[[float], float],
                        prefill_head: Callable[[float], float], prefill_pair: float, kv_coef: float, xfer: float,
                        prefill_cap: float, decode_cap: float, *, input_len: float, output_len: float, hit: float,
                        concurrency: float, rate: float, host: float, max_batch: float, max_tokens: float,
                        engines: float, prefill_replicas: float) -> dict[str, float]:
    """A disaggregated candidate's closed forms (kernels.serving.disagg_one), without drafts:
    prefill replicas of k prompts an iteration (t_p, mu = replicas k / t_p), the cache sent in
    ``xfer`` s and admitted half a decode iteration later, decode engines of batch B
    completing X(B) = engines B / (n t_d(B)). A closed loop's prompts do not queue: B makes
    the users add up, or is the batch limit; where X(B) > mu the prefill replicas bound the
    rate. A Poisson stream: B from X(B) = rate, the prompt's time the shorter of the M/D/1
    queues of k-prompt and of one-prompt iterations. ``prefill_cap`` / ``decode_cap``: KV
    tokens a prefill engine / a decode engine holds."""
    new = input_len * (1 - hit)
    pairs_one = new * (input_len - new + new / 2 + ROW_FILL)
    nd = max(output_len - 1, 1.0)

    def prefill(g: float) -> float:
        return host + prefill_rows(g * new) + prefill_head(g) + prefill_pair * g * pairs_one

    k = max(min(math.floor(max_tokens / new), math.floor(prefill_cap / input_len)), 1)
    t_p = prefill(k)
    mu = prefill_replicas * k / t_p
    b_max = min(max_batch, math.floor(decode_cap / (input_len + output_len)))

    def t_d(b: float) -> float:
        return host + decode_rows(b) + kv_coef * b * (input_len + output_len / 2)

    def served(b: float) -> float:
        return engines * b / (nd * t_d(b))

    out = {"prefill_s": t_p, "kv_transfer_s": xfer, "stable": True}
    if concurrency > 0:
        def users(b: float) -> float:
            return engines * b + served(b) * (t_p + xfer + ADMIT_WAIT * t_d(b)) - concurrency

        b = b_max if users(b_max) <= 0 else root(users, 0.0, b_max)
        if served(b) > mu:
            b = root(lambda v: served(v) - mu, 0.0, b)
        x = served(b)
        e2e = concurrency / x
    else:
        x = rate
        if rate >= mu or served(b_max) < rate:
            return {**out, "stable": False}
        b = root(lambda v: served(v) - rate, 0.0, b_max)
        t_1 = prefill(1)
        rho, rho_1 = rate / mu, rate * t_1 / prefill_replicas
        prompt = rho / (2 * (1 - rho)) * t_p + t_p
        if rho_1 < 1:
            prompt = min(prompt, rho_1 / (2 * (1 - rho_1)) * t_1 + t_1)
        e2e = prompt + xfer + ADMIT_WAIT * t_d(b) + nd * t_d(b)
    return {**out, "batch": b, "tpot_s": t_d(b), "e2e_latency_s": e2e, "ttft_s": e2e - nd * t_d(b),
            "requests_per_s": x}


def measured_requests(n: int, clients: int, steady: bool) -> range:
    """The requests the statistics are over: all, or with ``steady`` in a closed loop of
    fewer users than requests, those after the start-up burst (each user's first)."""
    return range(clients, n) if steady and 0 < clients < n else range(n)


def percentile(ordered: list[float], q: float) -> float:
    """numpy's default (linear) percentile of an ascending list."""
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])


def simulate_disagg(in_len: list[float], out_len: list[float], gaps: list[float], *, clients: int, rate: float,
                    n_prefill: int, n_decode: int, max_batch: int, max_tokens: float, p_cap: float, d_cap: float,
                    host: float, hit: float, grid: list[float], p_g: list[float], p_h: list[float], p_pair: float,
                    p_dp: list[float], d_g: list[float], d_h: list[float], d_kv: float, d_ds: list[float],
                    xfer: list[float], draft: int = 0, acceptance: float = 0.0, seed: int = 0,
                    steady: bool = False) -> dict[str, float]:
    """A disaggregated deployment's run (kernels.serving_sim module doc): prefill replicas
    taking prompts from one FIFO, each completed prompt's cache sent to the least-loaded
    decode engine, decode engines admitting whole sequences into their reservation.
    Events at one instant: decode ends, prefill ends, transfers, arrivals (lower index
    first); idle engines start once none is left at that instant, decode engines first.
    Returns ``{"stuck": 1}`` when a request can never be served."""
    n = len(in_len)
    q = draft + 1
    front = Front(n, gaps, clients, rate)
    closed, arrive, done, queue = front.closed, front.arrive, front.done, front.queue
    cached = [math.floor(x * hit) for x in in_len]
    target = [in_len[r] - cached[r] for r in range(n)]
    first: list[float | None] = [None] * n
    gen = [0] * n
    kv = [0.0] * n
    computed = [0.0] * n
    reserve = [0.0] * n
    dest = [0] * n
    prefill = [{"end": None, "members": [], "carry": None} for _ in range(n_prefill)]
    decode = [{"end": None, "waiting": deque(), "running": [], "used": 0.0, "reserved": 0.0, "routed": 0}
              for _ in range(n_decode)]
    transfers: list[tuple[float, int]] = []  # (ready, request), a heap
    t = area = peak = 0.0
    iterations = prefill_iterations = step_count = step_tokens = 0

    def start_decode(engine: dict) -> bool:
        """Admission, then an iteration of the running requests; False if the engine can never admit its next."""
        nonlocal iterations, peak
        waiting, running = engine["waiting"], engine["running"]
        while waiting and len(running) < max_batch:
            r = waiting[0]
            need = in_len[r] + out_len[r] + draft
            if engine["reserved"] + need > d_cap:
                break
            waiting.popleft()
            first[r] = t
            if gen[r] >= out_len[r]:
                engine["routed"] -= 1
                front.finish(r, t)
                continue
            running.append(r)
            engine["reserved"] += need
            reserve[r] = need
            engine["used"] += kv[r]
        if not running:
            return not waiting
        rows = float(len(running) * q)
        kv_read = 0.0
        for r in running:
            kv_read += kv[r] + q
        dt = host + lookup(grid, d_g, rows) + lookup(grid, d_h, rows) + d_kv * kv_read
        if draft:
            dt += lookup(grid, d_ds, len(running))
        peak = max(peak, engine["used"] + len(running) * q)
        engine["end"] = t + dt
        iterations += 1
        return True

    def start_prefill(replica: dict) -> bool:
        """An iteration of up to max_tokens prompt tokens (the cut prompt first, the last one cut);
        False if the queue's head does not fit the replica's cache."""
        nonlocal prefill_iterations
        budget = max_tokens
        tokens = rows = pairs = held = 0.0
        members = []
        while budget > 0:
            if replica["carry"] is not None:
                r, replica["carry"] = replica["carry"], None
            elif queue:
                r = queue[0]
                if in_len[r] > p_cap:
                    return False
                if held + in_len[r] > p_cap:
                    break
                queue.popleft()
            else:
                break
            c = min(target[r] - computed[r], budget)
            pairs += c * (cached[r] + computed[r] + c / 2 + ROW_FILL)
            tokens += c
            budget -= c
            held += in_len[r]
            members.append((r, c))
            if computed[r] + c >= target[r]:
                rows += 1
        if tokens > 0:
            dt = host + lookup(grid, p_g, tokens) + lookup(grid, p_h, rows) + p_pair * pairs
            if draft:
                dt += lookup(grid, p_dp, tokens)
            replica["end"] = t + dt
            replica["members"] = members
            prefill_iterations += 1
        return True

    def due() -> list[tuple[float, int, int]]:
        """The events pending as (time, kind, who), in their order at one instant."""
        events = [(e["end"], 0, d) for d, e in enumerate(decode) if e["end"] is not None]
        events += [(e["end"], 1, p) for p, e in enumerate(prefill) if e["end"] is not None]
        if transfers:
            events.append((transfers[0][0], 2, transfers[0][1]))
        if not closed and front.issued < n:
            events.append((arrive[front.issued], 3, front.issued))
        return events

    start = True
    while front.finished < n:
        if start:
            for engine in decode:
                if engine["end"] is None and not start_decode(engine):
                    return {"stuck": 1}
            for replica in prefill:
                if replica["end"] is None and (replica["carry"] is not None or queue) and not start_prefill(replica):
                    return {"stuck": 1}
            if front.finished == n:
                break
        events = due()
        if not events:
            return {"stuck": 1}
        te, kind, who = min(events, key=lambda e: (e[0], e[1]))  # ties: the kinds' order, then the listing's
        area += front.in_system * (te - t)
        t = te
        if kind == 0:
            engine = decode[who]
            engine["end"] = None
            still = []
            for r in engine["running"]:
                accepted = 0
                while accepted < draft and unit_draw(seed, r, gen[r], accepted) < acceptance:
                    accepted += 1
                m = min(1 + accepted, int(out_len[r]) - gen[r]) if draft else 1
                gen[r] += m
                kv[r] += m
                engine["used"] += m
                step_count += 1
                step_tokens += m
                if gen[r] >= out_len[r]:
                    engine["used"] -= kv[r]
                    engine["reserved"] -= reserve[r]
                    engine["routed"] -= 1
                    front.finish(r, t)
                else:
                    still.append(r)
            engine["running"] = still
        elif kind == 1:
            replica = prefill[who]
            replica["end"] = None
            for r, c in replica["members"]:
                computed[r] += c
                if computed[r] >= target[r]:
                    gen[r] = 1
                    kv[r] = in_len[r]
                    best = min(range(n_decode), key=lambda d: (decode[d]["routed"], d))
                    decode[best]["routed"] += 1
                    dest[r] = best
                    heapq.heappush(transfers, (t + xfer[r], r))
                else:
                    replica["carry"] = r
            replica["members"] = []
        elif kind == 2:
            _, r = heapq.heappop(transfers)
            decode[dest[r]]["waiting"].append(r)
        else:
            front.arrival()
        start = all(e[0] > t for e in due())
    measured = measured_requests(n, clients, steady)
    ttft = sorted(first[r] - arrive[r] for r in measured)
    multi = [r for r in measured if out_len[r] > 1]
    tpot = sorted((done[r] - first[r]) / (out_len[r] - 1) for r in multi)
    e2e = sorted(done[r] - arrive[r] for r in measured)
    return {"stuck": 0, "ttft_s": sum(ttft) / len(measured), "ttft_p50_s": percentile(ttft, 50),
            "ttft_p90_s": percentile(ttft, 90),
            "tpot_s": sum(tpot) / len(tpot) if tpot else 0.0, "tpot_p90_s": percentile(tpot, 90) if tpot else 0.0,
            "e2e_latency_s": sum(e2e) / len(measured), "e2e_p90_s": percentile(e2e, 90), "makespan_s": t, "concurrency": area / t,
            "requests_per_s": n / t, "iterations": iterations, "prefill_iterations": prefill_iterations,
            "kv_peak_tokens": peak, "tokens_per_step": step_tokens / step_count if step_count else math.nan}
