"""Record layouts in which hardware, model and workload parameters reach the kernels.

Each is a numpy structured dtype; a caller fills a one-element array and the
kernels read fields by name (numba compiles record access to a load at a fixed
offset). All values are SI: seconds, bytes, FLOP, bytes/s.
"""

from __future__ import annotations

import numpy as np

#: points a link's bandwidth-vs-size curve and a device's measured GEMM table may
#: hold (fixed-size fields of the records below; ``explorer.evaluate.pack`` refuses more)
MAX_CURVE_POINTS = 16
MAX_GEMM_POINTS = 64
#: collectives a tier may carry a measured bandwidth for (kernels.codes ALL_REDUCE..REDUCE)
N_COLLECTIVES = 7

#: One device of the cluster.
DEVICE = np.dtype(
    [
        ("peak_flops_per_s", np.float64),  # dense peak of the GEMM precision in use
        ("peak_16bit_flops_per_s", np.float64),  # dense 16-bit peak (0: the same as peak_flops_per_s)
        ("hbm_bytes_per_s", np.float64),
        ("hbm_capacity_bytes", np.float64),
        ("compute_units", np.float64),
        ("launch_s", np.float64),
        ("gemm_max_efficiency", np.float64),
        ("gemm_k_fill", np.float64),  # k elements a GEMM tile's fixed part is worth (schema Device.gemm_k_fill_bytes)
        # the same in 16-bit elements, for the GEMMs an 8-bit recipe keeps in 16 bits (0: gemm_k_fill)
        ("gemm_k_fill_16bit", np.float64),
        # extra compute time of the precision's GEMMs under their scaling recipe (0: none;
        # schema Device.gemm_scaling_overhead)
        ("gemm_scaling_overhead", np.float64),
        ("attention_efficiency", np.float64),
        ("memory_efficiency", np.float64),
        ("memory_overhead_bytes", np.float64),  # fixed: CUDA context, workspace
        ("memory_fragmentation", np.float64),  # allocator fragmentation, a fraction of the tensors' bytes
        ("comm_buffer_bytes", np.float64),  # communication buffers per process group
        ("host_link_bytes_per_s", np.float64),  # PCIe to the host, each direction
        ("host_memory_bytes_per_s", np.float64),  # host DRAM bandwidth per device
        ("host_capacity_bytes", np.float64),  # host DRAM for offloaded tensors per device
        ("kernel_fusion", np.float64),  # 1: fused elementwise kernels (spaces.schema.Device.kernel_fusion)
        # measured GEMM efficiency points (m, n, k, achieved/peak); n_gemm of them are used
        ("n_gemm", np.float64),
        ("gemm_m", np.float64, (MAX_GEMM_POINTS,)),
        ("gemm_n", np.float64, (MAX_GEMM_POINTS,)),
        ("gemm_k", np.float64, (MAX_GEMM_POINTS,)),
        ("gemm_eff", np.float64, (MAX_GEMM_POINTS,)),
    ]
)

#: One link tier, innermost first. domain_devices = 0 marks the outermost tier.
TIER = np.dtype(
    [
        ("domain_devices", np.float64),
        ("bytes_per_s", np.float64),  # achieved: bandwidth x efficiency / shared_by
        ("latency_s", np.float64),
        # achieved bandwidth of each collective (index = kernels.codes op) / bytes_per_s:
        # 1 unless measured, so that scaling bytes_per_s scales every operation
        ("op_scale", np.float64, (N_COLLECTIVES,)),
        # bandwidth-vs-message-size curve: n_curve points (bytes, fraction), ascending
        ("n_curve", np.float64),
        ("curve_bytes", np.float64, (MAX_CURVE_POINTS,)),
        ("curve_fraction", np.float64, (MAX_CURVE_POINTS,)),
        # kernels.codes ALLREDUCE_RING / _TREE / _AUTO (spaces.schema.LinkTier.allreduce_algorithm);
        # 0 = ring, so a table built without it keeps the ring algorithm
        ("allreduce_algorithm", np.float64),
    ]
)

