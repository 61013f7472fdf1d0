"""Inference kernels: prefill, decode steps, KV cache memory and serving throughput.

modeling.md section 8. One *replica* serves a batch of ``b`` sequences on
``tp * pp`` devices (``SERVING`` record); a deployment of ``n_gpus`` devices
runs ``n_gpus / (tp * pp)`` replicas side by side. All sizes are float64, all
times seconds, all memory bytes.

Layout of one replica
---------------------
- Attention and dense MLPs tensor-parallel over ``tp`` ranks (Megatron style:
  two all-reduces of the layer's tokens per layer), layers split evenly over
  ``pp`` stages (``kernels.training.device_layers``), one activation message
  between neighbouring stages. The TP all-reduces are the serving engines'
  own peer-to-peer kernels inside an NVLink domain
  (``kernels.collectives.engine_all_reduce_s``), NCCL beyond it.
- With ``attention_dp`` (TensorRT-LLM's "attention data parallelism" for MoE
  models) every non-expert weight is replicated on the ``tp`` ranks and each
  rank serves ``b / tp`` of the sequences with all heads: no TP all-reduce, and
  the MoE layers dispatch tokens all-to-all instead.
- MoE layers: the routed experts are split over ``ep`` ranks and each expert
  over the remaining ``tp / ep`` (expert TP). With TP attention every rank
  already holds every token after the attention all-reduce, so each computes
  its local experts on the rows routed to them and one all-reduce combines the
  partial outputs, exactly like a dense TP MLP: no dispatch. With attention DP
  each rank owns its tokens: all-to-all dispatch and combine
  (``kernels.moe.dispatch_s``) over the EP group, plus an all-gather /
  reduce-scatter of the rows inside each expert-TP group. Only the experts a
  token is routed to are read: for ``T`` tokens each of the ``E`` experts is
  hit with probability ``1 - (1 - k/E)^T`` (uniform routing), so a small
  decode batch reads only a fraction of the expert weights.

Precision
---------
GEMM weights (and KV cache) take ``weight_bytes`` / ``kv_bytes`` (FP8
checkpoints: 1 and 1, the device record then carries the FP8 peak); the
activations between kernels, the collectives' payload, the embedding and the
LM head stay in ``act_bytes`` (16-bit: FP8 checkpoints keep those two
matrices in BF16). Activation quantisation for FP8 GEMMs is taken as fused
into the preceding norm/activation kernel (no extra pass).

Phases
------
- Prefill of ``b`` sequences of ``input_len`` tokens: every GEMM with
  m = b * input_len rows (``kernels.ops.gemm_time_s``: roofline of compute at
  the tile efficiency and the bytes of both operands), causal FlashAttention
  forward over the prompt, memory-bound norms / residuals / rotary / KV cache
  write / activation, TP all-reduces, MoE experts; the LM head on the last
  token of each sequence only.
- Decode step: the same kernels with one token per sequence (m = b), so each
  GEMM reads its whole weight (memory-bound until b reaches the roofline's
  ridge), plus decode attention reading the KV cache, 2 * s * kv_heads *
  head_dim * kv_bytes per sequence per layer (MLA: the latent, s * (kv_lora +
  rope) * kv_bytes, attended with absorbed up-projections), roofline with its
  FLOP; every kernel pays the device's launch overhead.
- A request's decode steps see KV lengths input_len + 1 .. input_len +
  output_len; the step time is affine in the KV length while decode attention
  is memory-bound (its intensity 2 * heads / (kv_heads * kv_bytes) FLOP/byte
  is far below any GPU's ridge), so ``output_len`` steps at the mean length
  input_len + (output_len + 1) / 2 equal the exact sum (``decode_total_s``).
- total latency = prefill + output_len decode steps (FasterTransformer's
  convention: its published total is prefill + output_len x per-token time).
- A model's ``sliding_window`` bounds the keys a query attends (prefill: the
  mean of ``kernels.ops.causal_kv_len``; decode: min(length, window), averaged
  exactly over the steps) and the KV entries a sequence keeps (a cyclic cache).
- A device's ``kernel_fusion`` fuses each residual add + norm pair, rotary into
  attention and the MLP activation into the up-projection's epilogue, as in
  ``kernels.training``.

Serving throughput (rows with no batch)
---------------------------------------
The batch is what the KV cache holds: ``kv_fraction`` of the HBM left beside
the weights and the device's framework overhead, over KV bytes per sequence
at its full length input_len + output_len (TensorRT-LLM's default
GUARANTEED_NO_EVICT scheduler admits a request only when its whole sequence
fits), capped at ``batch_cap`` (trtllm-bench's 4096: its engine tuning caps
the batch there to bound decoder buffers). Continuous batching of requests of
equal length is approximated as waves: a wave prefills ``b`` requests and then
decodes them ``output_len`` steps, so output tokens per second of the
deployment = replicas * b * output_len / (prefill + decode total). Mixing
prefill chunks into decode iterations (which lets a memory-bound decode step
carry prefill work for free) is not modelled, so the estimate leans low where
decode is memory-bound. With ``pp`` > 1 the b sequences form ``pp`` micro-
batches of b / pp that keep every stage busy: each wave costs the full-model
time of one micro-batch.
"""

