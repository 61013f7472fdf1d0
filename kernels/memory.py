"""Memory per device: activations kept for the backward (Korthikanti et al. 2022,
generalised), parameters, gradients and optimizer states under ZeRO and
offload, DualPipe's and PipeDream's extra copies, the fixed overhead and
communication buffers; the peak over a candidate's stages. modeling.md
sections 6-7."""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from paraspace.kernels.codes import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE_OPS, SCHEDULE_DUALPIPE, \
    SCHEDULE_INTERLEAVED, SCHEDULE_PIPEDREAM, ZERO_3_DEFERRED
from paraspace.kernels.jit import jit
from paraspace.kernels.optimizer import OPT_DEVICE_MASTER, OPT_GRAD_FRACTION, OPT_HOST_STATE_FRACTION, \
    OPT_STATE_FRACTION
from paraspace.kernels.parameters import device_dense_layers, device_layers, layer_params, moe_layer_params, \
    param_parts, stage_params_from
from paraspace.kernels.recompute import recomputed_layers
from paraspace.kernels.routing import layer_imbalance
from paraspace.kernels.schedules import in_flight_chunks

#: Per recompute mode (index = kernels.codes RECOMPUTE_*: none, selective, full,
#: norms, moe-dispatch, selective-ops), what a layer that is not fully recomputed
#: keeps (full recompute keeps only the layer input; its entries are unused):
#: Korthikanti's replicated ab x tokens x h tensors: the two norm inputs and the
#: two norm outputs (the QKV and MLP inputs); "norms" recomputes the outputs in
#: the backward (Megatron-Core's recompute module "layernorm") and keeps 2;
#: "selective-ops" keeps only the layer input: the second norm's input is a
#: residual add of the output projection's output, both recomputed
#: (``_layer_activation_bytes`` adds what the policy keeps besides: the
#: reduce-scatter outputs with sequence parallelism, a gated MLP's down-projection output).
RC_REPLICATED = np.array([4.0, 4.0, 0.0, 2.0, 4.0, 1.0])
#: 1 where the s x s attention scores are kept without FlashAttention (selective and
#: selective-ops drop them: the unfused core's matmuls and softmax run again)
RC_SCORES = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
#: h-wide tensors kept per routed row of an MoE layer: the expert input (the
#: dispatched row) and output; "moe-dispatch" drops the input and dispatches again
#: in the backward
RC_ROUTED_H = np.array([2.0, 2.0, 0.0, 2.0, 1.0, 2.0])


@jit
def _layer_activation_bytes(b: float, s: float, t: float, c: float, sp: bool, recompute: int, flash: bool, model,
                            ab: float, moe_layer: bool, imbalance: float) -> float:
    tokens = b * s / c
    h = model.hidden
    if recompute == RECOMPUTE_FULL:
        full_input = ab * tokens * h
        return full_input / t if sp else full_input
    dropout = model.dropout > 0
    ops = recompute == RECOMPUTE_SELECTIVE_OPS
    replicated = RC_REPLICATED[recompute] * ab * tokens * h
    if ops and sp:  # the policy keeps the two reduce-scatter outputs (attention's and the MLP's)
        replicated += 2.0 * ab * tokens * h
    if dropout:
        replicated += 2.0 * tokens * h
    if sp:
        replicated /= t
    if ops and model.glu > 0 and not moe_layer:  # the down projection (7th GEMM): its output, TP's partial sums
        replicated += ab * tokens * h
    heads = model.heads / t
    if model.mla > 0:  # Q, K (nope + rope), V and O per head; the replicated latents
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        split = ab * tokens * heads * ((1.0 if ops else 2.0) * qk + 2.0 * model.v_head_dim)
        split += ab * tokens * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
    else:  # Q, K, V and the attention output; selective-ops recomputes K (the 2nd GEMM)
        kv = model.kv_heads / t
        split = ab * tokens * model.head_dim * (2.0 * heads + (1.0 if ops else 2.0) * kv)
    if moe_layer:
        # router logits and probabilities (fp32) of this rank's 1/t of the tokens; per
        # routed row: the expert input and output (h each) and gate, up, activation (3 f_e);
        # the shared experts as a dense MLP split by t
        rows = tokens / t * model.top_k * imbalance
        split += 8.0 * tokens / t * model.experts
        split += ab * rows * (RC_ROUTED_H[recompute] * h + 3.0 * model.expert_ffn)
        split += 3.0 * ab * tokens * model.shared_experts * model.expert_ffn / t
    elif ops:  # the gate (or fc1) output is kept; up, the activation and its product run again
        split += ab * tokens * model.ffn / t
    else:
        split += (3.0 if model.glu > 0 else 2.0) * ab * tokens * model.ffn / t
    scores = 0.0
    if flash:
        scores = 4.0 * b * heads * (s / c)
    elif RC_SCORES[recompute] > 0:
        per_elem = ab + (1.0 + ab if dropout else 0.0)
        scores = per_elem * b * heads * (s / c) * s
    return replicated + split + scores


