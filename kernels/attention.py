"""One transformer layer's attention on one device, one micro-batch: the Q/K/V
projections (MHA/GQA, or MLA's low-rank down/up projections), the attention
core, the output projection, and the norms, residual adds and rotary embedding
around them. modeling.md section 5."""

from __future__ import annotations

from collections import namedtuple

from paraspace.kernels.elementwise import (
    ROTARY_KERNELS,
    RMS_NORM_KERNELS,
    eager_attention_copies_bytes,
    eager_rms_norm_bytes,
    eager_rotary_bytes,
)
from paraspace.kernels.gemm_passes import gemm_passes_16bit_s, gemm_passes_s
from paraspace.kernels.jit import jit
from paraspace.kernels.ops import attention_qkv_fwd_bwd_s, causal_kv_len, memory_bound_s

#: Seconds of one layer's attention: the input projections (forward, backward,
#: weight-gradient GEMMs inside the backward; MLA: all down and up projections),
#: the output projection, the attention core, and the whole attention part
#: (projections, core, norms and residual adds) forward and backward; widths
#: per TP rank of the attention output (v_out), of the rotary embedding
#: (rope_width) and of the input projections' outputs (proj_out).
Attention = namedtuple("Attention", ("qkv_f", "qkv_b", "qkv_w", "out_f", "out_b", "out_w", "core_f", "core_b",
                                     "part_f", "part_b", "v_out", "rope_width", "proj_out"))


@jit
def attention_gemm_s(m: float, n: float, k: float, dev, tiles, ab: float, work):
    """``gemm_passes_s`` of an attention projection: in the space's GEMM precision, or
    at the 16-bit peak where the space quantises only the MLP GEMMs."""
    if work.quantize_attention > 0:
        return gemm_passes_s(m, n, k, dev, tiles, ab)
    return gemm_passes_16bit_s(m, n, k, dev, tiles, ab)


@jit(inline=True)
def mla_projections_s(sh, model, dev, tiles, work):
    """MLA (DeepSeek-V2/V3): KV down (replicated), KV up, Q down and up (or one Q
    projection without a query rank), and the core over qk = nope + rope heads:
    (projections forward, backward, W; core forward, backward; v_out, rope_width,
    bytes of the latent norms, proj_out)."""
    tokens = sh.tokens
    heads = sh.heads
    h = sh.h
    ab = sh.ab
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    kv_lat = model.kv_lora_rank + model.qk_rope_head_dim
    f1, b1, w1 = attention_gemm_s(tokens, kv_lat, h, dev, tiles, ab, work)  # KV down (replicated)
    fx, bx, wx = attention_gemm_s(tokens, heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank,
                                  dev, tiles, ab, work)
    f1 += fx
    b1 += bx
    w1 += wx
    if model.q_lora_rank > 0:
        fx, bx, wx = attention_gemm_s(tokens, model.q_lora_rank, h, dev, tiles, ab, work)
        fy, by, wy = attention_gemm_s(tokens, heads * qk, model.q_lora_rank, dev, tiles, ab, work)
        fx += fy
        bx += by
        wx += wy
    else:
        fx, bx, wx = attention_gemm_s(tokens, heads * qk, h, dev, tiles, ab, work)
    f1 += fx
    b1 += bx
    w1 += wx
    v_out = heads * model.v_head_dim
    rope_width = heads * model.qk_rope_head_dim + model.qk_rope_head_dim
    keys = causal_kv_len(sh.s, model.sliding_window)
    attn_f, attn_b, _ = attention_qkv_fwd_bwd_s(sh.b, sh.s / sh.c, keys, heads, heads, qk, model.v_head_dim, True,
                                                sh.flash, dev, ab, keys / sh.c)
    # the latent norms, read and written
    latent_norm_bytes = 2.0 * tokens * (model.kv_lora_rank + model.q_lora_rank) * ab
    proj_out = kv_lat + heads * (model.qk_nope_head_dim + model.v_head_dim) + heads * qk + model.q_lora_rank
    return f1, b1, w1, attn_f, attn_b, v_out, rope_width, latent_norm_bytes, proj_out


