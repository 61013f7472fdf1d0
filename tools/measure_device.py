"""Measure, on one GPU with PyTorch, what paraspace's kernels assume of a device.

    python tools/measure_device.py OUT_DIR [--budget-s 300] [--dry-run]

Runs on the machine being measured (it needs ``torch`` with CUDA, which
paraspace itself never imports). Writes into OUT_DIR:

``gemm_bf16.csv`` / ``gemm_fp8.csv``
    One row per GEMM in the ``paraspace calibrate gemm`` format (``m, n, k, dtype,
    seconds, tflops``) plus ``role`` (``fwd``: Y = X W^T as ``F.linear`` runs it;
    ``dgrad``: dX = dY W; ``wgrad``: dW = dY^T X, the layouts autograd uses) and
    ``layer``: the linear it stands for (the QKV, output, fused gate+up and down
    projections of Llama 3 8B / 70B and GPT-3 175B, split by tensor parallelism
    1, 2, 4, 8), at 1K to 16K tokens per micro-batch. m is always the output's rows:
    a wgrad row is (n_out, k_in) with the tokens as reduction, as
    ``kernels.ops.gemm_fwd_bwd_s`` prices it.
``attention.csv``
    ``torch.nn.functional.scaled_dot_product_attention`` per backend (FlashAttention-2
    ``flash``, cuDNN ``cudnn``, ``efficient``, and the unfused ``math``), causal and
    not, head dims 64 / 128, 1K to 32K tokens: forward and backward seconds and
    TFLOP/s, FLOPs counted as ``kernels.ops.attention_flops`` does (causal = half).
``memory.csv``
    Achieved HBM bandwidth of a copy, an add, RMSNorm and SwiGLU's elementwise part
    (bytes read + written / seconds), and the per-kernel cost of eager dispatch.
``grouped_gemm.csv``
    ``torch._grouped_mm`` (one kernel over every local expert) for the expert linears
    of DeepSeek-V3, Qwen3-30B-A3B, GPT-OSS-120B and Mixtral 8x7B: 1-32 local experts,
    64-4,096 tokens each, forward / dgrad / wgrad, plus DeepSeek-V3 with one hot
    expert at 1.5x and 2x the mean load.
``attention_variants.csv``
    Grouped-query attention (32 query heads on 8 KV heads) and MLA's head dims (192
    for queries and keys, 128 for values) per SDPA backend.
``decode_attention.csv``
    One query token a sequence over 512-32K cached keys (GQA 32 on 8 KV heads, and
    MHA), 1-128 sequences, per SDPA backend: achieved bytes per second of the cache
    read, what the serving kernels price at ``memory_efficiency`` of HBM.
``gemm_fp8_scaling.csv``
    Serving-sized forward GEMMs (16 to 8,192 tokens) of Qwen3-32B and Llama 3 70B at TP 1-8
    in BF16 and in FP8 under each scaling recipe an engine loads: one scale a tensor
    (``tensor``, fast accumulation), a scale per token and per output channel (``row``,
    fast accumulation), and DeepSeek-style blocks (``block``: activations 1 x 128,
    weights 128 x 128, ``torch.nn.functional.scaled_mm``), what block-quantized FP8
    checkpoints (Qwen3-*-FP8, DeepSeek-V3) run.
``layer.csv``
    One whole transformer block (``transformer_block``: norms, fused QKV, rotary
    embedding, SDPA, output projection, SwiGLU or GELU MLP, residuals; Llama 3 8B,
    MPT-7B / 30B, and a TP8 rank's share of Llama 3 70B and GPT-3 175B) at 2K-8K
    tokens, forward without autograd (a prefill's), forward and forward + backward, per SDPA backend (FlashAttention-2 and
    cuDNN) and recompute mode (none; ``selective``, the attention core under
    ``torch.utils.checkpoint``; ``full``, the whole block), with the bytes the forward
    keeps for the backward and the step's peak: what the kernels add up a layer from.
``decode_step.csv``
    One decode iteration (one token for each of 1-128 sequences of 1K or 4K cached
    tokens) through four whole SwiGLU blocks of Qwen3-32B and of Llama 3 8B,
    replayed from a CUDA graph: seconds per layer and the weight and KV-cache bytes
    it streams, what the serving kernels' decode step prices.
``decode_step_fp8.csv``
    The same with FP8 weights (``torch._scaled_mm``, one static scale a tensor) at
    16-128 sequences: the FP8 checkpoints' decode the TensorRT-LLM rows measure.
``ring_attention.csv``
    Context-parallel ring attention as one rank of a CP group runs it: PyTorch's own ring
    (``_templated_ring_attention`` and its backward, round-robin load balance, the
    fp32 merge of each step's output and the fp32 gradient accumulation, as torchtitan's
    CP rows ran it) made to run alone on one GPU (``RingRank``: its process-group
    queries answer the rank and CP size, its rotater hands back the buffer it is given,
    bytes a peer would have sent), for Llama 3.1 8B and a TP8 rank of 405B at 32K tokens
    a rank, CP 1-8, the first and the last rank; beside it the same SDPA calls alone
    (``kernels``) and one causal call over the whole sequence with few heads
    (``global``): what a ring step costs beyond its FLOPs.
``attention_heads.csv``
    Fused attention (FlashAttention-2 and cuDNN) of one sequence of 1K-32K tokens with 1 to
    64 heads of 128, causal (and not, at 2K and 8K), and of 2-8 sequences with as many
    heads in all: the rate against the thread blocks a call has (a TP8 rank of Llama 3 70B
    computes 8 heads, where ``attention.csv``'s rows have 32 or more). The forward is
    replayed from a CUDA graph, the backward timed by events (``timing``).
``train_memory.csv``
    Whole training steps of a Llama 3.1 8B-shaped model with 2-6 layers, built as torchtitan
    builds it, under FSDP2 on a one-rank group (torchtitan's mixed precision and AdamW),
    per-op / full / no checkpoint, 8K-32K tokens: the caching allocator's bytes after each
    phase (states, forward, backward, optimizer), its allocated and reserved peaks, what the
    process holds outside it, and the step's seconds.
``train_fp8.csv``
    The same steps in bf16 and with torchao's Float8Linear on the block linears (needs
    torchao), compiled and eager, at two depths: what FP8 speeds up and what it leaves.
``env.json``
    The device, driver, clocks, power limit, torch / CUDA / cuDNN versions, the
    allocator setting, torchao's version, and the date: the provenance a committed table
    carries.

Timing: GEMMs are replayed from a CUDA graph of as many calls as fill about 20 ms
(a kernel shorter than the host's dispatch is otherwise timed with the GPU
waiting), the median of three replays; attention and memory passes, CUDA
events around each call, the median of repeats sized to about 20 ms; two
warm-ups each; random normal inputs (never zeros). The card's
clocks and power settings are read, never changed. ``--dry-run`` lists the plan
and its estimated time without torch.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: (family, hidden, qkv width (q + 2 kv heads x head_dim), gate+up width, down input)
MODELS = (
    ("llama3-8b", 4096, 6144, 28672, 14336),
    ("llama3-70b", 8192, 10240, 57344, 28672),
    ("gpt3-175b", 12288, 36864, 49152, 49152),
)
TP_SIZES = (1, 2, 4, 8)
TOKENS = (1024, 2048, 4096, 8192, 16384)
FP8_TOKENS = (2048, 8192)
#: decode-sized GEMMs (a serving batch of sequences, one token each): memory-bound
DECODE_TOKENS = (16, 64, 256)
ROLES = ("fwd", "dgrad", "wgrad")
#: (head_dim, heads) of the attention sweeps; kv heads = heads (GQA changes no FLOP)
ATTN_HEADS = ((128, 32), (64, 32))
ATTN_SEQ = (1024, 2048, 4096, 8192, 16384, 32768)
ATTN_TOKENS = 16384
ATTN_BACKENDS = ("flash", "cudnn", "efficient", "math")
MATH_MAX_SEQ = 4096
#: (family, hidden, expert FFN width) of the MoE models in the validation data
MOE_MODELS = (("deepseek-v3", 7168, 2048), ("qwen3-30b-a3b", 2048, 768), ("gpt-oss-120b", 2880, 2880),
              ("mixtral-8x7b", 4096, 14336))
#: local experts per rank (groups of one grouped GEMM) and tokens per expert
GROUPS = (1, 4, 8, 32)
GROUP_ROWS = (64, 256, 1024, 4096)
MAX_GROUPED_ROWS = 65536
#: (groups, mean rows, max/mean) of the imbalanced grouped GEMMs: one hot expert
SKEWED = ((8, 512, 1.5), (8, 512, 2.0), (8, 2048, 1.5), (8, 2048, 2.0))
#: (label, batch, seq, heads, kv_heads, qk_dim, v_dim) of the attention variants
ATTN_VARIANTS = (("gqa", 2, 8192, 32, 8, 128, 128), ("mha", 2, 8192, 32, 32, 128, 128),
                 ("mla-tp8", 4, 4096, 16, 16, 192, 128), ("mla-tp1", 1, 4096, 128, 128, 192, 128),
                 ("mla-tp8", 1, 16384, 16, 16, 192, 128))
#: decode attention: (query heads, KV heads) at head dim 128, sequences in the batch,
#: cached tokens each (one query token a sequence), at most DECODE_MAX_KV_BYTES of cache
DECODE_HEADS = ((32, 8), (32, 32))
DECODE_BATCH = (1, 8, 32, 128)
DECODE_CONTEXT = (512, 2048, 8192, 32768)
DECODE_MAX_KV_BYTES = 8 << 30
#: (family, hidden, query width, qkv width, gate+up width, down input) of the FP8 scaling
#: sweep: Qwen3-32B's 64 query heads of 128 are wider than its hidden size
SCALING_MODELS = (("qwen3-32b", 5120, 8192, 10240, 51200, 25600),
                  ("llama3-70b", 8192, 8192, 10240, 57344, 28672))
SCALING_TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192)
SCALINGS = ("bf16", "tensor", "row", "block")
#: (label, hidden, heads, kv heads, head dim, FFN width, gated (SwiGLU) or GELU, norm, rotary, batch, seq)
#: of the whole-layer runs: one transformer block, as a data-parallel or TP-sharded rank runs it
#: (a TP8 shard's heads and FFN columns, no collective)
LAYER_SHAPES = (
    ("llama3-8b", 4096, 32, 8, 128, 14336, True, "rms", True, 4, 2048),
    ("llama3-8b", 4096, 32, 8, 128, 14336, True, "rms", True, 1, 8192),
    ("mpt-7b", 4096, 32, 32, 128, 16384, False, "ln", False, 8, 1024),
    ("mpt-7b", 4096, 32, 32, 128, 16384, False, "ln", False, 4, 2048),
    ("mpt-7b", 4096, 32, 32, 128, 16384, False, "ln", False, 1, 8192),
    ("mpt-30b", 7168, 56, 56, 128, 28672, False, "ln", False, 2, 2048),
    ("llama3-70b/tp8", 8192, 8, 1, 128, 3584, True, "rms", True, 2, 4096),
    ("gpt3-175b/tp8", 12288, 12, 12, 128, 6144, False, "ln", False, 1, 2048),
)
#: recompute modes of the whole-layer runs: none; Megatron's selective (the attention
#: core under torch.utils.checkpoint); full (the whole block under it)
LAYER_RECOMPUTE = ("none", "selective", "full")
#: timed calls of each whole-layer measurement (the median is recorded)
LAYER_REPS = 15
#: (label, hidden, heads, kv heads, head dim, FFN width, layers) of the decode-step runs:
#: a CUDA graph of one decode iteration through ``layers`` SwiGLU blocks (weights of their own)
DECODE_STEP_MODELS = (("qwen3-32b", 5120, 64, 8, 128, 25600, 4), ("llama3-8b", 4096, 32, 8, 128, 14336, 4))
DECODE_STEP_BATCH = (1, 8, 32, 128)
DECODE_STEP_CONTEXT = (1024, 4096)
#: batches of the FP8 decode-step runs (torch._scaled_mm wants rows in multiples of 16)
DECODE_STEP_BATCH_FP8 = (16, 32, 64, 128)
#: context-parallel ring attention: (label, query heads a rank computes (torchtitan repeats
#: the KV heads to the query heads before SDPA, so K and V have as many), head dim, tokens
#: a rank holds) of the torchtitan CP rows (Llama 3.1 8B; 405B at TP8), CP sizes, and the
#: whole-sequence causal calls (few heads: the rate needs only enough blocks for the SMs)
RING_MODELS = (("llama31-8b", 32, 128, 32768), ("llama31-405b/tp8", 16, 128, 32768))
RING_CP = (1, 2, 4, 8)
RING_GLOBAL_SEQ = (32768, 65536, 131072, 262144)
RING_GLOBAL_HEADS = 4
#: fused attention against its parallelism: one sequence (batch 1) of these lengths with
#: 1-64 heads of 128, causal, per backend: a TP8 rank of a 70B model computes 8 heads, of
#: 405B 16, where attention.csv's rows have 32 or more (batch x heads)
HEADS_SEQ = (1024, 2048, 4096, 8192, 16384, 32768)
HEADS_COUNTS = (1, 2, 4, 8, 16, 32, 64)
HEADS_MAX_TOKENS_HEADS = 32768 * 32
#: (batch, heads) pairs of equal product, and non-causal calls, at these lengths: whether
#: the rate follows the thread blocks (batch x heads x query tiles), and how much of the
#: causal loss is the triangle's uneven blocks
HEADS_BATCHED = ((2, 4), (4, 2), (8, 1), (2, 8))
HEADS_BATCHED_SEQ = (2048, 8192)
HEADS_FULL_SEQ = (2048, 8192)
#: whole-model training steps (``train_memory``): the shapes of Llama 3.1 8B (hidden, heads, KV
#: heads, head dim, ffn, vocab) with fewer layers, as torchtitan builds it (separate wq / wk / wv and
#: w1 / w3 / w2 linears, complex rotary, repeat_kv, fp32 cross-entropy), under FSDP2 on a one-rank
#: group with torchtitan's mixed precision (fp32 parameters, bf16 compute, fp32 reduce) and AdamW
TRAIN_MODEL = ("llama31-8b", 4096, 32, 8, 128, 14336, 128256)
#: (layers, micro-batch, sequence, recompute, optimizer, compile), in order of what the comparison
#: needs most: torchtitan's per-op policy ("op") and full checkpointing at two depths (the
#: per-layer slope), no recompute, the fused optimizer, longer sequences, and one compiled case
TRAIN_CASES = ((4, 2, 8192, "op", "foreach", False), (4, 2, 8192, "full", "foreach", False),
               (6, 2, 8192, "op", "foreach", False), (6, 2, 8192, "full", "foreach", False),
               (4, 2, 8192, "none", "foreach", False), (4, 2, 8192, "op", "fused", False),
               (4, 1, 16384, "full", "foreach", False), (2, 1, 32768, "full", "foreach", False),
               (4, 2, 8192, "op", "foreach", True))
#: whole steps in bf16 and in FP8 (``train_fp8``: torchao's Float8Linear on every block linear,
#: tensorwise dynamic scaling, the head in bf16, as torchtitan's Float8 rows ran): (layers,
#: micro-batch, sequence, recompute, compiled, dtype), at two depths each so that the per-layer
#: difference leaves out the loss and the optimizer, which FP8 does not touch
TRAIN_FP8_CASES = ((4, 2, 8192, "op", True, "bf16"), (4, 2, 8192, "op", True, "fp8"),
                   (6, 2, 8192, "op", True, "bf16"), (6, 2, 8192, "op", True, "fp8"),
                   (2, 1, 32768, "full", True, "bf16"), (2, 1, 32768, "full", True, "fp8"),
                   (3, 1, 32768, "full", True, "bf16"), (3, 1, 32768, "full", True, "fp8"),
                   (4, 2, 8192, "op", False, "fp8"), (6, 2, 8192, "op", False, "fp8"),
                   (6, 2, 8192, "op", False, "bf16"))
#: timed steps after the warm-up (the median reported): train_memory, train_fp8
TRAIN_TIMED_STEPS = {"train_memory": 1, "train_fp8": 3}
TARGET_S = 0.02
PARTS = ("gemm", "attention", "memory", "fp8", "grouped", "attention_variants", "decode_attention",
         "fp8_scaling", "layer", "decode_step", "decode_step_fp8", "ring_attention", "attention_heads",
         "train_memory", "train_fp8")


def linear_layers():
    """(layer label, n_out, k_in) of every projection of every model at every TP size:
    column-parallel QKV and gate+up split n, row-parallel output and down split k."""
    out = []
    for fam, h, qkv, up, down in MODELS:
        for t in TP_SIZES:
            out += [(f"{fam}/qkv/tp{t}", qkv // t, h), (f"{fam}/out/tp{t}", h, h // t),
                    (f"{fam}/gate_up/tp{t}", up // t, h), (f"{fam}/down/tp{t}", h, down // t)]
    return out


def gemm_plan(tokens=TOKENS, roles=ROLES):
    """(layer, role, m, n, k) of each GEMM: fwd (tokens, n_out, k_in), dgrad (tokens,
    k_in, n_out), wgrad (n_out, k_in, tokens)."""
    plan = []
    for layer, n_out, k_in in linear_layers():
        for s in tokens:
            shapes = {"fwd": (s, n_out, k_in), "dgrad": (s, k_in, n_out), "wgrad": (n_out, k_in, s)}
            plan += [(layer, r, *shapes[r]) for r in roles]
    return plan


def scaling_plan():
    """(layer, m, n, k) of the FP8 scaling sweep: the forward GEMM of every projection of
    ``SCALING_MODELS`` at every TP size and ``SCALING_TOKENS`` tokens."""
    plan = []
    for fam, h, q, qkv, up, down in SCALING_MODELS:
        for t in TP_SIZES:
            for layer, n_out, k_in in ((f"{fam}/qkv/tp{t}", qkv // t, h), (f"{fam}/out/tp{t}", h, q // t),
                                       (f"{fam}/gate_up/tp{t}", up // t, h), (f"{fam}/down/tp{t}", h, down // t)):
                plan += [(layer, m, n_out, k_in) for m in SCALING_TOKENS]
    return plan


def grouped_plan():
    """(family, linear, role, groups, rows per group (tuple), m, n, k): the forward,
    input-gradient and weight-gradient grouped GEMMs of each expert linear, shapes in
    ``kernels.moe.grouped_gemm_fwd_bwd_s``'s convention (m, n, k per group)."""
    plan = []
    for fam, h, f in MOE_MODELS:
        for linear, n_out, k_in in (("gate_up", 2 * f, h), ("down", h, f)):
            cases = [(g, (r,) * g) for g in GROUPS for r in GROUP_ROWS if g * r <= MAX_GROUPED_ROWS]
            if fam == "deepseek-v3":
                cases += [(g, skewed_rows(g, r, ratio)) for g, r, ratio in SKEWED]
            for g, rows in cases:
                m = max(rows)
                for role, shape in (("fwd", (m, n_out, k_in)), ("dgrad", (m, k_in, n_out)),
                                    ("wgrad", (n_out, k_in, m))):
                    plan.append((fam, linear, role, g, rows, *shape))
    return plan