@jit
def activation_bytes_per_layer(b: float, s: float, t: float, c: float, sp: bool, recompute: int,
                               flash: bool, model, ab: float) -> float:
    """Activation bytes one dense layer keeps for backward, per micro-batch per device.

    Korthikanti et al. 2022 (section 4.1, eq. 1-2), generalised to GQA and gated
    MLPs and to any element width ab (their coefficients assume ab = 2):
    replicated (split by t only with sequence parallelism): two norm inputs,
    QKV and MLP inputs (ab each per token x h), dropout masks (1 byte, x2);
    split by t: Q, K, V, attention output, MLP intermediates (3f gated: gate
    and up outputs and the down-projection input; 2f for GeLU); the s x s
    softmax output (+ dropout mask and output) unless FlashAttention or
    selective recompute removes it (flash keeps the fp32 log-sum-exp instead).
    Full recompute keeps only the layer input; norms recompute drops the two
    norm outputs (``RC_REPLICATED``). MLA keeps its per-head Q, K, V, O and the
    replicated latents. Selective-ops applies torchtitan's per-op policy to a
    layer's GEMMs in forward order (Q, K, V, O, gate, up, down: the 1st, 3rd,
    5th and 7th outputs kept, with the attention output; the early-stopping
    recompute redoes only what the backward reads): it keeps the layer input,
    Q, V, the attention output, the gate (GeLU: fc1) output and a gated MLP's
    down-projection output (unsplit: under TP, the partial sums); with sequence
    parallelism also the two reduce-scatter outputs; MLA drops its K.
    For GPT (ab = 2, f = 4h, dropout, no flash):
    s b h (10 + 24/t + 5 a s / (h t)) without SP, s b h / t (34 + 5 a s / h) with SP;
    with norms recompute 4 s b h fewer replicated bytes: s b h (6 + 24/t + 5 a s / (h t)),
    s b h / t (30 + 5 a s / h).
    """
    return _layer_activation_bytes(b, s, t, c, sp, recompute, flash, model, ab, False, 1.0)


@jit
def moe_activation_bytes_per_layer(b: float, s: float, t: float, c: float, sp: bool, recompute: int,
                                   flash: bool, model, ab: float, imbalance: float) -> float:
    """``activation_bytes_per_layer`` of an MoE layer: the MLP's intermediates
    replaced by the router's fp32 logits and probabilities, the routed rows
    (k x imbalance per token: expert input, output and three f_e-wide
    intermediates; moe-dispatch recompute drops the input, ``RC_ROUTED_H``) and
    the shared experts' intermediates."""
    return _layer_activation_bytes(b, s, t, c, sp, recompute, flash, model, ab, True, imbalance)



@jit
def eager_bytes_per_layer(b: float, s: float, t: float, c: float, recompute: int, model, ab: float,
                          moe_layer: bool, imbalance: float) -> float:
    """Bytes a layer run as eager PyTorch ops keeps for its backward beyond
    ``activation_bytes_per_layer``'s (``SpaceSpec.elementwise = "eager"``), per
    micro-batch per device, split by t: the rotated Q and K (rotary applied out of
    place, new tensors beside the QKV output; MLA: its rotary parts), the attention
    output's transposed copy that the output projection reads, and a gated MLP's SiLU
    output (an unfused SwiGLU keeps the gate, up, SiLU(gate) and their product; an MoE
    layer's routed rows and shared experts alike). Measured to 0.01% on an H100 and an
    H200 (``docs/measurements``, ``layer.csv``): Llama 3 8B keeps ab (f + (2 heads +
    kv_heads) d) = 2 (14,336 + 72 x 128) = 47,104 bytes a token more than the fused
    count's 139,392. None under full recompute (the layer keeps its input) or
    selective-ops (the per-op policy decides what is kept)."""
    if recompute == RECOMPUTE_FULL or recompute == RECOMPUTE_SELECTIVE_OPS:
        return 0.0
    tokens = b * s / c
    heads = model.heads / t
    if model.mla > 0:
        rope = model.qk_rope_head_dim
        kept = ab * tokens * (heads * (rope + model.v_head_dim) + rope)
    else:
        kept = ab * tokens * model.head_dim * (2.0 * heads + model.kv_heads / t)
    if model.glu <= 0:
        return kept
    if moe_layer:
        rows = tokens / t * model.top_k * imbalance
        return kept + ab * rows * model.expert_ffn + ab * tokens * model.shared_experts * model.expert_ffn / t
    return kept + ab * tokens * model.ffn / t