from __future__ import annotations

import math

import numpy as np

from paraspace.kernels import params
from paraspace.kernels.codes import (
    ALL_GATHER,
    DISPATCH_ALLTOALL,
    REDUCE_SCATTER,
    SEND_RECV,
)
from paraspace.kernels.collectives import collective_time_s, engine_all_reduce_s
from paraspace.kernels.jit import jit
from paraspace.kernels.moe import combine_s, dispatch_s, gathers, grouped_gemm_s
from paraspace.kernels.routing import moe_imbalance
from paraspace.kernels.ops import (
    attention_peak,
    attention_qkv_fwd_bwd_s,
    causal_kv_len,
    gemm_time_16bit_s,
    gemm_time_s,
    memory_bound_s,
)
from paraspace.kernels.training import (
    device_dense_layers,
    device_layers,
    layer_params,
    moe_layer_params,
)

#: One replica's serving setup.
SERVING = np.dtype(
    [
        ("tp", np.float64),
        ("pp", np.float64),
        ("ep", np.float64),  # expert-parallel ranks among the tp ranks (1 for dense models)
        ("attention_dp", np.float64),  # 1: non-expert weights replicated, each rank serves b / tp sequences
        ("n_gpus", np.float64),  # devices of the whole deployment (replicas = n_gpus / (tp * pp))
        ("weight_bytes", np.float64),  # GEMM weights per element (fp8: 1)
        ("act_bytes", np.float64),  # activations, collectives, embedding and LM head per element
        ("kv_bytes", np.float64),  # KV cache per element
        ("kv_fraction", np.float64),  # share of the HBM left after weights and overhead given to the KV cache
        ("batch_cap", np.float64),  # most concurrent sequences per replica the runtime schedules
        # busiest expert rank's routed rows / the mean; params.DERIVED_IMBALANCE (0):
        # from uniform random routing of each forward's tokens (kernels.routing)
        ("moe_imbalance", np.float64),
        # speculative draft tokens a decode step verifies (kernels.serving; ``serve`` here models none)
        ("draft_tokens", np.float64),
        ("expert_slots", np.float64),  # routed-expert slots of the EP group, redundant copies included (0: experts)
        ("dispatch", np.float64),  # kernels.codes DISPATCH_* under attention DP
        ("tbo", np.float64),  # 1: two-batch overlap (attention DP with ep > 1 only)
        # busiest EP rank's expected expert load over the mean from expert popularity after
        # the placement of the slots (spaces.expert_balance; 1: equally popular experts)
        ("placement_imbalance", np.float64),
        # bytes per element of an MoE dispatch under attention DP (kernels.params.DISPATCH_BYTES);
        # combines move act_bytes
        ("dispatch_bytes", np.float64),
    ]
)

#: TensorRT-LLM's default share of free memory for the KV cache (trtllm-bench's
#: kv_cache_free_gpu_mem_fraction 0.95, as the published runs state)
KV_CACHE_FRACTION = 0.95
#: trtllm-bench caps a replica's batch at 4096 sequences (tensorrt_llm/bench/build/tuning.py)
BATCH_CAP = 4096.0

