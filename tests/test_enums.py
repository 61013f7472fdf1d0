"""The kernels' integer codes mirror the enums defined once in spaces.enums."""

from __future__ import annotations

import pytest

from paraspace.kernels import codes
from paraspace.spaces.enums import (
    AllReduceAlgorithm,
    Collective,
    Dispatch,
    Dtype,
    Feasibility,
    Optimizer,
    Placement,
    Reason,
    Recompute,
    Schedule,
    label,
    labels,
    parse,
)

MIRRORS = [
    (Recompute.NONE, codes.RECOMPUTE_NONE),
    (Recompute.SELECTIVE, codes.RECOMPUTE_SELECTIVE),
    (Recompute.FULL, codes.RECOMPUTE_FULL),
    (Recompute.NORMS, codes.RECOMPUTE_NORMS),
    (Recompute.MOE_DISPATCH, codes.RECOMPUTE_MOE_DISPATCH),
    (Recompute.SELECTIVE_OPS, codes.RECOMPUTE_SELECTIVE_OPS),
    (Schedule.GPIPE, codes.SCHEDULE_GPIPE),
    (Schedule.ONE_F_ONE_B, codes.SCHEDULE_1F1B),
    (Schedule.INTERLEAVED, codes.SCHEDULE_INTERLEAVED),
    (Schedule.ZB_H1, codes.SCHEDULE_ZB_H1),
    (Schedule.DUALPIPE, codes.SCHEDULE_DUALPIPE),
    (Schedule.PIPEDREAM, codes.SCHEDULE_PIPEDREAM),
    (Optimizer.ADAM, codes.OPTIMIZER_ADAM),
    (Optimizer.ADAM_8BIT, codes.OPTIMIZER_ADAM_8BIT),
    (Optimizer.CPU_ADAM, codes.OPTIMIZER_CPU_ADAM),
    (Optimizer.ADAM_NO_MASTER, codes.OPTIMIZER_ADAM_NO_MASTER),
    (Optimizer.ADAM_8BIT_PAGED, codes.OPTIMIZER_ADAM_8BIT_PAGED),
    (Optimizer.ADAM_BF16, codes.OPTIMIZER_ADAM_BF16),
    (Feasibility.OK, codes.FEASIBLE_OK),
    (Feasibility.OUT_OF_MEMORY, codes.FEASIBLE_OUT_OF_MEMORY),
    (Feasibility.OUT_OF_HOST_MEMORY, codes.FEASIBLE_OUT_OF_HOST_MEMORY),
    (Dispatch.ALLGATHER, codes.DISPATCH_ALLGATHER),
    (Dispatch.ALLTOALL, codes.DISPATCH_ALLTOALL),
    (Dispatch.HIERARCHICAL, codes.DISPATCH_HIERARCHICAL),
    (Dispatch.SENDRECV_ALLGATHER, codes.DISPATCH_SENDRECV_ALLGATHER),
    (Dispatch.SENDRECV_ALLGATHER_SPLIT, codes.DISPATCH_SENDRECV_ALLGATHER_SPLIT),
    (Dispatch.LOW_LATENCY, codes.DISPATCH_LOW_LATENCY),
    (Placement.INNER, codes.PLACEMENT_INNER),
    (Placement.OUTER, codes.PLACEMENT_OUTER),
    (Collective.ALL_REDUCE, codes.ALL_REDUCE),
    (Collective.ALL_GATHER, codes.ALL_GATHER),
    (Collective.REDUCE_SCATTER, codes.REDUCE_SCATTER),
    (Collective.ALL_TO_ALL, codes.ALL_TO_ALL),
    (Collective.SEND_RECV, codes.SEND_RECV),
    (Collective.BROADCAST, codes.BROADCAST),
    (Collective.REDUCE, codes.REDUCE),
    (AllReduceAlgorithm.RING, codes.ALLREDUCE_RING),
    (AllReduceAlgorithm.TREE, codes.ALLREDUCE_TREE),
    (AllReduceAlgorithm.AUTO, codes.ALLREDUCE_AUTO),
]


@pytest.mark.parametrize(("member", "code"), MIRRORS, ids=lambda x: str(x))
def test_kernel_code_equals_enum(member, code):
    assert int(member) == code


def test_every_kernel_enum_member_is_mirrored():
    mirrored = {m for m, _ in MIRRORS}
    for enum in (Recompute, Schedule, Optimizer, Feasibility, Dispatch, Placement, Collective, AllReduceAlgorithm):
        assert set(enum) <= mirrored, f"{enum.__name__} has members the kernels do not know"


def test_labels_round_trip():
    for enum in (Recompute, Schedule, Optimizer, Dtype, Feasibility, Reason, Dispatch, Placement, Collective,
                 AllReduceAlgorithm):
        for member in enum:
            assert parse(enum, label(member)) is member
    assert labels(Schedule) == ["gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe", "pipedream"]
    assert labels(Recompute) == ["none", "selective", "full", "norms", "moe-dispatch", "selective-ops"]
    assert labels(Optimizer) == ["adam", "adam-8bit", "cpu-adam", "adam-no-master", "adam-8bit-paged", "adam-bf16"]
    assert labels(AllReduceAlgorithm) == ["ring", "tree", "auto"]


def test_collective_table_follows_the_enum():
    """kernels.codes.COLLECTIVES lists every Collective by its label, in code order."""
    assert codes.COLLECTIVES == tuple((label(m), int(m)) for m in sorted(Collective))


def test_parse_unknown_names_the_choices():
    choices = r"\['none', 'selective', 'full', 'norms', 'moe-dispatch', 'selective-ops'\]"
    with pytest.raises(ValueError, match=r"'partial' is not one of " + choices):
        parse(Recompute, "partial")


def test_reason_codes_are_dense_from_zero():
    assert [int(r) for r in Reason] == list(range(len(Reason)))