def skewed_rows(groups, mean, ratio, align=64):
    """Rows per expert with one expert at ``ratio`` x the mean and the rest even,
    multiples of ``align``, summing to groups x mean."""
    hot = int(round(ratio * mean / align)) * align
    rest = (groups * mean - hot) // (groups - 1) // align * align
    rows = [hot] + [rest] * (groups - 1)
    rows[-1] += groups * mean - sum(rows)
    return tuple(rows)


def attention_flops(b, s, heads, d, causal):
    """Forward FLOP as ``kernels.ops.attention_flops`` counts them."""
    f = 4.0 * b * s * s * heads * d
    return 0.5 * f if causal else f


def transformer_block(torch, hidden, heads, kv_heads, head_dim, ffn, gated, norm, rotary, device=None,
                      dtype=None):
    """One pre-norm transformer block as an ``nn.Module``: norm, fused QKV, rotary
    embedding (``rotary``), ``scaled_dot_product_attention`` (causal, grouped-query where
    ``kv_heads < heads``), output projection and residual; norm, gate+up (``gated``:
    SwiGLU) or up (GELU), down projection and residual. ``forward(x, recompute)``:
    ``recompute`` "selective" runs the attention core under ``torch.utils.checkpoint``,
    "full" the whole block (non-reentrant, as FSDP trainers wrap a block)."""
    nn, F = torch.nn, torch.nn.functional
    from torch.utils.checkpoint import checkpoint
    kw = {"device": device, "dtype": dtype}

    def make_norm():
        return nn.RMSNorm(hidden, **kw) if norm == "rms" else nn.LayerNorm(hidden, bias=False, **kw)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = make_norm(), make_norm()
            self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False, **kw)
            self.out = nn.Linear(heads * head_dim, hidden, bias=False, **kw)
            self.up = nn.Linear(hidden, (2 if gated else 1) * ffn, bias=False, **kw)
            self.down = nn.Linear(ffn, hidden, bias=False, **kw)
            self.cos = self.sin = None

        def rope(self, t):
            """Rotary embedding of (b, h, s, d), the half-split form Llama runs."""
            s = t.shape[2]
            if self.cos is None or self.cos.shape[0] != s:
                inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=t.device, dtype=torch.float32)
                                          / head_dim))
                ang = torch.outer(torch.arange(s, device=t.device, dtype=torch.float32), inv)
                self.cos, self.sin = ang.cos().to(t.dtype), ang.sin().to(t.dtype)
            a, b = t.chunk(2, dim=-1)
            return torch.cat((a * self.cos - b * self.sin, a * self.sin + b * self.cos), dim=-1)

        def core(self, q, k, v):
            gqa = {"enable_gqa": True} if kv_heads != heads else {}
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

        def attention(self, x, recompute):
            b, s, _ = x.shape
            qkv = self.qkv(self.norm1(x))
            q, k, v = qkv.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
            q = q.view(b, s, heads, head_dim).transpose(1, 2)
            k = k.view(b, s, kv_heads, head_dim).transpose(1, 2)
            v = v.view(b, s, kv_heads, head_dim).transpose(1, 2)
            if rotary:
                q, k = self.rope(q), self.rope(k)
            if recompute == "selective":
                o = checkpoint(self.core, q, k, v, use_reentrant=False)
            else:
                o = self.core(q, k, v)
            return self.out(o.transpose(1, 2).reshape(b, s, heads * head_dim))

        def mlp(self, x):
            u = self.up(self.norm2(x))
            if gated:
                g, u = u.chunk(2, dim=-1)
                u = F.silu(g) * u
            else:
                u = F.gelu(u, approximate="tanh")
            return self.down(u)

        def block(self, x, recompute="none"):
            x = x + self.attention(x, recompute)
            return x + self.mlp(x)

        def forward(self, x, recompute="none"):
            if recompute == "full":
                return checkpoint(self.block, x, use_reentrant=False)
            return self.block(x, recompute)

    return Block()


