"""Direct enumeration against filtering the full product.

``Encoder`` enumerates the valid combinations block by block (``spaces.encode``'s
docstring); ``encode_by_filter`` builds every combination of a range and filters
it with the same rules. They must agree on every column (values, dtypes, order),
on ``first_reason`` and on ``breaks``, for any range, any ids and any space.
(``tests/test_encode.py`` checks the rules themselves against plain Python.)
"""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.spaces import catalog
from paraspace.spaces import encode as encode_mod
from paraspace.spaces.catalog import load_space, space_from_raw
from paraspace.spaces.encode import (
    DIMENSION_NAMES,
    GROUPS,
    PREFIX_REASONS,
    SUFFIX_RULES,
    Encoder,
    _prefix,
    encode_by_filter,
)
from paraspace.spaces.enums import Dispatch, Optimizer, Placement, Reason, Recompute, Schedule, labels

ROOT = Path(__file__).resolve().parents[1]
BENCH_SPACES = sorted((ROOT / "bench" / "spaces").glob("*.toml"))
CALCULON = ROOT / "bench" / "spaces" / "gpt3-175b-a100-512-calculon.toml"


def make(*, dims: dict | None = None, **top):
    raw = {"name": "t", "description": "a test space", "model": "llama3-8b", "hardware": "h100-sxm5-80gb",
           "devices": 8, "global_batch": 8, "seq_len": 4096, **top}
    if dims is not None:
        raw["dimensions"] = dims
    return space_from_raw(raw, "test", Path(__file__).parent)


def assert_same(got, want, what="") -> None:
    assert list(got.columns) == list(want.columns), what
    for name, col in want.columns.items():
        assert got.columns[name].dtype == col.dtype, (what, name)
        np.testing.assert_array_equal(got.columns[name], col, err_msg=f"{what} {name}")
    assert got.n_combinations == want.n_combinations, what
    np.testing.assert_array_equal(got.first_reason, want.first_reason, err_msg=f"{what} first_reason")
    np.testing.assert_array_equal(got.breaks, want.breaks, err_msg=f"{what} breaks")


def check_range(encoder: Encoder, start: int, stop: int) -> None:
    assert_same(encoder.encode(start, stop), encode_by_filter(encoder, np.arange(start, stop, dtype=np.int64)),
                f"rows {start}:{stop}")