#: A transformer, dense or MoE, MHA/GQA or MLA (0 in the MoE / MLA fields when absent).
MODEL = np.dtype(
    [
        ("layers", np.float64),
        ("hidden", np.float64),
        ("heads", np.float64),
        ("kv_heads", np.float64),
        ("head_dim", np.float64),
        ("ffn", np.float64),
        ("vocab", np.float64),
        ("glu", np.float64),
        ("bias", np.float64),
        ("tied_embeddings", np.float64),
        ("dropout", np.float64),
        ("experts", np.float64),  # routed experts per MoE layer (0: dense model)
        ("top_k", np.float64),
        ("expert_ffn", np.float64),
        ("shared_experts", np.float64),
        ("dense_layers", np.float64),  # the first layers keep a dense MLP
        ("max_nodes", np.float64),  # node-limited routing (0: none)
        ("mla", np.float64),  # 1: multi-head latent attention
        ("q_lora_rank", np.float64),
        ("kv_lora_rank", np.float64),
        ("qk_nope_head_dim", np.float64),
        ("qk_rope_head_dim", np.float64),
        ("v_head_dim", np.float64),
        ("mtp_depth", np.float64),
        ("sliding_window", np.float64),  # keys each query attends to (0: all)
    ]
)

#: What is being run: the step's shape and the byte widths of its tensors.
WORKLOAD = np.dtype(
    [
        ("global_batch", np.float64),
        ("seq_len", np.float64),
        ("act_bytes", np.float64),  # activations and weights in the GEMM precision's storage type
        ("weight_bytes", np.float64),
        ("grad_bytes", np.float64),  # main gradients (fp32 in Megatron's distributed optimizer)
        ("optimizer_bytes", np.float64),  # per parameter: fp32 master + Adam m + v = 12
        ("flash_attention", np.float64),
        # bytes moved per element to cast a 16-bit GEMM operand to 8 bits (read 2, write 1)
        # when the GEMM precision is 8-bit (FP8 recipes cast activations, weights and
        # output gradients every pass); 0 for 16-bit GEMMs
        ("gemm_cast_bytes", np.float64),
        # busiest expert rank's routed rows / the mean; DERIVED_IMBALANCE (0): from
        # uniform random routing of each row's tokens (kernels.routing)
        ("moe_imbalance", np.float64),
        ("quantize_attention", np.float64),  # 1: attention projections in the GEMM precision too; 0: 16-bit
        ("loss_bytes", np.float64),  # bytes per logit element the loss holds at its peak (LOSS_BYTES)
        # 1: the layers' elementwise work runs as eager PyTorch ops, op by op
        # (kernels.elementwise), and keeps what those keep besides
        # (kernels.memory.eager_bytes_per_layer); 0: fused kernels (SpaceSpec.elementwise)
        ("eager_elementwise", np.float64),
        # 1: full recompute stops once the last tensor the backward reads is rebuilt
        # (PyTorch's non-reentrant checkpoint; SpaceSpec.checkpoint = "early-stop"): a
        # dense layer's down projection is not rerun; 0: the whole forward again
        ("checkpoint_early_stop", np.float64),
        # 1: a ZeRO-3 device stores its own parameter shard once, as the optimizer's fp32
        # master, and casts it to 16 bits as it gathers (PyTorch FSDP's mixed precision;
        # SpaceSpec.zero3_shard = "master"); 0: a 16-bit shard beside that master
        # (DeepSpeed ZeRO-3's partitioned fp16/bf16 parameters)
        ("zero3_master_shard", np.float64),
        # bytes per element of an MoE dispatch (the forward's tokens to their experts and
        # the backward's gradients before the down projections; DISPATCH_BYTES); combines
        # move act_bytes
        ("dispatch_bytes", np.float64),
    ]
)


def _has_default(dtype: np.dtype, name: str) -> bool:
    """Array-valued fields (tables) and their counts default to empty."""
    return dtype[name].shape != () or name.startswith("n_") or name in DEFAULTS