#: Output columns of ``serve``, in order.
OUTPUTS = (
    "batch",  # sequences per replica the phases ran with
    "max_batch",  # sequences the KV cache holds, capped at batch_cap
    "replicas",
    "weight_bytes",  # per device (the fullest pipeline stage)
    "kv_bytes_per_token",  # per device, per token of a sequence it serves
    "memory_bytes",  # weights + overhead + KV cache of the batch at its full length, per device
    "fits",  # 1 when the batch's KV cache fits in kv_fraction of the free HBM (kv_capacity)
    "prefill_s",
    "decode_step_s",  # one decode step of the batch at the mean KV length
    "decode_total_s",
    "total_s",  # prefill + decode_total
    "output_tokens_per_s",  # the whole deployment, throughput arrangement (pp micro-batches)
    "tokens_per_s",  # prompt and generated tokens per second, the whole deployment
)
N_OUT = len(OUTPUTS)
(
    I_BATCH, I_MAX_BATCH, I_REPLICAS, I_WEIGHTS, I_KV_TOKEN, I_MEMORY, I_FITS, I_PREFILL, I_DECODE_STEP,
    I_DECODE_TOTAL, I_TOTAL, I_OUT_TPS, I_TPS,
) = range(N_OUT)


def serving(**values: float) -> np.ndarray:
    """A SERVING record; ``kv_fraction``, ``batch_cap``, ``moe_imbalance``,
    ``attention_dp``, ``ep``, ``draft_tokens``, ``expert_slots``, ``dispatch``, ``tbo``,
    ``placement_imbalance`` and ``dispatch_bytes`` default to 0.95, 4096, derived
    (``params.DERIVED_IMBALANCE``), 0, 1, 0, 0 (one slot per expert), all-to-all, 0, 1
    and ``act_bytes``."""
    defaults = {"kv_fraction": KV_CACHE_FRACTION, "batch_cap": BATCH_CAP, "moe_imbalance": params.DERIVED_IMBALANCE,
                "attention_dp": 0.0, "ep": 1.0, "draft_tokens": 0.0, "expert_slots": 0.0,
                "dispatch": float(DISPATCH_ALLTOALL), "tbo": 0.0, "placement_imbalance": 1.0,
                "dispatch_bytes": values.get("act_bytes", 0.0)}
    return params.record(SERVING, **{**defaults, **values})


@jit
def expert_slots(model, srv) -> float:
    """Routed-expert slots of the replica's EP group: the experts, plus the
    redundant copies of hot ones (``expert_slots`` > 0)."""
    return srv.expert_slots if srv.expert_slots > 0.0 else model.experts


@jit
def slot_share(model, srv) -> float:
    """Expert weights a rank holds relative to one copy of each expert: slots /
    experts (1 without redundant experts)."""
    if srv.expert_slots > 0.0 and model.experts > 0.0:
        return srv.expert_slots / model.experts
    return 1.0


@jit
def attention_ranks(srv) -> float:
    """Ranks the attention heads and dense weights are split over: tp, or 1 under attention DP."""
    return 1.0 if srv.attention_dp > 0 else srv.tp


@jit
def kv_heads_per_rank(model, srv) -> float:
    """KV heads a rank stores: kv_heads / tp, at least one (a head shared by
    several ranks is replicated on each, as TensorRT-LLM does); all of them
    under attention DP."""
    return max(model.kv_heads / attention_ranks(srv), 1.0)


@jit
def kv_bytes_per_token(model, srv) -> float:
    """KV cache bytes one token of a sequence takes on each device that serves it
    (the first pipeline stage, which holds the most layers): per layer K and V of
    the rank's KV heads, 2 * kv_heads_per_rank * head_dim; MLA the compressed
    latent and the RoPE key, kv_lora_rank + qk_rope_head_dim, on every rank."""
    layers = device_layers(0, int(srv.pp), model.layers)
    if model.mla > 0:
        per_layer = model.kv_lora_rank + model.qk_rope_head_dim
    else:
        per_layer = 2.0 * kv_heads_per_rank(model, srv) * model.head_dim
    return layers * per_layer * srv.kv_bytes


@jit
def device_weight_bytes(model, srv) -> float:
    """Weight bytes on the fullest device: its stage's dense and MoE layers
    (``kernels.training.layer_params`` / ``moe_layer_params`` split by the
    attention ranks, routed experts by ep and the expert TP tp / ep) at
    weight_bytes; the embedding (first stage) and LM head (last stage, a second
    matrix unless tied on one device), split by the attention ranks, at act_bytes."""
    best = 0.0
    for stage in range(int(srv.pp)):
        best = max(best, stage_weight_bytes(model, srv, stage))
    return best