def ranges(encoder: Encoder, rng: np.random.Generator, n_random: int = 6, max_rows: int | None = None):
    """Ranges that start and stop on, just beside and inside block boundaries, plus random ones."""
    n, q = encoder.n_combinations, encoder.n_suffix
    cap = n if max_rows is None else max_rows
    out = [(0, min(n, cap)), (max(0, n - cap), n), (0, 1), (n - 1, n), (0, min(q, n)), (min(q, n) - 1, min(q + 1, n))]
    if n > q:
        b = q * int(rng.integers(1, n // q))  # a block boundary inside the space
        out += [(b, min(n, b + q)), (b - 1, min(n, b + 1)), (b + 1, min(n, b + 2 * q - 1)), (b - q + 3, b - 2),
                (max(0, b - 3 * q // 2), min(n, b + 3 * q // 2))]
    for _ in range(n_random):
        a = int(rng.integers(0, n))
        out.append((a, min(n, a + int(rng.integers(1, min(cap, n) + 1)))))
    return [(a, b) for a, b in out if 0 <= a < b <= n]


# --------------------------------------------------------------------------- structure


def test_groups_follow_the_rules():
    """Each rule's suffix columns lie in one group of consecutive dimensions: recompute with
    recompute_layers (RECOMPUTE_LAYERS), offload_activations alone (no rule), offload_weights
    to optimizer (WEIGHT_OFFLOAD spans sequence_parallel, tp_overlap, zero and defer_grad_sync,
    which DEFER_WITHOUT_ACCUMULATION reads with zero), schedule alone,
    ep to tbo (EP1_DISPATCH)."""
    named = [DIMENSION_NAMES[a:b] for a, b in GROUPS]
    assert named == [
        ("recompute", "recompute_layers"),
        ("offload_activations",),
        ("offload_weights", "sequence_parallel", "tp_overlap", "zero", "defer_grad_sync", "optimizer"),
        ("schedule",),
        ("ep", "expert_tp", "ep_placement", "dispatch", "tbo"),
    ]
    for rule in SUFFIX_RULES:
        assert len({g for g, (a, b) in enumerate(GROUPS) for d in rule.dims if d in DIMENSION_NAMES[a:b]}) == 1


def test_prefix_rules_come_first():
    space = make()
    cols = {n: np.ones(1, np.int32) for n in ("devices", "tp", "pp", "dp", "cp", "vpp", "micro_batch")}
    rules, terms = _prefix(space, cols)
    assert list(rules) == list(PREFIX_REASONS)
    assert max(PREFIX_REASONS) < min(r.reason for r in SUFFIX_RULES)
    assert sorted([*PREFIX_REASONS, *(r.reason for r in SUFFIX_RULES)]) == sorted(set(Reason) - {Reason.VALID})


def test_a_rule_sees_only_its_columns():
    """A rule is handed only the columns it names: one reading another fails loudly."""
    rule = next(r for r in SUFFIX_RULES if r.reason == Reason.WEIGHT_OFFLOAD)
    with pytest.raises(KeyError):
        rule.broken({}, {"offload_weights": np.ones(1, np.int8)}, make())


# --------------------------------------------------------------------------- hand-derived


def test_one_block_counted_by_hand():
    """llama3-8b on 2 devices, global batch 2: tp 1, pp 2, derived dp = 2 / 2 = 1, micro-batch 1,
    so 2 micro-batches. One block (every prefix dimension has one value) of
    2 sp x 2 tp_overlap x 3 zero x 3 schedules = 36 combinations, suffix position
    18 sp + 9 tpo + 3 zero + schedule. Its terms: vpp = 1, tp = 1, dp * cp = 1, pp and
    micro-batches even. Broken:
      VPP_SCHEDULE (vpp = 1 with interleaved):   36 / 3     = 12
      SP_WITHOUT_TP (sp with tp = 1):            36 / 2     = 18
      ZERO_WITHOUT_DP (zero > 0, dp * cp = 1):   36 * 2 / 3 = 24
      TP_OVERLAP_WITHOUT_SP (tpo, no sp):        36 / 4     =  9
      DUALPIPE_SHAPE: pp = 2 and 2 micro-batches are even:     0
    First reasons, in that order (not interleaved: 2/3; no sp: 1/2; zero 0: 1/3; no tpo: 1/2):
      VPP 12; SP 36*2/3*1/2 = 12; ZERO 36*2/3*1/2*2/3 = 8; TPO 36*2/3*1/2*1/3*1/2 = 2; valid 2.
    The valid ones: sp, tpo, zero at position 0, schedule 1f1b (0) or dualpipe (2): rows 0 and 2."""
    space = make(devices=2, global_batch=2, dims=dict(pp=[2], sequence_parallel=[False, True],
                                                      tp_overlap=[False, True], zero=[0, 1, 2],
                                                      schedule=["1f1b", "interleaved", "dualpipe"]))
    encoder = Encoder(space)
    assert (encoder.n_combinations, encoder.n_suffix) == (36, 36)
    enc = encoder.encode_all()
    want_first = {Reason.VALID: 2, Reason.VPP_SCHEDULE: 12, Reason.SP_WITHOUT_TP: 12, Reason.ZERO_WITHOUT_DP: 8,
                  Reason.TP_OVERLAP_WITHOUT_SP: 2}
    want_breaks = {Reason.VPP_SCHEDULE: 12, Reason.SP_WITHOUT_TP: 18, Reason.ZERO_WITHOUT_DP: 24,
                   Reason.TP_OVERLAP_WITHOUT_SP: 9}
    assert {Reason(i): int(v) for i, v in enumerate(enc.first_reason) if v} == want_first
    assert {Reason(i): int(v) for i, v in enumerate(enc.breaks) if v} == want_breaks
    assert enc.columns["row_id"].tolist() == [0, 2]
    assert enc.columns["schedule"].tolist() == [Schedule.ONE_F_ONE_B, Schedule.DUALPIPE]
    assert enc.columns["dp"].tolist() == [1, 1] and enc.columns["n_microbatches"].tolist() == [2, 2]
    # a cut block: rows 1..35 lose valid row 0 only; row 2 alone is valid
    cut = encoder.encode(1, 36)
    assert cut.first_reason[Reason.VALID] == 1 and cut.columns["row_id"].tolist() == [2]
    np.testing.assert_array_equal(cut.breaks, enc.breaks)  # row 0 breaks nothing
    assert_same(enc, encode_by_filter(encoder, np.arange(36)))
    assert_same(cut, encode_by_filter(encoder, np.arange(1, 36)))


def test_blocks_whose_prefix_fails():
    """devices 4, global batch 4, tp in [1, 3] (derived dp 4 and none), zero in [0, 1]:
    two blocks of 2. Block tp = 3: 3 does not divide 4 devices nor 32 heads, so both of its
    rows go to DEVICE_COUNT and break TP_HEADS too; its zero = 1 row has no dp, so
    ZERO_WITHOUT_DP (rows with a dp only) is not broken. Block tp = 1: dp = 4 shards, valid."""
    encoder = Encoder(make(devices=4, global_batch=4, dims=dict(tp=[1, 3], zero=[0, 1])))
    enc = encoder.encode_all()
    assert enc.first_reason[Reason.VALID] == 2 and enc.first_reason[Reason.DEVICE_COUNT] == 2
    assert enc.breaks[Reason.DEVICE_COUNT] == 2 and enc.breaks[Reason.TP_HEADS] == 2
    assert enc.breaks.sum() == 4
    assert enc.columns["row_id"].tolist() == [0, 1]
    assert_same(enc, encode_by_filter(encoder, np.arange(4)))


def test_calculon_counts():
    """Calculon's search problem (bench/spaces): 6 tp x 6 pp x 10 vpp x 8 micro-batch =
    2,880 blocks of 3 recompute x 2 x 2 offloads x 2 sp x 2 tp_overlap x 4 zero x 2
    optimizers x 2 schedules = 768; 222,552 valid (the filtering encoder's count)."""
    encoder = Encoder(load_space(str(CALCULON)))
    assert (encoder.n_combinations, encoder.n_suffix) == (2_211_840, 768)
    whole = encoder.encode_all()
    assert whole.n_rows == whole.first_reason[Reason.VALID] == 222_552
    assert whole.first_reason.sum() == 2_211_840
    parts = list(encoder.chunks(100_003))
    np.testing.assert_array_equal(sum(p.first_reason for p in parts), whole.first_reason)
    np.testing.assert_array_equal(sum(p.breaks for p in parts), whole.breaks)
    np.testing.assert_array_equal(np.concatenate([p.columns["row_id"] for p in parts]), whole.columns["row_id"])
    # the filter, on pieces of it
    rng = np.random.default_rng(7)
    for start, stop in ranges(encoder, rng, max_rows=20_000):
        check_range(encoder, start, stop)
    ids = rng.integers(0, encoder.n_combinations, 5000)
    assert_same(encoder.encode_ids(ids), encode_by_filter(encoder, ids))


# --------------------------------------------------------------------------- every shipped space


@pytest.fixture(params=["templates", "products", "mixed"])
def products(request, monkeypatch):
    """Valid rows copied from templates (the default), built from their ranks in the product
    of group parts, or both in one chunk (the template budget runs out after a few signatures)."""
    if request.param == "products":
        monkeypatch.setattr(encode_mod, "TEMPLATE_ROWS", 0)
    elif request.param == "mixed":
        monkeypatch.setattr(encode_mod, "TEMPLATE_BUDGET_ROWS", 40)
    return request.param


@pytest.mark.parametrize("name", catalog.names("space"))
def test_catalog_space(name, products):
    encoder = Encoder(load_space(name))
    n = encoder.n_combinations
    assert_same(encoder.encode_all(), encode_by_filter(encoder, np.arange(n, dtype=np.int64)), name)
    rng = np.random.default_rng(sum(map(ord, name)))
    for start, stop in ranges(encoder, rng):
        check_range(encoder, start, stop)
    ids = rng.integers(0, n, 3000)  # unsorted, with repeats
    assert_same(encoder.encode_ids(ids), encode_by_filter(encoder, ids), f"{name} ids")
    k = int(rng.integers(1, 3 * encoder.n_suffix))
    parts = list(encoder.chunks(k))
    assert all(p.n_combinations == k for p in parts[:-1])
    whole = encoder.encode_all()
    for col in whole.columns:
        np.testing.assert_array_equal(np.concatenate([p.columns[col] for p in parts]), whole.columns[col])
    np.testing.assert_array_equal(sum(p.first_reason for p in parts), whole.first_reason)
    np.testing.assert_array_equal(sum(p.breaks for p in parts), whole.breaks)


@pytest.mark.parametrize("path", BENCH_SPACES, ids=lambda p: p.stem)
def test_bench_space_pieces(path):
    encoder = Encoder(load_space(str(path)))
    rng = np.random.default_rng(3)
    for start, stop in ranges(encoder, rng, max_rows=30_000):
        check_range(encoder, start, stop)


# --------------------------------------------------------------------------- ids


def test_encode_ids_keeps_order_and_dtype():
    encoder = Encoder(load_space("llama3-70b-h100-1024"))
    valid = encoder.encode_all().columns["row_id"]
    ids = np.concatenate([valid[::-7][:50], valid[:5], valid[:5]]).astype(np.int32)  # descending, then repeats
    enc = encoder.encode_ids(ids)
    assert enc.columns["row_id"].dtype == np.int32
    np.testing.assert_array_equal(enc.columns["row_id"], ids)
    assert_same(enc, encode_by_filter(encoder, ids))
    empty = encoder.encode_ids(np.empty(0, np.int64))
    assert empty.n_rows == 0 and empty.n_combinations == 0 and not empty.first_reason.any()
    assert_same(empty, encode_by_filter(encoder, np.empty(0, np.int64)))


def test_encode_ids_refuses_rows_outside_the_space():
    encoder = Encoder(load_space("llama3-8b-h100-64"))
    for bad in ([-1], [encoder.n_combinations]):
        with pytest.raises(ValueError):
            encoder.encode_ids(np.array(bad))
    with pytest.raises(TypeError):
        encoder.encode_ids(np.array([1.0]))


def test_empty_and_clipped_ranges():
    encoder = Encoder(load_space("llama3-8b-h100-64"))
    n = encoder.n_combinations
    for start, stop in ((5, 5), (7, 3), (n, n + 10)):
        enc = encoder.encode(start, stop)
        assert enc.n_combinations == 0 and enc.n_rows == 0
        assert_same(enc, encode_by_filter(encoder, np.empty(0, np.int64)))
    assert_same(encoder.encode(n - 5, n + 100), encode_by_filter(encoder, np.arange(n - 5, n)))


# --------------------------------------------------------------------------- random spaces


def _sub(values, max_size):
    return st.lists(st.sampled_from(values), min_size=1, max_size=max_size, unique=True)


#: the most combinations a random space keeps (the filter reference runs on all of them)
BUDGET = 30_000


#: a value of each dimension that breaks no rule by itself
HARMLESS = dict(tp=1, pp=1, cp=1, vpp=1, micro_batch=1, recompute="none", recompute_layers=0,
                offload_activations=False, offload_weights=False, sequence_parallel=False, tp_overlap=False, zero=0,
                defer_grad_sync=False, optimizer="adam", schedule="1f1b", ep=1, expert_tp=1, ep_placement="inner", dispatch="alltoall",
                tbo=False)  # fmt: skip


@st.composite
def any_space(draw):
    """Random value lists for every dimension, on dense and MoE models. Most lists hold
    a harmless value somewhere and the global batch is a multiple of every cluster size,
    so that most spaces keep some rows; lists are cut (harmless values last) until the
    product fits BUDGET."""
    choices = dict(
        tp=_sub([1, 2, 3, 4, 8, 16], 3), pp=_sub([1, 2, 3, 4, 8], 3), cp=_sub([1, 2, 3, 4], 2),
        vpp=_sub([1, 2, 3, 4, 5], 3), micro_batch=_sub([1, 2, 3, 4, 8], 3),
        recompute=_sub(labels(Recompute), 3), recompute_layers=_sub([0, 1, 2, 4], 2),
        offload_activations=_sub([False, True], 2), offload_weights=_sub([False, True], 2),
        sequence_parallel=_sub([False, True], 2), tp_overlap=_sub([False, True], 2), zero=_sub([0, 1, 2, 3], 3),
        defer_grad_sync=_sub([False, True], 2), optimizer=_sub(labels(Optimizer), 3), schedule=_sub(labels(Schedule), 4),
        ep=_sub([1, 2, 3, 4, 8, 16], 3), expert_tp=_sub([1, 2, 3, 7], 2), ep_placement=_sub(labels(Placement), 2),
        dispatch=_sub(labels(Dispatch), 3), tbo=_sub([False, True], 2),
    )  # fmt: skip
    without = draw(st.sets(st.sampled_from(sorted([*choices, "dp"])), max_size=2))  # dimensions left as drawn
    dims = {}
    for name, values in choices.items():
        v = draw(values)
        if HARMLESS[name] not in v and name not in without:
            v.insert(draw(st.integers(0, len(v))), HARMLESS[name])
        dims[name] = v
    devices = draw(st.one_of(st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 32]),
                             st.lists(st.sampled_from([2, 4, 8, 12, 16]), min_size=1, max_size=3, unique=True)))
    sizes = devices if isinstance(devices, list) else [devices]
    if draw(st.booleans()):  # dp listed (most often with a value that fills a cluster alone)
        dims["dp"] = draw(_sub([1, 2, 3, 4, 6, 8, 16], 3))
        if sizes[0] not in dims["dp"] and "dp" not in without:
            dims["dp"].append(sizes[0])
    while len(sizes) * math.prod(len(v) for v in dims.values()) > BUDGET:
        longest = max(dims, key=lambda k: len(dims[k]))
        harmless = HARMLESS.get(longest, sizes[0])
        cut = max(i for i, x in enumerate(dims[longest]) if x != harmless or i == 0)
        dims[longest] = dims[longest][:cut] + dims[longest][cut + 1:]
    return dict(
        model=draw(st.sampled_from(["llama3-8b", "gpt3-175b", "mixtral-8x7b", "deepseek-v2", "qwen3-235b-a22b"])),
        devices=devices,
        global_batch=math.lcm(*sizes) * draw(st.sampled_from([1, 2, 3, 4, 6, 8])),
        seq_len=draw(st.sampled_from([6, 7, 12, 2048, 4097])),
        uneven_layers=draw(st.booleans()),
        dims=dims,
    )


@settings(max_examples=80, deadline=None)
@given(any_space(), st.data())
def test_property_random_spaces(kwargs, data):
    encoder = Encoder(make(**kwargs))
    n = encoder.n_combinations
    assert_same(encoder.encode_all(), encode_by_filter(encoder, np.arange(n, dtype=np.int64)))
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    check_range(encoder, start, stop)
    ids = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=50)), np.int64)
    assert_same(encoder.encode_ids(ids), encode_by_filter(encoder, ids))
    k = data.draw(st.integers(1, n))
    parts = list(encoder.chunks(k, start, stop))
    assert sum(p.n_combinations for p in parts) == stop - start
    want = encode_by_filter(encoder, np.arange(start, stop, dtype=np.int64))
    np.testing.assert_array_equal(np.concatenate([p.columns["row_id"] for p in parts]), want.columns["row_id"])
    np.testing.assert_array_equal(sum(p.first_reason for p in parts), want.first_reason)
    np.testing.assert_array_equal(sum(p.breaks for p in parts), want.breaks)


