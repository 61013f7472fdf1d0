"""The kernels' integer codes mirror the enums defined once in spaces.enums."""

from __future__ import annotations

import pytest

from kernels import codes
from spaces.enums import Dtype, Feasibility, Optimizer, Reason, Recompute, Schedule, label, labels, parse

MIRRORS = [
    (Recompute.NONE, codes.RECOMPUTE_NONE),
    (Recompute.SELECTIVE, codes.RECOMPUTE_SELECTIVE),
    (Recompute.FULL, codes.RECOMPUTE_FULL),
    (Schedule.GPIPE, codes.SCHEDULE_GPIPE),
    (Schedule.ONE_F_ONE_B, codes.SCHEDULE_1F1B),
    (Schedule.INTERLEAVED, codes.SCHEDULE_INTERLEAVED),
    (Schedule.ZB_H1, codes.SCHEDULE_ZB_H1),
    (Optimizer.ADAM, codes.OPTIMIZER_ADAM),
    (Optimizer.ADAM_8BIT, codes.OPTIMIZER_ADAM_8BIT),
    (Optimizer.CPU_ADAM, codes.OPTIMIZER_CPU_ADAM),
    (Feasibility.OK, codes.FEASIBLE_OK),
    (Feasibility.OUT_OF_MEMORY, codes.FEASIBLE_OUT_OF_MEMORY),
]


@pytest.mark.parametrize(("member", "code"), MIRRORS, ids=lambda x: str(x))
def test_kernel_code_equals_enum(member, code):
    assert int(member) == code


def test_every_kernel_enum_member_is_mirrored():
    mirrored = {m for m, _ in MIRRORS}
    for enum in (Recompute, Schedule, Optimizer, Feasibility):
        assert set(enum) <= mirrored, f"{enum.__name__} has members the kernels do not know"


def test_labels_round_trip():
    for enum in (Recompute, Schedule, Optimizer, Dtype, Feasibility, Reason):
        for member in enum:
            assert parse(enum, label(member)) is member
    assert labels(Schedule) == ["gpipe", "1f1b", "interleaved", "zb-h1"]


def test_parse_unknown_names_the_choices():
    with pytest.raises(ValueError, match=r"'partial' is not one of \['none', 'selective', 'full'\]"):
        parse(Recompute, "partial")


def test_reason_codes_are_dense_from_zero():
    assert [int(r) for r in Reason] == list(range(len(Reason)))