@jit
def stage_weight_bytes(model, srv, stage: int) -> float:
    """Weight bytes on a device of pipeline stage ``stage`` (``device_weight_bytes``)."""
    p = int(srv.pp)
    ta = attention_ranks(srv)
    etp = srv.tp / srv.ep
    emb = model.vocab * model.hidden / ta
    n = device_layers(stage, p, model.layers)
    nd = device_dense_layers(stage, p, model)
    matrices = nd * layer_params(model, ta)
    if n > nd:
        dense, expert = moe_layer_params(model, ta, srv.ep, etp)
        matrices += (n - nd) * (dense + expert * slot_share(model, srv))  # (experts + redundant) / ep a rank
    tables = 0.0
    if stage == 0:
        tables += emb
    if stage == p - 1:
        matrices += model.hidden * (2.0 if model.bias > 0 else 1.0)  # final norm
        if model.tied_embeddings == 0 or p > 1:
            tables += emb
    return matrices * srv.weight_bytes + tables * srv.act_bytes


@jit
def cached_tokens(model, seq_len: float) -> float:
    """KV entries a sequence of ``seq_len`` tokens keeps per layer: all of them,
    or the last ``sliding_window`` (a cyclic cache)."""
    if model.sliding_window > 0.0:
        return min(seq_len, model.sliding_window)
    return seq_len


@jit
def kv_capacity(model, dev, srv, seq_len: float) -> float:
    """Sequences of ``seq_len`` tokens a replica's KV cache holds: kv_fraction of
    the HBM left beside the weights and the framework overhead, over the KV bytes
    of one full sequence (times tp under attention DP, where each rank holds its
    own sequences). 0 when the weights do not fit."""
    return kv_units(dev, srv, device_weight_bytes(model, srv), kv_bytes_per_token(model, srv) * cached_tokens(model, seq_len))


@jit
def kv_units(dev, srv, weights: float, per_unit: float) -> float:
    """Whole units of ``per_unit`` KV-cache bytes (a token, a full sequence) that
    kv_fraction of the HBM beside ``weights`` and the framework overhead holds,
    times tp under attention DP (each rank keeps its own). 0 when nothing fits."""
    free = dev.hbm_capacity_bytes - weights - dev.memory_overhead_bytes
    if free <= 0.0 or per_unit <= 0.0:
        return 0.0
    n = math.floor(srv.kv_fraction * free / per_unit)
    if srv.attention_dp > 0:
        n *= srv.tp
    return float(n)


@jit
def max_batch(model, dev, srv, seq_len: float) -> float:
    """``kv_capacity`` capped at the runtime's batch_cap."""
    return min(kv_capacity(model, dev, srv, seq_len), srv.batch_cap)


@jit
def attention_block_s(model, dev, tiers, tiles, srv, b: float, q: float, s: float) -> float:
    """Attention half of one layer on one rank: projections, attention core,
    output projection, norms / residuals / rotary / KV cache write, and the TP
    all-reduce. ``b`` sequences of the replica, ``q`` new tokens each, ``s``
    tokens of KV (s = q: a causal prefill; q = 1: a decode step). A sliding
    window bounds the keys: a causal prefill's mean keys per query
    (``kernels.ops.causal_kv_len``), a decode step's min(s, window).
    With the device's ``kernel_fusion`` each residual add + norm pair is one
    kernel and rotary runs inside attention (as ``kernels.training``)."""
    return _attention_block_s(model, dev, tiers, tiles, srv, b, q, s, q > 1.0)


@jit
def verify_attention_block_s(model, dev, tiers, tiles, srv, b: float, q: float, s: float) -> float:
    """``attention_block_s`` of a speculative verification step: ``q`` new tokens
    (the last one and the drafts) of each of ``b`` sequences attend to the whole
    cache of ``s`` keys as a decode step does (the KV read once per sequence,
    the FLOP q times a decode step's; the drafts' causal mask among themselves,
    q (q - 1) / 2 of q s pairs, is not taken off). q = 1 is the decode step."""
    return _attention_block_s(model, dev, tiers, tiles, srv, b, q, s, False)


