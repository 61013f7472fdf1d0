"""The row kernels' strategy arguments as the tests spell them (short keys, in
``explorer.evaluate.KERNEL_ARGS`` order, with the dtypes ``spaces.encode``
gives them), their defaults, and packing strategy dicts into columns."""

from __future__ import annotations

import numpy as np

#: (test key, dtype) per strategy argument of evaluate_rows / simulate_rows, in order
COLUMNS = (("tp", np.int32), ("pp", np.int32), ("dp", np.int32), ("cp", np.int32), ("vpp", np.int32),
           ("mb", np.int32), ("recompute", np.int8), ("sp", np.int8), ("tpo", np.int8), ("zero", np.int8),
           ("opt", np.int8), ("schedule", np.int8), ("ep", np.int32), ("etp", np.int32), ("placement", np.int8),
           ("dispatch", np.int8), ("tbo", np.int8), ("rc_layers", np.int32), ("off_act", np.int8), ("off_w", np.int8),
           ("n_micro", np.int32))
#: every argument at its default (spaces.schema.Dimensions: 1f1b = 1, alltoall = 1); one micro-batch
DEFAULTS = dict(tp=1, pp=1, dp=1, cp=1, vpp=1, mb=1, recompute=0, sp=0, tpo=0, zero=0, opt=0, schedule=1, ep=1, etp=1,
                placement=0, dispatch=1, tbo=0, rc_layers=0, off_act=0, off_w=0, n_micro=1)


#: ``kernels.training.row_costs``'s strategy arguments, in order
COST_ARGS = ("tp", "pp", "dp", "cp", "mb", "recompute", "sp", "tpo", "zero", "opt", "schedule", "ep", "etp",
             "placement", "dispatch", "tbo", "off_act", "off_w")


def cost_args(**strategy: int) -> tuple:
    """``row_costs``' strategy arguments for ``strategy`` (DEFAULTS for the rest) at the
    encoder's dtypes: Python ints would compile the whole kernel a second time, for
    int64 (12 s cold on 2 cores)."""
    dtypes = dict(COLUMNS)
    full = {**DEFAULTS, **strategy}
    return tuple(dtypes[k](full[k]) for k in COST_ARGS)


def columns(strategies: list[dict], base: dict) -> list[np.ndarray]:
    """One array per argument, a row per strategy (``base`` fills what a strategy omits)."""
    return [np.array([{**base, **s}[name] for s in strategies], dtype=dtype) for name, dtype in COLUMNS]
