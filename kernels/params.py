"""Record layouts in which hardware, model and workload parameters reach the kernels.

Each is a numpy structured dtype; a caller fills a one-element array and the
kernels read fields by name (numba compiles record access to a load at a fixed
offset). All values are SI: seconds, bytes, FLOP, bytes/s.
"""

from __future__ import annotations

import numpy as np

#: One device of the cluster.
DEVICE = np.dtype(
    [
        ("peak_flops_per_s", np.float64),  # dense peak of the GEMM precision in use
        ("hbm_bytes_per_s", np.float64),
        ("hbm_capacity_bytes", np.float64),
        ("compute_units", np.float64),
        ("launch_s", np.float64),
        ("gemm_max_efficiency", np.float64),
        ("attention_efficiency", np.float64),
        ("memory_efficiency", np.float64),
        ("memory_overhead_bytes", np.float64),
        ("host_link_bytes_per_s", np.float64),  # PCIe to the host, each direction
        ("host_memory_bytes_per_s", np.float64),  # host DRAM bandwidth per device
    ]
)

#: One link tier, innermost first. domain_devices = 0 marks the outermost tier.
TIER = np.dtype(
    [
        ("domain_devices", np.float64),
        ("bytes_per_s", np.float64),  # achieved: bandwidth x efficiency / shared_by
        ("latency_s", np.float64),
    ]
)

#: A dense transformer.
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
    ]
)

#: What is being run: the step's shape and the byte widths of its tensors.
WORKLOAD = np.dtype(
    [
        ("devices", np.float64),
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
    ]
)


def record(dtype: np.dtype, **values: float) -> np.ndarray:
    """A one-element record array of ``dtype``; every field must be given.

    Returned as a ``np.recarray`` view (numba sees the same type) so that the
    kernels' attribute access also works with ``NUMBA_DISABLE_JIT=1``."""
    missing = set(dtype.names or ()) - set(values)
    extra = set(values) - set(dtype.names or ())
    if missing or extra:
        raise ValueError(f"record {dtype}: missing {sorted(missing)}, unknown {sorted(extra)}")
    out = np.zeros(1, dtype=dtype)
    for key, value in values.items():
        out[key] = value
    return out.view(np.recarray)


def tier_table(levels: list[tuple[float, float, float]] | tuple[tuple[float, float, float], ...]) -> np.ndarray:
    """TIER records from ``(domain_devices, bytes_per_s, latency_s)``, innermost first
    (a ``np.recarray``, as ``record`` returns)."""
    out = np.zeros(len(levels), dtype=TIER)
    for i, level in enumerate(levels):
        out[i] = level
    return out.view(np.recarray)