@jit
def _attention_block_s(model, dev, tiers, tiles, srv, b: float, q: float, s: float, causal: bool) -> float:
    dp = srv.attention_dp > 0
    ta = attention_ranks(srv)
    br = b / srv.tp if dp else b  # sequences this rank attends
    tokens = br * q
    h = model.hidden
    wb = srv.weight_bytes
    ab = srv.act_bytes
    kvb = srv.kv_bytes
    heads = model.heads / ta
    if causal:
        s = causal_kv_len(s, model.sliding_window)
    elif model.sliding_window > 0.0:
        s = min(s, model.sliding_window)
    if model.mla > 0:
        nope = model.qk_nope_head_dim
        rope = model.qk_rope_head_dim
        qk = nope + rope
        latent = model.kv_lora_rank + rope
        proj = gemm_time_s(tokens, latent, h, dev, tiles, wb)  # KV down-projection (replicated)
        proj += gemm_time_s(tokens, heads * (nope + model.v_head_dim), model.kv_lora_rank, dev, tiles, wb)
        if model.q_lora_rank > 0:
            proj += gemm_time_s(tokens, model.q_lora_rank, h, dev, tiles, wb)
            proj += gemm_time_s(tokens, heads * qk, model.q_lora_rank, dev, tiles, wb)
        else:
            proj += gemm_time_s(tokens, heads * qk, h, dev, tiles, wb)
        v_out = heads * model.v_head_dim
        if causal:  # prefill: per-head K and V after the up-projections
            attn, _, _ = attention_qkv_fwd_bwd_s(br, q, s, heads, heads, qk, model.v_head_dim, causal, True, dev,
                                                 ab, s)
        else:  # decode (q queries a sequence) with absorbed up-projections: every head reads the shared latent
            flops = 2.0 * br * q * heads * s * (latent + model.kv_lora_rank)
            traffic = br * s * latent * kvb
            attn = max(flops / (attention_peak(dev, kvb) * dev.attention_efficiency),
                       traffic / (dev.hbm_bytes_per_s * dev.memory_efficiency)) + dev.launch_s
        rope_width = heads * rope + rope
        cache_write = tokens * latent * kvb
    else:
        dh = model.head_dim
        kvh = kv_heads_per_rank(model, srv)
        proj = gemm_time_s(tokens, (heads + 2.0 * kvh) * dh, h, dev, tiles, wb)
        v_out = heads * dh
        # prefill's call spans the prompt's keys; a decode kernel (split over the keys, a few
        # queries) is not of that kind: no fill (0)
        attn, _, _ = attention_qkv_fwd_bwd_s(br, q, s, heads, kvh, dh, dh, causal, True, dev, kvb,
                                             s if causal else 0.0)
        rope_width = (heads + kvh) * dh
        cache_write = tokens * 2.0 * kvh * dh * kvb
    out = gemm_time_s(tokens, h, v_out, dev, tiles, wb)
    if dev.kernel_fusion > 0:  # residual add + norm fused twice (read x and residual, write both)
        common = memory_bound_s(8.0 * tokens * h * ab + cache_write, 2.0, dev)
    else:  # two norms (read + write), two residual adds (2 reads + write), rotary on Q and K with the KV write
        common = memory_bound_s(10.0 * tokens * h * ab + 2.0 * tokens * rope_width * ab + cache_write, 5.0, dev)
    total = proj + attn + out + common
    if not dp:
        total += engine_all_reduce_s(srv.tp, 1.0, tokens * h * ab, tiers)
    return total


@jit
def dense_mlp_s(model, dev, tiers, tiles, srv, tokens: float) -> float:
    """A dense MLP on one rank for ``tokens`` rows: up (gated: 2 f) and down GEMMs,
    the activation pass and, under TP, the all-reduce of its output."""
    ta = attention_ranks(srv)
    f = model.ffn / ta
    h = model.hidden
    gated = model.glu > 0
    up = (2.0 if gated else 1.0) * f
    t = gemm_time_s(tokens, up, h, dev, tiles, srv.weight_bytes) + gemm_time_s(tokens, h, f, dev, tiles,
                                                                              srv.weight_bytes)
    if dev.kernel_fusion <= 0:  # else the activation runs in the up-projection's epilogue
        t += memory_bound_s((3.0 if gated else 2.0) * tokens * f * srv.act_bytes, 1.0, dev)
    if srv.attention_dp <= 0:
        t += engine_all_reduce_s(srv.tp, 1.0, tokens * h * srv.act_bytes, tiers)
    return t