@jit(inline=True)
def mha_projections_s(sh, model, dev, tiles, work):
    """MHA / GQA: one fused QKV projection (kv_heads for K and V) and the core;
    the same tuple as ``mla_projections_s`` (no latent norms)."""
    dh = model.head_dim
    q_out = sh.heads * dh
    kv_out = model.kv_heads / sh.t * dh
    f1, b1, w1 = attention_gemm_s(sh.tokens, q_out + 2.0 * kv_out, sh.h, dev, tiles, sh.ab, work)
    keys = causal_kv_len(sh.s, model.sliding_window)
    attn_f, attn_b, _ = attention_qkv_fwd_bwd_s(sh.b, sh.s / sh.c, keys, sh.heads, model.kv_heads / sh.t, dh, dh, True,
                                                sh.flash, dev, sh.ab, keys / sh.c)
    return f1, b1, w1, attn_f, attn_b, q_out, q_out + kv_out, 0.0, q_out + 2.0 * kv_out


@jit(inline=True)
def norms_s(sh, model, rope_width: float, latent_norm_bytes: float, dev) -> float:
    """Forward seconds of a layer's memory-bound elementwise work: two norms, two
    residual adds, dropout, the latent norms and the rotary embedding (fused:
    each residual add + norm one kernel, rope inside attention)."""
    h = sh.h
    ab = sh.ab
    norm_tokens = sh.norm_tokens
    if sh.fused:  # each residual add + norm one kernel (read x and the residual, write both), rope inside attention
        mem_bytes = 8.0 * norm_tokens * h * ab
        n_kernels = 2.0
    else:
        mem_bytes = 10.0 * norm_tokens * h * ab  # 2 norms (read+write), 2 residual adds (2 reads+write)
        n_kernels = 5.0  # two norms, two residual adds, rotary embedding
    if model.dropout > 0:
        mem_bytes += 5.0 * norm_tokens * h * ab
        n_kernels += 2.0
    mem_bytes += latent_norm_bytes
    if not sh.fused:
        mem_bytes += 2.0 * sh.tokens * rope_width * ab  # rotary embedding on Q and K
    return memory_bound_s(mem_bytes, n_kernels, dev)


@jit(inline=True)
def eager_elementwise_s(sh, model, rope_width: float, v_out: float, dev) -> float:
    """``norms_s`` as eager PyTorch runs it (``kernels.elementwise``): the norms
    (the latent ones too) in fp32, the complex rotary on Q and K, the residual
    adds and dropout, the attention output's transposed copy and, with
    grouped-query attention, K and V repeated to the query heads."""
    ab = sh.ab
    norm = eager_rms_norm_bytes(ab)
    mem_bytes = sh.norm_tokens * sh.h * (2.0 * norm + 6.0 * ab)  # 2 norms, 2 residual adds (2 reads + write)
    n_kernels = 2.0 * RMS_NORM_KERNELS + 2.0
    if model.dropout > 0:
        mem_bytes += 5.0 * sh.norm_tokens * sh.h * ab
        n_kernels += 2.0
    latent = model.kv_lora_rank + model.q_lora_rank  # MLA's latent norms (0 for MHA)
    if latent > 0:
        mem_bytes += sh.tokens * latent * norm
        n_kernels += RMS_NORM_KERNELS * (2.0 if model.q_lora_rank > 0 else 1.0)
    mem_bytes += sh.tokens * rope_width * eager_rotary_bytes(ab)
    n_kernels += 2.0 * ROTARY_KERNELS
    grouped = model.mla <= 0 and model.kv_heads < model.heads
    dh = model.head_dim
    mem_bytes += eager_attention_copies_bytes(sh.tokens, ab, v_out, sh.heads * dh, model.kv_heads / sh.t * dh, grouped)
    n_kernels += 3.0 if grouped else 1.0
    return memory_bound_s(mem_bytes, n_kernels, dev)


@jit(inline=True)
def attention_s(sh, model, dev, tiles, work):
    """The ``Attention`` of one layer of ``sh``'s shape."""
    if model.mla > 0:
        f1, b1, w1, attn_f, attn_b, v_out, rope_width, latent, proj_out = mla_projections_s(sh, model, dev, tiles,
                                                                                             work)
    else:
        f1, b1, w1, attn_f, attn_b, v_out, rope_width, latent, proj_out = mha_projections_s(sh, model, dev, tiles,
                                                                                             work)
    f2, b2, w2 = attention_gemm_s(sh.tokens, sh.h, v_out, dev, tiles, sh.ab, work)
    if sh.eager:
        common = eager_elementwise_s(sh, model, rope_width, v_out, dev)
    else:
        common = norms_s(sh, model, rope_width, latent, dev)
    return Attention(f1, b1, w1, f2, b2, w2, attn_f, attn_b, f1 + f2 + attn_f + common, b1 + b2 + attn_b + 2.0 * common,
                     v_out, rope_width, proj_out)
