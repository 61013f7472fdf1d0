"""Row-parallel entry points of the operator and collective kernels: arrays in,
an array of seconds out (for benchmarks and for callers that price many shapes
at once, e.g. a calibration table)."""

from __future__ import annotations

import numpy as np
from numba import prange

from paraspace.kernels.collectives import collective_time_s
from paraspace.kernels.jit import jit
from paraspace.kernels.ops import gemm_time_s


@jit(parallel=True)
def gemm_rows(m, n, k, device, tiles, dtype_bytes):
    """``gemm_time_s`` for every row of (m, n, k) on ``device[0]``."""
    out = np.empty(m.shape[0])
    for i in prange(m.shape[0]):
        # device[0] inside the loop: a record hoisted out of a prange fails to lower (numba)
        out[i] = gemm_time_s(m[i], n[i], k[i], device[0], tiles, dtype_bytes)
    return out


@jit(parallel=True)
def collective_rows(op, size, stride, size_bytes, tiers):
    """``collective_time_s`` for every row of (op, group size, stride, bytes)."""
    out = np.empty(op.shape[0])
    for i in prange(op.shape[0]):
        out[i] = collective_time_s(op[i], size[i], stride[i], size_bytes[i], tiers)
    return out