@jit
def active_experts(experts: float, top_k: float, tokens: float) -> float:
    """Expected experts (of ``experts``) that receive at least one of ``tokens``
    tokens, each routed uniformly to ``top_k`` distinct experts:
    experts * (1 - (1 - top_k / experts)^tokens)."""
    if tokens <= 0.0 or experts <= 0.0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


@jit
def moe_mlp_s(model, dev, tiers, tiles, srv, tokens: float) -> float:
    """The MoE MLP on one rank whose attention produced ``tokens`` rows: router,
    the grouped GEMMs of its active local experts, shared experts, the local
    permute / unpermute passes and the communication of the layout (module doc)."""
    compute, comm = moe_mlp_parts(model, dev, tiers, tiles, srv, tokens)
    return compute + comm


@jit
def moe_mlp_parts(model, dev, tiers, tiles, srv, tokens: float):
    """``moe_mlp_s`` as (compute, communication): the router, expert and shared-
    expert GEMMs and the local passes, and the dispatch / combine (attention
    DP, ``srv.dispatch``'s algorithm over the EP group) or the all-reduce (TP
    attention). The routed experts sit in ``expert_slots`` slots, slots / ep a
    rank; a token picks top_k of them (a copy of an expert takes an even share
    of its tokens), and the busiest rank's routed rows are the mean times the
    routing's sampling imbalance (``moe_imbalance``: derived, ``kernels.routing``,
    or fixed) times ``placement_imbalance`` (popularity skew left by the slots'
    placement, ``spaces.expert_balance``)."""
    t = srv.tp
    e = srv.ep
    etp = t / e
    dp = srv.attention_dp > 0
    ta = attention_ranks(srv)
    h = model.hidden
    ab = srv.act_bytes
    wb = srv.weight_bytes
    n_exp = model.experts
    slots = expert_slots(model, srv)
    k = model.top_k
    fe = model.expert_ffn
    algorithm = int(srv.dispatch)
    routed = tokens * t if dp else tokens  # tokens routed over this rank's experts (the EP x expert-TP group)
    # the busiest of the e ranks over the mean: the routing's sampling noise (kernels.routing)
    # times the skew of expert popularity left by the placement (spaces.expert_balance)
    imb = moe_imbalance(srv.moe_imbalance, routed, n_exp, k, e) * srv.placement_imbalance
    router = gemm_time_s(tokens, n_exp, h, dev, tiles, ab) + memory_bound_s(12.0 * tokens * n_exp, 2.0, dev)
    hit = active_experts(slots, k, routed) / slots
    groups = slots / e * hit  # local expert slots with at least one row
    rows = routed * k * imb / (slots * hit)  # rows per active slot
    experts = grouped_gemm_s(groups, rows, 2.0 * fe / etp, h, dev, tiles, wb)
    experts += grouped_gemm_s(groups, rows, h, fe / etp, dev, tiles, wb)
    fused = dev.kernel_fusion > 0
    if not fused:
        experts += memory_bound_s(3.0 * groups * rows * fe / etp * ab, 1.0, dev)
    rank_rows = groups * rows
    # permute before, unpermute after: scan the tokens (a gathering dispatch: the whole gathered
    # buffer, e times this rank's), move each routed row out and back
    scanned = e * tokens if dp and gathers(algorithm) else tokens
    local = 2.0 * memory_bound_s((scanned + 2.0 * rank_rows) * h * ab, 2.0, dev)
    shared = 0.0
    if model.shared_experts > 0:
        width = model.shared_experts * fe / ta
        shared = gemm_time_s(tokens, 2.0 * width, h, dev, tiles, wb) + gemm_time_s(tokens, h, width, dev, tiles, wb)
        if not fused:
            shared += memory_bound_s(3.0 * tokens * width * ab, 1.0, dev)
    comm = 0.0
    if dp:  # the dispatch at dispatch_bytes an element, the combine at the activations'
        comm = dispatch_s(algorithm, tokens * h * srv.dispatch_bytes, e, etp, n_exp, k, model.max_nodes, tiers)[0]
        comm += combine_s(algorithm, tokens * h * ab, e, etp, n_exp, k, model.max_nodes, tiers)
        if etp > 1.0:  # expert TP: the dispatched rows gathered among its ranks, outputs scattered back
            rows = etp * tokens * k * imb * h
            comm += collective_time_s(ALL_GATHER, etp, 1.0, rows * srv.dispatch_bytes, tiers)
            comm += collective_time_s(REDUCE_SCATTER, etp, 1.0, rows * ab, tiers)
    else:  # every rank holds every token: one all-reduce sums the partial expert outputs
        comm = engine_all_reduce_s(t, 1.0, tokens * h * ab, tiers)
    return router + experts + local + shared, comm