@jit(inline=True)
def kept_bytes_per_layer(sh, recompute: int, model, work, moe_layer: bool, imbalance: float) -> float:
    """What one layer of ``sh``'s shape keeps for its backward under ``recompute``:
    ``activation_bytes_per_layer`` (``moe_activation_bytes_per_layer`` for an MoE
    layer, its busiest EP rank at ``imbalance``) plus, where the workload runs eager
    PyTorch ops, ``eager_bytes_per_layer``."""
    b, s, t, c, ab = sh.b, sh.s, sh.t, sh.c, sh.ab
    kept = _layer_activation_bytes(b, s, t, c, sh.sp, recompute, sh.flash, model, ab, moe_layer, imbalance)
    if work.eager_elementwise > 0:
        kept += eager_bytes_per_layer(b, s, t, c, recompute, model, ab, moe_layer, imbalance)
    return kept


@jit
def layer_input_bytes(b: float, s: float, t: float, c: float, sp: bool, model, ab: float) -> float:
    """A layer's input (what full recompute keeps): tokens x h, split by t with SP."""
    full_input = ab * b * s / c * model.hidden
    return full_input / t if sp else full_input


@jit
def comm_groups(t: float, c: float, d: float, p: float, ep: float, etp: float, edp: float, moe: bool) -> float:
    """Process groups of more than one rank a device belongs to, each a communicator
    with its own buffers: TP, CP, the DP x CP gradient group, PP and, with experts,
    EP, expert TP and expert DP."""
    n = 0.0
    for size in (t, c, d * c, p):
        if size > 1.0:
            n += 1.0
    if moe:
        for size in (ep, etp, edp):
            if size > 1.0:
                n += 1.0
    return n


@jit
def fixed_overhead_bytes(t: float, c: float, d: float, p: float, ep: float, etp: float, edp: float, moe: bool,
                         dev) -> float:
    """Device memory beside the tensors that does not scale with them: the
    profile's fixed overhead (context, workspace) and the communication buffers
    of each process group (``comm_groups``); the allocator's fragmentation,
    a fraction of the tensors' bytes, comes on top (``evaluate_one``)."""
    return dev.memory_overhead_bytes + comm_groups(t, c, d, p, ep, etp, edp, moe) * dev.comm_buffer_bytes


#: Activation bytes per layer and micro-batch: what a layer that is not fully
#: recomputed keeps (keep_*), what the row's recompute setting keeps (act_*),
#: dense and MoE; the extra bytes a recomputing layer's backward needs
#: (work_layer); and the layer input (what full recompute keeps).
Activations = namedtuple("Activations", ("keep_dense", "act_dense", "keep_moe", "act_moe", "work_layer", "inp"))

#: The peak-memory stage's bytes: total, overhead, weights, gradients, optimizer
#: states, activations, MoE buffers, host memory; the stage; the largest host
#: share over all stages.
MemoryPeak = namedtuple("MemoryPeak", ("peak", "overhead", "weights", "grads", "optim", "acts", "buffers", "host",
                                       "stage", "host_peak"))


@jit(inline=True)
def activation_sizes(sh, recompute: int, model, work):
    """The ``Activations`` of a layer of ``sh``'s shape. While a layer's backward
    recomputes, what it did not keep lives again for that one layer: (all of it)
    - (what is kept), so more recompute never needs more memory."""
    b, s, t, c, sp, ab = sh.b, sh.s, sh.t, sh.c, sh.sp, sh.ab
    is_moe = model.experts > 0 and model.dense_layers < model.layers
    kept = RECOMPUTE_NONE if recompute == RECOMPUTE_FULL else recompute
    none_dense = kept_bytes_per_layer(sh, RECOMPUTE_NONE, model, work, False, 1.0)
    act_dense = kept_bytes_per_layer(sh, recompute, model, work, False, 1.0)
    keep_dense = none_dense if kept == RECOMPUTE_NONE else act_dense
    act_moe = 0.0
    keep_moe = 0.0
    none_moe = 0.0
    if is_moe:
        imb = layer_imbalance(sh, model, work)  # the busiest EP rank's routed rows over the mean
        none_moe = kept_bytes_per_layer(sh, RECOMPUTE_NONE, model, work, True, imb)
        act_moe = kept_bytes_per_layer(sh, recompute, model, work, True, imb)
        keep_moe = none_moe if kept == RECOMPUTE_NONE else act_moe
    work_layer = none_dense - act_dense
    if is_moe:
        work_layer = max(work_layer, none_moe - act_moe)
    return Activations(keep_dense, act_dense, keep_moe, act_moe, work_layer,
                       layer_input_bytes(b, s, t, c, sp, model, ab))


