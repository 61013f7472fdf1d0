"""The serving analytic tier computes ``kv_s_per_token`` once per run of rows
that share a replica (``explorer.serve.replica_runs``, ``analytic_rows``'s
``run_of``): the same numbers, bit for bit, as once per row."""

from __future__ import annotations

import numpy as np
import pytest

from paraspace.explorer import serve
from paraspace.kernels import inference
from paraspace.kernels import serving as ks
from paraspace.spaces import serving as sp


@pytest.mark.parametrize("name", sp.names())
def test_runs_give_the_rows_results_bit_for_bit(name):
    space = sp.load_serving(name)
    cols = serve.encode(space).columns
    packed = serve.pack_serving(space)
    srv = serve.serving_records(space, cols)
    prefill = serve.serving_records(space, cols, prefill=True)
    args = (packed.model, packed.devs, packed.tiers, packed.tiles, srv, prefill, cols["dtype"], cols["mode"],
            cols["max_batch"], cols["max_tokens"], cols["scheduler"], cols["overlap_scheduler"], cols["instances"],
            cols["prefill_instances"], packed.workload)
    runs = serve.replica_runs(srv, cols["dtype"])
    assert runs[-1] + 1 < len(runs) / 2  # the rows of a replica do run together
    per_row = ks.analytic_rows(*args)
    assert np.array_equal(ks.analytic_rows(*args, runs), per_row, equal_nan=True)
    # a shuffled order breaks the runs up, and the rows still get their own results
    order = np.random.default_rng(1).permutation(len(runs))
    shuffled = {k: np.ascontiguousarray(v[order]) for k, v in cols.items()}
    srv_s, prefill_s = srv[order], prefill[order]
    out = ks.analytic_rows(packed.model, packed.devs, packed.tiers, packed.tiles, srv_s, prefill_s, shuffled["dtype"],
                           shuffled["mode"], shuffled["max_batch"], shuffled["max_tokens"], shuffled["scheduler"],
                           shuffled["overlap_scheduler"], shuffled["instances"], shuffled["prefill_instances"], packed.workload,
                           serve.replica_runs(srv_s, shuffled["dtype"]))
    assert np.array_equal(out, per_row[order], equal_nan=True)


def test_a_run_holds_one_replica():
    """Rows of one run differ at most in batch_cap (the row's max_batch, which the serving
    kernels never read); a run changes where any other field or the precision does."""
    srv = np.zeros(6, inference.SERVING)
    srv["tp"] = [1, 1, 1, 2, 2, 2]
    srv["batch_cap"] = [8, 16, 8, 8, 16, 16]
    dtype = np.array([0, 0, 2, 2, 2, 2], np.int8)
    assert serve.replica_runs(srv, dtype).tolist() == [0, 0, 1, 2, 2, 2]
    assert serve.replica_runs(srv[:1], dtype[:1]).tolist() == [0]
    assert serve.replica_runs(srv[:0], dtype[:0]).tolist() == []