@jit
def two_batch_layer_s(attn_half: float, compute_half: float, comm_half: float) -> float:
    """One MoE layer under two-batch overlap: the batch as two halves, each
    half's dispatch and combine running while the other half computes, so per
    layer each half exposes what its communication outlasts the other half's
    compute: 2 (attention + MoE compute of a half) + 2 max(0, comm - compute)
    (the halves' GEMMs at half m: a memory-bound decode GEMM reads its weight
    twice). SGLang's two-batch overlap; DeepSeek-V3/R1 inference overview
    (open-infra-index, 2025): "the communication cost of one microbatch is
    hidden behind the computation of the other"."""
    busy = attn_half + compute_half
    return 2.0 * busy + 2.0 * max(0.0, comm_half - busy)


@jit
def head_s(model, dev, tiers, tiles, srv, rows: float) -> float:
    """Final norm, LM head on ``rows`` tokens of the replica (16-bit weights at the 16-bit
    peak: FP8 checkpoints leave their head unquantized),
    the all-gather of the TP-split logits and a sampling pass over them."""
    dp = srv.attention_dp > 0
    ta = attention_ranks(srv)
    rank_rows = rows / srv.tp if dp else rows
    ab = srv.act_bytes
    v = model.vocab
    t = memory_bound_s(2.0 * rank_rows * model.hidden * ab, 1.0, dev)
    t += gemm_time_16bit_s(rank_rows, v / ta, model.hidden, dev, tiles, ab)
    if not dp:
        t += collective_time_s(ALL_GATHER, srv.tp, 1.0, rank_rows * v * ab, tiers)
    return t + memory_bound_s(rank_rows * v * ab, 1.0, dev)


@jit
def forward_s(model, dev, tiers, tiles, srv, b: float, q: float, s: float) -> float:
    """One forward of the replica: ``b`` sequences, ``q`` new tokens each over a KV
    of ``s`` tokens, through every layer of every stage in turn (the latency of
    one batch), with the embedding, the head on the last token of each sequence
    and the activation messages between stages."""
    return forward_head_s(model, dev, tiers, tiles, srv, b, q, s)[0]


@jit
def forward_head_s(model, dev, tiers, tiles, srv, b: float, q: float, s: float):
    """(``forward_s``, the ``head_s`` term it adds): a caller that wants the forward
    without its head subtracts the very number added rather than evaluate the head
    again (``kernels.serving.rows_s``: the same bits, one head fewer)."""
    if b <= 0.0:
        return 0.0, 0.0
    dp = srv.attention_dp > 0
    tokens = (b / srv.tp if dp else b) * q  # rows on one rank
    dense_layers = model.layers
    if model.experts > 0:
        dense_layers = min(model.dense_layers, model.layers)
    moe_layers = model.layers - dense_layers
    total = 0.0
    if srv.tbo > 0 and dp and srv.ep > 1.0 and moe_layers > 0.0:
        # two-batch overlap: every layer runs the two halves in turn (two_batch_layer_s)
        half = attention_block_s(model, dev, tiers, tiles, srv, 0.5 * b, q, s)
        if dense_layers > 0.0:
            total += dense_layers * 2.0 * (half + dense_mlp_s(model, dev, tiers, tiles, srv, 0.5 * tokens))
        compute, comm = moe_mlp_parts(model, dev, tiers, tiles, srv, 0.5 * tokens)
        total += moe_layers * two_batch_layer_s(half, compute, comm)
    else:
        attn = attention_block_s(model, dev, tiers, tiles, srv, b, q, s)
        if dense_layers > 0.0:
            total += dense_layers * (attn + dense_mlp_s(model, dev, tiers, tiles, srv, tokens))
        if moe_layers > 0.0:
            total += moe_layers * (attn + moe_mlp_s(model, dev, tiers, tiles, srv, tokens))
    total += memory_bound_s(2.0 * tokens * model.hidden * srv.act_bytes, 1.0, dev)  # embedding lookup
    head = head_s(model, dev, tiers, tiles, srv, b)
    total += head
    p = srv.pp
    if p > 1.0:
        total += (p - 1.0) * collective_time_s(SEND_RECV, p, srv.tp, tokens * model.hidden * srv.act_bytes, tiers)
    return total, head


