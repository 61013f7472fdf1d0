"""Every enumerated value of paraspace, defined once.

Enums are small integers in the encoded arrays and in the kernels; their names
(the spelling used in TOML files, on the command line and in Parquet output)
live here. ``kernels.codes`` mirrors the integer values for jitted code (the
kernels package may not import this one); ``tests/test_enums.py`` pins the
mirror to these definitions.
"""

from __future__ import annotations

from enum import IntEnum


class Recompute(IntEnum):
    """Activation recomputation (Korthikanti et al. 2022, section 4)."""

    NONE = 0  #: keep every activation
    SELECTIVE = 1  #: recompute the attention core only
    FULL = 2  #: keep each layer's input, recompute the whole layer
    NORMS = 3  #: recompute the two norms only: their outputs (the QKV and MLP inputs) are not kept
    MOE_DISPATCH = 4  #: MoE layers keep no dispatched rows (expert inputs): the backward redoes the dispatch
    #: per-op selective checkpointing (torchtitan's ``selective`` ``op`` policy): every other GEMM
    #: output in forward order and the attention output are kept; the norms, residual adds,
    #: activation function and the other GEMMs run again in the backward
    SELECTIVE_OPS = 5


class Schedule(IntEnum):
    """Pipeline schedule (modeling.md section 6)."""

    GPIPE = 0  #: all forwards, then all backwards; holds m micro-batches
    ONE_F_ONE_B = 1  #: warm-up, steady one-forward-one-backward, cool-down
    INTERLEAVED = 2  #: interleaved 1F1B with vpp virtual chunks per device
    ZB_H1 = 3  #: zero-bubble ZB-H1 (Qi et al. 2023): backward split into B and W, W fills the cool-down
    DUALPIPE = 4  #: DualPipe (DeepSeek-V3): micro-batches fed from both ends, two stages' parameters per device
    PIPEDREAM = 5  #: PipeDream asynchronous 1F1B with weight stashing: no flush, up to p - stage weight versions


class Optimizer(IntEnum):
    """Where and how the optimizer step runs (issue 9's memory knobs)."""

    ADAM = 0  #: Adam on the device: fp32 master, m and v (12 bytes/param)
    ADAM_8BIT = 1  #: blockwise 8-bit Adam (Dettmers et al. 2022): 8-bit m and v, fp32 master (6 bytes/param)
    CPU_ADAM = 2  #: ZeRO-Offload: states and the Adam step on the host, gradients down and weights up over PCIe
    ADAM_NO_MASTER = 3  #: Adam without fp32 master weights: 16-bit weights updated in place, fp32 m and v (8 bytes/param)
    ADAM_8BIT_PAGED = 4  #: paged 8-bit Adam (bitsandbytes): 8-bit m and v in host memory, paged in chunk by chunk for the device step
    #: pure bf16: the model cast to bf16 and trained so (KempnerForge's ``model.to(bf16)``):
    #: bf16 weights updated in place, bf16 gradients, bf16 m and v (torch's Adam keeps
    #: its moments in the parameter's dtype): 8 bytes/param
    ADAM_BF16 = 5


class Dispatch(IntEnum):
    """How MoE tokens reach their experts and come back (modeling.md section 4)."""

    ALLGATHER = 0  #: all-gather every token of the EP group, permute locally; combine by reduce-scatter
    ALLTOALL = 1  #: all-to-all(v): a token goes only to the ranks hosting its experts
    HIERARCHICAL = 2  #: DeepEP-style: one NIC transfer per (token, destination node), then intra-node forwarding
    SENDRECV_ALLGATHER = 3  #: inter-node send/recv of every token, then an intra-node all-gather (the documents' EP32 plan)
    SENDRECV_ALLGATHER_SPLIT = 4  #: the same with the intra-node part split in halves, overlapped with the inter-node one
    LOW_LATENCY = 5  #: DeepEP low-latency kernels: every copy straight over RDMA (also inside a node), all at once


class Placement(IntEnum):
    """Where the expert-parallel group lies in the rank layout of a stage."""

    INNER = 0  #: EP ranks adjacent (stride = expert TP): inside a node as far as it fits
    OUTER = 1  #: EP ranks spread (stride = expert TP x expert DP): across nodes, expert DP inside


class Collective(IntEnum):
    """Collective operations; the keys of per-operation link bandwidths."""

    ALL_REDUCE = 0
    ALL_GATHER = 1
    REDUCE_SCATTER = 2
    ALL_TO_ALL = 3
    SEND_RECV = 4
    BROADCAST = 5  #: one root's buffer to every rank (nccl-tests bus factor 1)
    REDUCE = 6  #: every rank's buffer summed onto one root (nccl-tests bus factor 1)


class AllReduceAlgorithm(IntEnum):
    """How a link tier runs an all-reduce (``LinkTier.allreduce_algorithm``)."""

    RING = 0  #: reduce-scatter then all-gather around a ring: 2(n-1) steps, 2(n-1)/n of the buffer
    TREE = 1  #: NCCL's double binary tree: 2 ceil(log2 n) steps, twice the buffer (each tree carries half)
    AUTO = 2  #: the faster of the two for the message, as NCCL's tuner picks