@jit(inline=True)
def stage_state_bytes(stage: int, sh, kn, edp: float, unit: float, parts, model, work):
    """(weights, gradients, optimizer states, host) bytes of stage ``stage``'s
    device: ZeRO shards over DP x CP (experts over expert DP), weight offload
    keeps the current and the prefetched ``unit`` on the device, host-side
    optimizer states; DualPipe's device holds stage ``stage`` and stage
    p - 1 - stage, each kind of parameter sharded as its own (dense over DP x CP,
    experts over expert DP), the gathered or prefetched working layers once;
    PipeDream stashes p - stage weight versions. ZeRO-3 with deferred gradient reduction
    (``ZERO_3_DEFERRED``) holds the stage's whole gradient, unsharded, as the
    micro-batches accumulate it (FSDP keeps it in the reduction precision). Its own
    parameter shard is a 16-bit copy beside the optimizer's fp32 master, or, with the
    workload's ``zero3_master_shard`` and an optimizer that keeps that master on the
    device (``OPT_DEVICE_MASTER``), the master alone (PyTorch FSDP: 2 bytes a parameter
    of the shard fewer)."""
    pp = int(sh.p)
    dc = sh.d * sh.c
    zero = kn.zero
    dense, expert = stage_params_from(stage, pp, parts, model)
    if kn.schedule == SCHEDULE_DUALPIPE:  # the twin stage's parameters too (modeling.md section 6)
        twin_dense, twin_expert = stage_params_from(pp - 1 - stage, pp, parts, model)
        dense += twin_dense
        expert += twin_expert
    params = dense + expert
    host = 0.0
    grads = 0.0
    host_state = work.optimizer_bytes * OPT_HOST_STATE_FRACTION[kn.optimizer]
    if host_state > 0:  # CPU Adam's fp32 master and moments, paged 8-bit Adam's moments: on the host
        host += (dense / dc + expert / edp) * host_state if zero >= 1 else params * host_state
    if kn.off_w != 0:  # weights and gradients on the host, the current and the prefetched unit on the device
        host += params * (work.weight_bytes + work.grad_bytes)
        params_dev = min(params, 2.0 * unit)
        weights = params_dev * work.weight_bytes
        grads = params_dev * work.grad_bytes
    elif zero >= 3:  # own shard + the gathered current and prefetched layers, at most all of them
        own = dense / dc + expert / edp
        if work.zero3_master_shard != 0.0 and OPT_DEVICE_MASTER[kn.optimizer] != 0.0:
            own = 0.0  # the shard is the optimizer's fp32 master (in optim), cast to 16 bits as gathered
        weights = min(params, own + 2.0 * layer_params(model, sh.t)) * work.weight_bytes
    else:
        weights = params * work.weight_bytes
    if kn.off_w == 0:
        # a deferred reduction accumulates the whole gradient unsharded in fp32; otherwise it
        # is stored in the optimizer's gradient precision, sharded from ZeRO-2 on
        deferred = zero == ZERO_3_DEFERRED
        gb = work.grad_bytes if deferred else work.grad_bytes * OPT_GRAD_FRACTION[kn.optimizer]
        grads = (dense / dc + expert / edp) * gb if zero >= 2 and not deferred else params * gb
    state = work.optimizer_bytes * OPT_STATE_FRACTION[kn.optimizer]
    optim = (dense / dc + expert / edp) * state if zero >= 1 else params * state
    # ---- PipeDream's weight versions (modeling.md section 6)
    if kn.schedule == SCHEDULE_PIPEDREAM:  # weight stashing: p - stage versions, one gradient and optimizer state
        weights += (sh.p - stage - 1.0) * params * work.weight_bytes
    return weights, grads, optim, host