@settings(max_examples=25, deadline=None)
@given(any_space(), st.integers(1, 200))
def test_property_products(kwargs, budget):
    """The same with rows built from their ranks in the product of group parts (no
    templates), and with templates for the first signatures only (a small budget)."""
    saved = encode_mod.TEMPLATE_ROWS, encode_mod.TEMPLATE_BUDGET_ROWS
    try:
        for rows, budget_rows in ((0, saved[1]), (saved[0], budget)):
            encode_mod.TEMPLATE_ROWS, encode_mod.TEMPLATE_BUDGET_ROWS = rows, budget_rows
            encoder = Encoder(make(**kwargs))
            n = encoder.n_combinations
            assert_same(encoder.encode_all(), encode_by_filter(encoder, np.arange(n)))
            check_range(encoder, n // 3, n - n // 5)
    finally:
        encode_mod.TEMPLATE_ROWS, encode_mod.TEMPLATE_BUDGET_ROWS = saved


# --------------------------------------------------------------------------- a billion combinations


def big_space():
    """Mixtral 8x7B over 4 cluster sizes: 4 x 5 tp x 5 pp x 3 cp x 4 vpp x 4 micro-batch =
    4,800 blocks of 6 recompute x 2 offload_weights x 2 sp x 2 tp_overlap x 4 zero x 3
    optimizers x 3 schedules x 4 ep x 2 expert_tp x 2 placements x 6 dispatches x 2 tbo =
    331,776: 1,592,524,800 combinations."""
    return make(model="mixtral-8x7b", devices=[64, 128, 256, 512], global_batch=1024, dims=dict(
        tp=[1, 2, 4, 8, 16], pp=[1, 2, 4, 8, 16], cp=[1, 2, 4], vpp=[1, 2, 3, 4], micro_batch=[1, 2, 4, 8],
        recompute=labels(Recompute), offload_weights=[False, True], sequence_parallel=[False, True],
        tp_overlap=[False, True], zero=[0, 1, 2, 3], optimizer=["adam", "cpu-adam", "adam-8bit"],
        schedule=["1f1b", "interleaved", "dualpipe"], ep=[1, 2, 4, 8], expert_tp=[1, 2],
        ep_placement=labels(Placement), dispatch=labels(Dispatch), tbo=[False, True]))


def test_billion_combinations_in_bounded_memory():
    """Encoding a chunk allocates in proportion to the chunk (its valid rows, 63 bytes each,
    and its blocks), not to the space: the filter would build every combination of the
    chunk (over 300 bytes each) and a table of the space would not fit at all."""
    tracemalloc.start()
    try:
        encoder = Encoder(big_space())
        assert encoder.n_combinations == 1_592_524_800 and encoder.n_suffix == 331_776
        assert tracemalloc.get_traced_memory()[1] < 2**20  # constructing it
        for chunk_rows in (1 << 14, 1 << 18):
            start = 3 * encoder.n_combinations // 7  # somewhere in the middle, not on a block boundary
            chunks = encoder.chunks(chunk_rows, start)
            next(chunks)  # meets this stretch's signatures
            for _ in range(3):
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                enc = next(chunks)
                peak = tracemalloc.get_traced_memory()[1] - before
                assert enc.n_combinations == chunk_rows
                assert peak < 100 * chunk_rows + 2**20, (chunk_rows, peak)
                del enc
    finally:
        tracemalloc.stop()
    check_range(encoder, start, start + 20_000)


def test_expert_groups_too_varied_to_fold():
    """EP_GROUP reads the stage's ranks through their gcd with the lcm of every ep *
    expert_tp; here that lcm (2*3*...*53, the primes to 53: about 3.3e19) passes 2**62,
    so the ranks are kept as they are. Either way the rows are the filter's."""
    space = make(model="mixtral-8x7b", devices=[8, 16], global_batch=16, dims=dict(
        tp=[1, 2], ep=[1, 2, 3, 5, 7, 11, 13, 17, 19], expert_tp=[1, 23, 29, 31, 37, 41, 43, 47, 53]))
    encoder = Encoder(space)
    assert_same(encoder.encode_all(), encode_by_filter(encoder, np.arange(encoder.n_combinations)))
    assert encoder.encode_all().n_rows > 0