class Dtype(IntEnum):
    """GEMM precision of a training run."""

    BF16 = 0
    FP16 = 1
    FP8 = 2
    TF32 = 3
    FP32 = 4
    INT8 = 5
    FP4 = 6  #: 4-bit floating point (NVFP4 / MXFP4 on Blackwell)


#: bytes per element of each precision (``Dtype``), as its operands are stored
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "tf32": 4.0, "fp32": 4.0, "int8": 1.0, "fp4": 0.5}


class Reason(IntEnum):
    """Why a combination of strategy values is not a candidate.

    The encoder applies the rules in this order; a dropped combination is
    charged to the first rule it breaks. ``VALID`` marks a kept row.
    """

    VALID = 0
    DEVICE_COUNT = 1  #: tp * pp * dp * cp != devices (derived dp: tp * pp * cp does not divide devices)
    TP_HEADS = 2  #: tp does not divide heads, kv_heads or ffn
    PP_LAYERS = 3  #: pp * vpp does not divide the layers (uneven_layers: a virtual chunk would hold none)
    CP_SEQUENCE = 4  #: cp > 1 and 2 * cp does not divide the sequence (load-balanced causal CP)
    BATCH = 5  #: dp * micro_batch does not divide the global batch (rows with a dp only)
    VPP_SCHEDULE = 6  #: vpp > 1 needs the interleaved schedule and it needs vpp > 1
    INTERLEAVE_MICROBATCHES = 7  #: interleaving needs micro-batches divisible by pp (rows with a dp only)
    PP1_SCHEDULE = 8  #: with pp == 1 the schedules coincide; only 1f1b is kept
    SP_WITHOUT_TP = 9  #: sequence parallel with tp == 1 is the same row without it
    ZERO_WITHOUT_DP = 10  #: ZeRO with dp * cp == 1 shards nothing (rows with a dp only)
    TP_OVERLAP_WITHOUT_SP = 11  #: TP comm overlap needs sequence parallelism (Megatron-LM)
    EP_DENSE = 12  #: ep > 1 or expert TP > 1 on a dense model
    EP_EXPERTS = 13  #: ep does not divide the routed experts, or expert TP the expert FFN width
    EP_GROUP = 14  #: ep * expert TP does not divide the stage's tp * cp * dp ranks (rows with a dp only)
    EP1_DISPATCH = 15  #: with ep == 1 there is no dispatch: only the default algorithm, placement and no overlap kept
    RECOMPUTE_LAYERS = 16  #: recompute_layers > 0 (recompute only the last k layers of each device) needs recompute = full
    WEIGHT_OFFLOAD = 17  #: streaming weights from the host needs the optimizer on the host (cpu-adam)
    DUALPIPE_SHAPE = 18  #: DualPipe needs an even pp and an even number of micro-batches (rows with a dp only)
    MOE_RECOMPUTE_DENSE = 19  #: recompute = moe-dispatch on a dense model: no dispatch to redo, the same row as none
    #: defer_grad_sync needs ZeRO-3 and more than one micro-batch per step (rows with a dp only)
    DEFER_WITHOUT_ACCUMULATION = 20


class Feasibility(IntEnum):
    """Whether an evaluated candidate can run, and if not why."""

    OK = 0
    OUT_OF_MEMORY = 1  #: peak device memory exceeds HBM capacity (or a study's --max-mem cap)
    OUT_OF_HOST_MEMORY = 2  #: offloaded tensors exceed the host memory available per device


#: How each enum is spelt in TOML, on the command line and in Parquet.
#: Lower-case member names, except where the field's literature spells it otherwise.
_SPELLING: dict[type[IntEnum], dict[IntEnum, str]] = {
    Schedule: {Schedule.GPIPE: "gpipe", Schedule.ONE_F_ONE_B: "1f1b", Schedule.INTERLEAVED: "interleaved",
               Schedule.ZB_H1: "zb-h1"},
    Recompute: {Recompute.MOE_DISPATCH: "moe-dispatch", Recompute.SELECTIVE_OPS: "selective-ops"},
    Optimizer: {Optimizer.ADAM: "adam", Optimizer.ADAM_8BIT: "adam-8bit", Optimizer.CPU_ADAM: "cpu-adam",
                Optimizer.ADAM_NO_MASTER: "adam-no-master", Optimizer.ADAM_8BIT_PAGED: "adam-8bit-paged",
                Optimizer.ADAM_BF16: "adam-bf16"},
    Dispatch: {Dispatch.SENDRECV_ALLGATHER: "sendrecv-allgather", Dispatch.SENDRECV_ALLGATHER_SPLIT: "sendrecv-allgather-split",
               Dispatch.LOW_LATENCY: "low-latency"},
}


def label(member: IntEnum) -> str:
    """The user-facing name of an enum member (``Recompute.FULL`` -> ``"full"``)."""
    return _SPELLING.get(type(member), {}).get(member, member.name.lower())


def labels(enum: type[IntEnum]) -> list[str]:
    """User-facing names of every member, in value order."""
    return [label(m) for m in sorted(enum)]


def parse(enum: type[IntEnum], text: str) -> IntEnum:
    """The member of ``enum`` spelt ``text``; ``ValueError`` naming the choices otherwise."""
    for member in enum:
        if label(member) == text:
            return member
    raise ValueError(f"{text!r} is not one of {labels(enum)}")