@jit(inline=True)
def stage_activation_bytes(stage: int, sh, kn, acts, logits: float, loss_bytes: float, model):
    """(activation bytes on the device, bytes offloaded to the host) of stage
    ``stage`` at the schedule's peak (``in_flight_chunks``): kept layers keep
    ``acts.keep_*``, fully recomputed ones their input; offloaded activations
    leave only layer inputs, two layers' worth back in flight; the last stage
    (and DualPipe's device 0) adds the loss's ``loss_bytes`` per logit element
    (``kernels.params.LOSS_BYTES``) and the MTP modules'."""
    pp = int(sh.p)
    n = device_layers(stage, pp, model.layers)
    nd = device_dense_layers(stage, pp, model)
    inp = acts.inp
    chunks = in_flight_chunks(kn.schedule, sh.p, kn.v, kn.m, float(stage))
    fr_d, fr_m = recomputed_layers(kn.recompute, kn.rc_layers, nd, n - nd)
    per_chunk = (nd - fr_d) * acts.keep_dense + (n - nd - fr_m) * acts.keep_moe + (fr_d + fr_m) * inp
    host_chunk = 0.0
    if kn.off_act != 0:  # only layer inputs stay; the rest waits on the host, two layers' worth in flight
        host_chunk = per_chunk - n * inp
        per_chunk = n * inp
    if kn.schedule == SCHEDULE_INTERLEAVED:
        per_chunk /= kn.v
        if kn.off_act != 0:
            host_chunk /= kn.v
    device = chunks * per_chunk + acts.work_layer
    host = 0.0
    off_layers = n - fr_d - fr_m  # layers whose activations go to the host
    if kn.off_act != 0 and off_layers > 0:
        # the layer in its backward and the one being fetched are back on the device
        # (never more layers than were offloaded, so offloading never adds memory)
        keep_off = acts.keep_dense if nd - fr_d > 0 else 0.0
        if n - nd - fr_m > 0:
            keep_off = max(keep_off, acts.keep_moe)
        back = min(2.0, chunks * off_layers)
        host = chunks * host_chunk - back * (keep_off - inp)
        device += back * (keep_off - inp)
    mtp = acts.act_moe if model.experts > 0 else acts.act_dense
    if stage == pp - 1:
        device += loss_bytes * logits  # the loss over one micro-batch's logits
        device += chunks * model.mtp_depth * mtp
    if kn.schedule == SCHEDULE_DUALPIPE and stage == 0 and pp > 1:
        # device 0 also runs the upward direction's last stage and its loss
        device += loss_bytes * logits
        device += chunks * model.mtp_depth * mtp
    return device, host


@jit(inline=True)
def device_memory(sh, kn, edp: float, logits: float, moe_buffer: float, model, dev, work):
    """The ``MemoryPeak`` over the candidate's stages: tensors plus the fixed
    overhead and the allocator's fragmentation (a fraction of the tensors)."""
    pp = int(sh.p)
    t = sh.t
    is_moe = model.experts > 0 and model.dense_layers < model.layers
    acts = activation_sizes(sh, kn.recompute, model, work)
    # the largest unit streamed with weight offload: a layer, or the embedding / head
    unit = max(layer_params(model, t), model.vocab * model.hidden / t)
    if is_moe:
        moe_d, moe_e = moe_layer_params(model, t, sh.e, sh.et)
        unit = max(unit, moe_d + moe_e)
    parts = param_parts(model, t, sh.e, sh.et)
    fixed_overhead = fixed_overhead_bytes(t, sh.c, sh.d, sh.p, sh.e, sh.et, edp, is_moe, dev)
    peak = -1.0
    host_peak = 0.0
    parts_at_peak = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    for stage in range(pp):
        weights, grads, optim, host = stage_state_bytes(stage, sh, kn, edp, unit, parts, model, work)
        act, host_act = stage_activation_bytes(stage, sh, kn, acts, logits, work.loss_bytes, model)
        host += host_act
        buffers = moe_buffer if device_layers(stage, pp, model.layers) > device_dense_layers(stage, pp, model) else 0.0
        host_peak = max(host_peak, host)
        tensors = weights + grads + optim + act + buffers
        overhead = fixed_overhead + dev.memory_fragmentation * tensors
        total = tensors + overhead
        if total > peak:
            peak = total
            parts_at_peak = (overhead, weights, grads, optim, act, buffers, host, float(stage))
    overhead, weights, grads, optim, act, buffers, host, at = parts_at_peak
    return MemoryPeak(peak, overhead, weights, grads, optim, act, buffers, host, at, host_peak)
