"""The optimizer step and the optimizer states' bytes, per optimizer
(``kernels.codes`` OPTIMIZER_*). modeling.md section 7."""

from __future__ import annotations

import numpy as np

from paraspace.kernels.jit import jit
from paraspace.kernels.ops import memory_bound_s

#: bytes per parameter touched by one Adam step on its shard: read fp32 master,
#: m, v and gradient (16), write master, m, v (12), write the 16-bit weight (2),
#: one more gradient read for clipping (4)
ADAM_BYTES_PER_PARAM = 34.0
#: ZeRO-Offload's CPU Adam: host DRAM bytes per parameter (read and write fp32
#: master, m, v: 24; read the 16-bit gradient, write the 16-bit weight: 4) and
#: PCIe bytes per parameter (16-bit gradient down, 16-bit weight up: 2 + 2, one
#: after the other: the update waits for the gradients, the weights for the update)
CPU_ADAM_HOST_BYTES = 28.0
CPU_ADAM_LINK_BYTES = 4.0
#: Per optimizer (index = kernels.codes OPTIMIZER_*: adam, adam-8bit, cpu-adam,
#: adam-no-master, adam-8bit-paged, adam-bf16). Optimizer states as fractions of the
#: workload's fp32 Adam states (master + m + v, optimizer_bytes = 12), on the
#: device and on the host:
#:   adam 12 of 12 on the device; adam-8bit m and v of one byte each beside the
#:   fp32 master, 6 of 12; cpu-adam all 12 on the host; adam-no-master fp32 m and
#:   v, 8 of 12 (the 16-bit weights are updated in place); adam-8bit-paged the
#:   8-bit m and v, 2 of 12, in host memory (bitsandbytes' paged optimizers; no
#:   fp32 master: the 16-bit weights are updated in place); adam-bf16 bf16 m and
#:   v, 4 of 12. The chunk being updated is transient and not counted.
#: (numpy arrays, which numba freezes as constants indexable at run time)
OPT_STATE_FRACTION = np.array([1.0, 0.5, 0.0, 8.0 / 12.0, 0.0, 4.0 / 12.0])
OPT_HOST_STATE_FRACTION = np.array([0.0, 0.0, 1.0, 0.0, 2.0 / 12.0, 0.0])
#: Stored gradients as a fraction of the workload's gradient bytes (fp32, 4):
#: adam-bf16 keeps them in bf16, 2 of 4 (FSDP reduces them in fp32 all the same,
#: and accumulates a deferred reduction in fp32: ``kernels.memory``)
OPT_GRAD_FRACTION = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.5])
#: 1 where the optimizer keeps an fp32 master copy of its parameters on the device (adam,
#: adam-8bit): a ZeRO-3 shard stored as that master alone (FSDP's mixed precision,
#: ``kernels.memory.stage_state_bytes``) needs no 16-bit copy beside it. cpu-adam keeps
#: its master on the host, and the others have none: their 16-bit weights are the
#: parameters the step updates
OPT_DEVICE_MASTER = np.array([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
#: HBM bytes per parameter of the step on the device:
#:   adam 34 (ADAM_BYTES_PER_PARAM); adam-8bit: read master 4, m+v 2, grad 4;
#:   write master 4, m+v 2, weight 2; clip read 4 = 22; cpu-adam none;
#:   adam-no-master: read weight 2, m 4, v 4, grad 4 (14); write weight 2, m 4,
#:   v 4 (10); clip read 4 = 28; adam-8bit-paged: read weight 2, m+v 2 (paged
#:   in), grad 4 (8); write weight 2, m+v 2 (4); clip read 4 = 16 (the page
#:   copies' own HBM traffic runs at the host link's pace, counted there);
#:   adam-bf16: read weight, m, v and gradient 2 each (8), write weight, m, v (6),
#:   clip read 2 = 16
OPT_DEVICE_STEP_BYTES = np.array([ADAM_BYTES_PER_PARAM, 22.0, 0.0, 28.0, 16.0, 16.0])
#: host-link bytes per parameter on the step's critical path: cpu-adam 2 + 2 in
#: sequence; adam-8bit-paged pages m and v (2 bytes) in and the updated ones out,
#: chunk by chunk: the write-back of one chunk overlaps the fetch of the next on
#: the full-duplex link, so 2 bytes each way cost the time of 2
OPT_LINK_BYTES = np.array([0.0, 0.0, CPU_ADAM_LINK_BYTES, 0.0, 2.0, 0.0])
#: host DRAM bytes per parameter streamed by a step on the CPU (cpu-adam only)
OPT_HOST_STEP_BYTES = np.array([0.0, 0.0, CPU_ADAM_HOST_BYTES, 0.0, 0.0, 0.0])


@jit
def optimizer_step_s(optimizer: int, shard: float, dev) -> float:
    """One optimizer step over ``shard`` parameters of this device: its host-link
    transfers, its host-memory stream on the CPU, then its pass on the device
    (one launch even when the device does no update, as for CPU Adam)."""
    return (OPT_LINK_BYTES[optimizer] * shard / dev.host_link_bytes_per_s
            + OPT_HOST_STEP_BYTES[optimizer] * shard / (dev.host_memory_bytes_per_s * dev.memory_efficiency)
            + memory_bound_s(OPT_DEVICE_STEP_BYTES[optimizer] * shard, 1.0, dev))