def layer_flops(hidden, heads, kv_heads, head_dim, ffn, gated, batch, seq):
    """Model FLOPs of one block's forward: its four linears and the causal attention
    core (half the pairs, as ``kernels.ops.attention_flops`` counts)."""
    tokens = batch * seq
    linear = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden \
        + hidden * (2 if gated else 1) * ffn + ffn * hidden
    return 2.0 * tokens * linear + attention_flops(batch, seq, heads, head_dim, True)


def decode_step(torch, hidden, heads, kv_heads, head_dim, ffn, layers, batch, context, device=None,
                dtype=None, fp8=False):
    """A callable running one decode iteration (one new token for each of ``batch``
    sequences of ``context`` cached tokens) through ``layers`` SwiGLU blocks, each with
    its own weights and KV cache: RMSNorm, QKV, the new key and value written into the
    cache, SDPA over the cache (grouped-query), output projection, residual, RMSNorm,
    gate+up, SiLU x up, down, residual. ``fp8``: the four linears' weights in FP8 (e4m3)
    and each linear a ``torch._scaled_mm`` of its input cast to FP8 (one scale a tensor,
    static as a calibrated checkpoint's, fast accumulation; ``batch`` a multiple of 16),
    the cache and attention in ``dtype``. Returns (step, weight bytes, KV bytes read)."""
    F = torch.nn.functional
    kw = {"device": device, "dtype": dtype}
    qkv_w = heads * head_dim + 2 * kv_heads * head_dim
    f8 = torch.float8_e4m3fn

    def weight(n, k):
        w = torch.randn(n, k, **kw) * k ** -0.5
        return w.to(f8) if fp8 else w

    ws = [dict(n1=torch.ones(hidden, **kw), n2=torch.ones(hidden, **kw), qkv=weight(qkv_w, hidden),
               out=weight(hidden, heads * head_dim), up=weight(2 * ffn, hidden), down=weight(hidden, ffn),
               k=torch.randn(batch, kv_heads, context, head_dim, **kw),
               v=torch.randn(batch, kv_heads, context, head_dim, **kw)) for _ in range(layers)]
    x0 = torch.randn(batch, 1, hidden, **kw)
    pos = context - 1
    gqa = {"enable_gqa": True} if kv_heads != heads else {}
    one = torch.ones((), device=device, dtype=torch.float32)

    def linear(x, w):
        if not fp8:
            return F.linear(x, w)
        y = torch._scaled_mm(x.reshape(batch, -1).to(f8), w.t(), scale_a=one, scale_b=one, out_dtype=dtype,
                             use_fast_accum=True)
        return y.view(batch, 1, -1)

    def step():
        x = x0
        for w in ws:
            h = F.rms_norm(x, (hidden,), w["n1"])
            q, k, v = linear(h, w["qkv"]).split((heads * head_dim, kv_heads * head_dim,
                                                 kv_heads * head_dim), dim=-1)
            w["k"][:, :, pos] = k.view(batch, kv_heads, head_dim)
            w["v"][:, :, pos] = v.view(batch, kv_heads, head_dim)
            o = F.scaled_dot_product_attention(q.view(batch, 1, heads, head_dim).transpose(1, 2), w["k"], w["v"],
                                               **gqa)
            x = x + linear(o.transpose(1, 2).reshape(batch, 1, heads * head_dim), w["out"])
            g, u = linear(F.rms_norm(x, (hidden,), w["n2"]), w["up"]).chunk(2, dim=-1)
            x = x + linear(F.silu(g) * u, w["down"])
        return x

    size = x0.element_size()
    weight_bytes = layers * ws[0]["qkv"].element_size() * (qkv_w * hidden + heads * head_dim * hidden
                                                            + 3 * ffn * hidden)
    kv_bytes = layers * 2 * size * batch * kv_heads * context * head_dim
    return step, weight_bytes, kv_bytes


def ring_schedule(cp: int, rank: int) -> list[tuple[str, str, bool]]:
    """The SDPA calls one rank of a load-balanced causal ring makes, step by step:
    (query part, key/value part, causal). Each rank holds chunks ``rank`` and
    ``2 cp - 1 - rank`` of 2 cp equal chunks of the sequence. Step 0 is its own two
    chunks, causal; a step bringing the KV of an earlier rank (``i <= rank``) needs that
    rank's first chunk against both query chunks; one from a later rank needs both its
    chunks against the second query chunk only ("all", "first" or "second" half).
    PyTorch's ring (``torch.distributed.tensor.experimental``, ``_templated_ring_attention``)
    schedules it so."""
    calls = [("all", "all", True)]
    for i in range(1, cp):
        calls.append(("all", "first", False) if i <= rank else ("second", "all", False))
    return calls


def ring_pairs(cp: int, rank: int, tokens: int) -> int:
    """Query-key pairs one rank's ring computes (``tokens`` a rank, causal step counted
    as its lower triangle, diagonal included)."""
    half = tokens // 2
    total = 0
    for q_part, kv_part, causal in ring_schedule(cp, rank):
        nq = tokens if q_part == "all" else half
        nk = tokens if kv_part == "all" else half
        total += nq * (nq + 1) // 2 if causal else nq * nk
    return total


