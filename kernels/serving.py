"""Serving analytic tier: engine iteration times, KV capacity and the steady state
of a deployment under a closed-loop or Poisson workload (issue 15, modeling.md
section 8). Arrays in, arrays out; one row per candidate, ``prange`` over chunks of
rows that share a replica (``analytic_rows``).

Engines
-------
A candidate runs ``instances`` copies of one replica of ``tp * pp`` devices
(``kernels.inference``'s layout: TP or attention-DP attention, experts over
``ep``). A replica with ``pp`` stages runs ``pp`` *engines* side by side (vLLM's
virtual engines: each schedules its own batch and its iterations pass through
every stage while the other engines' iterations occupy the other stages), so an
engine's iteration takes the full forward latency, it owns ``1 / pp`` of the
replica's KV cache, and the deployment has ``instances * pp`` engines that
split the workload: a closed loop's C users as evenly as they go (``engine_users``:
ceil(C / E) users on C mod E engines, floor(C / E) on the others, idle where C < E),
a Poisson stream evenly (``rate / engines`` each).

One iteration
-------------
An iteration runs ``tokens`` rows (one per decoding request plus the prefill
chunks) through every layer, the LM head on ``rows`` sequences that emit a
token, decode attention reading ``kv_read`` cached tokens and prefill attention
over ``pairs`` causal (query, key) pairs::

    iteration_s = host_s + rows_s(tokens) + head_rows_s(rows) + kv_s_per_token * kv_read + pair_s * pairs
                  (+ the draft modules' passes, "Speculative decoding" below)

``rows_s`` is ``kernels.inference.forward_s`` of ``tokens`` one-token sequences
over an empty cache minus its head: every GEMM at m = tokens (reading its whole
weight until the ridge), the MoE experts those tokens hit (1 - (1 - k/E)^T),
the EP dispatch under attention DP, TP all-reduces, pipeline sends and every
kernel's launch. ``kv_s_per_token`` is the slope of a decode step in its KV
length (memory-bound: the KV bytes of a token over the achieved HBM bandwidth,
all layers). ``pair_s`` is the attention core's FLOP per causal pair, 2 x
heads / tp x (qk + v dims) per layer, at the attention peak (added to, not
overlapped with, the rows' Q/O traffic). A chunk of ``c`` prompt tokens after
``p`` cached ones makes c * (p + c / 2) pairs, and each of its rows also pays the
fused kernel's fixed part, ``ROW_FILL_KEYS`` (225) keys' worth: c * (p + c / 2 + 225)
pair-equivalents, so a prompt's chunks sum to in * (p0 + in / 2 + 225) however it is
cut. For a whole prompt of L keys that is L^2 / 2 x (L + 450) / L, the measured
causal law plateau x L / (L + 450) (``kernels.ops.loop_fill``), the rate
``kernels.inference``'s prefill already runs at.

Steady state (per engine)
-------------------------
KV capacity: ``kv_fraction`` of the HBM beside the weights and the device's
overhead over the KV bytes of a token (``kernels.inference.kv_capacity``'s
terms), times tp under attention DP; an engine holds B_kv = floor(capacity /
(in + out)) whole requests.

- Closed loop, c users per engine, B = min(c, max_batch, B_kv, floor((max_tokens
  - 1) / q)) of them in service, the rest queued. Continuous batching
  (``continuous_s``): the users send their prompts in clumps of g, one by one
  where lengths differ, and where every request is alike as many as one
  iteration's budget takes, g = min(B, floor(max_tokens / in)) (users that start
  together finish together and send again together: the simulation keeps such
  clumps). A clump's prompts take k iterations (k = ceil(g in / room), room =
  max_tokens - b q the budget the decode rows leave; unchunked: 1) and each
  request n = (out - 1) / E decoding, so an iteration holds b = B n / (n + k)
  decoding requests, and over a request's n + k iterations the other B / g - 1
  clumps' k chunks each fall x = (B / g - 1) k / (n + k) to an iteration. An
  iteration's time is not linear in its tokens (a decode batch reads the weights
  whatever a chunk beside it adds, until its GEMMs turn compute-bound), so an
  iteration of x chunks is timed as iterations of floor(x) and floor(x) + 1 whole
  chunks in the shares whose mean is x (``continuous_s``; the time of the
  mean composition let the weight reads hide the prompts: 13% more throughput than
  simulated on the Llama 3.1 70B space): the prefill is k iterations of its own
  chunk and x others (one iteration more under the overlap scheduler), the decode
  n iterations of x chunks.
  Static batching runs waves (``wave_s``): the prefill of B prompts in one
  iteration, then out - 1 decode iterations at batch B whose KV reads are in +
  j, j = 1 .. out - 1; so does a continuous scheduler whose users send alike
  requests (constant lengths) and whose budget takes the B prompts in one
  iteration: its users start together and finish together, wave after wave (the
  simulation's degenerate case: one clump). Either way period = prefill + decode;
  throughput B / period requests a second; by Little's law e2e = c * period / B;
  TTFT = e2e - decode; TPOT = decode / (out - 1). (Waves under a continuous
  scheduler, the model before 2026-11-27, put every prompt of a wave ahead of every
  first token: on the Llama 3.1 70B space their TTFT was a median 5.6x the
  simulation's, TPOT 0.62x; now 1.01x and 1.006x.) Engines with different user counts (C not a
  multiple of E) run their own; the deployment serves the sum of their
  rates, and its latencies are means over its requests (each group's weighted by
  the requests it completes), so rate x e2e = C.
- Poisson at lambda per engine, continuous: the iteration time t solves
  t = iteration_s(B q + lambda t in, B q + lambda t, B (in + out / 2 + q - 1),
  lambda t pairs) with B = lambda (out - 1) t / E decoding requests (the least
  fixed point, ``poisson_fixed_point``: iterated from t = 0, and extrapolated
  along a linear piece of the iteration time where the iterates show one;
  unstable when it diverges or B exceeds the batch or KV limit or the tokens
  exceed max_tokens; q = 1 and E = 1 without drafts). TPOT = t / E.
  TTFT = t / 2 (the iteration under way when it arrives) + the iterations that
  carry its prompt (``prompt_iterations_s``): ceil(in / (max_tokens - B q))
  chunks of the room the decode batch leaves (unchunked: the prompt whole in
  one), each iteration the B decoding requests' q rows plus that chunk, at its
  own cost (t is the mean iteration, in which a prompt is a fraction lambda t in
  of the tokens; the prompt's own iterations carry all of it); with the overlap
  scheduler one iteration t more (the batch an arrival could join was scheduled
  before it came). Unstable (overloaded), the engine runs at its limit: t_s,
  where B reaches the batch limit or the tokens max_tokens (``saturated_t``),
  sets an iteration of F(t_s) seconds that admits lambda t_s requests, as many as
  finish, so it serves lambda t_s / F(t_s) requests a second whatever lambda is
  offered (lambda t_s does not depend on it), and TPOT = F(t_s) / E; TTFT is
  infinite (the queue grows without bound). Where the iteration time grows less
  than its load (F's arguments are lambda t times constants), that rate is the
  largest at which the engine is stable: there F(t_s) = t_s.
- Poisson, static: waves of the B requests that arrived during the last one, B
  = lambda period(B) (fixed point); TTFT = period / 2 + prefill. Overloaded, waves
  of the batch limit: bmax / period(bmax) requests a second.

Disaggregated candidates (``disagg_one``): prefill replicas and decode
replicas apart, the prompt's KV cache sent between them (``kv_transfer_s``).

Speculative decoding / multi-token prediction
---------------------------------------------
With ``k = draft_tokens`` > 0 (the ``SERVING`` record) a decode step drafts k
tokens per sequence and verifies q = k + 1 positions (the last token and the
drafts) in one target forward: its GEMMs at m = b q rows, the head on b q rows,
and attention reading each sequence's cache once for its q queries
(``kernels.inference.verify_attention_block_s``). Each draft is accepted with
probability a (the workload's ``acceptance_rate``) until the first rejection,
so a sequence emits 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens a step
on average (``expected_tokens``; Leviathan et al. 2023, arXiv:2211.17192,
eq. 1) and its cache grows by as many.

The draft is a *module*: one transformer layer of the model's own kind (MoE
when the model's last layer is) after a 2h -> h projection of the token's
embedding and the target's last hidden state, sharing the model's embedding
and LM head. That is DeepSeek-V3's MTP module (arXiv:2412.19437, section 2.2;
a model with ``mtp_depth`` D uses min(k, D) of its own, the k steps cycling
through them, as TensorRT-LLM's "MTP Eagle" mode reuses DeepSeek-V3's single
module for every draft) and EAGLE's draft head (one decoder layer after a
fully connected 2h -> h layer; Li et al. 2024, arXiv:2401.15077), the generic
speculator of a model without MTP modules. DeepSeek-V3 reports 85-90%
acceptance of its second-token prediction and 1.8x the tokens per second
(section 5.4.3). Costs, each 0 when k = 0:

- weights: the modules on the last stage's devices (``draft_weight_bytes``);
- KV: each module keeps a layer's cache (``replica_kv_bytes_per_token``);
- a decode step of b sequences: k module passes over b rows, each with the
  head on b rows (``draft_steps_s``), and k reads of a module's cache;
- prefill: every prompt token passes the modules once, building their caches
  (``draft_prompt_s``, and their causal pairs in ``pair_s``).

In the closed forms a request needs (out - 1) / E decode steps (E =
``expected_tokens``) whose KV reads are in + q + (j - 1) E, j = 1 ..; TPOT =
decode time / (out - 1) as before. The drafting of one step is charged whole
to it (engines overlap little of it: the draft needs the verified token).

The simulation (``kernels.serving_sim``) takes the same iteration cost, as a
table over token counts, and in the degenerate cases reproduces these closed
forms exactly.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from paraspace.kernels.codes import SEND_RECV
from paraspace.kernels.collectives import flat_time_s, link_bytes_per_s
from paraspace.kernels.inference import (
    attention_block_s,
    attention_ranks,
    dense_mlp_s,
    forward_head_s,
    forward_s,
    head_s,
    kv_bytes_per_token,
    kv_units,
    moe_mlp_s,
    slot_share,
    stage_weight_bytes,
    verify_attention_block_s,
)
from paraspace.kernels.jit import jit
from paraspace.kernels.ops import ATTENTION_FWD_FILL_KEYS, attention_peak, gemm_time_s, memory_bound_s
from paraspace.kernels.training import device_layers, layer_params, moe_layer_params

# spaces.serving.Scheduler
STATIC = 0
CONTINUOUS = 1
UNCHUNKED = 2

# spaces.serving.Mode
AGG = 0
DISAGG = 1

# spaces.serving.Feasible
OK = 0
WEIGHTS_OOM = 1
KV_TOO_SMALL = 2
OVERLOADED = 3
SLA_TTFT = 4
SLA_TTFT_P90 = 5
SLA_TPOT = 6
SLA_TPOT_P90 = 7
PROMPT_TOO_LONG = 8
MEMORY_CAP = 9  # set by a study's --max-mem (explorer.serve_study), never by the kernels

#: The workload and engine scalars every row shares.
SERVING_WORKLOAD = np.dtype(
    [
        ("input_len", np.float64),  # mean prompt tokens
        ("output_len", np.float64),  # mean generated tokens (the first comes from the prefill iteration)
        ("longest_seq_len", np.float64),  # the longest request (prompt + output) the workload sends
        ("longest_prompt_len", np.float64),  # the most prompt tokens a request computes (beside its prefix-cache hit)
        ("longest_input_len", np.float64),  # the longest prompt, its prefix-cache hit included (what a cache holds)
        ("prefix_hit_rate", np.float64),  # share of a prompt found in the prefix cache
        ("concurrency", np.float64),  # closed-loop users of the deployment (0: Poisson)
        ("rate_per_s", np.float64),  # Poisson requests/s of the deployment (0: closed loop)
        ("devices", np.float64),
        ("host_s", np.float64),  # host and scheduler time per iteration
        ("kv_fraction", np.float64),
        ("acceptance_rate", np.float64),  # probability each draft token is accepted (speculative decoding)
        ("sla_ttft_s", np.float64),  # 0: not checked
        ("sla_ttft_p90_s", np.float64),
        ("sla_tpot_s", np.float64),
        ("sla_tpot_p90_s", np.float64),
    ]
)

#: Output columns of ``analytic_rows``, in order.
OUTPUTS = (
    "engines",  # instances * pp
    "batch",  # mean running requests per engine
    # prefill of one wave (closed loop, static Poisson) or of one prompt's iterations (Poisson; NaN when overloaded)
    "prefill_s",
    "decode_step_s",  # one decode iteration at the batch and mean KV length
    "tokens_per_step",  # tokens a decoding sequence emits per decode iteration (1 without drafts)
    "kv_transfer_s",  # disaggregated: one prompt's KV cache from its prefill to its decode replica (0 aggregated)
    "ttft_s",
    "tpot_s",
    "e2e_latency_s",
    "output_tokens_per_s_per_gpu",
    "output_tokens_per_s_per_user",
    "requests_per_s",  # the deployment
    "kv_capacity_tokens",  # per replica
    "mem_weights_bytes",  # per device (the fullest stage)
    "mem_kv_bytes",  # per device, the running batches' whole sequences
    "mem_peak_bytes",
    "reason",  # Feasible code
)
N_OUT = len(OUTPUTS)
(
    O_ENGINES, O_BATCH, O_PREFILL, O_DECODE_STEP, O_TOKENS_PER_STEP, O_KV_TRANSFER, O_TTFT, O_TPOT, O_E2E, O_TPS_GPU,
    O_TPS_USER, O_RPS, O_KV_CAP,
    O_MEM_W, O_MEM_KV, O_MEM_PEAK, O_REASON,
) = range(N_OUT)

#: the fused attention kernel's fixed part per prompt row, in keys: a causal call over L
#: keys runs at plateau x L / (L + ATTENTION_FWD_FILL_KEYS), i.e. takes as long as
#: L^2 / 2 + L x ATTENTION_FWD_FILL_KEYS / 2 pairs at the plateau (module doc)
ROW_FILL_KEYS = 0.5 * ATTENTION_FWD_FILL_KEYS
#: the fixed points stop when a step moves less than this share
FIXED_POINT_RTOL = 1e-12
FIXED_POINT_ITERATIONS = 200
#: steps of the continuous-Poisson fixed point a run's memo keeps (``iterate_memo``): on
#: the catalog's Poisson space the iterates reach the fixed point or leave the engine's
#: limits within 38 steps, later steps are evaluated unremembered, and every run's memo
#: is filled with NaN first (200 steps' worth cost more than the lookups save)
MEMO_STEPS = 64
#: iteration times at an engine's limit a run's memo keeps (``iterate_memo``): a run's rows
#: differ in max_batch and max_tokens, and where one limit binds the others repeat its point
SATURATION_SLOTS = 4
#: two chords of the iteration time whose slopes differ by less than this share lie on one
#: linear piece of it (``linear_piece_fixed_point``)
LINEAR_PIECE_RTOL = 1e-6
#: iterations a transferred cache waits, on average, for its decode engine's next one, which
#: admits it and streams its first token (``kernels.serving_sim._admit_decode``): it arrives at
#: a moment the engine's iterations do not follow, half way through one on average
ADMIT_WAIT = 0.5
#: the disaggregated decode batch's root finding (``disagg_batch``): to 2^-48 of the bracket
#: it starts from (the 48 halvings of the bisection it replaces) or a residual within
#: BATCH_RTOL of its target, in at most BATCH_ITERATIONS steps
BATCH_RTOL = 2.0**-48
BATCH_ITERATIONS = 200
#: the decode batch's equations (``disagg_balance``): the users a closed loop's batch holds,
#: the requests a second it completes
USERS, SERVED = 0, 1
#: passes of the closed loop's prompt iterations k and mean decode batch B n / (n + k)
#: (``continuous_s``): k = ceil(g in / room) falls as the decode batch it leaves room beside
#: does; one pass settles it where a clump fits one chunk, a few where it is cut
CHUNK_SETTLE = 8


@jit
def rows_s(model, dev, tiers, tiles, srv, tokens: float) -> float:
    """Every layer's kernels and communication for ``tokens`` rows (one new token
    each over an empty cache), without the LM head: ``forward_s`` minus ``head_s``."""
    if tokens <= 0.0:
        return 0.0
    total, head = forward_head_s(model, dev, tiers, tiles, srv, tokens, 1.0, 0.0)
    return total - head


@jit
def head_rows_s(model, dev, tiers, tiles, srv, rows: float) -> float:
    """The final norm, LM head, logits gather and sampling for ``rows`` sequences (0 for none)."""
    if rows <= 0.0:
        return 0.0
    return head_s(model, dev, tiers, tiles, srv, rows)


#: one-token forwards a run of rows with one replica remembers (``forward_memo``): a
#: run's rows differ in max_batch, max_tokens, scheduler and overlap, among which a
#: handful of batch and chunk sizes repeat
MEMO_SLOTS = 16


@jit
def forward_memo() -> np.ndarray:
    """An empty memo of one replica's ``forward_head_s`` over one-token sequences:
    rows of (tokens, forward, head); NaN tokens mark a free slot."""
    return np.full((MEMO_SLOTS, 3), np.nan)


@jit
def cycle_memo() -> np.ndarray:
    """An empty memo of one replica's last closed-loop cycle of each group of engines
    (``engine_users``; ``remembered_cycle_s``): a row per group of its arguments (users in
    service, max_tokens, scheduler) and values (prefill without the overlap scheduler's
    iteration, decode, the mean decode iteration); NaN: none yet."""
    return np.full((2, 6), np.nan)


@jit
def remembered_forward_s(memo, model, dev, tiers, tiles, srv, tokens: float):
    """``forward_head_s(tokens, 1, 0)`` of ``srv``, looked up in ``memo``
    (``forward_memo``, holding this replica's only) or evaluated and kept there:
    the same bits either way. A full memo overwrites the slot the token count
    hashes to."""
    free = -1
    for j in range(memo.shape[0]):
        if memo[j, 0] == tokens:
            return memo[j, 1], memo[j, 2]
        if free < 0 and np.isnan(memo[j, 0]):
            free = j
    total, head = forward_head_s(model, dev, tiers, tiles, srv, tokens, 1.0, 0.0)
    if free < 0:
        free = int(tokens) % memo.shape[0]
    memo[free, 0] = tokens
    memo[free, 1] = total
    memo[free, 2] = head
    return total, head


@jit
def remembered_rows_s(memo, model, dev, tiers, tiles, srv, tokens: float) -> float:
    """``rows_s`` through ``remembered_forward_s``: the same bits."""
    if tokens <= 0.0:
        return 0.0
    total, head = remembered_forward_s(memo, model, dev, tiers, tiles, srv, tokens)
    return total - head


@jit
def decode_rows_s(model, dev, tiers, tiles, srv, b: float) -> float:
    """``rows_s(b) + head_rows_s(b)`` (b decoding sequences, each emitting a token) in
    one ``forward_s`` over an empty cache (equal up to rounding)."""
    if b <= 0.0:
        return 0.0
    return forward_s(model, dev, tiers, tiles, srv, b, 1.0, 0.0)


# --------------------------------------------------------------------------- speculative decoding


@jit
def expected_tokens(acceptance: float, draft: float) -> float:
    """Tokens a sequence emits per decode step with ``draft`` draft tokens, each
    accepted with probability ``acceptance`` until the first rejection (the
    target's own token always comes): 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a),
    k + 1 at a = 1, 1 at a = 0 or k = 0 (Leviathan et al. 2023, eq. 1)."""
    total = 1.0
    term = 1.0
    for _ in range(int(draft)):
        term *= acceptance
        total += term
    return total


@jit
def draft_modules(model, srv) -> float:
    """Draft modules a replica runs (module doc): none without drafts; min(k,
    mtp_depth) of the model's MTP modules; one EAGLE-style head otherwise."""
    if srv.draft_tokens <= 0.0:
        return 0.0
    if model.mtp_depth > 0.0:
        return min(srv.draft_tokens, model.mtp_depth)
    return 1.0


@jit
def draft_layer_is_moe(model) -> bool:
    """A draft module's layer is an MoE layer when the model's last layer is."""
    return model.experts > 0 and model.layers > model.dense_layers


@jit
def draft_weight_bytes(model, srv) -> float:
    """Weights of the draft modules on each device of the last stage: per module
    one layer split as the model's (``kernels.training.layer_params`` /
    ``moe_layer_params``), the 2h x h projection (replicated, as vLLM's
    DeepSeek MTP ``eh_proj``) and three norms of h; embedding and head shared."""
    n = draft_modules(model, srv)
    if n <= 0.0:
        return 0.0
    ta = attention_ranks(srv)
    h = model.hidden
    if draft_layer_is_moe(model):
        dense, expert = moe_layer_params(model, ta, srv.ep, srv.tp / srv.ep)
        layer = dense + expert * slot_share(model, srv)  # its experts in the replica's slots, as the model's layers
    else:
        layer = layer_params(model, ta)
    return n * (layer + 2.0 * h * h + 3.0 * h) * srv.weight_bytes


@jit
def replica_weight_bytes(model, srv) -> float:
    """``kernels.inference.device_weight_bytes`` with the draft modules on the last
    stage: the fullest device's weights."""
    p = int(srv.pp)
    best = 0.0
    for stage in range(p):
        w = stage_weight_bytes(model, srv, stage)
        if stage == p - 1:
            w += draft_weight_bytes(model, srv)
        best = max(best, w)
    return best


@jit
def replica_kv_bytes_per_token(model, srv) -> float:
    """``kernels.inference.kv_bytes_per_token`` of the fullest stage counting a
    layer's cache for each draft module on the last stage."""
    per = kv_bytes_per_token(model, srv)
    n = draft_modules(model, srv)
    if n <= 0.0:
        return per
    p = int(srv.pp)
    first = device_layers(0, p, model.layers)
    return per / first * max(first, device_layers(p - 1, p, model.layers) + n)


@jit
def draft_rows_s(model, dev, tiers, tiles, srv, tokens: float) -> float:
    """One draft module's pass over ``tokens`` rows of the replica, without the
    head: the embedding lookup and its two input norms, the 2h -> h projection
    and one layer of the model's kind over an empty cache (as ``rows_s``);
    0 without drafts."""
    if srv.draft_tokens <= 0.0 or tokens <= 0.0:
        return 0.0
    rank = tokens / srv.tp if srv.attention_dp > 0 else tokens
    h = model.hidden
    t = attention_block_s(model, dev, tiers, tiles, srv, tokens, 1.0, 0.0)
    if draft_layer_is_moe(model):
        t += moe_mlp_s(model, dev, tiers, tiles, srv, rank)
    else:
        t += dense_mlp_s(model, dev, tiers, tiles, srv, rank)
    t += gemm_time_s(rank, h, 2.0 * h, dev, tiles, srv.weight_bytes)
    return t + memory_bound_s(6.0 * rank * h * srv.act_bytes, 3.0, dev)


@jit
def draft_prompt_s(model, dev, tiers, tiles, srv, tokens: float) -> float:
    """The draft modules' pass over ``tokens`` prompt tokens (building their KV
    caches; their attention pairs are in ``pair_s``); 0 without drafts."""
    n = draft_modules(model, srv)
    if n <= 0.0:
        return 0.0
    return n * draft_rows_s(model, dev, tiers, tiles, srv, tokens)


@jit
def draft_steps_s(model, dev, tiers, tiles, srv, b: float) -> float:
    """The k draft steps of a decode step of ``b`` sequences: k x (a module's pass
    over b rows + the head on b rows); their cache reads are in ``kv_s_per_token``.
    0 without drafts."""
    if srv.draft_tokens <= 0.0 or b <= 0.0:
        return 0.0
    return srv.draft_tokens * (draft_rows_s(model, dev, tiers, tiles, srv, b)
                               + head_rows_s(model, dev, tiers, tiles, srv, b))


# --------------------------------------------------------------------------- iteration parts


@jit
def kv_s_per_token(model, dev, tiers, tiles, srv) -> float:
    """Decode-step seconds per cached token read: the slope of ``forward_s`` in
    the KV length between 0 and ``s`` (one sequence; its attention halves, the
    only terms that depend on the KV length; linear while the decode
    attention stays on one side of its roofline, which holds from s = 0 for
    both its memory-bound GQA and its compute-bound absorbed-MLA forms). With
    k draft tokens the step verifies q = k + 1 positions per sequence
    (``verify_attention_block_s``: the cache read once, q times the FLOP) and
    each of the k draft steps reads a module's one-layer cache."""
    s = 4096.0
    if model.sliding_window > 0.0:
        s = min(s, model.sliding_window)
    q = srv.draft_tokens + 1.0
    # the attention half is forward_s's only term that depends on the KV length, the same in every layer
    per_layer = verify_attention_block_s(model, dev, tiers, tiles, srv, 1.0, q, s) - verify_attention_block_s(
        model, dev, tiers, tiles, srv, 1.0, q, 0.0)
    coef = model.layers * per_layer / s
    if srv.draft_tokens > 0.0:
        draft = verify_attention_block_s(model, dev, tiers, tiles, srv, 1.0, 1.0, s) - verify_attention_block_s(
            model, dev, tiers, tiles, srv, 1.0, 1.0, 0.0)
        coef += srv.draft_tokens * draft / s
    return coef


@jit
def pair_s(model, dev, srv) -> float:
    """Prefill attention seconds per causal (query, key) pair, all layers and the
    draft modules: 2 x heads / tp x (qk + v head dims) FLOP per layer at the
    attention peak (under attention DP each rank attends 1 / tp of the prompts
    with every head)."""
    if model.mla > 0:
        dims = model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim
    else:
        dims = 2.0 * model.head_dim
    flops = (model.layers + draft_modules(model, srv)) * 2.0 * model.heads / srv.tp * dims
    return flops / (attention_peak(dev, srv.kv_bytes) * dev.attention_efficiency)


@jit
def kv_capacity_tokens(model, dev, srv) -> float:
    """Tokens a replica's KV cache holds (0 when the weights do not fit)."""
    return kv_units(dev, srv, replica_weight_bytes(model, srv), replica_kv_bytes_per_token(model, srv))


@jit
def device_kv_bytes(srv, per_token: float, sequences: float, tokens: float) -> float:
    """KV-cache bytes on one device of a replica whose cache holds ``sequences`` of
    ``tokens`` each in every one of its pp batches in flight (``per_token``:
    ``replica_kv_bytes_per_token``); under attention DP each rank holds its own."""
    ranks = srv.tp if srv.attention_dp > 0 else 1.0
    return per_token * srv.pp * sequences * tokens / ranks


@jit
def iteration_s(model, dev, tiers, tiles, srv, host: float, kv_coef: float, pair_coef: float, tokens: float,
                rows: float, kv_read: float, pairs: float, prompt: float, drafting: float) -> float:
    """One engine iteration (module doc), the kernels evaluated at these counts:
    ``tokens`` rows (q per decoding sequence plus the prompt chunks), ``rows``
    head rows, ``prompt`` of the tokens prompt tokens (the draft modules pass
    them once), ``drafting`` sequences that draft k tokens each."""
    start = host + rows_s(model, dev, tiers, tiles, srv, tokens)
    return iteration_beside_rows_s(model, dev, tiers, tiles, srv, start, kv_coef * kv_read, pair_coef * pairs, rows,
                                   prompt, drafting)


@jit
def iteration_beside_rows_s(model, dev, tiers, tiles, srv, start: float, kv: float, pair: float, rows: float,
                            prompt: float, drafting: float) -> float:
    """``iteration_s`` from ``start`` = host + its rows' time on: the head on ``rows``,
    the KV reads' and the prompt pairs' seconds, and the draft modules' passes, added in
    ``iteration_s``'s order (``chunk_iteration_s`` starts from remembered rows)."""
    return (start + head_rows_s(model, dev, tiers, tiles, srv, rows) + kv + pair
            + draft_prompt_s(model, dev, tiers, tiles, srv, prompt)
            + draft_steps_s(model, dev, tiers, tiles, srv, drafting))


@jit
def iterate_memo(steps: int) -> np.ndarray:
    """An empty memo of one replica's continuous-Poisson fixed point: row 2k holds
    step k's ``iteration_s`` arguments (tokens, rows, kv_read, pairs, prompt,
    drafting) and its value, row 2k + 1 those of the probe after it
    (``poisson_fixed_point``), and the last ``SATURATION_SLOTS`` rows the iteration
    times at the engine's limits (``saturated_iteration_s``); NaN arguments never
    match. 2 x ``steps`` rows and those (``MEMO_STEPS``; none where no Poisson stream
    reads it)."""
    return np.full((2 * steps + (SATURATION_SLOTS if steps > 0 else 0), 7), np.nan)


@jit
def remembered_iteration_s(iterates, step: int, model, dev, tiers, tiles, srv, host: float, kv_coef: float,
                           pair_coef: float, tokens: float, rows: float, kv_read: float, pairs: float, prompt: float,
                           drafting: float) -> float:
    """``iteration_s`` in memo row ``step``, looked up in ``iterates``
    (``iterate_memo``, this replica's only, with its host, kv_coef and pair_coef) or
    evaluated and kept there: the same bits either way. A run's rows that differ
    only in max_batch, max_tokens, scheduler or overlap iterate the same sequence
    (none of them enters the iteration time; they only stop it), so each step of
    the first row's sequence serves the others. Without a row for ``step`` (an
    empty memo, or a step beyond the memo's), evaluated."""
    if step >= iterates.shape[0] - SATURATION_SLOTS:
        return iteration_s(model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, tokens, rows, kv_read, pairs,
                           prompt, drafting)
    m = iterates[step]
    if (m[0] == tokens and m[1] == rows and m[2] == kv_read and m[3] == pairs and m[4] == prompt
            and m[5] == drafting):
        return m[6]
    t = iteration_s(model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, tokens, rows, kv_read, pairs, prompt,
                    drafting)
    m[0] = tokens
    m[1] = rows
    m[2] = kv_read
    m[3] = pairs
    m[4] = prompt
    m[5] = drafting
    m[6] = t
    return t


@jit
def linear_piece_fixed_point(t0: float, t1: float, t2: float, t3: float) -> float:
    """Where the line through four successive iterates of t = F(t) (t1 = F(t0), t2 =
    F(t1), t3 = F(t2)) meets t = F(t), or -1. The chords' slopes r1 = (t2 - t1) / (t1
    - t0) and r2 = (t3 - t2) / (t2 - t1) are F's over [t0, t1] and [t1, t2]; when they
    agree (``LINEAR_PIECE_RTOL``) and lie in (0, 1), the iterates are on one linear
    piece of F, which meets the diagonal at t3 + (t3 - t2) r2 / (1 - r2) (Aitken's
    delta-squared extrapolation: exact for a linear F). -1 when they do not, or
    without four iterates (a negative t0)."""
    if t0 < 0.0 or not (t0 < t1 < t2 < t3):
        return -1.0
    r1 = (t2 - t1) / (t1 - t0)
    r2 = (t3 - t2) / (t2 - t1)
    if not (0.0 < r2 < 1.0) or abs(r2 - r1) > LINEAR_PIECE_RTOL * r2:
        return -1.0
    return t3 + (t3 - t2) * r2 / (1.0 - r2)


@jit
def poisson_fits(lam: float, t: float, nd: float, e_tok: float, q: float, new: float, bmax: float,
                 max_tokens: float) -> bool:
    """Whether an iteration of t seconds under lam arrivals a second fits the engine:
    its decode batch lam (out - 1) t / E within ``bmax`` and its tokens (q per
    decoding request, the arrivals' new prompt tokens) within ``max_tokens``."""
    b = lam * nd * t / e_tok  # each request decodes for (out - 1) / E iterations
    return b <= bmax and b * q + lam * t * new <= max_tokens


@jit
def saturated_t(lam: float, nd: float, e_tok: float, q: float, new: float, bmax: float, max_tokens: float) -> float:
    """The iteration time at which a Poisson load of lam arrivals a second reaches the
    engine's limit (``poisson_fits``' bound): its decode batch lam (out - 1) t / E at
    ``bmax`` or its tokens lam t ((out - 1) q / E + new) at ``max_tokens``, whichever comes
    first; infinite without load. An overloaded engine runs there: its iterations hold
    the full batch (or budget) and admit lam t of the queue, the requests that finish,
    so lam t, and with it the iteration, is the same whatever the rate offered."""
    t = np.inf
    per_batch = lam * nd / e_tok
    if per_batch > 0.0:
        t = bmax / per_batch
    per_token = lam * (nd * q / e_tok + new)
    if per_token > 0.0:
        t = min(t, max_tokens / per_token)
    return t


@jit
def saturated_iteration_s(iterates, model, dev, tiers, tiles, srv, host: float, kv_coef: float, pair_coef: float,
                          lam: float, full: float, nd: float, e_tok: float, q: float, inl: float, outl: float,
                          new: float, pairs: float) -> float:
    """``poisson_iteration_s`` at the engine's limit ``full`` (``saturated_t``), looked up
    in the last ``SATURATION_SLOTS`` rows of ``iterates`` (``iterate_memo``) by the
    arrivals an iteration admits, lam x full, on which alone F depends for one replica
    (its decode batch and tokens are lam x full times the run's constants), or evaluated
    and kept there, the first free row, else the first: the same bits either way."""
    x = lam * full
    n = iterates.shape[0]
    free = -1
    for j in range(max(n - SATURATION_SLOTS, 0), n):
        if iterates[j, 0] == x:
            return iterates[j, 6]
        if free < 0 and np.isnan(iterates[j, 0]):
            free = j
    t = poisson_iteration_s(iterates, n, model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, lam, full, nd,
                            e_tok, q, inl, outl, new, pairs)
    if n > 0:
        if free < 0:
            free = n - SATURATION_SLOTS
        iterates[free, 0] = x
        iterates[free, 6] = t
    return t


@jit
def poisson_iteration_s(iterates, slot: int, model, dev, tiers, tiles, srv, host: float, kv_coef: float,
                        pair_coef: float, lam: float, t: float, nd: float, e_tok: float, q: float, inl: float,
                        outl: float, new: float, pairs: float) -> float:
    """The continuous-Poisson iteration time F(t) (module doc), through memo row
    ``slot`` (``remembered_iteration_s``): lam t arrivals' prompts (their new tokens
    and causal pairs) beside b = lam (out - 1) t / E decoding requests."""
    arrivals = lam * t
    b = lam * nd * t / e_tok
    return remembered_iteration_s(iterates, slot, model, dev, tiers, tiles, srv, host, kv_coef, pair_coef,
                                  max(b * q + arrivals * new, 1.0), max(b * q + arrivals, 1.0),
                                  b * (inl + 0.5 * outl) + b * (q - 1.0), arrivals * pairs, arrivals * new, b)


@jit
def poisson_fixed_point(iterates, model, dev, tiers, tiles, srv, host: float, kv_coef: float, pair_coef: float,
                        lam: float, nd: float, e_tok: float, q: float, inl: float, outl: float, new: float,
                        pairs: float, bmax: float, max_tokens: float):
    """(t, converged): the least fixed point t = F(t) of the continuous-Poisson
    iteration time (``poisson_iteration_s``), iterated from t = 0, or the first
    iterate that no longer fits (``poisson_fits``) and False. F rises with t, so the
    iterates rise to the least fixed point; they approach it geometrically, at F's
    slope there. Where the last four iterates lie on one linear piece of F
    (``linear_piece_fixed_point``), the point that piece meets the diagonal is
    tried once: if it fits and F there equals it (``FIXED_POINT_RTOL``), F is linear
    up to it and it is the fixed point the iterates approach (a kink or step between
    would move F off that line), found in a few steps instead of tens. Plain step k
    goes through memo row 2k, its probe row 2k + 1 (``iterate_memo``)."""
    t = 0.0
    back2 = -1.0  # the two iterates before t (negative: not yet)
    back1 = -1.0
    for step in range(FIXED_POINT_ITERATIONS):
        if not poisson_fits(lam, t, nd, e_tok, q, new, bmax, max_tokens):  # t's batch or tokens do not fit
            return t, False
        nt = poisson_iteration_s(iterates, 2 * step, model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, lam,
                                 t, nd, e_tok, q, inl, outl, new, pairs)
        if abs(nt - t) <= FIXED_POINT_RTOL * nt:
            return nt, True
        probe = linear_piece_fixed_point(back2, back1, t, nt)
        if probe > 0.0 and poisson_fits(lam, probe, nd, e_tok, q, new, bmax, max_tokens):
            at = poisson_iteration_s(iterates, 2 * step + 1, model, dev, tiers, tiles, srv, host, kv_coef,
                                     pair_coef, lam, probe, nd, e_tok, q, inl, outl, new, pairs)
            if abs(at - probe) <= FIXED_POINT_RTOL * at:
                return at, True
        back2 = back1
        back1 = t
        t = nt
    return t, False


@jit
def prompt_iterations_s(model, dev, tiers, tiles, srv, host: float, kv_coef: float, pair_coef: float, b: float,
                        q: float, kv_read: float, new: float, pairs: float, room: float) -> float:
    """The iterations that carry one prompt of ``new`` tokens to compute (its ``pairs``
    causal pairs) beside ``b`` decoding sequences of q rows each (``kv_read`` cached
    tokens): ceil(new / room) chunks of ``room`` tokens, the last the remainder, each
    an ``iteration_s`` of the decode rows and its chunk, the head on the decode rows
    and, with the last chunk, the prompt's first token. Infinite when the decode
    batch leaves no room."""
    if room <= 0.0:
        return np.inf
    chunks = max(math.ceil(new / room), 1.0)
    last = new - (chunks - 1.0) * room
    full = 0.0
    if chunks > 1.0:
        full = (chunks - 1.0) * iteration_s(model, dev, tiers, tiles, srv, host, kv_coef, pair_coef,
                                            b * q + room, b * q, kv_read, 0.0, room, b)
    return full + iteration_s(model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, max(b * q + last, 1.0),
                              b * q + 1.0, kv_read, pairs, last, b)


@jit
def decode_reads(input_len: float, nd: float, q: float, e_tok: float) -> float:
    """Cached tokens a request's decode steps read: n = nd / E steps (E tokens
    each, ``expected_tokens``), step j reading in + q + (j - 1) E:
    n in + n q + E n (n - 1) / 2, written so that q = E = 1 gives
    nd in + nd (nd + 1) / 2 bit for bit."""
    n = nd / e_tok
    return n * input_len + 0.5 * n * (n + 1.0) + (q - 1.0) * n + (e_tok - 1.0) * 0.5 * n * (n - 1.0)


@jit
def prompt_pairs(input_len: float, hit: float) -> float:
    """Causal pairs of one prompt's prefill with the kernel's fill, in plateau-rate
    pair-equivalents: in_new (p0 + in_new / 2 + ROW_FILL_KEYS), p0 the cached prefix."""
    new = input_len * (1.0 - hit)
    return new * (input_len - new + 0.5 * new + ROW_FILL_KEYS)


@jit
def wave_s(model, dev, tiers, tiles, srv, wl, host: float, kv_coef: float, pair_coef: float, b: float, memo):
    """(prefill, decode) seconds of a static batch's wave of ``b`` requests: the
    prompts in one iteration, then (out - 1) / E decode iterations at batch b, each
    verifying q = k + 1 positions per sequence and drafting k, with KV reads in + q
    + (j - 1) E (``decode_reads``; in + j without drafts). Its one-token forwards go
    through ``memo`` (``remembered_forward_s``)."""
    inl = wl.input_len
    nd = wl.output_len - 1.0
    q = srv.draft_tokens + 1.0
    e_tok = expected_tokens(wl.acceptance_rate, srv.draft_tokens)
    prompt = b * inl * (1.0 - wl.prefix_hit_rate)  # the prompts' tokens beside their prefix-cache hits
    decode = 0.0
    head = -1.0
    if nd > 0.0 and b * q > 0.0:
        decode, last_head = remembered_forward_s(memo, model, dev, tiers, tiles, srv, b * q)  # decode_rows_s(b q)
        if q == 1.0:
            head = last_head  # head_s(b): the decode forward's own, not evaluated twice
    if head < 0.0:
        head = head_rows_s(model, dev, tiers, tiles, srv, b)
    pre = host + remembered_rows_s(memo, model, dev, tiers, tiles, srv, prompt) + head
    pre += pair_coef * b * prompt_pairs(inl, wl.prefix_hit_rate)
    pre += draft_prompt_s(model, dev, tiers, tiles, srv, prompt)
    dec = 0.0
    if nd > 0.0:
        step = host + decode + draft_steps_s(model, dev, tiers, tiles, srv, b)
        dec = nd / e_tok * step + kv_coef * b * decode_reads(inl, nd, q, e_tok)
    return pre, dec


@jit
def chunk_iteration_s(model, dev, tiers, tiles, srv, host: float, kv_coef: float, pair_coef: float, b: float,
                      q: float, kv_read: float, new: float, pairs: float, prompts: float, k: float, chunks: float,
                      memo) -> float:
    """``iteration_s`` of ``b`` decoding sequences (q rows each, ``kv_read`` cached
    tokens) beside ``chunks`` chunks of clumps of ``prompts`` prompts cut in k (a
    clump's ``new`` tokens and ``pairs`` causal pairs over k, and k-th of its first
    tokens); its rows through ``memo`` (``remembered_rows_s``): the same bits as
    ``iteration_s``."""
    prompt = chunks * new / k
    start = host + remembered_rows_s(memo, model, dev, tiers, tiles, srv, max(b * q + prompt, 1.0))
    return iteration_beside_rows_s(model, dev, tiers, tiles, srv, start, kv_coef * kv_read,
                                   pair_coef * chunks * pairs / k, max(b * q + chunks * prompts / k, 1.0), prompt, b)


@jit
def continuous_s(model, dev, tiers, tiles, srv, wl, host: float, kv_coef: float, pair_coef: float, b: float,
                 max_tokens: float, scheduler: int, in_step: bool, memo):
    """(prefill, decode, mean decode iteration) seconds of a request among ``b`` in
    service on a continuously batching engine (module doc, closed loop; the overlap
    scheduler's iteration is ``remembered_cycle_s``'s). Its users send their prompts in clumps
    of g: alike requests (``in_step``) as many as the budget takes at once, for they
    start, finish and send again together; others one by one. A clump's g prompts
    take k iterations (chunks of the room the decode rows leave), its decode (out -
    1) / E; over that cycle the other b / g - 1 clumps' k chunks each fall x = (b / g
    - 1) k / (n + k) to an iteration: the prefill is k iterations of its own chunk
    and x others, the decode n iterations of x chunks, each a mean over iterations
    of whole chunks (``chunk_iteration_s``)."""
    inl = wl.input_len
    nd = max(wl.output_len - 1.0, 0.0)
    q = srv.draft_tokens + 1.0
    e_tok = expected_tokens(wl.acceptance_rate, srv.draft_tokens)
    new = inl * (1.0 - wl.prefix_hit_rate)
    steps = nd / e_tok  # a request's decode iterations
    g = 1.0
    if in_step and new > 0.0:
        g = min(b, max(math.floor(max_tokens / new), 1.0))
    k = 1.0  # a clump's iterations: unchunked one, else its chunks of the room the decode rows leave
    if scheduler != UNCHUNKED:  # room >= 1: the caller keeps b q within max_tokens - 1
        for _ in range(CHUNK_SETTLE):
            settled = max(math.ceil(g * new / (max_tokens - b * steps / (steps + k) * q)), 1.0)
            if settled == k:
                break
            k = settled
    b_d = b * steps / (steps + k)
    kv_read = b_d * (inl + 0.5 * wl.output_len) + b_d * (q - 1.0)
    others = (b / g - 1.0) * k / (steps + k)
    clump_new = g * new
    clump_pairs = g * prompt_pairs(inl, wl.prefix_hit_rate)
    # x chunks an iteration as iterations of floor(x) and floor(x) + 1 whole chunks in the
    # shares whose mean is x (module doc: the time of the mean composition undercounts the
    # prompts); the decode's and the prefill's (one chunk more) share the middle one
    whole = math.floor(others)
    share = others - whole
    middle = chunk_iteration_s(model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, b_d, q, kv_read, clump_new,
                               clump_pairs, g, k, whole + 1.0, memo)
    t = chunk_iteration_s(model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, b_d, q, kv_read, clump_new,
                          clump_pairs, g, k, whole, memo)
    prompt = middle
    if share > 0.0:
        t = (1.0 - share) * t + share * middle
        prompt = (1.0 - share) * middle + share * chunk_iteration_s(model, dev, tiers, tiles, srv, host, kv_coef,
                                                                    pair_coef, b_d, q, kv_read, clump_new,
                                                                    clump_pairs, g, k, whole + 2.0, memo)
    return k * prompt, steps * t, t


@jit
def remembered_cycle_s(cycles, model, dev, tiers, tiles, srv, wl, host: float, kv_coef: float, pair_coef: float,
                       b: float, max_tokens: float, scheduler: int, overlap: bool, in_step: bool, memo):
    """``continuous_s`` (prefill, decode) with the overlap scheduler's iteration added to
    the prefill (the batch a new request could join was scheduled before it came),
    through ``cycles`` (``cycle_memo``, this replica's): a run's rows that differ only
    in the overlap scheduler, next to each other, share one evaluation; the same bits."""
    if not (cycles[0] == b and cycles[1] == max_tokens and cycles[2] == scheduler):
        pre, dec, t = continuous_s(model, dev, tiers, tiles, srv, wl, host, kv_coef, pair_coef, b, max_tokens,
                                   scheduler, in_step, memo)
        cycles[0] = b
        cycles[1] = max_tokens
        cycles[2] = scheduler
        cycles[3] = pre
        cycles[4] = dec
        cycles[5] = t
    pre = cycles[3]
    if overlap:
        pre += cycles[5]
    return pre, cycles[4]


@jit
def sla_reason(wl, ttft: float, ttft_p90: float, tpot: float, tpot_p90: float) -> int:
    """The first SLA target missed (OK when none); NaN percentiles are not checked."""
    if wl.sla_ttft_s > 0.0 and ttft > wl.sla_ttft_s:
        return SLA_TTFT
    if wl.sla_ttft_p90_s > 0.0 and ttft_p90 > wl.sla_ttft_p90_s:
        return SLA_TTFT_P90
    if wl.sla_tpot_s > 0.0 and tpot > wl.sla_tpot_s:
        return SLA_TPOT
    if wl.sla_tpot_p90_s > 0.0 and tpot_p90 > wl.sla_tpot_p90_s:
        return SLA_TPOT_P90
    return OK


@jit
def engine_users(concurrency: float, engines: float):
    """A closed loop's C users over a deployment's E identical engines, as evenly as
    they go (what a least-loaded router keeps): (users, engines) of the busier group,
    ceil(C / E) users on each of C mod E engines, then of the others, floor(C / E)
    users each (0 where C < E: those engines idle). Every user is on one engine:
    the groups' engines add up to E and their users to C; a group of 0 engines is
    absent (C a multiple of E: one group). Elementwise over arrays too, as plain Python
    (``engine_users.py_func``: the simulation's groups, ``explorer.serve``)."""
    users = np.floor(concurrency)
    low = np.floor(users / engines)
    busy = users - low * engines
    return low + 1.0, busy, low, engines - busy


@jit
def analytic_one(model, dev, tiers, tiles, srv, wl, max_batch: float, max_tokens: float, scheduler: int,
                 overlap: bool, instances: float, memory_only: bool, kv_coef: float, memo, iterates, cycles,
                 out) -> None:
    """Fill ``out`` (``OUTPUTS``) for one aggregated candidate (module doc); with
    ``memory_only`` stop after the memory columns and the memory reasons (a
    disaggregated row's decode replica, ``disagg_one`` does the rest).
    ``kv_coef`` is ``kv_s_per_token`` of ``srv`` (``analytic_rows`` computes it
    once per run of rows with one replica), ``memo`` its ``forward_memo``,
    ``iterates`` its ``iterate_memo`` (read under a Poisson stream only) and ``cycles``
    its ``cycle_memo`` (read by a continuously batching closed loop)."""
    for k in range(N_OUT):
        out[k] = np.nan
    pp = srv.pp
    engines = instances * pp
    weights = replica_weight_bytes(model, srv)
    per_token = replica_kv_bytes_per_token(model, srv)
    cap = kv_units(dev, srv, weights, per_token)
    q = srv.draft_tokens + 1.0
    e_tok = expected_tokens(wl.acceptance_rate, srv.draft_tokens)
    out[O_ENGINES] = engines
    out[O_TOKENS_PER_STEP] = e_tok
    out[O_KV_TRANSFER] = 0.0
    out[O_KV_CAP] = cap
    out[O_MEM_W] = weights
    out[O_MEM_KV] = 0.0
    out[O_MEM_PEAK] = weights + dev.memory_overhead_bytes
    inl = wl.input_len
    outl = wl.output_len
    seq = inl + outl
    if dev.hbm_capacity_bytes - weights - dev.memory_overhead_bytes <= 0.0:
        out[O_REASON] = WEIGHTS_OOM
        return
    b_kv = math.floor(cap / pp / seq)
    bmax = min(max_batch, b_kv)
    if bmax < 1.0 or cap / pp < wl.longest_seq_len:  # the longest request could never be admitted
        out[O_REASON] = KV_TOO_SMALL
        return
    if scheduler == UNCHUNKED and wl.longest_prompt_len > max_tokens:  # a whole prompt never fits an iteration
        out[O_REASON] = PROMPT_TOO_LONG
        return
    out[O_REASON] = OK
    if memory_only:
        return
    host = wl.host_s
    pair_coef = pair_s(model, dev, srv)
    static = scheduler == STATIC
    nd = outl - 1.0
    reason = OK
    if wl.concurrency > 0.0:
        # each group of engines (engine_users) runs waves of its users; the deployment's
        # means are over its requests, each group weighing the requests it completes
        hi_users, hi_engines, lo_users, lo_engines = engine_users(wl.concurrency, engines)
        # users whose requests are all alike and whose prompts one iteration takes stay in
        # step: they run in waves, as static batches do (module doc)
        new_tokens = inl * (1.0 - wl.prefix_hit_rate)
        in_step = wl.longest_input_len <= inl and wl.longest_seq_len <= seq
        served = 0.0
        pre_sum = ttft_sum = tpot_sum = e2e_sum = 0.0
        b = 0.0
        groups = 0
        active = 0.0  # engines with users
        pre = ttft = tpot = e2e = rps_engine = 0.0
        for group in range(2):
            c = hi_users if group == 0 else lo_users
            count = hi_engines if group == 0 else lo_engines
            if c <= 0.0 or count <= 0.0:
                continue
            b_g = min(c, bmax)
            if static or (in_step and b_g * new_tokens <= max_tokens):
                pre, dec = wave_s(model, dev, tiers, tiles, srv, wl, host, kv_coef, pair_coef, b_g, memo)
            else:  # the decode rows within the token budget, a row to spare for a prompt
                b_g = max(min(b_g, math.floor((max_tokens - 1.0) / q)), 1.0)
                pre, dec = remembered_cycle_s(cycles[group], model, dev, tiers, tiles, srv, wl, host, kv_coef,
                                              pair_coef, b_g, max_tokens, scheduler, overlap, in_step, memo)
            period = pre + dec
            e2e = c * period / b_g  # Little's law over the engine's c users
            ttft = e2e - dec
            tpot = dec / nd if nd > 0.0 else 0.0
            rps_engine = b_g / period  # an engine's requests a second
            x = count * rps_engine  # the group's
            served += x
            pre_sum += x * pre
            ttft_sum += x * ttft
            tpot_sum += x * tpot
            e2e_sum += x * e2e
            b = max(b, b_g)  # the busiest engine's batch sizes the cache
            groups += 1
            active += count
        if groups > 1:  # one group: its own values, as they are
            pre = pre_sum / served
            ttft = ttft_sum / served
            tpot = tpot_sum / served
            e2e = e2e_sum / served
        if groups > 1 or active < engines:  # idle engines (C < E) serve nothing
            rps_engine = served / engines
    else:
        lam = wl.rate_per_s / engines
        new = inl * (1.0 - wl.prefix_hit_rate)
        pairs = prompt_pairs(inl, wl.prefix_hit_rate)
        converged = False
        if static:  # waves of the requests that arrived during the previous one
            b = 1.0
            pre = 0.0
            dec = 0.0
            for _ in range(FIXED_POINT_ITERATIONS):
                pre, dec = wave_s(model, dev, tiers, tiles, srv, wl, host, kv_coef, pair_coef, b, memo)
                nb = max(lam * (pre + dec), 1.0)
                if nb > bmax:
                    break
                if abs(nb - b) <= FIXED_POINT_RTOL * nb:
                    b = nb
                    converged = True
                    break
                b = nb
            period = pre + dec
            ttft = 0.5 * period + pre
            tpot = dec / nd if nd > 0.0 else 0.0
        else:  # continuous: the iteration time with its decode batch and prefill tokens
            t, converged = poisson_fixed_point(iterates, model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, lam,
                                               nd, e_tok, q, inl, outl, new, pairs, bmax, max_tokens)
            b = lam * nd * t / e_tok
            pre = np.nan  # an overloaded engine (the loop did not converge) has no steady prompt to time
            if converged:
                pre = prompt_iterations_s(model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, b, q,
                                          b * (inl + 0.5 * outl) + b * (q - 1.0), new, pairs,
                                          new if scheduler == UNCHUNKED else max_tokens - b * q)
            ttft = 0.5 * t + pre + (t if overlap else 0.0)
            tpot = t / e_tok
            dec = nd * tpot
        e2e = ttft + dec
        rps_engine = lam
        if not converged:  # the queue grows without bound: the engine serves what a full batch sustains
            reason = OVERLOADED
            if static:  # waves of bmax requests
                b = bmax
                pre, dec = wave_s(model, dev, tiers, tiles, srv, wl, host, kv_coef, pair_coef, b, memo)
                served = b / (pre + dec)
                tpot = dec / nd if nd > 0.0 else 0.0
            else:  # iterations at the engine's limit (saturated_t), admitting what leaves
                full = saturated_t(lam, nd, e_tok, q, new, bmax, max_tokens)
                t = saturated_iteration_s(iterates, model, dev, tiers, tiles, srv, host, kv_coef, pair_coef, lam, full,
                                          nd, e_tok, q, inl, outl, new, pairs)
                b = lam * nd * full / e_tok
                served = lam * full / t
                tpot = t / e_tok
                dec = nd * tpot
            rps_engine = min(lam, served)
            ttft = np.inf
            e2e = np.inf
    out[O_BATCH] = b
    out[O_PREFILL] = pre
    out[O_DECODE_STEP] = tpot * e_tok
    out[O_TTFT] = ttft
    out[O_TPOT] = tpot
    out[O_E2E] = e2e
    out[O_RPS] = rps_engine * engines
    out[O_TPS_GPU] = rps_engine * engines * outl / wl.devices
    out[O_TPS_USER] = 1.0 / tpot if tpot > 0.0 else np.nan
    out[O_MEM_KV] = device_kv_bytes(srv, per_token, b, seq)
    out[O_MEM_PEAK] = weights + dev.memory_overhead_bytes + out[O_MEM_KV]
    if reason == OK:
        reason = sla_reason(wl, ttft, np.nan, tpot, np.nan)
    out[O_REASON] = reason


@jit
def kv_transfer_s(model, tiers, prefill_srv, input_len: float, devices: float) -> float:
    """One prompt's KV cache from a prefill replica to a decode replica: every
    prefill rank sends its share, input_len x its KV bytes a token
    (``replica_kv_bytes_per_token``: the draft modules' too), at once over its own link of
    the tier between the groups: the innermost when the whole deployment fits
    in its domain, else the outermost (the groups on different nodes). One
    point-to-point message on that tier (``kernels.collectives.flat_time_s``
    SEND_RECV: latency + bytes over the send/recv bandwidth the tier achieves
    at that size, ``link_bytes_per_s``)."""
    tier = tiers.shape[0] - 1
    if tiers[0].domain_devices > 0.0 and devices <= tiers[0].domain_devices:
        tier = 0
    size = input_len * replica_kv_bytes_per_token(model, prefill_srv)
    link = tiers[tier]
    return flat_time_s(SEND_RECV, 2.0, size, link_bytes_per_s(link, SEND_RECV, size), link.latency_s)


@jit
def decode_only_s(model, dev, tiers, tiles, srv, host: float, kv_coef: float, b: float, kv_mean: float) -> float:
    """A decode-only iteration of ``b`` requests at a mean KV length ``kv_mean``
    (each verifying q = k + 1 positions, reading kv_mean + q - 1, and drafting k)."""
    q = srv.draft_tokens + 1.0
    return (host + decode_rows_s(model, dev, tiers, tiles, srv, b * q) + kv_coef * b * (kv_mean + (q - 1.0))
            + draft_steps_s(model, dev, tiers, tiles, srv, b))


@jit
def prefill_iteration_s(model, dev, tiers, tiles, psrv, host: float, prompts: float, new: float, inl: float,
                        hit: float) -> float:
    """A prefill replica's iteration over ``prompts`` prompts of ``new`` tokens to
    compute each (``inl`` long, a share ``hit`` of them cached): their rows, their
    first tokens' head, their causal pairs and the draft modules over their tokens."""
    t = host + rows_s(model, dev, tiers, tiles, psrv, prompts * new) + head_rows_s(model, dev, tiers, tiles, psrv,
                                                                                  prompts)
    t += pair_s(model, dev, psrv) * prompts * prompt_pairs(inl, hit)
    return t + draft_prompt_s(model, dev, tiers, tiles, psrv, prompts * new)


@jit
def disagg_balance(kind: int, engines: float, steps: float, before: float, b: float, t_d: float) -> float:
    """At decode batch b, its decode iteration t_d (``decode_only_s``) and n = ``steps``
    iterations a request: SERVED, the requests a second the engines complete, X = engines
    b / (n t_d); USERS, the users a closed loop holds, engines b + X (before + ADMIT_WAIT
    t_d), ``before`` a request's seconds ahead of its transfer's end (its prefill iteration
    and the transfer). Both rise with b, from 0."""
    x = engines * b / (steps * t_d)
    if kind == USERS:
        return engines * b + x * (before + ADMIT_WAIT * t_d)
    return x


@jit
def disagg_batch(kind: int, target: float, hi: float, at_hi: float, model, dev, tiers, tiles, srv, host: float,
                 kv_coef: float, kv_mean: float, engines: float, steps: float, before: float):
    """(b, t_d(b)): the decode batch b in (0, hi] where ``disagg_balance`` (``kind``) reaches
    ``target`` (0 at b = 0, ``at_hi`` >= target at hi), and its decode iteration: regula
    falsi with the Illinois step (the end kept twice running has its residual halved), so a
    smooth balance takes a few steps where halving took 48 (``bench/bench_serving.py``, the
    Llama space's disaggregated candidates: 39,000 a second by halving, 172,000 so), a step
    in it (GEMM tiles) a bracket that closes on it. Stops at a residual within BATCH_RTOL of
    the target or a bracket within BATCH_RTOL of ``hi``; returns the last point tried."""
    if at_hi <= target:
        return hi, decode_only_s(model, dev, tiers, tiles, srv, host, kv_coef, hi, kv_mean)
    lo = 0.0
    g_lo = -target
    g_hi = at_hi - target
    width = BATCH_RTOL * hi
    b = hi
    t_d = np.nan
    side = 0
    for _ in range(BATCH_ITERATIONS):
        b = hi - g_hi * (hi - lo) / (g_hi - g_lo)
        if not lo < b < hi:
            b = 0.5 * (lo + hi)
        t_d = decode_only_s(model, dev, tiers, tiles, srv, host, kv_coef, b, kv_mean)
        g = disagg_balance(kind, engines, steps, before, b, t_d) - target
        if abs(g) <= BATCH_RTOL * target:
            return b, t_d
        if g < 0.0:
            lo = b
            g_lo = g
            if side < 0:
                g_hi *= 0.5
            side = -1
        else:
            hi = b
            g_hi = g
            if side > 0:
                g_lo *= 0.5
            side = 1
        if hi - lo <= width:
            return b, t_d
    return b, t_d


@jit
def disagg_one(model, dev, tiers, tiles, srv, psrv, wl, max_batch: float, max_tokens: float, instances: float,
               prefill_instances: float, kv_coef: float, out) -> None:
    """``OUTPUTS`` of a disaggregated candidate (``out`` holds the decode replica's
    memory columns already; they become the prefill replica's where its device is
    the fuller). Prefill replicas (one engine each) pack k = floor(max_tokens / in)
    prompts an iteration (fewer where the engine's cache holds fewer) of t_p,
    serving mu = x k / t_p prompts/s. The KV cache then moves (``kv_transfer_s``);
    the decode engines run decode-only iterations t_d(B) at batch B, completing
    X(B) = engines B / (n t_d(B)) requests/s, n = (out - 1) / E iterations a
    request (E tokens each, ``expected_tokens``). Poisson rate R: an M/D/1 queue
    in front of the prefill replicas, wait rho / (2 (1 - rho)) t_p at rho = R / mu;
    B solves X(B) = R (``disagg_batch``); a prompt's wait and iteration are the M/D/1 queue's of
    one-prompt iterations t_1 (rho_1 = R t_1 / replicas) where that is the shorter, as a
    prompt that finds the queue short runs alone (the batched form alone had made the
    screen's TTFT 2.2x the simulation's on a Poisson 5 requests/s variant of the Llama
    space). Closed loop, C users: the prompts come in the
    clumps an iteration took as answers end, no queue while the replicas keep up:
    B solves engines B + X (t_p + transfer + ADMIT_WAIT t_d(B)) = C, or B = max_batch
    when the decode side is the bottleneck; where X(B) > mu the prefill replicas are,
    and B solves X(B) = mu instead; e2e = C / X (Little). (The M/D/1 wait had made the
    screen's TTFT a median 1.54x the simulation's on the Llama 3.1 70B space's
    disaggregated rows, up to 2.5x.) A cache that arrives waits ``ADMIT_WAIT`` of a
    decode iteration for the next one, which admits it. TTFT = e2e - n t_d: the first token reaches the user
    from the decode replica, which streams the answer once the cache has
    arrived, so TTFT includes the transfer (as ``kernels.serving_sim``'s
    disaggregated simulation; SGLang's PD router and NVIDIA Dynamo return the
    decode worker's stream)."""
    inl = wl.input_len
    nd = max(wl.output_len - 1.0, 1.0)
    new = inl * (1.0 - wl.prefix_hit_rate)
    host = wl.host_s
    p_weights = replica_weight_bytes(model, psrv)
    if dev.hbm_capacity_bytes - p_weights - dev.memory_overhead_bytes <= 0.0:
        out[O_REASON] = WEIGHTS_OOM
        return
    p_per_token = replica_kv_bytes_per_token(model, psrv)
    p_cap = math.floor(kv_units(dev, psrv, p_weights, p_per_token) / psrv.pp)  # a prefill engine's (serving_sim's)
    if p_cap < wl.longest_input_len:  # the longest prompt could never be prefilled
        out[O_REASON] = KV_TOO_SMALL
        return
    # an iteration packs the prompts the token budget takes and the cache holds
    k = max(min(math.floor(max_tokens / new), math.floor(p_cap / inl)), 1.0)
    t_p = prefill_iteration_s(model, dev, tiers, tiles, psrv, host, k, new, inl, wl.prefix_hit_rate)
    mu = prefill_instances * k / t_p
    xfer = kv_transfer_s(model, tiers, psrv, inl, wl.devices)
    engines = instances * srv.pp
    bmax = min(max_batch, math.floor(out[O_KV_CAP] / srv.pp / (inl + wl.output_len)))
    kv_mean = inl + 0.5 * wl.output_len
    steps = nd / expected_tokens(wl.acceptance_rate, srv.draft_tokens)  # decode iterations a request
    reason = OK
    if wl.concurrency > 0.0:
        # a closed loop's prompts are not a Poisson stream: each comes as its user's answer ends, in
        # the clumps one prefill iteration took (users that start together finish together), so no
        # queue forms while the prefill replicas keep up; once they do not, they bound the rate and
        # the users beyond the decode batches and the prompts in flight wait for them
        b = bmax  # where the decode side bounds the rate; the other users wait for a decode slot
        t_d = decode_only_s(model, dev, tiers, tiles, srv, host, kv_coef, b, kv_mean)
        users = disagg_balance(USERS, engines, steps, t_p + xfer, b, t_d)
        if users > wl.concurrency:
            b, t_d = disagg_batch(USERS, wl.concurrency, bmax, users, model, dev, tiers, tiles, srv, host, kv_coef,
                                  kv_mean, engines, steps, t_p + xfer)
        served = disagg_balance(SERVED, engines, steps, 0.0, b, t_d)
        if served > mu:  # the prefill replicas bound the rate: the batch that drains mu
            b, t_d = disagg_batch(SERVED, mu, b, served, model, dev, tiers, tiles, srv, host, kv_coef, kv_mean,
                                  engines, steps, 0.0)
        rate = engines * b / (steps * t_d)
        e2e = wl.concurrency / rate
    else:
        rate = wl.rate_per_s
        rho = rate / mu
        b = bmax
        t_d = decode_only_s(model, dev, tiers, tiles, srv, host, kv_coef, b, kv_mean)
        served = disagg_balance(SERVED, engines, steps, 0.0, b, t_d)
        if rho >= 1.0 or served < rate:
            reason = OVERLOADED
            rate = min(rate, mu, served)  # served: the slower side's capacity
        else:
            b, t_d = disagg_batch(SERVED, rate, bmax, served, model, dev, tiers, tiles, srv, host, kv_coef, kv_mean,
                                  engines, steps, 0.0)
        prompt = np.inf  # overloaded: the queue grows without bound
        if reason == OK:  # a prompt that finds the queue short is an iteration of its own
            t_1 = prefill_iteration_s(model, dev, tiers, tiles, psrv, host, 1.0, new, inl, wl.prefix_hit_rate)
            rho_1 = rate * t_1 / prefill_instances
            prompt = rho / (2.0 * (1.0 - rho)) * t_p + t_p
            if rho_1 < 1.0:
                prompt = min(prompt, rho_1 / (2.0 * (1.0 - rho_1)) * t_1 + t_1)
        e2e = prompt + xfer + ADMIT_WAIT * t_d + steps * t_d
    tpot = steps * t_d / nd
    ttft = e2e - nd * tpot  # wait + t_p + transfer + the wait to be admitted
    out[O_BATCH] = b
    out[O_PREFILL] = t_p
    out[O_DECODE_STEP] = t_d
    out[O_KV_TRANSFER] = xfer
    out[O_TTFT] = ttft
    out[O_TPOT] = tpot
    out[O_E2E] = e2e
    out[O_RPS] = rate
    out[O_TPS_GPU] = rate * wl.output_len / wl.devices
    out[O_TPS_USER] = 1.0 / tpot
    out[O_MEM_KV] = device_kv_bytes(srv, replica_kv_bytes_per_token(model, srv), b, inl + wl.output_len)
    out[O_MEM_PEAK] = out[O_MEM_W] + dev.memory_overhead_bytes + out[O_MEM_KV]
    # the memory columns are the fullest device's: a prefill replica's holds its weights and the
    # caches of the k prompts of each of its pp iterations in flight
    p_kv = device_kv_bytes(psrv, p_per_token, k, inl)
    if p_weights + dev.memory_overhead_bytes + p_kv > out[O_MEM_PEAK]:
        out[O_MEM_W] = p_weights
        out[O_MEM_KV] = p_kv
        out[O_MEM_PEAK] = p_weights + dev.memory_overhead_bytes + p_kv
    if reason == OK:
        reason = sla_reason(wl, ttft, np.nan, tpot, np.nan)
    out[O_REASON] = reason


#: most rows one ``prange`` task of ``analytic_rows`` evaluates (consecutive rows of one
#: run): long runs still spread over the cores
CHUNK_ROWS = 64


@jit
def chunk_starts(runs) -> np.ndarray:
    """The first row of each chunk of ``analytic_rows`` and, last, the row count:
    a chunk starts where ``runs`` (``run_of``) changes and every ``CHUNK_ROWS``
    rows within a run."""
    n = runs.shape[0]
    starts = np.empty(n + 1, np.int64)
    k = 0
    for i in range(n):
        if i == 0 or runs[i] != runs[i - 1] or i - starts[k - 1] >= CHUNK_ROWS:
            starts[k] = i
            k += 1
    starts[k] = n
    return starts[:k + 1]


@jit(parallel=True)
def analytic_rows(model, devs, tiers, tiles, srv_rows, prefill_rows, dtype, mode, max_batch, max_tokens, scheduler,
                  overlap, instances, prefill_instances, wl, run_of=None):
    """``OUTPUTS`` for every row: ``srv_rows`` the rows' (decode) replicas as
    ``kernels.inference.SERVING`` records, ``prefill_rows`` their prefill
    replicas (read where ``mode`` is DISAGG), ``devs`` one DEVICE record per
    Dtype code (indexed by ``dtype``), ``model`` and ``wl`` one-element record
    arrays; ``overlap`` (int8, 1: the overlap scheduler) per row. Returns (n,
    N_OUT) float64, each column contiguous (the transpose of an (N_OUT, n) array).

    ``run_of`` (optional, int64, 0, then each row equal to the previous or one
    more) numbers runs of consecutive rows whose replica records (``batch_cap``
    aside: the serving tier never reads it) and ``dtype`` are equal
    (``explorer.serve.replica_runs``). A run's rows, in chunks of at most
    ``CHUNK_ROWS``, share one ``kv_s_per_token``, one ``forward_memo`` (the
    closed loop's waves repeat a few batch and chunk sizes over a run), one
    ``cycle_memo`` (a continuously batching closed loop's rows with and without the
    overlap scheduler, side by side, share a cycle) and, under a Poisson stream, one
    ``iterate_memo`` (its fixed point's steps); without it,
    each row is its own run. Same results, bit for bit."""
    n = srv_rows.shape[0]
    out = np.empty((N_OUT, n))
    runs = np.arange(n) if run_of is None else run_of
    starts = chunk_starts(runs)
    for c in prange(starts.shape[0] - 1):
        first = starts[c]
        memo = forward_memo()
        iterates = iterate_memo(MEMO_STEPS if wl[0].concurrency <= 0.0 else 0)
        cycles = cycle_memo()
        row = np.empty(N_OUT)
        kv = kv_s_per_token(model[0], devs[dtype[first]], tiers, tiles, srv_rows[first])
        for i in range(first, starts[c + 1]):
            disagg = mode[i] == DISAGG
            analytic_one(model[0], devs[dtype[i]], tiers, tiles, srv_rows[i], wl[0], float(max_batch[i]),
                         float(max_tokens[i]), int(scheduler[i]), overlap[i] != 0, float(instances[i]), disagg, kv,
                         memo, iterates, cycles, row)
            if disagg and row[O_REASON] == OK:
                disagg_one(model[0], devs[dtype[i]], tiers, tiles, srv_rows[i], prefill_rows[i], wl[0],
                           float(max_batch[i]), float(max_tokens[i]), float(instances[i]),
                           float(prefill_instances[i]), kv, row)
            for k in range(N_OUT):
                out[k, i] = row[k]
    return out.T


#: token counts the simulation's cost tables are evaluated at: 1, 2, 3, 4, 6, 8, 12, ... 2^23
def token_grid() -> np.ndarray:
    powers = 2.0 ** np.arange(24)
    return np.unique(np.concatenate([powers, 1.5 * powers[1:]]))


@jit(parallel=True)
def cost_tables(model, devs, tiers, tiles, srv_rows, dtype, grid):
    """Per row the iteration cost's parts on ``grid`` token / row counts: (rows_s
    table, head_rows_s table, draft_prompt_s table, draft_steps_s table (both 0
    without drafts), kv_s_per_token, pair_s, kv capacity per engine)."""
    n = srv_rows.shape[0]
    k = grid.shape[0]
    g = np.empty((n, k))
    h = np.empty((n, k))
    dp = np.empty((n, k))
    ds = np.empty((n, k))
    kv_coef = np.empty(n)
    pair_coef = np.empty(n)
    cap = np.empty(n)
    for i in prange(n):
        srv = srv_rows[i]
        dev = devs[dtype[i]]
        m = model[0]
        for j in range(k):
            g[i, j] = rows_s(m, dev, tiers, tiles, srv, grid[j])
            h[i, j] = head_rows_s(m, dev, tiers, tiles, srv, grid[j])
            dp[i, j] = draft_prompt_s(m, dev, tiers, tiles, srv, grid[j])
            ds[i, j] = draft_steps_s(m, dev, tiers, tiles, srv, grid[j])
        kv_coef[i] = kv_s_per_token(m, dev, tiers, tiles, srv)
        pair_coef[i] = pair_s(m, dev, srv)
        cap[i] = math.floor(kv_capacity_tokens(m, dev, srv) / srv.pp)
    return g, h, dp, ds, kv_coef, pair_coef, cap


@jit
def sla_reasons(wl, ttft, ttft_p90, tpot, tpot_p90):
    """``sla_reason`` of every row (``wl`` a one-element record array)."""
    n = ttft.shape[0]
    out = np.empty(n, np.int64)
    for i in range(n):
        out[i] = sla_reason(wl[0], ttft[i], ttft_p90[i], tpot[i], tpot_p90[i])
    return out