#: Bytes per logit element the loss holds at its peak, per ``SpaceSpec.cross_entropy``
#: (the last stage's activations, ``kernels.memory.stage_activation_bytes``):
#: fused (Megatron's vocab-parallel cross-entropy) upcasts the logits once and
#: computes the softmax and its gradient in place in that fp32 copy: 4;
#: unfused (``torch.nn.functional.cross_entropy`` over ``logits.float()``) keeps the
#: fp32 log-softmax for its backward, which then also holds the fp32 gradient
#: arriving from the loss and the fp32 gradient it returns: 3 x 4 = 12
LOSS_BYTES = {"fused": 4.0, "unfused": 12.0}

#: Bytes per element an MoE dispatch moves, per ``dispatch_dtype`` of a training or
#: serving space: bf16 2; fp8 one byte plus a float32 scale per 128 elements, the
#: 1 x 128 tiles DeepSeek-V3 quantizes activations in (arXiv 2412.19437, section
#: 3.3.2) and DeepEP's FP8 dispatch sends (deepseek-ai/DeepEP README: "dispatch FP8,
#: combine BF16"). DeepSeek-V3 dispatches in FP8 in training (section 3.3.3: the
#: activations before the up projections and the gradients before the down
#: projections; both combines stay BF16) and in serving (open-infra-index, the
#: V3/R1 inference system overview: FP8 dispatch, BF16 combine). Combines move
#: the activations' bytes.
DISPATCH_BYTES = {"bf16": 2.0, "fp8": 1.0 + 4.0 / 128.0}

#: ``moe_imbalance`` value that asks the kernels to derive the busiest expert
#: rank's load from the routing statistics (``kernels.routing.moe_imbalance``)
DERIVED_IMBALANCE = 0.0

#: scalar fields that may be omitted: the MoE / MLA description of a dense MHA
#: model (0), a device's GEMM refinements (none) and the routing imbalance (derived)
DEFAULTS = {
    **dict.fromkeys(("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "max_nodes", "mla",
                     "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "mtp_depth", "sliding_window", "kernel_fusion", "allreduce_algorithm",
                     "memory_fragmentation", "comm_buffer_bytes", "gemm_k_fill", "gemm_k_fill_16bit",
                     "gemm_scaling_overhead"), 0.0),
    "moe_imbalance": DERIVED_IMBALANCE,
    "quantize_attention": 1.0,
    "loss_bytes": LOSS_BYTES["fused"],
    "eager_elementwise": 0.0,
    "checkpoint_early_stop": 0.0,
    "zero3_master_shard": 0.0,
    "dispatch_bytes": DISPATCH_BYTES["bf16"],
    "peak_16bit_flops_per_s": 0.0,
}


def record(dtype: np.dtype, **values: float) -> np.ndarray:
    """A one-element record array of ``dtype``; every scalar field must be given
    except those in ``DEFAULTS`` and the tables (arrays and their ``n_*`` counts: empty).

    Returned as a ``np.recarray`` view (numba sees the same type) so that the
    kernels' attribute access also works with ``NUMBA_DISABLE_JIT=1``."""
    missing = {n for n in dtype.names or () if not _has_default(dtype, n)} - set(values)
    extra = set(values) - set(dtype.names or ())
    if missing or extra:
        raise ValueError(f"record {dtype}: missing {sorted(missing)}, unknown {sorted(extra)}")
    out = np.zeros(1, dtype=dtype)
    for key, value in DEFAULTS.items():
        if key in out.dtype.names:
            out[key] = value
    for key, value in values.items():
        out[key] = value
    return out.view(np.recarray)


def tier_table(levels: list[tuple[float, float, float]] | tuple[tuple[float, float, float], ...]) -> np.ndarray:
    """TIER records from ``(domain_devices, bytes_per_s, latency_s)``, innermost first
    (a ``np.recarray``, as ``record`` returns), every collective at ``bytes_per_s``,
    no size curve and ring all-reduce; set ``op_scale`` / the curve fields /
    ``allreduce_algorithm`` to refine."""
    out = np.zeros(len(levels), dtype=TIER)
    for i, (domain, bw, lat) in enumerate(levels):
        out["domain_devices"][i] = domain
        out["bytes_per_s"][i] = bw
        out["latency_s"][i] = lat
        out["op_scale"][i] = 1.0
    return out.view(np.recarray)
