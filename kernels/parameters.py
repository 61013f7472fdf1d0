"""What each device holds of the model: parameter counts per layer, per stage
and of the whole model, the layers of each pipeline stage and virtual chunk
(uneven splits), and the model's FLOP per sequence."""

from __future__ import annotations

from paraspace.kernels.codes import SCHEDULE_DUALPIPE
from paraspace.kernels.jit import jit
from paraspace.kernels.ops import causal_kv_len


@jit
def attention_weights(model):
    """Matrix elements of one layer's attention as (TP-split, replicated).

    MHA/GQA: Q, K, V (kv_heads for K and V) and the output projection, all split.
    MLA (DeepSeek-V2/V3): the down-projections h x q_lora and h x (kv_lora + rope)
    are replicated; the up-projections q_lora x heads (nope + rope) (or h x that
    without a query rank), kv_lora x heads (nope + v) and the output heads v x h
    are split by heads."""
    h = model.hidden
    if model.mla > 0:
        heads = model.heads
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        split = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim) + heads * model.v_head_dim * h
        rep = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        if model.q_lora_rank > 0:
            split += model.q_lora_rank * heads * qk
            rep += h * model.q_lora_rank
        else:
            split += h * heads * qk
        return split, rep
    q = model.heads * model.head_dim
    kv = model.kv_heads * model.head_dim
    return h * (q + 2.0 * kv) + q * h, 0.0


@jit
def layer_vectors(model, width: float):
    """Vector parameters of one layer as (TP-split, replicated): biases of the
    column-parallel matrices (QKV, MLP up of ``width``) are split; norm weights
    (2h; with biases 4h, plus the out-proj and down-proj biases added after the
    TP reduction: 6h) and MLA's latent norms are replicated (Megatron-LM)."""
    h = model.hidden
    split = 0.0
    rep = 2.0 * h
    if model.bias > 0:
        q = model.heads * model.head_dim
        kv = model.kv_heads * model.head_dim
        split = (q + 2.0 * kv) + (2.0 if model.glu > 0 else 1.0) * width
        rep = 6.0 * h
    if model.mla > 0:
        rep += model.kv_lora_rank + model.q_lora_rank
    return split, rep


@jit
def mlp_matrices(model, width: float) -> float:
    """Matrix elements of a (gated) MLP of intermediate ``width``."""
    return (3.0 if model.glu > 0 else 2.0) * model.hidden * width


@jit
def layer_params(model, t: float) -> float:
    """Parameters of one dense transformer layer held by one of t tensor-parallel ranks.

    Attention (``attention_weights``) and the MLP (3 h f gated, 2 h f otherwise)
    are sharded by t, as are the column-parallel biases; norms and the
    row-parallel biases are replicated (``layer_vectors``)."""
    split, rep = attention_weights(model)
    vsplit, vrep = layer_vectors(model, model.ffn)
    return (split + mlp_matrices(model, model.ffn) + vsplit) / t + rep + vrep


@jit
def moe_layer_params(model, t: float, ep: float, etp: float):
    """Parameters of one MoE layer on one device as (non-expert, expert): the
    attention and norms as in a dense layer, the router (experts x h, replicated),
    the shared experts split by t like a dense MLP, and E / ep routed experts
    (3 h f_e each, gated) split by the expert TP size."""
    split, rep = attention_weights(model)
    shared = model.shared_experts * model.expert_ffn
    vsplit, vrep = layer_vectors(model, shared)
    router = model.experts * model.hidden
    dense = (split + mlp_matrices(model, shared) + vsplit) / t + rep + vrep + router
    expert = model.experts / ep * 3.0 * model.hidden * model.expert_ffn / etp
    return dense, expert


@jit
def mtp_params(model, t: float, ep: float, etp: float):
    """Parameters of the multi-token-prediction modules as (non-expert, expert):
    per depth one more layer (MoE when the model is), its 2h x h projection
    (split by t) and two norms; embedding and head are shared with the model."""
    if model.mtp_depth <= 0:
        return 0.0, 0.0
    h = model.hidden
    if model.experts > 0:
        dense, expert = moe_layer_params(model, t, ep, etp)
    else:
        dense = layer_params(model, t)
        expert = 0.0
    return model.mtp_depth * (dense + 2.0 * h * h / t + 2.0 * h), model.mtp_depth * expert


@jit
def model_params(model):
    """(total, active per token) parameters of the whole model, MTP modules excluded.

    Active counts what one token's forward multiplies by: every layer's attention
    and norms, the dense MLPs, the router, shared experts and top_k routed
    experts of each MoE layer, embedding and output head."""
    dense_layers = model.layers
    moe_layers = 0.0
    if model.experts > 0:
        dense_layers = model.dense_layers
        moe_layers = model.layers - model.dense_layers
    emb = model.vocab * model.hidden * (1.0 if model.tied_embeddings > 0 else 2.0)
    final_norm = model.hidden * (2.0 if model.bias > 0 else 1.0)
    base = dense_layers * layer_params(model, 1.0) + emb + final_norm
    if moe_layers == 0.0:
        return base, base
    dense, expert = moe_layer_params(model, 1.0, 1.0, 1.0)
    one_expert = 3.0 * model.hidden * model.expert_ffn
    total = base + moe_layers * (dense + expert)
    active = base + moe_layers * (dense + model.top_k * one_expert)
    return total, active