@jit
def prefill_s(model, dev, tiers, tiles, srv, b: float, input_len: float) -> float:
    """Prefill latency of ``b`` prompts of ``input_len`` tokens (causal attention
    over the prompt; the head only on each sequence's last token)."""
    return forward_s(model, dev, tiers, tiles, srv, b, input_len, input_len)


@jit
def decode_step_s(model, dev, tiers, tiles, srv, b: float, kv_len: float) -> float:
    """One decode step: one token for each of ``b`` sequences over a KV cache of
    ``kv_len`` tokens (the new token's included)."""
    return forward_s(model, dev, tiers, tiles, srv, b, 1.0, kv_len)


@jit
def mean_kv_len(input_len: float, output_len: float, window: float) -> float:
    """Mean keys attended over a request's decode steps, whose KV lengths run
    input_len + 1 .. input_len + output_len: their mean, input_len +
    (output_len + 1) / 2, or with a sliding window w the mean of min(length, w)."""
    first = input_len + 1.0
    last = input_len + output_len
    if window <= 0.0 or window >= last:
        return input_len + 0.5 * (output_len + 1.0)
    if window <= first:
        return window
    below = math.floor(window) - first + 1.0  # steps whose length is at most w
    return ((first + math.floor(window)) * below / 2.0 + (output_len - below) * window) / output_len


@jit
def serve(model, dev, tiers, tiles, srv, batch: float, input_len: float, output_len: float):
    """``OUTPUTS`` of one request shape. ``batch`` > 0: that many sequences per
    replica; 0: as many as the KV cache holds (``max_batch``; all-NaN times and
    fits = 0 when not even one fits). Latencies run the batch through every
    stage; the throughput columns split it into pp micro-batches (module doc)."""
    out = np.zeros(N_OUT)
    seq = input_len + output_len
    room = kv_capacity(model, dev, srv, seq)
    cap = min(room, srv.batch_cap)
    b = batch if batch > 0.0 else cap
    weights = device_weight_bytes(model, srv)
    kv_token = kv_bytes_per_token(model, srv)
    per_rank = b / srv.tp if srv.attention_dp > 0 else b
    memory = weights + dev.memory_overhead_bytes + per_rank * cached_tokens(model, seq) * kv_token
    out[I_BATCH] = b
    out[I_MAX_BATCH] = cap
    out[I_REPLICAS] = srv.n_gpus / (srv.tp * srv.pp)
    out[I_WEIGHTS] = weights
    out[I_KV_TOKEN] = kv_token
    out[I_MEMORY] = memory
    out[I_FITS] = 1.0 if 1.0 <= b <= room else 0.0
    if b < 1.0:
        for i in range(I_PREFILL, N_OUT):
            out[i] = np.nan
        return out
    s_mean = mean_kv_len(input_len, output_len, model.sliding_window)
    pre = prefill_s(model, dev, tiers, tiles, srv, b, input_len)
    step = decode_step_s(model, dev, tiers, tiles, srv, b, s_mean)
    out[I_PREFILL] = pre
    out[I_DECODE_STEP] = step
    out[I_DECODE_TOTAL] = output_len * step
    out[I_TOTAL] = pre + output_len * step
    mb = b / srv.pp
    wave = prefill_s(model, dev, tiers, tiles, srv, mb, input_len) + output_len * decode_step_s(
        model, dev, tiers, tiles, srv, mb, s_mean)
    out[I_OUT_TPS] = out[I_REPLICAS] * b * output_len / wave
    out[I_TPS] = out[I_REPLICAS] * b * seq / wave
    return out