class RingRank:
    """PyTorch's own ring attention (forward and backward), run as rank ``rank`` of a
    CP group of ``cp`` on one GPU: the module's process-group queries answer
    (rank, cp), and its rotater hands back the buffer it was given, the same bytes a
    peer would have sent, so every kernel, merge, cast and concatenation of a rank's
    ring runs and only the transfers are left out."""

    MODULES = ("torch.distributed.tensor.experimental._context_parallel._attention",
               "torch.distributed.tensor.experimental._attention")

    def __init__(self, torch):
        import importlib
        import types
        self.torch = torch
        for name in self.MODULES:
            try:
                self.mod = importlib.import_module(name)
                break
            except ImportError:
                continue
        else:
            raise ImportError(f"none of {self.MODULES}")

        class Group:
            pass

        class Echo:
            def __init__(self, *args, **kwargs):
                self.buf = None

            def exchange_buffers(self, buf):
                self.buf = buf

            def next_buffer(self):
                return self.buf

        self.group = Group()
        self.echo = Echo
        self.shim = types.SimpleNamespace(ProcessGroup=Group, get_rank=lambda g=None: self.rank,
                                          get_world_size=lambda g=None: self.cp)
        self.rank, self.cp = 0, 1

    def _patched(self):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            saved = self.mod.dist, self.mod._create_rotater
            self.mod.dist, self.mod._create_rotater = self.shim, self.echo
            try:
                yield
            finally:
                self.mod.dist, self.mod._create_rotater = saved
        return ctx()

    def forward(self, q, k, v, cp, rank):
        """(out, logsumexp, *the last call's rest) of one rank's forward."""
        self.cp, self.rank = cp, rank
        aten = self.torch.ops.aten
        with self._patched():
            return self.mod._templated_ring_attention(self.group, 2, aten._scaled_dot_product_flash_attention,
                                                      q, k, v, is_causal=True, dropout_p=0.0, scale=None)

    def backward(self, go, q, k, v, fwd, cp, rank):
        """(dq, dk, dv) of one rank's backward, from ``forward``'s result."""
        self.cp, self.rank = cp, rank
        aten = self.torch.ops.aten
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset = fwd[:8]
        with self._patched():
            return self.mod._templated_ring_attention_backward(
                self.group, 2, aten._scaled_dot_product_flash_attention_backward.default, grad_out=go,
                grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=True,
                cum_seq_q=cum_q, cum_seq_k=cum_k, max_q=max_q, max_k=max_k, dropout_p=0.0, philox_seed=seed,
                philox_offset=offset, scale=None)[:3]


def ring_kernel_calls(torch, q, k, v, cp, rank):
    """The flash calls of one rank's ring alone (no merge, cast or concatenation), as
    (forward callable, backward callable)."""
    aten = torch.ops.aten
    half = q.shape[2] // 2
    parts = {"all": slice(None), "first": slice(0, half), "second": slice(half, None)}
    calls = []
    for q_part, kv_part, causal in ring_schedule(cp, rank):
        qq = q[:, :, parts[q_part]]
        kk, vv = k[:, :, parts[kv_part]].contiguous(), v[:, :, parts[kv_part]].contiguous()
        res = aten._scaled_dot_product_flash_attention(qq, kk, vv, 0.0, causal)
        calls.append((qq, kk, vv, causal, res))

    def fwd():
        for qq, kk, vv, causal, _ in calls:
            aten._scaled_dot_product_flash_attention(qq, kk, vv, 0.0, causal)

    def bwd():
        for qq, kk, vv, causal, res in calls:
            out, lse, cq, ck, mq, mk, seed, off = res[:8]
            aten._scaled_dot_product_flash_attention_backward(out, qq, kk, vv, out, lse, cq, ck, mq, mk, 0.0,
                                                               causal, seed, off)
    return fwd, bwd