@jit(inline=True)
def device_layers(stage: int, pp: int, layers: float) -> float:
    """Layers on the device of pipeline stage ``stage``: L // p each, and one more
    on the first L mod p stages (uneven splits; an even split when p divides L)."""
    n = int(layers)
    return float(n // pp + (1 if stage < n % pp else 0))


@jit
def chunk_layers(stage: int, chunk: int, pp: int, v: int, layers: float) -> float:
    """Layers of virtual chunk ``chunk`` on that device: its layers split over v
    chunks the same way (the earlier chunks take the remainder)."""
    n = int(device_layers(stage, pp, layers))
    return float(n // v + (1 if chunk < n % v else 0))


@jit(inline=True)
def device_dense_layers(stage: int, pp: int, model) -> float:
    """Layers with a dense MLP on that device: all of them in a dense model; in an
    MoE model those of its layers among the first ``dense_layers``."""
    n = device_layers(stage, pp, model.layers)
    if model.experts <= 0:
        return n
    total = int(model.layers)
    first = stage * (total // pp) + min(stage, total % pp)
    return float(max(0.0, min(model.dense_layers - first, n)))


@jit
def chunk_dense_layers(stage: int, chunk: int, pp: int, v: int, model) -> float:
    """Dense layers of virtual chunk ``chunk`` on that device (its dense layers
    fill its chunks in order)."""
    before = 0.0
    for c in range(chunk):
        before += chunk_layers(stage, c, pp, v, model.layers)
    return max(0.0, min(device_dense_layers(stage, pp, model) - before, chunk_layers(stage, chunk, pp, v,
                                                                                     model.layers)))


@jit
def param_parts(model, t: float, ep: float, etp: float):
    """Per-device parameter counts the stages are assembled from, computed once per
    candidate: (dense layer, MoE layer non-expert, MoE layer expert, MTP modules
    non-expert, MTP modules expert, embedding)."""
    md = 0.0
    me = 0.0
    if model.experts > 0:
        md, me = moe_layer_params(model, t, ep, etp)
    td, te = mtp_params(model, t, ep, etp)
    return layer_params(model, t), md, me, td, te, model.vocab * model.hidden / t


@jit
def stage_params(stage: int, pp: int, t: float, ep: float, etp: float, model):
    """Parameters on the device of pipeline stage ``stage`` as (non-expert, expert):
    its dense and MoE layers, the embedding on the first stage, the final norm
    and output head (and the MTP modules, with a copy of the embedding) on the
    last (tied embeddings share one matrix only when both ends are on one device)."""
    return stage_params_from(stage, pp, param_parts(model, t, ep, etp), model)


@jit(inline=True)
def stage_params_from(stage: int, pp: int, parts, model):
    """``stage_params`` from the candidate's ``param_parts``."""
    lp, md, me, td, te, emb = parts
    n = device_layers(stage, pp, model.layers)
    nd = device_dense_layers(stage, pp, model)
    dense = nd * lp + (n - nd) * md
    expert = (n - nd) * me
    if stage == 0:
        dense += emb
    if stage == pp - 1:
        dense += model.hidden * (2.0 if model.bias > 0 else 1.0)  # final norm (LayerNorm has a bias)
        if model.tied_embeddings == 0 or pp > 1:
            dense += emb
        dense += td
        expert += te
        if model.mtp_depth > 0 and pp > 1:
            dense += emb
    return dense, expert


@jit
def model_flop_per_sequence(model, s: float) -> float:
    """Forward FLOP of the whole model for one sequence (causal attention): two
    per active matrix element per token, plus the attention core."""
    split, rep = attention_weights(model)
    h = model.hidden
    keys = causal_kv_len(s, model.sliding_window)
    if model.mla > 0:
        core = s * keys * model.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    else:
        core = 2.0 * s * keys * model.heads * model.head_dim  # causal: half of 4 s^2 heads head_dim
    attn = 2.0 * s * (split + rep) + core
    dense_layers = model.layers
    flop = 0.0
    if model.experts > 0:
        dense_layers = model.dense_layers
        experts = model.top_k + model.shared_experts
        moe_mlp = 2.0 * s * (experts * 3.0 * h * model.expert_ffn + model.experts * h)
        flop += (model.layers - model.dense_layers) * (attn + moe_mlp)
    flop += dense_layers * (attn + 2.0 * s * mlp_matrices(model, model.ffn))
    return flop + 2.0 * s * h * model.vocab


@jit(inline=True)
def largest_stage_params(pp: int, schedule: int, parts, model):
    """The device with the most parameters, as (total, its non-expert, its expert,
    non-expert parameters of the stage with the most): DualPipe devices hold
    stage ``stage`` and stage p - 1 - stage (the other direction's) and reduce and
    update both; a ZeRO-3 pass gathers one stage's parameters (DualPipe's chunk
    runs one stage)."""
    params_max = -1.0
    dense_max = 0.0
    expert_max = 0.0
    one_max = -1.0
    pass_dense = 0.0
    for stage in range(pp):
        sd, se = stage_params_from(stage, pp, parts, model)
        if sd + se > one_max:
            one_max = sd + se
            pass_dense = sd
        if schedule == SCHEDULE_DUALPIPE:  # the device also holds stage p - 1 - stage (the other direction's):
            td, te = stage_params_from(pp - 1 - stage, pp, parts, model)  # its gradients are reduced and
            sd += td  # updated too (the memory model's two copies, evaluate_one)
            se += te
        if sd + se > params_max:
            params_max = sd + se
            dense_max = sd
            expert_max = se
    return params_max, dense_max, expert_max, pass_dense
