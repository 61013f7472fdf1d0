"""Integer codes of the enums the kernels branch on.

Mirrors ``spaces.enums`` (kernels may not import spaces): the values are
pinned to those definitions by ``tests/test_enums.py``.
"""

# spaces.enums.Recompute
RECOMPUTE_NONE = 0
RECOMPUTE_SELECTIVE = 1
RECOMPUTE_FULL = 2
RECOMPUTE_NORMS = 3
RECOMPUTE_MOE_DISPATCH = 4
RECOMPUTE_SELECTIVE_OPS = 5

# spaces.enums.Schedule
SCHEDULE_GPIPE = 0
SCHEDULE_1F1B = 1
SCHEDULE_INTERLEAVED = 2
SCHEDULE_ZB_H1 = 3
SCHEDULE_DUALPIPE = 4
SCHEDULE_PIPEDREAM = 5

# spaces.enums.Optimizer
OPTIMIZER_ADAM = 0
OPTIMIZER_ADAM_8BIT = 1
OPTIMIZER_CPU_ADAM = 2
OPTIMIZER_ADAM_NO_MASTER = 3
OPTIMIZER_ADAM_8BIT_PAGED = 4
OPTIMIZER_ADAM_BF16 = 5

# spaces.enums.Dispatch
DISPATCH_ALLGATHER = 0
DISPATCH_ALLTOALL = 1
DISPATCH_HIERARCHICAL = 2
DISPATCH_SENDRECV_ALLGATHER = 3
DISPATCH_SENDRECV_ALLGATHER_SPLIT = 4
DISPATCH_LOW_LATENCY = 5

# ZeRO stages as the kernels take them: the space's zero (0 none, 1 optimizer states,
# 2 + gradients, 3 + parameters) and, for a ZeRO-3 row with defer_grad_sync,
# ZERO_3_DEFERRED: parameters and optimizer states sharded, the micro-batches'
# gradients accumulated unsharded and reduce-scattered once, after the last one
# (FSDP2 set_requires_gradient_sync(False) / FSDP1 no_sync on all but the last
# micro-batch); explorer.evaluate.kernel_zero derives it
ZERO_3 = 3
ZERO_3_DEFERRED = 4

# spaces.enums.Placement
PLACEMENT_INNER = 0
PLACEMENT_OUTER = 1

# spaces.enums.Feasibility
FEASIBLE_OK = 0
FEASIBLE_OUT_OF_MEMORY = 1
FEASIBLE_OUT_OF_HOST_MEMORY = 2

# spaces.enums.Collective (kernels.collectives)
ALL_REDUCE = 0
ALL_GATHER = 1
REDUCE_SCATTER = 2
ALL_TO_ALL = 3
SEND_RECV = 4
BROADCAST = 5
REDUCE = 6

#: (name, code) of each collective, for tables and tests
COLLECTIVES = (
    ("all_reduce", ALL_REDUCE),
    ("all_gather", ALL_GATHER),
    ("reduce_scatter", REDUCE_SCATTER),
    ("all_to_all", ALL_TO_ALL),
    ("send_recv", SEND_RECV),
    ("broadcast", BROADCAST),
    ("reduce", REDUCE),
)

# spaces.enums.AllReduceAlgorithm (kernels.params.TIER.allreduce_algorithm)
ALLREDUCE_RING = 0
ALLREDUCE_TREE = 1
ALLREDUCE_AUTO = 2
