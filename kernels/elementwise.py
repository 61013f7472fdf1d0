"""A layer's memory-bound elementwise work as eager PyTorch runs it
(``SpaceSpec.elementwise = "eager"``): what each op reads and writes, by hand
from the reference Llama layer that torchtitan and most PyTorch-native trainers
run without ``torch.compile`` (pytorch/torchtitan ``torchtitan/models/norms.py``
``RMSNorm`` and ``torchtitan/models/llama/model.py``, as of its 2024-12 release;
Meta's and Hugging Face's Llama are the same op for op):

- RMSNorm, ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w``:
  ``x.float()`` reads ab and writes 4 bytes an element, ``pow`` 4 + 4, ``mean``
  reads 4, the multiply 4 + 4, ``type_as`` 4 + ab, the weight multiply ab + ab:
  28 + 4 ab bytes (36 in bf16), against 2 ab for one fused kernel; eight launches
  (the eps add and rsqrt run on the row statistics).
- rotary, ``view_as_real(view_as_complex(x.float()) * freqs_cis).type_as(x)`` on Q
  and on K: 16 + 2 ab bytes an element of each (``float``, the complex multiply,
  ``type_as``), three launches each.
- ``repeat_kv`` (grouped-query attention): K and V expanded to the query heads
  and materialised (``expand(...).reshape``): each reads its KV width and writes
  the query width.
- the attention output's ``transpose(1, 2).contiguous()``: a read and a write of
  its width (heads x the value head dim).
- SwiGLU, ``silu(w1 x) * w3 x``: ``silu`` 2 ab and the product 3 ab an element
  of the FFN width, two launches (one fused kernel: 3 ab).

With fp32 activations (ab = 4) the casts are no-ops. The backward is priced at
twice the forward, as for the fused passes (``kernels.attention.attention_s``)."""

from __future__ import annotations

from paraspace.kernels.jit import jit
from paraspace.kernels.ops import memory_bound_s

#: launches of one eager RMSNorm (float, pow, mean, add eps, rsqrt, multiply, type_as, weight)
RMS_NORM_KERNELS = 8.0
#: launches of the eager rotary embedding on one tensor (float, complex multiply, type_as)
ROTARY_KERNELS = 3.0


@jit(inline=True)
def upcast_bytes(ab: float) -> float:
    """Bytes an element of ``x.float()`` moves (read ab, write 4), or of the
    ``type_as`` back: 0 where the activations are fp32 already."""
    return ab + 4.0 if ab < 4.0 else 0.0


@jit(inline=True)
def eager_rms_norm_bytes(ab: float) -> float:
    """Bytes an element of eager RMSNorm moves: the upcast, ``pow`` (4 + 4),
    ``mean`` (4), the multiply by the rsqrt (4 + 4), the cast back and the weight
    multiply (2 ab)."""
    return 2.0 * upcast_bytes(ab) + 20.0 + 2.0 * ab


@jit(inline=True)
def eager_rotary_bytes(ab: float) -> float:
    """Bytes an element of Q or K moves through the eager complex rotary: the
    upcast, the complex multiply (4 + 4) and the cast back."""
    return 2.0 * upcast_bytes(ab) + 8.0


@jit(inline=True)
def activation_s(sh, elements: float, glu: bool, dev) -> float:
    """Forward seconds of an MLP's activation function over ``elements`` of its FFN
    width, by the layer's elementwise mode: nothing when fused into the
    up-projection's epilogue; one pass otherwise (SwiGLU reads 2 and writes 1 ab,
    GELU reads and writes 1); eager, SwiGLU's ``silu`` (read and write) and product
    (two reads, a write) apart, two launches."""
    if sh.eager and glu:
        return memory_bound_s(5.0 * elements * sh.ab, 2.0, dev)
    if sh.fused:
        return 0.0
    return memory_bound_s((3.0 if glu else 2.0) * elements * sh.ab, 1.0, dev)


@jit(inline=True)
def eager_attention_copies_bytes(tokens: float, ab: float, v_out: float, q_width: float, kv_width: float,
                                 grouped: bool) -> float:
    """Bytes of the copies eager attention makes around the fused core, per rank:
    the output's contiguous transpose (read and write ``v_out``) and, where K and V
    have fewer heads than Q (``grouped``), ``repeat_kv``'s K and V (each reads
    ``kv_width`` and writes ``q_width``)."""
    copies = 2.0 * v_out
    if grouped:
        copies += 2.0 * (kv_width + q_width)
    return tokens * copies * ab