def titan_transformer(torch, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, seq, recompute,
                      device=None):
    """A Llama 3 model as torchtitan (2024-12) builds it, fp32 parameters: token embedding,
    ``layers`` blocks (RMSNorm in fp32 then cast back; separate wq, wk, wv linears; rotary
    through complex fp32 products; ``repeat_kv`` before SDPA; wo; w2(silu(w1 x) * w3 x)), a
    final norm and the output linear. ``recompute`` wraps each block: "full"
    (``torch.utils.checkpoint``, non-reentrant), "op" (torchtitan's per-op selective policy:
    the outputs of SDPA and of every other mm, the 1st, 3rd, 5th and 7th of a block, are
    kept; ``_get_custom_policy`` in torchtitan's ``parallelize_llama.py``) or "none"."""
    from collections import defaultdict
    from functools import partial
    nn, F = torch.nn, torch.nn.functional
    from torch.utils.checkpoint import checkpoint
    kw = {"device": device, "dtype": torch.float32}

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden, **kw))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight

    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.polar(torch.ones(seq, head_dim // 2, device=device),
                        torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv))

    def rotary(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs.view(1, seq, 1, head_dim // 2)).flatten(3).type_as(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.wq = nn.Linear(hidden, heads * head_dim, bias=False, **kw)
            self.wk = nn.Linear(hidden, kv_heads * head_dim, bias=False, **kw)
            self.wv = nn.Linear(hidden, kv_heads * head_dim, bias=False, **kw)
            self.wo = nn.Linear(heads * head_dim, hidden, bias=False, **kw)
            self.w1 = nn.Linear(hidden, ffn, bias=False, **kw)
            self.w3 = nn.Linear(hidden, ffn, bias=False, **kw)
            self.w2 = nn.Linear(ffn, hidden, bias=False, **kw)

        def attention(self, x):
            b, s, _ = x.shape
            q = self.wq(x).view(b, s, heads, head_dim)
            k = self.wk(x).view(b, s, kv_heads, head_dim)
            v = self.wv(x).view(b, s, kv_heads, head_dim)
            q, k = rotary(q), rotary(k)
            rep = heads // kv_heads
            k = k[:, :, :, None].expand(b, s, kv_heads, rep, head_dim).reshape(b, s, heads, head_dim)
            v = v[:, :, :, None].expand(b, s, kv_heads, rep, head_dim).reshape(b, s, heads, head_dim)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            return self.wo(o.transpose(1, 2).contiguous().view(b, s, heads * head_dim))

        def block(self, x):
            h = x + self.attention(self.attention_norm(x))
            y = self.ffn_norm(h)
            return h + self.w2(F.silu(self.w1(y)) * self.w3(y))

        def forward(self, x):
            if recompute == "full":
                return checkpoint(self.block, x, use_reentrant=False)
            if recompute == "op":
                return checkpoint(self.block, x, use_reentrant=False, context_fn=op_policy_context)
            return self.block(x)

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    ops = torch.ops.aten
    # torchtitan's list; aten.max: Float8Linear's amax, "useful to always save" under low precision
    save = {ops.mm.default, ops._scaled_dot_product_flash_attention.default,
            ops._scaled_dot_product_efficient_attention.default, ops.max.default}
    if hasattr(ops, "_scaled_dot_product_cudnn_attention"):
        save.add(ops._scaled_dot_product_cudnn_attention.default)

    def policy(meta, ctx, func, *args, **kwargs):
        key = "recompute_mm" if ctx.is_recompute else "forward_mm"
        if func == ops.mm.default:
            meta[key] += 1
        keep = func in save and not (func == ops.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    def op_policy_context():
        return create_selective_checkpoint_contexts(partial(policy, defaultdict(int)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(vocab, hidden, **kw)
            self.layers = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()
            self.output = nn.Linear(hidden, vocab, bias=False, **kw)

        def forward(self, tokens):
            x = self.tok_embeddings(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.output(self.norm(x))

    model = Model()
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
    return model


def train_memory_case(torch, layers, batch, seq, recompute, optimizer, compiled, fsdp, device, fp8=False, timed=1):
    """Whole training steps of ``titan_transformer`` under FSDP2 (``fsdp``: a one-rank group,
    torchtitan's MixedPrecisionPolicy bf16 / fp32 reduce, each block sharded and resharded
    after its forward but the last, then the root) or, without it, autocast to bf16. Three
    steps (zero_grad to None, forward, fp32 cross-entropy, ``del pred``, backward, AdamW), the
    third phase by phase. ``fp8``: the blocks' linears converted to torchao's Float8Linear
    (tensorwise dynamic scaling; the head stays bf16) before compiling and sharding, torchtitan's
    order. Returns the bytes the caching allocator held at each point, its peaks, what the
    process holds outside it, and the median seconds of ``timed`` steps after one."""
    F = torch.nn.functional
    _, hidden, heads, kv_heads, head_dim, ffn, vocab = TRAIN_MODEL
    model = titan_transformer(torch, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, seq, recompute,
                              device=device)
    params = sum(p.numel() for p in model.parameters())
    if fp8:
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output")
    if compiled:
        for i, block in enumerate(model.layers):
            model.layers[i] = torch.compile(block, fullgraph=True)
    autocast = None
    if fsdp:
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(model.layers):
            fully_shard(block, mp_policy=mp, reshard_after_forward=i < layers - 1)
        fully_shard(model, mp_policy=mp, reshard_after_forward=True)
    else:
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=optimizer == "fused", foreach=optimizer == "foreach")
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    labels = torch.randint(0, vocab, (batch, seq), device=device)
    cuda = torch.cuda

    def forward():
        if autocast is None:
            pred = model(tokens)
        else:
            with autocast:
                pred = model(tokens)
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        del pred
        return loss

    def step():
        opt.zero_grad(set_to_none=True)
        forward().backward()
        opt.step()

    cuda.synchronize()
    cuda.reset_peak_memory_stats()
    e = [cuda.Event(enable_timing=True) for _ in range(timed + 1)]
    step()
    e[0].record()
    for i in range(timed):
        step()
        e[i + 1].record()
    cuda.synchronize()
    step_s = statistics.median(e[i].elapsed_time(e[i + 1]) / 1e3 for i in range(timed))
    peak_reserved = cuda.max_memory_reserved()
    peak_allocated = cuda.max_memory_allocated()
    opt.zero_grad(set_to_none=True)
    cuda.synchronize()
    states = cuda.memory_allocated()
    cuda.reset_peak_memory_stats()
    loss = forward()
    cuda.synchronize()
    after_forward = cuda.memory_allocated()
    fwd_peak = cuda.max_memory_allocated()
    cuda.reset_peak_memory_stats()
    loss.backward()
    del loss
    cuda.synchronize()
    bwd_peak = cuda.max_memory_allocated()
    after_backward = cuda.memory_allocated()
    cuda.reset_peak_memory_stats()
    opt.step()
    cuda.synchronize()
    opt_peak = cuda.max_memory_allocated()
    free, total = cuda.mem_get_info()
    outside = (total - free) - cuda.memory_reserved()
    stats = cuda.memory_stats()
    out = {"params": params, "states_bytes": states, "after_forward_bytes": after_forward,
           "fwd_peak_bytes": fwd_peak, "after_backward_bytes": after_backward, "bwd_peak_bytes": bwd_peak,
           "opt_peak_bytes": opt_peak, "peak_allocated_bytes": max(peak_allocated, fwd_peak, bwd_peak, opt_peak),
           "peak_reserved_bytes": max(peak_reserved, cuda.max_memory_reserved()), "outside_allocator_bytes": outside,
           "step_s": step_s, "alloc_retries": stats.get("num_alloc_retries", 0)}
    return out


def attention_plan():
    plan = []
    for d, heads in ATTN_HEADS:
        for s in ATTN_SEQ:
            b = max(1, ATTN_TOKENS // s)
            for backend in ATTN_BACKENDS:
                if backend == "math" and s > MATH_MAX_SEQ:
                    continue
                plan.append((backend, b, s, heads, d, True))
    # the FlashAttention-3 paper's comparison point (H100, bf16, d 128, 16K, no mask)
    for backend in ("flash", "cudnn"):
        plan.append((backend, 1, 16384, 16, 128, False))
    return plan


def estimate_s(rate=600e12):
    """Rough time of the whole plan at ``rate`` FLOP/s (for --dry-run)."""
    total = 0.0
    for _, _, m, n, k in gemm_plan():
        t = 2.0 * m * n * k / rate
        total += max(TARGET_S, 5 * t) + 4 * t
    for _, b, s, h, d, c in attention_plan():
        t = 3.5 * attention_flops(b, s, h, d, c) / (rate / 2)
        total += max(TARGET_S, 5 * t) * 2 + 4 * t
    return total


class Timer:
    """Median CUDA-event time of a callable, after warm-up."""

    def __init__(self, torch):
        self.torch = torch

    def __call__(self, fn, warmup=2, min_reps=3):
        cuda = self.torch.cuda
        for _ in range(warmup):
            fn()
        cuda.synchronize()
        e0, e1 = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        cuda.synchronize()
        first = e0.elapsed_time(e1) / 1e3
        reps = int(min(50, max(min_reps, math.ceil(TARGET_S / max(first, 1e-6)))))
        starts = [cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [cuda.Event(enable_timing=True) for _ in range(reps)]
        for a, z in zip(starts, ends):
            a.record()
            fn()
            z.record()
        cuda.synchronize()
        return statistics.median(a.elapsed_time(z) / 1e3 for a, z in zip(starts, ends))

    def graphed(self, fn):
        """Median time of one call replayed from a CUDA graph of many: a kernel shorter
        than the host's dispatch (a few microseconds of Python and the framework) would
        otherwise be timed with the GPU waiting for the host. What ``fn`` allocates
        comes from the graph's private pool (so the dense GEMMs write into ``out=``).
        Returns (graphed seconds, eager event-timed seconds)."""
        cuda = self.torch.cuda
        first = self(fn, warmup=2)
        reps = int(min(500, max(1, math.ceil(TARGET_S / max(first, 1e-6)))))
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            fn()
        cuda.current_stream().wait_stream(side)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        cuda.synchronize()
        times = []
        for _ in range(3):
            e0, e1 = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            e0.record()
            graph.replay()
            e1.record()
            cuda.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3 / reps)
        del graph
        return statistics.median(times), first

    def replayed(self, fn):
        """(seconds, "graph", eager seconds) from ``graphed``, or (seconds, "events",
        the same seconds) from plain event timing where the call cannot be captured."""
        try:
            sec, eager = self.graphed(fn)
            return sec, "graph", eager
        except RuntimeError as err:
            print(f"graph capture refused ({str(err)[:100]}): timed by events", flush=True)
            sec = self(fn)
            return sec, "events", sec

    def sdpa_fwd_bwd(self, q, k, v, kind, **kwargs):
        """(forward, backward) seconds of ``scaled_dot_product_attention`` on ``kind``'s
        backend (``sdpa_backends``); the backward as autograd runs it, dQ, dK and dV."""
        from torch.nn.attention import sdpa_kernel
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(kind):
            fwd = self(lambda: sdpa(q, k, v, **kwargs))
            o = sdpa(q, k, v, **kwargs)
            go = self.torch.randn_like(o)
            bwd = self(lambda: self.torch.autograd.grad(o, (q, k, v), go, retain_graph=True))
        return fwd, bwd


def sdpa_backends():
    """SDPA backend label -> ``torch.nn.attention.SDPBackend`` (FlashAttention-2 ``flash``,
    cuDNN ``cudnn``, memory-efficient ``efficient``, unfused ``math``)."""
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def _version(package: str) -> str:
    """An installed package's version, or "absent" (torchao: the train_fp8 part's Float8Linear)."""
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:  # noqa: BLE001
        return "absent"


def smi(fields):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        out = f"nvidia-smi failed: {err}"
    return out


class Writer:
    def __init__(self, path, header):
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(header)

    def row(self, values):
        self.w.writerow(values)
        self.f.flush()


def run(out: Path, budget_s: float, parts: set[str]) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    t_start = time.perf_counter()

    def left():
        return budget_s - (time.perf_counter() - t_start)

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    env = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": props.name, "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": sys.version.split()[0],
        "allocator": os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default",
        "torchao": _version("torchao"),
        "smi_before": smi("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,"
                          "power.max_limit,temperature.gpu,pstate"),
        "timing": f"GEMMs (dense, fp8, grouped): CUDA-graph replay of calls sized to {TARGET_S * 1e3:.0f} ms, "
                  "median of 3 replays; attention and memory passes: CUDA events per call, median of repeats "
                  f"sized to {TARGET_S * 1e3:.0f} ms; whole layers: CUDA events per call, median of at least "
                  f"{LAYER_REPS}; decode steps: CUDA-graph replay as the GEMMs; 2 warm-ups each; torch.randn inputs; "
                  "whole training steps: CUDA events around each step after one warm-up (train_memory one, "
                  "train_fp8 the median of three), memory from the "
                  "caching allocator's counters",
    }
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env, indent=1), flush=True)
    timer = Timer(torch)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True

    # ---- bf16 GEMMs in autograd's layouts, each replayed from a CUDA graph
    if "gemm" in parts:
        g = Writer(out / "gemm_bf16.csv", ["m", "n", "k", "dtype", "seconds", "tflops", "role", "layer",
                                           "eager_seconds"])
        cache = {}

        def randn(shape):
            key = tuple(shape)
            if key not in cache:
                if len(cache) > 6:
                    cache.clear()
                cache[key] = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
            return cache[key]

        done = 0
        decode = [(layer, "decode", m, n, k) for layer, _, m, n, k in gemm_plan(DECODE_TOKENS, ("fwd",))]
        for layer, role, m, n, k in gemm_plan() + decode:
            if left() < 0.45 * budget_s:
                print(f"gemm: budget reached after {done} shapes", flush=True)
                break
            c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            if role in ("fwd", "decode"):  # X (tokens, k_in) @ W (n_out, k_in)^T
                a, b = randn((m, k)), randn((n, k)).t()
            elif role == "dgrad":  # dY (tokens, n_out = k) @ W (n_out, k_in = n)
                a, b = randn((m, k)), randn((k, n))
            else:  # dY^T (n_out = m, tokens = k) @ X (tokens, k_in = n)
                a, b = randn((k, m)).t(), randn((k, n))
            s, _, eager = timer.replayed(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c))
            g.row([m, n, k, "bf16", f"{s:.6e}", f"{2.0 * m * n * k / s / 1e12:.2f}", role, layer, f"{eager:.6e}"])
            done += 1
            del c
        cache.clear()
        torch.cuda.empty_cache()
        print(f"gemm bf16: {done} shapes, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- attention
    if "attention" in parts:
        a_w = Writer(out / "attention.csv", ["backend", "batch", "seq", "heads", "head_dim", "causal", "fwd_s",
                                             "bwd_s", "fwd_tflops", "bwd_tflops", "error"])
        backends = sdpa_backends()
        for backend, b, s, h, d, causal in attention_plan():
            if left() < 0.2 * budget_s:
                print("attention: budget reached", flush=True)
                break
            flops = attention_flops(b, s, h, d, causal)
            try:
                q, k_, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                            for _ in range(3))
                fwd, bwd = timer.sdpa_fwd_bwd(q, k_, v, backends[backend], is_causal=causal)
                a_w.row([backend, b, s, h, d, int(causal), f"{fwd:.6e}", f"{bwd:.6e}", f"{flops / fwd / 1e12:.2f}",
                         f"{2.5 * flops / bwd / 1e12:.2f}", ""])
                del q, k_, v
            except Exception as err:  # noqa: BLE001 - a backend that refuses a shape is a result
                a_w.row([backend, b, s, h, d, int(causal), "", "", "", "", f"{type(err).__name__}: {str(err)[:120]}"])
            torch.cuda.empty_cache()
        print(f"attention done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- memory-bound passes and dispatch
    if "memory" in parts:
        m_w = Writer(out / "memory.csv", ["op", "elements", "bytes_moved", "seconds", "GB_per_s"])
        n = 1 << 28  # 256 Mi bf16 elements = 512 MiB per tensor, far over L2
        x = torch.randn(n, device=dev, dtype=torch.bfloat16)
        y = torch.randn(n, device=dev, dtype=torch.bfloat16)
        z = torch.empty_like(x)
        rows = n // 8192
        w = torch.randn(8192, device=dev, dtype=torch.bfloat16)
        ops = [
            ("copy", lambda: z.copy_(x), 4 * n),
            ("add", lambda: torch.add(x, y, out=z), 6 * n),
            ("rms_norm", lambda: F.rms_norm(x.view(rows, 8192), (8192,), w), 4 * n),
            ("swiglu", lambda: F.silu(x[: n // 2]) * y[: n // 2], 3 * n),
        ]
        for name, fn, moved in ops:
            try:
                s = timer(fn)
                m_w.row([name, n, moved, f"{s:.6e}", f"{moved / s / 1e9:.1f}"])
            except Exception as err:  # noqa: BLE001
                m_w.row([name, n, moved, "", f"error {type(err).__name__}: {str(err)[:80]}"])
        small = torch.randn(1024, device=dev)
        for _ in range(100):
            small.add_(1.0)
        torch.cuda.synchronize()
        reps = 5000
        t0 = time.perf_counter()
        for _ in range(reps):
            small.add_(1.0)
        torch.cuda.synchronize()
        per = (time.perf_counter() - t0) / reps
        m_w.row(["eager_dispatch_per_kernel", 1024, 0, f"{per:.6e}", ""])
        del x, y, z
        torch.cuda.empty_cache()
        print(f"memory done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- fp8 forward GEMMs (torch._scaled_mm: A row-major, B column-major, tensorwise scales,
    if "fp8" in parts:
        # fast accumulation as FP8 training recipes use it in the forward)
        f_w = Writer(out / "gemm_fp8.csv", ["m", "n", "k", "dtype", "seconds", "tflops", "role", "layer"])
        one = torch.ones((), device=dev, dtype=torch.float32)
        done = 0
        for layer, role, m, n, k in gemm_plan(FP8_TOKENS, ("fwd",)):
            if left() < 0.02 * budget_s:
                print(f"fp8: budget reached after {done}", flush=True)
                break
            try:
                a = torch.randn(m, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
                c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                try:
                    s, _ = timer.graphed(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                                                  out_dtype=torch.bfloat16, use_fast_accum=True, out=c))
                except (TypeError, RuntimeError):  # no out= overload: eager timing
                    s = timer(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                       use_fast_accum=True))
                f_w.row([m, n, k, "fp8", f"{s:.6e}", f"{2.0 * m * n * k / s / 1e12:.2f}", role, layer])
                done += 1
            except Exception as err:  # noqa: BLE001
                print(f"fp8 {m}x{n}x{k}: {type(err).__name__}: {str(err)[:160]}", flush=True)
                break
    # ---- FP8 scaling recipes at serving sizes: one GEMM per (shape, recipe), graph-replayed
    if "fp8_scaling" in parts:
        sw = Writer(out / "gemm_fp8_scaling.csv", ["m", "n", "k", "scaling", "seconds", "tflops",
                                                   "weight_GB_per_s", "layer", "timing", "error"])
        f8 = torch.float8_e4m3fn
        sm = getattr(F, "scaled_mm", None)
        st = getattr(F, "ScalingType", None)
        for layer, m, n, k in scaling_plan():
            if left() < 0.05 * budget_s:
                print("fp8 scaling: budget reached", flush=True)
                break
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            xa, wb = x.to(f8), w.to(f8)
            one = torch.ones((), device=dev, dtype=torch.float32)
            # row: a scale per token (m, 1) and per output channel (1, n); block: (m, k/128)
            # activation scales column-major, the weight's (n/128, k/128) scales transposed,
            # its k blocks padded to a multiple of 4 as cuBLAS asks
            row_a = torch.rand(m, 1, device=dev, dtype=torch.float32) + 0.5
            row_b = torch.rand(1, n, device=dev, dtype=torch.float32) + 0.5
            kb = k // 128
            blk_a = (torch.rand(kb, m, device=dev, dtype=torch.float32) + 0.5).t()
            blk_b = (torch.rand(n // 128, -(-kb // 4) * 4, device=dev, dtype=torch.float32) + 0.5).t()
            calls = {
                "bf16": lambda: torch.matmul(x, w.t(), out=c),
                "tensor": lambda: torch._scaled_mm(xa, wb.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                   use_fast_accum=True, out=c),
                "row": lambda: torch._scaled_mm(xa, wb.t(), scale_a=row_a, scale_b=row_b, out_dtype=torch.bfloat16,
                                                use_fast_accum=True, out=c),
                "block": (lambda: sm(xa, wb.t(), blk_a, st.BlockWise1x128, blk_b, st.BlockWise128x128,
                                     output_dtype=torch.bfloat16)) if sm is not None else None,
            }
            for scaling in SCALINGS:
                wbytes = n * k * (2 if scaling == "bf16" else 1)
                try:
                    if calls[scaling] is None:
                        raise RuntimeError("torch.nn.functional.scaled_mm absent")
                    sec, how, _ = timer.replayed(calls[scaling])
                    sw.row([m, n, k, scaling, f"{sec:.6e}", f"{2.0 * m * n * k / sec / 1e12:.2f}",
                            f"{wbytes / sec / 1e9:.1f}", layer, how, ""])
                except Exception as err:  # noqa: BLE001 - a refused recipe is a result
                    sw.row([m, n, k, scaling, "", "", "", layer, "", f"{type(err).__name__}: {str(err)[:120]}"])
            del x, w, c, xa, wb
            torch.cuda.empty_cache()
        print(f"fp8 scaling done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- grouped GEMMs of MoE experts (torch._grouped_mm: one kernel for every local expert)
    if "grouped" in parts:
        gw = Writer(out / "grouped_gemm.csv", ["family", "linear", "role", "groups", "rows", "m", "n", "k",
                                               "seconds", "useful_tflops", "timing", "error"])
        for fam, linear, role, groups, rows, m, n, k in grouped_plan():
            if left() < 0.1 * budget_s:
                print("grouped: budget reached", flush=True)
                break
            total = sum(rows)
            offs = torch.tensor(rows, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            flops = sum(2.0 * r * (m * n * k / max(rows)) for r in rows) if role != "wgrad" else \
                sum(2.0 * m * n * r for r in rows)
            try:
                if role == "fwd":  # X (tokens, k_in) @ W_g (n_out, k_in)^T
                    a = torch.randn(total, k, device=dev, dtype=torch.bfloat16)
                    b = torch.randn(groups, n, k, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
                elif role == "dgrad":  # dY (tokens, n_out = k) @ W_g (n_out, k_in = n)
                    a = torch.randn(total, k, device=dev, dtype=torch.bfloat16)
                    b = torch.randn(groups, k, n, device=dev, dtype=torch.bfloat16)
                else:  # dY^T (n_out = m, tokens) @ X (tokens, k_in = n), grouped along the tokens
                    a = torch.randn(total, m, device=dev, dtype=torch.bfloat16).t()
                    b = torch.randn(total, n, device=dev, dtype=torch.bfloat16)

                def fn(a=a, b=b, offs=offs):
                    return torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16)

                sec, how, _ = timer.replayed(fn)
                gw.row([fam, linear, role, groups, "/".join(map(str, rows)), m, n, k, f"{sec:.6e}",
                        f"{flops / sec / 1e12:.2f}", how, ""])
            except Exception as err:  # noqa: BLE001 - a refused layout is a result
                gw.row([fam, linear, role, groups, "/".join(map(str, rows)), m, n, k, "", "", "",
                        f"{type(err).__name__}: {str(err)[:120]}"])
            torch.cuda.empty_cache()
        print(f"grouped done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- attention variants: grouped-query and MLA head dims, per backend
    if "attention_variants" in parts:
        vw = Writer(out / "attention_variants.csv", ["label", "backend", "batch", "seq", "heads", "kv_heads",
                                                     "qk_dim", "v_dim", "fwd_s", "bwd_s", "fwd_tflops",
                                                     "bwd_tflops", "error"])
        kinds = {name: kind for name, kind in sdpa_backends().items() if name != "math"}
        for label, b, s, h, hk, dq, dv in ATTN_VARIANTS:
            flops = 2.0 * b * s * s * h * (dq + dv) / 2.0
            for backend, kind in kinds.items():
                try:
                    q = torch.randn(b, h, s, dq, device=dev, dtype=torch.bfloat16, requires_grad=True)
                    k_ = torch.randn(b, hk, s, dq, device=dev, dtype=torch.bfloat16, requires_grad=True)
                    v = torch.randn(b, hk, s, dv, device=dev, dtype=torch.bfloat16, requires_grad=True)
                    gqa = {"enable_gqa": True} if hk != h else {}
                    fwd, bwd = timer.sdpa_fwd_bwd(q, k_, v, kind, is_causal=True, **gqa)
                    vw.row([label, backend, b, s, h, hk, dq, dv, f"{fwd:.6e}", f"{bwd:.6e}",
                            f"{flops / fwd / 1e12:.2f}", f"{2.5 * flops / bwd / 1e12:.2f}", ""])
                    del q, k_, v
                except Exception as err:  # noqa: BLE001
                    vw.row([label, backend, b, s, h, hk, dq, dv, "", "", "", "",
                            f"{type(err).__name__}: {str(err)[:120]}"])
                torch.cuda.empty_cache()
        print(f"attention variants done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- decode attention: one query token a sequence over its cached keys (memory-bound)
    if "decode_attention" in parts:
        dw = Writer(out / "decode_attention.csv", ["backend", "batch", "context", "heads", "kv_heads", "head_dim",
                                                   "seconds", "kv_bytes", "GB_per_s", "timing", "error"])
        kinds = sdpa_backends()
        for h, hk in DECODE_HEADS:
            for b in DECODE_BATCH:
                for ctx in DECODE_CONTEXT:
                    kv_bytes = 2 * b * ctx * hk * 128 * 2
                    if kv_bytes > DECODE_MAX_KV_BYTES:
                        continue
                    q = torch.randn(b, h, 1, 128, device=dev, dtype=torch.bfloat16)
                    k_ = torch.randn(b, hk, ctx, 128, device=dev, dtype=torch.bfloat16)
                    v = torch.randn(b, hk, ctx, 128, device=dev, dtype=torch.bfloat16)
                    gqa = {"enable_gqa": True} if hk != h else {}
                    for backend, kind in kinds.items():
                        if left() < 0.05 * budget_s:
                            break
                        try:
                            def fn(q=q, k_=k_, v=v, kind=kind, gqa=gqa):
                                with sdpa_kernel(kind):
                                    return F.scaled_dot_product_attention(q, k_, v, **gqa)
                            sec, how, _ = timer.replayed(fn)
                            moved = kv_bytes + 2 * b * h * 128 * 2
                            dw.row([backend, b, ctx, h, hk, 128, f"{sec:.6e}", kv_bytes, f"{moved / sec / 1e9:.1f}",
                                    how, ""])
                        except Exception as err:  # noqa: BLE001
                            dw.row([backend, b, ctx, h, hk, 128, "", kv_bytes, "", "",
                                    f"{type(err).__name__}: {str(err)[:100]}"])
                    del q, k_, v
                    torch.cuda.empty_cache()
        print(f"decode attention done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- one whole transformer block, forward and backward, under each recompute mode
    if "layer" in parts:
        lw = Writer(out / "layer.csv", ["label", "backend", "recompute", "batch", "seq", "hidden", "heads",
                                        "kv_heads", "head_dim", "ffn", "gated", "norm", "infer_s", "fwd_s", "step_s", "bwd_s",
                                        "fwd_flop", "fwd_tflops", "step_tflops", "saved_bytes", "peak_bytes",
                                        "error"])
        kinds = sdpa_backends()
        for label, h, heads, kvh, d, ffn, gated, norm, rotary, b, s in LAYER_SHAPES:
            block = transformer_block(torch, h, heads, kvh, d, ffn, gated, norm, rotary, device=dev,
                                      dtype=torch.bfloat16)
            params = list(block.parameters())
            x = torch.randn(b, s, h, device=dev, dtype=torch.bfloat16, requires_grad=True)
            gy = torch.randn(b, s, h, device=dev, dtype=torch.bfloat16)
            flops = layer_flops(h, heads, kvh, d, ffn, gated, b, s)
            for backend in ("flash", "cudnn"):
                for mode in LAYER_RECOMPUTE:
                    if left() < 0.05 * budget_s:
                        break
                    head = [label, backend, mode, b, s, h, heads, kvh, d, ffn, int(gated), norm]
                    try:
                        with sdpa_kernel(kinds[backend]):
                            with torch.no_grad():  # a prefill's forward: nothing kept
                                infer = timer(lambda: block(x), min_reps=LAYER_REPS)
                            fwd = timer(lambda mode=mode: block(x, mode), min_reps=LAYER_REPS)

                            def step(mode=mode):
                                return torch.autograd.grad(block(x, mode), [x, *params], gy)
                            step_s = timer(step, min_reps=LAYER_REPS)
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                            base = torch.cuda.memory_allocated()
                            y = block(x, mode)
                            saved = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
                            len(torch.autograd.grad(y, [x, *params], gy))  # the gradients count in the peak
                            peak = torch.cuda.max_memory_allocated() - base
                            del y
                        lw.row([*head, f"{infer:.6e}", f"{fwd:.6e}", f"{step_s:.6e}", f"{step_s - fwd:.6e}", f"{flops:.6e}",
                                f"{flops / fwd / 1e12:.2f}", f"{3.0 * flops / step_s / 1e12:.2f}", saved, peak, ""])
                    except Exception as err:  # noqa: BLE001
                        lw.row([*head, "", "", "", "", f"{flops:.6e}", "", "", "", "",
                                f"{type(err).__name__}: {str(err)[:120]}"])
                    torch.cuda.empty_cache()
            del block, params, x, gy
            torch.cuda.empty_cache()
        print(f"layer done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- one decode iteration through whole blocks, replayed from a CUDA graph
    for part, fp8, batches in (("decode_step", False, DECODE_STEP_BATCH),
                               ("decode_step_fp8", True, DECODE_STEP_BATCH_FP8)):
        if part not in parts:
            continue
        sw = Writer(out / f"{part}.csv", ["label", "backend", "batch", "context", "layers", "hidden", "heads",
                                          "kv_heads", "head_dim", "ffn", "seconds_per_layer",
                                          "weight_bytes_per_layer", "kv_bytes_per_layer", "GB_per_s", "timing",
                                          "eager_seconds_per_layer", "error"])
        kinds = sdpa_backends()
        for label, h, heads, kvh, d, ffn, layers in DECODE_STEP_MODELS:
            for b in batches:
                for ctx in DECODE_STEP_CONTEXT:
                    with torch.no_grad():
                        step, wb, kvb = decode_step(torch, h, heads, kvh, d, ffn, layers, b, ctx, device=dev,
                                                    dtype=torch.bfloat16, fp8=fp8)
                        for backend in ("flash", "cudnn"):
                            if left() < 0.05 * budget_s:
                                break
                            head = [label, backend, b, ctx, layers, h, heads, kvh, d, ffn]
                            try:
                                def fn(step=step, kind=kinds[backend]):
                                    with sdpa_kernel(kind):
                                        return step()
                                sec, how, eager = timer.replayed(fn)
                                sw.row([*head, f"{sec / layers:.6e}", wb // layers, kvb // layers,
                                        f"{(wb + kvb) / sec / 1e9:.1f}", how, f"{eager / layers:.6e}", ""])
                            except Exception as err:  # noqa: BLE001
                                sw.row([*head, "", wb // layers, kvb // layers, "", "", "",
                                        f"{type(err).__name__}: {str(err)[:120]}"])
                    del step
                    torch.cuda.empty_cache()
        print(f"{part} done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- whole training steps: what the allocator holds, phase by phase (FSDP2 on one rank),
    # and the step in bf16 beside FP8
    train_parts = {"train_memory": [(*case, "bf16") for case in TRAIN_CASES],
                   "train_fp8": [(layers, b, s, mode, "foreach", compiled, dtype)
                                 for layers, b, s, mode, compiled, dtype in TRAIN_FP8_CASES]}
    if parts & set(train_parts):
        fields = ["params", "states_bytes", "after_forward_bytes", "fwd_peak_bytes", "after_backward_bytes",
                  "bwd_peak_bytes", "opt_peak_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                  "outside_allocator_bytes", "step_s", "alloc_retries"]
        fsdp = False
        try:
            import torch.distributed as dist
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            torch.cuda.set_device(0)
            dist.init_process_group("nccl", rank=0, world_size=1)
            fsdp = True
        except Exception as err:  # noqa: BLE001
            print(f"train_memory: no process group ({err}); autocast without FSDP", flush=True)
        label, *shape = TRAIN_MODEL
        for part, cases in train_parts.items():
            if part not in parts:
                continue
            extra = ["dtype"] if part == "train_fp8" else []
            tw = Writer(out / f"{part}.csv", ["label", "wrap", "layers", "batch", "seq", "recompute", "optimizer",
                                              "compiled", *extra, "hidden", "heads", "kv_heads", "head_dim", "ffn",
                                              "vocab", *fields, "error"])
            for layers, b, s, mode, optimizer, compiled, dtype in cases:
                case = (layers, b, s, mode, optimizer, compiled, dtype)
                if left() < (0.3 if compiled and part == "train_memory" else 0.05) * budget_s:
                    print(f"{part}: budget reached before {case}", flush=True)
                    break
                head = [label, "fsdp2-1rank" if fsdp else "autocast", layers, b, s, mode, optimizer, int(compiled),
                        *([dtype] if extra else []), *shape]
                torch.cuda.empty_cache()
                try:
                    with sdpa_kernel(sdpa_backends()["flash"]):
                        got = train_memory_case(torch, layers, b, s, mode, optimizer, compiled, fsdp, dev,
                                                fp8=dtype == "fp8", timed=TRAIN_TIMED_STEPS[part])
                    tw.row([*head, *(f"{got[f]:.6e}" if f == "step_s" else got[f] for f in fields), ""])
                except Exception as err:  # noqa: BLE001
                    failed = dict.fromkeys(fields, "") | {"peak_reserved_bytes": torch.cuda.max_memory_reserved()}
                    tw.row([*head, *(failed[f] for f in fields), f"{type(err).__name__}: {str(err)[:160]}"])
                print(f"{part} {case}: {time.perf_counter() - t_start:.0f} s", flush=True)
                import gc
                gc.collect()
                torch.cuda.empty_cache()
        if fsdp:
            dist.destroy_process_group()
        print(f"whole training steps done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- context-parallel ring attention, one rank of the ring alone on the GPU
    if "ring_attention" in parts:
        rw = Writer(out / "ring_attention.csv", ["label", "impl", "cp", "rank", "tokens_per_rank", "seq", "heads",
                                                 "head_dim", "pairs", "fwd_s", "bwd_s", "fwd_tflops", "bwd_tflops",
                                                 "error"])
        try:
            ring = RingRank(torch)
            ring_error = ""
        except Exception as err:  # noqa: BLE001 - recorded: the kernels-alone rows still run
            ring, ring_error = None, f"{type(err).__name__}: {str(err)[:120]}"
        for label, h, d, n in RING_MODELS:
            q, k_, v = (torch.randn(1, h, n, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
            go = torch.randn_like(q)
            for cp in RING_CP:
                for rank in sorted({0, cp - 1}):
                    if left() < 0.05 * budget_s:
                        break
                    pairs = ring_pairs(cp, rank, n) * h
                    flop = 4.0 * pairs * d  # QK^T and PV, 2 FLOP a multiply-add
                    head = [label, "", cp, rank, n, n * cp, h, d, pairs]
                    for impl in ("torch", "kernels"):
                        head[1] = impl
                        try:
                            if impl == "torch":
                                if ring is None:
                                    raise RuntimeError(ring_error)
                                fwd_out = ring.forward(q, k_, v, cp, rank)
                                fwd = timer(lambda cp=cp, rank=rank: ring.forward(q, k_, v, cp, rank))
                                bwd = timer(lambda cp=cp, rank=rank, f=fwd_out: ring.backward(go, q, k_, v, f, cp,
                                                                                                rank))
                                del fwd_out
                            else:
                                f_call, b_call = ring_kernel_calls(torch, q, k_, v, cp, rank)
                                fwd, bwd = timer(f_call), timer(b_call)
                                del f_call, b_call
                            rw.row([*head, f"{fwd:.6e}", f"{bwd:.6e}", f"{flop / fwd / 1e12:.2f}",
                                    f"{2.5 * flop / bwd / 1e12:.2f}", ""])
                        except Exception as err:  # noqa: BLE001
                            rw.row([*head, "", "", "", "", f"{type(err).__name__}: {str(err)[:120]}"])
                        torch.cuda.empty_cache()
            del q, k_, v, go
            torch.cuda.empty_cache()
        for s_len in RING_GLOBAL_SEQ:
            if left() < 0.05 * budget_s:
                break
            h = RING_GLOBAL_HEADS
            q, k_, v = (torch.randn(1, h, s_len, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
                        for _ in range(3))
            flop = attention_flops(1, s_len, h, 128, True)
            try:
                fwd, bwd = timer.sdpa_fwd_bwd(q, k_, v, sdpa_backends()["flash"], is_causal=True)
                rw.row(["global", "sdpa-flash", 1, 0, s_len, s_len, h, 128, s_len * s_len // 2 * h, f"{fwd:.6e}",
                        f"{bwd:.6e}", f"{flop / fwd / 1e12:.2f}", f"{2.5 * flop / bwd / 1e12:.2f}", ""])
            except Exception as err:  # noqa: BLE001
                rw.row(["global", "sdpa-flash", 1, 0, s_len, s_len, h, 128, "", "", "", "", "",
                        f"{type(err).__name__}: {str(err)[:120]}"])
            del q, k_, v
            torch.cuda.empty_cache()
        print(f"ring attention done, {time.perf_counter() - t_start:.0f} s", flush=True)

    # ---- fused attention against its parallelism (heads x batch)
    if "attention_heads" in parts:
        hw_ = Writer(out / "attention_heads.csv", ["backend", "batch", "seq", "heads", "head_dim", "causal",
                                                  "fwd_s", "bwd_s", "fwd_tflops", "bwd_tflops", "timing", "error"])
        kinds = sdpa_backends()
        plan = [(1, h, s_len, True) for s_len in HEADS_SEQ for h in HEADS_COUNTS
                if s_len * h <= HEADS_MAX_TOKENS_HEADS]
        plan += [(b, h, s_len, True) for s_len in HEADS_BATCHED_SEQ for b, h in HEADS_BATCHED]
        plan += [(1, h, s_len, False) for s_len in HEADS_FULL_SEQ for h in HEADS_COUNTS]
        for b, h, s_len, causal in plan:
            for backend in ("flash", "cudnn"):
                if left() < 0.05 * budget_s:
                    break
                flop = attention_flops(b, s_len, h, 128, causal)
                try:
                    q, k_, v = (torch.randn(b, h, s_len, 128, device=dev, dtype=torch.bfloat16,
                                            requires_grad=True) for _ in range(3))
                    # the forward replayed from a CUDA graph: a call of tens of microseconds is
                    # shorter than eager dispatch, which events would time with the GPU waiting
                    with sdpa_kernel(kinds[backend]):
                        def fwd_call(q=q, k_=k_, v=v, causal=causal):
                            return F.scaled_dot_product_attention(q, k_, v, is_causal=causal)
                        fwd, how_f, _ = timer.replayed(fwd_call)
                        o = fwd_call()
                        go = torch.randn_like(o)

                        def bwd_call(o=o, go=go, q=q, k_=k_, v=v):
                            return torch.autograd.grad(o, (q, k_, v), go, retain_graph=True)
                        bwd, how_b = timer(bwd_call), "events"  # autograd's backward is not captured
                        del o, go
                    hw_.row([backend, b, s_len, h, 128, int(causal), f"{fwd:.6e}", f"{bwd:.6e}",
                             f"{flop / fwd / 1e12:.2f}", f"{2.5 * flop / bwd / 1e12:.2f}", f"{how_f}/{how_b}", ""])
                    del q, k_, v
                except Exception as err:  # noqa: BLE001
                    hw_.row([backend, b, s_len, h, 128, int(causal), "", "", "", "", "",
                             f"{type(err).__name__}: {str(err)[:120]}"])
                torch.cuda.empty_cache()
        print(f"attention heads done, {time.perf_counter() - t_start:.0f} s", flush=True)

    env["smi_after"] = smi("clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active")
    env["seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps({k: env[k] for k in ("smi_after", "seconds")}), flush=True)


def summary(out: Path) -> None:
    """Print the medians the closing table needs (runs after ``run``, or on copies)."""
    for name in ("gemm_bf16.csv", "gemm_fp8.csv"):
        p = out / name
        if not p.exists():
            continue
        rows = list(csv.DictReader(open(p)))
        by = {}
        for r in rows:
            by.setdefault((r["role"], r["layer"].split("/")[0]), []).append(float(r["tflops"]))
        for key, v in sorted(by.items()):
            print(f"{name} {key}: n={len(v)} median {statistics.median(v):.0f} max {max(v):.0f} TFLOP/s")
    p = out / "attention.csv"
    if p.exists():
        for r in csv.DictReader(open(p)):
            print("attn", r["backend"], r["seq"], r["head_dim"], r["causal"], r["fwd_tflops"], r["bwd_tflops"],
                  r["error"][:60])
    p = out / "decode_attention.csv"
    if p.exists():
        for r in csv.DictReader(open(p)):
            print("decode", r["backend"], r["batch"], r["context"], r["heads"], r["kv_heads"], r["GB_per_s"],
                  r["timing"], r["error"][:50])
    p = out / "gemm_fp8_scaling.csv"
    if p.exists():
        rows = list(csv.DictReader(open(p)))
        by = {}
        for r in rows:
            if not r["error"]:
                by.setdefault((int(r["m"]), r["scaling"]), []).append(float(r["tflops"]))
        errors = [r["error"] for r in rows if r["error"]]
        print("fp8 scaling:", len(errors), "errors", *errors[:3])
        for key, v in sorted(by.items()):
            print(f"  m={key[0]} {key[1]}: n={len(v)} median {statistics.median(v):.0f} TFLOP/s")
    for name in ("grouped_gemm.csv", "attention_variants.csv"):
        p = out / name
        if p.exists():
            rows = list(csv.DictReader(open(p)))
            bad = [r for r in rows if r["error"]]
            print(f"{name}: {len(rows)} rows, {len(bad)} errors", *(r["error"] for r in bad[:3]))
            if name.startswith("attention"):
                for r in rows:
                    print(" ", r["label"], r["backend"], r["fwd_tflops"], r["bwd_tflops"], r["error"][:50])
    for name in ("layer.csv", "decode_step.csv", "decode_step_fp8.csv", "ring_attention.csv",
                 "attention_heads.csv", "train_memory.csv", "train_fp8.csv"):
        p = out / name
        if p.exists():
            print(p.read_text())
    p = out / "memory.csv"
    if p.exists():
        print(p.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    args = ap.parse_args(argv)
    if args.dry_run:
        print(f"{len(gemm_plan())} bf16 GEMMs, {len(gemm_plan(FP8_TOKENS, ('fwd',)))} fp8, "
              f"{len(attention_plan())} attention cases; about {estimate_s():.0f} s at 600 TFLOP/s")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    run(args.out, args.budget_s, set(args.parts.split(",")))
    summary(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
