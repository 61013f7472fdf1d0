"""The graph build keeps reference counting out of its loops.

``kernels.pipeline.build_step_recipe``'s pieces are spliced into it at IR level
and each binds the ``Build`` record of arrays: an atomic incref and decref per
array, which LLVM's reference-count pruning must remove (the rules in the
records' comment of ``kernels/pipeline.py``). A piece that breaks them leaves
~20 atomic operations per pass and slows the build 5-10x without changing a
number, so the golden digests cannot see it; this test can. It compiles an
uncached copy (the cached dispatcher cannot be inspected) and counts the
increfs left in the build's LLVM IR: what remains is one-off (the arguments'
records, each device's compute order); one unpruned binding of ``Build`` adds
one per array of it.
"""

from __future__ import annotations

import re

import numba
import numpy as np

from paraspace.kernels import pipeline
from paraspace.kernels.codes import SCHEDULE_DUALPIPE
from paraspace.kernels.jit import OPTIONS

#: increfs left on the code of this commit: 11
MAX_INCREFS = 16


def test_build_prunes_the_reference_counts_of_its_pieces():
    assert len(pipeline.Build._fields) > MAX_INCREFS - 11  # one unpruned binding exceeds the bound
    fresh = numba.njit(**{**OPTIONS, "cache": False})(pipeline.build_step_recipe.py_func)
    p, v = 2, 1
    ones = np.ones((p, v), np.int64)
    fresh(SCHEDULE_DUALPIPE, p, v, 2, ones, ones, ones, 1, 0, 0, 1, 1, 1, 1, 2, 0, 0, 1,
          np.ones((p, v, 4), np.int64), 0, 1, True)
    llvm = fresh.inspect_llvm(fresh.signatures[0])
    body = re.search(r"^define[^\n]*build_step_recipe.*?^}", llvm, re.S | re.M)
    assert body is not None
    increfs = body.group(0).count("@NRT_incref(")
    assert increfs <= MAX_INCREFS, (
        f"build_step_recipe keeps {increfs} reference-count increments (at most {MAX_INCREFS}): a piece "
        "binds Build where LLVM cannot prune it; see the rules above kernels.pipeline.StepShape")
